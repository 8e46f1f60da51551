"""Public entry points: ``pfor`` and ``vectorized_map`` (argument checking, binding, chunking).

The pipeline, written once in :func:`_vectorize`: trace the body (``trace.py``) → bind its
inputs as stacked/invariant values → :class:`~tfx_vec.pfor.vectorizer.Vectorizer` walks it →
each output leaf is assembled (``composites.py``) and packed back into the body's structure.
Eager calls run that pipeline inside a cached concrete function (``eager_cache.py``); inside a
``tf.function`` or a TF1 graph the ops are emitted straight into the caller's graph.

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> x = tf.reshape(tf.range(6.0), [3, 2])
    >>> tfx_vec.pfor(lambda i: tf.reduce_sum(tf.gather(x, i)) * 2.0, 3).numpy().tolist()
    [2.0, 10.0, 18.0]
    >>> tfx_vec.vectorized_map(lambda r: r * 10.0, x, in_axes=1).numpy().tolist()
    [[0.0, 20.0, 40.0], [10.0, 30.0, 50.0]]
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.util import nest

from tfx_vec.pfor import composites, eager_cache, trace
from tfx_vec.pfor.converters.parsing_ops import unbatch_inputs
from tfx_vec.pfor.eager_cache import cache_stats, clear_cache
from tfx_vec.pfor.errors import VectorizationError
from tfx_vec.pfor.registry import WrappedTensor, tile_to_stacked
from tfx_vec.pfor.vectorizer import RANDOMNESS, Vectorizer

__all__ = ["pfor", "vectorized_map", "cache_stats", "clear_cache", "in_xla_context"]


# {{{ public API

def pfor(loop_fn: Callable, iters: int | tf.Tensor, *, fallback_to_while_loop: bool = True,
         parallel_iterations: int | None = None, randomness: str = "different") -> Any:
    """Run ``loop_fn(i)`` for ``i`` in ``range(iters)``, vectorized, and stack the outputs.

    Returns the outputs' nested structure with every tensor stacked along a new axis 0
    (``None`` stays ``None``; SparseTensor, RaggedTensor and other batchable composites are
    batched; a returned ``tf.Operation`` becomes its vectorized side effects).  ``iters`` is a
    Python int or a scalar integer tensor known only at run time.  A body with a second
    required parameter, or one named ``pfor_config``, receives a
    :class:`~tfx_vec.pfor.trace.PforConfig` for cross-iteration reductions.

    Args:
      loop_fn: the body, written for one iteration ``i`` (a scalar int32 tensor).
      iters: the number of iterations.
      fallback_to_while_loop: an op without a vectorized converter runs in a per-iteration
        loop (listed by ``fallback_report()``); False raises
        :class:`~tfx_vec.VectorizationError` naming the op instead.
      parallel_iterations: as in TensorFlow's pfor: vectorize at most this many iterations at
        a time, in a sequential loop over chunks (bounds memory); ``None`` vectorizes all.
        Must be >= 2 and cannot be combined with reductions.
      randomness: ``"different"`` (independent draws per iteration), ``"same"`` (one draw
        shared by all) or ``"error"`` (refuse random ops).

    Example:
        >>> import tensorflow as tf, tfx_vec
        >>> tfx_vec.pfor(lambda i: tf.cast(i, tf.float32) ** 2, 4).numpy().tolist()
        [0.0, 1.0, 4.0, 9.0]
    """
    _check_options(fallback_to_while_loop, parallel_iterations, randomness)
    if parallel_iterations == 1:
        raise ValueError("pfor: found `parallel_iterations == 1`, which vectorizes nothing. "
                         "Use `for_loop` instead (or parallel_iterations=None to vectorize "
                         "every iteration).")
    if not callable(loop_fn):
        raise TypeError(f"pfor: loop_fn must be callable, got {loop_fn!r}")
    iters_static = _static_iters(iters)
    with_config = _wants_config(loop_fn)
    chunk = parallel_iterations
    if chunk is not None and iters_static is not None and chunk >= iters_static:
        chunk = None
    options = (fallback_to_while_loop, parallel_iterations, randomness)

    def build(fn, n=None):
        loop_len = tf.constant(iters_static, tf.int32) if iters_static is not None else n
        index = WrappedTensor(tf.range(loop_len), True)
        return _vectorize(fn, [tf.TensorSpec([], tf.int32)], [index], loop_len, options,
                          with_config=with_config, chunk_size=chunk)

    dynamic = [] if iters_static is not None else [tf.cast(iters, tf.int32)]
    return _dispatch("pfor", loop_fn, build, (iters_static, chunk), dynamic, options)


def vectorized_map(fn: Callable, elems: Any, *, in_axes: Any = 0, out_axes: Any = 0,
                   chunk_size: int | None = None, fallback_to_while_loop: bool = True,
                   randomness: str = "different", parallel_iterations: int | None = None) -> Any:
    """``fn`` applied to every slice of ``elems``, vectorized (like ``tf.vectorized_map``).

    ``in_axes``/``out_axes`` are JAX-style: an int (the mapped axis) or None (not mapped: the
    whole value is passed to every call / the output is the same in every call), or a nested
    structure matching (a prefix of) ``elems`` / the output.  As in ``tf.vectorized_map``, a
    mapped input whose leading dimension is 1 is broadcast against the others, and
    ``elems`` may hold RaggedTensors, SparseTensors and batchable ExtensionTypes (mapped along
    their first dimension).  ``chunk_size`` vectorizes chunks of that many iterations in a
    sequential loop, bounding memory.  ``parallel_iterations`` sizes the per-iteration loops
    of ops that fall back.

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
    elems = tf.nest.map_structure(
        lambda e: tf.convert_to_tensor(e) if isinstance(e, tf.Variable) else e, elems)
    leaves = tf.nest.flatten(elems)
    axes = _flat_axes(in_axes, elems, "in_axes")
    flat_leaves = [_elem_leaf(x, ax, k) for k, (x, ax) in enumerate(zip(leaves, axes))]
    if not any(leaf.mapped for leaf in flat_leaves):
        raise ValueError("vectorized_map: in_axes maps no input (all None)")
    n = _mapped_size(flat_leaves, leaves)
    tensors, is_mapped, specs = [], [], []
    for leaf in flat_leaves:
        for t, spec in zip(leaf.tensors, leaf.specs):
            tensors.append(composites.broadcast_leading(t, n) if leaf.mapped else t)
            is_mapped.append(leaf.mapped)
            specs.append(spec)
    options = (fallback_to_while_loop, parallel_iterations, randomness)

    def pack_args(args):
        it, values = iter(args), []
        for leaf in flat_leaves:
            values.append(leaf.rebuild([next(it) for _ in leaf.tensors]))
        return [tf.nest.pack_sequence_as(elems, values)]

    def build(fn_, *values):
        loop_len = (tf.constant(n, tf.int32) if isinstance(n, int)
                    else tf.shape(values[is_mapped.index(True)])[0])
        bound = [WrappedTensor(v, m) for v, m in zip(values, is_mapped)]
        return _vectorize(fn_, specs, bound, loop_len, options, pack_args=pack_args,
                          out_axes=out_axes, chunk_size=chunk_size)

    key = (tuple(is_mapped), _hashable_axes(in_axes), _hashable_axes(out_axes), chunk_size,
           tf.nest.map_structure(_leaf_signature, elems), isinstance(n, int) and n)
    return _dispatch("vectorized_map", fn, build, key, tensors, options)

