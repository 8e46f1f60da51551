"""Paper Figure 7: batch gradient utilization of autobatched NUTS on a 100-d correlated Gaussian.

Utilization = gradients the chains needed / (batched gradient evaluations x batch size).  A
counter in the target counts batched evaluations (each evaluates every member, masked or not);
``leapfrogs_taken`` counts the gradients each chain needed.  Local static runs one trajectory
per call (it synchronizes on trajectory boundaries, and its Python recursion cannot batch
members at different recursion points); the program-counter runtime runs T trajectories in one
call (``num_trajectories_per_step=T``) and so batches the 5th gradient of one chain's 3rd
trajectory with the 8th of another's 2nd.  Both start from exact draws of the target.

Each row also records the *ceiling* of its schedule: a chain cannot take more gradients than it
needs, so a call costs at least as many batched gradients as its longest chain needs, and
utilization is at most (gradients needed) / (batch x sum over calls of the longest chain's
need).  The earliest-block program counter reaches it exactly (its gradient block runs only when
every unfinished chain waits there); only more trajectories per call raise it.  The last rows
give that ceiling for T = 10 ... 100 trajectories per call from longer runs (100 trajectories
at batch 30, 50 at batch 1000; per-chain gradient counts of blocks of 10 trajectories), and one
row measures a single call of 100 trajectories at batch 1000.

Run: ``.venv/bin/python -m benchmarks [--quick] nuts_utilization``.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from benchmarks.harness import Report
from tfx_vec.autobatch.nuts import NoUTurnSampler

DIM = 100


def correlated_gaussian(dim: int = DIM, seed: int = 0):
    """Covariance with eigenvalues log-spaced over two decades, random eigenvectors."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    eig = np.logspace(-2, 0, dim)
    cov = (q * eig) @ q.T
    return cov.astype(np.float32), np.linalg.inv(cov).astype(np.float32), rng


def _counting_target(prec: np.ndarray):
    calls = tf.Variable(0, dtype=tf.int64, trainable=False)
    prec_t = tf.constant(prec)

    def target(x):
        calls.assign_add(1)
        return -0.5 * tf.reduce_sum(tf.matmul(x, prec_t) * x, axis=-1)

    return target, calls


