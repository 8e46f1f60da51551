"""tfx_vec.autobatch.NoUTurnSampler as a TFP kernel: every runtime agrees with the per-chain
reference, kernel results are consistent, edge cases (divergence, maximum depth) are flagged, bad
input is rejected clearly.  TFP workflows (sample_chain, dual averaging, XLA) and the statistics
are in test_nuts_stats.py."""
import re

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from tensorflow_probability.python.internal import samplers

from tfx_vec.autobatch import ir, nuts, program_counter
from tfx_vec.autobatch.nuts import NoUTurnSampler

CHAINS = 5
COV = np.array([[1.0, 0.6, 0.2], [0.6, 2.0, -0.5], [0.2, -0.5, 0.8]], np.float32)
PREC = np.linalg.inv(COV).astype(np.float32)


def _two_part_log_prob(x, y):
    """A correlated 3-d Gaussian whose state is split into parts of shapes [1] and [2]."""
    z = tf.concat([x, y], axis=-1)
    return -0.5 * tf.einsum("bi,ij,bj->b", z, tf.constant(PREC), z)


def _two_part_state(seed=0):
    rng = np.random.default_rng(seed)
    return [tf.constant(rng.normal(size=(CHAINS, 1)).astype(np.float32)),
            tf.constant(rng.normal(size=(CHAINS, 2)).astype(np.float32))]


def _per_chain_steps():
    """A step size per chain (shape [chains, 1]) and per state part."""
    base = np.linspace(0.25, 0.6, CHAINS).astype(np.float32)[:, None]
    return [tf.constant(base), tf.constant(0.8 * base)]


def _run_steps(runtime, num_steps=2, step_size=None, **kw):
    """``num_steps`` kernel steps with fixed seeds; ``runtime="xla[:scheduler]"``: the program
    counter under ``tf.function(jit_compile=True)`` (compiled once, called once per step)."""
    xla = runtime.startswith("xla")
    if ":" in runtime:
        kw["scheduler"] = runtime.split(":")[1]
    step_size = _per_chain_steps() if step_size is None else step_size
    kernel = NoUTurnSampler(_two_part_log_prob, step_size=step_size, max_tree_depth=5,
                            runtime="program_counter" if xla else runtime, **kw)
    step = tf.function(kernel.one_step, jit_compile=True) if xla else kernel.one_step
    state = _two_part_state()
    results = kernel.bootstrap_results(state)
    out = []
    for i in range(num_steps):
        state, results = step(state, results, seed=tf.constant([7, i]))
        out.append((state, results))
    return out


def _assert_same(a, b, rtol=2e-5, atol=2e-5):
    """Floats allclose, integer and boolean results identical, over the whole structure."""
    for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)):
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype.kind == "f":
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def reference():
    """The same program run directly in Python, one chain at a time (the unbatched reference)."""
    return _run_steps("python", num_trajectories_per_step=2, unrolled_leapfrog_steps=2)


@pytest.mark.parametrize("runtime", ["xla", "xla:earliest", "xla:most_active", "local_static",
                                     "hybrid"])
def test_runtime_matches_per_chain_reference(reference, runtime):
    """Every batched runtime gives each chain what running it alone gives: the program
    counter under XLA (the default scheduler, sweep_guarded, and two others), local static,
    and local static with XLA blocks."""
    got = _run_steps(runtime, num_trajectories_per_step=2, unrolled_leapfrog_steps=2)
    _assert_same(got, reference, *((1e-4, 1e-4) if runtime != "local_static" else ()))


@pytest.mark.parametrize("runtime", ["python", "local_static", "xla"])
def test_subtrees_built_in_one_block_give_the_recursions_draws(runtime):
    """Building the bottom levels of every subtree in one block (all their leapfrogs
    computed, those a chain's tree does not take dropped) changes how the batch runs, not the
    draws: states, statistics and leapfrog counts are the recursion's down to single leaves,
    for every depth up to the whole tree (max_tree_depth 5: subtrees of depth 4)."""
    want = _run_steps(runtime, num_trajectories_per_step=2, unrolled_subtree_depth=0)
    for depth in (2, 4):
        got = _run_steps(runtime, num_trajectories_per_step=2, unrolled_subtree_depth=depth)
        _assert_same(got, want, *((1e-6, 1e-6) if runtime == "xla" else (0, 0)))


