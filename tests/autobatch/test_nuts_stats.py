"""Statistical checks of tfx_vec's NUTS (program-counter runtime under XLA).

Marginals: one joint target of independent parts (a diagonal Gaussian, a correlated Gaussian, a
standard normal and a log-gamma, which is skewed), so one compiled program serves those tests.
512 chains start over-dispersed and run under ``tfp.mcmc.sample_chain`` with dual averaging (a
step size per chain and per part) inside one ``tf.function(jit_compile=True)``: 12 adaptation
steps, then 10 with the step sizes frozen.  Each chain's last state is one draw from the target,
independent of the other chains, so the bands are Monte Carlo standard errors and DKWM bands.

Mixing: split R-hat and ESS (``tfp.mcmc`` diagnostics) of 16 chains x 500 draws on a 10-d
correlated Gaussian.  Seeds are fixed, so each test is deterministic.
"""
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from scipy import special, stats

from tfx_vec.autobatch.nuts import NoUTurnSampler

Z = 4.5          # two-sided band in standard errors (about 7e-6 per comparison)
DKWM_ALPHA = 1e-4
CHAINS, ADAPT, DRAWS = 512, 12, 10

DIAG_SD = np.array([0.5, 1.0, 2.0], np.float32)
CORR_COV = np.array([[1.0, 0.8, 0.3], [0.8, 1.5, -0.4], [0.3, -0.4, 0.7]], np.float32)
LOGGAMMA_K = 2.0


def _gauss(x, cov):
    prec = tf.constant(np.linalg.inv(cov).astype(np.float32))
    return -0.5 * tf.einsum("bi,ij,bj->b", x, prec, x)


def _joint_log_prob(diag, corr, normal, skew):
    lp = -0.5 * tf.reduce_sum(tf.square(diag / DIAG_SD), -1) + _gauss(corr, CORR_COV)
    lp += -0.5 * tf.square(normal[:, 0])
    lp += LOGGAMMA_K * skew[:, 0] - tf.exp(skew[:, 0])  # y = log X, X ~ Gamma(k, 1)
    return lp


@pytest.fixture(scope="module")
def marginal_draws():
    """Last states [CHAINS, ...] per part, and per-step kernel diagnostics."""
    rng = np.random.default_rng(0)
    # Over-dispersed starts; the log-gamma part starts near its bulk: far out in its steep tail
    # (y = 5 has gradient -146) every first leapfrog diverges and a chain rightly never moves.
    init = [tf.constant((rng.normal(size=(CHAINS, n)) * s).astype(np.float32))
            for n, s in ((3, 3.0), (3, 3.0), (1, 3.0), (1, 1.0))]
    steps = [tf.fill([CHAINS, 1], s) for s in (0.3, 0.3, 0.5, 0.4)]
    kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(
        NoUTurnSampler(_joint_log_prob, step_size=steps, max_tree_depth=6),
        num_adaptation_steps=ADAPT, target_accept_prob=0.75)

    @tf.function(jit_compile=True)
    def run(state):
        return tfp.mcmc.sample_chain(
            ADAPT + DRAWS, state, kernel=kernel, seed=(11, 7),
            trace_fn=lambda _, r: (r.inner_results.is_accepted, r.inner_results.step_size,
                                   r.inner_results.leapfrogs_taken))

    states, (accepted, step_sizes, leapfrogs) = run(init)
    return ([s[-1].numpy() for s in states], accepted.numpy(),
            [s.numpy() for s in step_sizes], leapfrogs.numpy())


def _check_mean_cov(x, mean, cov):
    n = x.shape[0]
    sd = np.sqrt(np.diag(cov))
    np.testing.assert_array_less(np.abs(x.mean(0) - mean), Z * sd / math.sqrt(n))
    # Var of a sample covariance entry for Gaussians: (s_ii s_jj + s_ij^2) / n.
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov ** 2) / n)
    np.testing.assert_array_less(np.abs(np.cov(x, rowvar=False) - cov), Z * se)


def test_chains_move_and_adapt_per_chain(marginal_draws):
    _, accepted, step_sizes, leapfrogs = marginal_draws
    assert accepted[ADAPT:].mean() > 0.5  # a kernel that never moves would pass the tests below
    final = step_sizes[0][-1][:, 0]
    assert np.all(np.isfinite(final)) and len(np.unique(final)) > 0.9 * len(final)
    assert np.all(step_sizes[0][-1] == step_sizes[0][-2])  # frozen after adaptation
    assert np.all(leapfrogs >= 1)  # per step


def test_diagonal_gaussian_moments(marginal_draws):
    _check_mean_cov(marginal_draws[0][0], np.zeros(3), np.diag(DIAG_SD ** 2))


def test_correlated_gaussian_moments(marginal_draws):
    _check_mean_cov(marginal_draws[0][1], np.zeros(3), CORR_COV)


def _dkwm_check(x, cdf):
    """Dvoretzky-Kiefer-Wolfowitz-Massart: sup |F_n - F| <= eps with probability 1 - alpha."""
    x = np.sort(x)
    n = len(x)
    f = cdf(x)
    ks = max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n))
    assert ks < math.sqrt(math.log(2 / DKWM_ALPHA) / (2 * n)), ks


def test_normal_dkwm_band(marginal_draws):
    _dkwm_check(marginal_draws[0][2][:, 0], stats.norm.cdf)


def test_skewed_dkwm_band(marginal_draws):
    _dkwm_check(marginal_draws[0][3][:, 0], lambda y: special.gammainc(LOGGAMMA_K, np.exp(y)))


def test_10d_correlated_gaussian_rhat_and_ess():
    """Split R-hat < 1.01 and ESS > 400 from 16 chains x 500 draws (after 50 burn-in)."""
    rng = np.random.default_rng(1)
    a = rng.normal(size=(10, 10))
    cov = (a @ a.T / 10 + 0.2 * np.eye(10)).astype(np.float32)
    step = 0.5 * float(np.sqrt(np.linalg.eigvalsh(cov).min()))
    kernel = NoUTurnSampler(lambda x: _gauss(x, cov), step_size=step, max_tree_depth=6)
    init = tf.constant(rng.normal(size=(16, 10)).astype(np.float32) * 2.0)

    @tf.function(jit_compile=True)
    def run(x):
        return tfp.mcmc.sample_chain(500, x, kernel=kernel, num_burnin_steps=50,
                                     trace_fn=None, seed=(5, 5))

    draws = run(init)  # [draws, chains, 10]
    rhat = tfp.mcmc.potential_scale_reduction(draws, split_chains=True).numpy()
    ess = tfp.mcmc.effective_sample_size(draws, cross_chain_dims=1).numpy()
    assert rhat.max() < 1.01, rhat
    assert ess.min() > 400, ess
    flat = draws.numpy().reshape(-1, 10)
    np.testing.assert_array_less(np.abs(flat.mean(0)), Z * np.sqrt(np.diag(cov) / ess))
