"""pfor / vectorized_map behave as TensorFlow's: outputs (None, ops, sparse, composites),
inputs (composites, variables, size-1 broadcasting, unknown ranks), PforConfig, chunking by
``parallel_iterations``, tapes re-entered in the body, ``run_functions_eagerly``.

Every vectorized result is compared with the per-iteration loop (or TensorFlow's own
``for_loop`` semantics) on random values.
"""
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfx_vec
from tests.pfor.oracle import assert_all_close, check_pfor, reference
from tests.support import random_array

R = np.random.default_rng(17)


def arr(*shape, dtype=np.float32):
    return tf.constant(random_array(R, shape, dtype))


# {{{ outputs

def test_none_outputs_stay_none():
    x = arr(3, 2)
    out = tfx_vec.pfor(lambda i: (tf.gather(x, i) * 2.0, None, {"g": None}), 3)
    assert out[1] is None and out[2]["g"] is None
    assert_all_close(out[0], x.numpy() * 2, 1e-6, 1e-6, "tensor next to None")
    assert tfx_vec.pfor(lambda i: None, 2) is None


def test_a_returned_operation_runs_its_side_effects():
    v = tf.Variable(0.0)
    x = arr(4)
    out = tfx_vec.pfor(lambda i: v.assign_add(tf.gather(x, i)).op, 4)
    assert out is None                       # eagerly, as TF: an op is no value
    np.testing.assert_allclose(v.numpy(), x.numpy().sum(), rtol=1e-5)
    with tf.Graph().as_default():            # in a graph: an op that runs them
        w = tf.Variable(1.0)
        op = tfx_vec.pfor(lambda i: w.assign_add(tf.cast(i, tf.float32)).op, 3)
        assert isinstance(op, tf.Operation)
        with tf.compat.v1.Session() as sess:
            sess.run(w.initializer)
            sess.run(op)
            assert sess.run(w) == 4.0


def _dense(sp: tf.SparseTensor) -> np.ndarray:
    return tf.sparse.to_dense(tf.sparse.reorder(sp)).numpy()


@pytest.mark.parametrize("which", ["none", "indices", "values", "shape", "all"])
def test_sparse_outputs_gain_a_leading_iteration_dimension(which):
    """Iteration i's sparse tensor is row i of the result; the dense shape is the largest."""
    n = 4

    def loop_fn(i):
        i64 = tf.cast(i, tf.int64)
        idx = [[i64 % 3]] if which in ("indices", "all") else [[1]]
        val = [tf.cast(i, tf.float32) + 1.0] if which in ("values", "all") else [5.0]
        shape = [i64 + 3] if which in ("shape", "all") else [3]
        return tf.SparseTensor(idx, val, shape)
    out = tfx_vec.pfor(loop_fn, n)
    rows = [_dense(loop_fn(tf.constant(i))) for i in range(n)]
    width = max(r.shape[0] for r in rows)
    expected = np.stack([np.pad(r, [0, width - r.shape[0]]) for r in rows])
    np.testing.assert_array_equal(_dense(out), expected)
    np.testing.assert_array_equal(out.dense_shape.numpy(), expected.shape)


def test_indexed_slices_outputs_are_made_dense_with_a_warning():
    def loop_fn(i):
        return tf.IndexedSlices(tf.reshape(tf.cast(i, tf.float32), [1, 1]), tf.reshape(i, [1]),
                                tf.constant([3, 1]))
    with pytest.warns(UserWarning, match="IndexedSlices"):
        out = tfx_vec.pfor(loop_fn, 3)
    np.testing.assert_array_equal(out.numpy()[:, :, 0], np.diag([0.0, 1.0, 2.0]))


class Pair(tf.experimental.BatchableExtensionType):
    """A batchable extension type with two components of different shapes."""
    a: tf.Tensor
    b: tf.Tensor


def test_batchable_composites_are_batched_as_their_spec_says():
    x = arr(5, 3)
    out = tfx_vec.pfor(lambda i: Pair(a=tf.gather(x, i), b=tf.reduce_sum(tf.gather(x, i))), 5,
                       fallback_to_while_loop=False)
    assert isinstance(out, Pair)
    assert_all_close(out.a, x.numpy(), 1e-6, 1e-6, "a")
    assert_all_close(out.b, x.numpy().sum(1), 1e-5, 1e-5, "b")


def test_ragged_outputs_are_vectorized_when_components_agree():
    x = tf.constant(R.integers(0, 9, size=[3, 5]).astype(np.int32))
    lengths = tf.constant([[2, 3], [4, 1], [0, 5]])

    def loop_fn(i):
        return tf.RaggedTensor.from_row_lengths(tf.gather(x, i), tf.gather(lengths, i))
    out = tfx_vec.pfor(loop_fn, 3, fallback_to_while_loop=False)
    assert out.to_list() == [loop_fn(tf.constant(i)).to_list() for i in range(3)]


