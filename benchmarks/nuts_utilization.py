"""Paper Figure 7: batch gradient utilization of autobatched NUTS on 100-d correlated Gaussians.

Utilization = gradients the chains needed / (batched gradient evaluations x batch size).  A
counter in the target counts batched evaluations (each evaluates every member, masked or not);
``total_leapfrogs_taken`` counts the gradients each chain needed.  Local static runs one trajectory
per call (it synchronizes on trajectory boundaries, and its Python recursion cannot batch
members at different recursion points); the program-counter runtime runs T trajectories in one
call (``num_trajectories_per_step=T``) and so batches the 5th gradient of one chain's 3rd
trajectory with the 8th of another's 2nd.  Both start from exact draws of the target.

Two targets: ours (covariance eigenvalues log-spaced over two decades) and the NUTS paper's
(precision drawn from a Wishart, as in TFP's own utilization tests of its autobatched NUTS; the
autobatching paper does not say which correlated Gaussian its Figure 7 used).  How much a
schedule can recover depends on how much the chains' trajectory lengths spread, so the second
target checks that the first is not an easy (or a hard) case.

Each row also records the *ceiling* of its schedule: a chain cannot take more gradients than it
needs, so a call costs at least as many batched gradients as its longest chain needs, and
utilization is at most (gradients needed) / (batch x sum over calls of the longest chain's
need).  The earliest-block program counter reaches it exactly (its gradient block runs only when
every unfinished chain waits there); only more trajectories per call raise it.  The 'ceiling
over N trajectories' rows give that ceiling for T = 1 (local static's) and T = 10 ... 100 from
the per-chain, per-trajectory gradient counts of longer runs (our target: 100 trajectories at
batch 30, 50 at batch 1000; the paper's: 200 at batch 30): the two runtimes' utilizations over
many calls, on the same trajectories, with far less noise than one call of 30 chains.  One row
measures a single call of 100 trajectories at batch 1000 (our target).  The last rows measure
``run_ahead=True`` (chains never wait at a step's end) over many steps, against the same steps
without it.

Run: ``.venv/bin/python -m benchmarks [--quick] nuts_utilization``.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from benchmarks.harness import Report
from tfx_vec.autobatch.nuts import NoUTurnSampler

DIM = 100


class Problem(NamedTuple):
    """A 100-d zero-mean Gaussian target: its precision, exact draws, and NUTS' step size."""
    name: str
    precision: np.ndarray
    draw: Callable[[int], np.ndarray]   # batch -> [batch, DIM] exact draws
    step_size: float
    how: str                            # how the step size was chosen


def correlated_gaussian(dim: int = DIM, seed: int = 0):
    """Covariance with eigenvalues log-spaced over two decades, random eigenvectors."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    eig = np.logspace(-2, 0, dim)
    cov = (q * eig) @ q.T
    return cov.astype(np.float32), np.linalg.inv(cov).astype(np.float32), rng


def log_spaced_problem(seed: int = 0) -> Problem:
    """Ours: covariance eigenvalues log-spaced over two decades; step 0.8 x the smallest sd."""
    cov, prec, rng = correlated_gaussian(seed=seed)
    chol = np.linalg.cholesky(cov)
    step = 0.8 * float(np.sqrt(np.linalg.eigvalsh(cov).min()))
    return Problem("log-spaced covariance", prec,
                   lambda b: (rng.normal(size=(b, DIM)) @ chol.T).astype(np.float32), step,
                   "0.8 x the smallest sd")


def nuts_paper_problem(quick: bool, seed: int = 0) -> Problem:
    """The NUTS paper's correlated Gaussian (Hoffman & Gelman 2014, section 4.1, there 250-d):
    precision drawn from Wishart(DIM degrees of freedom, identity), about 200x between the
    smallest and largest sd; TFP's own autobatched-NUTS utilization tests use this target.
    The step size comes from TFP's dual averaging (its default 0.75 target acceptance)."""
    rng = np.random.default_rng(seed)
    g = rng.normal(size=(DIM, DIM))
    prec = (g.T @ g).astype(np.float32)
    chol_prec = np.linalg.cholesky(prec.astype(np.float64))

    def draw(b: int) -> np.ndarray:   # x = L^-T z has covariance (L L^T)^-1
        return np.linalg.solve(chol_prec.T, rng.normal(size=(DIM, b))).T.astype(np.float32)
    step = tuned_step_size(prec, draw(64), adaptation_steps=60 if quick else 150)
    return Problem("NUTS paper's (Wishart precision)", prec, draw, step,
                   "dual averaging, target acceptance 0.75")


