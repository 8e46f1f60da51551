"""tfx_vec.autobatch.NoUTurnSampler honours the TransitionKernel contract of
tfp.mcmc.NoUTurnSampler: batch shapes read from the target's output (none, one or several batch
dimensions; parts shaped exactly the batch shape; mixed ranks; float32 and float64; chain counts
unknown at trace time), TFP's kernel results and constructor arguments, TFP's step-size
adaptation kernels and TransformedTransitionKernel, TF1 graph mode, TFP's errors.

References: a batch of any shape gives exactly what the same chains give as one flat batch
(chain b's draws depend only on the step seed and b), so the flat batch (itself checked against
the per-chain reference in test_nuts_kernel.py) is the reference for every batch shape.  Eager
steps use the local-static runtime (no program to trace: fast); the program counter runs under
tf.function and XLA, where the chain count may be unknown."""
import functools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from tensorflow_probability.python.internal import samplers

from tfx_vec.autobatch import nuts

NoUTurnSampler = functools.partial(nuts.NoUTurnSampler, runtime="local_static")
RNG = np.random.default_rng(42)
PREC = np.array([[1.5, 0.4, 0.1], [0.4, 1.0, -0.3], [0.1, -0.3, 0.8]])


def _gauss(x):
    """A correlated Gaussian on the last axis (any batch shape)."""
    return -0.5 * tf.einsum("...i,ij,...j->...", x, tf.constant(PREC, x.dtype), x)


def _step(kernel, state, seed=(3, 9), steps=1):
    results = kernel.bootstrap_results(state)
    for i in range(steps):
        state, results = kernel.one_step(state, results, seed=(seed[0], seed[1] + i))
    return state, results


def _assert_close(a, b, tol=1e-5):
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batch_of_rank_two_is_the_flat_batch(dtype):
    """State [2, 3, 3] (target output [2, 3]) gives what the flat batch [6, 3] gives; every
    per-chain result comes back with the batch shape [2, 3]."""
    x = RNG.normal(size=(2, 3, 3)).astype(dtype)
    kernel = NoUTurnSampler(_gauss, step_size=0.4, max_tree_depth=4)
    got, r = _step(kernel, tf.constant(x), steps=2)
    want, w = _step(kernel, tf.constant(x.reshape(6, 3)), steps=2)
    assert got.dtype == dtype and got.shape == (2, 3, 3)
    _assert_close(got, tf.reshape(want, [2, 3, 3]))
    for name in ("target_log_prob", "log_accept_ratio", "leapfrogs_taken", "is_accepted",
                 "reach_max_depth", "has_divergence", "energy", "total_leapfrogs_taken"):
        assert getattr(r, name).shape == (2, 3), name
        _assert_close(getattr(r, name), tf.reshape(getattr(w, name), [2, 3]))
    _assert_close(r.grads_target_log_prob, [tf.reshape(w.grads_target_log_prob[0], [2, 3, 3])])


def test_scalar_parameter_per_chain_and_mixed_ranks():
    """Parts of shapes [4] (exactly the batch shape), [4, 1] and [4, 2, 2]: the same draws as
    one flat [4, 6] state."""
    a, b, c = (RNG.normal(size=s).astype(np.float32) for s in ((4,), (4, 1), (4, 2, 2)))
    scales = tf.constant(np.linspace(0.5, 2.0, 6).astype(np.float32))

    def flat_target(z):
        return -0.5 * tf.reduce_sum(tf.square(z / scales), -1)

    def parts_target(x, y, w):
        return flat_target(tf.concat([x[:, None], y, tf.reshape(w, [-1, 4])], -1))

    kernel = NoUTurnSampler(parts_target, step_size=0.3, max_tree_depth=4)
    got, r = _step(kernel, [tf.constant(a), tf.constant(b), tf.constant(c)], steps=2)
    flat = np.concatenate([a[:, None], b, c.reshape(4, 4)], -1)
    want, w = _step(NoUTurnSampler(flat_target, step_size=0.3, max_tree_depth=4),
                    tf.constant(flat), steps=2)
    assert isinstance(got, list) and [g.shape for g in got] == [(4,), (4, 1), (4, 2, 2)]
    _assert_close(tf.concat([got[0][:, None], got[1], tf.reshape(got[2], [4, 4])], -1), want)
    _assert_close(r.leapfrogs_taken, w.leapfrogs_taken)


def test_one_chain_without_batch_dimension():
    """A target returning a scalar: one chain, parts without batch dimensions (here a scalar
    and a vector, as TFP's list-of-floats start state), the same as a batch of one."""
    def target(x, y):
        return -0.5 * (x * x + tf.reduce_sum(y * y, -1) + x * y[..., 0])

    x, y = np.float32(0.7), RNG.normal(size=3).astype(np.float32)
    kernel = NoUTurnSampler(target, step_size=0.4, max_tree_depth=4)
    got, r = _step(kernel, (tf.constant(x), tf.constant(y)), steps=2)
    want, w = _step(kernel, (tf.constant([x]), tf.constant(y[None])), steps=2)
    assert isinstance(got, tuple) and got[0].shape == () and got[1].shape == (3,)
    _assert_close(got, (want[0][0], want[1][0]))
    assert r.target_log_prob.shape == () and r.energy.shape == () and r.seed.shape == (2,)
    _assert_close(r.target_log_prob, w.target_log_prob[0])


