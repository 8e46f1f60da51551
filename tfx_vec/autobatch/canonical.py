"""A batched function's source in canonical form, through AutoGraph's own machinery.

The front end (:mod:`.frontend`) builds blocks from a function whose only control flow is
``if``, ``while``, ``for ... in range(...)`` and one final ``return``, and in which every call
to a batched function is an assignment of its own with plain names as arguments.  This module
gets there in stages, each one function, most of them AutoGraph's
(``tensorflow.python.autograph.pyct`` and ``autograph.converters``, as TFP's auto_batching
front end uses them):

1. :func:`read_source`: ``parser.parse_entity`` and ``inspect_utils`` (the namespace of
   globals and closure cells the function's names resolve in), ``origin_info`` (source lines).
2. :func:`check_syntax`: what cannot be batched is refused, naming file and line.
   :func:`fold_static_tests`: an ``if`` or ``while`` testing only Python values the function
   reads from its closure or module (a flag, a count) is decided now, as a ``tf.function``
   trace decides Python conditions, and code that can no longer run is dropped.
3. :func:`hoist_loop_calls`: a ``while`` whose test calls a batched function tests at the top
   of a ``while True`` body instead (A-normal form cannot precompute a loop test).
4. AutoGraph's ``break_statements``, ``continue_statements`` and ``return_statements``
   converters: ``break``/``continue`` become flags that guard the rest of the loop body and
   extend the loop test; early ``return`` s set ``do_return``/``retval_`` and guard what follows,
   leaving one ``return retval_`` at the end.
5. :func:`strip_return_guards`: the ``try`` the return converter wraps around each return is
   unwrapped (batched code raises no exceptions per member); ``do_return`` is initialized when
   something reads it and dropped when nothing does.
6. :func:`rewrite_logic`: ``and``/``or``/``not``, chained comparisons and ``==``/``!=`` call
   :mod:`.logic` (element-wise, both sides evaluated); conditions go through ``truth``.
7. AutoGraph's A-normal form (``common_transformers.anf``): calls to batched functions (and
   their non-trivial arguments, and ``if`` tests) are lifted into assignments of their own.
8. Line numbers for generated statements, then ``qual_names`` and ``static_analysis.activity``:
   what every statement reads and writes.

Example:
    >>> from tfx_vec import autobatch as ab
    >>> @ab.function
    ... def clip(x):
    ...     if x > 3:
    ...         return 3
    ...     return x
    >>> fdef = canonicalize(clip.__wrapped__).fdef
    >>> import ast, gast
    >>> print(ast.unparse(gast.gast_to_ast(fdef)).replace("    ", " "))
    @ab.function
    def clip(x):
     _ab_t1 = x > 3
     if _ab_t1:
      retval_ = 3
     else:
      retval_ = x
     return retval_
"""
from __future__ import annotations

import builtins
import dataclasses
import inspect
import itertools
import operator
from typing import Any, Callable

import gast
import numpy as np
from tensorflow.python.autograph.converters import (break_statements, continue_statements,
                                                    return_statements)
from tensorflow.python.autograph.core import converter
from tensorflow.python.autograph.pyct import (anno, errors, inspect_utils, naming, origin_info,
                                              parser, qual_names, templates, transformer)
from tensorflow.python.autograph.pyct.common_transformers import anf
from tensorflow.python.autograph.pyct.static_analysis import activity
from tensorflow.python.autograph.pyct.static_analysis.annos import NodeAnno

from .errors import UnsupportedSyntaxError
from .logic import PREFIX

__all__ = ["Source", "Canonical", "canonicalize", "read_source", "check_syntax",
           "fold_static_tests", "hoist_loop_calls", "strip_return_guards", "rewrite_logic",
           "extra_loop_test"]

_REJECTED_STMTS = {
    "Try": "try/except", "TryStar": "try/except*", "With": "with", "AsyncWith": "async with",
    "Raise": "raise", "Global": "global", "Nonlocal": "nonlocal", "Delete": "del",
    "Import": "import", "ImportFrom": "import", "Assert": "assert (use tf.debugging in a "
    "helper function)", "FunctionDef": "a nested def", "AsyncFunctionDef": "a nested def",
    "ClassDef": "a nested class", "Match": "match", "AsyncFor": "async for",
}
_REJECTED_EXPRS = {"Yield": "yield", "YieldFrom": "yield from", "Await": "await",
                   "NamedExpr": "an assignment expression (:=)"}