# }}}


# {{{ binding vectorized_map's inputs

def _elem_leaf(x: Any, ax: int | None, k: int) -> composites.ElemLeaf:
    """Leaf ``k`` of ``elems`` with its mapped axis moved to the front."""
    composite = isinstance(x, (tf.SparseTensor, tf.RaggedTensor)) or (
        composites.composite_spec(x) is not None)
    if composite:
        if ax not in (None, 0):
            raise ValueError(f"vectorized_map: in_axes {ax} for input {k}, a "
                             f"{type(x).__name__}; composite inputs are mapped along axis 0")
        return composites.flatten_elems(x, ax is not None)
    if isinstance(x, tf.IndexedSlices):
        x = tf.convert_to_tensor(x)
    x = tf.convert_to_tensor(x)
    if ax is None:
        return composites.flatten_elems(x, False)
    rank = x.shape.rank
    if rank is None and ax == 0:
        return composites.flatten_elems(x, True)
    if rank is None or rank == 0 or not -rank <= ax < rank:
        raise ValueError(f"vectorized_map: in_axes {ax} is invalid for input {k} of shape "
                         f"{x.shape}")
    return composites.flatten_elems(_move_axis(x, ax % rank, 0), True)


def _mapped_size(flat_leaves: Sequence[composites.ElemLeaf], leaves: Sequence[Any]):
    """The number of iterations: a Python int when every mapped size is static.

    Leading dimensions of 1 broadcast against the others (as in ``tf.vectorized_map``);
    other static sizes must agree.
    """
    sizes = [composites.leading_size(leaf.tensors[0]) for leaf in flat_leaves if leaf.mapped]
    static = [s for s in sizes if isinstance(s, int)]
    distinct = sorted(set(static) - {1})
    if len(distinct) > 1:
        shapes = [_describe(x) for x, leaf in zip(leaves, flat_leaves) if leaf.mapped]
        raise ValueError(f"vectorized_map: mapped inputs have different sizes {distinct} along "
                         f"their mapped axis (inputs: {', '.join(shapes)}); only a size of 1 "
                         "broadcasts")
    if len(static) == len(sizes):
        return distinct[0] if distinct else 1
    if distinct:
        return distinct[0]
    return tf.reduce_max(tf.stack([tf.cast(s, tf.int32) for s in sizes]))


