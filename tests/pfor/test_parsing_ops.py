"""tf.io.parse_single_example in the loop body, checked against one tf.io.parse_example of
all the examples (and against the body run per iteration)."""
import numpy as np
import pytest
import tensorflow as tf

import tfx_vec


def _example(dense, ints, words):
    feature = {
        "dense": tf.train.Feature(float_list=tf.train.FloatList(value=dense)),
        "ints": tf.train.Feature(int64_list=tf.train.Int64List(value=ints)),
        "words": tf.train.Feature(bytes_list=tf.train.BytesList(value=words)),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


FEATURES = {
    "dense": tf.io.FixedLenFeature([2], tf.float32),
    "ints": tf.io.VarLenFeature(tf.int64),
    "words": tf.io.VarLenFeature(tf.string),
}


def _examples(rng, n, same_lengths=False):
    out = []
    for _ in range(n):
        k = 2 if same_lengths else int(rng.integers(0, 4))
        out.append(_example(rng.normal(size=2).astype(np.float32).tolist(),
                            rng.integers(-50, 50, size=k).tolist(),
                            [bytes(rng.choice(list(b"abc"), size=3)) for _ in range(k)]))
    return tf.constant(out)


def _assert_same(got, want):
    for key in FEATURES:
        g, w = got[key], want[key]
        if isinstance(w, tf.SparseTensor):
            np.testing.assert_array_equal(g.indices.numpy(), w.indices.numpy())
            np.testing.assert_array_equal(g.values.numpy(), w.values.numpy())
            np.testing.assert_array_equal(g.dense_shape.numpy(), w.dense_shape.numpy())
        else:
            np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_sparse_features_of_different_lengths_come_out_batched(rng):
    data = _examples(rng, 6)
    got = tfx_vec.pfor(lambda i: tf.io.parse_single_example(tf.gather(data, i), FEATURES), 6,
                       fallback_to_while_loop=False)
    _assert_same(got, tf.io.parse_example(data, FEATURES))


def test_sparse_values_used_in_the_body_when_lengths_agree(rng):
    data = _examples(rng, 5, same_lengths=True)

    def loop_fn(i):
        ints = tf.io.parse_single_example(tf.gather(data, i), FEATURES)["ints"]
        return ints.values * 2 + ints.indices[:, 0], ints.dense_shape
    got = tfx_vec.pfor(loop_fn, 5, fallback_to_while_loop=False)
    want = [tf.stack(v) for v in zip(*[loop_fn(tf.constant(k)) for k in range(5)])]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_sparse_values_of_different_lengths_used_in_the_body_are_an_error(rng):
    data = tf.constant([_example([1.0, 2.0], [1, 2], [b"a"]), _example([3.0, 4.0], [3], [])])
    with pytest.raises(tfx_vec.VectorizationError, match="different number of values"):
        tfx_vec.pfor(lambda i: tf.io.parse_single_example(
            tf.gather(data, i), FEATURES)["ints"].values + 1, 2)


def test_tf1_graph_parse_single_example(rng):
    with tf.Graph().as_default():
        data = _examples(rng, 4)
        got = tfx_vec.pfor(lambda i: tf.io.parse_single_example(tf.gather(data, i), FEATURES),
                           4)
        want = tf.io.parse_example(data, FEATURES)
        with tf.compat.v1.Session() as sess:
            got, want = sess.run([got, want])
    for key in FEATURES:
        for g, w in zip(tf.nest.flatten(got[key]), tf.nest.flatten(want[key])):
            np.testing.assert_array_equal(g, w)
