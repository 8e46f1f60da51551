"""Paper Figure 6: NUTS on Bayesian logistic regression, gradient evaluations per second.

Synthetic data: N points (10,000; 1,000 with ``--quick``), 100 regressors, float32, prior
N(0, 1).  Chains start at draws from the Laplace approximation of the posterior, so trajectory
lengths are those of the stationary regime.  Throughput = gradients the chains needed (sum of
``leapfrogs_taken``, i.e. excluding synchronization waste) / wall seconds of warm steps; the
first call (tracing, compilation) is reported separately as ``first_call_s`` in the JSON.

Implementations, same data and step size, one process:

* ``tfx_vec pc+xla`` (ours): tfx_vec NUTS, program-counter runtime, one XLA program per step.
* ``tfx_vec pc+xla T=5``: the same with ``num_trajectories_per_step=5`` (Figure 7: the batch
  synchronizes on gradients, not on trajectory boundaries).
* ``tfx_vec pc+xla T=5 sweep``: the same with ``scheduler="sweep_guarded"``.
* ``tfx_vec pc+xla [T=5] run_ahead``: ``run_ahead=True``: a step pauses the batch when every
  chain has its trajectories; chains that got there first have gone on, and the next step
  resumes them (only returned trajectories are counted).
* ``tfx_vec pc+xla T=20 run_ahead``: the same with 20 trajectories per step.
* ``tfx_vec local_static``: eager, recursion through Python.
* ``tfx_vec hybrid``: local static with each basic block compiled by XLA.
* ``unbatched eager``: the same Python NUTS run directly, one chain at a time.
* ``tfp autobatched``: ``tensorflow_probability.python.experimental.mcmc.nuts_autobatching``.
* ``tfp nuts+xla``: TFP's hand-written iterative ``tfp.mcmc.NoUTurnSampler`` under XLA.
* ``value+grad bound``: not a sampler: batch / seconds of one batched evaluation of the
  log-density *and* its gradient (NUTS needs both at every leapfrog), repeated in an XLA
  loop: what a sampler with utilization 1 and free control flow would reach where the
  target's cost dominates (large batches; at a few chains fusion across the sampler's own
  ops can beat it).

Then ESS per second (minimum over the 100 coordinates, all chains pooled) for ours and for
TFP's NUTS under XLA.

Run: ``.venv/bin/python -m benchmarks [--quick] nuts_logistic``.
"""
from __future__ import annotations

import functools
import time
from typing import Callable

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from benchmarks.harness import Report, time_fn
from tfx_vec.autobatch.nuts import NoUTurnSampler

DIM = 100
OURS = "tfx_vec pc+xla"


