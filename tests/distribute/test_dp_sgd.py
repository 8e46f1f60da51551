"""DP-SGD on one device: the vectorized step against a per-example loop, Keras fit, accounting,
convergence, errors.  (The same step under strategies: ``test_strategies.py``.)"""
import dp_accounting
import keras
import numpy as np
import pytest
import tensorflow as tf

import tfx_vec
from tfx_vec.pfor import dp_sgd
from tests.distribute.reference import dp_gradient_loop, noise_draws


def _mlp(rng, d_in=5, d_h=7, d_out=3):
    return [tf.Variable(rng.normal(0, 0.7, s).astype(np.float32))
            for s in [(d_in, d_h), (d_h,), (d_h, d_out)]]


def _mlp_loss(params, x, y):
    w1, b1, w2 = params
    logits = tf.tanh(x @ w1 + b1) @ w2
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))


@pytest.mark.parametrize("microbatch_size", [1, 3])
@pytest.mark.parametrize("noise_multiplier", [0.0, 1.3])
def test_dp_gradients_equal_per_example_loop(microbatch_size, noise_multiplier):
    rng = np.random.default_rng(1 + microbatch_size)
    params = _mlp(rng)
    x = tf.constant(rng.normal(0, 2, (12, 5)).astype(np.float32))
    y = tf.constant(rng.integers(0, 3, 12).astype(np.int32))
    loss = lambda mb: _mlp_loss(params, *mb)  # noqa: E731
    # A clip between the smallest and largest norms: some rows are clipped, some are not.
    _, norms = dp_gradient_loop(loss, params, (x, y), l2_norm_clip=1e9, noise_multiplier=0,
                                seed=0, step=0, microbatch_size=microbatch_size)
    clip = float(np.median(norms))
    want, want_norms = dp_gradient_loop(
        loss, params, (x, y), l2_norm_clip=clip, noise_multiplier=noise_multiplier, seed=7,
        step=5, microbatch_size=microbatch_size)
    step = tf.function(lambda: dp_sgd.dp_gradients(
        loss, params, (x, y), l2_norm_clip=clip, noise_multiplier=noise_multiplier, seed=7,
        step=5, num_microbatches=12 // microbatch_size if microbatch_size > 1 else None))
    got = step()
    assert (want_norms > clip).any() and (want_norms < clip).any()
    np.testing.assert_allclose(got.norms.numpy(), want_norms, rtol=1e-5)
    for g, w in zip(got.grads, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(got.losses.numpy()[:2], [
        float(_mlp_loss(params, x[i * microbatch_size:(i + 1) * microbatch_size],
                        y[i * microbatch_size:(i + 1) * microbatch_size])) for i in range(2)],
        rtol=1e-5)


def test_noise_is_one_draw_of_the_right_scale_per_step():
    v = tf.Variable(tf.zeros([200, 50]))
    batch = tf.ones([4, 1])
    loss = lambda mb: tf.reduce_sum(v) * tf.reduce_sum(mb)  # noqa: E731 (gradient: ones)
    a = dp_sgd.dp_gradients(loss, [v], batch, l2_norm_clip=0.5, noise_multiplier=2.0, seed=3,
                            step=1)
    b = dp_sgd.dp_gradients(loss, [v], batch, l2_norm_clip=0.5, noise_multiplier=2.0, seed=3,
                            step=2)
    clip_mean = 0.5 / np.sqrt(10000.0)     # each gradient has norm 100: clipped to 0.5
    for out in (a, b):
        z = out.grads[0].numpy() * 4 - 4 * clip_mean
        assert abs(z.std() - 1.0) < 0.03 and abs(z.mean()) < 0.03   # stddev sigma*C = 1
    assert not np.allclose(a.grads[0], b.grads[0])   # a fresh draw each step
    np.testing.assert_allclose(a.grads[0].numpy() * 4 - 4 * clip_mean,
                               noise_draws([(200, 50)], 3, 1, 1.0)[0], atol=1e-5)


def _keras_model(cls, init_seed, **dp):
    keras.utils.set_random_seed(init_seed)
    return cls([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                keras.layers.Dense(3)], **dp)


@pytest.mark.parametrize("num_microbatches", [None, 2])
def test_keras_fit_step_equals_per_example_loop(num_microbatches):
    rng = np.random.default_rng(4)
    x = rng.normal(0, 2, (8, 6)).astype(np.float32)
    y = rng.integers(0, 3, 8).astype(np.int32)
    dp = dict(l2_norm_clip=0.8, noise_multiplier=1.1, seed=11, num_microbatches=num_microbatches)
    model = _keras_model(dp_sgd.DPSequential, 0, **dp)
    lr = 0.5
    model.compile(keras.optimizers.SGD(lr),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [v.numpy() for v in model.trainable_variables]
    ref = _keras_model(keras.Sequential, 0)
    loss_obj = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    want, _ = dp_gradient_loop(lambda mb: loss_obj(mb[1], ref(mb[0])), ref.trainable_variables,
                               (tf.constant(x), tf.constant(y)), l2_norm_clip=0.8,
                               noise_multiplier=1.1, seed=11, step=0,
                               microbatch_size=8 // (num_microbatches or 8))
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for b, g, v in zip(before, want, model.trainable_variables):
        np.testing.assert_allclose(v.numpy(), b - lr * g, rtol=1e-4, atol=1e-6)
    assert model.get_config()["noise_multiplier"] == 1.1


def test_custom_loop_with_keras_optimizer_matches_fit():
    rng = np.random.default_rng(5)
    x = tf.constant(rng.normal(0, 1, (6, 6)).astype(np.float32))
    y = tf.constant(rng.integers(0, 3, 6).astype(np.int32))
    fit_model = _keras_model(dp_sgd.DPSequential, 1, l2_norm_clip=1.0, noise_multiplier=0.7,
                             seed=2)
    fit_model.compile(keras.optimizers.Adam(0.01),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    fit_model.fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)

    model = _keras_model(keras.Sequential, 1)
    opt = keras.optimizers.Adam(0.01)
    loss_obj = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step():
        out = dp_sgd.dp_gradients(lambda mb: loss_obj(mb[1], model(mb[0], training=True)),
                                  model.trainable_variables, (x, y), l2_norm_clip=1.0,
                                  noise_multiplier=0.7, seed=2, step=opt.iterations)
        opt.apply_gradients(zip(out.grads, model.trainable_variables))
    step(), step()
    for a, b in zip(fit_model.trainable_variables, model.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_functional_dp_model_reports_loss_and_metrics():
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(2)(inputs)
    model = dp_sgd.DPModel(inputs, outputs, l2_norm_clip=1.0, noise_multiplier=0.0, seed=0)
    model.compile(keras.optimizers.SGD(0.0), "mse", metrics=["mae"])
    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    h = model.fit(x, np.zeros((8, 2), np.float32), batch_size=4, verbose=0)
    pred = model.predict(x, verbose=0)
    # learning rate 0: the reported loss is the model's mse on the data
    np.testing.assert_allclose(h.history["loss"][0], np.mean(pred ** 2), rtol=1e-4)
    np.testing.assert_allclose(h.history["mae"][0], np.mean(np.abs(pred)), rtol=1e-4)


def test_mnist_sized_model_converges_on_synthetic_data():
    rng = np.random.default_rng(0)
    n, classes = 2048, 10
    templates = rng.normal(0, 1, (classes, 28, 28, 1)).astype(np.float32)
    y = rng.integers(0, classes, n).astype(np.int32)
    x = templates[y] + rng.normal(0, 1.5, (n, 28, 28, 1)).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = dp_sgd.DPSequential([
        keras.Input((28, 28, 1)), keras.layers.Conv2D(8, 5, strides=2, activation="relu"),
        keras.layers.MaxPooling2D(2), keras.layers.Flatten(), keras.layers.Dense(10)],
        l2_norm_clip=1.0, noise_multiplier=1.1, seed=0)
    model.compile(keras.optimizers.SGD(0.25, momentum=0.5),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    h = model.fit(x, y, batch_size=64, epochs=3, verbose=0)
    assert h.history["loss"][-1] < 0.5 * h.history["loss"][0]
    xt = templates[np.arange(200) % classes] + rng.normal(0, 1.5, (200, 28, 28, 1))
    acc = np.mean(np.argmax(model.predict(xt.astype(np.float32), verbose=0), -1)
                  == np.arange(200) % classes)
    assert acc > 0.9, acc
    eps = dp_sgd.compute_epsilon(1.1, 64 / n, 3 * n // 64, 1e-5)
    assert 0 < eps < 20


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
@pytest.mark.parametrize("sigma,q,steps", [(1.1, 256 / 60000, 14040), (0.8, 0.01, 500),
                                           (4.0, 0.1, 30)])
def test_epsilon_equals_dp_accounting(accountant, sigma, q, steps):
    acc = (dp_accounting.rdp.RdpAccountant() if accountant == "rdp"
           else dp_accounting.pld.PLDAccountant())
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                steps)
    want = acc.get_epsilon(1e-5)
    assert dp_sgd.compute_epsilon(sigma, q, steps, 1e-5, accountant=accountant) == \
        pytest.approx(want, rel=1e-9)


def test_noise_multiplier_calibration_hits_the_target():
    sigma = dp_sgd.compute_noise_multiplier(2.0, 0.01, 1000, 1e-5)
    assert dp_sgd.compute_epsilon(sigma, 0.01, 1000, 1e-5) <= 2.0
    assert dp_sgd.compute_epsilon(sigma * 0.99, 0.01, 1000, 1e-5) > 2.0


def test_errors_are_clear():
    v = tf.Variable([1.0])
    loss = lambda mb: tf.reduce_sum(v * mb)  # noqa: E731
    with pytest.raises(ValueError, match="l2_norm_clip must be > 0"):
        dp_sgd.dp_gradients(loss, [v], tf.ones([4, 1]), l2_norm_clip=0, noise_multiplier=1,
                            seed=0, step=0)
    with pytest.raises(ValueError, match="does not split into 3 microbatches"):
        dp_sgd.dp_gradients(loss, [v], tf.ones([4, 1]), l2_norm_clip=1, noise_multiplier=1,
                            seed=0, step=0, num_microbatches=3)
    with pytest.raises(ValueError, match="scalar loss"):
        dp_sgd.dp_gradients(lambda mb: v * mb, [v], tf.ones([4, 1]), l2_norm_clip=1,
                            noise_multiplier=1, seed=0, step=0)
    with pytest.raises(ValueError, match="sampling_rate"):
        dp_sgd.compute_epsilon(1.0, 2.0, 10, 1e-5)
    with pytest.raises(ValueError, match="accountant must be one of"):
        dp_sgd.compute_epsilon(1.0, 0.1, 10, 1e-5, accountant="moments")
    with pytest.raises(TypeError, match="keras.Model subclass"):
        dp_sgd.make_dp_model_class(dict)
    with pytest.raises(TypeError):
        dp_sgd.DPSequential([keras.Input((2,))])   # the DP options are required


def test_batch_norm_in_training_is_a_vectorization_error():
    model = dp_sgd.DPSequential([keras.Input((3,)), keras.layers.BatchNormalization(),
                                 keras.layers.Dense(1)], l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile("sgd", "mse")
    with pytest.raises(tfx_vec.VectorizationError):
        model.fit(np.ones((4, 3)), np.ones((4, 1)), batch_size=4, verbose=0)