def _leaf_signature(x):
    if isinstance(x, (tf.SparseTensor, tf.RaggedTensor)) or composites.composite_spec(x):
        return tf.type_spec_from_value(x)
    return 0

# }}}


# {{{ the pipeline

def _vectorize(fn: Callable, specs: Sequence[tf.TensorSpec], bound: Sequence[WrappedTensor],
               loop_len: tf.Tensor, options, *, with_config: Any = False,
               pack_args=None, out_axes: Any = 0, chunk_size: int | None = None) -> Any:
    """trace → bind → vectorize (whole, or chunk by chunk) → assemble, into the current graph."""
    n_static = tf.get_static_value(loop_len)
    n_static = None if n_static is None else int(n_static)
    traced = trace.trace_function(fn, specs, with_config=with_config, pack_args=pack_args,
                                  iters=n_static)
    if traced.reductions and chunk_size is not None:
        raise ValueError("pfor: setting `parallel_iterations` currently unsupported if "
                         "reductions across iterations are performed (config.reduce*): each "
                         "chunk would reduce over its own iterations only")
    leaf_axes = _flat_axes(out_axes, traced.pack(list(traced.leaves)), "out_axes")
    outputs = traced.graph.outputs
    if n_static == 0 and all(o.shape.is_fully_defined() and o.dtype not in (tf.variant,
                                                                             tf.resource)
                             for o in outputs):
        # zero iterations: nothing runs; kernels need not cope with empty batches
        outs = [WrappedTensor(tf.zeros([0] + o.shape.as_list(), o.dtype), True) for o in outputs]
        side = [[] for _ in traced.op_outputs]
    elif chunk_size is None:
        outs, side = _convert(traced, bound, loop_len, options)
    else:
        if None in leaf_axes:
            raise ValueError("vectorized_map: out_axes=None cannot be combined with chunk_size")
        outs, side = _chunked(traced, bound, loop_len, options, int(chunk_size))
    results = []
    for leaf, ax in zip(traced.leaves, leaf_axes):
        if leaf.kind == "tensor":
            k = leaf.slots[0]
            w, = unbatch_inputs([outs[k]], loop_len)
            results.append(_place(w, outputs[k], ax, loop_len, n_static))
            continue
        if leaf.kind in ("sparse", "composite") and ax != 0:
            raise ValueError(f"vectorized_map: out_axes {ax} for a {leaf.kind} output; "
                             "composite outputs are stacked along axis 0")
        effects = side[leaf.slots[0]] if leaf.kind == "op" else None
        results.append(composites.assemble_leaf(leaf, outs, loop_len, n_static, effects))
    return traced.pack(results)


