"""Vectorized ``Dataset.map`` (paper §5.4): examples/s of an input pipeline.

A per-example preprocessing function (normalize an image, random-free augment with a
data-dependent ``tf.cond``, a small feature transform) over a dataset of 28x28 images.
Implementations (the pipeline is iterated to the end each time):

- ``tfx_vec``: ``dataset.apply(tfx_vec.pfor.data.map_and_batch(fn, b))``;
- ``map+batch``: ``dataset.map(fn).batch(b)``;
- ``map(parallel)+batch``: the same with ``num_parallel_calls=AUTOTUNE``;
- ``tf.vectorized_map``: ``dataset.batch(b).map(lambda x: tf.vectorized_map(fn, x))``.

Run: ``.venv/bin/python -m benchmarks [--quick] dataset_map``.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from benchmarks import _pfor_models as M
from benchmarks.harness import Report
from tfx_vec.pfor.data import map_and_batch


def _preprocess(w):
    def fn(image):
        x = (image - tf.reduce_mean(image)) / (tf.math.reduce_std(image) + 1e-6)
        x = tf.cond(tf.reduce_sum(x[:, :14]) > tf.reduce_sum(x[:, 14:]),
                    lambda: tf.reverse(x, [1]), lambda: x)
        feats = tf.nn.relu(tf.matmul(tf.reshape(x, [1, -1]), w))[0]
        return x[..., None], feats
    return fn


def _consume(ds: tf.data.Dataset) -> int:
    """Run the whole pipeline inside the tf.data runtime (no Python per batch)."""
    return int(ds.reduce(tf.constant(0), lambda count, _: count + 1))


def run(quick: bool) -> Report:
    report = Report("dataset_map", unit="examples/s", ours="tfx_vec", higher_is_better=True,
                    notes="CPU; a full pass over the dataset per timing (Dataset.reduce).")
    rng = np.random.default_rng(0)
    n = 2048 if quick else 16384
    images = rng.normal(size=[n, 28, 28]).astype(np.float32)
    w = tf.constant(rng.normal(size=[784, 32]).astype(np.float32) / 28.0)
    fn = _preprocess(w)
    base = tf.data.Dataset.from_tensor_slices(images)
    batches = [32, 128] if quick else [8, 32, 128, 512]
    repeats, warmup = (3, 1) if quick else (5, 1)
    for b in batches:
        pipelines = {
            "tfx_vec": base.apply(map_and_batch(fn, b)),
            "map+batch": base.map(fn).batch(b),
            "map(parallel)+batch": base.map(fn, num_parallel_calls=tf.data.AUTOTUNE).batch(b),
            "tf.vectorized_map": base.batch(b).map(lambda x: tf.vectorized_map(fn, x)),
        }
        M.measure_interleaved(report, f"b={b}", {k: (lambda ds=ds: _consume(ds))
                                                for k, ds in pipelines.items()},
                              items=n, rounds=repeats, warmup=warmup)
    return report
