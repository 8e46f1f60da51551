"""Vectorized ``tf.data`` map (paper §5.4): ``map(fn).batch(n)`` as ``batch(n).map(pfor(fn))``.

``dataset.apply(map_and_batch(fn, n))`` gives the same elements as
``dataset.map(fn).batch(n)`` -- the final partial batch included (or dropped with
``drop_remainder=True``) and nested element structures kept -- but ``fn``, written for one
element, runs once per batch, vectorized by pfor over the batch rows.

Example:
    >>> import tensorflow as tf
    >>> ds = tf.data.Dataset.range(5).map(lambda i: tf.cast(i, tf.float32))
    >>> out = ds.apply(map_and_batch(lambda x: x * x, 2))
    >>> [b.numpy().tolist() for b in out]
    [[0.0, 1.0], [4.0, 9.0], [16.0]]
"""
from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

__all__ = ["map_and_batch"]


def map_and_batch(fn: Callable[..., Any], batch_size: int, *, drop_remainder: bool = False,
                  fallback_to_while_loop: bool = True, randomness: str = "different"
                  ) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
    """A ``Dataset.apply`` transformation equal to ``.map(fn).batch(batch_size)``.

    ``fn`` is called like ``Dataset.map`` calls it: a tuple element is unpacked into
    positional arguments, any other structure (a tensor, a dict) is passed whole.  Its outputs
    may be any nested structure of tensors.

    Args:
      fn: the per-element function.
      batch_size: elements per batch (a positive Python int).
      drop_remainder: drop the final partial batch, as ``Dataset.batch`` does.
      fallback_to_while_loop, randomness: pfor's options.

    Example:
      >>> import tensorflow as tf
      >>> ds = tf.data.Dataset.from_tensor_slices(tf.range(6.0))
      >>> [b.numpy().tolist() for b in ds.apply(map_and_batch(lambda v: v + 1.0, 4))]
      [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0]]
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"map_and_batch: batch_size must be a positive int, got {batch_size!r}")
    if not callable(fn):
        raise TypeError(f"map_and_batch: fn must be callable, got {fn!r}")

    def apply(dataset: tf.data.Dataset) -> tf.data.Dataset:
        @tf.autograph.experimental.do_not_convert
        def vectorized(*batched):
            element = batched if len(batched) > 1 else batched[0]
            unpack = isinstance(element, tuple)
            n = tf.shape(tf.nest.flatten(element)[0])[0]

            def loop_fn(i):
                row = tf.nest.map_structure(lambda t: tf.gather(t, i), element)
                return fn(*row) if unpack else fn(row)

            from tfx_vec.pfor import api
            return api.pfor(loop_fn, n, fallback_to_while_loop=fallback_to_while_loop,
                            randomness=randomness)

        return dataset.batch(batch_size, drop_remainder=drop_remainder).map(vectorized)

    return apply
