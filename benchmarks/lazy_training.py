"""Custom training loops in eager, lazy, tf.function and tf.function(jit_compile=True).

One training-step function (plain eager TF code: a GradientTape, ``tf.*`` calls, operators,
``assign_sub``) is run four ways on the same data and weights: eager; ``tfx_vec.lazy`` (lazy
variables and tape, ``lazy.mark_step()`` after the step, warm cache); ``tf.function``; and
``tf.function(jit_compile=True)``.  Models: an 8-layer MLP of 32 units and a small convnet.
Also reported: the lazy first-step time (recording + compile) and the recording cost per op
(the time to record one training step, tape and updates included, divided by the ops recorded;
best of the repeats).  "lazy async" is the same loop with ``lazy.mark_step(wait=False)``
(PyTorch/XLA's asynchronous barrier); "lazy, no trace cache" the blocking loop with
``lazy.configure(trace_cache=False)``, so the trace cache's gain is measured in the same run.
Samples of the implementations are interleaved round by round (lazy rows last, rotated).

Run: ``.venv/bin/python -m benchmarks lazy_training`` (``--quick`` for fewer repeats).
"""
from __future__ import annotations

import statistics
import time

import numpy as np
import tensorflow as tf

from benchmarks.harness import Report, time_fn
from tfx_vec import lazy

LR = 0.05


def _mlp_params(rng, width=32, depth=8, n_in=32, n_out=10):
    dims = [n_in] + [width] * (depth - 1) + [n_out]
    ws = [rng.normal(0, (2.0 / a) ** 0.5, (a, b)).astype(np.float32)
          for a, b in zip(dims[:-1], dims[1:])]
    bs = [np.full([b], 0.01, np.float32) for b in dims[1:]]
    return ws + bs


def _mlp_forward(params, x):
    n = len(params) // 2
    h = x
    for i, (w, b) in enumerate(zip(params[:n], params[n:])):
        h = tf.matmul(h, w) + b
        if i < n - 1:
            h = tf.nn.relu(h)
    return h


def _conv_params(rng):
    return [rng.normal(0, 0.3, (3, 3, 1, 8)).astype(np.float32),
            rng.normal(0, 0.1, (3, 3, 8, 16)).astype(np.float32),
            rng.normal(0, 0.05, (4 * 4 * 16, 10)).astype(np.float32),
            np.full([8], 0.01, np.float32), np.full([16], 0.01, np.float32),
            np.zeros([10], np.float32) + 0.01]


def _conv_forward(params, x):
    k1, k2, wd, b1, b2, bd = params
    h = tf.nn.relu(tf.nn.conv2d(x, k1, 1, "SAME") + b1)
    h = tf.nn.max_pool2d(h, 2, 2, "VALID")
    h = tf.nn.relu(tf.nn.conv2d(h, k2, 1, "SAME") + b2)
    h = tf.nn.max_pool2d(h, 2, 2, "VALID")
    h = tf.reshape(h, [h.shape[0], -1])
    return tf.matmul(h, wd) + bd


def train_step(forward, params, x, y, tape_cls=tf.GradientTape):
    """One SGD step, written as ordinary eager TF code."""
    with tape_cls() as tape:
        logits = forward(params, x)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    grads = tape.gradient(loss, params)
    for p, g in zip(params, grads):
        p.assign_sub(LR * g)
    return loss


def _data(rng, model, batch):
    if model == "mlp":
        x = rng.normal(size=(batch, 32)).astype(np.float32)
    else:
        x = rng.normal(size=(batch, 16, 16, 1)).astype(np.float32)
    return tf.constant(x), tf.constant(rng.integers(0, 10, batch).astype(np.int32))


def _setups(model, batch, seed=0):
    rng = np.random.default_rng(seed)
    init = _mlp_params(rng) if model == "mlp" else _conv_params(rng)
    forward = _mlp_forward if model == "mlp" else _conv_forward
    x, y = _data(rng, model, batch)

    def eager():
        params = [tf.Variable(p) for p in init]
        return lambda: train_step(forward, params, x, y)

    def function(jit):
        params = [tf.Variable(p) for p in init]
        step = tf.function(lambda: train_step(forward, params, x, y), jit_compile=jit)
        return step

    def lazy_mode():
        params = [lazy.Variable(p) for p in init]
        lx, ly = lazy.tensor(x), lazy.tensor(y)

        def step(wait=True):
            loss = train_step(forward, params, lx, ly, lazy.GradientTape)
            lazy.mark_step(wait=wait)
            return loss
        return step, params, lx, ly, forward

    return eager, function, lazy_mode