_OPAQUE = (gast.Lambda, gast.ListComp, gast.SetComp, gast.DictComp, gast.GeneratorExp,
           gast.IfExp)
_NO_SOURCE = (
    "ab.function compiles a function from its Python source, and the source of {name!r} "
    "cannot be read ({error}). Functions typed into an interactive interpreter or created "
    "with exec() have none: put the function in a .py file and import it (or run the file "
    "with `python file.py`); IPython and Jupyter keep the source of their cells, so they "
    "work too.")


def batched_python_function(obj: Any) -> Callable | None:
    """The Python function behind an ``ab.function`` object, or None for anything else."""
    return getattr(obj, "_autobatch_python_fn", None)


# {{{ where the code comes from

class Source:
    """A function's parsed source: tree, file, line offset, the namespace its names resolve in.

    ``namespace`` is AutoGraph's (``inspect_utils.getnamespace``: globals, then closure cells);
    ``closure`` the closure cells alone (compiled primitives take them as parameters).
    """

    def __init__(self, fn: Callable):
        self.fn = fn
        name = getattr(fn, "__qualname__", repr(fn))
        try:
            self.filename = inspect.getsourcefile(fn) or "<unknown>"
            _, first = inspect.getsourcelines(fn)
            # (no __future__ preamble: none changes what a function body means in Python 3,
            # and without it the parsed lines are the source's)
            node, self.text = parser.parse_entity(fn, future_features=())
        except (OSError, TypeError, errors.InaccessibleSourceCodeError) as e:
            raise UnsupportedSyntaxError(_NO_SOURCE.format(name=name, error=e)) from e
        if "__autograph_generated" in self.filename:
            raise UnsupportedSyntaxError(
                f"{name} was rewritten by AutoGraph before ab.function saw it (it is defined "
                "inside code that a tf.function converts); decorate the enclosing factory "
                "with @tf.autograph.experimental.do_not_convert")
        self.offset = first - 1
        if not isinstance(node, gast.FunctionDef):
            raise UnsupportedSyntaxError(f"{self.filename}:{first}: ab.function needs a `def` "
                                         f"(got a lambda?)")
        # AutoGraph's origin annotations survive its converters (line numbers do not)
        origin_info.resolve(node, self.text, self.filename, self.offset + 1, 0)
        self.tree = node
        self.namespace = inspect_utils.getnamespace(fn)
        self.closure = {}
        for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                self.closure[var] = cell.cell_contents
            except ValueError:
                pass  # not yet bound: resolved as a plain name at run time

    def loc(self, node: gast.AST) -> str:
        return f"{self.filename}:{(getattr(node, 'lineno', None) or 1) + self.offset}"

    def error(self, node: gast.AST, msg: str) -> UnsupportedSyntaxError:
        return UnsupportedSyntaxError(f"{self.loc(node)}: {msg} (in {self.fn.__qualname__})")

    def resolve(self, node: gast.AST, local_names: set[str]) -> Any:
        """The object a name or attribute chain denotes (None if unknown or a local)."""
        if not anno.hasanno(node, anno.Basic.QN):
            return None
        return self._resolve_qn(anno.getanno(node, anno.Basic.QN), local_names)

    def _resolve_qn(self, qn: qual_names.QN, local_names: set[str]) -> Any:
        if qn.has_attr():
            base = self._resolve_qn(qn.parent, local_names)
            try:
                return getattr(base, qn.attr) if base is not None else None
            except Exception:  # a property that fails is simply not a batched function
                return None
        if not qn.is_simple() or str(qn) in local_names:
            return None
        name = str(qn)
        return self.namespace[name] if name in self.namespace else getattr(builtins, name,
                                                                           None)

    def batched(self, node: gast.AST, local_names: set[str]) -> Any:
        """The ``ab.function`` a call's callee denotes, or None."""
        target = self.resolve(node, local_names)
        return target if batched_python_function(target) is not None else None