def tuned_step_size(prec: np.ndarray, x0: np.ndarray, adaptation_steps: int) -> float:
    """The median over chains of the step size TFP's dual averaging settles on."""
    sd_min = float(1 / np.sqrt(np.linalg.eigvalsh(prec.astype(np.float64)).max()))
    kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
        NoUTurnSampler(lambda x: target_without_counter(prec, x),
                       step_size=tf.fill([x0.shape[0], 1], sd_min), max_tree_depth=10),
        num_adaptation_steps=adaptation_steps, target_accept_prob=0.75)
    step = tf.function(lambda x: tfp.mcmc.sample_chain(
        adaptation_steps, x, kernel=kernel, seed=[7, 7],
        trace_fn=lambda _, r: r.new_step_size), jit_compile=True)
    _, sizes = step(tf.constant(x0))
    return float(np.median(sizes[-1].numpy()))


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
        taken = results.total_leapfrogs_taken.numpy()
        worst += int((taken - needed).max())
        needed = taken
        if kernel.runtime == "program_counter":
            program = program or next(iter(kernel._programs.values()))
            steps += int(program.last_status.steps)
    batched = int(calls.numpy())
    per_grad = steps / batched if program is not None else None
    return (needed.sum() / (batched * needed.size), needed.sum() / (worst * needed.size),
            per_grad)


class UtilizationReport(Report):
    """Plots like the paper's Figure 7: utilization against batch size, one line per runtime
    setting, one panel per target (the ``{prefix}batch=B`` rows)."""
    PANELS = {"ours (log-spaced covariance)": "", "NUTS paper's (Wishart precision)":
              "paper MVN, "}

    def plot(self, path: Path) -> Path | None:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        fig, axes = plt.subplots(1, len(self.PANELS), figsize=(11, 4), sharey=True)
        color = {impl: f"C{k}" for k, impl in enumerate(self.impls())}
        for ax, (title, prefix) in zip(axes, self.PANELS.items()):
            rows = [r for r in self.rows if re.fullmatch(rf"{re.escape(prefix)}batch=\d+", r.case)]
            for impl in dict.fromkeys(r.impl for r in rows):
                points = sorted((int(r.case.rsplit("=", 1)[1]), r.value)
                                for r in rows if r.impl == impl)
                ax.plot(*zip(*points), marker="o", color=color[impl],
                        label=impl.replace("program_counter", "program counter"))
            ax.set_xscale("log")
            ax.set_xlabel("batch size (chains)")
            ax.set_title(title, fontsize=10)
            ax.legend(fontsize=7)
        axes[0].set_ylabel("batch gradient utilization")
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        return path


def run(quick: bool) -> Report:
    ours = log_spaced_problem()
    report = UtilizationReport("nuts_utilization", unit="utilization", ours="program_counter T=10",
                    higher_is_better=True,
                    notes=("Batch gradient utilization (1.0 = no member idles at a gradient) "
                           "on two 100-d correlated Gaussians, chains starting at exact draws: "
                           f"'batch=B' rows: {ours.name}, step size {ours.step_size:.3f} "
                           f"({ours.how}); 'paper MVN, batch=B' rows: the NUTS paper's target "
                           "(precision ~ Wishart(100, I)), step size from TFP's dual averaging. "
                           "Local static: 10 trajectories, one per call; program counter: T "
                           "trajectories in one call (eager graph; XLA does not change the "
                           "schedule). Each row's extra 'ceiling' is the best any schedule "
                           "synchronizing on these calls can do (sum needed / (batch x sum of "
                           "per-call maxima)); 'loop_steps_per_gradient' counts the program "
                           "counter's loop steps per batched gradient. Rows 'ceiling over N "
                           "trajectories': that ceiling for T trajectories per call, from the "
                           "per-chain gradient counts of a longer run."))
    sweep(report, ours, "", [1, 10, 30] if quick else [1, 3, 10, 30, 100, 300, 1000],
          [1, 10] if quick else [1, 2, 5, 10])
    # Measured, not derived: one call of many trajectories (the paper's 86% at 1000 chains).
    for b, t in ({30: 20} if quick else {1000: 100}).items():
        sweep(report, ours, f"one call of {t} trajectories, ", [b], [t], local_static=False)
    ceilings(report, ours, "", {30: 20} if quick else {30: 100, 1000: 50})
    # Past the ceilings: run_ahead (chains never wait at a step's end; measured over many steps)
    for b, t, steps in ([(30, 10, 3)] if quick else [(30, 10, 20), (1000, 1, 30), (1000, 10, 5)]):
        u, plain = run_ahead_utilization(ours, b, t, steps)
        case = f"batch={b}, {steps} steps of {t} trajectories"
        report.add(case, f"program_counter T={t}", plain)
        report.add(case, f"program_counter T={t} run_ahead", u)
        print(f"  {case}: run_ahead {u:.3f}, without {plain:.3f}", flush=True)
    paper = nuts_paper_problem(quick)
    print(f"  paper MVN: step size {paper.step_size:.4f} ({paper.how})", flush=True)
    report.notes += f" Paper MVN step size: {paper.step_size:.4f}."
    sweep(report, paper, "paper MVN, ", [1, 30] if quick else [1, 10, 30, 100], [1, 10])
    ceilings(report, paper, "paper MVN, ", {30: 20} if quick else {30: 200})
    return report