def logistic_problem(n: int, seed: int = 0):
    """Target log-density over ``[B, DIM]`` and a Laplace approximation (mean, Cholesky)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, DIM)).astype(np.float32)
    w_true = rng.normal(size=DIM).astype(np.float32) * 0.3
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-x @ w_true))).astype(np.float32)
    xt, yt = tf.constant(x.T), tf.constant(y)

    def target(w):
        logits = tf.matmul(w, xt)                                   # [B, N]
        return (tf.reduce_sum(yt * logits - tf.nn.softplus(logits), axis=-1)
                - 0.5 * tf.reduce_sum(w * w, axis=-1))

    w = np.zeros(DIM)
    for _ in range(20):  # Newton's method for the mode
        p = 1 / (1 + np.exp(-x @ w))
        hess = (x.T * (p * (1 - p))) @ x + np.eye(DIM)
        w = w + np.linalg.solve(hess, x.T @ (y - p) - w)
    chol = np.linalg.cholesky(np.linalg.inv(hess))
    return target, w.astype(np.float32), chol.astype(np.float32), rng


def warm_throughput(step: Callable, state, results, steps: int, grads: Callable):
    """(first call seconds, gradients per second over ``steps`` warm steps)."""
    t0 = time.perf_counter()
    state, results = step(state, results, 0)
    np.asarray(results.leapfrogs_taken)
    first = time.perf_counter() - t0
    total = 0
    t0 = time.perf_counter()
    for i in range(steps):
        prev = results
        state, results = step(state, results, i + 1)
        total += grads(prev, results)
    return first, total / (time.perf_counter() - t0)


def _per_step(prev, new) -> int:
    return int(np.sum(new.leapfrogs_taken))


def _ours(target, step_size, runtime, jit, trajectories=1, scheduler="earliest",
          run_ahead=False):
    kernel = NoUTurnSampler(target, step_size=step_size, runtime=runtime,
                            num_trajectories_per_step=trajectories, scheduler=scheduler,
                            run_ahead=run_ahead)
    one = kernel.one_step
    if jit:
        one = tf.function(one, jit_compile=True)
    step = lambda s, r, i: one(s, r, seed=tf.constant([17, i]))
    return kernel.bootstrap_results, step, _per_step


def _tfp_nuts(target, step_size, runtime, jit):
    kernel = tfp.mcmc.NoUTurnSampler(target, step_size=step_size)
    one = tf.function(lambda s, r, seed: kernel.one_step(s, r, seed=seed), jit_compile=True)
    step = lambda s, r, i: one(s, r, tf.constant([17, i]))
    return kernel.bootstrap_results, step, _per_step


def _tfp_autobatched(target, step_size, runtime, jit):
    from tensorflow_probability.python.experimental.mcmc import nuts_autobatching
    kernel = nuts_autobatching.NoUTurnSampler(target, step_size=step_size, seed=17)
    step = lambda s, r, i: kernel.one_step(s, r)
    return kernel.bootstrap_results, step, _per_step


def _value_and_gradient_bound(target, init: tf.Tensor, repeats: int = 3) -> float:
    """Gradients per second of batched log-density-and-gradient evaluations in one XLA loop
    (best of ``repeats``), each feeding the next so that none is elided.  Small batches get
    more iterations so that the call itself costs next to nothing."""
    iters = max(10, 2048 // int(init.shape[0]))

    @tf.function(jit_compile=True)
    def loop(x):
        def body(i, x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                lp = target(x)
            return i + 1, x + 1e-6 * tape.gradient(lp, x) + 1e-9 * lp[:, None]
        return tf.while_loop(lambda i, _: i < iters, body, (0, x))[1]

    best = time_fn(lambda: loop(init), repeats=repeats, warmup=1).min
    return int(init.shape[0]) * iters / best


IMPLS = {
    OURS: (_ours, "program_counter", True),
    # Figure 7's setting: 5 trajectories per step, batched across trajectory boundaries.
    "tfx_vec pc+xla T=5": (functools.partial(_ours, trajectories=5), "program_counter", True),
    # ... and the sweep_guarded block scheduler (fewer loop steps than earliest-block).
    "tfx_vec pc+xla T=5 sweep": (functools.partial(_ours, trajectories=5,
                                                   scheduler="sweep_guarded"),
                                 "program_counter", True),
    # ... and chains that finish early going on with the next step's trajectories.
    "tfx_vec pc+xla run_ahead": (functools.partial(_ours, run_ahead=True), "program_counter",
                                 True),
    "tfx_vec pc+xla T=5 run_ahead": (functools.partial(_ours, trajectories=5, run_ahead=True),
                                     "program_counter", True),
    "tfx_vec pc+xla T=20 run_ahead": (functools.partial(_ours, trajectories=20,
                                                        run_ahead=True),
                                      "program_counter", True),
    "tfx_vec local_static": (_ours, "local_static", False),
    "tfx_vec hybrid": (_ours, "hybrid", False),
    "unbatched eager": (_ours, "python", False),
    "tfp autobatched": (_tfp_autobatched, None, False),
    "tfp nuts+xla": (_tfp_nuts, None, True),
}


def _ess_per_second(make, target, step_size, runtime, jit, init, draws: int) -> tuple[float, float]:
    bootstrap, step, _ = make(target, step_size, runtime, jit)
    state, results = init, bootstrap(init)
    state, results = step(state, results, 0)          # warm (compiles)
    samples = []
    t0 = time.perf_counter()
    for i in range(draws):
        state, results = step(state, results, i + 1)
        samples.append(state)
    seconds = time.perf_counter() - t0
    ess = tfp.mcmc.effective_sample_size(tf.stack(samples), cross_chain_dims=1)
    return float(tf.reduce_min(ess)) / seconds, seconds


def run(quick: bool) -> Report:
    n = 1_000 if quick else 10_000
    batches = [1, 16, 128] if quick else [1, 16, 128, 1024]
    steps = lambda b: 1 if quick else 2  # timed warm steps per batch size
    # Peers too slow to run at every batch size are limited (their cost grows with the batch).
    max_batch = {"unbatched eager": 1 if quick else 16, "tfp autobatched": 128 if quick else 1024}
    target, mode, chol, rng = logistic_problem(n)
    step_size = float(0.5 * np.min(np.linalg.norm(chol, axis=1)) ** 1)  # ~0.5 x smallest sd
    report = Report("nuts_logistic", unit="grads/s", ours=OURS, higher_is_better=True,
                    notes=(f"Bayesian logistic regression, N={n}, D={DIM}, float32, step size "
                           f"{step_size:.4f}, max tree depth 10, {steps(1)} warm step(s) timed; "
                           "grads/s = gradients the chains needed / wall s; the ESS/s rows are "
                           "effective samples per second (min over coordinates); CPU."))
    for b in batches:
        init = tf.constant(mode + rng.normal(size=(b, DIM)).astype(np.float32) @ chol.T)
        for impl, (make, runtime, jit) in IMPLS.items():
            if b > max_batch.get(impl, b):
                continue
            bootstrap, step, leapfrogs = make(target, step_size, runtime, jit)
            first, rate = warm_throughput(step, init, bootstrap(init), steps(b), leapfrogs)
            report.add(f"batch={b}", impl, rate, first_call_s=first)
            print(f"  batch={b:5d} {impl:22s} {rate:12.1f} grads/s  first call {first:7.2f} s",
                  flush=True)
        bound = _value_and_gradient_bound(target, init)
        report.add(f"batch={b}", "value+grad bound", bound)
        print(f"  batch={b:5d} {'value+grad bound':22s} {bound:12.1f} grads/s", flush=True)
    chains, draws = (16, 20) if quick else (64, 100)
    init = tf.constant(mode + rng.normal(size=(chains, DIM)).astype(np.float32) @ chol.T)
    for impl, thin in ((OURS, 1), ("tfx_vec pc+xla T=5", 5), ("tfx_vec pc+xla T=5 sweep", 5),
                       ("tfp nuts+xla", 1)):
        make, runtime, jit = IMPLS[impl]  # T=5 keeps every 5th trajectory: same work per run
        rate, seconds = _ess_per_second(make, target, step_size, runtime, jit, init,
                                        draws // thin)
        report.add(f"ESS/s ({chains} chains x {draws} trajectories)", impl, rate,
                   seconds=seconds)
    return report