def test_zero_sized_event_part():
    kernel = NoUTurnSampler(lambda x, y: -0.5 * tf.reduce_sum(x * x, -1) + tf.reduce_sum(y, -1),
                            step_size=0.3, max_tree_depth=3)
    x = tf.constant(RNG.normal(size=(3, 2)).astype(np.float32))
    (got, empty), _ = _step(kernel, [x, tf.zeros([3, 0])])
    want, _ = _step(NoUTurnSampler(lambda x: -0.5 * tf.reduce_sum(x * x, -1), step_size=0.3,
                                   max_tree_depth=3), x)
    assert empty.shape == (3, 0)
    _assert_close(got, want)


def test_chain_count_unknown_at_trace_time():
    """tf.function with input_signature [None, 3] (and XLA) gives the eager draws."""
    kernel = NoUTurnSampler(_gauss, step_size=0.4, max_tree_depth=4)
    x = tf.constant(RNG.normal(size=(5, 3)).astype(np.float32))

    def step(kernel, x):
        return kernel.one_step(x, kernel.bootstrap_results(x), seed=(3, 9))

    want = step(kernel, x)
    batched = kernel.copy(runtime="program_counter")
    spec = [tf.TensorSpec([None, 3], tf.float32)]
    got = tf.function(functools.partial(step, batched), input_signature=spec,
                      jit_compile=True)(x)
    _assert_close(got[0], want[0], 1e-4)
    _assert_close(got[1].leapfrogs_taken, want[1].leapfrogs_taken)


def test_unknown_rank_is_a_clear_error():
    kernel = NoUTurnSampler(_gauss, step_size=0.4)
    f = tf.function(kernel.bootstrap_results, input_signature=[tf.TensorSpec(None, tf.float32)])
    with pytest.raises(ValueError, match="unknown rank"):
        f(tf.ones([2, 3]))


def test_kernel_results_have_tfps_fields_and_meaning():
    """Every field of TFP's NUTS results, with TFP's meaning: the bootstrap values equal TFP's;
    leapfrogs_taken counts one step (total_leapfrogs_taken all of them); seed is the seed the
    step used; energy is log-density minus kinetic energy at the sample (so below it)."""
    x = tf.constant(RNG.normal(size=(4, 3)).astype(np.float32))
    ours = NoUTurnSampler(_gauss, step_size=1e-3, max_tree_depth=3, parallel_iterations=3)
    theirs = tfp.mcmc.NoUTurnSampler(_gauss, step_size=1e-3, max_tree_depth=3)
    assert set(theirs.bootstrap_results(x)._fields) <= set(ours.bootstrap_results(x)._fields)
    assert ours.parallel_iterations == 3 and ours.parameters["parallel_iterations"] == 3
    mine, tfps = ours.bootstrap_results(x), theirs.bootstrap_results(x)
    for name in ("target_log_prob", "log_accept_ratio", "leapfrogs_taken", "is_accepted",
                 "reach_max_depth", "has_divergence", "energy"):
        _assert_close(getattr(mine, name), getattr(tfps, name))
    _assert_close(mine.grads_target_log_prob, tfps.grads_target_log_prob)
    state, r = x, mine
    for i in range(2):  # tiny steps: every trajectory reaches the maximum depth, 7 leaves
        seed = samplers.sanitize_seed((5, i))
        state, r = ours.one_step(state, r, seed=seed)
        np.testing.assert_array_equal(r.leapfrogs_taken, [7] * 4)
        np.testing.assert_array_equal(r.total_leapfrogs_taken, [7 * (i + 1)] * 4)
        np.testing.assert_array_equal(r.seed, seed)
        assert np.all(r.reach_max_depth)
        np.testing.assert_array_less(r.energy, r.target_log_prob)
        # energy is conserved along a tiny-step trajectory: log p(x0) - |p0|^2 / 2 with a
        # standard normal momentum, i.e. within a few units of the log-density
        assert np.all(np.asarray(r.target_log_prob - r.energy) < 15.0)


def test_energy_matches_tfps_in_distribution():
    """At stationarity (N(0, I) target started at draws from it) the sample's energy is
    -(|x|^2 + |p|^2) / 2 + const ~ -(chi2 with 2D degrees of freedom) / 2 + const: its mean over
    chains agrees with TFP's sampler and with the exact value within Monte Carlo error."""
    d, chains = 3, 2000
    target = tfp.distributions.MultivariateNormalDiag(tf.zeros(d)).log_prob
    x = tf.constant(RNG.normal(size=(chains, d)).astype(np.float32))
    means = []
    for kernel in (NoUTurnSampler(target, step_size=0.2, max_tree_depth=3),
                   tfp.mcmc.NoUTurnSampler(target, step_size=0.2, max_tree_depth=3)):
        _, r = _step(kernel, x)
        means.append(float(np.mean(r.energy)))
    exact = -(d + 0.5 * d * np.log(2 * np.pi))
    se = np.sqrt(d / chains)  # sd of chi2_{2D} / 2 is sqrt(D)
    assert abs(means[0] - exact) < 4.5 * se and abs(means[0] - means[1]) < 4.5 * np.sqrt(2) * se


