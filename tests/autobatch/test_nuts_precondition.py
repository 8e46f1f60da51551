"""NUTS with a momentum distribution (a mass matrix) and the windowed warm-up.

Exact checks: three leapfrog steps of our program, mapped back to the user's coordinates, are
the leapfrog of ``tfp.experimental.mcmc.PreconditionedNoUTurnSampler`` with kinetic energy
``-momentum_distribution.log_prob`` (positions, momenta, energy, U-turn products), for diagonal
and dense distributions of each supported kind.

Statistics: an ill-conditioned Gaussian (one part with scales log-spaced 0.01..10, one with a
dense random covariance of condition number 1e3) sampled with the matching mass matrix by us
and by TFP (both under XLA).  Chains are independent replicates: the per-chain averages over
the kept steps give honest Monte Carlo standard errors.  Seeds are fixed.
"""
import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from tfx_vec.autobatch.nuts import NoUTurnSampler, _leaf, _StateSpec, windowed_adaptive_nuts

tfd = tfp.distributions
PrecisionFactorMVN = tfp.experimental.distributions.MultivariateNormalPrecisionFactorLinearOperator
Z = 4.5


def _random_covariance(rng, n, low=0.3, high=3.0):
    rotation, _ = np.linalg.qr(rng.normal(size=(n, n)))
    return ((rotation * np.logspace(np.log10(low), np.log10(high), n)) @ rotation.T
            ).astype(np.float32)


RNG = np.random.default_rng(3)
PREC = np.linalg.inv(_random_covariance(RNG, 5)).astype(np.float32)
DIAG = RNG.uniform(0.5, 2.0, 5).astype(np.float32)
TRIL = np.linalg.cholesky(_random_covariance(RNG, 5)).astype(np.float32)
FULL = (np.eye(5) + 0.3 * RNG.normal(size=(5, 5))).astype(np.float32)   # not triangular


def _gauss(*parts):
    x = tf.concat(parts, -1)
    return -0.5 * tf.einsum("bi,ij,bj->b", x, PREC, x)


MOMENTA = {
    "diag": (1, lambda: tfd.MultivariateNormalDiag(scale_diag=DIAG)),
    "independent_normal": (1, lambda: tfd.Independent(tfd.Normal(0.0, DIAG), 1)),
    "precision_factor_diag": (1, lambda: PrecisionFactorMVN(
        precision_factor=tf.linalg.LinearOperatorDiag(DIAG))),
    "tril": (1, lambda: tfd.MultivariateNormalTriL(scale_tril=TRIL)),
    "full_scale": (1, lambda: tfd.MultivariateNormalLinearOperator(
        scale=tf.linalg.LinearOperatorFullMatrix(FULL))),
    "precision_factor_dense": (1, lambda: PrecisionFactorMVN(
        precision_factor=tf.linalg.LinearOperatorFullMatrix(FULL))),
    "joint_diag": (2, lambda: tfd.JointDistributionSequential(
        [tfd.MultivariateNormalDiag(scale_diag=DIAG[:3]),
         tfd.Independent(tfd.Normal(0.0, DIAG[3:]), 1)])),
    "joint_mixed": (2, lambda: tfd.JointDistributionSequential(
        [tfd.MultivariateNormalDiag(scale_diag=DIAG[:3]),
         tfd.MultivariateNormalTriL(scale_tril=TRIL[:2, :2])])),
}


def _parts(flat, n_parts):
    return [flat] if n_parts == 1 else [flat[:, :3], flat[:, 3:]]


