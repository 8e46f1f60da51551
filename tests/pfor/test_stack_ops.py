"""TF1 resource stacks (StackV2 and its push/pop/close) in and around the loop body."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.ops import data_flow_ops as stacks

import tfx_vec
from tests.pfor.oracle import check_pfor


def _push_all(s, values):
    """Push ``values`` in order; returns the last push (later ops depend on it)."""
    op = None
    for v in values:
        with tf.control_dependencies([op] if op is not None else []):
            op = stacks.stack_push_v2(s, v)
    return op


def _pop_n(s, k, after, dtype=tf.float32):
    """Pop ``k`` values in order, the first after ``after``."""
    out = []
    for _ in range(k):
        with tf.control_dependencies([after]):
            after = stacks.stack_pop_v2(s, elem_type=dtype)
        out.append(after)
    return out


def _body(x, c):
    def loop_fn(i):
        s = stacks.stack_v2(max_size=4, elem_type=tf.float32)
        xi = tf.gather(x, i)
        last = _push_all(s, [xi, c, c * 3.0, tf.sin(xi)])
        popped = _pop_n(s, 4, last)
        with tf.control_dependencies(popped):
            close = stacks.stack_close_v2(s)
        with tf.control_dependencies([close]):
            return [tf.identity(p) for p in popped]
    return loop_fn


def test_stack_in_body_pushes_invariant_then_variant_values_as_the_loop(rng):
    x = tf.constant(rng.normal(size=(5, 3)), tf.float32)
    c = tf.constant(rng.normal(size=(3,)), tf.float32)

    def loop_fn(i):
        s = stacks.stack_v2(max_size=3, elem_type=tf.float32)
        xi = tf.gather(x, i)
        last = _push_all(s, [xi * 2.0, c, xi + c])
        return _pop_n(s, 3, last)
    check_pfor(loop_fn, 5)


def test_stack_in_body_with_only_invariant_pushes(rng):
    c = tf.constant(rng.normal(size=(2, 3)), tf.float32)

    def loop_fn(i):
        s = stacks.stack_v2(max_size=2, elem_type=tf.float32)
        last = _push_all(s, [c, c * 2.0])
        a, b = _pop_n(s, 2, last)
        return a - b, b + tf.cast(i, tf.float32)
    check_pfor(loop_fn, 4)


def test_tf1_graph_stack_in_body_matches_the_unrolled_loop(rng):
    xv = rng.normal(size=(4, 2)).astype(np.float32)
    cv = rng.normal(size=(2,)).astype(np.float32)
    with tf.Graph().as_default():
        x, c = tf.constant(xv), tf.constant(cv)
        loop_fn = _body(x, c)
        out = tfx_vec.pfor(loop_fn, 4, fallback_to_while_loop=False)
        expected = [tf.stack(vals) for vals in
                    zip(*[loop_fn(tf.constant(i)) for i in range(4)])]
        with tf.compat.v1.Session() as sess:
            got, want = sess.run([out, expected])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def _outside_stack(values):
    s = stacks.stack_v2(max_size=len(values), elem_type=tf.float32)
    return s, _push_all(s, values)


def test_tf1_graph_pops_of_a_stack_made_outside_run_once_for_all_iterations(rng):
    vals = rng.normal(size=(3, 2)).astype(np.float32)
    x = rng.normal(size=(4, 2)).astype(np.float32)
    with tf.Graph().as_default():
        s, pushed = _outside_stack([tf.constant(v) for v in vals])

        def loop_fn(i):
            top, below = _pop_n(s, 2, pushed)
            return top * tf.gather(x, i), below
        with tf.control_dependencies([pushed]):
            scaled, below = tfx_vec.pfor(loop_fn, 4, fallback_to_while_loop=False)
        with tf.control_dependencies([scaled, below]):
            rest = stacks.stack_pop_v2(s, elem_type=tf.float32)
        with tf.compat.v1.Session() as sess:
            scaled, below, rest = sess.run([scaled, below, rest])
    # Every iteration sees the stack as it was before the loop (as in TensorFlow's pfor).
    np.testing.assert_allclose(scaled, vals[2] * x, rtol=1e-6)
    np.testing.assert_array_equal(below, np.stack([vals[1]] * 4))
    np.testing.assert_array_equal(rest, vals[0])


def test_tf1_graph_push_to_a_stack_made_outside_is_an_error(rng):
    with tf.Graph().as_default():
        s, _ = _outside_stack([tf.constant(rng.normal(size=2), tf.float32)])
        with pytest.raises(tfx_vec.VectorizationError, match="StackPushV2 not allowed"):
            tfx_vec.pfor(lambda i: stacks.stack_push_v2(s, tf.cast(i, tf.float32)), 2)


def test_tf1_graph_chunked_pop_of_a_stack_made_outside_is_an_error(rng):
    with tf.Graph().as_default():
        s, pushed = _outside_stack([tf.constant(v, tf.float32) for v in rng.normal(size=3)])
        with pytest.raises(tfx_vec.VectorizationError, match="once per chunk"):
            tfx_vec.pfor(lambda i: _pop_n(s, 1, pushed)[0], 4, parallel_iterations=2)


def test_variant_push_after_invariant_push_is_an_error(rng):
    c = tf.constant(rng.normal(size=(2,)), tf.float32)

    def loop_fn(i):
        s = stacks.stack_v2(max_size=2, elem_type=tf.float32)
        return _push_all(s, [c, c * tf.cast(i, tf.float32)])
    with pytest.raises(tfx_vec.VectorizationError, match="earlier received a loop-invariant"):
        tfx_vec.pfor(loop_fn, 3)


def _push_pop_under_cond(x: tf.Tensor):
    """A body that pushes and pops its own stack in a branch taken by some iterations only."""
    def loop_fn(i):
        s = stacks.stack_v2(max_size=1, elem_type=tf.float32)
        xi = tf.gather(x, i)
        return tf.cond(xi > 0, lambda: _pop_n(s, 1, stacks.stack_push_v2(s, xi))[0],
                       lambda: xi)
    return loop_fn


def test_stack_under_a_loop_variant_cond_is_an_error(rng):
    loop_fn = _push_pop_under_cond(tf.constant(rng.normal(size=(3,)), tf.float32))
    with pytest.raises(tfx_vec.VectorizationError, match="lock step"):
        tfx_vec.pfor(loop_fn, 3, fallback_to_while_loop=False)


def test_stack_under_a_masked_cond_under_xla_is_an_error(rng):
    loop_fn = _push_pop_under_cond(tf.constant(rng.normal(size=(3,)), tf.float32))
    run = tf.function(lambda: tfx_vec.pfor(loop_fn, 3, fallback_to_while_loop=False),
                      jit_compile=True, autograph=False)
    with pytest.raises(tfx_vec.VectorizationError, match="StackPushV2.*lock step"):
        run()
