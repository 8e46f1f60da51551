"""Front end: a batched function's source -> Function IR (a control-flow graph of blocks).

:mod:`.canonical` puts the source in canonical form through AutoGraph (``break``,
``continue`` and early ``return`` lowered to flags, A-normal form, activity analysis); this
module walks that form once:

* each maximal run of straight-line statements becomes one
  :class:`~tfx_vec.autobatch.ir.Primitive`: a real Python function compiled with the user's
  file name and line numbers (tracebacks point at the user's code), whose inputs and outputs
  are what AutoGraph's activity analysis says the statements read and write;
* an assignment of a call to a batched function becomes a :class:`~tfx_vec.autobatch.ir.Call`;
* ``if``, ``while`` and ``for i in range(...)`` become blocks and branches, the final
  ``return`` a :class:`~tfx_vec.autobatch.ir.Return` (jumps to a block that only returns are
  replaced by the return).

Anything it cannot batch raises :class:`~tfx_vec.autobatch.errors.UnsupportedSyntaxError`
naming the user's file and line.

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec import autobatch as ab
    >>> @ab.function
    ... def absolute(x):
    ...     if x < 0:
    ...         x = -x
    ...     return x
    >>> prog = compile_program(absolute)
    >>> [len(b.ops) for b in prog.functions["absolute"].blocks]
    [1, 1, 1]
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
from typing import Any, Callable

import gast
from tensorflow.python.autograph.pyct import anno
from tensorflow.python.autograph.pyct.static_analysis.annos import NodeAnno

from . import ir
from .canonical import Canonical, batched_python_function, canonicalize, extra_loop_test
from .logic import HELPERS, PREFIX
from .passes.liveness import block_liveness

__all__ = ["compile_program", "batched_python_function"]


def _name(id_: str, ctx=None) -> gast.Name:
    return gast.Name(id=id_, ctx=ctx or gast.Load(), annotation=None, type_comment=None)


def _assign(target: str, value: gast.expr, like: gast.AST) -> gast.Assign:
    node = gast.Assign(targets=[_name(target, gast.Store())], value=value, type_comment=None)
    return gast.copy_location(node, like)


def _call(helper: str, args: list, like: gast.AST) -> gast.Call:
    return gast.copy_location(gast.Call(func=_name(PREFIX + helper), args=args, keywords=[]),
                              like)


def _source_order(node: gast.AST, names: set[str]) -> list[str]:
    """``names`` in the order they first appear in ``node``."""
    found = sorted((n.lineno or 0, n.col_offset or 0, n.id) for n in gast.walk(node)
                   if isinstance(n, gast.Name) and n.id in names
                   and getattr(n, "lineno", None) is not None)
    ordered = list(dict.fromkeys(name for *_, name in found))
    return ordered + sorted(names - set(ordered))


_CONNECTIVES = {PREFIX + "and": "and", PREFIX + "or": "or", PREFIX + "not": "not"}


def _logic(expr: gast.expr) -> tuple:
    """``expr`` as a formula (see :attr:`ir.Branch.logic`): connectives over flags."""
    if isinstance(expr, gast.Name):
        return ("var", expr.id)
    if isinstance(expr, gast.Constant) and isinstance(expr.value, bool):
        return ("const", expr.value)
    if isinstance(expr, gast.Call) and isinstance(expr.func, gast.Name):
        if expr.func.id == PREFIX + "truth" and len(expr.args) == 1:
            return _logic(expr.args[0])
        if expr.func.id in _CONNECTIVES:
            return (_CONNECTIVES[expr.func.id], *map(_logic, expr.args))
    return ("?",)


def _roots(qns) -> set[str]:
    return {str(root) for qn in qns for root in qn.support_set}


def compile_primitive(can: Canonical, stmts: list, inputs: tuple, outputs: tuple) -> Callable:
    """One real Python function ``(*inputs) -> tuple(outputs)`` running ``stmts``."""
    src = can.source
    freevars = list(src.closure)
    factory = ast.parse(
        f"def {PREFIX}factory({', '.join(freevars + list(HELPERS))}):\n"
        f"    def {PREFIX}prim({', '.join(inputs)}):\n"
        f"        return ({''.join(o + ', ' for o in outputs)})\n"
        f"    return {PREFIX}prim\n").body[0]
    body = []
    for s in stmts:
        node = gast.gast_to_ast(s)
        ast.increment_lineno(node, src.offset)
        for n in ast.walk(node):  # nodes the converters built may carry stale positions
            if hasattr(n, "lineno") and not (node.lineno <= n.lineno <= (n.end_lineno or 0)):
                n.lineno = n.end_lineno = node.lineno
        body.append(node)
    line = body[0].lineno if body else src.offset + 1
    for n in ast.walk(factory):  # the wrapper's own lines point at the first statement
        if hasattr(n, "lineno"):
            n.lineno = n.end_lineno = line
    factory.body[0].body[0:0] = body
    module = ast.fix_missing_locations(ast.Module(body=[factory], type_ignores=[]))
    scope: dict[str, Any] = {}
    exec(compile(module, src.filename, "exec"), src.fn.__globals__, scope)
    return scope[f"{PREFIX}factory"](*[src.closure[v] for v in freevars], *HELPERS.values())


@dataclasses.dataclass(frozen=True)
class _Statements:
    """A primitive's statements, before :meth:`_FunctionBuilder._compiled` compiles them."""
    stmts: tuple


