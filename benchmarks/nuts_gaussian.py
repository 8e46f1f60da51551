"""NUTS gradients per second on a 100-d correlated Gaussian, against TFP's NUTS under XLA.

Here the gradient is cheap (a [B, 100] x
[100, 100] matmul), so control overhead and synchronization waste decide, unlike on the
logistic regression of ``nuts_logistic`` (where the gradient dominates).

Target: the log-spaced correlated Gaussian of ``nuts_utilization`` (step size 0.8 x the smallest
sd, maximum tree depth 10); chains start at exact draws.  Every implementation runs one
XLA-compiled ``one_step`` from the same state with the same seed on every call, so each call
does the same work: throughput = gradients the chains needed in one call (``leapfrogs_taken``,
excluding synchronization waste) / seconds per call, the calls timed round-robin in one process.

* ``tfx_vec pc+xla``: tfx_vec NUTS, program-counter runtime, one trajectory per step
  (``sweep``: with ``scheduler="sweep_guarded"``).
* ``tfx_vec pc+xla T=10``: ten trajectories per step (synchronizing on gradients, not on
  trajectory boundaries; the kernel returns the state after the tenth).
* ``tfx_vec pc+xla T=10 sweep``: the same with ``scheduler="sweep_guarded"``.
* ``tfp nuts+xla``: TFP's hand-written iterative ``tfp.mcmc.NoUTurnSampler`` under XLA.

Then the ``chained steps`` rows: the chains move, as in ``tfp.mcmc.sample_chain`` — each call
starts from the previous call's state with a new seed, so each call's work differs; throughput
= gradients of the trajectories returned over ``CHAINED_STEPS`` warm steps / their seconds,
median over interleaved rounds.  These rows add ``run_ahead=True`` (a step pauses the batch once
every chain has its trajectory and the next step resumes it), which the repeated-step rows
cannot show.

Run: ``.venv/bin/python -m benchmarks [--quick] nuts_gaussian``.
"""
from __future__ import annotations

import statistics
from typing import Callable

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from benchmarks.harness import Report
from benchmarks.nuts_logistic import IMPLS as STEP_MAKERS
from benchmarks.nuts_logistic import warm_throughput
from benchmarks.nuts_utilization import log_spaced_problem, target_without_counter
from tfx_vec.autobatch.nuts import NoUTurnSampler

OURS = "tfx_vec pc+xla"
SEED = (17, 3)


def _ours(trajectories: int, scheduler: str = "earliest") -> Callable:
    def make(target, step_size):
        kernel = NoUTurnSampler(target, step_size=step_size, max_tree_depth=10,
                                num_trajectories_per_step=trajectories, scheduler=scheduler)
        return kernel, tf.function(kernel.one_step, jit_compile=True)
    return make


def _tfp_nuts(target, step_size):
    kernel = tfp.mcmc.NoUTurnSampler(target, step_size=step_size, max_tree_depth=10)
    return kernel, tf.function(kernel.one_step, jit_compile=True)


IMPLS = {
    OURS: _ours(1),
    "tfx_vec pc+xla sweep": _ours(1, "sweep_guarded"),
    "tfx_vec pc+xla T=10": _ours(10),
    "tfx_vec pc+xla T=10 sweep": _ours(10, "sweep_guarded"),
    "tfp nuts+xla": _tfp_nuts,
}


CHAINED_STEPS = 4
# nuts_logistic's step makers (same names there): steps that carry state from call to call.
CHAINED = {impl: STEP_MAKERS[impl]
           for impl in (OURS, "tfx_vec pc+xla run_ahead", "tfp nuts+xla")}


def chained_steps(report: Report, problem, target, batch: int, rounds: int) -> None:
    """Rows ``batch=B, chained steps``: consecutive steps from exact draws, see the module doc."""
    x0 = tf.constant(problem.draw(batch))
    made = {impl: make(target, problem.step_size, runtime, jit)
            for impl, (make, runtime, jit) in CHAINED.items()}
    rates = {impl: [] for impl in made}
    for _ in range(rounds):
        for impl, (bootstrap, step, count) in made.items():
            rates[impl].append(warm_throughput(step, x0, bootstrap(x0), CHAINED_STEPS,
                                               count)[1])
    case = f"batch={batch}, {CHAINED_STEPS} chained steps"
    for impl, r in rates.items():
        report.add(case, impl, statistics.median(r), lo=min(r), hi=max(r))
        print(f"  {case} {impl:26s} {statistics.median(r):12.0f} grads/s", flush=True)


def run(quick: bool) -> Report:
    problem = log_spaced_problem()
    target = lambda x: target_without_counter(problem.precision, x)
    report = Report("nuts_gaussian", unit="grads/s", ours=OURS, higher_is_better=True,
                    notes=(f"100-d correlated Gaussian ({problem.name}), step size "
                           f"{problem.step_size:.3f}, max tree depth 10, chains at exact draws; "
                           "grads/s = gradients the chains needed in one XLA-compiled one_step "
                           "/ its median seconds over interleaved rounds; CPU."))
    for b in [100] if quick else [10, 100, 1000]:
        x0 = tf.constant(problem.draw(b))
        calls, grads = {}, {}
        for impl, make in IMPLS.items():
            kernel, step = make(target, problem.step_size)
            results = kernel.bootstrap_results(x0)
            seed = tf.constant(SEED)
            call = (lambda step=step, results=results, seed=seed:
                    step(x0, results, seed=seed)[1].leapfrogs_taken)
            # Both kernels count per call from these bootstrap results: every call repeats the
            # same trajectories, so the gradient count of one call is that of every call.
            grads[impl] = int(np.sum(call()))
            calls[impl] = call
        timings = Report("scratch", unit="s").measure_interleaved(
            f"batch={b}", calls, rounds=3 if quick else 7)
        for impl, t in timings.items():
            rate = grads[impl] / t.median
            report.add(f"batch={b}", impl, rate, lo=grads[impl] / t.max,
                       hi=grads[impl] / t.min, gradients_per_call=grads[impl],
                       seconds_per_call=t.median)
            print(f"  batch={b:5d} {impl:26s} {rate:12.0f} grads/s ({grads[impl]} gradients in "
                  f"{t.median * 1e3:.1f} ms)", flush=True)
    for b in [100] if quick else [100, 1000]:
        chained_steps(report, problem, target, b, rounds=2 if quick else 3)
    return report
