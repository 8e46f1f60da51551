"""Public entry points: ``pfor`` and ``vectorized_map`` (argument checking, caching, chunking).

The pipeline, written once in :func:`_vectorize`: trace the body (``trace.py``) → bind its
inputs as stacked/invariant values → :class:`~tfx_vec.pfor.vectorizer.Vectorizer` walks it →
outputs are packed back into the body's structure.

In eager mode the whole vectorized computation is wrapped in a ``tf.function`` cached on the
body's code, its closed-over values (eager tensors in the closure become arguments, so a new
``lambda`` over new tensors of the same signature reuses the trace), ``iters`` (Python int =
static, tensor = dynamic) and the options; ``tf.function`` itself keys on input shapes.
Inside a ``tf.function`` the ops are emitted straight into the caller's graph.

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> x = tf.reshape(tf.range(6.0), [3, 2])
    >>> tfx_vec.pfor(lambda i: tf.reduce_sum(tf.gather(x, i)) * 2.0, 3).numpy().tolist()
    [2.0, 10.0, 18.0]
    >>> tfx_vec.vectorized_map(lambda r: r * 10.0, x, in_axes=1).numpy().tolist()
    [[0.0, 20.0, 40.0], [10.0, 30.0, 50.0]]
"""
from __future__ import annotations

import collections
import inspect
import types
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.util import nest

from tfx_vec.pfor import trace
from tfx_vec.pfor.errors import VectorizationError, from_runtime_error
from tfx_vec.pfor.registry import WrappedTensor, tile_to_stacked
from tfx_vec.pfor.vectorizer import RANDOMNESS, Vectorizer

_CACHE_SIZE = 128
_cache: "collections.OrderedDict[Any, Callable]" = collections.OrderedDict()
_stats = collections.Counter()


def cache_stats() -> dict[str, int]:
    """Eager-cache counters: ``hits``, ``misses`` (new ``tf.function``) and ``traces``."""
    return dict(_stats, traces=trace.trace_count())


def clear_cache() -> None:
    _cache.clear()


# {{{ public API

def pfor(loop_fn: Callable, iters: int | tf.Tensor, *, fallback_to_while_loop: bool = True,
         parallel_iterations: int | None = None, randomness: str = "different") -> Any:
    """Run ``loop_fn(i)`` (or ``loop_fn(i, config)``) for ``i`` in ``range(iters)``, vectorized.

    Returns the outputs' nested structure with every tensor stacked along a new axis 0.
    ``iters`` is a Python int or a scalar integer tensor known only at run time.  An op without
    a vectorized converter runs in a per-iteration loop (listed by ``fallback_report()``), or
    raises :class:`~tfx_vec.VectorizationError` when ``fallback_to_while_loop=False``.

    Example:
        >>> import tensorflow as tf, tfx_vec
        >>> tfx_vec.pfor(lambda i: tf.cast(i, tf.float32) ** 2, 4).numpy().tolist()
        [0.0, 1.0, 4.0, 9.0]
    """
    _check_options(fallback_to_while_loop, parallel_iterations, randomness)
    if not callable(loop_fn):
        raise TypeError(f"pfor: loop_fn must be callable, got {loop_fn!r}")
    iters_static = _static_iters(iters)
    with_config = _wants_config(loop_fn)
    options = (fallback_to_while_loop, parallel_iterations, randomness)

    def build(fn, n=None):
        loop_len = tf.constant(iters_static, tf.int32) if iters_static is not None else n
        index = WrappedTensor(tf.range(loop_len), True)
        return _vectorize(fn, [tf.TensorSpec([], tf.int32)], [index], loop_len, options,
                          with_config=with_config)

    dynamic = [] if iters_static is not None else [tf.cast(iters, tf.int32)]
    return _dispatch("pfor", loop_fn, build, iters_static, dynamic, options)


