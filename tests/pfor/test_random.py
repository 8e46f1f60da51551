"""Random ops under every ``randomness`` mode, checked statistically (§3.8).

For each op: 'different' draws are independent across iterations (rows differ and their
pairwise correlation is near 0) with the right mean/variance; 'same' rows are identical and
have the right mean/variance; 'error' raises naming the op.  Tolerances come from the sample
size (a few standard errors).  Stateless ops are exact: compared with the per-iteration loop.
"""
import numpy as np
import pytest
import tensorflow as tf

import tfx_vec
from tests.pfor.oracle import check_pfor, reference, assert_all_close

N, M = 16, 512  # iterations, samples per iteration
GEN = tf.random.Generator.from_seed(7)

# name, loop body (ignores i), op type named in the error, mean, variance
CASES = [
    ("normal", lambda i: tf.random.normal([M], 1.0, 2.0), "RandomStandardNormal", 1.0, 4.0),
    ("uniform", lambda i: tf.random.uniform([M]), "RandomUniform", 0.5, 1 / 12),
    ("truncated", lambda i: tf.random.truncated_normal([M]), "TruncatedNormal", 0.0, 0.7737),
    ("uniform_int", lambda i: tf.random.uniform([M], 0, 10, tf.int32), "RandomUniformInt",
     4.5, 99 / 12),
    ("gamma", lambda i: tf.random.gamma([M], 3.0), "RandomGamma", 3.0, 3.0),
    ("poisson", lambda i: tf.random.poisson([M], 4.0), "RandomPoissonV2", 4.0, 4.0),
    ("categorical", lambda i: tf.random.categorical(tf.math.log([[0.25, 0.75]]), M)[0],
     "Multinomial", 0.75, 0.1875),
    ("generator_normal", lambda i: GEN.normal([M]), "RngReadAndSkip", 0.0, 1.0),
    ("generator_uniform", lambda i: GEN.uniform([M]), "RngReadAndSkip", 0.5, 1 / 12),
]
IDS = [c[0] for c in CASES]


def _draw(body, randomness):
    out = tfx_vec.pfor(body, N, randomness=randomness, fallback_to_while_loop=False)
    return np.asarray(out, np.float64)


def _check_moments(x, mean, var):
    n = x.size
    se_mean = np.sqrt(var / n)
    assert abs(x.mean() - mean) < 5 * se_mean + 1e-9, (x.mean(), mean)
    # Var of the sample variance is ~2 var^2/n for near-normal data; allow a wide margin.
    assert abs(x.var() - var) < 8 * var * np.sqrt(2.0 / n) + 1e-9, (x.var(), var)


@pytest.mark.parametrize("name,body,op_type,mean,var", CASES, ids=IDS)
def test_different_draws_are_independent(name, body, op_type, mean, var):
    x = _draw(body, "different")
    assert x.shape == (N, M)
    _check_moments(x, mean, var)
    assert len({row.tobytes() for row in x}) == N, "two iterations drew the same numbers"
    corr = np.corrcoef(x)[np.triu_indices(N, 1)]
    # Each pairwise correlation of independent rows has sd ~ 1/sqrt(M).
    assert np.max(np.abs(corr)) < 5.5 / np.sqrt(M), np.max(np.abs(corr))
    assert abs(corr.mean()) < 5 / np.sqrt(M * corr.size)


@pytest.mark.parametrize("name,body,op_type,mean,var", CASES, ids=IDS)
def test_same_draws_are_shared(name, body, op_type, mean, var):
    x = _draw(body, "same")
    assert x.shape == (N, M)
    np.testing.assert_array_equal(x, np.broadcast_to(x[:1], x.shape))
    _check_moments(x[0], mean, var)


@pytest.mark.parametrize("name,body,op_type,mean,var", CASES, ids=IDS)
def test_error_mode_names_the_op(name, body, op_type, mean, var):
    with pytest.raises(tfx_vec.VectorizationError, match=op_type):
        _draw(body, "error")


def test_loop_variant_distribution_parameters():
    alpha = tf.constant([0.5, 2.0, 8.0, 20.0])
    x = tfx_vec.pfor(lambda i: tf.random.gamma([4096], tf.gather(alpha, i)), 4,
                     fallback_to_while_loop=False).numpy()
    for row, a in zip(x, alpha.numpy()):
        _check_moments(row.astype(np.float64), a, a)


def test_stateless_ops_are_exact_in_every_mode():
    seed = tf.constant([3, 4])
    x = tf.constant(np.linspace(0.1, 1.0, 5), tf.float32)

    def body(i):
        noise = tf.random.stateless_normal([6], seed)
        return noise * tf.gather(x, i) + tf.random.stateless_uniform([6], seed + 1)
    for mode in ("different", "same", "error"):
        check_pfor(body, 5, modes=("eager",), randomness=mode)


def test_stateless_ops_with_loop_variant_seed_are_exact_per_iteration():
    """No batched kernel reproduces each seed's draw: they run once per iteration, exactly,
    even with fallbacks off (as in TensorFlow's pfor), and are counted."""
    logits = tf.math.log(tf.constant([[0.2, 0.3, 0.5], [0.6, 0.3, 0.1]]))

    def body(i):
        seed = tf.stack([i, 7])
        return (tf.random.stateless_normal([3], seed),
                tf.random.stateless_categorical(logits * tf.cast(i + 1, tf.float32), 4, seed),
                tf.random.stateless_categorical(logits, 4, [1, 2]))
    expected = reference(body, 4)
    tfx_vec.reset_fallbacks()
    actual = tfx_vec.pfor(body, 4, fallback_to_while_loop=False)
    for a, e in zip(actual, expected):
        assert_all_close(a.numpy(), e, 1e-6, 1e-6, "per-iteration seeds")
    assert len({row.tobytes() for row in actual[0].numpy()}) == 4
    report = tfx_vec.fallback_report()
    assert report.get("StatelessRandomGetKeyCounter") or report.get("StatelessMultinomial")
