"""Jacobians, hessians and per-example gradients against TensorFlow's while-loop jacobian,
central finite differences (float64) and loops of ``tape.gradient``."""
import numpy as np
import pytest
import tensorflow as tf

import tfx_vec.pfor.gradients as G
from tfx_vec.pfor import vectorizer
from tests.support import random_array

RNG = np.random.default_rng(21)
W = tf.constant(random_array(RNG, [3, 4], np.float64, -1, 1))
X0 = tf.constant(random_array(RNG, [2, 3], np.float64, -1, 1))


def f(x):
    """[2, 3] -> [2, 4], non-linear, with a reduction across rows."""
    h = tf.tanh(tf.matmul(x, W))
    return h * tf.reduce_sum(x * x) + tf.sin(h)


def rnn(x):
    """A dynamic-length RNN: a tf.while_loop over the rows of x ([T, 3] -> [4])."""
    def body(t, h):
        return t + 1, tf.tanh(tf.linalg.matvec(W, tf.gather(x, t), transpose_a=True) + h)
    _, h = tf.while_loop(lambda t, h: t < tf.shape(x)[0], body,
                         (tf.constant(0), tf.zeros([4], tf.float64)))
    return h


def finite_differences(fn, x, eps=1e-6):
    """Central differences: [*y.shape, *x.shape]."""
    x = np.asarray(x, np.float64)
    cols = []
    for k in range(x.size):
        e = np.zeros(x.size)
        e[k] = eps
        e = e.reshape(x.shape)
        cols.append((np.asarray(fn(tf.constant(x + e))) - np.asarray(fn(tf.constant(x - e))))
                    / (2 * eps))
    jac = np.stack(cols, axis=-1)
    return jac.reshape(jac.shape[:-1] + x.shape)


def tf_loop_jacobian(fn, x):
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = fn(x)
    return tape.jacobian(y, x, experimental_use_pfor=False).numpy()


@pytest.mark.parametrize("fn,x", [(f, X0), (rnn, X0)], ids=["dense", "while_loop_rnn"])
def test_reverse_jacobian_of_function(fn, x):
    jac = G.jacobian(fn, x, fallback_to_while_loop=False).numpy()
    assert jac.shape == tuple(fn(x).shape) + tuple(x.shape)
    np.testing.assert_allclose(jac, finite_differences(fn, x), rtol=1e-6, atol=1e-7)
    if fn is f:  # TF cannot take the while-loop jacobian of a while loop more than once
        np.testing.assert_allclose(jac, tf_loop_jacobian(fn, x), rtol=1e-10, atol=1e-12)


def test_jacobian_with_tape_and_several_sources_and_while_loop_variant():
    w = tf.Variable(W)
    x = tf.Variable(X0)
    with tf.GradientTape(persistent=True) as tape:
        y = tf.tanh(tf.matmul(x, w)) * 3.0
    ours = G.jacobian(y, {"x": x, "w": w}, tape=tape)
    ref = tape.jacobian(y, {"x": x, "w": w}, experimental_use_pfor=False)
    loop = G.jacobian(y, {"x": x, "w": w}, tape=tape, use_pfor=False)
    for k in ("x", "w"):
        np.testing.assert_allclose(ours[k].numpy(), ref[k].numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(loop[k].numpy(), ref[k].numpy(), rtol=1e-10, atol=1e-12)


def test_jacobian_in_graph_mode_with_tf_gradients():
    @tf.function
    def run(x):
        return G.jacobian(f(x), x)
    np.testing.assert_allclose(run(X0).numpy(), tf_loop_jacobian(f, X0), rtol=1e-10, atol=1e-12)


def test_forward_mode_matches_reverse_mode():
    fwd = G.jacobian(f, X0, mode="forward").numpy()
    np.testing.assert_allclose(fwd, tf_loop_jacobian(f, X0), rtol=1e-10, atol=1e-12)
    g = lambda x, w: tf.tanh(tf.matmul(x, w)) * tf.reduce_sum(w)  # noqa: E731
    fwd2 = G.jacobian(g, [X0, W], mode="forward")
    rev2 = G.jacobian(g, [X0, W])
    for a, b in zip(fwd2, rev2):
        assert a.shape == b.shape
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="mode"):
        G.jacobian(f, X0, mode="sideways")


def test_batch_jacobian():
    x = tf.constant(random_array(RNG, [5, 3], np.float64, -1, 1))
    g = lambda x: tf.sin(tf.matmul(x, W)) * tf.reduce_sum(x, axis=1, keepdims=True)  # noqa
    ours = G.batch_jacobian(g, x).numpy()
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = g(x)
    ref = tape.batch_jacobian(y, x, experimental_use_pfor=False).numpy()
    assert ours.shape == (5, 4, 3)
    np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-12)