@pytest.mark.parametrize("runtime", ["xla", "xla:earliest", "program_counter"])
def test_subtrees_computed_for_the_chains_at_them_give_the_same_draws(monkeypatch, runtime):
    """Gathering the chains at an unrolled subtree (as from GATHERED_SUBTREE_MIN_CHAINS
    chains on) changes which rows are computed, not the draws."""
    want = _run_steps(runtime, num_trajectories_per_step=2, unrolled_subtree_depth=2)
    monkeypatch.setattr(nuts, "GATHERED_SUBTREE_MIN_CHAINS", 2)
    kernel = NoUTurnSampler(_two_part_log_prob, 0.3, unrolled_subtree_depth=2)
    kernel._program(nuts._StateSpec(_two_part_state(), 1), batched=True)
    assert _gathered(kernel) == [True]  # gathered at CHAINS chains
    got = _run_steps(runtime, num_trajectories_per_step=2, unrolled_subtree_depth=2)
    _assert_same(got, want, 1e-6, 1e-6)


def _gathered(kernel: NoUTurnSampler) -> list:
    """Whether each program the kernel built gathers its subtrees (the cost keys skipped)."""
    return [key[-1] for key in kernel._programs if key[0] != "cost"]


def test_subtrees_are_gathered_only_where_the_gradient_is_cheap(monkeypatch):
    """Where the gradient costs more than GATHERED_SUBTREE_GRADIENT_FLOPS_PER_DIM per chain
    and dimension (a dense 50-d Gaussian ran 0.88x gathered) the subtree stays unrolled and
    is computed for every chain."""
    monkeypatch.setattr(nuts, "GATHERED_SUBTREE_MIN_CHAINS", 2)
    spec = nuts._StateSpec(_two_part_state(), 1)
    cheap = NoUTurnSampler(_two_part_log_prob, 0.3)
    cheap._program(spec, batched=True)
    assert cheap._cost(spec) < nuts.GATHERED_SUBTREE_GRADIENT_FLOPS_PER_DIM
    assert _gathered(cheap) == [True]
    monkeypatch.setattr(nuts, "GATHERED_SUBTREE_GRADIENT_FLOPS_PER_DIM", cheap._cost(spec))
    costly = NoUTurnSampler(_two_part_log_prob, 0.3)
    costly._program(spec, batched=True)
    assert costly._subtree_depth(spec) == nuts.SUBTREE_DEPTH and _gathered(costly) == [False]


def test_tracing_a_step_runs_the_targets_python_once_per_use():
    """Tracing a step runs the target's Python twice (the bootstrap's gradient, the block of a
    subtree's leaves), not once per leaf: the leaves are calls of one function.  (With the
    subtree depth given, no cost estimate traces it once more.)"""
    calls = []

    def target(x):
        calls.append(1)
        return -0.5 * tf.reduce_sum(x * x, -1)
    kernel = NoUTurnSampler(target, step_size=0.3, unrolled_subtree_depth=2)
    x = tf.constant(np.random.default_rng(0).normal(size=(4, 3)), tf.float32)
    step = tf.function(lambda x, seed: kernel.one_step(x, kernel.bootstrap_results(x),
                                                       seed=seed)[0], autograph=False)
    step.get_concrete_function(x, tf.constant([1, 2]))
    assert len(calls) == 2


def test_subtree_depth_follows_the_gradients_cost():
    """By default subtrees of depth 2 are built in one block where the gradient costs under
    1000 operations per chain and dimension, none where it costs more or its cost is unknown;
    a depth given is kept, up to the deepest subtree there is."""
    rng = np.random.default_rng(4)
    dim = int(rng.integers(3, 8))
    x = tf.constant(rng.normal(size=(CHAINS, dim)).astype(np.float32))
    spec = nuts._StateSpec([x], 1)

    def depth(target, **kw):
        return NoUTurnSampler(target, 0.1, **kw)._subtree_depth(spec)

    def quadratic(size):   # about 8 * size operations per chain and dimension, gradient included
        m = tf.constant(rng.normal(size=(dim, size)).astype(np.float32))
        return lambda x: -tf.reduce_sum(tf.matmul(tf.matmul(x, m), tf.transpose(m)) * x, -1)

    assert nuts.SUBTREE_DEPTH == 2 and nuts.SUBTREE_GRADIENT_FLOPS_PER_DIM == 1000
    assert depth(quadratic(4)) == 2
    assert depth(quadratic(50)) == 2    # a few hundred per dimension: still worth it
    assert depth(quadratic(250)) == 0
    assert depth(quadratic(4), unrolled_subtree_depth=1) == 1
    assert depth(quadratic(4), unrolled_subtree_depth=9, max_tree_depth=4) == 3
    looped = lambda x: tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 0.5),
                                     (0, -tf.reduce_sum(x * x, -1)))[1]
    assert depth(looped) == 0
    # the count behind it: 2 m n k per matrix product, on a random-sized one
    m, k, n = rng.integers(2, 9, size=3)
    graph = tf.function(tf.matmul).get_concrete_function(
        tf.TensorSpec([m, k]), tf.TensorSpec([k, n])).graph
    # plus the size of each input placeholder and of the output's identity
    assert nuts._graph_flops(graph) == 2 * m * n * k + m * k + k * n + m * n


