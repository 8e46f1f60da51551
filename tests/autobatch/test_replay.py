"""Primitive traces kept from type inference and replayed into the runtime's graph: same
results as tracing again, the user's Python run once per function trace, and never a trace
replayed into a later trace (where the Python state it read may have changed)."""
import numpy as np
import pytest
import tensorflow as tf

from tests.autobatch.programs import reference
from tfx_vec import autobatch as ab
from tfx_vec.autobatch import replay

CALLS = []
SCALE = [3]


def triple(x):
    CALLS.append(1)
    return x * SCALE[0]


def _grow():
    """A new batched function each time: no types kept from another test."""
    @ab.function
    def grow(n, limit):
        while n < limit:
            n = triple(n) + 1
        return n
    return grow


def _ints(seed):
    rng = np.random.default_rng(seed)
    return (tf.constant(rng.integers(1, 9, 7), tf.int32),
            tf.constant(rng.integers(50, 900, 7), tf.int32))


@pytest.mark.parametrize("jit", [False, True])
def test_a_function_trace_runs_the_primitives_python_once_and_matches_the_reference(jit):
    n, limit = _ints(1)
    grow = _grow()
    CALLS.clear()
    got = tf.function(lambda a, b: grow(a, b), jit_compile=jit)(n, limit).numpy()
    # type inference traced `triple` once; the loop's block replayed that trace
    assert len(CALLS) == 1
    np.testing.assert_array_equal(got, reference(grow, n, limit))


def test_a_later_trace_reads_the_python_state_again():
    n, limit = _ints(2)
    grow = _grow()
    first = tf.function(lambda a, b: grow(a, b))(n, limit).numpy()
    SCALE[0] = 5
    try:
        # same signature: the types are kept, the trace of `triple` is not replayed here
        second = tf.function(lambda a, b: grow(a, b))(n, limit).numpy()
        np.testing.assert_array_equal(second, reference(grow, n, limit))
    finally:
        SCALE[0] = 3
    assert not np.array_equal(first, second)


def test_tensors_of_the_enclosing_function_are_captured_by_the_replayed_trace():
    n, limit = _ints(3)

    @tf.function(jit_compile=True, autograph=False)
    def f(a, b, k):
        step = k * 2  # a tensor of this function's graph, read inside the loop's block

        @ab.function
        def climb(x, top):
            while x < top:
                x = x + step
            return x
        return climb(a, b)

    got = f(n, limit, tf.constant(3)).numpy()
    np.testing.assert_array_equal(got, np.where(n < limit, n + 6 * -(-(limit - n) // 6), n))


def test_a_trace_whose_outputs_include_an_input_and_a_literal_replays_them():
    def split(x):
        return x, x + 1, 7

    @tf.function(autograph=False)
    def f(v):
        from tensorflow.python.framework import func_graph
        with func_graph.FuncGraph("types").as_default() as g:
            x = tf.compat.v1.placeholder(tf.int32, [3])
            replay.record(split, g, [x], split(x))
        return replay.replay(split, [v])

    a, b, c = f(tf.constant([4, 5, 6]))
    assert a.numpy().tolist() == [4, 5, 6] and b.numpy().tolist() == [5, 6, 7] and c == 7
    assert replay.stateless_function(split)


def test_a_primitive_with_its_own_tf_control_flow_replays_right():
    # the kept trace holds functions of its own (the cond's branches, the loop's body)
    def settle(x):
        x = tf.cond(tf.reduce_all(x > 0), lambda: x + 1, lambda: x - 1)
        return tf.while_loop(lambda v: tf.reduce_any(v % 5 != 0),
                             lambda v: (v + tf.cast(v % 5 != 0, v.dtype),), (x,))[0]

    n, limit = _ints(4)
    for jit in (False, True):
        @ab.function
        def walk(n, limit):
            while n < limit:
                n = settle(n) + 2
            return n

        got = tf.function(lambda a, b: walk(a, b), jit_compile=jit)(n, limit).numpy()
        np.testing.assert_array_equal(got, reference(walk, n, limit))