def test_hessian_of_non_scalar_output():
    x = tf.constant(random_array(RNG, [3], np.float64, -1, 1))
    g = lambda v: tf.tanh(tf.linalg.matvec(W, v, transpose_a=True)) * tf.reduce_sum(v ** 3)  # noqa
    hess = G.hessian(g, x).numpy()
    assert hess.shape == (4, 3, 3)
    fd = finite_differences(lambda v: G.jacobian(g, v, use_pfor=False), x, eps=1e-5)
    np.testing.assert_allclose(hess, fd, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(hess, np.swapaxes(hess, 1, 2), rtol=1e-10, atol=1e-12)


def test_hessian_through_a_while_loop_rnn():
    """TF cannot differentiate its while-loop jacobian again; pfor's jacobian is plain ops."""
    x = X0[:1]
    hess = G.hessian(rnn, x).numpy()
    assert hess.shape == (4, 1, 3, 1, 3)
    fd = finite_differences(lambda v: tf_loop_jacobian(rnn, v), x, eps=1e-5)
    np.testing.assert_allclose(hess, fd, rtol=1e-5, atol=1e-7)


def test_per_example_gradients_match_a_loop_of_tape_gradient():
    k1 = tf.Variable(random_array(RNG, [3, 3, 1, 2], np.float32, -0.5, 0.5))
    w2 = tf.Variable(random_array(RNG, [2, 3], np.float32, -0.5, 0.5))
    b2 = tf.Variable(random_array(RNG, [3], np.float32, -0.5, 0.5))
    images = tf.constant(random_array(RNG, [6, 5, 5, 1], np.float32))
    labels = tf.constant(RNG.integers(0, 3, size=[6]).astype(np.int32))
    variables = [k1, w2, b2]

    def loss_fn(example):
        image, label = example
        h = tf.nn.relu(tf.nn.conv2d(image[None], k1, 1, "SAME"))
        logits = tf.matmul(tf.reduce_mean(h, axis=[1, 2]), w2) + b2
        return tf.nn.sparse_softmax_cross_entropy_with_logits(label[None], logits)[0]

    ours = G.per_example_gradients(loss_fn, variables, (images, labels))
    for i in range(6):
        with tf.GradientTape() as tape:
            loss = loss_fn((images[i], labels[i]))
        for got, ref in zip(ours, tape.gradient(loss, variables)):
            np.testing.assert_allclose(got[i].numpy(), ref.numpy(), rtol=1e-4, atol=1e-6)
    loop = G.per_example_gradients(loss_fn, variables, (images, labels), use_pfor=False)
    for a, b in zip(ours, loop):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)


def test_per_example_gradients_through_a_while_loop_rnn():
    """Per-example trip counts give the gradient's accumulator lists per-row element counts;
    everything is vectorized (no fallback; more cases in test_lists_ragged.py)."""
    w = tf.Variable(tf.cast(W, tf.float32))
    seqs = tf.constant(random_array(RNG, [4, 5, 3], np.float32, -1, 1))
    lengths = tf.constant([5, 2, 4, 1])

    def loss_fn(example):
        xs, length = example

        def body(t, h):
            return t + 1, tf.tanh(tf.linalg.matvec(w, tf.gather(xs, t), transpose_a=True) + h)
        _, h = tf.while_loop(lambda t, h: t < length, body, (tf.constant(0), tf.zeros([4])))
        return tf.reduce_sum(h * h)

    vectorizer.reset_fallbacks()
    ours = G.per_example_gradients(loss_fn, [w], (seqs, lengths))
    assert not vectorizer.fallback_report()
    for i in range(4):
        with tf.GradientTape() as tape:
            loss = loss_fn((seqs[i], lengths[i]))
        np.testing.assert_allclose(ours[0][i].numpy(), tape.gradient(loss, w).numpy(),
                                   rtol=1e-4, atol=1e-6)


# {{{ TensorFlow's semantics: None for no dependency, integer sources, first dimensions

def test_no_dependency_gives_none_as_tensorflow_or_zeros_on_request():
    x, z = tf.constant([1.0, 2.0]), tf.constant([3.0])
    assert G.jacobian(lambda a, b: a * 2.0, [x, z])[1] is None
    assert G.jacobian(lambda a, b: a * 2.0, [x, z], mode="forward")[1] is None
    zero = G.jacobian(lambda a, b: a * 2.0, [x, z], unconnected_gradients="zero")[1]
    assert zero.shape == (2, 1) and not zero.numpy().any()
    assert G.batch_jacobian(lambda a: tf.ones([2, 3]), tf.ones([2, 4])) is None
    with tf.Graph().as_default():
        y = tf.constant([[2.0]])
        assert G.jacobian(y, tf.constant([[1.0]])) is None
        assert G.batch_jacobian(y, tf.constant([[1.0]])) is None
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = x * 3.0
    assert G.jacobian(y, [x, z], tape=tape)[1] is None