def test_non_batchable_composite_output_is_a_clear_error():
    class Plain(tf.experimental.ExtensionType):
        v: tf.Tensor
    with pytest.raises(ValueError, match="BatchableTypeSpec"):
        tfx_vec.pfor(lambda i: Plain(v=tf.cast(i, tf.float32)), 2)

# }}}


# {{{ inputs

def test_composite_elems_are_mapped_along_their_first_dimension():
    rt = tf.ragged.constant([[[1.0, 2.0], [3.0]], [[4.0], [5.0, 6.0]], [[7.0, 8.0], [9.0]]])
    got = tfx_vec.vectorized_map(lambda r: r.flat_values * 2.0, rt, fallback_to_while_loop=False)
    assert_all_close(got, np.array([[2, 4, 6], [8, 10, 12], [14, 16, 18]], np.float32),
                     0, 0, "ragged elems")
    pair = Pair(a=arr(4, 2), b=arr(4))
    got = tfx_vec.vectorized_map(lambda p: p.a * p.b, pair, fallback_to_while_loop=False)
    assert_all_close(got, pair.a.numpy() * pair.b.numpy()[:, None], 1e-6, 1e-6, "extension")
    sp = tf.sparse.from_dense(tf.constant([[0.0, 2.0], [3.0, 0.0], [0.0, 5.0]]))
    got = tfx_vec.vectorized_map(lambda s: tf.sparse.reduce_sum(s) + 1.0, sp)
    assert_all_close(got, np.array([3.0, 4.0, 6.0], np.float32), 0, 0, "sparse elems")
    uneven = tf.sparse.from_dense(tf.constant([[0.0, 2.0], [3.0, 4.0]]))   # 1 and 2 values
    with pytest.raises(tfx_vec.VectorizationError, match="DeserializeSparse.*ragged"):
        tfx_vec.vectorized_map(lambda s: tf.sparse.reduce_sum(s), uneven)


def test_truly_ragged_elems_are_a_clear_error_without_fallback():
    rt = tf.ragged.constant([[[1, 2], [3]], [[4]]])
    with pytest.raises(tfx_vec.VectorizationError, match="ragged"):
        tfx_vec.vectorized_map(lambda r: r.flat_values, rt, fallback_to_while_loop=False)


def test_variables_and_leading_ones_and_unknown_ranks():
    v = tf.Variable([1.0, 2.0, 3.0])
    assert tfx_vec.vectorized_map(lambda e: e + 1.0, v).numpy().tolist() == [2.0, 3.0, 4.0]
    a, b = tf.constant([3.0]), tf.constant([-2.0, 6.0, 9.0])
    got = tfx_vec.vectorized_map(lambda e: e[0] + e[1], (a, b))   # size 1 broadcasts
    assert got.numpy().tolist() == [1.0, 9.0, 12.0]
    unknown = tf.function(lambda t: tfx_vec.vectorized_map(lambda e: tf.reduce_sum(e * e), t),
                          input_signature=[tf.TensorSpec(None, tf.float32)])
    x = arr(4, 3)
    assert_all_close(unknown(x), (x.numpy() ** 2).sum(1), 1e-5, 1e-5, "unknown rank")
    dynamic = tf.function(lambda p, q: tfx_vec.vectorized_map(lambda e: e[0] * e[1], (p, q)),
                          input_signature=[tf.TensorSpec([None], tf.float32)] * 2)
    assert dynamic(a, b).numpy().tolist() == [-6.0, 18.0, 27.0]


def test_in_axes_mismatch_names_shapes_not_values():
    big = tf.zeros([50, 40])
    with pytest.raises(ValueError) as err:
        tfx_vec.vectorized_map(lambda e: e, (big, big), in_axes=(0, 0, 0))
    message = str(err.value)
    assert "float32[50, 40]" in message and len(message) < 400, message

# }}}


# {{{ config, chunking, options

def test_pfor_config_as_tf_passes_it():
    x, y = arr(4, 3, 2), arr(4, 3, 2)

    def loop_fn(i, pfor_config):
        xi, yi = tf.gather(x, i), tf.gather(y, i)
        mean = pfor_config.reduce(lambda p, q: tf.reduce_mean(p + q, axis=0), xi, yi)
        both = pfor_config.reduce(lambda p, q: (tf.reduce_max(p), tf.reduce_min(q)), xi, yi)
        return mean + xi, pfor_config.reduce_concat(xi), both
    mean, concat, (hi, lo) = tfx_vec.pfor(loop_fn, 4)
    xv, yv = x.numpy(), y.numpy()
    assert_all_close(mean, (xv + yv).mean(0) + xv, 1e-5, 1e-5, "reduce(fn, *args)")
    assert_all_close(concat, np.broadcast_to(xv, (4,) + xv.shape), 0, 0, "reduce_concat stacks")
    assert_all_close(hi, np.full(4, xv.max()), 0, 0, "tuple result")
    assert_all_close(lo, np.full(4, yv.min()), 0, 0, "tuple result")


