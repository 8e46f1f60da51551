"""Control flow inside pfor bodies (§3.6, §3.7) against the per-iteration loop."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import tensorflow as tf

import tfx_vec
from tests.pfor.oracle import check_pfor, reference, assert_all_close
from tests.support import random_array
from tfx_vec.pfor import vectorizer

RNG = np.random.default_rng(3)
X = tf.constant(random_array(RNG, [5, 4], np.float32))
LENS = tf.constant([3, 0, 5, 1, 2], tf.int32)
FAST = ("eager", "dynamic")


def _row(i):
    return tf.gather(X, i)


def test_cond_loop_variant_predicate_partitions():
    def f(i):
        xi = _row(i)
        return tf.cond(tf.reduce_sum(xi) > 0.0,
                       lambda: (xi * 2.0, tf.cast(i, tf.float32)),
                       lambda: (xi - 1.0, tf.constant(7.0)))
    check_pfor(f, 5)


def test_cond_loop_invariant_predicate_keeps_one_cond():
    flag = tf.constant(True)

    def f(i):
        xi = _row(i)
        return tf.cond(flag, lambda: xi * 3.0, lambda: tf.ones([4]))
    check_pfor(f, 5, modes=FAST)


def test_switch_case_variant_index_out_of_range_runs_default():
    def f(i):
        xi = _row(i)
        return tf.switch_case(i - 1, [lambda: xi + 1.0, lambda: xi * xi, lambda: -xi])
    check_pfor(f, 5, modes=FAST)


def test_while_loop_variant_trip_count():
    def f(i):
        xi = _row(i)
        _, acc = tf.while_loop(lambda k, a: k < tf.gather(LENS, i),
                               lambda k, a: (k + 1, a * 1.5 + tf.cast(k, tf.float32)),
                               (0, xi))
        return acc
    check_pfor(f, 5)


def test_while_loop_invariant_condition_variant_body():
    def f(i):
        _, acc, count = tf.while_loop(lambda k, a, c: k < 3,
                                      lambda k, a, c: (k + 1, tf.sin(a) + a, c + 1),
                                      (0, _row(i), 10))
        return acc, count
    check_pfor(f, 5, modes=FAST)



def test_constant_filled_loop_variables_become_stacked_by_filling():
    """Invariant Fill/ZerosLike/OnesLike initial values that the body makes loop-variant
    (like while-gradient accumulators) are stacked with a fill, not a Tile."""
    dims = tf.constant([2, 4])

    def f(i):
        xi = _row(i)
        inits = (tf.zeros(dims), tf.fill(dims, 2.5), tf.ones_like(X[:2]), tf.zeros_like(X[:2]))
        _, *accs = tf.while_loop(lambda k, *a: k < 3,
                                 lambda k, *a: (k + 1,) + tuple(v * 0.5 + xi for v in a),
                                 (0,) + inits)
        return accs
    check_pfor(f, 5, modes=FAST)
    graph = tf.function(lambda: tfx_vec.pfor(f, 5)).get_concrete_function().graph
    tiled = [op for op in graph.get_operations()
             if op.type == "Tile" and op.outputs[0].shape.rank == 3]
    assert not tiled, [op.name for op in tiled]


@pytest.mark.parametrize("init", [[[0.0, -0.0], [0.0, 0.0]], [[1.5, 1.5], [1.5, 2.5]]])
def test_non_uniform_constant_loop_variable_is_tiled_exactly(init):
    """A constant mixing 0.0 and -0.0 (or differing values) is not filled with one value."""
    def f(i):
        scale = 1.0 + tf.cast(i, tf.float32)
        _, a = tf.while_loop(lambda k, a: k < 2, lambda k, a: (k + 1, a * scale),
                             (0, tf.constant(init)))
        return a
    got, want = tfx_vec.pfor(f, 3).numpy(), reference(f, 3)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))

def test_nested_cond_in_while_and_while_in_cond():
    def f(i):
        xi = _row(i)

        def body(k, a):
            a = tf.cond(tf.reduce_max(a) > 1.0, lambda: a * 0.5, lambda: a + 0.25)
            return k + 1, a
        _, a = tf.while_loop(lambda k, a: k < tf.gather(LENS, i), body, (0, xi))
        return tf.cond(i % 2 == 0,
                       lambda: tf.while_loop(lambda k, b: k < i, lambda k, b: (k + 1, b + a),
                                             (0, a))[1],
                       lambda: a)
    check_pfor(f, 5, modes=FAST)


def test_tensor_array_scan_and_map_fn_in_body():
    def f(i):
        xi = _row(i)
        ta = tf.TensorArray(tf.float32, size=0, dynamic_size=True)

        def body(k, ta, a):
            a = a * 1.1 + 1.0
            return k + 1, ta.write(k, a), a
        _, ta, _ = tf.while_loop(lambda k, ta, a: k < 3, body, (0, ta, xi))
        scanned = tf.scan(lambda c, e: c * e + 1.0, xi, initializer=tf.constant(1.0))
        mapped = tf.map_fn(lambda e: e * e, xi)
        return ta.stack(), scanned, mapped, ta.read(1)
    check_pfor(f, 5, modes=FAST)


def test_tensor_array_through_loop_variant_cond_runs_per_iteration():
    def f(i):
        ta = tf.TensorArray(tf.float32, size=2, clear_after_read=False)
        ta = ta.write(0, _row(i)).write(1, _row(i) * 2.0)
        ta = tf.cond(i % 2 == 0, lambda: ta.write(1, -_row(i)), lambda: ta)
        return ta.stack()
    with pytest.raises(tfx_vec.VectorizationError, match="If"):
        tfx_vec.pfor(f, 5, fallback_to_while_loop=False)
    assert_all_close(tfx_vec.pfor(f, 5).numpy(), reference(f, 5), 1e-6, 1e-6, "cond of lists")


def test_tensor_array_read_at_loop_variant_index():
    def f(i):
        table = tf.TensorArray(tf.float32, size=5, clear_after_read=False).unstack(X * 3.0)
        return table.read(4 - i) * 2.0 + table.read(1)
    check_pfor(f, 5, modes=FAST)


def test_tf_function_called_from_body():
    @tf.function
    def inner(a, k):
        return tf.nn.relu(a) * tf.cast(k, tf.float32) + 1.0

    check_pfor(lambda i: inner(_row(i), i), 5, modes=FAST)


def test_nested_pfor():
    def f(i):
        return tfx_vec.pfor(lambda j: _row(i) * tf.cast(j + 1, tf.float32), 3)
    check_pfor(f, 5, modes=FAST)


def test_jit_compile_uses_masked_cond_and_while():
    def f(i):
        xi = _row(i)
        c = tf.cond(tf.reduce_sum(xi) > 0.0, lambda: xi * 2.0, lambda: xi - 1.0)
        _, w = tf.while_loop(lambda k, a: k < tf.gather(LENS, i),
                             lambda k, a: (k + 1, a + c), (0, xi))
        return tf.switch_case(i % 3, [lambda: w, lambda: w * w, lambda: -w])

    @tf.function(jit_compile=True)
    def run():
        return tfx_vec.pfor(f, 5, fallback_to_while_loop=False)
    np.testing.assert_allclose(run().numpy(), reference(f, 5), rtol=1e-5, atol=1e-5)
    # The same body without XLA partitions (dynamic shapes): both forms agree.
    np.testing.assert_allclose(tfx_vec.pfor(f, 5, fallback_to_while_loop=False).numpy(),
                               reference(f, 5), rtol=1e-5, atol=1e-5)


def test_loop_variant_tensor_list_in_variant_loop_is_vectorized():
    """Lists carried by a loop with per-iteration trip counts get per-row element counts
    (more cases in test_lists_ragged.py)."""
    def f(i):
        ta = tf.TensorArray(tf.float32, size=0, dynamic_size=True)
        _, ta = tf.while_loop(lambda k, ta: k < tf.gather(LENS, i) + 1,
                              lambda k, ta: (k + 1, ta.write(0, _row(i) * tf.cast(k, tf.float32))),
                              (0, ta))
        return ta.read(0)
    vectorizer.reset_fallbacks()
    got = tfx_vec.pfor(f, 5, fallback_to_while_loop=False).numpy()
    assert_all_close(got, reference(f, 5), 1e-5, 1e-5, "per-row counts")
    assert not vectorizer.fallback_report()


@settings(max_examples=4)
@given(n=st.integers(1, 6), d=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_random_shapes_cond_and_while(n, d, seed):
    rng = np.random.default_rng(seed)
    x = tf.constant(random_array(rng, [n, d], np.float32))
    lens = tf.constant(rng.integers(0, 4, size=[n]).astype(np.int32))

    def f(i):
        xi = tf.gather(x, i)
        _, a = tf.while_loop(lambda k, a: k < tf.gather(lens, i),
                             lambda k, a: (k + 1, tf.cond(tf.reduce_sum(a) > 0.0,
                                                          lambda: a * 0.5, lambda: a + 1.0)),
                             (0, xi))
        return a
    check_pfor(f, n, modes=("eager",))