def test_integer_sources_give_none_with_a_warning():
    with pytest.warns(UserWarning, match="int32"):
        assert G.jacobian(lambda a: tf.cast(a, tf.float32) * 2.0, tf.constant([1, 2])) is None
    w = tf.Variable([1.0, 2.0])
    with pytest.warns(UserWarning, match="int32"):
        g = G.per_example_gradients(lambda e: tf.reduce_sum(w * tf.cast(e, tf.float32)),
                                    {"w": w, "k": tf.constant(3)}, tf.ones([4, 2], tf.int32))
    assert g["k"] is None and g["w"].shape == (4, 2)


def test_batch_jacobian_checks_the_first_dimension():
    with pytest.raises(ValueError, match="Need first dimension of `output`"):
        G.batch_jacobian(lambda a: tf.concat([a, a], 0), tf.ones([2, 2]))
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32)
        jac = G.batch_jacobian(tf.concat([x, x], axis=0), x)
        with tf.compat.v1.Session() as sess:
            with pytest.raises(tf.errors.InvalidArgumentError, match="same first dimension"):
                sess.run(jac, feed_dict={x: [[1.0, 2.0], [3.0, 4.0]]})


def test_per_example_gradients_take_any_structure_of_variables():
    w, b = tf.Variable(RNG.normal(size=[3]).astype(np.float32)), tf.Variable(0.5)
    xs = tf.constant(RNG.normal(size=[5, 3]).astype(np.float32))

    def loss(e):
        return tf.reduce_sum(tf.sin(w * e)) * b
    bare = G.per_example_gradients(loss, w, xs)
    assert isinstance(bare, tf.Tensor) and bare.shape == (5, 3)
    nested = G.per_example_gradients(loss, {"w": w, "pair": (b, w)}, xs)
    for k in range(5):
        with tf.GradientTape() as tape:
            value = loss(xs[k])
        gw, gb = tape.gradient(value, [w, b])
        np.testing.assert_allclose(bare[k].numpy(), gw.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(nested["pair"][0][k].numpy(), gb.numpy(), rtol=1e-5)
        np.testing.assert_allclose(nested["pair"][1][k].numpy(), gw.numpy(), rtol=1e-5, atol=1e-6)
    unused = tf.Variable(1.0)
    none = G.per_example_gradients(loss, [w, unused], xs, unconnected_gradients="none")
    assert none[1] is None
    zeros = G.per_example_gradients(loss, [w, unused], xs)
    assert zeros[1].shape == (5,) and not zeros[1].numpy().any()

# }}}


def test_per_example_gradients_and_jacobian_of_keras_variables():
    """Keras 3 variables (not ``tf.Variable``) are differentiated through the TensorFlow
    variable each holds; the structure handed in is the structure returned."""
    import keras
    rng = np.random.default_rng(7)
    model = keras.Sequential([keras.Input([4]), keras.layers.Dense(3, activation="tanh"),
                              keras.layers.Dense(1)])
    x = tf.constant(random_array(rng, [5, 4], np.float32))
    y = tf.constant(random_array(rng, [5, 1], np.float32))

    def loss_fn(example):
        xi, yi = example
        return tf.reduce_sum(tf.square(model(xi[None])[0] - yi))

    variables = model.trainable_variables
    assert not isinstance(variables[0], tf.Variable)
    ours = G.per_example_gradients(loss_fn, variables, (x, y))
    assert isinstance(ours, list) and len(ours) == len(variables)
    for i in range(5):
        with tf.GradientTape() as tape:
            loss = loss_fn((x[i], y[i]))
        refs = tape.gradient(loss, [v.value for v in variables])
        for got, ref in zip(ours, refs):
            np.testing.assert_allclose(got[i].numpy(), ref.numpy(), rtol=1e-4, atol=1e-6)
    kernel = variables[0]
    with tf.GradientTape(persistent=True) as tape:
        out = model(x)
    jac = G.jacobian(out, kernel, tape=tape)
    ref = tape.jacobian(out, kernel.value, experimental_use_pfor=False)
    np.testing.assert_allclose(jac.numpy(), ref.numpy(), rtol=1e-4, atol=1e-6)