def vectorized_map(fn: Callable, elems: Any, *, in_axes: Any = 0, out_axes: Any = 0,
                   chunk_size: int | None = None, fallback_to_while_loop: bool = True,
                   randomness: str = "different", parallel_iterations: int | None = None) -> Any:
    """``fn`` applied to every slice of ``elems``, vectorized (like ``tf.vectorized_map``).

    ``in_axes``/``out_axes`` are JAX-style: an int (the mapped axis) or None (not mapped: the
    whole value is passed to every call / the output is the same in every call), or a nested
    structure matching (a prefix of) ``elems`` / the output.  ``chunk_size`` vectorizes
    chunks of that many iterations in a sequential loop, bounding memory.

    Example:
        >>> import tensorflow as tf, tfx_vec
        >>> w = tf.ones([2, 2])
        >>> tfx_vec.vectorized_map(lambda a: tf.linalg.matvec(a[1], a[0]), (tf.ones([5, 2]), w),
        ...                        in_axes=(0, None), chunk_size=2).shape
        TensorShape([5, 2])
    """
    _check_options(fallback_to_while_loop, parallel_iterations, randomness)
    if chunk_size is not None and (not isinstance(chunk_size, (int, np.integer))
                                   or isinstance(chunk_size, bool) or chunk_size < 1):
        raise ValueError(f"vectorized_map: chunk_size must be a positive int, got {chunk_size!r}")
    flat = [tf.convert_to_tensor(e) for e in tf.nest.flatten(elems)]
    axes = _flat_axes(in_axes, elems, "in_axes")
    mapped = []
    for k, (x, ax) in enumerate(zip(flat, axes)):
        if ax is None:
            continue
        rank = x.shape.rank
        if rank is None or rank == 0 or not -rank <= ax < rank:
            raise ValueError(f"vectorized_map: in_axes {ax} is invalid for input {k} of shape "
                             f"{x.shape}")
        flat[k] = _move_axis(x, ax % rank, 0)
        mapped.append(k)
    if not mapped:
        raise ValueError("vectorized_map: in_axes maps no input (all None)")
    sizes = {flat[k].shape[0] for k in mapped} - {None}
    if len(sizes) > 1:
        raise ValueError(f"vectorized_map: mapped inputs have different sizes {sorted(sizes)}")
    n_static = sizes.pop() if sizes else None
    structure = elems
    options = (fallback_to_while_loop, parallel_iterations, randomness)
    is_mapped = [ax is not None for ax in axes]
    specs = [tf.TensorSpec(x.shape[1:] if m else x.shape, x.dtype) for x, m in zip(flat, is_mapped)]

    def pack_args(args):
        return [tf.nest.pack_sequence_as(structure, args)]

    def build(fn_, *values):
        n = n_static if n_static is not None else tf.shape(values[mapped[0]])[0]
        loop_len = tf.constant(n, tf.int32) if isinstance(n, int) else n
        bound = [WrappedTensor(v, m) for v, m in zip(values, is_mapped)]
        return _vectorize(fn_, specs, bound, loop_len, options, pack_args=pack_args,
                          out_axes=out_axes, chunk_size=chunk_size)

    key = (tuple(is_mapped), _hashable_axes(in_axes), _hashable_axes(out_axes), chunk_size,
           tf.nest.map_structure(lambda _: 0, elems))
    return _dispatch("vectorized_map", fn, build, key, flat, options)

# }}}


# {{{ the pipeline

def _vectorize(fn: Callable, specs: Sequence[tf.TensorSpec], bound: Sequence[WrappedTensor],
               loop_len: tf.Tensor, options, *, with_config: bool = False,
               pack_args=None, out_axes: Any = 0, chunk_size: int | None = None) -> Any:
    """trace → bind → vectorize (whole, or chunk by chunk) → pack, into the current graph."""
    traced = trace.trace_function(fn, specs, with_config=with_config, pack_args=pack_args)
    flat_axes = _flat_axes(out_axes, traced.pack(list(traced.graph.outputs)), "out_axes")
    n_static = tf.get_static_value(loop_len)
    if n_static == 0 and all(o.shape.is_fully_defined() and o.dtype not in (tf.variant,
                                                                             tf.resource)
                             for o in traced.graph.outputs):
        # zero iterations: nothing runs; kernels need not cope with empty batches
        outs = [WrappedTensor(tf.zeros([0] + o.shape.as_list(), o.dtype), True)
                for o in traced.graph.outputs]
    elif chunk_size is None:
        outs = _convert(traced, bound, loop_len, options)
    else:
        if None in flat_axes:
            raise ValueError("vectorized_map: out_axes=None cannot be combined with chunk_size")
        outs = _chunked(traced, bound, loop_len, options, int(chunk_size))
    results = []
    for w, ax, original in zip(outs, flat_axes, traced.graph.outputs):
        if ax is None:
            if w.is_stacked:
                raise VectorizationError(
                    "out_axes=None for an output that differs across iterations "
                    f"(output {original.name} of the loop body)")
            results.append(w.t)
            continue
        t = w.t if w.is_stacked else tile_to_stacked(w.t, loop_len)
        if n_static is not None and t.shape.rank is not None:
            t.set_shape([int(n_static)] + [None] * (t.shape.rank - 1))
        t.set_shape(t.shape[:1].concatenate(original.shape))
        if ax != 0:
            if not -t.shape.rank <= ax < t.shape.rank:
                raise ValueError(f"vectorized_map: out_axes {ax} is invalid for an output of "
                                 f"rank {t.shape.rank}")
            t = _move_axis(t, 0, ax % t.shape.rank)
        results.append(t)
    return traced.pack(results)


