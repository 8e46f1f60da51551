"""Converter micro-benchmarks: tfx_vec.pfor vs tf.vectorized_map vs tf.map_fn (a while loop),
and tfx_vec.pfor inside ``tf.function(jit_compile=True)`` (the ratio column
``tfx_vec.pfor/tfx_vec.pfor (jit_compile)`` is the graph-mode time over the XLA time).

One case per converter family whose formulation matters (grouped conv for per-iteration filters,
per-example gradients through conv/pool backprops, segment-id offsets, right-hand sides folded
into one solve, per-iteration batch-norm statistics), all inside ``tf.function``.

Run: ``.venv/bin/python -m benchmarks [--quick] pfor_converters``
"""
import numpy as np
import tensorflow as tf
import tfx_vec
from benchmarks.harness import Report


def _cases(n):
    rng = np.random.default_rng(0)
    r = lambda *s: tf.constant(rng.uniform(-1, 1, size=s).astype(np.float32))  # noqa: E731
    xs, fs = r(n, 4, 16, 16, 8), r(n, 3, 3, 8, 16)
    imgs, labels = r(n, 28, 28, 1), tf.constant(rng.integers(0, 10, size=n).astype(np.int32))
    w = [r(3, 3, 1, 8), r(3, 3, 8, 16), r(7 * 7 * 16, 10)]
    seg_data, seg_ids = r(n, 2000, 16), tf.constant(np.sort(rng.integers(0, 100, 2000)).astype(np.int32))
    a = r(64, 64) + 8 * tf.eye(64)
    rhs = r(n, 64, 8)
    bn_x = r(n, 8, 8, 8, 16)
    signal = tf.complex(r(n, 64, 64), r(n, 64, 64))
    sorted_rows = tf.sort(r(8, 4096), axis=-1)
    queries, keys = r(n, 8, 256), r(n, 2048)

    def per_example_grad(i):
        with tf.GradientTape() as tape:
            tape.watch(w)
            h = tf.nn.max_pool2d(tf.nn.relu(tf.nn.conv2d(tf.gather(imgs, i)[None], w[0], 1, "SAME")), 2, 2, "VALID")
            h = tf.nn.max_pool2d(tf.nn.relu(tf.nn.conv2d(h, w[1], 1, "SAME")), 2, 2, "VALID")
            logits = tf.matmul(tf.reshape(h, [1, -1]), w[2])
            loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(tf.gather(labels, i)[None], logits))
        return tape.gradient(loss, w)

    return {
        "conv2d, per-iteration images+filters": lambda i: tf.nn.conv2d(tf.gather(xs, i), tf.gather(fs, i), 1, "SAME"),
        "per-example grads, MNIST convnet": per_example_grad,
        "segment_sum, per-iteration data": lambda i: tf.math.segment_sum(tf.gather(seg_data, i), seg_ids),
        "solve, invariant 64x64 matrix": lambda i: tf.linalg.solve(a, tf.gather(rhs, i)),
        "fused_batch_norm (training)": lambda i: tf.compat.v1.nn.fused_batch_norm(tf.gather(bn_x, i), tf.ones([16]), tf.zeros([16]))[0],
        "fft2d + irfft, per-iteration signal": lambda i: tf.signal.irfft(tf.signal.fft2d(tf.gather(signal, i))),
        "searchsorted, invariant sorted rows": lambda i: tf.searchsorted(sorted_rows, tf.gather(queries, i)),
        "argsort / top_k, per-iteration keys": lambda i: (tf.argsort(tf.gather(keys, i)), tf.math.top_k(tf.gather(keys, i), 16).values),
    }


def run(quick: bool) -> Report:
    n = 64 if quick else 256
    report = Report("pfor_converters", unit="ms", ours="tfx_vec.pfor",
                    notes=f"n={n} iterations; median of round-robin samples inside tf.function")
    for case, body in _cases(n).items():
        report.measure_interleaved(case, _implementations(body, n), rounds=11 if quick else 21,
                                   warmup=3)
    return report


JIT = "tfx_vec.pfor (jit_compile)"


def _implementations(body, n: int) -> dict:
    idx = tf.range(n)
    spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), body(tf.constant(0)))
    return {
        "tfx_vec.pfor": tf.function(lambda: tfx_vec.pfor(body, n, fallback_to_while_loop=False)),
        JIT: tf.function(lambda: tfx_vec.pfor(body, n, fallback_to_while_loop=False),
                         jit_compile=True),
        "tf.vectorized_map": tf.function(lambda: tf.vectorized_map(body, idx)),
        "tf.map_fn": tf.function(lambda: tf.map_fn(body, idx, fn_output_signature=spec)),
    }
