"""Eager calls: the vectorized computation as a cached concrete ``tf.function``.

Called eagerly, ``pfor``/``vectorized_map`` build their graph inside a ``tf.function`` (as
TensorFlow's pfor does) and keep its concrete function, keyed on the body's code, the
identities of the non-tensor values it reads (closure cells, referenced globals, defaults),
the signatures of the eager tensors it reads, the arguments' signatures and the options.

The body captures the eager tensors it reads *by value* while it is traced, exactly like a
``tf.function`` would -- so an outer ``tf.GradientTape`` re-entered inside the body
(``with tape:``) records those captures and its gradients reach the outer tensors.  A later
call of the same code over *other* tensors of the same signature (a fresh ``lambda`` over
fresh tensors) reuses the concrete function with its captured inputs replaced by the new
tensors (no retrace).  When the body captured an eager tensor that is not one of the values
it reads directly (an attribute of an object, an element of a list), that tensor could change
without the key changing, so the entry is not reused: the next call traces again.

``tf.config.run_functions_eagerly(True)`` is overridden for the duration of the call (the
vectorized graph only exists as a graph), as TensorFlow's pfor does.

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> before = cache_stats()["traces"]
    >>> for k in range(3):
    ...     x = tf.fill([3], float(k))
    ...     _ = tfx_vec.pfor(lambda i: tf.gather(x, i) + 1.0, 3)
    >>> cache_stats()["traces"] - before
    1
"""
from __future__ import annotations

import collections
import types
from typing import Any, Callable

import tensorflow as tf
from tensorflow.python.framework import composite_tensor

from tfx_vec.pfor import trace
from tfx_vec.pfor.errors import from_runtime_error

__all__ = ["cache_stats", "clear_cache", "call_cached"]

_CACHE_SIZE = 128
_cache: "collections.OrderedDict[Any, tuple]" = collections.OrderedDict()
_stats = collections.Counter()


def cache_stats() -> dict[str, int]:
    """Eager-cache counters: ``hits``, ``misses`` (new concrete function) and ``traces``.

    Example:
        >>> sorted(cache_stats())[-1]
        'traces'
    """
    return dict(_stats, traces=trace.trace_count())


def clear_cache() -> None:
    """Forget every cached concrete function.

    Example:
        >>> clear_cache()
    """
    _cache.clear()


def call_cached(kind: str, fn: Callable, build: Callable[..., Any], static_key,
                tensors: list, options) -> Any:
    """``build(fn, *tensors)`` run as a cached concrete function (eager callers only).

    Example:
        >>> import tensorflow as tf
        >>> build = lambda fn, t: fn(t) * 2.0
        >>> float(call_cached("demo", lambda t: t + 1.0, build, None, [tf.constant(1.0)], ()))
        4.0
    """
    eager_functions = tf.config.functions_run_eagerly()
    if eager_functions:
        tf.config.run_functions_eagerly(False)
    try:
        return _call(kind, fn, build, static_key, tensors, options)
    except tf.errors.InvalidArgumentError as e:
        err = from_runtime_error(e)
        if err is not None:
            raise err from e
        raise
    finally:
        if eager_functions:
            tf.config.run_functions_eagerly(True)


def _call(kind, fn, build, static_key, tensors, options):
    fn_key, slots = _function_key(fn)
    key = (kind, fn_key, _hashable(static_key), options,
           tuple(_signature(t) for t in tensors), tuple(_signature(v) for _, v in slots))
    entry = _cache.get(key)
    if entry is None:
        _stats["misses"] += 1
        concrete = tf.function(_graph_only(lambda *ts: build(fn, *ts)),
                               autograph=False).get_concrete_function(*tensors)
        capture_slots = _capture_slots(concrete, slots)
        entry = (concrete, capture_slots)
        if capture_slots is not None:
            _cache[key] = entry
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
    else:
        _stats["hits"] += 1
        _cache.move_to_end(key)
    concrete, capture_slots = entry
    captured = list(concrete.captured_inputs)
    if capture_slots:
        current = dict(_slot_tensors(slots))
        captured = [captured[k] if s is None else current[s] for k, s in enumerate(capture_slots)]
    return concrete._call_flat(list(tensors), captured)  # pylint: disable=protected-access


def _graph_only(build: Callable[..., Any]) -> Callable[..., Any]:
    """A returned ``tf.Operation`` (a side effect) is ``None`` to an eager caller."""
    def run(*ts):
        return tf.nest.map_structure(lambda v: None if isinstance(v, tf.Operation) else v,
                                     build(*ts))
    return run


def _capture_slots(concrete, slots) -> list | None:
    """For each captured input: the slot it came from, or None (variables, constants).

    ``None`` as a whole: some captured eager tensor is not a directly read value, so the
    entry must not be reused.
    """
    by_id = {id(t): s for s, t in _slot_tensors(slots)}
    out = []
    for t in concrete.captured_inputs:
        s = by_id.get(id(t))
        if s is None and _is_eager_value(t) and t.dtype != tf.resource:
            return None
        out.append(s)
    return out


def _slot_tensors(slots):
    """(slot id, eager tensor) for every tensor among the values a body reads directly."""
    for slot, v in slots:
        if isinstance(v, tf.Tensor):
            yield slot, v
        else:
            for k, c in enumerate(tf.nest.flatten(v, expand_composites=True)):
                yield (slot, k), c


def _signature(v):
    if isinstance(v, tf.Tensor):
        return (tuple(v.shape.as_list()) if v.shape.rank is not None else None, v.dtype)
    return tf.type_spec_from_value(v)


def _is_eager_value(v) -> bool:
    """An eager tensor (not a variable handle), or a composite made only of them."""
    if isinstance(v, tf.Tensor):
        return hasattr(v, "numpy") and v.dtype != tf.resource
    if isinstance(v, composite_tensor.CompositeTensor) and not isinstance(v, tf.Variable):
        comps = tf.nest.flatten(v, expand_composites=True)
        return bool(comps) and all(_is_eager_value(c) for c in comps)
    return False


def _function_key(fn: Callable):
    """(hashable key, [(slot, eager value)]) for the values ``fn`` reads directly.

    For a plain Python function: its code, defaults and, per closure cell and referenced
    global, either the identity of the value or -- for an eager tensor or composite -- its
    slot (the value itself is replaced at call time, see the module docstring).
    """
    if not isinstance(fn, types.FunctionType):
        return (_identity(fn),), []
    key = [fn.__code__, _identity(fn.__defaults__), _identity(fn.__kwdefaults__)]
    slots = []
    for k, cell in enumerate(fn.__closure__ or ()):
        try:
            v = cell.cell_contents
        except ValueError:  # empty cell
            key.append(("empty", k))
            continue
        if _is_eager_value(v):
            key.append(("cell-tensor", k))
            slots.append((("cell", k), v))
        else:
            key.append(("cell", k, _identity(v)))
    for name in sorted(_global_names(fn.__code__)):
        if name not in fn.__globals__:
            continue
        v = fn.__globals__[name]
        if _is_eager_value(v):
            key.append(("global-tensor", name))
            slots.append((("global", name), v))
        else:
            key.append(("global", name, _identity(v)))
    return tuple(key), slots


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


class _Id:
    """Hashable by identity, holding a reference so the id cannot be reused while cached."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _Id) and other.obj is self.obj


def _identity(v):
    if isinstance(v, (int, float, str, bool, bytes, type(None))):
        return (type(v).__name__, v)
    return _Id(v)


def _hashable(v):
    try:
        hash(v)
        return v
    except TypeError:
        return repr(v)
