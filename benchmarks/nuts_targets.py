"""NUTS on several targets as users run it: ``tfp.mcmc.sample_chain`` under XLA, against TFP's
NUTS and BlackJAX.

Each target is a log-density over a batch of chains; every implementation runs
``NUM_STEPS`` NUTS steps of all chains in one compiled call (``tfp.mcmc.sample_chain`` inside
``tf.function(jit_compile=True)`` for both TensorFlow kernels; ``jax.jit`` of a ``lax.scan``
over ``jax.vmap(blackjax.nuts(...).step)`` for BlackJAX), from the same start with the same
seed on every call, so that every call does the same work.  Throughput = gradients the chains
needed (the sum over steps and chains of ``leapfrogs_taken``; BlackJAX's
``num_integration_steps``) / median seconds per call over interleaved rounds.  The first call
(trace, compile, run) is timed on its own, after a warm-up that pays the process's one-time
costs, and reported as ``first_call_s``.

Targets (float32, fixed step sizes so that every sampler does the same trajectories in law):

* ``gauss100 dense``: a 100-d Gaussian whose precision is a random Wishart-like matrix
  ``A A^T / 100 + 0.1 I`` (standard deviations 0.5 to 3.2), step 0.1, tree depth 8; 1000 and
  100 chains.
* ``gauss500 dense``: the same kind at 500 dimensions, 100 chains (the gradient dominates).
* ``gauss10 log-spaced``: a diagonal 10-d Gaussian with standard deviations 0.1 to 10, step
  0.08, tree depth 10, 1000 chains (long, unequal trajectories).
* ``logistic``: Bayesian logistic regression, 1000 points x 25 regressors, 256 chains.
* ``eight schools``: the non-centred eight schools model with three state parts (the mean and
  log scale are scalars per chain), 1000 chains, step 0.4.
* ``gauss100 dense, mass matrix``: the 100-d dense Gaussian with its covariance as the inverse
  mass matrix (a ``MultivariateNormalPrecisionFactorLinearOperator`` momentum for ours and for
  ``tfp.experimental.mcmc.PreconditionedNoUTurnSampler``; BlackJAX's ``inverse_mass_matrix``),
  step 0.3, 1000 chains.

Implementations: ``tfx_vec pc+xla`` (ours, the default ``NoUTurnSampler``), ``tfp nuts+xla``
(``tfp.mcmc.NoUTurnSampler``), ``blackjax`` (when JAX and BlackJAX are installed: optional
peers of the benchmarks, never dependencies of the package).

Run: ``.venv/bin/python -m benchmarks [--quick] nuts_targets``.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from benchmarks.harness import Report
from tfx_vec.autobatch.nuts import NoUTurnSampler

OURS = "tfx_vec pc+xla"
TFP = "tfp nuts+xla"
BLACKJAX = "blackjax"
NUM_STEPS = 5
SEED = (11, 5)


@dataclasses.dataclass
class Target:
    """One benchmark target: a TensorFlow log-density over batched state parts, the same
    density for one chain in JAX (built lazily, JAX being optional), start state, step size."""
    name: str
    log_prob: Callable[..., tf.Tensor]
    jax_log_prob: Callable[[], Callable]  # () -> log-density of one chain's list of parts
    init: list[np.ndarray]
    step_size: float
    max_tree_depth: int
    inverse_mass: np.ndarray | None = None  # a dense inverse mass matrix (None: identity)


def _dense_precision(dim: int, seed: int = 0) -> np.ndarray:
    a = np.random.default_rng(seed).normal(size=(dim, dim))
    return (a @ a.T / dim + 0.1 * np.eye(dim)).astype(np.float32)


def dense_gaussian(dim: int, chains: int, seed: int = 0) -> Target:
    """A ``dim``-d Gaussian with a random dense precision, step 0.1, tree depth 8; the chains
    start at exact draws."""
    precision = _dense_precision(dim, seed)
    rng = np.random.default_rng(seed + 100)
    chol_cov = np.linalg.cholesky(np.linalg.inv(precision))
    p = tf.constant(precision)

    def jax_log_prob():
        import jax.numpy as jnp
        pj = jnp.asarray(precision)
        return lambda x: -0.5 * jnp.dot(x, pj @ x)

    return Target(f"gauss{dim} dense, {chains} chains",
                  lambda x: -0.5 * tf.reduce_sum(x * tf.matmul(x, p), axis=-1), jax_log_prob,
                  [(rng.normal(size=(chains, dim)) @ chol_cov.T).astype(np.float32)], 0.1, 8)


def preconditioned_gaussian(dim: int, chains: int) -> Target:
    """The dense Gaussian with its covariance as the inverse mass matrix and a step size of
    0.3: in law, every sampler runs the identity-metric NUTS of a standard normal."""
    target = dense_gaussian(dim, chains)
    covariance = np.linalg.inv(_dense_precision(dim)).astype(np.float32)
    return dataclasses.replace(target, name=f"gauss{dim} dense, mass matrix, {chains} chains",
                               step_size=0.3, inverse_mass=covariance)


def log_spaced_gaussian(chains: int, seed: int = 1) -> Target:
    """A diagonal 10-d Gaussian with standard deviations 0.1 to 10, step 0.08, tree depth 10
    (long trajectories of unequal lengths); the chains start at exact draws."""
    rng = np.random.default_rng(seed)
    scale = np.logspace(-1, 1, 10).astype(np.float32)

    def jax_log_prob():
        import jax.numpy as jnp
        return lambda x: -0.5 * jnp.sum((x / scale) ** 2)

    return Target(f"gauss10 log-spaced, {chains} chains",
                  lambda x: -0.5 * tf.reduce_sum((x / scale) ** 2, axis=-1), jax_log_prob,
                  [(rng.normal(size=(chains, 10)) * scale).astype(np.float32)], 0.08, 10)


def logistic(chains: int, points: int = 1000, dim: int = 25, seed: int = 2) -> Target:
    """Bayesian logistic regression on ``points`` synthetic points of ``dim`` regressors,
    standard normal prior, step 0.05, tree depth 8."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(points, dim)).astype(np.float32)
    y = (rng.uniform(size=points) < 1 / (1 + np.exp(-x @ rng.normal(size=dim) * 0.5))
         ).astype(np.float32)
    xt, yt = tf.constant(x.T), tf.constant(y)

    def log_prob(w):
        logits = tf.matmul(w, xt)
        return (tf.reduce_sum(yt * logits - tf.nn.softplus(logits), axis=-1)
                - 0.5 * tf.reduce_sum(w * w, axis=-1))

    def jax_log_prob():
        import jax
        import jax.numpy as jnp
        xj, yj = jnp.asarray(x), jnp.asarray(y)

        def lp(w):
            logits = xj @ w
            return jnp.sum(yj * logits - jax.nn.softplus(logits)) - 0.5 * jnp.sum(w * w)
        return lp

    return Target(f"logistic {points}x{dim}, {chains} chains", log_prob, jax_log_prob,
                  [(rng.normal(size=(chains, dim)) * 0.1).astype(np.float32)], 0.05, 8)


