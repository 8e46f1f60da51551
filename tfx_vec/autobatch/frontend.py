"""Front end: Python source (parsed with gast) -> Function IR (control-flow graph of blocks).

Straight-line statements become :class:`~tfx_vec.autobatch.ir.Primitive` s: each maximal run of
them is compiled into one real Python function (with the user's file name and line numbers, so
tracebacks point at the user's code) that runs on whole batches.  Calls to other batched
functions are lifted out of expressions (A-normal form) into :class:`~tfx_vec.autobatch.ir.Call`
ops; ``if``/``while``/``for i in range(n)``/``break``/``continue``/``return`` become blocks and
terminators.  ``and``/``or``/``not`` and chained comparisons are rewritten to element-wise
logical ops (both sides are evaluated: no short circuit).

Anything else (``try``, ``with``, ``yield``, nested ``def``, assignments to attributes or
subscripts, batched functions used as values, ...) raises
:class:`~tfx_vec.autobatch.errors.UnsupportedSyntaxError` naming the user's file and line.

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
import builtins
import inspect
import operator
import textwrap
from typing import Any, Callable

import gast
import tensorflow as tf
from tensorflow.python.framework import override_binary_operator  # TF2's == promotion
from tensorflow.python.ops import gen_math_ops

from . import ir
from .errors import UnsupportedSyntaxError

__all__ = ["compile_program", "batched_python_function", "logical_and", "logical_or",
           "logical_not", "equal", "not_equal"]

_PREFIX = "_ab_"
_REJECTED_STMTS = {
    "Try": "try/except", "TryStar": "try/except*", "With": "with", "AsyncWith": "async with",
    "Raise": "raise", "Global": "global", "Nonlocal": "nonlocal", "Delete": "del",
    "Import": "import", "ImportFrom": "import", "Assert": "assert (use tf.debugging in a "
    "helper function)", "FunctionDef": "a nested def", "AsyncFunctionDef": "a nested def",
    "ClassDef": "a nested class", "Match": "match", "AsyncFor": "async for",
}
_REJECTED_EXPRS = {"Yield": "yield", "YieldFrom": "yield from", "Await": "await",
                   "NamedExpr": "an assignment expression (:=)"}


def batched_python_function(obj: Any) -> Callable | None:
    """The Python function behind an ``ab.function`` object, or None for anything else."""
    return getattr(obj, "_autobatch_python_fn", None)


# {{{ element-wise logic used by rewritten predicates

def _is_python_bool(x: Any) -> bool:
    return isinstance(x, (bool, int)) and not isinstance(x, tf.Tensor)


def logical_and(a: Any, b: Any) -> Any:
    """``a and b`` on per-member predicates (both sides already evaluated)."""
    if _is_python_bool(a) and _is_python_bool(b):
        return bool(a) and bool(b)
    return tf.logical_and(truth(a), truth(b))


def logical_or(a: Any, b: Any) -> Any:
    """``a or b`` on per-member predicates (both sides already evaluated)."""
    if _is_python_bool(a) and _is_python_bool(b):
        return bool(a) or bool(b)
    return tf.logical_or(truth(a), truth(b))


def logical_not(a: Any) -> Any:
    """``not a`` on a per-member predicate."""
    if _is_python_bool(a):
        return not a
    return tf.logical_not(truth(a))


def truth(x: Any) -> Any:
    """Python truthiness of a per-member predicate (``if n:`` on an int means ``n != 0``)."""
    if isinstance(x, (bool, int, float)):
        return bool(x)
    x = tf.convert_to_tensor(x)
    return x if x.dtype == tf.bool else tf.not_equal(x, tf.zeros_like(x))


def _tf2_equality(a: Any, b: Any, python_op: Callable, tf_op: Callable, with_none: bool) -> Any:
    """``python_op(a, b)``, or on tensors ``tf_op`` as TF2's ``Tensor.__eq__``/``__ne__`` does
    it (promotion, ``with_none`` against ``None``, no error on incompatible shapes)."""
    if not (tf.is_tensor(a) or tf.is_tensor(b)):
        return python_op(a, b)
    if a is None or b is None:
        return with_none
    if not tf.is_tensor(a):
        a, b = b, a
    a, b = override_binary_operator.maybe_promote_tensors(a, b)
    return tf_op(a, b, incompatible_shape_error=False)


def equal(a: Any, b: Any) -> Any:
    """``a == b`` with TF2 semantics in every mode: element-wise on tensors.

    In a TF1 graph (``tf.compat.v1.Graph``), ``Tensor.__eq__`` is object identity, so
    ``n % 2 == 0`` would be the Python constant ``False`` for every member; batched functions are
    written (and checked by :meth:`AutobatchFunction.unbatched`) with TF2's meaning.
    """
    return _tf2_equality(a, b, operator.eq, gen_math_ops.equal, False)


def not_equal(a: Any, b: Any) -> Any:
    """``a != b`` with TF2 semantics in every mode (see :func:`equal`)."""
    return _tf2_equality(a, b, operator.ne, gen_math_ops.not_equal, True)


def start_like(start: Any, end: Any) -> Any:
    """The first value of a ``range`` loop counter, batched like the loop's end."""
    end = tf.convert_to_tensor(end)
    return tf.cast(start, end.dtype) + tf.zeros_like(end)