def sweep(report: Report, problem: Problem, prefix: str, batches: list[int], counts: list[int],
          local_static: bool = True) -> None:
    """Rows ``{prefix}batch=B``: local static over ``counts[-1]`` trajectories one per call,
    and the program counter with T trajectories in one call for each T in ``counts``."""
    target, calls = _counting_target(problem.precision)
    base = NoUTurnSampler(target, step_size=problem.step_size, max_tree_depth=10,
                          runtime="local_static")
    for b in batches:
        x0 = tf.constant(problem.draw(b))
        case = f"{prefix}batch={b}"
        if local_static:
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


def ceilings(report: Report, problem: Problem, prefix: str, long_runs: dict[int, int]) -> None:
    """Longer runs (``{batch: trajectories}``), one trajectory per XLA-compiled step: from the
    gradients each chain needs in each trajectory, the ceiling of synchronizing every T
    trajectories, for T = 1 (local static's schedule) and T = 10 ... 100 (the program
    counter's).  Both runtimes meet their ceilings exactly (every row of :func:`sweep`), so
    these are their utilizations over many calls, on the same trajectories."""
    plain = NoUTurnSampler(lambda x: target_without_counter(problem.precision, x),
                           step_size=problem.step_size, max_tree_depth=10,
                           runtime="program_counter")
    for b, long in long_runs.items():
        needs = per_call_gradients(plain, tf.constant(problem.draw(b)), long)  # [long, b]
        for t in (1, 10, 20, 50, 100):
            if long % t:
                continue
            calls_of_t = needs.reshape(long // t, t, b).sum(axis=1)  # [calls, chains]
            ceiling = calls_of_t.sum() / (b * calls_of_t.max(axis=1).sum())
            report.add(f"{prefix}batch={b}, ceiling over {long} trajectories",
                       "local_static" if t == 1 else f"program_counter T={t}", ceiling)
            print(f"  {prefix}batch={b:5d} T={t:3d} ceiling {ceiling:.3f} ({long} trajectories)",
                  flush=True)


def run_ahead_utilization(problem: Problem, batch: int, trajectories: int,
                          steps: int) -> tuple[float, float]:
    """Utilization over ``steps`` steps from exact draws, with and without ``run_ahead``:
    gradients of the trajectories the steps returned / (batched evaluations x batch).  Work
    a run-ahead step has done past its returned state is not counted (conservative)."""
    target, calls = _counting_target(problem.precision)
    x0 = tf.constant(problem.draw(batch))
    out = []
    for run_ahead in (True, False):
        kernel = NoUTurnSampler(target, step_size=problem.step_size, max_tree_depth=10,
                                num_trajectories_per_step=trajectories, run_ahead=run_ahead)
        x, r = x0, kernel.bootstrap_results(x0)
        calls.assign(0)
        for i in range(steps):
            x, r = kernel.one_step(x, r, seed=(5, i))
        out.append(float(np.sum(r.total_leapfrogs_taken.numpy())) / (int(calls.numpy()) * batch))
    return out[0], out[1]


def target_without_counter(prec: np.ndarray, x: tf.Tensor) -> tf.Tensor:
    return -0.5 * tf.reduce_sum(tf.matmul(x, tf.constant(prec)) * x, axis=-1)


def per_call_gradients(kernel: NoUTurnSampler, x0: tf.Tensor, calls: int,
                       seed: int = 1) -> np.ndarray:
    """Gradients each chain needs in each of ``calls`` XLA-compiled steps, ``[calls, chains]``."""
    step = tf.function(kernel.one_step, jit_compile=True)
    state, results = x0, kernel.bootstrap_results(x0)
    rows = []
    for i in range(calls):
        state, results = step(state, results, seed=tf.constant([seed, i]))
        rows.append(results.leapfrogs_taken.numpy())
    return np.stack(rows)