def test_one_step_size_per_chain_matches_reference():
    """One step size for all coordinates of a chain travels as [chains, 1] (not [chains, D])
    through the program; the batched program still matches the per-chain reference."""
    step = tf.constant(np.linspace(0.2, 0.5, CHAINS).astype(np.float32)[:, None])
    want = _run_steps("python", step_size=step, num_trajectories_per_step=2)
    _assert_same(_run_steps("local_static", step_size=step, num_trajectories_per_step=2), want)


def test_kernel_results_are_consistent(reference):
    """target_log_prob and its gradient belong to the returned state; counters add up."""
    for state, r in reference:
        with tf.GradientTape() as tape:
            tape.watch(state)
            lp = _two_part_log_prob(*state)
        np.testing.assert_allclose(r.target_log_prob, lp, rtol=1e-5, atol=1e-5)
        for g, want in zip(r.grads_target_log_prob, tape.gradient(lp, state)):
            np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_less(r.log_accept_ratio, 1e-6)
        assert np.all(np.asarray(r.leapfrogs_taken) % 2 == 0)  # 2 unrolled steps per leaf
    (_, first), (_, second) = reference
    # leapfrogs_taken counts this step (as TFP's), total_leapfrogs_taken every step so far
    np.testing.assert_array_equal(first.total_leapfrogs_taken, first.leapfrogs_taken)
    np.testing.assert_array_equal(second.total_leapfrogs_taken,
                                  first.leapfrogs_taken + second.leapfrogs_taken)
    assert np.all(np.asarray(second.leapfrogs_computed) >= np.max(second.total_leapfrogs_taken))


def test_chain_seeds_do_not_depend_on_the_batch():
    """Chain b's seed depends only on the step seed and b, so (with the per-chain reference
    test above) chain b gets the same draws alone as in any batch."""
    np.testing.assert_array_equal(nuts.chain_seeds((1, 1), 3), nuts.chain_seeds((1, 1), 7)[:3])
    assert len({tuple(s) for s in nuts.chain_seeds((1, 1), 1000).numpy()}) == 1000


def test_one_gradient_block_and_it_is_last():
    """The structure the program-counter schedule relies on: exactly one block of
    the lowered program evaluates the gradient (the leaf) and it is the last block, so with
    earliest-block scheduling every unfinished chain waits there before it runs; trajectory
    boundaries are no function calls (one loop of doublings, recursion only in build_tree);
    the blocks are laid out continuations first."""
    kernel = NoUTurnSampler(_two_part_log_prob, step_size=0.3)
    state = _two_part_state()
    fn = kernel._program(nuts._StateSpec(state, 1), batched=True)
    kernel.one_step(state, kernel.bootstrap_results(state), seed=(1, 2))
    # the program as declared, and as run for this signature (per-member scalar blocks merged)
    as_run = [p for p in fn._compiled.values() if isinstance(p, tuple)]
    assert len(as_run) == 1
    for program in (fn.lowered(), as_run[0][1]):
        gradient_blocks = [i for i, b in enumerate(program.blocks) for op in b.ops
                           if isinstance(op, ir.Primitive) and "leaf(" in op.text]
        assert gradient_blocks == [len(program.blocks) - 1]
        assert set(program.entries) == {"run_trajectories", "build_tree"}
        # continuations_first layout: members returning from a subtree (climbing) run before
        # build_tree's entry, where members descend
        tree = [i for i, owner in enumerate(program.owners) if owner == "build_tree"]
        assert program.entries["build_tree"] > tree[0]
        # a chain whose trajectory goes on returns from the doubling's block straight to the
        # block that starts the next doubling: no block of its own for the loop's test
        doubling = [i for i, b in enumerate(program.blocks) for op in b.ops
                    if isinstance(op, ir.Primitive) and "extend(" in op.text]
        next_doubling = [i for i, b in enumerate(program.blocks) for op in b.ops
                         if isinstance(op, ir.Primitive) and "_choose_direction(" in op.text]
        assert len(doubling) == len(next_doubling) == 1
        assert next_doubling[0] in ir.successors(program.blocks[doubling[0]].terminator)