def _place(w: WrappedTensor, original: tf.Tensor, ax, loop_len, n_static) -> tf.Tensor:
    """A tensor output: stacked (tiled if invariant) with its axis at ``ax``, or, for
    ``ax=None``, the invariant value itself."""
    if ax is None:
        if w.is_stacked:
            raise VectorizationError(
                "out_axes=None for an output that differs across iterations "
                f"(output {original.name} of the loop body)")
        return w.t
    t = w.t if w.is_stacked else tile_to_stacked(w.t, loop_len)
    t.set_shape(tf.TensorShape([n_static]).concatenate(original.shape))
    if n_static is not None and t.shape.rank is not None:
        t.set_shape([n_static] + [None] * (t.shape.rank - 1))
    if ax != 0:
        if not -t.shape.rank <= ax < t.shape.rank:
            raise ValueError(f"vectorized_map: out_axes {ax} is invalid for an output of "
                             f"rank {t.shape.rank}")
        t = _move_axis(t, 0, ax % t.shape.rank)
    return t


def _convert(traced: trace.TracedBody, bound: Sequence[WrappedTensor], loop_len, options,
             chunked: bool = False):
    """The vectorized outputs, and the ops emitted for each returned ``tf.Operation``."""
    fallback, parallel_iterations, randomness = options
    vec = Vectorizer(loop_len, fallback_to_while_loop=fallback,
                     parallel_iterations=parallel_iterations, randomness=randomness,
                     xla=in_xla_context(), reductions=traced.reductions)
    vec.chunked = chunked
    outs = vec.convert_graph(traced.graph, list(bound) + traced.capture_inputs())
    # A returned op stands for every side effect of the body (what running it implies).
    effects = [op for ops in vec.side_effects.values() for op in ops]
    return outs, [effects for _ in traced.op_outputs]


def _chunked(traced, bound: Sequence[WrappedTensor], loop_len, options, chunk: int):
    """Vectorize ``chunk`` iterations at a time in a sequential ``tf.while_loop``.

    With a static iteration count the loop runs over full chunks of static size and the
    remainder is one more vectorized chunk (all shapes static, so XLA compiles it); with a
    dynamic count the last chunk of the loop is simply shorter.  Returned side effects are
    the loops themselves.
    """
    outputs = traced.graph.outputs
    n_static = tf.get_static_value(loop_len)
    done = []

    def run(start, size):
        sliced = [WrappedTensor(_rows(w.t, start, size), True) if w.is_stacked else w
                  for w in bound]
        outs, side = _convert(traced, sliced, size, options, chunked=True)
        outs = unbatch_inputs(outs, size)  # (chunks are concatenated as stacked tensors)
        with tf.control_dependencies([op for ops in side for op in ops]):
            outs = [tf.identity(w.t if w.is_stacked else tile_to_stacked(w.t, size))
                    for w in outs]
            return outs, tf.identity(size)

    def loop(num_chunks, size_of, element_shape):
        tas = [tf.TensorArray(o.dtype, size=num_chunks, infer_shape=False,
                              element_shape=tf.TensorShape([element_shape]).concatenate(o.shape))
               for o in outputs]

        def body(k, tas):
            outs, size = run(k * chunk, size_of(k))
            with tf.control_dependencies([size]):
                return k + 1, [ta.write(k, t) for ta, t in zip(tas, outs)]

        k, tas = tf.while_loop(lambda k, _: k < num_chunks, body, (tf.constant(0), tas))
        done.append(k)
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
            outs, size = run(num_full * chunk, rem)
            pieces.append(outs)
            done.append(size)
        flat = [tf.concat(p, 0) if len(p) > 1 else p[0] for p in zip(*pieces)]
        for t, o in zip(flat, outputs):   # (TensorArray.concat forgets the static shape)
            if o.dtype != tf.variant:
                t.set_shape(tf.TensorShape([int(n_static)]).concatenate(o.shape))
    side = [[t.op for t in done] for _ in traced.op_outputs]
    return [WrappedTensor(t, True) for t in flat], side