@pytest.mark.parametrize("name", sorted(MOMENTA))
def test_leapfrog_energy_and_u_turn_are_tfps_for_the_momentum_distribution(name):
    n_parts, make = MOMENTA[name]
    md = make()
    rng = np.random.default_rng(11)
    q0 = tf.constant(rng.normal(size=(3, 5)).astype(np.float32))
    p0 = tf.constant(rng.normal(size=(3, 5)).astype(np.float32))
    eps = 0.15
    kernel = NoUTurnSampler(_gauss, eps, momentum_distribution=md)
    parts = _parts(q0, n_parts)
    spec = _StateSpec(parts, 1)
    vg = functools.partial(spec.value_and_grad, _gauss)

    # TFP's leapfrog: velocity = grad of -momentum_distribution.log_prob
    def kinetic(p):
        p_parts = _parts(p, n_parts)
        return -md.log_prob(p_parts if n_parts > 1 else p_parts[0])

    def velocity(p):
        with tf.GradientTape() as tape:
            tape.watch(p)
            k = kinetic(p)
        return tape.gradient(k, p)

    q, p = q0, p0
    logp, g = vg(q)
    for _ in range(3):
        p = p + 0.5 * eps * g
        q = q + eps * velocity(p)
        logp, g = vg(q)
        p = p + 0.5 * eps * g
    energy = -logp + kinetic(p)

    # ours: the identity-metric leaf on the program's coordinates
    factor = kernel._momentum.factor
    to_program = (lambda m: m * factor) if kernel._momentum.diagonal else (lambda m: m @ factor)
    y, g_y = kernel._to_program(q0, vg(q0)[1])
    p_y = to_program(p0)
    logp0 = vg(q0)[0]
    h0 = -logp0 + 0.5 * tf.reduce_sum(p_y * p_y, -1)
    out = _leaf(kernel._momentum.target(vg), 3, 1000.0, tf.ones([3]), y, p_y, g_y, logp0,
                kernel._program_step_size(spec, parts, eps), h0)
    q_ours, g_ours = kernel._from_program(out[0], out[2])
    np.testing.assert_allclose(q_ours, q, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(g_ours, g, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[1], to_program(p), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[7] + kernel._log_normalizer(tf.float32), energy,
                               rtol=1e-5, atol=1e-4)
    # the generalized U-turn criterion: velocity at an end against the summed momenta
    ours = tf.reduce_sum(out[1] * (p_y + out[1]), -1)
    np.testing.assert_allclose(ours, tf.reduce_sum(velocity(p) * (p0 + p), -1), rtol=1e-4,
                               atol=1e-4)


def test_a_diagonal_mass_matrix_keeps_the_identity_program():
    kernel = NoUTurnSampler(_gauss, 0.1)
    diagonal = kernel.copy(momentum_distribution=MOMENTA["diag"][1]())
    dense = kernel.copy(momentum_distribution=MOMENTA["tril"][1]())
    assert diagonal._programs is kernel._programs and dense._programs is not kernel._programs


@pytest.mark.parametrize("md, step, message", [
    (tfd.MultivariateStudentTLinearOperator(3.0, tf.zeros(5), tf.linalg.LinearOperatorDiag(
        tf.ones(5))), 0.1, "cannot use momentum_distribution MultivariateStudentTLinearOperator"),
    (tfd.MultivariateNormalDiag(loc=tf.fill([5], 0.5), scale_diag=DIAG), 0.1, "mean zero"),
    (tfd.MultivariateNormalDiag(scale_diag=tf.ones([2, 5])), 0.1, "batch shape"),
    (tfd.MultivariateNormalDiag(scale_diag=tf.ones([4])), 0.1, "does not match the state"),
    (tfd.MultivariateNormalTriL(scale_tril=TRIL), tf.constant([0.1, 0.1, 0.2, 0.1, 0.1]),
     "same for every coordinate"),
    (tfd.JointDistributionSequential([tfd.Normal(0.0, 1.0), lambda x: tfd.Normal(x, 1.0)]),
     0.1, "not callables"),
])
def test_momentum_distributions_we_cannot_use_are_clear_errors(md, step, message):
    with pytest.raises(ValueError, match=message):
        kernel = NoUTurnSampler(_gauss, step, momentum_distribution=md)
        kernel.bootstrap_results(tf.ones([2, 5]))


# -- statistics on an ill-conditioned Gaussian -------------------------------------------------

CHAINS, BURN, KEEP, STEP = 128, 6, 6, 0.5
SD = np.logspace(-2, 1, 6).astype(np.float32)
COV = _random_covariance(np.random.default_rng(5), 4, 0.01, 10.0)
COV_PREC = np.linalg.inv(COV).astype(np.float32)


def _ill_conditioned(a, b):
    return (-0.5 * tf.reduce_sum((a / SD) ** 2, -1)
            - 0.5 * tf.einsum("bi,ij,bj->b", b, COV_PREC, b))


def _mass_matrix():
    """The target's own covariance as the inverse mass matrix (momentum precision)."""
    return tfd.JointDistributionSequential([
        tfd.MultivariateNormalDiag(scale_diag=1.0 / SD),
        PrecisionFactorMVN(precision_factor=tf.linalg.LinearOperatorLowerTriangular(
            np.linalg.cholesky(COV).astype(np.float32)))])


def _init():
    rng = np.random.default_rng(2)
    return [tf.constant(2.0 * SD * rng.normal(size=(CHAINS, 6)), tf.float32),
            tf.constant(2.0 * rng.normal(size=(CHAINS, 4)) @ np.linalg.cholesky(COV).T,
                        tf.float32)]


def _sample(kernel):
    @tf.function(jit_compile=True)
    def run(state):
        return tfp.mcmc.sample_chain(KEEP, state, kernel=kernel, num_burnin_steps=BURN,
                                     seed=(8, 1), trace_fn=lambda _, r: r.leapfrogs_taken)
    (a, b), leapfrogs = run(_init())
    x = np.concatenate([a.numpy(), b.numpy()], -1)           # [KEEP, CHAINS, 10]
    # per-chain averages of x and x^2: independent across chains
    moments = np.concatenate([x.mean(0), (x ** 2).mean(0)], -1)   # [CHAINS, 20]
    return moments.mean(0), moments.std(0) / np.sqrt(CHAINS), leapfrogs.numpy().mean()


@pytest.fixture(scope="module")
def ill_conditioned():
    ours = _sample(NoUTurnSampler(_ill_conditioned, STEP, max_tree_depth=6,
                                  momentum_distribution=_mass_matrix()))
    tfps = _sample(tfp.experimental.mcmc.PreconditionedNoUTurnSampler(
        _ill_conditioned, STEP, momentum_distribution=_mass_matrix(), max_tree_depth=6))
    return ours, tfps


def test_mass_matrix_gets_the_ill_conditioned_moments(ill_conditioned):
    (estimate, mcse, _), _ = ill_conditioned
    truth = np.concatenate([np.zeros(10), SD ** 2, np.diag(COV)])
    assert np.all(np.abs(estimate - truth) < Z * mcse), (estimate, truth, mcse)
    # and the errors are small: each second moment within 25% of the truth
    np.testing.assert_allclose(estimate[10:], truth[10:], rtol=0.25)


def test_mass_matrix_matches_tfps_preconditioned_nuts(ill_conditioned):
    (ours, ours_se, ours_leapfrogs), (tfps, tfps_se, tfps_leapfrogs) = ill_conditioned
    assert np.all(np.abs(ours - tfps) < Z * np.hypot(ours_se, tfps_se)), (ours, tfps)
    assert abs(ours_leapfrogs / tfps_leapfrogs - 1) < 0.15, (ours_leapfrogs, tfps_leapfrogs)


def test_without_the_mass_matrix_the_same_step_diverges():
    kernel = NoUTurnSampler(_ill_conditioned, STEP, max_tree_depth=6, runtime="local_static")
    state = _init()
    _, results = kernel.one_step(state, kernel.bootstrap_results(state), seed=(8, 1))
    assert np.mean(results.has_divergence) > 0.95
    assert np.mean(results.is_accepted) < 0.05


def test_windowed_adaptation_finds_the_variances_and_a_unit_scale_step():
    sd = np.logspace(-1, 1, 4).astype(np.float32)
    draws, kernel = windowed_adaptive_nuts(
        40, lambda x: -0.5 * tf.reduce_sum((x / sd) ** 2, -1),
        tf.constant(np.random.default_rng(4).normal(size=(16, 4)), tf.float32),
        num_adaptation_steps=120, step_size=0.05, seed=(6, 2), max_tree_depth=7)
    variance = 1.0 / kernel.momentum_distribution.scale.diag_part().numpy() ** 2
    np.testing.assert_allclose(variance, sd ** 2, rtol=0.35)
    # the problem is a unit Gaussian in the mass matrix's metric: a step near 1
    assert 0.5 < float(kernel.step_size) < 2.0, kernel.step_size
    per_chain = (draws.numpy() ** 2).mean(0)                 # [16, 4]
    mcse = per_chain.std(0) / np.sqrt(16)
    assert np.all(np.abs(per_chain.mean(0) - sd ** 2) < Z * mcse), (per_chain.mean(0), mcse)


def test_adaptation_windows_are_stans():
    from tfx_vec.autobatch.nuts import _adaptation_windows
    assert _adaptation_windows(1000) == [(75, False), (25, True), (50, True), (100, True),
                                         (200, True), (500, True), (50, False)]
    assert _adaptation_windows(100) == [(15, False), (75, True), (10, False)]