def _uninterrupted(kernel, state, first_seed, trajectories):
    """Each chain's state and leapfrogs after its first ``trajectories`` trajectories of its
    own seed stream, in one uninterrupted run of the per-chain program (no steps, no
    pausing): what run-ahead steps must return, wherever their pauses fell."""
    spec = nuts._StateSpec(state, 1)
    # the program for several trajectories a call (with one a call, the program compiled
    # runs exactly one)
    program = kernel.copy(num_trajectories_per_step=2)._program(spec, batched=False)
    q = spec.flatten(state)
    logp, g = spec.value_and_grad(kernel.target_log_prob_fn, q)
    step_seed, _ = samplers.split_seed(samplers.sanitize_seed(first_seed))  # as one_step does
    n = tf.constant(trajectories, tf.int32)
    args = kernel._arguments(spec, state, kernel.bootstrap_results(state).step_size, n, n, q,
                             logp, g, nuts.chain_seeds(step_seed, CHAINS))
    rows = [program(*(a[b:b + 1] for a in args)) for b in range(CHAINS)]
    return (np.concatenate([np.asarray(r[0]) for r in rows]),
            np.concatenate([np.asarray(r[5]) for r in rows]))


@pytest.mark.parametrize("runtime", ["xla", "program_counter", "xla:sweep_guarded"])
def test_run_ahead_follows_each_chains_uninterrupted_trajectories(runtime):
    """With run_ahead, a step pauses the machine when every chain has its next 2
    trajectories, chains that got there first having gone on, and the next step resumes it;
    still, after step j every chain is exactly where its own seed stream takes it after 2j
    trajectories, with those trajectories' leapfrogs: the same Markov chain as without steps."""
    steps = _run_steps(runtime, num_steps=4, num_trajectories_per_step=2, run_ahead=True)
    kernel = NoUTurnSampler(_two_part_log_prob, step_size=_per_chain_steps(), max_tree_depth=5)
    spec = nuts._StateSpec(_two_part_state(), 1)
    ahead = 0
    for j, (state, r) in enumerate(steps, start=1):
        want_q, want_leapfrogs = _uninterrupted(kernel, _two_part_state(), (7, 0), 2 * j)
        np.testing.assert_allclose(spec.flatten(state), want_q, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(r.total_leapfrogs_taken, want_leapfrogs)
        ahead += int(np.sum(np.asarray(r.machine[0]["vals"]["run_trajectories.t"]) > 2 * j))
    assert ahead > 0  # some chain was past the step's trajectories when it paused


def _stiff_gaussian(on_call=lambda: None):
    """A 6-d Gaussian with scales 1 to 0.1 (trajectories of very unequal lengths)."""
    prec = tf.constant(np.diag(np.logspace(0, 2, 6)).astype(np.float32))

    def target(x):
        on_call()
        return -0.5 * tf.reduce_sum(tf.matmul(x, prec) * x, -1)
    return target


def _stiff_start():
    return tf.constant(np.random.default_rng(1).normal(size=(30, 6)).astype(np.float32) * 0.3)


def test_run_ahead_records_every_steps_state_wherever_the_pause_falls():
    """30 chains, 3 trajectories a step: some chain finishes the trajectory at its cap (the
    next step's target) just as the machine pauses.  Resumed, it must still record that
    trajectory's state as the step's result, not go on from the cap it re-reads and leave
    the step the state of the one before (a frozen chain)."""
    target, x0 = _stiff_gaussian(), _stiff_start()
    kernel = NoUTurnSampler(target, step_size=0.08, num_trajectories_per_step=3,
                            run_ahead=True)
    spec = nuts._StateSpec([x0], 1)
    q = spec.flatten([x0])
    logp, g = spec.value_and_grad(target, q)
    step_seed, _ = samplers.split_seed(samplers.sanitize_seed((3, 0)))  # as one_step does
    seeds = nuts.chain_seeds(step_seed, 30)
    uninterrupted = kernel._program(spec, batched=True)  # each chain's own seed stream
    x, r = x0, kernel.bootstrap_results(x0)
    for i in range(4):
        x, r = kernel.one_step(x, r, seed=(3, i))
        n = tf.constant(3 * (i + 1), tf.int32)
        want = uninterrupted(*kernel._arguments(spec, [x0], r.step_size, n, n, q, logp, g,
                                                 seeds))
        np.testing.assert_allclose(x, want[0], rtol=1e-5, atol=1e-5, err_msg=f"step {i}")
        np.testing.assert_array_equal(r.total_leapfrogs_taken, want[5])


def test_run_ahead_raises_utilization_past_the_per_step_ceiling():
    """Without running ahead a step costs at least as many batched gradients as its slowest
    chain needs (the ceiling of synchronizing every T trajectories); running ahead, the
    chains that finish early spend that time on their next trajectories."""
    calls = tf.Variable(0, dtype=tf.int64)
    target, x0 = _stiff_gaussian(lambda: calls.assign_add(1)), _stiff_start()
    result = {}
    for run_ahead in (False, True):
        kernel = NoUTurnSampler(target, step_size=0.08, num_trajectories_per_step=3,
                                run_ahead=run_ahead)
        x, r = x0, kernel.bootstrap_results(x0)
        calls.assign(0)
        slowest = 0
        for i in range(6):
            x, r = kernel.one_step(x, r, seed=(3, i))
            slowest += int(np.max(np.asarray(r.leapfrogs_taken)))
        needed = np.sum(np.asarray(r.total_leapfrogs_taken))  # only the returned trajectories
        result[run_ahead] = (needed / (int(calls.numpy()) * 30), needed / (slowest * 30))
    (plain, ceiling), (ahead, _) = result[False], result[True]
    assert plain <= ceiling + 1e-9
    assert ahead > ceiling + 0.05, result


def test_divergence_is_flagged_and_state_kept():
    kernel = NoUTurnSampler(lambda x: -0.5 * tf.reduce_sum(x * x, -1) / 0.01, step_size=5.0,
                            max_energy_diff=10.0, runtime="local_static")
    x = tf.fill([3, 2], 0.3)
    new, r = kernel.one_step(x, kernel.bootstrap_results(x), seed=(0, 1))
    assert np.all(r.has_divergence) and not np.any(r.is_accepted)
    np.testing.assert_array_equal(new, x)
    np.testing.assert_array_equal(r.leapfrogs_taken, [1, 1, 1])


def test_max_tree_depth_is_reached_with_tiny_steps():
    kernel = NoUTurnSampler(lambda x: -0.5 * tf.reduce_sum(x * x, -1), step_size=1e-3,
                            max_tree_depth=3, runtime="local_static")
    x = tf.fill([2, 2], 1.0)
    _, r = kernel.one_step(x, kernel.bootstrap_results(x), seed=(0, 2))
    assert np.all(r.reach_max_depth) and not np.any(r.has_divergence)
    np.testing.assert_array_equal(r.leapfrogs_taken, [7, 7])  # 2**3 - 1 leaves


def test_kernel_protocol():
    kernel = NoUTurnSampler(lambda x: -tf.reduce_sum(x * x, -1), step_size=0.1, seed=3,
                            runtime="local_static")
    assert kernel.is_calibrated and kernel.parameters["max_tree_depth"] == 10
    x = tf.ones([2, 2])
    r = kernel.bootstrap_results(x)
    # No seed to one_step: the carried seed makes the step reproducible and advances.
    a, r1 = kernel.one_step(x, r)
    b, _ = kernel.one_step(x, r)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(np.asarray(r1.seed), np.asarray(r.seed))
    # copy() keeps compiled programs unless a parameter the program is built from changes.
    more = kernel.copy(num_trajectories_per_step=3)
    assert more._programs is kernel._programs and more.num_trajectories_per_step == 3
    assert kernel.copy(max_tree_depth=4)._programs is not kernel._programs


def test_default_scheduler_sweeps_unless_running_ahead():
    """By default the program counter sweeps the blocks (skipping those no chain waits at),
    whatever the target; run_ahead gathers the chains at the gradient (earliest); a scheduler
    given is kept."""
    target = lambda x: -0.5 * tf.reduce_sum(x * x, -1)
    assert NoUTurnSampler(target, 0.1)._scheduler() == "sweep_guarded"
    assert NoUTurnSampler(target, 0.1, run_ahead=True)._scheduler() == "earliest"
    for given in program_counter.SCHEDULERS:
        assert NoUTurnSampler(target, 0.1, scheduler=given)._scheduler() == given


@pytest.mark.parametrize("make, message", [
    (lambda: NoUTurnSampler(lambda x: x, 0.1, max_tree_depth=0), "max_tree_depth"),
    (lambda: NoUTurnSampler(lambda x: x, 0.1, runtime="gpu"), "runtime must be one of"),
    (lambda: NoUTurnSampler(lambda x: x, 0.1, scheduler="fifo"), "scheduler must be None or one of"),
    (lambda: NoUTurnSampler(lambda x: x, 0.1, unrolled_leapfrog_steps=0), "unrolled"),
    (lambda: NoUTurnSampler(lambda x: x, 0.1, num_trajectories_per_step=0), "num_trajectories"),
    (lambda: NoUTurnSampler(lambda x: x, 0.1, unrolled_subtree_depth=-1), "subtree_depth"),
    (lambda: NoUTurnSampler(lambda x: x, 0.1, unrolled_subtree_depth=1.5), "subtree_depth"),
    (lambda: NoUTurnSampler(lambda x: x, 0.1, run_ahead=True, runtime="local_static"),
     "run_ahead pauses"),
])
def test_bad_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_states_and_step_sizes():
    k = NoUTurnSampler(lambda x, y: -tf.reduce_sum(x * x, -1), step_size=0.1)
    with pytest.raises(TypeError, match="share one float dtype"):
        k.bootstrap_results([tf.ones([2, 1]), tf.ones([2, 1], tf.float64)])
    with pytest.raises(TypeError, match="floating point"):
        NoUTurnSampler(lambda x: x, 0.1).bootstrap_results(tf.ones([2, 1], tf.int32))
    with pytest.raises(ValueError, match=r"one value per chain"):
        NoUTurnSampler(lambda x: x[..., None] * tf.ones([3]), 0.1).bootstrap_results(
            tf.ones([2, 2]))
    with pytest.raises(ValueError, match=r"one value per chain"):
        NoUTurnSampler(lambda x: tf.reduce_sum(x, -1)[:1], 0.1).bootstrap_results(
            tf.ones([2, 2]))
    bad = NoUTurnSampler(lambda x: -tf.reduce_sum(x * x, -1), step_size=tf.ones([3]))
    x = tf.ones([2, 2])
    with pytest.raises(ValueError, match="does not broadcast"):
        bad.one_step(x, bad.bootstrap_results(x), seed=(1, 2))
    two = NoUTurnSampler(lambda x: -tf.reduce_sum(x * x, -1), step_size=[0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="expected 1 or 1 step sizes"):
        two.one_step(x, two.bootstrap_results(x), seed=(1, 2))


def test_python_runtime_refuses_graph_mode():
    k = NoUTurnSampler(lambda x: -tf.reduce_sum(x * x, -1), 0.1, runtime="python")
    x = tf.ones([2, 2])
    r = k.bootstrap_results(x)
    with pytest.raises(ValueError, match="eager"):
        tf.function(lambda: k.one_step(x, r, seed=(1, 1)))()


def test_random_streams_are_uniform_and_independent():
    """The counter-based generator: uniform marginals (DKWM) and uncorrelated split streams."""
    seeds = nuts.chain_seeds((5, 6), 20000)
    u = nuts._uniform(seeds, tf.float64).numpy()
    a, b = nuts._split(seeds, 2)
    ua, ub = nuts._uniform(a, tf.float64).numpy(), nuts._uniform(b, tf.float64).numpy()
    eps = np.sqrt(np.log(2 / 1e-4) / (2 * len(u)))
    for x in (u, ua, ub):
        x = np.sort(x)
        assert np.max(np.abs(x - (np.arange(len(x)) + 0.5) / len(x))) < eps
    for x, y in ((u, ua), (ua, ub), (u, ub)):
        assert abs(np.corrcoef(x, y)[0, 1]) < 4.5 / np.sqrt(len(u))
    z = nuts._normal(seeds[:2000], 10, tf.float64).numpy().ravel()
    assert abs(z.mean()) < 4.5 / np.sqrt(z.size) and abs(z.var() - 1) < 4.5 * np.sqrt(2 / z.size)


def _np_hash(seed, counter):
    """NumPy reference of the generator's hash (three MurmurHash3 finalizers, uint32 wrap)."""
    def fmix(x):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x85EBCA6B)
        x = x ^ (x >> np.uint32(13))
        x = x * np.uint32(0xC2B2AE35)
        return x ^ (x >> np.uint32(16))
    key = seed.astype(np.int32).view(np.uint32)
    k0, k1 = key[..., 0], key[..., 1]
    while np.ndim(counter) > k0.ndim:
        k0, k1 = k0[..., None], k1[..., None]
    with np.errstate(over="ignore"):
        x = fmix((counter * np.uint32(0x9E3779B9)) ^ k0)
        x = fmix(x + k1)
        return fmix(x ^ (k0 + np.uint32(0x7F4A7C15)))


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_random_bits_match_a_numpy_reference(mode):
    """Split seeds, uniforms and normals are exactly the documented hash of the seed (any
    rewrite of the generator must keep every draw's bits), eagerly and in graphs, where the
    hash is one function call (with and without XLA, which inlines it)."""
    seeds = np.random.default_rng(7).integers(-2**31, 2**31, size=(50, 2)).astype(np.int32)

    def draws(s):
        return (*nuts._split(s, 3), nuts._uniform(s, tf.float64), nuts._normal(s, 4, tf.float64))
    if mode != "eager":
        draws = tf.function(draws, jit_compile=mode == "xla", autograph=False)
    *got, uniform, normal = draws(tf.constant(seeds))
    bits = _np_hash(seeds, np.arange(6, dtype=np.uint32)[None, :]).view(np.int32)
    for i, g in enumerate(got):
        np.testing.assert_array_equal(g.numpy(), bits[:, 2 * i:2 * i + 2])
    u = (((_np_hash(seeds, np.uint32(1 << 31)) >> np.uint32(8)).astype(np.float64) + 0.5)
         * 2.0 ** -24)
    np.testing.assert_array_equal(uniform.numpy(), u)
    idx = np.arange(1, 5, dtype=np.uint32)[None, :]
    u1, u2 = (((_np_hash(seeds, 2 * idx + j + np.uint32(1 << 31)) >> np.uint32(8))
               .astype(np.float64) + 0.5) * 2.0 ** -24 for j in (0, 1))
    np.testing.assert_allclose(normal.numpy(),
                               np.sqrt(-2 * np.log(u1)) * np.cos(2 * np.pi * u2), rtol=1e-12)


def test_a_subtree_merge_is_one_call_in_a_graph_with_the_eager_values():
    """The merge of two subtrees (its hash and U-turn checks inside) is traced once per
    signature: a second use in a graph adds a call, not its operations again, and computes
    what the plain function computes eagerly, on random values."""
    rng = np.random.default_rng(3)
    chains, dim = 7, 5

    def values(kinds: str) -> list:
        """Random per-chain values: v a [chains, dim] vector, r a real, i a count, f a flag."""
        make = {"v": lambda: rng.normal(size=(chains, dim)), "r": lambda: rng.normal(size=chains),
                "i": lambda: rng.integers(1, 4, chains).astype(np.int32),
                "f": lambda: rng.random(chains) < 0.5}
        return [tf.constant(make[k]()) for k in kinds]
    first = values("vvrrvvvrrif")        # qp1 .. div1
    second = values("vvvrvvrrvvrriff")   # q2 .. div2
    seed = tf.constant(rng.integers(-2**31, 2**31, (chains, 2)), tf.int32)
    args = (seed, *first, *second)
    expected = nuts._merge_subtrees.__wrapped__(*args)

    @tf.function(autograph=False)
    def twice(*a):
        graph = tf.compat.v1.get_default_graph()
        once = nuts._merge_subtrees(*a)
        before = len(graph.get_operations())
        again = nuts._merge_subtrees(*a)
        added = len(graph.get_operations()) - before
        assert added <= 2, f"the second merge added {added} operations"
        return once, again
    for got in twice(*args):
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g.numpy(), e.numpy())


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_values_computed_once_are_unchanged(mode):
    """The fusion stop on per-chain predicates and seeds is the identity on every value:
    random flags and int32 values, the extremes and zero included."""
    rng = np.random.default_rng(11)
    flags = rng.random(257) < 0.5
    ints = np.concatenate([rng.integers(-2**31, 2**31, 250),
                           [0, 1, -1, 2**31 - 1, -2**31, 2**31 - 2, -2**31 + 1]]).astype(np.int32)
    fn = nuts._computed_once
    if mode != "eager":
        fn = tf.function(fn, jit_compile=mode == "xla", autograph=False)
    np.testing.assert_array_equal(fn(tf.constant(flags)).numpy(), flags)
    np.testing.assert_array_equal(fn(tf.constant(ints)).numpy(), ints)
    for dtype, bits in ((np.float32, np.int32), (np.float64, np.int64)):
        info = np.finfo(dtype)
        floats = np.concatenate([rng.normal(size=250) * 10.0 ** rng.integers(-30, 30, 250),
                                 [0.0, -0.0, np.inf, -np.inf, np.nan, info.max, info.min,
                                  info.tiny, info.tiny / 4, -info.tiny / 8]]).astype(dtype)
        got = fn(tf.constant(floats)).numpy()
        np.testing.assert_array_equal(got.view(bits), floats.view(bits))  # bit for bit