_HELPERS = {f"{_PREFIX}and": logical_and, f"{_PREFIX}or": logical_or,
            f"{_PREFIX}not": logical_not, f"{_PREFIX}start": start_like,
            f"{_PREFIX}truth": truth, f"{_PREFIX}eq": equal, f"{_PREFIX}ne": not_equal}

# }}}

# {{{ small AST helpers

def _name(id_: str, ctx=None) -> gast.Name:
    return gast.Name(id=id_, ctx=ctx or gast.Load(), annotation=None, type_comment=None)


def _assign(target: str, value: gast.expr, like: gast.AST) -> gast.Assign:
    node = gast.Assign(targets=[_name(target, gast.Store())], value=value, type_comment=None)
    return gast.copy_location(node, like)


def _helper_call(name: str, args: list, like: gast.AST) -> gast.Call:
    return gast.copy_location(gast.Call(func=_name(_PREFIX + name), args=args, keywords=[]),
                              like)


def _target_names(target: gast.AST) -> list[str]:
    if isinstance(target, gast.Name):
        return [target.id]
    if isinstance(target, (gast.Tuple, gast.List)):
        return [n for e in target.elts for n in _target_names(e)]
    if isinstance(target, gast.Starred):
        return _target_names(target.value)
    return []


def _assigned_names(stmts: list) -> set[str]:
    """Locals a function body assigns (Python's scoping rule), not looking inside lambdas."""
    names: set[str] = set()
    for s in stmts:
        for node in gast.walk(s):
            if isinstance(node, (gast.Assign,)):
                for t in node.targets:
                    names.update(_target_names(t))
            elif isinstance(node, (gast.AugAssign, gast.AnnAssign, gast.For)):
                names.update(_target_names(node.target))
    return names


def _loaded(node: gast.AST, local_names: set[str]) -> list[str]:
    """Locals that ``node`` reads, in source order (duplicates removed)."""
    out: dict[str, None] = {}
    for n in gast.walk(node):
        if isinstance(n, gast.Name) and isinstance(n.ctx, gast.Load) and n.id in local_names:
            out.setdefault(n.id)
    return list(out)


def _comparison(left: gast.expr, op: gast.cmpop, right: gast.expr, like: gast.AST) -> gast.expr:
    """One comparison; ``==``/``!=`` call :func:`equal`/:func:`not_equal` (TF2's meaning)."""
    if isinstance(op, (gast.Eq, gast.NotEq)):
        return _helper_call("eq" if isinstance(op, gast.Eq) else "ne", [left, right], like)
    return gast.copy_location(gast.Compare(left=left, ops=[op], comparators=[right]), like)


class _LogicRewriter(gast.NodeTransformer):
    """``and``/``or``/``not``/chained comparisons -> element-wise helpers."""

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        helper = "and" if isinstance(node.op, gast.And) else "or"
        acc = node.values[0]
        for v in node.values[1:]:
            acc = _helper_call(helper, [acc, v], node)
        return acc

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, gast.Not):
            return _helper_call("not", [node.operand], node)
        return node

    def visit_Compare(self, node):
        self.generic_visit(node)
        lefts = [node.left] + node.comparators[:-1]
        parts = [_comparison(l, o, r, node)
                 for l, o, r in zip(lefts, node.ops, node.comparators)]
        acc = parts[0]
        for p in parts[1:]:
            acc = _helper_call("and", [acc, p], node)
        return acc

