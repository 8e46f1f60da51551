"""``tf.Module`` methods recorded as one node: which methods, and what makes them replayable.

A training step written against ``tf.Module`` (the core tutorials' layers and their own Adam)
issues every op from the program's Python through TensorFlow's op wrappers; inside
``lazy.device()`` that Python, not the arithmetic, is nearly the whole step.  So the public
methods and ``__call__`` of the ``tf.Module`` subclasses a program defines (on ``tf.Module``
itself, not on a library's subclass of it) are recorded as
*units*, exactly as Keras calls are (``units.py``: a probe runs the first call op by op, later
calls with the same signature and the same Python state record one ``call`` node that the
compiled program replays).

Keras' contract for ``call`` (what ``model.fit`` compiles) does not bind a ``tf.Module``, so a
method becomes a unit only when a static scan of its code, and of the code it can reach (the
methods of its module's and submodules' classes, the functions they name as globals, in
closures or in attributes, all defined outside the libraries), finds nothing a replay could
not reproduce:

- no ``global`` or ``nonlocal`` assignment;
- no ``print``, ``input``, ``open``, ``exec``, ``eval``, ``breakpoint``, ``logging``,
  ``warnings``, and no name ``random``, ``time`` or ``datetime`` (Python's, NumPy's and
  TensorFlow's random numbers, clocks);
- no global or closure value that can change in place (a list, dict, set or NumPy array), and
  no NumPy array attribute of the module or its submodules.

The globals and closure values the scanned code reads, and the program's plain objects the
modules hold (a configuration object), are then part of the unit's Python state, compared by
identity on every call like the modules' attributes: rebinding one (a global learning rate
set to a new float) makes the next call a probe again.  What the scan cannot see (a library
function with side effects, a mutable object reached through another object) is the
assumption a unit makes, as ``tf.function`` makes it for every method it traces;
``lazy.configure(record_calls=False)`` runs every method op by op.

Also here: inside the device, ``tf.Module``'s attribute walk (``variables``,
``trainable_variables``, ``submodules``), which a step reads once or twice, keeps its result
while the modules' Python state is unchanged (:func:`install_walk_cache`).

Example (the scan; ``tests/lazy/test_module_units.py`` trains programs through it):
    >>> import tensorflow as tf
    >>> from tfx_vec.lazy import module_units
    >>> class Scale(tf.Module):
    ...     def __init__(self):
    ...         self.w = tf.Variable(2.0)
    ...     def __call__(self, x):
    ...         return self.w * x + 1.0
    ...     def show(self, x):
    ...         print(x)
    ...         return self(x)
    >>> type(module_units.scan(Scale.__call__, [Scale()])).__name__
    'Guard'
    >>> module_units.scan(Scale.show, [Scale()]).split(" (")[0]
    'it prints'
"""
from __future__ import annotations

import dis
import inspect
import types
import weakref
from typing import Any, Callable, Iterable

import numpy as np
import tensorflow as tf
from tensorflow.python.module import module as _tf_module
from tensorflow.python.util import nest

__all__ = ["is_user_class", "methods", "Guard", "scan", "module_objects", "install_walk_cache"]

# Top-level packages whose code is not scanned: their functions are the ops a unit replays.
_LIBRARIES = frozenset({
    "tensorflow", "tensorflow_probability", "keras", "tf_keras", "tfx_vec", "numpy", "jax",
    "builtins", "abc", "functools", "typing", "collections", "contextlib", "operator",
    "itertools", "math", "dataclasses", "enum", "copy", "weakref",
})
_SIDE_EFFECTS = {
    "print": "it prints", "input": "it reads input", "open": "it opens a file",
    "exec": "it calls exec", "eval": "it calls eval", "breakpoint": "it calls breakpoint",
    "logging": "it logs", "warnings": "it warns", "random": "it draws random numbers",
    "time": "it reads a clock", "datetime": "it reads a clock",
}
_MUTABLE = (list, dict, set, bytearray, np.ndarray)
_GLOBAL_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_GLOBAL_STORES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL", "STORE_NAME", "DELETE_NAME"})
_DEREF_STORES = frozenset({"STORE_DEREF", "DELETE_DEREF"})


def _library(module_name: str | None) -> bool:
    return (module_name or "builtins").partition(".")[0] in _LIBRARIES


def is_user_class(cls: type) -> bool:
    """A ``tf.Module`` subclass the program defined on ``tf.Module`` itself: not TensorFlow's,
    TFP's or Keras' own, nor a subclass of theirs (a ``tf_keras`` layer, a TFP distribution),
    whose methods their library calls under its own contract."""
    if not issubclass(cls, tf.Module) or _library(cls.__module__):
        return False
    bases = set(tf.Module.__mro__)
    return all(c in bases or not _library(c.__module__) for c in cls.__mro__)


