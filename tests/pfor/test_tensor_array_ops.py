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
