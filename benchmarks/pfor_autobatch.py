"""Paper Figure 1: auto-batching single-example inference with pfor.

Two models written for ONE example -- a linear projection (768-d input, constant 768x768
matrix) and a small MNIST convnet (conv-relu-maxpool x2, dense-relu-dense) -- are run on a
batch by ``tfx_vec.pfor``, ``tf.map_fn`` (a while loop), ``tf.vectorized_map`` (TensorFlow's
pfor) and hand-batched code, all inside ``tf.function``, in one process; ``tfx_vec.pfor`` and
the hand-batched code also inside ``tf.function(jit_compile=True)``.  The value is
throughput in examples/s (higher is better; ratios >1 mean tfx_vec wins).

Also "first call": the time of the first call of a fresh ``tf.function`` (trace + vectorize +
run, batch 256), reported as calls/s so that the ratio reads the same way.

Run: ``.venv/bin/python -m benchmarks [--quick] pfor_autobatch``.
"""
from __future__ import annotations

import statistics
import time

import numpy as np
import tensorflow as tf

import tfx_vec
from benchmarks.harness import Report

OURS = "tfx_vec.pfor"


def linear_model(rng: np.random.Generator):
    w = tf.constant(rng.standard_normal([768, 768]).astype(np.float32) / 28.0)

    def one(x):                       # x: [768]
        return tf.linalg.matvec(w, x, transpose_a=True)

    def batched(xs):                  # xs: [b, 768]
        return tf.matmul(xs, w)

    def inputs(b):
        return tf.constant(rng.standard_normal([b, 768]).astype(np.float32))
    return one, batched, inputs


def convnet_model(rng: np.random.Generator):
    def const(*shape):
        return tf.constant((rng.standard_normal(shape) / np.sqrt(np.prod(shape[:-1])))
                           .astype(np.float32))
    k1, b1, k2, b2 = const(5, 5, 1, 16), const(16), const(5, 5, 16, 32), const(32)
    w3, b3, w4, b4 = const(7 * 7 * 32, 128), const(128), const(128, 10), const(10)

    def features(x):                  # x: [batch, 28, 28, 1]
        h = tf.nn.max_pool2d(tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, k1, 1, "SAME"), b1)), 2, 2,
                             "VALID")
        h = tf.nn.max_pool2d(tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(h, k2, 1, "SAME"), b2)), 2, 2,
                             "VALID")
        h = tf.reshape(h, [-1, 7 * 7 * 32])
        return tf.nn.relu(h @ w3 + b3) @ w4 + b4

    def one(x):                       # x: [28, 28, 1], written for a single image
        return features(x[tf.newaxis])[0]

    def inputs(b):
        return tf.constant(rng.standard_normal([b, 28, 28, 1]).astype(np.float32))
    return one, features, inputs


JIT = "tfx_vec.pfor (jit_compile)"


def implementations(one, batched):
    return {
        OURS: tf.function(lambda xs: tfx_vec.vectorized_map(one, xs)),
        JIT: tf.function(lambda xs: tfx_vec.vectorized_map(one, xs), jit_compile=True),
        "hand-batched (jit_compile)": tf.function(batched, jit_compile=True),
        "tf.vectorized_map": tf.function(lambda xs: tf.vectorized_map(one, xs)),
        "tf.map_fn (while_loop)": tf.function(
            lambda xs: tf.map_fn(one, xs, fn_output_signature=tf.float32)),
        "hand-batched": tf.function(batched),
    }


def interleaved(fns: dict, rounds: int, inner: int, warmup: int = 3) -> dict:
    """Seconds per call of each function, sampled round-robin (one sample of each per round)
    so that load drifting on a shared machine hits every implementation alike.
    Returns ``{name: (median, min, max)}``."""
    for f in fns.values():
        for _ in range(warmup):
            f().numpy()
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                out = f()
            out.numpy()
            samples[name].append((time.perf_counter() - t0) / inner)
    return {name: (statistics.median(v), min(v), max(v)) for name, v in samples.items()}


def first_call_seconds(makers: dict, xs, repeats: int) -> dict[str, float]:
    """Median time of the first call of a fresh tf.function per implementation; samples are
    interleaved and one untimed round goes first (process-wide one-time costs)."""
    samples = {name: [] for name in makers}
    for r in range(repeats + 1):
        for name, make in makers.items():
            f = make()
            t0 = time.perf_counter()
            f(xs).numpy()
            if r:
                samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(s) for name, s in samples.items()}


def run(quick: bool) -> Report:
    rng = np.random.default_rng(0)
    sizes = [1, 16, 256] if quick else [1, 4, 16, 64, 256, 1024]
    rounds = 5 if quick else 15
    report = Report("pfor_autobatch", unit="examples/s", ours=OURS, higher_is_better=True)
    fallbacks = {}
    for name, model in (("linear", linear_model), ("convnet", convnet_model)):
        one, batched, inputs = model(rng)
        impls = implementations(one, batched)
        tfx_vec.reset_fallbacks()
        for b in sizes:
            xs = inputs(b)
            fns = {impl: (lambda fn=fn: fn(xs)) for impl, fn in impls.items()
                   # the while loop on 1024 images takes minutes per sample on a shared machine
                   if not (impl.startswith("tf.map_fn") and name == "convnet" and b > 256)}
            for impl, (med, lo, hi) in interleaved(fns, rounds, max(1, 64 // b)).items():
                report.add(f"{name} b={b}", impl, b / med, lo=b / hi, hi=b / lo)
        fallbacks[name] = dict(tfx_vec.fallback_report())
        makers = {OURS: lambda: tf.function(lambda v: tfx_vec.vectorized_map(one, v)),
                  "tf.vectorized_map": lambda: tf.function(lambda u: tf.vectorized_map(one, u))}
        for impl, secs in first_call_seconds(makers, inputs(256), 3 if quick else 5).items():
            report.add(f"{name} first call b=256 (calls/s)", impl, 1.0 / secs, seconds=secs)
    report.notes = (
        "examples/s, median of round-robin timed calls inside tf.function (first-call rows: calls/s of a "
        "fresh tf.function's first call = trace + vectorize + run).\n"
        f"pfor fallbacks (op type: count): {fallbacks}")
    return report