def read_source(fn: Callable) -> tuple[Source, transformer.Context]:
    """Parse ``fn`` and make the AutoGraph context its converters run in."""
    src = Source(fn)
    info = transformer.EntityInfo(name=fn.__name__, source_code=src.text, source_file=None,
                                  future_features=(), namespace=src.namespace)
    ctx = transformer.Context(info=info, namer=naming.Namer(src.namespace),
                              user_context=converter.ProgramContext(
                                  options=converter.ConversionOptions(recursive=False),
                                  autograph_module=None))
    return src, ctx

# }}}

# {{{ syntax checks


def _target_names(target: gast.AST) -> list[str]:
    if isinstance(target, gast.Name):
        return [target.id]
    if isinstance(target, (gast.Tuple, gast.List)):
        return [n for e in target.elts for n in _target_names(e)]
    if isinstance(target, gast.Starred):
        return _target_names(target.value)
    return []


def _locals_of(fdef: gast.FunctionDef) -> set[str]:
    """Parameters and every name the body binds (Python's scoping rule)."""
    scope = anno.getanno(fdef, NodeAnno.BODY_SCOPE)
    return {a.id for a in fdef.args.args} | {str(q) for q in scope.bound if q.is_simple()}


def check_syntax(src: Source, ctx: transformer.Context) -> gast.FunctionDef:
    """Refuse what cannot be batched; returns the tree with names resolved."""
    fdef = activity.resolve(qual_names.resolve(src.tree), ctx, None)
    a = fdef.args
    if a.vararg or a.kwarg or a.kwonlyargs or a.defaults or a.posonlyargs:
        raise src.error(fdef, "batched functions take plain positional parameters only "
                              "(no defaults, *args, **kwargs or keyword-only)")
    local_names = _locals_of(fdef)
    for n in sorted(local_names):
        if n.startswith(PREFIX):
            raise src.error(fdef, f"local name {n!r} uses the reserved prefix {PREFIX!r}")
    for stmt in fdef.body:
        for node in gast.walk(stmt):
            _check_node(src, node, local_names)
    if not _definitely_returns(fdef.body):
        raise src.error(fdef, f"{fdef.name} can reach its end without a return statement")
    return fdef


def _definitely_returns(stmts: list) -> bool:
    """Does every path through ``stmts`` end in a ``return`` (or never end)?"""
    for s in stmts:
        if isinstance(s, gast.Return):
            return True
        if isinstance(s, gast.If) and _definitely_returns(s.body) and _definitely_returns(
                s.orelse):
            return True
        if _endless(s):
            return True
    return False


def _is_true(test: gast.expr) -> bool:
    """Is ``test`` the literal ``True``?"""
    return isinstance(test, gast.Constant) and test.value is True


def _endless(s: gast.stmt) -> bool:
    """Is ``s`` a ``while True:`` loop that never breaks?"""
    return isinstance(s, gast.While) and _is_true(s.test) and not _breaks(s.body)


def _breaks(stmts: list) -> bool:
    """Does a ``break`` in ``stmts`` leave the loop they are the body of?"""
    for s in stmts:
        if isinstance(s, gast.Break):
            return True
        if isinstance(s, gast.If) and (_breaks(s.body) or _breaks(s.orelse)):
            return True
    return False


