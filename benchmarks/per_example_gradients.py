"""Per-example gradients (paper Figure 2): examples/s vs batch size.

MNIST convnet and an LSTM over length-10 sequences (a ``tf.while_loop`` over time, so the
gradient contains a while loop too), and the same LSTM over sequences of per-example lengths
1..10 (``lstm varlen``: each example's loop runs its own number of steps, so the gradient's
accumulator lists hold a per-example number of elements; tfx_vec's result is checked against
the while loop's).  Implementations, each inside one ``tf.function``:

- ``tfx_vec``: ``tfx_vec.per_example_gradients`` (pfor over the examples);
- ``while_loop``: the same loss and ``tape.gradient`` per example in a ``tf.map_fn`` loop;
- ``tf.vectorized_map``: TensorFlow's own pfor over the same per-example function (on
  ``lstm varlen`` it fails at run time, noted in the report);
- ``tfx_vec (jit_compile)``: ``tfx_vec.per_example_gradients`` inside
  ``tf.function(jit_compile=True)``;
- ``jax jit(vmap(grad))`` (MNIST only, when JAX is installed): the same convnet and
  parameters in JAX, ``jax.jit(jax.vmap(jax.grad(loss)))``; its inputs are copied from
  TensorFlow once, outside the timed calls.

Run: ``.venv/bin/python -m benchmarks [--quick] per_example_gradients``.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from benchmarks import _pfor_models as M
from benchmarks.harness import Report
from tfx_vec.pfor.gradients import per_example_gradients
from tfx_vec.pfor.vectorizer import fallback_report, reset_fallbacks


def _cases(quick: bool):
    rng = np.random.default_rng(0)
    if quick:
        mnist = M.mnist_params(channels=(4, 8), hidden=32)
        lstm, d_in = M.lstm_params(16, 32, d_out=10), 16
        batches = [8, 32]
    else:
        mnist = M.mnist_params(channels=(8, 16), hidden=128)
        lstm, d_in = M.lstm_params(64, 128, d_out=10), 64
        batches = [1, 8, 32, 128, 256]

    def mnist_loss(example):
        image, label = example
        logits = M.mnist_logits(mnist, image)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(label, logits)

    def lstm_loss(example, bounded=False):
        xs, label = example
        h = M.lstm_while(lstm, xs, tf.shape(xs)[0], bounded)
        logits = tf.linalg.matvec(lstm[2], h, transpose_a=True)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(label, logits)

    def lstm_varlen_loss(example, bounded=False):
        xs, length, label = example
        h = M.lstm_while(lstm, xs, length, bounded)
        logits = tf.linalg.matvec(lstm[2], h, transpose_a=True)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(label, logits)

    for b in batches:
        labels = tf.constant(rng.integers(0, 10, size=[b]).astype(np.int32))
        images = tf.constant(rng.normal(size=[b, 28, 28, 1]).astype(np.float32))
        seqs = tf.constant(rng.normal(size=[b, 10, d_in]).astype(np.float32))
        yield f"mnist b={b}", mnist_loss, mnist, (images, labels), b
        yield f"lstm10 b={b}", lstm_loss, lstm, (seqs, labels), b
        lengths = tf.constant(rng.integers(1, 11, size=[b]).astype(np.int32))
        yield f"lstm varlen b={b}", lstm_varlen_loss, lstm, (seqs, lengths, labels), b


def _tf_vectorized_map(loss_fn, variables, batch):
    def one(example):
        with tf.GradientTape() as tape:
            loss = loss_fn(example)
        return tape.gradient(loss, variables)
    return tf.vectorized_map(one, batch)


def _check_against_loop(loss_fn, variables, batch) -> None:
    """tfx_vec's per-example gradients equal the while loop's (and nothing fell back)."""
    reset_fallbacks()
    ours = per_example_gradients(loss_fn, variables, batch, fallback_to_while_loop=False)
    loop = per_example_gradients(loss_fn, variables, batch, use_pfor=False)
    for a, b in zip(ours, loop):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-3, atol=1e-5)
    assert not fallback_report(), str(fallback_report())


def run(quick: bool) -> Report:
    report = Report("per_example_gradients", unit="examples/s", ours="tfx_vec",
                    higher_is_better=True,
                    notes="CPU; per-example gradients of all parameters; each implementation "
                          "is one tf.function, timed after warm-up (tracing excluded).")
    if not M.jax_available():
        report.notes += "\n" + M.JAX_MISSING
    repeats, warmup = (3, 1) if quick else (5, 2)
    for case, loss_fn, variables, batch, b in _cases(quick):
        if "varlen" in case:
            _check_against_loop(loss_fn, variables, batch)
        impls = {
            "tfx_vec": M.compiled(lambda batch, f=loss_fn, v=variables:
                                   per_example_gradients(f, v, batch)),
            "while_loop": M.compiled(lambda batch, f=loss_fn, v=variables:
                                      per_example_gradients(f, v, batch, use_pfor=False)),
            "tf.vectorized_map": M.compiled(lambda batch, f=loss_fn, v=variables:
                                             _tf_vectorized_map(f, v, batch)),
            JIT: M.compiled(lambda batch, f=_bounded(loss_fn), v=variables:
                            per_example_gradients(f, v, batch), jit_compile=True),
        }
        calls = {k: (lambda fn=fn, batch=batch: fn(batch)) for k, fn in impls.items()}
        if case.startswith("mnist") and M.jax_available():
            calls[JAX] = M.jax_mnist_per_example_grads(variables, *batch)
        M.measure_interleaved(report, case, calls, items=b, rounds=repeats, warmup=warmup)
        jit, jax_v = report.value(case, JIT), report.value(case, JAX)
        if jit and jax_v:
            report.notes += f"\n{case}: {JIT}/{JAX} = {jit / jax_v:.2f}x"
    return report


JIT = "tfx_vec (jit_compile)"
JAX = "jax jit(vmap(grad))"


def _bounded(loss_fn):
    """The loss with its while loops bounded (``maximum_iterations``) for XLA, if it has any."""
    import inspect
    if "bounded" in inspect.signature(loss_fn).parameters:
        return lambda example: loss_fn(example, bounded=True)
    return loss_fn
