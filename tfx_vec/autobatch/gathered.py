"""Functions that run on the active members only: gathered in chunks, scattered back.

The program-counter runtime runs a block for the whole batch and keeps the results of the
members waiting at it (masking): every member pays for every block that runs.  That is the
right trade for cheap blocks (a gather and a scatter cost more than the block), not for an
expensive function that a fraction of the members reach at each loop step: NUTS' leapfrog
steps, at 1000 chains, when a third of the chains are at a leaf.

:func:`on_active_members` marks such a function.  Called by a program that the
program-counter runtime runs, it computes only the members that the block runs for: their
arguments gathered in chunks of ``ceil(batch / chunks)`` members (one ``tf.while_loop`` trip
per chunk that holds an active member, so that the function is traced and compiled once),
its results scattered back to the batch.  Members the block does not run for get zeros,
which the runtime's mask drops.  Anywhere else -- called directly, by the unbatched
reference, by the local-static runtime (which gathers whole blocks itself), below
``min_batch`` members or where the batch size is unknown at trace time -- it is the function
itself.

Pipeline: :func:`running_members` (the runtime) says which members a primitive runs for;
:func:`on_active_members` (the program) reads it; ``_active_first`` orders the members,
``_chunked`` loops over the chunks.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

import tensorflow as tf

__all__ = ["calls", "on_active_members", "running_members"]

_STATE = threading.local()


@contextlib.contextmanager
def running_members(mask: tf.Tensor | None) -> Iterator[None]:
    """While a runtime builds a primitive's operations: ``mask`` (``[B]`` bool) marks the
    members whose results it keeps (``None``: all of them, nothing to gather)."""
    previous = getattr(_STATE, "mask", None)
    _STATE.mask = mask
    try:
        yield
    finally:
        _STATE.mask = previous


def calls() -> int:
    """How many calls of functions marked :func:`on_active_members` this thread has made (a
    trace that made some cannot stand for the runtime's, which gathers)."""
    return getattr(_STATE, "calls", 0)


def on_active_members(fn: Callable | None = None, *, chunks: int = 4,
                      min_batch: int = 256) -> Callable:
    """Decorate an expensive, member-independent TF function of a batched program so that the
    program-counter runtime computes it only for the members at the block calling it.

    Every tensor argument whose leading dimension is the batch is gathered; other arguments
    (numbers, shared tensors) are passed as they are.  The function must return a structure
    of tensors with the batch as leading dimension.  Worth it where the function costs far
    more than gathering its arguments and scattering its results (a gradient, a few leapfrog
    steps), on batches of hundreds of members; a loss on cheap functions and small batches.

    Args:
      fn: the function (or use ``@on_active_members(chunks=...)``).
      chunks: the batch is split into this many chunks; a call computes the chunks that hold
        a member the block runs for (the active members come first).
      min_batch: below this many members, the function runs on the whole batch.

    Example:
        >>> import tensorflow as tf
        >>> from tfx_vec import autobatch as ab
        >>> @ab.on_active_members(min_batch=4)
        ... def expensive(x):
        ...     return x * x + 1.0
        >>> @ab.function
        ... def f(x):
        ...     if x > 0:
        ...         x = expensive(x)
        ...     return x
        >>> f(tf.constant([-1.0, 2.0, -3.0, 4.0])).numpy().tolist()
        [-1.0, 5.0, -3.0, 17.0]
    """
    if fn is None:
        return functools.partial(on_active_members, chunks=chunks, min_batch=min_batch)
    if int(chunks) < 1:
        raise ValueError(f"on_active_members: chunks must be >= 1, got {chunks}")

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        _STATE.calls = calls() + 1
        mask = getattr(_STATE, "mask", None)
        batch = None if mask is None else tf.compat.dimension_value(mask.shape[0])
        if batch is None or batch < min_batch or tf.executing_eagerly() \
                or not tf.compat.v1.executing_eagerly_outside_functions():
            return fn(*args, **kwargs)  # TF1 graphs: the function itself
        return _chunked(fn, mask, batch, -(-batch // int(chunks)), args, kwargs)
    return call


def _active_first(mask: tf.Tensor, batch: int) -> tuple[tf.Tensor, tf.Tensor]:
    """The members' indices, those where ``mask`` first (each group in order), and how many
    are active: a permutation from two running counts, without a sort (XLA:CPU's sort of
    1000 keys costs more than the function it would save)."""
    ones = tf.cast(mask, tf.int32)
    active = tf.reduce_sum(ones)
    position = tf.where(mask, tf.cumsum(ones) - 1, active + tf.cumsum(1 - ones) - 1)
    return tf.scatter_nd(position[:, None], tf.range(batch), [batch]), active


def _chunked(fn: Callable, mask: tf.Tensor, batch: int, size: int, args: tuple,
             kwargs: dict) -> Any:
    """``fn`` on the members where ``mask``, ``size`` at a time, results scattered back."""
    flat = tf.nest.flatten((args, kwargs))
    batched = [i for i, x in enumerate(flat) if isinstance(x, tf.Tensor) and x.shape.rank
               and tf.compat.dimension_value(x.shape[0]) == batch]

    def on_members(*members: tf.Tensor) -> Any:
        values = list(flat)
        for i, x in zip(batched, members):
            values[i] = x
        a, kw = tf.nest.pack_sequence_as((args, kwargs), values)
        return fn(*a, **kw)

    # traced once, for a chunk: the loop's body calls it (XLA inlines the call)
    traced = tf.function(on_members, autograph=False).get_concrete_function(
        *(tf.TensorSpec([size, *flat[i].shape[1:]], flat[i].dtype) for i in batched))
    outputs = tf.nest.flatten(traced.structured_outputs)
    for out in outputs:
        if not isinstance(out, tf.Tensor) or not out.shape.rank \
                or tf.compat.dimension_value(out.shape[0]) != size:
            raise ValueError(
                f"on_active_members: {getattr(fn, '__name__', fn)} must return tensors whose "
                f"leading dimension is the batch's (got {out!r} for a chunk of {size} members)")
    order, active = _active_first(mask, batch)

    def body(chunk: tf.Tensor, results: list) -> tuple:
        # the last chunk ends at the batch's end (it may overlap the one before: the same
        # members computed twice write the same values)
        index = tf.slice(order, [tf.minimum(chunk * size, batch - size)], [size])[:, None]
        new = tf.nest.flatten(traced(*(tf.gather_nd(flat[i], index) for i in batched)))
        return chunk + 1, [tf.tensor_scatter_nd_update(r, index, x)
                           for r, x in zip(results, new)]

    zeros = [tf.zeros([batch, *out.shape[1:]], out.dtype) for out in outputs]
    trips = (active + size - 1) // size
    _, results = tf.while_loop(lambda chunk, _: chunk < trips, body, (tf.constant(0), zeros))
    return tf.nest.pack_sequence_as(traced.structured_outputs, results)