class _Block:
    def __init__(self):
        self.ops: list = []
        self.term: Any = None
        self.order: int | None = None  # when it was first entered (source order)


@dataclasses.dataclass
class _Pending:
    """A straight-line statement waiting to become part of a primitive."""
    stmt: gast.stmt
    reads: list[str]
    writes: list[str]


class _FunctionBuilder:
    """Builds one :class:`ir.Function` from one canonical Python function."""

    def __init__(self, can: Canonical, name: str, name_of: Callable[[Any], str],
                 arity_of: Callable[[Any], tuple]):
        self.can, self.src, self.name = can, can.source, name
        self.name_of, self.arity_of = name_of, arity_of
        self.locals = set(can.locals)
        self.blocks: list[_Block] = []
        self.entered = 0
        self.cur = self._enter(self._new())
        self.pending: list[_Pending] = []
        self.counter = 0

    # -- blocks -------------------------------------------------------------------------
    def _new(self) -> _Block:
        b = _Block()
        self.blocks.append(b)
        return b

    def _enter(self, b: _Block) -> _Block:
        if b.order is None:
            b.order, self.entered = self.entered, self.entered + 1
        self.cur = b
        return b

    def _terminate(self, term: Any) -> None:
        self.flush()
        if self.cur.term is None:
            self.cur.term = term

    def _fresh(self, kind: str) -> str:
        self.counter += 1
        name = f"{PREFIX}{kind}{self.counter}"
        while name in self.locals:
            self.counter += 1
            name = f"{PREFIX}{kind}{self.counter}"
        self.locals.add(name)
        return name

    # -- straight-line code -------------------------------------------------------------
    def _add(self, stmt: gast.stmt, reads=None, writes=None) -> None:
        """Queue a statement: the user's with AutoGraph's activity sets, a generated one with
        the names it reads (every local name in it) and ``writes``."""
        if reads is None and anno.hasanno(stmt, anno.Static.SCOPE):
            scope = anno.getanno(stmt, anno.Static.SCOPE)
            reads = _source_order(stmt, _roots(scope.read) & self.locals)
            writes = sorted(_roots(q for q in scope.modified if q.is_simple()) & self.locals)
        elif reads is None:
            reads = _source_order(stmt, {n.id for n in gast.walk(stmt) if isinstance(n, gast.Name)
                                         and isinstance(n.ctx, gast.Load)} & self.locals)
        self.pending.append(_Pending(stmt, reads, list(writes or ())))

    def flush(self) -> None:
        """Turn the pending straight-line statements into one Primitive."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        inputs: dict[str, None] = {}
        outputs: dict[str, None] = {}
        for p in pending:
            for u in p.reads:
                if u not in outputs:
                    inputs.setdefault(u)
            outputs.update(dict.fromkeys(p.writes))
        stmts = [p.stmt for p in pending]
        text = "; ".join(ast.unparse(gast.gast_to_ast(s)) for s in stmts)
        loc = self.src.loc(stmts[0])
        s = stmts[0]
        if (len(stmts) == 1 and isinstance(s, gast.Assign) and len(s.targets) == 1
                and isinstance(s.targets[0], gast.Name) and isinstance(s.value, gast.Name)
                and len(inputs) == 1):
            # `y = x`: a move the passes can see through (see result forwarding)
            self.cur.ops.append(dataclasses.replace(ir.move(tuple(outputs), tuple(inputs), loc),
                                                    text=text))
            return
        # compiled once liveness is known (_compiled): only live outputs leave the primitive
        self.cur.ops.append(ir.Primitive(tuple(inputs), tuple(outputs),
                                         _Statements(tuple(stmts)), text, loc))

    def as_var(self, expr: gast.AST, kind: str = "t") -> str:
        """A local holding the value of ``expr``."""
        if isinstance(expr, gast.Name) and expr.id in self.locals:
            return expr.id
        tmp = self._fresh(kind)
        self._add(_assign(tmp, expr, expr), writes=[tmp])
        return tmp

    # -- calls to batched functions -----------------------------------------------------
    def _callee(self, value: gast.AST) -> Any:
        return (self.src.batched(value.func, self.locals)
                if isinstance(value, gast.Call) else None)

    def _emit_call(self, call: gast.Call, target: Any, out: str) -> None:
        params = self.arity_of(target)
        if len(call.args) > len(params):
            raise self.src.error(call, f"too many arguments: {len(call.args)} for {params}")
        values: list = list(call.args) + [None] * (len(params) - len(call.args))
        for k in call.keywords:
            if k.arg not in params or values[params.index(k.arg)] is not None:
                raise self.src.error(call, f"unexpected or repeated keyword argument {k.arg!r}")
            values[params.index(k.arg)] = k.value
        missing = [p for p, v in zip(params, values) if v is None]
        if missing:
            raise self.src.error(call, f"missing arguments {missing}")
        args = [self.as_var(v) for v in values]
        self.flush()
        self.cur.ops.append(ir.Call(self.name_of(target), tuple(args), out, self.src.loc(call)))

    def _call_into_temp(self, s: gast.stmt) -> gast.Name:
        """Emit the batched call ``s.value`` into a fresh local; return a name for it."""
        out = self._fresh("r")
        self._emit_call(s.value, self._callee(s.value), out)
        return gast.copy_location(_name(out), s.value)

    # -- statements ---------------------------------------------------------------------
    def body(self, stmts: list) -> None:
        for s in stmts:
            handler = getattr(self, f"stmt_{type(s).__name__}", None)
            if handler is None:
                raise self.src.error(s, f"statement {type(s).__name__} is not supported in a "
                                        "batched function")
            handler(s)

    def stmt_Assign(self, s):
        target = self._callee(s.value)
        if (len(s.targets) == 1 and isinstance(s.targets[0], gast.Name)
                and isinstance(s.value, gast.Constant) and isinstance(s.value.value, bool)):
            # a flag (AutoGraph's do_return, break_, continue_ or the user's): jump threading
            # sees constants through ir.constant
            self.flush()
            self.cur.ops.append(ir.constant(s.targets[0].id, s.value.value, self.src.loc(s)))
        elif target is None:
            self._add(s)
        elif len(s.targets) == 1 and isinstance(s.targets[0], gast.Name):
            self._emit_call(s.value, target, s.targets[0].id)
        else:  # `a, b = f(x)`: call into a temporary, then unpack it
            out = self._call_into_temp(s)
            s.value = out
            self._add(s, [out.id], sorted({n.id for t in s.targets for n in gast.walk(t)
                                           if isinstance(n, gast.Name)} & self.locals))

    def stmt_AugAssign(self, s):
        if self._callee(s.value) is None:
            self._add(s)
            return
        s.value = self._call_into_temp(s)
        self._add(s, [s.target.id, s.value.id], [s.target.id])

    def stmt_AnnAssign(self, s):
        if s.value is not None:
            plain = gast.copy_location(
                gast.Assign(targets=[s.target], value=s.value, type_comment=None), s)
            anno.copyanno(s, plain, anno.Static.SCOPE)
            self.stmt_Assign(plain)

    def stmt_Expr(self, s):
        v = s.value
        if isinstance(v, gast.Constant) and isinstance(v.value, str):
            return  # docstring
        if isinstance(v, gast.Name) or (isinstance(v, gast.Tuple) and all(
                isinstance(e, gast.Name) for e in v.elts)):
            return  # AutoGraph's no-op marker `(break_,)`
        if self._callee(v) is not None:
            self._call_into_temp(s)
        else:
            self._add(s)

    def stmt_Pass(self, s):
        pass

    def stmt_Return(self, s):
        self._terminate(_PendingReturn(s.value.id))
        self._enter(self._new())  # nothing follows the one return

    def stmt_If(self, s):
        assert isinstance(s.test, gast.Name), "A-normal form names every if test"
        cond = s.test.id  # a local holding truth(test), assigned just before
        defs = [p.stmt.value for p in self.pending if cond in p.writes
                and isinstance(p.stmt, gast.Assign)]
        then_b, join = self._new(), self._new()
        else_b = self._new() if s.orelse else join
        self._terminate(_PendingBranch(cond, then_b, else_b, self.src.loc(s),
                                       _logic(defs[-1]) if defs else ("?",)))
        for block, stmts in ((then_b, s.body), (else_b, s.orelse)):
            if block is join:
                continue
            self._enter(block)
            self.body(stmts)
            self._terminate(_PendingJump(join))
        self._enter(join)

    def _loop(self, s, header: _Block, cond: str, test: gast.expr, setup: list) -> None:
        body_b, exit_b = self._new(), self._new()
        self._terminate(_PendingBranch(cond, body_b, exit_b, self.src.loc(s), _logic(test)))
        self._enter(body_b)
        self.pending.extend(setup)
        self.body(s.body)
        self._terminate(_PendingJump(header))
        self._enter(exit_b)

    def _header(self) -> _Block:
        header = self._new()
        self._terminate(_PendingJump(header))
        self._enter(header)
        return header

    def stmt_While(self, s):
        header = self._header()
        cond = self._fresh("c")
        scope = anno.getanno(s, NodeAnno.COND_SCOPE)
        self._add(_assign(cond, s.test, s), _source_order(s.test, _roots(scope.read)
                                                           & self.locals), [cond])
        self._loop(s, header, cond, s.test, [])

    def stmt_For(self, s):
        args = s.iter.args
        start = args[0] if len(args) > 1 else gast.Constant(value=0, kind=None)
        end = args[1] if len(args) > 1 else args[0]
        step = args[2].value if len(args) == 3 else 1
        end_v = self._fresh("end")  # range() reads its bounds once
        self._add(_assign(end_v, end, s), writes=[end_v])
        counter = self._fresh("i")
        self._add(_assign(counter, _call("start", [start, _name(end_v)], s), s),
                  writes=[counter])
        header = self._header()
        cond = self._fresh("c")
        test = gast.Compare(left=_name(counter), ops=[gast.Lt() if step > 0 else gast.Gt()],
                            comparators=[_name(end_v)])
        extra = extra_loop_test(s)
        if extra is not None:
            test = _call("and", [test, extra], s)
        self._add(_assign(cond, test, s), writes=[cond])
        setup = [_Pending(_assign(s.target.id, _name(counter), s), [counter], [s.target.id]),
                 _Pending(_assign(counter, gast.BinOp(left=_name(counter), op=gast.Add(),
                                                      right=gast.Constant(value=step, kind=None)),
                                  s), [counter], [counter])]
        self._loop(s, header, cond, test, setup)

    # -- finish -------------------------------------------------------------------------
    def build(self) -> ir.Function:
        fdef = self.can.fdef
        self.body(fdef.body)
        self.flush()
        entry = self.blocks[0]
        reachable, stack, seen = [], [entry], {id(entry)}
        while stack:
            b = stack.pop()
            reachable.append(b)
            if b.term is None:
                raise self.src.error(fdef, f"{self.name} can reach its end without a return "
                                           "statement")
            for nxt in b.term.targets():
                if id(nxt) not in seen:
                    seen.add(id(nxt))
                    stack.append(nxt)
        reachable.sort(key=lambda b: b.order)
        for b in reachable:
            b.term = b.term.threaded()
        reachable = [b for b in reachable if b is entry or any(
            t is b for o in reachable for t in o.term.targets())]
        index = {id(b): i for i, b in enumerate(reachable)}
        blocks = tuple(ir.Block(f"{self.name}.{i}", tuple(b.ops), b.term.resolve(index))
                       for i, b in enumerate(reachable))
        return self._compiled(ir.Function(self.name, self.can.params, blocks,
                                          self.can.result or "", self.src.loc(fdef)))

    def _compiled(self, f: ir.Function) -> ir.Function:
        """Compile every primitive, its outputs narrowed to the variables live after it (a
        lambda or a list used within one run of statements is never a batched variable)."""
        _, after = block_liveness(f.blocks, lambda i: ir.successors(f.blocks[i].terminator))
        blocks = []
        for i, b in enumerate(f.blocks):
            ops = []
            for k, op in enumerate(b.ops):
                if isinstance(op, ir.Primitive) and isinstance(op.fn, _Statements):
                    outputs = tuple(v for v in op.outputs if v in after[(i, k)])
                    op = dataclasses.replace(op, outputs=outputs, fn=compile_primitive(
                        self.can, op.fn.stmts, op.inputs, outputs))
                ops.append(op)
            blocks.append(dataclasses.replace(b, ops=tuple(ops)))
        return dataclasses.replace(f, blocks=tuple(blocks))


def _skip_empty(b: _Block) -> _Block:
    """Where control really goes when it enters ``b``: past blocks that only jump."""
    seen = set()
    while not b.ops and isinstance(b.term, _PendingJump) and id(b) not in seen:
        seen.add(id(b))
        b = b.term.target
    return b


class _PendingJump:
    def __init__(self, target: _Block):
        self.target = target

    def threaded(self):
        """Jumps past empty blocks; a jump to a block that only returns is that return."""
        target = _skip_empty(self.target)
        if not target.ops and isinstance(target.term, _PendingReturn):
            return target.term
        return _PendingJump(target)

    def targets(self):
        return (self.target,)

    def resolve(self, index):
        return ir.Jump(index[id(self.target)])


class _PendingBranch:
    def __init__(self, cond: str, true: _Block, false: _Block, loc: str, logic: tuple):
        self.cond, self.true, self.false, self.loc, self.logic = cond, true, false, loc, logic

    def threaded(self):
        # (a branch into an empty block that jumps to a loop test stays: block merging copies
        # the test into that block, so members skip the loop header)
        return self

    def targets(self):
        return (self.true, self.false)

    def resolve(self, index):
        return ir.Branch(self.cond, index[id(self.true)], index[id(self.false)], self.loc,
                         self.logic)


class _PendingReturn:
    def __init__(self, value: str):
        self.value = value

    def threaded(self):
        return self

    def targets(self):
        return ()

    def resolve(self, index):
        return ir.Return(self.value)


def compile_program(main: Any) -> ir.Program:
    """Compile an ``ab.function`` object and every batched function it reaches.

    Args:
      main: the ``ab.function`` object to start from.
    Returns:
      A Function-IR :class:`ir.Program` whose ``main`` is ``main``'s name.
    Raises:
      UnsupportedSyntaxError: naming file and line of the first unsupported construct.
    """
    names: dict[int, str] = {}
    objects: list[Any] = []

    def name_of(obj: Any) -> str:
        if id(obj) not in names:
            base = batched_python_function(obj).__name__
            name, k = base, 1
            while name in names.values():
                k += 1
                name = f"{base}_{k}"
            names[id(obj)] = name
            objects.append(obj)
        return names[id(obj)]

    def arity_of(obj: Any) -> tuple:
        return tuple(inspect.signature(batched_python_function(obj)).parameters)

    name_of(main)
    functions: dict[str, ir.Function] = {}
    i = 0
    while i < len(objects):
        obj = objects[i]
        can = canonicalize(batched_python_function(obj))
        functions[names[id(obj)]] = _FunctionBuilder(can, names[id(obj)], name_of,
                                                     arity_of).build()
        i += 1
    return ir.Program(functions, names[id(main)], notes=("frontend",))