def test_a_float_value_used_four_times_is_computed_once_under_xla():
    """A momentum read by four consumers (both trajectory ends, the summed momentum, the
    kinetic energy) is computed once: without the fusion stop, XLA fuses its 40
    multiplications into each consumer."""
    def momentum(x):
        for _ in range(40):
            x = x * 1.001 - 0.01
        return x

    def uses(x, stop=nuts._computed_once):
        p = stop(momentum(x))
        return p + 1.0, p - 2.0, tf.abs(p), tf.reduce_sum(tf.square(p), -1)
    x = tf.constant(np.random.default_rng(6).normal(size=(64, 16)), tf.float32)
    compiled = tf.function(lambda x: uses(x), jit_compile=True, autograph=False)
    hlo = compiled.experimental_get_compiler_ir(x)(stage="optimized_hlo")
    assert _instruction_count(hlo, "multiply") <= 41, hlo  # the chain once, and the square
    # the values are the stop's input (bit for bit: the abs); what its consumers compute
    # from them may round differently from the fused program (XLA folds and contracts
    # arithmetic across what it fuses)
    fused = tf.function(lambda x: uses(x, tf.identity), jit_compile=True, autograph=False)
    for got, want in zip(compiled(x), fused(x)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(compiled(x)[2].numpy(), fused(x)[2].numpy())


@pytest.mark.parametrize("per_step", [1, 3])
def test_no_momentum_is_drawn_after_a_calls_last_trajectory(monkeypatch, per_step):
    """A step's chains draw one momentum per trajectory they run: none for a trajectory
    after the step's last, which the next step would not use (it starts from its own
    seeds)."""
    draws = []

    def counted(seed, q):
        draws.append(int(q.shape[0]))
        return draw(seed, q)
    draw = nuts._draw_trajectory
    monkeypatch.setattr(nuts, "_draw_trajectory", counted)
    kernel = NoUTurnSampler(_two_part_log_prob, step_size=0.3, runtime="python",
                            num_trajectories_per_step=per_step)
    state = _two_part_state()
    kernel.one_step(state, kernel.bootstrap_results(state), seed=(4, 1))
    assert sum(draws) == CHAINS * per_step


def _instruction_count(hlo: str, op: str) -> int:
    """How many ``op`` instructions optimized HLO text has (fused computations included)."""
    return len(re.findall(rf"= \S+ {op}\(", hlo))


def test_a_per_chain_predicate_is_computed_once_under_xla():
    """A per-chain predicate selecting between [chains, dim] values is computed once per
    chain, not once per column and select: XLA fuses cheap elementwise work into every
    consumer, so without the fusion stop the predicate's 40 multiplications appear once in
    each of the two selects' fusions (and run for each of the 16 columns)."""
    def predicate(x):
        for _ in range(40):
            x = x * 1.001 - 0.01
        return x > 0

    def selects(x, a, b):
        return nuts._where_each(predicate(x), (a, b), (b, a))
    rng = np.random.default_rng(5)
    x, a, b = (tf.constant(rng.normal(size=s), tf.float32) for s in ((64,), (64, 16), (64, 16)))
    compiled = tf.function(selects, jit_compile=True, autograph=False)
    hlo = compiled.experimental_get_compiler_ir(x, a, b)(stage="optimized_hlo")
    assert _instruction_count(hlo, "multiply") == 40, hlo
    for got, want in zip(compiled(x, a, b), (np.where(predicate(x).numpy()[:, None], a, b),
                                             np.where(predicate(x).numpy()[:, None], b, a))):
        np.testing.assert_array_equal(got.numpy(), want)