# }}}


class _Source:
    """Where a function's code came from: parsed tree, file, line offset, namespace."""

    def __init__(self, fn: Callable):
        self.fn = fn
        try:
            lines, first = inspect.getsourcelines(fn)
            self.filename = inspect.getsourcefile(fn) or "<unknown>"
        except (OSError, TypeError) as e:
            raise UnsupportedSyntaxError(
                f"cannot read the source of {getattr(fn, '__qualname__', fn)!r}: {e}") from e
        if "__autograph_generated" in self.filename:
            raise UnsupportedSyntaxError(
                f"{fn.__qualname__} was rewritten by AutoGraph before ab.function saw it (it is "
                "defined inside code that a tf.function converts); decorate the enclosing "
                "factory with @tf.autograph.experimental.do_not_convert")
        tree = gast.parse(textwrap.dedent("".join(lines)))
        defs = [n for n in tree.body if isinstance(n, gast.FunctionDef)]
        if not defs:
            raise UnsupportedSyntaxError(
                f"{self.filename}:{first}: ab.function needs a `def` (got a lambda?)")
        self.fdef = defs[0]
        self.offset = first - 1
        self.closure = {}
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                self.closure[name] = cell.cell_contents
            except ValueError:
                pass  # not yet bound: resolved as a plain name at run time

    def loc(self, node: gast.AST) -> str:
        return f"{self.filename}:{getattr(node, 'lineno', 1) + self.offset}"

    def error(self, node: gast.AST, msg: str) -> UnsupportedSyntaxError:
        return UnsupportedSyntaxError(f"{self.loc(node)}: {msg} (in {self.fn.__qualname__})")

    def resolve(self, node: gast.AST, local_names: set[str]) -> Any:
        """The object a Name/Attribute chain denotes at compile time (None if unknown/local)."""
        if isinstance(node, gast.Name):
            if node.id in local_names:
                return None
            if node.id in self.closure:
                return self.closure[node.id]
            if node.id in self.fn.__globals__:
                return self.fn.__globals__[node.id]
            return getattr(builtins, node.id, None)
        if isinstance(node, gast.Attribute):
            base = self.resolve(node.value, local_names)
            try:
                return getattr(base, node.attr) if base is not None else None
            except Exception:  # a property that fails is simply not a batched function
                return None
        return None

    def compile_primitive(self, stmts: list, inputs: tuple, outputs: tuple) -> Callable:
        """One real Python function ``(*inputs) -> tuple(outputs)`` running ``stmts``."""
        freevars = list(self.closure)
        factory = ast.parse(
            f"def {_PREFIX}factory({', '.join(freevars + list(_HELPERS))}):\n"
            f"    def {_PREFIX}prim({', '.join(inputs)}):\n"
            f"        return ({''.join(o + ', ' for o in outputs)})\n"
            f"    return {_PREFIX}prim\n").body[0]
        body = []
        for s in stmts:
            node = gast.gast_to_ast(_LogicRewriter().visit(s))
            ast.increment_lineno(node, self.offset)
            body.append(node)
        line = body[0].lineno if body else self.offset + 1
        for n in ast.walk(factory):  # the wrapper's own lines point at the first statement
            if hasattr(n, "lineno"):
                n.lineno = n.end_lineno = line
        factory.body[0].body[0:0] = body
        module = ast.fix_missing_locations(ast.Module(body=[factory], type_ignores=[]))
        scope: dict[str, Any] = {}
        exec(compile(module, self.filename, "exec"), self.fn.__globals__, scope)
        return scope[f"{_PREFIX}factory"](*[self.closure[v] for v in freevars],
                                          *_HELPERS.values())


class _Block:
    def __init__(self):
        self.ops: list = []
        self.term: Any = None
        self.order: int | None = None  # when it was first entered (source order)