def methods(cls: type) -> list[str]:
    """The names of ``cls``' own methods recorded as units: ``__call__`` and the public plain
    functions (not generators, coroutines, properties, static or class methods)."""
    out = []
    for name, fn in cls.__dict__.items():
        if name != "__call__" and name.startswith("_"):
            continue
        if not inspect.isfunction(fn) or fn.__code__.co_flags & (
                inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
            continue
        out.append(name)
    return out


def module_objects(owner: Any) -> list:
    """The objects whose attributes are the module's Python state: the module, its
    submodules, and the program's own plain objects they hold (a configuration object),
    directly or in a list, tuple or dict."""
    modules = [owner, *owner.submodules]
    seen = set(map(id, modules))
    plain = []
    for m in modules:
        for value in vars(m).values():
            inner = value.values() if isinstance(value, dict) else \
                value if isinstance(value, (list, tuple)) else ()
            for v in (value, *inner):
                if id(v) not in seen and _plain_object(v):
                    seen.add(id(v))
                    plain.append(v)
    return modules + plain


def _plain_object(value: Any, slotted: bool = False) -> bool:
    """An instance of a class the program defined, not a module, with (or, ``slotted``,
    without) a ``__dict__``."""
    t = type(value)
    return not _library(t.__module__) and hasattr(value, "__dict__") != slotted and \
        not isinstance(value, (tf.Module, tuple, type, types.FunctionType, types.MethodType,
                               types.ModuleType))


class Guard:
    """The global and closure values some code reads, compared by identity in :meth:`same`
    (kept alive, so an identity is never reused)."""

    __slots__ = ("globals", "names", "values", "cells", "contents")

    def __init__(self, reads: list, cells: list):
        self.globals = [g for g, _ in reads]
        self.names = [n for _, n in reads]
        self.values = [g.get(n, _MISSING) for g, n in reads]
        self.cells = cells
        self.contents = [_cell_value(c) for c in cells]

    def same(self) -> bool:
        for g, n, v in zip(self.globals, self.names, self.values):
            if g.get(n, _MISSING) is not v:
                return False
        for c, v in zip(self.cells, self.contents):
            if _cell_value(c) is not v:
                return False
        return True


_MISSING = object()


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:   # an empty cell (assigned later in the enclosing function)
        return _MISSING


def scan(fn: Callable, objects: list) -> Guard | str:
    """Scan ``fn`` (a method of ``objects[0]``) and the code it can reach; returns the guard of
    what it reads, or why it cannot be a unit.

    Reachable: the functions the scanned code names as globals or closure values, the
    methods (and property getters) of the objects' classes it names as attributes, the
    objects' ``__call__`` (a submodule called), and functions kept as their attributes."""
    members: dict = {}   # attribute name -> the objects' user functions of that name
    functions = [fn]
    for obj in objects:
        for cls in type(obj).__mro__:
            if _library(cls.__module__):
                continue
            for name, f in vars(cls).items():
                f = f.fget if isinstance(f, property) else f
                f = f.__wrapped__ if getattr(f, "_tfx_vec_unit", False) else f   # ours
                if inspect.isfunction(f):
                    members.setdefault(name, []).append(f)
        functions += members.get("__call__", [])
        for value in vars(obj).values():
            if isinstance(value, np.ndarray):
                return f"an attribute of {type(obj).__name__} is a NumPy array (changed in " \
                       "place, a replay would miss it)"
            if _plain_object(value, slotted=True):
                return f"an attribute of {type(obj).__name__} is a {type(value).__name__} " \
                       "without a __dict__ (its state cannot be compared)"
            if inspect.isfunction(value) and not _library(value.__module__):
                functions.append(value)
    reads: list = []
    cells: list = []
    seen: set = set()
    while functions:
        f = functions.pop()
        if f.__code__ in seen:
            continue
        seen.add(f.__code__)
        why = _scan_code(f, reads, cells, functions, members)
        if why:
            return f"{why} ({f.__qualname__}, line {f.__code__.co_firstlineno})"
    return Guard(reads, cells)


def _codes(code: types.CodeType) -> Iterable[types.CodeType]:
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _codes(c)


def _scan_code(fn: Callable, reads: list, cells: list, functions: list,
               members: dict) -> str:
    """Why ``fn``'s code cannot be replayed ("" when it can); appends the globals it reads to
    ``reads``, its closure cells to ``cells``, and the user functions it names (``members``:
    by attribute name) to ``functions``."""
    g = fn.__globals__
    for code in _codes(fn.__code__):
        for ins in dis.get_instructions(code):
            name = ins.argval
            if ins.opname in _GLOBAL_STORES:
                return f"it assigns the global {name!r}"
            if ins.opname in _DEREF_STORES and name in fn.__code__.co_freevars:
                return f"it assigns {name!r} of an enclosing function"
            if isinstance(name, str) and name in _SIDE_EFFECTS and ins.opname in (
                    _GLOBAL_LOADS | {"LOAD_ATTR", "LOAD_METHOD", "IMPORT_NAME", "IMPORT_FROM"}):
                return _SIDE_EFFECTS[name]
            if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and name in members:
                functions += members[name]
            if ins.opname in _GLOBAL_LOADS and name in g:
                why = _read(g[name], f"the global {name!r}", functions)
                if why:
                    return why
                reads.append((g, name))
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        why = _read(_cell_value(cell), f"the closure variable {name!r}", functions)
        if why:
            return why
        cells.append(cell)
    return ""


def _read(value: Any, what: str, functions: list) -> str:
    """Why reading ``value`` (a global or closure value) cannot be replayed; queues the user
    functions it is or holds (a class's methods, static and class methods included)."""
    if isinstance(value, _MUTABLE):
        return f"it reads {what}, a {type(value).__name__} that can change in place"
    if _library(getattr(value, "__module__", "builtins")):
        return ""
    if inspect.isfunction(value):
        functions.append(value)
    elif isinstance(value, type):
        for f in vars(value).values():
            f = getattr(f, "__func__", f)   # staticmethod, classmethod
            if inspect.isfunction(f):
                functions.append(f)
    return ""


# {{{ tf.Module's attribute walk, kept while the modules are unchanged

# module -> {expand_composites: (its state, (its leaves, the variables among them))}
_WALKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _flat_value(value: Any) -> bool:
    """An attribute value whose leaves a snapshot sees: not a structure, or a list, tuple or
    dict of non-structures (what the walk flattens deeper, a snapshot would not compare)."""
    if not nest.is_nested(value):
        return True
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (list, tuple)):
        return False
    return not any(map(nest.is_nested, value))