def test_none_gradient_raises_tfps_error():
    kernel = NoUTurnSampler(lambda x, y: -tf.reduce_sum(x * x, -1), step_size=0.1)
    with pytest.raises(ValueError, match="Encountered `None` gradient"):
        kernel.bootstrap_results([tf.ones([2, 2]), tf.ones([2, 1])])


def test_nested_state_is_tfps_type_error():
    kernel = NoUTurnSampler(lambda x: -tf.reduce_sum(x * x, -1), step_size=0.1)
    with pytest.raises(TypeError, match="nested or non-list-like"):
        kernel.bootstrap_results({"x": tf.ones([2, 2])})


def test_shard_axis_names_are_recorded_and_sharded_states_refused():
    kernel = NoUTurnSampler(_gauss, step_size=0.1)
    assert kernel.experimental_shard_axis_names is None
    sharded = kernel.experimental_with_shard_axes(["a"])
    assert sharded.experimental_shard_axis_names == ["a"]
    with pytest.raises(ValueError, match="sharded states"):
        sharded.bootstrap_results(tf.ones([2, 3]))
    with pytest.raises(ValueError, match="parallel_iterations"):
        NoUTurnSampler(_gauss, step_size=0.1, parallel_iterations=0)


@pytest.mark.parametrize("adaptation", ["simple", "dual_averaging"])
def test_step_size_adaptation_kernels_drive_our_step_size(adaptation):
    """TFP's adaptation kernels set the step size through the kernel results (copy-free): a
    far too large initial step size is reduced, our kernel steps with the adapted one (what
    the results report is what the adaptation set), and the chains accept often after it."""
    x = tf.constant(RNG.normal(size=(64, 3)).astype(np.float32))
    inner = nuts.NoUTurnSampler(_gauss, step_size=3.0, max_tree_depth=4)
    if adaptation == "simple":
        kernel = tfp.mcmc.SimpleStepSizeAdaptation(inner, num_adaptation_steps=20,
                                                   adaptation_rate=0.1)
    else:
        kernel = tfp.mcmc.DualAveragingStepSizeAdaptation(inner, num_adaptation_steps=20)

    @tf.function(jit_compile=True)
    def run():
        return tfp.mcmc.sample_chain(
            30, x, kernel=kernel, seed=(2, 8),
            trace_fn=lambda _, r: (r.inner_results.step_size, r.inner_results.is_accepted))

    _, (steps, accepted) = run()
    steps, accepted = np.asarray(steps), np.asarray(accepted)
    assert steps[-1] < 1.5 and np.all(steps[-5:] == steps[-1])  # adapted, then frozen
    assert accepted[-10:].mean() > 0.5


def test_transformed_transition_kernel_is_the_transformed_target():
    """TransformedTransitionKernel(ours, Exp) on a log-normal target draws exp of what ours
    draws on the unconstrained target log p(exp(z)) + z (same seeds, same chains)."""
    lognormal = tfp.distributions.LogNormal(0.3, 0.7)
    z = tf.constant(RNG.normal(size=(8,)).astype(np.float32))
    ttk = tfp.mcmc.TransformedTransitionKernel(
        NoUTurnSampler(lognormal.log_prob, step_size=0.5, max_tree_depth=4),
        tfp.bijectors.Exp())
    got = tfp.mcmc.sample_chain(3, tf.exp(z), kernel=ttk, trace_fn=None, seed=(6, 1))
    unconstrained = NoUTurnSampler(lambda u: lognormal.log_prob(tf.exp(u)) + u, step_size=0.5,
                                   max_tree_depth=4)
    want = tfp.mcmc.sample_chain(3, z, kernel=unconstrained, trace_fn=None, seed=(6, 1))
    _assert_close(got, tf.exp(want), 1e-4)
    assert np.all(np.asarray(got) > 0) and not np.allclose(got[-1], tf.exp(z))


def test_tf1_graph_and_session_match_eager():
    """Built in a tf.compat.v1 Graph and run in a Session, sample_chain gives the eager draws
    (the chains move: the start state is not every sample)."""
    x0 = RNG.normal(size=(3, 2)).astype(np.float32)

    def draws(runtime):
        kernel = nuts.NoUTurnSampler(lambda x: -0.5 * tf.reduce_sum(x * x, -1), step_size=0.5,
                                     max_tree_depth=3, runtime=runtime)
        return tfp.mcmc.sample_chain(3, tf.constant(x0), kernel=kernel, trace_fn=None,
                                     seed=(1, 2))

    eager = draws("local_static").numpy()  # the same draws as the program counter's
    graph = tf.Graph()
    with graph.as_default():
        out = draws("program_counter")
        with tf.compat.v1.Session(graph=graph) as sess:
            got = sess.run(out)
    np.testing.assert_allclose(got, eager, rtol=1e-5, atol=1e-5)
    assert not np.allclose(got[-1], x0)
