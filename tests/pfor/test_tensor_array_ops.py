"""TF1 resource TensorArrays made outside the loop body and used inside it (graph mode)."""
import numpy as np
import pytest
import tensorflow as tf

import tfx_vec

R = tf.raw_ops


def _filled(values):
    ta, flow = R.TensorArrayV3(size=len(values), dtype=tf.float32, clear_after_read=False,
                               element_shape=[])
    return ta, R.TensorArrayScatterV3(handle=ta, indices=list(range(len(values))),
                                      value=values, flow_in=flow)


def test_reads_and_gathers_at_per_iteration_positions():
    with tf.Graph().as_default():
        ta, flow = _filled([1.0, 2.0, 3.0, 4.0])

        def loop_fn(i):
            read = R.TensorArrayReadV3(handle=ta, index=3 - i, flow_in=flow, dtype=tf.float32)
            both = R.TensorArrayGatherV3(handle=ta, indices=tf.stack([i, 0]), flow_in=flow,
                                         dtype=tf.float32)
            first = R.TensorArrayReadV3(handle=ta, index=0, flow_in=flow, dtype=tf.float32)
            return read, both, first
        read, both, first = tfx_vec.pfor(loop_fn, 3, fallback_to_while_loop=False)
        assert read.shape[0] == 3
        with tf.compat.v1.Session() as sess:
            read, both, first = sess.run([read, both, first])
    np.testing.assert_array_equal(read, [4.0, 3.0, 2.0])
    np.testing.assert_array_equal(both, [[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]])
    np.testing.assert_array_equal(first, [1.0, 1.0, 1.0])


def test_writes_and_scatters_at_per_iteration_positions():
    with tf.Graph().as_default():
        ta, flow = R.TensorArrayV3(size=6, dtype=tf.float32, clear_after_read=False)

        def loop_fn(i):
            x = tf.cast(i, tf.float32)
            f = R.TensorArrayWriteV3(handle=ta, index=i, value=x * 10.0, flow_in=flow)
            return R.TensorArrayScatterV3(handle=ta, indices=tf.reshape(i + 3, [1]),
                                          value=tf.reshape(x, [1]), flow_in=f)
        flows = tfx_vec.pfor(loop_fn, 3, fallback_to_while_loop=False)
        with tf.control_dependencies([flows]):
            out = R.TensorArrayGatherV3(handle=ta, indices=list(range(6)), flow_in=flow,
                                        dtype=tf.float32)
        with tf.compat.v1.Session() as sess:
            np.testing.assert_array_equal(sess.run(out), [0.0, 10.0, 20.0, 0.0, 1.0, 2.0])


def test_per_iteration_values_at_one_position_are_an_error():
    with tf.Graph().as_default():
        ta, flow = R.TensorArrayV3(size=2, dtype=tf.float32)
        with pytest.raises(tfx_vec.VectorizationError, match="TensorArrayWriteV3.*same position"):
            tfx_vec.pfor(lambda i: R.TensorArrayWriteV3(
                handle=ta, index=0, value=tf.cast(i, tf.float32), flow_in=flow), 2)


def _gradients_per_iteration(seed, through_array):
    """Per iteration ``i``: d(row i of ``sin(x) * w`` times ``v[i]``)/dx, with ``x`` passed
    through a TensorArray (``unstack``/``stack``/``read``) or not (the reference)."""
    rng = np.random.default_rng(seed)
    xv = rng.normal(size=(3, 2)).astype(np.float32)
    wv = rng.normal(size=(3, 2)).astype(np.float32)
    vv = rng.normal(size=(4, 2)).astype(np.float32)
    with tf.Graph().as_default():
        x, w, v = tf.constant(xv), tf.constant(wv), tf.constant(vv)
        if through_array:
            ta = tf.TensorArray(tf.float32, 3, clear_after_read=False).unstack(x)
            y, second = tf.sin(ta.stack()) * w, ta.read(1)
        else:
            y, second = tf.sin(x) * w, x[1]

        def loop_fn(i):
            vi = tf.gather(v, i)
            target = tf.reduce_sum(tf.gather(y, i % 3) * vi) + tf.reduce_sum(second * vi)
            return tf.gradients(target, x)[0]
        if through_array:
            out = tfx_vec.pfor(loop_fn, 4, fallback_to_while_loop=False)
            assert "TensorArrayGradWithShape" in {op.type for op in out.graph.get_operations()}
        else:
            out = tf.stack([loop_fn(tf.constant(i)) for i in range(4)])
        with tf.compat.v1.Session() as sess:
            return sess.run(out)


def test_gradients_through_an_array_made_outside_are_per_iteration(tf1_control_flow):
    got = _gradients_per_iteration(7, through_array=True)
    want = _gradients_per_iteration(7, through_array=False)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_gradient_of_a_read_at_a_per_iteration_position_is_an_error(tf1_control_flow):
    with tf.Graph().as_default():
        x = tf.constant(np.random.default_rng(5).normal(size=(3,)), tf.float32)
        ta = tf.TensorArray(tf.float32, 3, clear_after_read=False).unstack(x)
        with pytest.raises(tfx_vec.VectorizationError, match="same positions"):
            tfx_vec.pfor(lambda i: tf.gradients(ta.read(i) ** 2, x)[0], 3)