def _convert(traced: trace.TracedBody, bound: Sequence[WrappedTensor], loop_len, options
             ) -> list[WrappedTensor]:
    fallback, parallel_iterations, randomness = options
    vec = Vectorizer(loop_len, fallback_to_while_loop=fallback,
                     parallel_iterations=parallel_iterations, randomness=randomness,
                     xla=in_xla_context(), reductions=traced.reductions)
    return vec.convert_graph(traced.graph, list(bound) + traced.capture_inputs())


def _chunked(traced, bound: Sequence[WrappedTensor], loop_len, options, chunk: int
             ) -> list[WrappedTensor]:
    """Vectorize ``chunk`` iterations at a time in a sequential ``tf.while_loop``.

    With a static iteration count the loop runs over full chunks of static size and the
    remainder is one more vectorized chunk (all shapes static, so XLA compiles it); with a
    dynamic count the last chunk of the loop is simply shorter.
    """
    outputs = traced.graph.outputs
    n_static = tf.get_static_value(loop_len)

    def run(start, size):
        sliced = [WrappedTensor(_rows(w.t, start, size), True) if w.is_stacked else w
                  for w in bound]
        outs = _convert(traced, sliced, size, options)
        return [w.t if w.is_stacked else tile_to_stacked(w.t, size) for w in outs]

    def loop(num_chunks, size_of, element_shape):
        tas = [tf.TensorArray(o.dtype, size=num_chunks, infer_shape=False,
                              element_shape=tf.TensorShape([element_shape]).concatenate(o.shape))
               for o in outputs]

        def body(k, tas):
            size = size_of(k)
            return k + 1, [ta.write(k, t) for ta, t in zip(tas, run(k * chunk, size))]

        _, tas = tf.while_loop(lambda k, _: k < num_chunks, body, (tf.constant(0), tas))
        return [ta.concat() for ta in tas]

    if n_static is None:
        num = (loop_len + chunk - 1) // chunk
        flat = loop(num, lambda k: tf.minimum(chunk, loop_len - k * chunk), None)
    else:
        num_full, rem = divmod(int(n_static), chunk)
        pieces = []
        if num_full:
            pieces.append(loop(num_full, lambda k: chunk, chunk))
        if rem or not num_full:
            pieces.append(run(num_full * chunk, rem))
        flat = [tf.concat(p, 0) if len(p) > 1 else p[0] for p in zip(*pieces)]
    return [WrappedTensor(t, True) for t in flat]

def _rows(t: tf.Tensor, start, size) -> tf.Tensor:
    """``t[start:start+size]`` with a static leading dimension when ``size`` is an int."""
    rank = t.shape.rank
    begin = tf.concat([tf.reshape(tf.cast(start, tf.int32), [1]), tf.zeros([rank - 1], tf.int32)], 0)
    sizes = tf.concat([tf.reshape(tf.cast(size, tf.int32), [1]), -tf.ones([rank - 1], tf.int32)], 0)
    rows = tf.slice(t, begin, sizes)  # a dynamic-offset, static-size slice for XLA
    if isinstance(size, int) and rows.shape.rank is not None:
        rows.set_shape([size] + rows.shape.as_list()[1:])
    return rows

# }}}


# {{{ eager caching

def _dispatch(kind: str, fn: Callable, build: Callable, static_key, tensors: list, options):
    if not tf.executing_eagerly():
        return build(fn, *tensors)
    fn_key, closure_tensors, rebuild = _function_key(fn)
    key = (kind, fn_key, _hashable(static_key), options)
    compiled = _cache.get(key)
    if compiled is None:
        _stats["misses"] += 1

        @tf.function(autograph=False)
        def compiled(closure_values, tensors):
            return build(rebuild(closure_values), *tensors)
        _cache[key] = compiled
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    else:
        _stats["hits"] += 1
        _cache.move_to_end(key)
    try:
        return compiled(closure_tensors, list(tensors))
    except tf.errors.InvalidArgumentError as e:
        err = from_runtime_error(e)
        if err is not None:
            raise err from e
        raise