_SCHOOLS_Y = np.array([28, 8, -3, 7, -1, 1, 18, 12], np.float32)
_SCHOOLS_SIGMA = np.array([15, 10, 16, 11, 9, 11, 10, 18], np.float32)


def eight_schools(chains: int, seed: int = 3) -> Target:
    """Non-centred: mu ~ N(0, 5), log tau ~ N(5, 1), theta_raw ~ N(0, 1),
    y ~ N(mu + exp(log tau) theta_raw, sigma)."""
    rng = np.random.default_rng(seed)

    def log_prob(mu, log_tau, theta):
        effect = mu[..., None] + tf.exp(log_tau)[..., None] * theta
        return (-0.5 * (mu / 5.0) ** 2 - 0.5 * (log_tau - 5.0) ** 2
                - 0.5 * tf.reduce_sum(theta ** 2, axis=-1)
                - 0.5 * tf.reduce_sum(((_SCHOOLS_Y - effect) / _SCHOOLS_SIGMA) ** 2, axis=-1))

    def jax_log_prob():
        import jax.numpy as jnp

        def lp(mu, log_tau, theta):
            effect = mu + jnp.exp(log_tau) * theta
            return (-0.5 * (mu / 5.0) ** 2 - 0.5 * (log_tau - 5.0) ** 2
                    - 0.5 * jnp.sum(theta ** 2)
                    - 0.5 * jnp.sum(((_SCHOOLS_Y - effect) / _SCHOOLS_SIGMA) ** 2))
        return lp

    init = [rng.normal(size=chains).astype(np.float32),
            (rng.normal(size=chains) * 0.5 + 1.0).astype(np.float32),
            rng.normal(size=(chains, 8)).astype(np.float32)]
    return Target(f"eight schools, {chains} chains", log_prob, jax_log_prob, init, 0.4, 8)


def targets(quick: bool) -> list[Target]:
    if quick:
        return [dense_gaussian(100, 100), eight_schools(100)]
    return [dense_gaussian(100, 1000), dense_gaussian(100, 100), dense_gaussian(500, 100),
            log_spaced_gaussian(1000), logistic(256), eight_schools(1000),
            preconditioned_gaussian(100, 1000)]