def install_walk_cache(snapshot: Callable[[list], Any], active: Callable[[], bool]) -> None:
    """Keep the leaves of ``tf.Module._flatten`` (what ``variables``,
    ``trainable_variables`` and ``submodules`` walk) while ``active()`` and the modules' Python
    state is what ``snapshot(objects)`` saw; the predicate is applied to the kept leaves on
    every call, so a variable's ``trainable`` is read afresh.

    A training step reads ``model.trainable_variables`` once or twice; on the lazy device,
    where the step's ops cost a few microseconds each, TensorFlow's walk of the attributes
    (every one flattened with paths) is the largest part of a small model's step."""
    original = tf.Module._flatten

    def _flatten(self, recursive=True, predicate=None, attribute_traversal_key=None,
                 with_path=False, expand_composites=False):
        if (recursive and predicate is not None and attribute_traversal_key is None
                and not with_path and active()):
            walked = _walked(self, original, snapshot, bool(expand_composites))
            if walked is not None:
                leaves, variables = walked
                if predicate is _IS_VARIABLE:
                    return iter(variables)
                return filter(predicate, variables if predicate in _ON_VARIABLES else leaves)
        return original(self, recursive, predicate, attribute_traversal_key, with_path,
                        expand_composites)
    _flatten.__wrapped__ = original
    tf.Module._flatten = _flatten


def _walked(module: Any, original: Callable, snapshot: Callable[[list], Any],
            expand: bool) -> tuple | None:
    """The module's leaves (every value the walk yields, composite tensors expanded or not)
    and the variables among them, from the cache when its state is unchanged; ``None`` when
    its attributes hold nested structures (walked every time)."""
    kept = _WALKS.get(module, {}).get(expand)
    if kept is not None and kept[0].same():
        return kept[1]
    leaves = tuple(original(module, True, _everything, None, False, expand))
    objects = [module, *(m for m in leaves if isinstance(m, tf.Module))]
    if not all(_flat_value(v) for m in objects for k, v in vars(m).items()
               if k not in m._TF_MODULE_IGNORED_PROPERTIES):
        return None
    walked = leaves, tuple(v for v in leaves if isinstance(v, tf.Variable))
    _WALKS.setdefault(module, {})[expand] = (snapshot(objects), walked)
    return walked


def _everything(_: Any) -> bool:
    return True


# TensorFlow's predicates of variables (a variable's type is fixed, its ``trainable`` is read
# afresh): applied to the kept variables only.  Absent in another TensorFlow: the leaves.
_IS_VARIABLE = getattr(_tf_module, "_is_variable", None)
_ON_VARIABLES = frozenset(filter(None, (
    _IS_VARIABLE, getattr(_tf_module, "_is_trainable_variable", None),
    getattr(_tf_module, "_is_non_trainable_variable", None))))
# }}}