def _function_key(fn: Callable):
    """(hashable key, eager tensors it reads, rebuild(values) -> fn reading those values).

    For a plain Python function the key is its code plus the identities of the non-tensor
    values it reads (closure cells, referenced globals, defaults); eager tensors among them
    become ``tf.function`` arguments, so a fresh ``lambda`` over fresh tensors of the same
    signature hits the cache, and rebinding a tensor never reuses a stale trace.
    """
    if not isinstance(fn, types.FunctionType):
        return (_identity(fn),), [], lambda values: fn
    key = [fn.__code__, _identity(fn.__defaults__), _identity(fn.__kwdefaults__)]
    tensors, cell_slots, global_names = [], [], []
    for k, cell in enumerate(fn.__closure__ or ()):
        try:
            v = cell.cell_contents
        except ValueError:  # empty cell
            key.append(("empty", k))
            continue
        if _is_eager_tensor(v):
            key.append(("cell-tensor", k))
            tensors.append(v)
            cell_slots.append(k)
        else:
            key.append(("cell", k, _identity(v)))
    for name in sorted(_global_names(fn.__code__)):
        if name not in fn.__globals__:
            continue
        v = fn.__globals__[name]
        if _is_eager_tensor(v):
            key.append(("global-tensor", name))
            tensors.append(v)
            global_names.append(name)
        else:
            key.append(("global", name, _identity(v)))

    def rebuild(values):
        values = list(values)
        cells = list(fn.__closure__ or ())
        for slot in cell_slots:
            cells[slot] = types.CellType(values.pop(0))
        glob = fn.__globals__
        if global_names:
            glob = dict(fn.__globals__)
            for name in global_names:
                glob[name] = values.pop(0)
        g = types.FunctionType(fn.__code__, glob, fn.__name__, fn.__defaults__,
                               tuple(cells) if fn.__closure__ else None)
        g.__kwdefaults__ = fn.__kwdefaults__
        return g

    return tuple(key), tensors, rebuild


def _is_eager_tensor(v) -> bool:
    return isinstance(v, tf.Tensor) and hasattr(v, "numpy") and v.dtype != tf.resource


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

# }}}


# {{{ argument checking and small helpers

def _check_options(fallback, parallel_iterations, randomness) -> None:
    if not isinstance(fallback, bool):
        raise TypeError(f"fallback_to_while_loop must be a bool, got {fallback!r}")
    if parallel_iterations is not None and (not isinstance(parallel_iterations, int)
                                            or parallel_iterations < 1):
        raise ValueError(f"parallel_iterations must be a positive int, got "
                         f"{parallel_iterations!r}")
    if randomness not in RANDOMNESS:
        raise ValueError(f"randomness must be one of {RANDOMNESS}, got {randomness!r}")


def _static_iters(iters) -> int | None:
    if isinstance(iters, bool):
        raise TypeError("pfor: iters must be an int or a scalar integer tensor, got a bool")
    if isinstance(iters, (int, np.integer)):
        if iters < 0:
            raise ValueError(f"pfor: iters must be >= 0, got {iters}")
        return int(iters)
    t = tf.convert_to_tensor(iters)
    if not t.dtype.is_integer or (t.shape.rank is not None and t.shape.rank != 0):
        raise TypeError(f"pfor: iters must be an int or a scalar integer tensor, got {t!r}")
    return None


def _wants_config(loop_fn: Callable) -> bool:
    try:
        params = inspect.signature(loop_fn).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.default is p.empty]
    return len(required) >= 2


def in_xla_context() -> bool:
    """Whether ops are being emitted inside a ``jit_compile=True`` trace."""
    from tensorflow.python.ops import control_flow_util
    try:
        return bool(control_flow_util.GraphOrParentsInXlaContext(
            tf.compat.v1.get_default_graph()))
    except Exception:  # pragma: no cover - private API moved
        return False


def _flat_axes(axes: Any, structure: Any, what: str) -> list:
    n = len(tf.nest.flatten(structure))
    if axes is None or isinstance(axes, (int, np.integer)):
        return [None if axes is None else int(axes)] * n
    try:
        per = nest.map_structure_up_to(
            axes, lambda ax, sub: [ax] * len(tf.nest.flatten(sub)), axes, structure)
    except (ValueError, TypeError) as e:
        raise ValueError(f"vectorized_map: {what} {axes!r} does not match the structure "
                         f"{structure!r}: {e}") from None
    return [ax for group in nest.flatten_up_to(axes, per) for ax in group]


def _hashable_axes(axes):
    return repr(axes)


def _move_axis(t: tf.Tensor, src: int, dst: int) -> tf.Tensor:
    if src == dst:
        return t
    rank = t.shape.rank
    perm = [i for i in range(rank) if i != src]
    perm.insert(dst, src)
    return tf.transpose(t, perm)

# }}}