def test_parallel_iterations_chunks_as_tf_and_refuses_what_tf_refuses():
    x = arr(8, 3)
    for p in (2, 3, 8, 10):
        got = tfx_vec.pfor(lambda i: tf.tanh(tf.gather(x, i)), 8, parallel_iterations=p)
        assert got.shape == (8, 3)
        assert_all_close(got, np.tanh(x.numpy()), 1e-6, 1e-6, f"parallel_iterations={p}")
    with pytest.raises(ValueError, match="positive integer"):
        tfx_vec.pfor(lambda i: i, 8, parallel_iterations=0)
    with pytest.raises(ValueError, match="for_loop"):
        tfx_vec.pfor(lambda i: i, 8, parallel_iterations=1)
    with pytest.raises(ValueError, match="parallel_iterations"):
        tfx_vec.pfor(lambda i, c: c.reduce_sum(i), 8, parallel_iterations=2)


def test_run_functions_eagerly_is_overridden_for_the_call_only():
    tf.config.run_functions_eagerly(True)
    try:
        assert tfx_vec.vectorized_map(lambda v: v * v, tf.range(4)).numpy().tolist() == [0, 1, 4,
                                                                                          9]
        assert tf.config.functions_run_eagerly()
    finally:
        tf.config.run_functions_eagerly(False)


def test_gradient_from_an_outer_tape_reentered_in_the_body():
    """``with tape:`` inside the body records the captures of outer tensors (as in a
    tf.function), so the gradient reaches them: never None."""
    with tf.GradientTape(persistent=True) as g:
        x = arr(3, 4)
        g.watch(x)

    def loop_fn(i):
        with g:
            y = tf.reduce_sum(tf.sin(tf.gather(x, i)) * x)
        return g.gradient(y, x)
    got = tfx_vec.pfor(loop_fn, 3)
    assert got is not None
    xv = x.numpy()
    expected = np.stack([_grad_row(xv, i) for i in range(3)])
    assert_all_close(got, expected.astype(np.float32), 1e-5, 1e-5, "outer tape")
    again = tfx_vec.pfor(loop_fn, 3)              # the cached call reaches the tape too
    assert_all_close(again, expected.astype(np.float32), 1e-5, 1e-5, "outer tape, cached")


def _grad_row(x, i):
    """d/dx of sum(sin(x[i]) * x): row i gets cos(x[i]) * sum_rows(x) + sin(x[i]) for its own
    row; every row r gets sin(x[i])."""
    g = np.broadcast_to(np.sin(x[i]), x.shape).copy()
    g[i] += np.cos(x[i]) * x.sum(0)
    return g

# }}}


# {{{ TF1 graphs

def test_tf1_graph_body_builds_layers_and_control_dependencies_in_the_user_graph():
    """Under ``disable_v2_behavior`` the body is built in the user's graph: a v1 layer built
    by the body owns ordinary graph variables, later calls of it still work, and a print the
    body's output depends on runs."""
    script = textwrap.dedent("""
        import numpy as np, tensorflow as tf, tfx_vec
        from tensorflow.python.layers import layers as tf_layers
        tf.compat.v1.disable_v2_behavior()
        x = tf.constant(np.arange(12, dtype=np.float32).reshape(4, 3))
        layer = tf_layers.Dense(2)
        def loop_fn(i):
            h = layer(tf.expand_dims(tf.gather(x, i), 0))
            with tf.control_dependencies([tf.print("row", i)]):
                return tf.identity(h[0])
        out = tfx_vec.pfor(loop_fn, 4)
        again = layer(x)
        mapped = tfx_vec.vectorized_map(lambda r: r * 2.0, x)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            a, b, m = sess.run([out, again, mapped])
        assert np.allclose(a, b, atol=1e-5), (a, b)
        assert np.allclose(m, np.arange(12).reshape(4, 3) * 2)
        assert [v.name for v in tf.compat.v1.global_variables()] == ["dense/kernel:0",
                                                                     "dense/bias:0"]
        print("OK")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=240)
    assert proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr[-3000:]
    assert "row [0 1 2 3]" in proc.stderr, proc.stderr[-3000:]

# }}}
