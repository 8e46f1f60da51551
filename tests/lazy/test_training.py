"""Gradients (lazy.GradientTape) and whole training loops against the same eager loops."""
import numpy as np
import pytest
import tensorflow as tf

from tests.support import random_array
from tfx_vec import lazy


def test_gradients_match_tf_gradient_tape():
    rng = np.random.default_rng(0)
    wa, xa, ba = random_array(rng, (3, 4)), random_array(rng, (5, 3)), random_array(rng, (4,))

    def loss_fn(x, w, b):
        return tf.reduce_mean(tf.nn.softplus(x @ w + b) * tf.sigmoid(x[:, :1]))

    w, b, x = lazy.Variable(wa), lazy.Variable(ba), lazy.tensor(xa)
    with lazy.GradientTape() as tape:
        tape.watch(x)
        loss = loss_fn(x, w, b)
    grads = tape.gradient(loss, {"w": w, "xb": [x, b]})
    ew, eb, ex = tf.Variable(wa), tf.Variable(ba), tf.constant(xa)
    with tf.GradientTape() as etape:
        etape.watch(ex)
        eloss = loss_fn(ex, ew, eb)
    egrads = etape.gradient(eloss, {"w": ew, "xb": [ex, eb]})
    lazy.mark_step()
    assert lazy.metrics()["executions"] == 1      # forward and backward: one program
    for a, e in zip(tf.nest.flatten(grads), tf.nest.flatten(egrads)):
        np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)


def test_unconnected_and_unwatched_sources_follow_eager_rules():
    w, v = lazy.Variable([1.0, 2.0]), lazy.Variable([3.0])
    x = lazy.tensor([0.5, 0.25])
    with lazy.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(w * x)
    assert tape.gradient(loss, v) is None                 # unconnected
    assert tape.gradient(loss, x) is None                 # not watched
    zero = tape.gradient(loss, [v], unconnected_gradients=tf.UnconnectedGradients.ZERO)[0]
    np.testing.assert_allclose(zero.numpy(), [0.0])
    np.testing.assert_allclose(tape.gradient(loss, w).numpy(), [0.5, 0.25])
    once = lazy.GradientTape()
    with once:
        y = tf.reduce_sum(w * w)
    once.gradient(y, w)
    with pytest.raises(lazy.LazyGradientError, match="non-persistent"):
        once.gradient(y, w)


def test_only_ops_inside_the_with_block_are_differentiated():
    """As eager: ops before the tape are constants; a target computed after exit is not
    recorded (None); nested tapes give second derivatives."""
    wa = random_array(np.random.default_rng(3), (3,))

    def run(tape_cls, w):
        pre = w * 2.0                                  # before the tape: a constant for it
        with tape_cls(persistent=True) as tape:
            loss = tf.reduce_sum(pre * w + tf.sin(w))
        after = loss * w                               # after exit: not on the tape
        with tape_cls() as outer:
            with tape_cls() as inner:
                cube = tf.reduce_sum(w * w * w)
            g = inner.gradient(cube, w)
        return [tape.gradient(loss, w), tape.gradient(after, w), outer.gradient(g, w)]
    lz = run(lazy.GradientTape, lazy.Variable(wa))
    eg = run(tf.GradientTape, tf.Variable(wa))
    lazy.mark_step()
    assert lz[1] is None and eg[1] is None
    np.testing.assert_allclose(lz[0].numpy(), eg[0].numpy(), rtol=1e-5)
    np.testing.assert_allclose(lz[2].numpy(), eg[2].numpy(), rtol=1e-5)


def test_value_forced_inside_the_tape_keeps_its_gradient():
    """Printing the loss or branching on it inside the tape (a barrier) still differentiates."""
    wa = random_array(np.random.default_rng(1), (4,))
    w, ew = lazy.Variable(wa), tf.Variable(wa)
    with lazy.GradientTape() as tape:
        h = tf.tanh(w * 2.0)
        loss = tf.reduce_sum(h * h) if float(tf.reduce_sum(h)) > 0 else tf.reduce_sum(h)
    g = tape.gradient(loss, w)
    with tf.GradientTape() as etape:
        eh = tf.tanh(ew * 2.0)
        eloss = tf.reduce_sum(eh * eh) if float(tf.reduce_sum(eh)) > 0 else tf.reduce_sum(eh)
    np.testing.assert_allclose(g.numpy(), etape.gradient(eloss, ew).numpy(), rtol=1e-4,
                               atol=1e-6)


def _mlp(params, x):
    n = len(params) // 2
    for i in range(n):
        x = tf.matmul(x, params[i]) + params[n + i]
        x = tf.nn.relu(x) if i < n - 1 else x
    return x


def _convnet(params, x):
    k1, k2, wd, bd = params
    h = tf.nn.max_pool2d(tf.nn.relu(tf.nn.conv2d(x, k1, 1, "SAME")), 2, 2, "VALID")
    h = tf.nn.relu(tf.nn.conv2d(h, k2, 1, "SAME"))
    return tf.reshape(h, [h.shape[0], -1]) @ wd + bd


def _train(model, init, xs, ys, tape_cls, var_cls, data_fn, barrier):
    params = [var_cls(p) for p in init]
    losses = []
    for x, y in zip(xs, ys):
        with tape_cls() as tape:
            logits = model(params, data_fn(x))
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(data_fn(y),
                                                                                 logits))
        grads = tape.gradient(loss, params)
        for p, g in zip(params, grads):
            p.assign_sub(0.1 * g)
        barrier()
        losses.append(float(loss))
    return losses, [p.numpy() for p in params]


@pytest.mark.parametrize("model", ["mlp", "convnet"])
def test_training_loop_losses_and_weights_match_eager(model):
    rng = np.random.default_rng(2)
    if model == "mlp":
        dims = [6, 8, 8, 8, 4]
        init = [random_array(rng, (a, b)) * 0.5 for a, b in zip(dims[:-1], dims[1:])]
        init += [random_array(rng, (b,)) * 0.1 for b in dims[1:]]
        xs = [random_array(rng, (5, 6)) for _ in range(4)]
        fn = _mlp
    else:
        init = [random_array(rng, (3, 3, 1, 4)) * 0.5, random_array(rng, (3, 3, 4, 4)) * 0.3,
                random_array(rng, (4 * 4 * 4, 3)) * 0.2, random_array(rng, (3,)) * 0.1]
        xs = [random_array(rng, (2, 8, 8, 1)) for _ in range(4)]
        fn = _convnet
    ys = [rng.integers(0, 3, len(x)).astype(np.int32) for x in xs]
    eager = _train(fn, init, xs, ys, tf.GradientTape, tf.Variable, tf.constant, lambda: None)
    lz = _train(fn, init, xs, ys, lazy.GradientTape, lazy.Variable, lazy.tensor,
                lazy.mark_step)
    np.testing.assert_allclose(lz[0], eager[0], rtol=1e-4, atol=1e-5)
    for a, b in zip(lz[1], eager[1]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    m = lazy.metrics()
    assert m["compiles"] == 1 and m["cache_hits"] == 3    # one program for all four steps
