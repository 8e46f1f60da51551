"""Paper Figure 7: batch gradient utilization of autobatched NUTS on a 100-d correlated Gaussian.

Utilization = gradients the chains needed / (batched gradient evaluations x batch size).  A
counter in the target counts batched evaluations (each evaluates every member, masked or not);
``leapfrogs_taken`` counts the gradients each chain needed.  Local static runs one trajectory
per call (it synchronizes on trajectory boundaries, and its Python recursion cannot batch
members at different recursion points); the program-counter runtime runs T trajectories in one
call (``num_trajectories_per_step=T``) and so batches the 5th gradient of one chain's 3rd
trajectory with the 8th of another's 2nd.  Both start from exact draws of the target.

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
            per_call: int, seed: int = 0) -> float:
    """Utilization over ``trajectories`` trajectories, ``per_call`` of them per ``one_step``."""
    results = kernel.bootstrap_results(x0)
    state = x0
    calls.assign(0)
    taken = 0
    for i in range(trajectories // per_call):
        state, results = kernel.one_step(state, results, seed=(seed, i))
    taken = int(tf.reduce_sum(results.leapfrogs_taken))
    return taken / (int(calls.numpy()) * int(x0.shape[0]))


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
                           "change the schedule)."))
    chol = np.linalg.cholesky(cov)
    for b in batches:
        x0 = tf.constant((rng.normal(size=(b, DIM)) @ chol.T).astype(np.float32))
        case = f"batch={b}"
        u = measure(base, calls, x0, trajectories=counts[-1], per_call=1)
        report.add(case, "local_static", u)
        for t in counts:
            k = base.copy(runtime="program_counter", num_trajectories_per_step=t)
            report.add(case, f"program_counter T={t}", measure(k, calls, x0, t, per_call=t))
    return report