def _check_node(src: Source, node: gast.AST, local_names: set[str]) -> None:
    kind = type(node).__name__
    if kind in _REJECTED_STMTS:
        raise src.error(node, f"{_REJECTED_STMTS[kind]} is not supported in a batched function")
    if kind in _REJECTED_EXPRS:
        raise src.error(node, f"{_REJECTED_EXPRS[kind]} is not supported")
    if isinstance(node, (gast.Assign, gast.AugAssign, gast.AnnAssign, gast.For)):
        for t in node.targets if isinstance(node, gast.Assign) else [node.target]:
            for n in gast.walk(t):
                if isinstance(n, (gast.Attribute, gast.Subscript)):
                    raise src.error(n, "assignment to an attribute or subscript (batched "
                                       "values are immutable: build a new value instead)")
    if isinstance(node, gast.Return) and node.value is None:
        raise src.error(node, "a batched function must return a value")
    if isinstance(node, (gast.While, gast.For)) and node.orelse:
        raise src.error(node, f"{kind.lower()}/else is not supported")
    if isinstance(node, gast.For):
        _check_range_loop(src, node, local_names)
    if isinstance(node, _OPAQUE):
        where = ("inside a conditional expression (use an if statement)"
                 if isinstance(node, gast.IfExp) else
                 "inside a lambda" if isinstance(node, gast.Lambda) else
                 "inside a comprehension")
        for n in gast.walk(node):
            if isinstance(n, gast.Call) and src.batched(n.func, local_names) is not None:
                raise src.error(n, f"call to a batched function {where} is not supported")
    if isinstance(node, gast.Call) and src.batched(node.func, local_names) is not None:
        if any(isinstance(x, gast.Starred) for x in node.args) or any(
                k.arg is None for k in node.keywords):
            raise src.error(node, "*args/**kwargs in a call to a batched function")
        node.func.ab_callee = True  # a callee position, not a use as a value
    if (isinstance(node, (gast.Name, gast.Attribute)) and isinstance(node.ctx, gast.Load)
            and not getattr(node, "ab_callee", False)
            and src.batched(node, local_names) is not None):
        text = parser.unparse(node, include_encoding_marker=False).strip()
        raise src.error(node, f"batched function {text!r} used as a value; only direct calls "
                              "are supported")


def _check_range_loop(src: Source, node: gast.For, local_names: set[str]) -> None:
    it = node.iter
    if not (isinstance(it, gast.Call) and isinstance(it.func, gast.Name)
            and src.resolve(it.func, local_names) is range
            and 1 <= len(it.args) <= 3 and not it.keywords):
        raise src.error(node, "only `for <name> in range(...)` loops are supported")
    if not isinstance(node.target, gast.Name):
        raise src.error(node, "the loop variable of a range loop must be a plain name")
    if len(it.args) == 3 and not (isinstance(it.args[2], gast.Constant)
                                  and isinstance(it.args[2].value, int)
                                  and not isinstance(it.args[2].value, bool)
                                  and it.args[2].value != 0):
        raise src.error(node, "the step of a range loop must be a nonzero int literal")

# }}}

# {{{ canonicalizing transformations


# {{{ tests decided when the function is compiled

_NOT_STATIC = object()
_STATIC_TYPES = (bool, int, float, str, type(None), np.bool_, np.integer, np.floating)
_COMPARE = {gast.Eq: operator.eq, gast.NotEq: operator.ne, gast.Lt: operator.lt,
            gast.LtE: operator.le, gast.Gt: operator.gt, gast.GtE: operator.ge,
            gast.Is: operator.is_, gast.IsNot: operator.is_not}