def _tf_sampler(kernel_class, preconditioned_class) -> Callable[[Target], Callable[[], Any]]:
    """A call running ``NUM_STEPS`` of ``kernel_class`` (``preconditioned_class`` for a target
    with a mass matrix) through ``sample_chain`` under XLA; it returns the per-step, per-chain
    leapfrog counts."""
    def make(target: Target) -> Callable[[], Any]:
        kwargs = {}
        if target.inverse_mass is not None:
            kernel_class_ = preconditioned_class
            # momentum ~ N(0, M), given by its precision M^-1 = inverse_mass, the form of
            # TFP's own windowed adaptation (as MultivariateNormalTriL, TFP's sampler was 20x
            # slower under XLA here, 544 gradients/s)
            factor = np.linalg.cholesky(target.inverse_mass).astype(np.float32)
            kwargs["momentum_distribution"] = (
                tfp.experimental.distributions.MultivariateNormalPrecisionFactorLinearOperator(
                    precision_factor=tf.linalg.LinearOperatorLowerTriangular(factor)))
        else:
            kernel_class_ = kernel_class
        kernel = kernel_class_(lambda *parts: target.log_prob(*parts),
                               step_size=target.step_size,
                               max_tree_depth=target.max_tree_depth, **kwargs)
        init = [tf.constant(p) for p in target.init]

        @tf.function(jit_compile=True)
        def sample(seed):
            return tfp.mcmc.sample_chain(NUM_STEPS, init, kernel=kernel,
                                         trace_fn=lambda _, r: r.leapfrogs_taken, seed=seed)[1]
        seed = tf.constant(SEED)
        return lambda: sample(seed)
    return make


def _blackjax_sampler(target: Target) -> Callable[[], Any]:
    import blackjax
    import jax
    import jax.numpy as jnp

    log_prob = target.jax_log_prob()
    logdensity = lambda parts: log_prob(*parts)
    dims = sum(int(np.prod(p.shape[1:])) for p in target.init)
    inverse_mass = (jnp.ones(dims, jnp.float32) if target.inverse_mass is None
                    else jnp.asarray(target.inverse_mass))
    nuts = blackjax.nuts(logdensity, target.step_size, inverse_mass_matrix=inverse_mass,
                         max_num_doublings=target.max_tree_depth)
    init = [jnp.asarray(p) for p in target.init]
    chains = target.init[0].shape[0]

    @jax.jit  # the start is an argument: as a constant, XLA would fold its first gradient
    def sample(init, key):
        states = jax.vmap(nuts.init)(init)

        def one_step(states, key):
            states, info = jax.vmap(nuts.step)(jax.random.split(key, chains), states)
            return states, info.num_integration_steps
        return jax.lax.scan(one_step, states, jax.random.split(key, NUM_STEPS))[1]

    key = jax.random.PRNGKey(SEED[0])
    return lambda: sample(init, key).block_until_ready()


def _blackjax_available() -> bool:
    try:
        import blackjax  # noqa: F401
        import jax  # noqa: F401
    except ImportError:
        return False
    return True


def _warm_up(jax_too: bool) -> None:
    """Pay the process's one-time costs (XLA's CPU client, LLVM's start-up) before any first
    call is timed: otherwise the first target's first call, ours as measured first, carries
    them alone."""
    tf.function(lambda x: x * 2.0 + 1.0, jit_compile=True)(tf.ones([4])).numpy()
    if jax_too:
        import jax
        jax.jit(lambda x: x * 2.0 + 1.0)(jax.numpy.ones(4)).block_until_ready()


def compare(name: str, target_list: list[Target], quick: bool, blackjax: bool) -> Report:
    """The ``name`` report: each target's first call and steady throughput for ours, TFP's NUTS
    and (where ``blackjax`` and installed) BlackJAX, timed in interleaved rounds."""
    makers = {OURS: _tf_sampler(NoUTurnSampler, NoUTurnSampler),
              TFP: _tf_sampler(tfp.mcmc.NoUTurnSampler,
                               tfp.experimental.mcmc.PreconditionedNoUTurnSampler)}
    notes = (f"{NUM_STEPS} NUTS steps per call, sample_chain under XLA"
             f"{' (jax.jit for BlackJAX)' if blackjax else ''}, same start and seed every call; "
             "grads/s = leapfrog steps the chains took / median seconds per call over "
             "interleaved rounds; first_call_s = trace + compile + run; CPU.")
    if blackjax and _blackjax_available():
        makers[BLACKJAX] = _blackjax_sampler
    elif blackjax:
        notes += "\nBlackJAX is not installed (`pip install blackjax`): its column is skipped."
    report = Report(name, unit="grads/s", ours=OURS, higher_is_better=True, notes=notes)
    _warm_up(BLACKJAX in makers)
    for target in target_list:
        calls, grads, first = {}, {}, {}
        for impl, make in makers.items():
            call = make(target)
            t0 = time.perf_counter()
            grads[impl] = int(np.sum(np.asarray(call())))
            first[impl] = time.perf_counter() - t0
            calls[impl] = call
        timings = Report("scratch", unit="s").measure_interleaved(
            target.name, calls, rounds=3 if quick else 5)
        for impl, t in timings.items():
            rate = grads[impl] / t.median
            report.add(target.name, impl, rate, lo=grads[impl] / t.max, hi=grads[impl] / t.min,
                       first_call_s=first[impl], gradients_per_call=grads[impl],
                       seconds_per_call=t.median)
            print(f"  {target.name:32s} {impl:16s} {rate:10.0f} grads/s ({grads[impl]} in "
                  f"{t.median:.3f} s), first call {first[impl]:.1f} s", flush=True)
    return report


def run(quick: bool) -> Report:
    return compare("nuts_targets", targets(quick), quick, blackjax=True)