def measure(kernel: NoUTurnSampler, calls: tf.Variable, x0: tf.Tensor, trajectories: int,
            per_call: int, seed: int = 0) -> tuple[float, float, float | None]:
    """Utilization over ``trajectories`` trajectories, ``per_call`` of them per ``one_step``.

    Returns (utilization, ceiling, program-counter loop steps per batched gradient or None).
    The ceiling is what a schedule that never runs the gradient for fewer than all unfinished
    chains achieves: per call, every chain waits for the one needing the most gradients, so it
    is (sum of gradients needed) / (batch x sum over calls of the per-call maximum).
    """
    results = kernel.bootstrap_results(x0)
    state = x0
    calls.assign(0)
    needed = np.zeros(int(x0.shape[0]), np.int64)
    worst = 0
    steps = 0
    program = None
    for i in range(trajectories // per_call):
        state, results = kernel.one_step(state, results, seed=(seed, i))
        taken = results.leapfrogs_taken.numpy()
        worst += int((taken - needed).max())
        needed = taken
        if kernel.runtime == "program_counter":
            program = program or next(iter(kernel._programs.values()))
            steps += int(program.last_status.steps)
    batched = int(calls.numpy())
    per_grad = steps / batched if program is not None else None
    return (needed.sum() / (batched * needed.size), needed.sum() / (worst * needed.size),
            per_grad)


def run(quick: bool) -> Report:
    batches = [1, 10, 30] if quick else [1, 3, 10, 30, 100, 300, 1000]
    counts = [1, 10] if quick else [1, 2, 5, 10]
    cov, prec, rng = correlated_gaussian()
    target, calls = _counting_target(prec)
    step = 0.8 * float(np.sqrt(np.linalg.eigvalsh(cov).min()))  # 0.8 x the smallest sd
    base = NoUTurnSampler(target, step_size=step, max_tree_depth=10, runtime="local_static")
    report = Report("nuts_utilization", unit="utilization", ours=f"program_counter T={counts[-1]}",
                    higher_is_better=True,
                    notes=("Batch gradient utilization (1.0 = no member idles at a gradient). "
                           f"100-d correlated Gaussian, step size {step:.3f}, chains start at "
                           "exact draws; local static: 10 trajectories, one per call; program "
                           "counter: T trajectories in one call (eager graph; XLA does not "
                           "change the schedule). Each row's extra 'ceiling' is the best any "
                           "schedule synchronizing on these calls can do (sum needed / (batch x "
                           "sum of per-call maxima)); 'loop_steps_per_gradient' counts the "
                           "program counter's loop steps per batched gradient. Rows 'ceiling "
                           "over N trajectories': that ceiling for T trajectories per call, "
                           "from the per-chain gradient counts of a longer run."))
    chol = np.linalg.cholesky(cov)
    for b in batches:
        x0 = tf.constant((rng.normal(size=(b, DIM)) @ chol.T).astype(np.float32))
        case = f"batch={b}"
        u, ceiling, _ = measure(base, calls, x0, trajectories=counts[-1], per_call=1)
        report.add(case, "local_static", u, ceiling=ceiling)
        print(f"  {case:11s} local static utilization {u:.3f} (ceiling {ceiling:.3f})",
              flush=True)
        for t in counts:
            k = base.copy(runtime="program_counter", num_trajectories_per_step=t)
            u, ceiling, per_grad = measure(k, calls, x0, t, per_call=t)
            report.add(case, f"program_counter T={t}", u, ceiling=ceiling,
                       loop_steps_per_gradient=per_grad)
            print(f"  {case:11s} T={t:3d} utilization {u:.3f} (ceiling {ceiling:.3f}), "
                  f"{per_grad:.1f} loop steps per gradient", flush=True)
    # Measured, not derived: one call of many trajectories (the 86% at 1000 chains).
    for b, t in ({30: 20} if quick else {1000: 100}).items():
        x0 = tf.constant((rng.normal(size=(b, DIM)) @ chol.T).astype(np.float32))
        k = base.copy(runtime="program_counter", num_trajectories_per_step=t)
        u, ceiling, per_grad = measure(k, calls, x0, t, per_call=t)
        report.add(f"batch={b}, one call of {t} trajectories", f"program_counter T={t}", u,
                   ceiling=ceiling, loop_steps_per_gradient=per_grad)
        print(f"  batch={b:5d} T={t:3d} utilization {u:.3f} (ceiling {ceiling:.3f}), "
              f"{per_grad:.1f} loop steps per gradient", flush=True)
    # Longer runs: the ceiling for T trajectories per call, from the gradients each chain needs
    # in each block of 10 trajectories (the program counter meets its ceiling in every row
    # above); blocks run as XLA-compiled steps of 10 trajectories each.
    long_runs = {30: 20} if quick else {30: 100, 1000: 50}   # batch: trajectories
    plain = base.copy(target_log_prob_fn=lambda x: target_without_counter(prec, x),
                      runtime="program_counter", num_trajectories_per_step=10)
    for b, long in long_runs.items():
        x0 = tf.constant((rng.normal(size=(b, DIM)) @ chol.T).astype(np.float32))
        needs = per_call_gradients(plain, x0, long // 10)                # [blocks, chains]
        for t in (10, 20, 50, 100):
            if long % t:
                continue
            calls_of_t = needs.reshape(long // t, t // 10, b).sum(axis=1)  # [calls, chains]
            ceiling = calls_of_t.sum() / (b * calls_of_t.max(axis=1).sum())
            report.add(f"batch={b}, ceiling over {long} trajectories", f"program_counter T={t}",
                       ceiling)
            print(f"  batch={b:5d} T={t:3d} ceiling {ceiling:.3f} ({long} trajectories)",
                  flush=True)
    return report


def target_without_counter(prec: np.ndarray, x: tf.Tensor) -> tf.Tensor:
    return -0.5 * tf.reduce_sum(tf.matmul(x, tf.constant(prec)) * x, axis=-1)


def per_call_gradients(kernel: NoUTurnSampler, x0: tf.Tensor, calls: int,
                       seed: int = 1) -> np.ndarray:
    """Gradients each chain needs in each of ``calls`` XLA-compiled steps, ``[calls, chains]``."""
    step = tf.function(kernel.one_step, jit_compile=True)
    state, results = x0, kernel.bootstrap_results(x0)
    rows, before = [], np.zeros(int(x0.shape[0]), np.int64)
    for i in range(calls):
        state, results = step(state, results, seed=tf.constant([seed, i]))
        taken = results.leapfrogs_taken.numpy()
        rows.append(taken - before)
        before = taken
    return np.stack(rows)
