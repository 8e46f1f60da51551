"""ab.on_active_members: a marked function is computed for the members a block runs for only
(gathered in chunks, scattered back), with the results of computing every member; elsewhere it
is the function itself."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tfx_vec import autobatch as ab
from tfx_vec.autobatch import gathered

CHUNK_ROWS: list[int] = []  # the leading dimension each trace of `step` saw


def step(x, v, k, scale):
    """Several outputs of several dtypes and ranks, a shared number among the arguments."""
    CHUNK_ROWS.append(x.shape[0])
    v = v * scale + tf.sin(x)[:, None]
    return x * 0.5 + tf.reduce_sum(v, -1) * 0.01, v, k + 1, tf.reduce_sum(v, -1) > 0.0


gathered_step = ab.on_active_members(step, chunks=3, min_batch=1)


@ab.function
def walk(x, v, limit):
    """Members leave the loop at different iterations: the block calling ``step`` runs for a
    different set of members every loop step."""
    k = tf.zeros_like(limit)
    up = x > 100.0
    while k < limit:
        x, v, k, up = gathered_step(x, v, k, 1.5)
    return x, v, k, up


@ab.function
def walk_unmarked(x, v, limit):
    k = tf.zeros_like(limit)
    up = x > 100.0
    while k < limit:
        x, v, k, up = step(x, v, k, 1.5)
    return x, v, k, up


def _arguments(batch, seed):
    rng = np.random.default_rng(seed)
    return (tf.constant(rng.normal(size=batch).astype(np.float32)),
            tf.constant(rng.normal(size=(batch, 3)).astype(np.float32)),
            tf.constant(rng.integers(0, 5, size=batch).astype(np.int32)))


def _assert_same(got, want):
    for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


@settings(max_examples=8, deadline=None)
@given(batch=st.integers(1, 13), seed=st.integers(0, 2 ** 16),
       opts=st.sampled_from([{}, {"jit_compile": True},
                             {"jit_compile": True, "scheduler": "sweep_guarded"}]))
def test_gathered_runs_give_each_members_own_results(batch, seed, opts):
    """Against each member run alone (the unbatched reference) and the unmarked program, on
    random batches (not a multiple of the chunks, some members never entering the loop), in
    a graph and under XLA with two schedulers."""
    args = _arguments(batch, seed)
    got = walk(*args, **opts)
    _assert_same(got, walk_unmarked(*args, **opts))
    for b in range(batch):
        one = walk.unbatched(*(a[b:b + 1] for a in args))
        _assert_same([g[b:b + 1] for g in got], one)


ROWS = tf.Variable(0)  # rows `_count` computed


@ab.on_active_members(chunks=3, min_batch=1)
def _count(x):
    ROWS.assign_add(tf.shape(x)[0])
    return x + 1.0


@ab.function
def counted(x, limit):
    k = tf.zeros_like(limit)
    while k < limit:
        x = _count(x)
        k += 1
    return x


def test_only_chunks_holding_active_members_are_computed():
    """Nine members, chunks of three: one active member costs one chunk, four cost two, and
    the loop step after three of them left computes one chunk, not the members gone."""
    run = tf.function(counted, autograph=False)
    for chunks, limit in ((1, [0, 0, 1, 0, 0, 0, 0, 0, 0]), (2, [1, 0, 0, 1, 1, 0, 0, 0, 1]),
                          (3, [2, 0, 0, 1, 1, 0, 0, 0, 1])):  # 2 chunks, then 1
        ROWS.assign(0)
        out = run(tf.zeros([9]), tf.constant(limit))
        np.testing.assert_array_equal(out.numpy(), np.array(limit, np.float32))
        assert ROWS.numpy() == 3 * chunks


def test_outside_the_program_counter_it_is_the_function_itself():
    """Called directly, by the local-static runtime, below min_batch or in a TF1 graph, the
    function sees the whole batch."""
    args = _arguments(6, 1)
    want = walk_unmarked(*args)
    CHUNK_ROWS.clear()
    _assert_same(gathered_step(args[0], args[1], args[2], 1.5),
                 step(args[0], args[1], args[2], 1.5))
    _assert_same(walk(*args, runtime="local_static"), want)
    assert set(CHUNK_ROWS) == {6}
    big = ab.on_active_members(step, min_batch=7)
    with gathered.running_members(tf.ones([6], tf.bool)):
        CHUNK_ROWS.clear()
        tf.function(lambda: big(args[0], args[1], args[2], 1.5), autograph=False)()
        assert CHUNK_ROWS == [6]
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [6])
        with gathered.running_members(tf.ones([6], tf.bool)):
            CHUNK_ROWS.clear()
            gathered_step(x, tf.ones([6, 3]), tf.zeros([6], tf.int32), 1.5)
            assert CHUNK_ROWS == [6]


@ab.on_active_members(min_batch=1)
def _summed(x):
    return tf.reduce_sum(x)


@ab.function
def _bad(x):
    if x > 0:
        x = x + _summed(x)
    return x


def test_results_without_the_batch_dimension_are_refused():
    with pytest.raises(ab.PrimitiveError, match="on_active_members: _summed must return "
                                                "tensors whose leading dimension"):
        _bad(tf.constant([1.0, -2.0, 3.0, 4.0]))
    with pytest.raises(ValueError, match="chunks must be >= 1"):
        ab.on_active_members(step, chunks=0)
