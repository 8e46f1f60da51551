"""Variables inside pfor bodies (§3.8): reads are loop-invariant, assign_add/sub reduce first,
other writes of loop-variant values are errors naming the op."""
import numpy as np
import pytest
import tensorflow as tf

import tfx_vec
from tests.pfor.oracle import check_pfor
from tests.support import random_array

RNG = np.random.default_rng(11)
X = tf.constant(random_array(RNG, [6, 3], np.float32))


def test_variable_reads_and_resource_gather_are_exact():
    w = tf.Variable(random_array(RNG, [3, 4], np.float32))
    table = tf.Variable(random_array(RNG, [10, 3], np.float32))
    ids = tf.constant([[1, 4], [9, 0], [3, 3], [2, 8], [5, 6], [7, 1]])

    def body(i):
        emb = tf.reduce_sum(tf.gather(table, tf.gather(ids, i)), axis=0)
        return tf.linalg.matvec(w, tf.gather(X, i) + emb, transpose_a=True)
    check_pfor(body, 6, modes=("eager", "dynamic"))


@pytest.mark.parametrize("method,sign", [("assign_add", 1.0), ("assign_sub", -1.0)])
def test_accumulating_writes_reduce_then_apply_once(method, sign):
    v = tf.Variable(tf.ones([3]))

    def body(i):
        getattr(v, method)(tf.gather(X, i))       # loop-variant: summed over iterations
        getattr(v, method)(tf.constant([1.0, 2.0, 3.0]))  # invariant: applied n times
        return tf.constant(0.0)
    tfx_vec.pfor(body, 6, fallback_to_while_loop=False)
    expected = 1.0 + sign * (X.numpy().sum(0) + 6 * np.array([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(v.numpy(), expected, rtol=1e-5)


def test_assign_of_invariant_value_is_one_write():
    v = tf.Variable(tf.zeros([3]))

    def body(i):
        v.assign(tf.constant([4.0, 5.0, 6.0]))
        return tf.gather(X, i) * 2.0
    out = tfx_vec.pfor(body, 6, fallback_to_while_loop=False)
    np.testing.assert_allclose(v.numpy(), [4.0, 5.0, 6.0])
    np.testing.assert_allclose(out.numpy(), X.numpy() * 2.0, rtol=1e-6)


def test_assign_of_loop_variant_value_is_an_error_naming_the_op():
    v = tf.Variable(tf.zeros([3]))

    def body(i):
        v.assign(tf.gather(X, i))
        return tf.constant(0.0)
    with pytest.raises(tfx_vec.VectorizationError, match="AssignVariableOp"):
        tfx_vec.pfor(body, 6)


def test_scatter_add_of_loop_variant_value_is_an_error():
    v = tf.Variable(tf.zeros([6, 3]))

    def body(i):
        v.scatter_add(tf.IndexedSlices(tf.gather(X, i)[None], i[None]))
        return tf.constant(0.0)
    with pytest.raises(tfx_vec.VectorizationError, match="ResourceScatterAdd"):
        tfx_vec.pfor(body, 6)
