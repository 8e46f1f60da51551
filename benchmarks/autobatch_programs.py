"""Fibonacci and Collatz, batched: members per second for every autobatch runtime and its peers.

Implementations (same inputs, same process):

* ``pc+xla`` (ours): program-counter runtime, ``jit_compile=True``, one XLA program, with the
  ``sweep_guarded`` block scheduler (every block once per loop step in program order; those
  that write stacks or touch non-scalar values behind a ``tf.cond`` on whether any member
  waits at them, the rest masked).
* ``pc+xla sweep``: the same with unguarded (masked) sweeps.
* ``pc+xla earliest``: the same with the default earliest-block-first ``switch_case`` dispatch.
* ``pc``: the program-counter runtime (earliest block) as a non-XLA ``tf.function`` graph.
* ``local_static``: Algorithm 1, eager, masked (runs on a prefix of the batch: its cost per step
  does not depend on the batch size, but is long).
* ``python``: the unbatched Python function, eagerly, one member at a time (sampled members).
* ``tfp_ab+xla`` / ``tfp_ab``: ``tfp.experimental.auto_batching`` (its own front end and type
  annotations) under ``tf.function(jit_compile=True)`` / ``tf.function``.  TFP's front end has
  no loops, so its Collatz is the tail-recursive formulation.

Run: ``.venv/bin/python -m benchmarks [--quick] autobatch_programs``.
"""
from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

from benchmarks.harness import Report, time_fn
from tfx_vec import autobatch as ab

OURS = "pc+xla"
_MIN_SAMPLE_S = 5e-3


@ab.function(max_stack_depth=24)
def fib(n):
    if n <= 1:
        return tf.ones_like(n)
    return fib(n - 2) + fib(n - 1)


@ab.function
def collatz(n):
    steps = tf.zeros_like(n)
    while n > 1:
        if n % 2 == 0:
            n = n // 2
        else:
            n = 3 * n + 1
        steps += 1
    return steps


def _tfp_programs():
    from tensorflow_probability.python.experimental import auto_batching as tab
    from tensorflow_probability.python.experimental.auto_batching import instructions

    def int_type(_):  # the dtype ours runs at (int64 costs TFP ~20% on Collatz)
        return instructions.TensorType(np.int32, ())

    fib_ctx, collatz_ctx = tab.Context(), tab.Context()

    @fib_ctx.batch(type_inference=int_type)
    def tfp_fib(n):
        if n <= 1:
            return 1
        else:
            left = tfp_fib(n - 2)
            right = tfp_fib(n - 1)
            return left + right

    @collatz_ctx.batch(type_inference=int_type)
    def tfp_collatz(n, steps):
        if n <= 1:
            return steps
        else:
            if n % 2 == 0:
                return tfp_collatz(n // 2, steps + 1)
            else:
                return tfp_collatz(3 * n + 1, steps + 1)

    return {"fib": lambda n, depth: tfp_fib(n, max_stack_depth=depth),
            "collatz": lambda n, depth: tfp_collatz(n, tf.zeros_like(n), max_stack_depth=depth)}


PROGRAMS = {
    # name: (ab.function, inputs for a batch size, TFP stack depth)
    "fib": (fib, lambda rng, b: rng.integers(0, 14, size=b), 24),
    "collatz": (collatz, lambda rng, b: rng.integers(1, 100, size=b), 130),
}


def _python_rate(fn, x: np.ndarray, sample: int) -> float:
    xs = x[:sample]
    t0 = time.perf_counter()
    for v in xs:
        fn.unbatched(tf.constant(v))
    return len(xs) / (time.perf_counter() - t0)


def run(quick: bool) -> Report:
    sizes = [16, 1024] if quick else [1, 16, 256, 1024, 4096]
    repeats = 5 if quick else 9
    report = Report("autobatch_programs", unit="members/s", ours=OURS, higher_is_better=True,
                    notes="members/s = batch size / best seconds per batched call over "
                          "interleaved rounds (ours and the peers timed in turn each round, "
                          "in a new random order, 10 ms apart; a sample is >= 5 ms of calls; "
                          "TFP runs int32 like ours); "
                          "python = unbatched eager loop on a sample of members; local_static "
                          "on the first 64 members at most, timed once.")
    tfp = _tfp_programs()
    rng = np.random.default_rng(0)
    for name, (fn, make, depth) in PROGRAMS.items():
        x_all = make(rng, max(sizes)).astype(np.int32)
        ref = np.stack([np.asarray(fn.unbatched(tf.constant(v))) for v in x_all[:32]])
        for b in sizes:
            case = f"{name} b={b}"
            x = tf.constant(x_all[:b])
            tfp_graph = tf.function(lambda a: tfp[name](a, depth), autograph=False)
            tfp_xla = tf.function(lambda a: tfp[name](a, depth), autograph=False,
                                  jit_compile=True)
            fns = {
                OURS: lambda: fn(x, jit_compile=True, scheduler="sweep_guarded"),
                "pc+xla sweep": lambda: fn(x, jit_compile=True, scheduler="sweep"),
                "pc+xla earliest": lambda: fn(x, jit_compile=True),
                "pc": lambda: fn(x),
                "tfp_ab+xla": lambda: tfp_xla(x),
                "tfp_ab": lambda: tfp_graph(x),
            }
            for impl, f in fns.items():
                np.testing.assert_array_equal(np.asarray(f())[:32], ref[:b], err_msg=impl)
            # sub-millisecond calls: several per sample, so one scheduler hiccup is not a sample
            once = time_fn(fns[OURS], repeats=1, warmup=0).median
            report.measure_interleaved(case, fns, items=b, rounds=repeats, statistic="min",
                                       inner=max(1, min(20, round(_MIN_SAMPLE_S / once))))
            small = x[:min(b, 64)]
            report.measure(case, "local_static",
                           lambda: fn(small, runtime="local_static"),
                           items=int(small.shape[0]), repeats=1, warmup=0)
            report.add(case, "python", _python_rate(fn, x_all[:b], 4 if quick else 16))
    return report
