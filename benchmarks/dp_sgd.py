"""DP-SGD training steps: examples/s of one full step (per-example gradients, clipping to an l2
norm, one Gaussian noise draw, SGD update), on a dense and a conv Keras model.

Implementations differ only in how the per-example gradients are computed; clipping, noise
and update are the same code, and all three are one ``tf.function`` each:

- ``tfx_vec``: :func:`tfx_vec.pfor.dp_sgd.dp_gradients` (one vectorized pfor loop);
- ``map_fn``: the textbook loop, ``tf.map_fn`` of a per-example ``GradientTape`` gradient;
- ``tf.vectorized_map``: TensorFlow's own pfor over the same per-example gradient function
  (the approach TF Privacy's vectorized optimizers take).

Models: ``dense`` (784-512-10 MLP, 407k parameters) and ``conv`` (TF Privacy's MNIST tutorial
convnet: conv 16@8x8/2, pool, conv 32@4x4/2, pool, dense 32, dense 10; 26k parameters).
Before timing, the three noised gradients are checked equal (same seed, same step).

Run: ``.venv/bin/python -m benchmarks [--quick] dp_sgd``.
"""
from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from benchmarks.harness import Report
from tfx_vec.pfor import dp_sgd

CLIP, SIGMA, SEED, LR = 1.0, 1.1, 0, 0.1


def dense_model() -> keras.Model:
    return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                             keras.layers.Dense(512, activation="relu"),
                             keras.layers.Dense(10)])


def conv_model() -> keras.Model:
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(16, 8, strides=2, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2, 1), keras.layers.Conv2D(32, 4, strides=2,
                                                             activation="relu"),
        keras.layers.MaxPooling2D(2, 1), keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])


MODELS = {"dense": dense_model, "conv": conv_model}
_xent = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _per_example_loop(model, vectorize):
    """Per-example gradients ``[b, *v.shape]`` by ``tf.map_fn`` or ``tf.vectorized_map``."""
    variables = [v.value for v in model.trainable_variables]

    def one(example):
        x, y = example
        with tf.GradientTape() as tape:
            loss = _xent(y[None], model(x[None], training=True))
        return tape.gradient(loss, variables)

    def grads(batch):
        if vectorize:
            return tf.vectorized_map(one, batch)
        return tf.map_fn(one, batch, fn_output_signature=[
            tf.TensorSpec(v.shape, v.dtype) for v in variables])
    return grads


def _peer_dp_gradients(per_example, variables, batch, step):
    """Clip, sum, noise and average as DP-SGD does, on given per-example gradients."""
    sums, _ = dp_sgd.clip_and_sum(per_example(batch), CLIP)
    fold = tf.random.experimental.stateless_fold_in
    step_seed = fold(tf.constant([0, SEED], tf.int64), tf.cast(step, tf.int64))
    n = tf.cast(tf.shape(batch[0])[0], tf.float32)
    return [(s + tf.random.stateless_normal(tf.shape(v), fold(step_seed, tf.constant(
        k, tf.int64)), stddev=SIGMA * CLIP)) / n for k, (s, v) in enumerate(zip(sums, variables))]


def make_steps(model) -> dict:
    """{implementation: tf.function(batch, step) -> noised gradients}, no update applied."""
    variables = model.trainable_variables

    def ours(batch, step):
        return dp_sgd.dp_gradients(
            lambda mb: _xent(mb[1], model(mb[0], training=True)), variables, batch,
            l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=SEED, step=step).grads

    impls = {"tfx_vec": ours}
    for name, vec in (("map_fn", False), ("tf.vectorized_map", True)):
        loop = _per_example_loop(model, vec)
        impls[name] = lambda batch, step, loop=loop: _peer_dp_gradients(loop, variables, batch,
                                                                         step)
    return {k: tf.function(f) for k, f in impls.items()}


def make_train_steps(model, grads_fns: dict) -> dict:
    """Each gradient function followed by the same SGD update: the timed training step."""
    opt = keras.optimizers.SGD(LR)
    opt.build(model.trainable_variables)

    def train(grads_fn):
        @tf.function
        def step(batch):
            g = grads_fn(batch, tf.identity(opt.iterations.value))
            opt.apply_gradients(zip(g, model.trainable_variables))
            return g[0][0]
        return step
    return {k: train(f) for k, f in grads_fns.items()}


def synthetic_batch(b: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (tf.constant(rng.normal(size=(b, 28, 28, 1)).astype(np.float32)),
            tf.constant(rng.integers(0, 10, b).astype(np.int32)))


def check_equal(grads_fns: dict, batch) -> None:
    ref = [g.numpy() for g in grads_fns["tfx_vec"](batch, 3)]
    for name, fn in grads_fns.items():
        for a, b in zip(fn(batch, 3), ref):
            np.testing.assert_allclose(a.numpy(), b, rtol=2e-3, atol=2e-5, err_msg=name)


def run(quick: bool) -> Report:
    report = Report("dp_sgd", unit="examples/s", ours="tfx_vec", higher_is_better=True,
                    notes="CPU; one DP-SGD training step (per-example gradients, clip, noise, "
                          "SGD update) per call, each implementation one tf.function; "
                          "noised gradients checked equal before timing.")
    batches = [32] if quick else [32, 128, 256]
    rounds, warmup = (3, 1) if quick else (5, 2)
    for model_name, make in MODELS.items():
        keras.utils.set_random_seed(0)
        model = make()
        grads_fns = make_steps(model)
        steps = make_train_steps(model, grads_fns)
        for b in batches:
            batch = synthetic_batch(b)
            check_equal(grads_fns, batch)
            report.measure_interleaved(f"{model_name} b={b}",
                                       {k: (lambda fn=fn: fn(batch)) for k, fn in steps.items()},
                                       items=b, rounds=rounds, warmup=warmup)
    return report