def _recording_us_per_op(params, lx, ly, forward, repeats):
    """Time recording one training step (no barrier inside the timing), per recorded op."""
    best = float("inf")
    for _ in range(repeats):
        before = lazy.metrics().get("ops_recorded", 0)
        t0 = time.perf_counter()
        loss = train_step(forward, params, lx, ly, lazy.GradientTape)  # noqa: F841 (live,
        elapsed = time.perf_counter() - t0                               # as in the step)
        ops = lazy.metrics()["ops_recorded"] - before
        lazy.mark_step()
        best = min(best, elapsed / ops)
    return best * 1e6, ops


def _key_us(step, repeats: int) -> tuple[float, float]:
    """Median time of the barrier's program lookup (the ``canonicalize`` timer: trace cache
    hit, or graph walk and key) per step, with the trace cache on and off, alternating."""
    per: dict = {True: [], False: []}
    for _ in range(repeats):
        for on in (True, False):
            before = lazy.metrics().get("canonicalize_s", 0.0)
            (step if on else lambda: _untraced(step))()
            per[on].append(lazy.metrics()["canonicalize_s"] - before)
    return statistics.median(per[True]) * 1e6, statistics.median(per[False]) * 1e6


def _untraced(step):
    """A blocking lazy step with the trace cache off (the barrier canonicalizes the graph)."""
    lazy.configure(trace_cache=False)
    try:
        return step()
    finally:
        lazy.configure(trace_cache=True)


def _interleaved(report: Report, case: str, fns: dict, rounds: int, inner: int) -> None:
    """One timed sample of ``inner`` calls per implementation per round, rounds interleaved, so
    load from other jobs on this shared machine hits every implementation alike."""
    for fn in fns.values():
        time_fn(fn, repeats=1, warmup=2, inner=1)
    samples: dict = {name: [] for name in fns}
    # A lazy sample taken right after eager's runs measurably slower (its XLA executions), so
    # eager is followed by the tf.function rows, and the three lazy rows come last in an order
    # rotated each round: each of them follows each of the others equally often.
    names = list(fns)
    lazy_rows = [n for n in names if "lazy" in n]
    others = [n for n in names if n not in lazy_rows]
    for r in range(rounds):
        k = r % len(lazy_rows)
        for name in others + lazy_rows[k:] + lazy_rows[:k]:
            samples[name].append(time_fn(fns[name], repeats=1, warmup=0, inner=inner).median)
    for name, ss in samples.items():
        report.add(case, name, 1.0 / statistics.median(ss), lo=1.0 / max(ss), hi=1.0 / min(ss))


def run(quick: bool) -> Report:
    repeats, inner = (6, 5) if quick else (15, 10)
    report = Report("lazy_training", unit="steps/s", ours="tfx_vec.lazy", higher_is_better=True)
    notes = []
    for model, batch in (("mlp", 64), ("convnet", 16)):
        case = f"{model} b={batch}"
        eager, function, lazy_mode = _setups(model, batch)
        step, params, lx, ly, forward = lazy_mode()
        t0 = time.perf_counter()
        float(step())
        first = time.perf_counter() - t0
        _interleaved(report, case, {"eager": eager(), "tfx_vec.lazy": step,
                                    "lazy, no trace cache": lambda: _untraced(step),
                                    "tf.function": function(False),
                                    "tf.function(jit)": function(True),
                                    "lazy async": lambda: step(wait=False)},
                     repeats, inner)
        us, ops = _recording_us_per_op(params, lx, ly, forward, repeats)
        hit_us, walk_us = _key_us(step, 10 * repeats)
        notes.append(f"{case}: lazy first step (record + compile) {first:.2f} s; recording "
                     f"{us:.2f} us/op over {ops} recorded ops per step; barrier program lookup "
                     f"{hit_us:.0f} us (trace cache) vs {walk_us:.0f} us (graph walk + key)")
    m = lazy.metrics()
    notes.append(f"lazy metrics: compiles={m.get('compiles', 0)} cache_hits="
                 f"{m.get('cache_hits', 0)} trace_hits={m.get('trace_hits', 0)} "
                 f"executions={m.get('executions', 0)}")
    report.notes = "\n".join(notes)
    return report
