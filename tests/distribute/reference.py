"""References the distributed tests compare with: DP-SGD written as a per-example Python loop.

Every example's gradient comes from its own ``GradientTape``; clipping, summing and the noise
are written out with NumPy.  The noise is the documented function of ``(seed, step, variable
index)`` (stateless normals), which is what makes a seeded comparison possible.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf


def noise_draws(shapes: Sequence[Sequence[int]], seed: int, step: int, stddev: float
                ) -> list[np.ndarray]:
    """The noise DP-SGD adds at ``step``: N(0, stddev^2) per variable, stateless."""
    fold_in = tf.random.experimental.stateless_fold_in
    step_seed = fold_in(tf.constant([0, seed], tf.int64), tf.constant(step, tf.int64))
    return [tf.random.stateless_normal(
        shape, fold_in(step_seed, tf.constant(k, tf.int64)), stddev=stddev).numpy()
        for k, shape in enumerate(shapes)]


def dp_gradient_loop(loss_fn: Callable[[Any], tf.Tensor], variables: Sequence[tf.Variable],
                     batch: Any, *, l2_norm_clip: float, noise_multiplier: float, seed: int,
                     step: int, microbatch_size: int = 1) -> tuple[list[np.ndarray], np.ndarray]:
    """(noised mean clipped gradient, norms) by a Python loop over microbatches."""
    leaves = tf.nest.flatten(batch)
    n = int(leaves[0].shape[0])
    sums = [np.zeros(v.shape, np.float64) for v in variables]
    norms = []
    for start in range(0, n, microbatch_size):
        mb = tf.nest.map_structure(lambda t: t[start:start + microbatch_size], batch)
        with tf.GradientTape() as tape:
            loss = loss_fn(mb)
        grads = [np.asarray(g, np.float64) for g in tape.gradient(loss, list(variables))]
        norm = np.sqrt(sum(float(np.sum(g * g)) for g in grads))
        norms.append(norm)
        factor = min(1.0, l2_norm_clip / norm)
        sums = [s + factor * g for s, g in zip(sums, grads)]
    noise = noise_draws([v.shape for v in variables], seed, step, noise_multiplier * l2_norm_clip)
    m = n // microbatch_size
    return [(s + z) / m for s, z in zip(sums, noise)], np.array(norms)