class _FunctionBuilder:
    """Builds one :class:`ir.Function` from one Python function."""

    def __init__(self, src: _Source, name: str, name_of: Callable[[Any], str],
                 arity_of: Callable[[Any], tuple]):
        self.src, self.name, self.name_of, self.arity_of = src, name, name_of, arity_of
        fdef = src.fdef
        a = fdef.args
        if a.vararg or a.kwarg or a.kwonlyargs or a.defaults or a.posonlyargs:
            raise src.error(fdef, "batched functions take plain positional parameters only "
                                  "(no defaults, *args, **kwargs or keyword-only)")
        self.params = tuple(p.id for p in a.args)
        self.locals = set(self.params) | _assigned_names(fdef.body)
        for n in self.locals:
            if n.startswith(_PREFIX):
                raise src.error(fdef, f"local name {n!r} uses the reserved prefix {_PREFIX!r}")
        self.blocks: list[_Block] = []
        self.entered = 0
        self.cur = self._enter(self._new())
        self.pending: list = []
        self.loops: list[tuple[_Block, _Block]] = []
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
        name = f"{_PREFIX}{kind}{self.counter}"
        self.locals.add(name)
        return name

    # -- primitives ---------------------------------------------------------------------
    def flush(self) -> None:
        """Turn the pending straight-line statements into one Primitive."""
        if not self.pending:
            return
        stmts, self.pending = self.pending, []
        inputs: dict[str, None] = {}
        outputs: dict[str, None] = {}
        for s in stmts:
            uses = _loaded(s.value if isinstance(s, (gast.Assign, gast.AnnAssign)) else s,
                           self.locals)
            if isinstance(s, gast.AugAssign):
                uses = _target_names(s.target) + uses
            for u in uses:
                if u not in outputs:
                    inputs.setdefault(u)
            targets = (s.targets if isinstance(s, gast.Assign) else
                       [s.target] if isinstance(s, (gast.AugAssign, gast.AnnAssign)) else [])
            for t in targets:
                for n in _target_names(t):
                    outputs.setdefault(n)
        text = "; ".join(ast.unparse(gast.gast_to_ast(s)) for s in stmts)
        loc = self.src.loc(stmts[0])
        if (len(stmts) == 1 and isinstance(stmts[0], gast.Assign)
                and [type(t) for t in stmts[0].targets] == [gast.Name]
                and isinstance(stmts[0].value, gast.Name) and len(inputs) == 1):
            # `y = x` (and `return x`): a move the passes can see through (see result forwarding)
            self.cur.ops.append(dataclasses.replace(ir.move(tuple(outputs), tuple(inputs), loc),
                                                    text=text))
            return
        fn = self.src.compile_primitive(stmts, tuple(inputs), tuple(outputs))
        self.cur.ops.append(ir.Primitive(tuple(inputs), tuple(outputs), fn, text, loc))

    def _check_expr(self, node: gast.AST) -> None:
        for n in gast.walk(node):
            kind = type(n).__name__
            if kind in _REJECTED_EXPRS:
                raise self.src.error(n, f"{_REJECTED_EXPRS[kind]} is not supported")

    def lift(self, node: gast.AST) -> gast.AST:
        """Replace calls to batched functions in ``node`` by Call ops (A-normal form)."""
        self._check_expr(node)
        builder = self

        class Lifter(gast.NodeTransformer):
            def visit_Lambda(self, n):
                builder._forbid_batched(n, "inside a lambda")
                return n

            def _comp(self, n):
                builder._forbid_batched(n, "inside a comprehension")
                return n

            visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comp

            def visit_Name(self, n):
                if isinstance(n.ctx, gast.Load) and batched_python_function(
                        builder.src.resolve(n, builder.locals)) is not None:
                    raise builder.src.error(n, f"batched function {n.id!r} used as a value; "
                                               "only direct calls are supported")
                return n

            def visit_Call(self, n):
                target = builder.src.resolve(n.func, builder.locals)
                if batched_python_function(target) is None:
                    self.generic_visit(n)
                    return n
                n.args = [self.visit(a) for a in n.args]
                for k in n.keywords:
                    k.value = self.visit(k.value)
                return builder._emit_call(n, target)

        return Lifter().visit(node)

    def _forbid_batched(self, node: gast.AST, where: str) -> None:
        for n in gast.walk(node):
            if isinstance(n, gast.Call) and batched_python_function(
                    self.src.resolve(n.func, self.locals)) is not None:
                raise self.src.error(n, f"call to a batched function {where} is not supported")

    def _emit_call(self, call: gast.Call, target: Any) -> gast.Name:
        params = self.arity_of(target)
        if any(isinstance(a, gast.Starred) for a in call.args) or any(
                k.arg is None for k in call.keywords):
            raise self.src.error(call, "*args/**kwargs in a call to a batched function")
        values: list = list(call.args) + [None] * (len(params) - len(call.args))
        if len(call.args) > len(params):
            raise self.src.error(call, f"too many arguments: {len(call.args)} for {params}")
        for k in call.keywords:
            if k.arg not in params or values[params.index(k.arg)] is not None:
                raise self.src.error(call, f"unexpected or repeated keyword argument {k.arg!r}")
            values[params.index(k.arg)] = k.value
        if any(v is None for v in values):
            missing = [p for p, v in zip(params, values) if v is None]
            raise self.src.error(call, f"missing arguments {missing}")
        args = [self.as_var(v) for v in values]
        self.flush()
        out = self._fresh("r")
        self.cur.ops.append(ir.Call(self.name_of(target), tuple(args), out, self.src.loc(call)))
        return gast.copy_location(_name(out), call)

    def as_var(self, expr: gast.AST, kind: str = "t") -> str:
        """A local holding the value of the (already lifted) expression."""
        if isinstance(expr, gast.Name) and expr.id in self.locals:
            return expr.id
        tmp = self._fresh(kind)
        self.pending.append(_assign(tmp, expr, expr))
        return tmp

    # -- statements ---------------------------------------------------------------------
    def body(self, stmts: list) -> None:
        for s in stmts:
            self.stmt(s)

    def stmt(self, s: gast.stmt) -> None:
        kind = type(s).__name__
        if kind in _REJECTED_STMTS:
            raise self.src.error(s, f"{_REJECTED_STMTS[kind]} is not supported in a batched "
                                    "function")
        handler = getattr(self, f"stmt_{kind}", None)
        if handler is None:
            raise self.src.error(s, f"statement {kind} is not supported in a batched function")
        handler(s)

    def _check_targets(self, targets: list) -> None:
        for t in targets:
            for n in gast.walk(t):
                if isinstance(n, (gast.Attribute, gast.Subscript)):
                    raise self.src.error(n, "assignment to an attribute or subscript (batched "
                                            "values are immutable: build a new value instead)")

    def stmt_Assign(self, s):
        self._check_targets(s.targets)
        s.value = self.lift(s.value)
        self.pending.append(s)

    def stmt_AugAssign(self, s):
        self._check_targets([s.target])
        s.value = self.lift(s.value)
        self.pending.append(s)

    def stmt_AnnAssign(self, s):
        self._check_targets([s.target])
        if s.value is None:
            return
        self.stmt_Assign(gast.copy_location(
            gast.Assign(targets=[s.target], value=s.value, type_comment=None), s))

    def stmt_Expr(self, s):
        if isinstance(s.value, gast.Constant) and isinstance(s.value.value, str):
            return  # docstring
        s.value = self.lift(s.value)
        self.pending.append(s)

    def stmt_Pass(self, s):
        pass

    def stmt_Return(self, s):
        if s.value is None:
            raise self.src.error(s, "a batched function must return a value")
        value = self.lift(s.value)
        self.pending.append(_assign(f"{_PREFIX}ret", value, s))
        self.locals.add(f"{_PREFIX}ret")
        self._terminate(_PendingReturn(f"{_PREFIX}ret"))
        self._enter(self._new())  # unreachable code after return

    def _predicate(self, test: gast.AST) -> str:
        lifted = self.lift(test)
        if not isinstance(lifted, (gast.Compare, gast.BoolOp)) and not (
                isinstance(lifted, gast.UnaryOp) and isinstance(lifted.op, gast.Not)):
            lifted = _helper_call("truth", [lifted], test)
        return self.as_var(lifted, "c")

    def stmt_If(self, s):
        cond = self._predicate(s.test)
        then_b, join = self._new(), self._new()
        else_b = self._new() if s.orelse else join
        self._terminate(_PendingBranch(cond, then_b, else_b, self.src.loc(s)))
        for block, stmts in ((then_b, s.body), (else_b, s.orelse)):
            if block is join:
                continue
            self._enter(block)
            self.body(stmts)
            self._terminate(_PendingJump(join))
        self._enter(join)

    def _loop(self, s, header: _Block, cond: str, setup_body: list) -> None:
        body_b, exit_b = self._new(), self._new()
        self._terminate(_PendingBranch(cond, body_b, exit_b, self.src.loc(s)))
        self._enter(body_b)
        self.pending.extend(setup_body)
        self.loops.append((header, exit_b))
        self.body(s.body)
        self.loops.pop()
        self._terminate(_PendingJump(header))
        self._enter(exit_b)

    def stmt_While(self, s):
        if s.orelse:
            raise self.src.error(s, "while/else is not supported")
        header = self._new()
        self._terminate(_PendingJump(header))
        self._enter(header)
        self._loop(s, header, self._predicate(s.test), [])

    def stmt_For(self, s):
        if s.orelse:
            raise self.src.error(s, "for/else is not supported")
        it = s.iter
        if not (isinstance(it, gast.Call) and isinstance(it.func, gast.Name)
                and it.func.id == "range" and self.src.resolve(it.func, self.locals) is range
                and 1 <= len(it.args) <= 3 and not it.keywords):
            raise self.src.error(s, "only `for <name> in range(...)` loops are supported")
        if not isinstance(s.target, gast.Name):
            raise self.src.error(s, "the loop variable of a range loop must be a plain name")
        args = [self.lift(a) for a in it.args]
        start = args[0] if len(args) > 1 else gast.Constant(value=0, kind=None)
        end = args[1] if len(args) > 1 else args[0]
        step = 1
        if len(args) == 3:
            if not (isinstance(args[2], gast.Constant) and isinstance(args[2].value, int)
                    and args[2].value != 0):
                raise self.src.error(s, "the step of a range loop must be a nonzero int literal")
            step = args[2].value
        end_v = self.as_var(end, "end")
        counter = self._fresh("i")
        self.pending.append(_assign(counter, _helper_call("start", [start, _name(end_v)], s), s))
        header = self._new()
        self._terminate(_PendingJump(header))
        self._enter(header)
        op = gast.Lt() if step > 0 else gast.Gt()
        cond = self._fresh("c")
        self.pending.append(_assign(cond, gast.Compare(left=_name(counter), ops=[op],
                                                       comparators=[_name(end_v)]), s))
        setup = [_assign(s.target.id, _name(counter), s),
                 _assign(counter, gast.BinOp(left=_name(counter), op=gast.Add(),
                                             right=gast.Constant(value=step, kind=None)), s)]
        self._loop(s, header, cond, setup)

    def stmt_Break(self, s):
        if not self.loops:
            raise self.src.error(s, "break outside a loop")
        self._terminate(_PendingJump(self.loops[-1][1]))
        self._enter(self._new())

    def stmt_Continue(self, s):
        if not self.loops:
            raise self.src.error(s, "continue outside a loop")
        self._terminate(_PendingJump(self.loops[-1][0]))
        self._enter(self._new())

    # -- finish -------------------------------------------------------------------------
    def build(self) -> ir.Function:
        self.body(self.src.fdef.body)
        self.flush()
        entry = self.blocks[0]
        reachable, stack = [], [entry]
        seen = {id(entry)}
        while stack:
            b = stack.pop()
            reachable.append(b)
            if b.term is None:
                raise self.src.error(self.src.fdef, f"{self.name} can reach its end without "
                                                    "a return statement")
            for nxt in b.term.targets():
                if id(nxt) not in seen:
                    seen.add(id(nxt))
                    stack.append(nxt)
        reachable.sort(key=lambda b: b.order)
        index = {id(b): i for i, b in enumerate(reachable)}
        blocks = tuple(ir.Block(f"{self.name}.{i}", tuple(b.ops), b.term.resolve(index))
                       for i, b in enumerate(reachable))
        return ir.Function(self.name, self.params, blocks, f"{_PREFIX}ret",
                           self.src.loc(self.src.fdef))


class _PendingJump:
    def __init__(self, target: _Block):
        self.target = target

    def targets(self):
        return (self.target,)

    def resolve(self, index):
        return ir.Jump(index[id(self.target)])


class _PendingBranch:
    def __init__(self, cond: str, true: _Block, false: _Block, loc: str):
        self.cond, self.true, self.false, self.loc = cond, true, false, loc

    def targets(self):
        return (self.true, self.false)

    def resolve(self, index):
        return ir.Branch(self.cond, index[id(self.true)], index[id(self.false)], self.loc)


class _PendingReturn:
    def __init__(self, value: str):
        self.value = value

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
        name = names[id(obj)]
        functions[name] = _FunctionBuilder(_Source(batched_python_function(obj)), name,
                                           name_of, arity_of).build()
        i += 1
    return ir.Program(functions, names[id(main)], notes=("frontend",))