def _static_value(src: Source, node: gast.expr, local_names: set[str]) -> Any:
    """The value of ``node`` when it is made of constants and of names that are not the
    function's own and hold Python or NumPy scalars, with ``not``, ``and``, ``or`` and
    comparisons (nothing is called); ``_NOT_STATIC`` otherwise."""
    if isinstance(node, gast.Constant):
        return node.value
    if isinstance(node, gast.Name):
        if node.id in local_names or node.id not in src.namespace:
            return _NOT_STATIC
        value = src.namespace[node.id]
        return value if isinstance(value, _STATIC_TYPES) else _NOT_STATIC
    parts: list = []
    if isinstance(node, gast.UnaryOp) and isinstance(node.op, gast.Not):
        parts = [node.operand]
    elif isinstance(node, gast.BoolOp):
        parts = node.values
    elif isinstance(node, gast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        parts = [node.left, *node.comparators]
    values = [_static_value(src, x, local_names) for x in parts]
    if not values or any(v is _NOT_STATIC for v in values):
        return _NOT_STATIC
    if isinstance(node, gast.UnaryOp):
        return not values[0]
    if isinstance(node, gast.BoolOp):
        return (all if isinstance(node.op, gast.And) else any)(bool(v) for v in values)
    return all(_COMPARE[type(op)](a, b)
               for op, a, b in zip(node.ops, values[:-1], values[1:]))


def _folded_test(src: Source, node: gast.expr, local_names: set[str]) -> Any:
    """A test decided now (a bool), or the test with the static operands of its top ``and``
    / ``or`` that cannot change its value dropped (``flag or x < n`` -> ``x < n`` when
    ``flag`` is false); a static operand that decides it decides it only when it comes
    first (what follows may call a batched function)."""
    value = _static_value(src, node, local_names)
    if value is not _NOT_STATIC:
        return bool(value)
    if not isinstance(node, gast.BoolOp):
        return node
    deciding = isinstance(node.op, gast.Or)  # the operand value that decides an `or`
    kept = []
    for x in node.values:
        v = _static_value(src, x, local_names)
        if v is _NOT_STATIC:
            kept.append(x)
        elif bool(v) == deciding and not kept:
            return deciding
        elif bool(v) == deciding:
            kept.append(x)
    if len(kept) == 1:
        return kept[0]
    folded = gast.BoolOp(op=node.op, values=kept)
    anno.copyanno(node, folded, anno.Basic.ORIGIN)
    return folded


_LEAVES = (gast.Return, gast.Break, gast.Continue)


def _fold_body(src: Source, stmts: list, local_names: set[str], changed: list) -> list:
    """``stmts`` with static tests decided, recursively, and cut after the first statement
    that never lets control reach the next one; ``changed`` gets an entry per change."""
    out: list = []
    for k, s in enumerate(stmts):
        if isinstance(s, (gast.If, gast.While)):
            test = _folded_test(src, s.test, local_names)
            if test is True and _is_true(s.test):
                test = s.test  # `while True:` as it is
            if test is not s.test:
                changed.append(s)
            if isinstance(s, gast.If) and isinstance(test, bool):
                out.extend(_fold_body(src, s.body if test else s.orelse, local_names, changed))
                if out and isinstance(out[-1], _LEAVES):
                    break
                continue
            if isinstance(s, gast.While) and test is False:
                out.extend(_fold_body(src, s.orelse, local_names, changed))
                continue
            if test is True:
                test = gast.Constant(value=True, kind=None)
                anno.copyanno(s.test, test, anno.Basic.ORIGIN)
            s.test = test
        for field in ("body", "orelse"):
            if getattr(s, field, None):
                setattr(s, field, _fold_body(src, getattr(s, field), local_names, changed)
                        or [gast.Pass()])
        out.append(s)
        if isinstance(s, _LEAVES) or _endless(s):
            changed.extend(stmts[k + 1:])
            break
    return out


def fold_static_tests(src: Source, ctx: transformer.Context,
                      fdef: gast.FunctionDef) -> gast.FunctionDef:
    """Decide each ``if`` or ``while`` test that reads only Python values from the
    function's closure or module (``if many_steps:``, ``while done_once or n > 0:``),
    keeping the branch taken (a ``while`` decided true loops until it breaks), and drop what
    follows a ``return``, ``break``, ``continue`` or a loop that never breaks: the program is
    specialized on those values when it is compiled (as a ``tf.function`` traces Python
    conditions once), and the branch not taken costs no blocks.  A test reading a local,
    a tensor or a call stays a batched branch.  Returns the tree, names resolved again if it
    changed."""
    changed: list = []
    fdef.body = _fold_body(src, fdef.body, _locals_of(fdef), changed)
    if not changed:
        return fdef
    return activity.resolve(qual_names.resolve(fdef), ctx, None)

# }}}


class _Gensym:
    """Fresh names with the reserved prefix (user locals never start with it)."""

    def __init__(self, counter: itertools.count):
        self.counter = counter

    def new_name(self, stem: str = "t") -> str:
        return f"{PREFIX}{stem if stem != 'tmp' else 't'}{next(self.counter)}"


def hoist_loop_calls(src: Source, fdef: gast.FunctionDef, gensym: _Gensym) -> None:
    """``while <test calling a batched function>: body`` becomes
    ``while True: c = <test>; if not c: break; body`` (in place)."""
    local_names = _locals_of(fdef)

    class Hoister(gast.NodeTransformer):
        def visit_While(self, node):
            self.generic_visit(node)
            if not any(isinstance(n, gast.Call) and src.batched(n.func, local_names) is not None
                       for n in gast.walk(node.test)):
                return node
            name = gensym.new_name("w")
            node.body = templates.replace("name = test\nif not name:\n    break",
                                          name=name, test=node.test) + node.body
            node.test = gast.Constant(value=True, kind=None)
            return node

    Hoister().visit(fdef)


def _is_return_try(node: gast.AST) -> bool:
    """The ``try: do_return = True; retval_ = value / except: do_return = False; raise``
    that AutoGraph's return converter puts around each return."""
    if not (isinstance(node, gast.Try) and len(node.body) == 2 and len(node.handlers) == 1
            and not node.orelse and not node.finalbody):
        return False
    flag, handler = node.body[0], node.handlers[0]
    return (isinstance(flag, gast.Assign) and isinstance(flag.value, gast.Constant)
            and flag.value.value is True and handler.type is None
            and len(handler.body) == 2 and isinstance(handler.body[1], gast.Raise))


def extra_loop_test(node: gast.For) -> gast.expr | None:
    """The condition AutoGraph's converters attach to a ``for`` loop (``not break_``...)."""
    return anno.getanno(node, anno.Basic.EXTRA_LOOP_TEST, default=None)


def strip_return_guards(fdef: gast.FunctionDef) -> None:
    """Unwrap the return converter's ``try`` s; initialize ``do_return`` when it is read,
    drop its assignments when it is not (in place)."""
    flags: set[str] = set()

    class Unwrap(gast.NodeTransformer):
        def visit_Try(self, node):
            if not _is_return_try(node):
                return node
            flags.add(node.body[0].targets[0].id)
            return [self.visit(s) for s in node.body]

    Unwrap().visit(fdef)
    if not flags:
        return
    (flag,) = flags
    exprs = [fdef] + [t for n in gast.walk(fdef) if isinstance(n, gast.For)
                      for t in [extra_loop_test(n)] if t is not None]
    read = any(isinstance(n, gast.Name) and n.id == flag and isinstance(n.ctx, gast.Load)
               for e in exprs for n in gast.walk(e))
    if read:
        fdef.body[0:0] = templates.replace("flag = False", flag=flag)
        return

    class Drop(gast.NodeTransformer):
        def visit_Assign(self, node):
            return None if _target_names(node.targets[0]) == [flag] else node

    Drop().visit(fdef)


def _helper_call(name: str, args: list, like: gast.AST) -> gast.Call:
    call = gast.Call(func=gast.Name(id=PREFIX + name, ctx=gast.Load(), annotation=None,
                                    type_comment=None), args=args, keywords=[])
    return gast.copy_location(call, like)


def _comparison(left: gast.expr, op: gast.cmpop, right: gast.expr, like: gast.AST) -> gast.expr:
    if isinstance(op, (gast.Eq, gast.NotEq)):
        return _helper_call("eq" if isinstance(op, gast.Eq) else "ne", [left, right], like)
    return gast.copy_location(gast.Compare(left=left, ops=[op], comparators=[right]), like)


def _is_boolean(test: gast.expr) -> bool:
    """Is ``test`` (rewritten) a comparison, ``not`` or ``==``, which give booleans already?"""
    return isinstance(test, gast.Compare) or (
        isinstance(test, gast.Call) and isinstance(test.func, gast.Name)
        and test.func.id in (PREFIX + "not", PREFIX + "eq", PREFIX + "ne"))


class _LogicRewriter(gast.NodeTransformer):
    """``and``/``or``/``not``/chained comparisons/``==``/``!=`` -> :mod:`.logic` helpers;
    ``if``/``while`` tests -> ``truth(test)``."""

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

    def _test(self, node):
        self.generic_visit(node)
        if not _is_boolean(node.test):
            node.test = _helper_call("truth", [node.test], node.test)
        return node

    visit_If = visit_While = _test

    def visit_For(self, node):
        self.generic_visit(node)
        test = extra_loop_test(node)
        if test is not None:
            anno.setanno(node, anno.Basic.EXTRA_LOOP_TEST, self.visit(test))
        return node


def rewrite_logic(fdef: gast.FunctionDef) -> None:
    """See :class:`_LogicRewriter` (in place)."""
    _LogicRewriter().visit(fdef)


class _Anf(anf.AnfTransformer):
    """AutoGraph's A-normal form, leaving lambdas, comprehensions and conditional expressions
    whole (they hold no batched calls: :func:`check_syntax`) and naming temporaries with the
    reserved prefix."""

    def __init__(self, ctx, config, gensym: _Gensym):
        super().__init__(ctx, config)
        self._gensym = gensym

    def _whole(self, node):
        return node

    visit_Lambda = visit_ListComp = visit_SetComp = visit_DictComp = _whole
    visit_GeneratorExp = visit_IfExp = _whole


def _anf(src: Source, fdef: gast.FunctionDef, ctx: transformer.Context,
         gensym: _Gensym) -> gast.FunctionDef:
    local_names = _locals_of(activity.resolve(qual_names.resolve(fdef), ctx, None))

    def batched_call(node: gast.AST) -> bool:
        return isinstance(node, gast.Call) and src.batched(node.func, local_names) is not None

    def lift(parent: gast.AST, field: str, child: gast.AST) -> bool:
        return batched_call(child) or (batched_call(parent) and field in ("args", "keywords"))

    config = [(anf.ASTEdgePattern(gast.If, "test", anf.ANY), anf.REPLACE),
              (anf.ASTEdgePattern(anf.ANY, anf.ANY, anf.ANY), lift)]
    return _Anf(ctx, config, gensym).visit(fdef)


def _number_lines(src: Source, stmts: list, line: int) -> int:
    """Line numbers (relative to the parsed text, as the parser gave them) from AutoGraph's
    origin annotations, which survive its converters: a statement takes the line of the first
    of the user's expressions inside it, else its own, else the line of the statement before.
    Returns the last line."""
    for s in stmts:
        # the user's expressions first: statements the converters build carry some origin
        nodes = sorted(gast.walk(s), key=lambda n: isinstance(n, gast.stmt))
        lines = [anno.getanno(n, anno.Basic.ORIGIN).loc.lineno - src.offset
                 for n in nodes if anno.hasanno(n, anno.Basic.ORIGIN)]
        s.lineno = lines[0] if lines else line
        s.end_lineno = max(getattr(s, "end_lineno", None) or s.lineno, s.lineno)
        line = s.lineno
        for field in ("body", "orelse"):
            line = _number_lines(src, getattr(s, field, None) or [], line)
    return line

# }}}


@dataclasses.dataclass
class Canonical:
    """A function in canonical form: ``fdef`` with activity scopes, its parameters, every local
    name, the variable it returns (None when it can fall off its end) and its source."""
    fdef: gast.FunctionDef
    params: tuple[str, ...]
    locals: frozenset
    result: str | None
    source: Source


def canonicalize(fn: Callable) -> Canonical:
    """Run the stages of the module docstring on ``fn``.

    Raises:
      UnsupportedSyntaxError: naming file and line of the first construct that cannot be
        batched.
    """
    src, ctx = read_source(fn)
    fdef = fold_static_tests(src, ctx, check_syntax(src, ctx))
    gensym = _Gensym(itertools.count(1))
    hoist_loop_calls(src, fdef, gensym)
    fdef = break_statements.transform(fdef, ctx)
    fdef = continue_statements.transform(fdef, ctx)
    fdef = return_statements.transform(fdef, ctx, default_to_null_return=False)
    strip_return_guards(fdef)
    rewrite_logic(fdef)
    fdef = _anf(src, fdef, ctx, gensym)
    _number_lines(src, fdef.body, 1)
    fdef = activity.resolve(qual_names.resolve(fdef), ctx, None)
    last = fdef.body[-1] if fdef.body else None
    result = last.value.id if isinstance(last, gast.Return) else None
    return Canonical(fdef, tuple(a.id for a in fdef.args.args), frozenset(_locals_of(fdef)),
                     result, src)