def _rows(t: tf.Tensor, start, size) -> tf.Tensor:
    """``t[start:start+size]`` with a static leading dimension when ``size`` is an int."""
    if t.shape.rank is None:
        return tf.gather(t, tf.range(start, start + size))
    rank = t.shape.rank
    begin = tf.concat([tf.reshape(tf.cast(start, tf.int32), [1]), tf.zeros([rank - 1], tf.int32)], 0)
    sizes = tf.concat([tf.reshape(tf.cast(size, tf.int32), [1]), -tf.ones([rank - 1], tf.int32)], 0)
    rows = tf.slice(t, begin, sizes)  # a dynamic-offset, static-size slice for XLA
    if isinstance(size, int) and rows.shape.rank is not None:
        rows.set_shape([size] + rows.shape.as_list()[1:])
    return rows


def _dispatch(kind: str, fn: Callable, build: Callable, static_key, tensors: list, options):
    if not tf.executing_eagerly():
        return build(fn, *tensors)
    return eager_cache.call_cached(kind, fn, build, static_key, tensors, options)

# }}}


# {{{ argument checking and small helpers

def _check_options(fallback, parallel_iterations, randomness) -> None:
    if not isinstance(fallback, bool):
        raise TypeError(f"fallback_to_while_loop must be a bool, got {fallback!r}")
    if parallel_iterations is not None and (
            not isinstance(parallel_iterations, (int, np.integer))
            or isinstance(parallel_iterations, bool) or parallel_iterations < 1):
        raise ValueError(f"parallel_iterations must be None or a positive integer, got "
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
        raise TypeError(f"pfor: iters must be an int or a scalar integer tensor, got "
                        f"{_describe(t)}")
    value = tf.get_static_value(t)
    if value is not None and not tf.executing_eagerly():
        if value < 0:
            raise ValueError(f"pfor: iters must be >= 0, got {int(value)}")
        return int(value)
    return None


def _wants_config(loop_fn: Callable) -> Any:
    """False, True (a second required positional parameter) or "keyword" (``pfor_config``)."""
    try:
        params = inspect.signature(loop_fn).parameters
    except (TypeError, ValueError):
        return False
    if "pfor_config" in params:
        return "keyword"
    required = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY,
                                                         p.POSITIONAL_OR_KEYWORD)
                and p.default is p.empty]
    return len(required) >= 2


def in_xla_context() -> bool:
    """Whether ops are being emitted inside a ``jit_compile=True`` trace.

    Example:
        >>> in_xla_context()
        False
    """
    from tensorflow.python.ops import control_flow_util
    try:
        return bool(control_flow_util.GraphOrParentsInXlaContext(
            tf.compat.v1.get_default_graph()))
    except Exception:  # pragma: no cover - private API moved
        return False


def _describe(x: Any) -> str:
    """A short description of a value for error messages: type and shape, never values."""
    if isinstance(x, (tf.Tensor, tf.Variable, np.ndarray)):
        return f"{getattr(x.dtype, 'name', x.dtype)}{list(x.shape) if x.shape is not None else '?'}"
    if isinstance(x, (tf.RaggedTensor, tf.SparseTensor)):
        return f"{type(x).__name__}{list(x.shape)}"
    if isinstance(x, (int, float, bool, str, type(None))):
        return repr(x)
    return type(x).__name__


def _flat_axes(axes: Any, structure: Any, what: str) -> list:
    n = len(tf.nest.flatten(structure))
    if axes is None or isinstance(axes, (int, np.integer)):
        return [None if axes is None else int(axes)] * n
    try:
        per = nest.map_structure_up_to(
            axes, lambda ax, sub: [ax] * len(tf.nest.flatten(sub)), axes, structure)
    except (ValueError, TypeError):
        shapes = tf.nest.map_structure(_describe, structure)
        raise ValueError(f"vectorized_map: {what} {axes!r} does not match the structure "
                         f"of the values it describes, {shapes!r}; give one axis (or None) "
                         "per value, or one for a whole sub-structure") from None
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
