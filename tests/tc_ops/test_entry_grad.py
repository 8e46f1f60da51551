"""Every corpus TC through its ``tc.define`` entry under ``tf.GradientTape``: the gradient of each
floating-point input matches central finite differences of the TC itself (in double precision,
along a random direction); a TC that cannot be differentiated raises ``TcGradientError`` when the
gradient is asked for, never ``None``."""
import re

import numpy as np
import pytest
import tensorflow as tf

from tfx_vec import tc_ops as tc

from .corpus import BY_NAME, CASES

# *=! (row_stats) has no automatic gradient; half is not a float64 TC
NOT_DIFFERENTIABLE = {"row_stats"}
SKIP = {"half_axpy"}


def as_double(source: str) -> str:
    """The TC in double precision (types, casts and the float-only builtins)."""
    source = re.sub(r"\bfloat\b", "double", source)
    return re.sub(r"\b(fmax|fmin|exp|log|tanh|sqrt)f\(", r"\1(", source)


def _double_inputs(case, rng):
    return [a.astype(np.float64) if np.asarray(a).dtype == np.float32 else a
            for a in case.inputs(rng)]


def _loss_weights(outs, rng):
    return [rng.standard_normal(np.shape(o)) if np.asarray(o).dtype.kind == "f" else None
            for o in outs]


def _loss(outs, weights):
    return sum(tf.reduce_sum(tf.cast(o, tf.float64) * w)
               for o, w in zip(outs, weights) if w is not None)


@pytest.mark.parametrize("case", [c for c in CASES if c.name not in NOT_DIFFERENTIABLE | SKIP],
                         ids=lambda c: c.name)
def test_gradient_matches_finite_differences(case):
    entry = tc.define(as_double(case.source))[case.entry]
    rng = np.random.default_rng(5)
    args = _double_inputs(case, rng)
    outs = entry.run_numpy(*args)
    weights = _loss_weights(outs, rng)
    tensors = [tf.constant(a) for a in args]
    floats = [k for k, a in enumerate(args) if np.asarray(a).dtype == np.float64 and
              np.ndim(a) > 0]
    with tf.GradientTape() as tape:
        tape.watch([tensors[k] for k in floats])
        res = entry(*tensors)
        loss = _loss(res if isinstance(res, tuple) else (res,), weights)
    grads = tape.gradient(loss, [tensors[k] for k in floats])
    eps = 1e-6
    for k, g in zip(floats, grads):
        assert g is not None, f"{case.name}: no gradient for input {k}"
        u = rng.standard_normal(np.shape(args[k]))
        plus, minus = list(args), list(args)
        plus[k], minus[k] = args[k] + eps * u, args[k] - eps * u
        fd = (float(_loss(entry.run_numpy(*plus), weights)) -
              float(_loss(entry.run_numpy(*minus), weights))) / (2 * eps)
        np.testing.assert_allclose(float(np.sum(g.numpy() * u)), fd, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{case.name}: input {k}")


def test_a_tc_without_a_derivative_raises_when_the_gradient_is_asked_for():
    case = BY_NAME["row_stats"]
    entry = tc.define(case.source)[case.entry]
    A, K = case.inputs(np.random.default_rng(0))
    a = tf.constant(A)
    with tf.GradientTape() as tape:
        tape.watch(a)
        mn, prod, kmax, habs = entry(a, K)          # the forward pass itself works
        loss = tf.reduce_sum(prod)
    with pytest.raises(tc.TcGradientError, match=r"line 4, column 5: automatic gradients of "
                                                 r"\*= reductions"):
        tape.gradient(loss, a)


def test_gradient_error_also_inside_tf_function():
    entry = tc.define("def e(float(N) A) -> (B) { B(i) = erf(A(i)) }").e

    @tf.function
    def step(a):
        with tf.GradientTape() as tape:
            tape.watch(a)
            loss = tf.reduce_sum(entry(a))
        return tape.gradient(loss, a)

    with pytest.raises(tc.TcGradientError, match="no derivative rule for builtin erf"):
        step(tf.ones([3]))


def test_keras_model_of_entries_trains():
    """An entry is the op a Keras layer can call directly (weights are tf.Variables)."""
    import keras
    entry = tc.define(BY_NAME["fcrelu"].source).fcrelu

    class Dense(keras.layers.Layer):
        def build(self, shape):
            self.w = self.add_weight(shape=(4, shape[-1]), initializer="glorot_uniform")
            self.b = self.add_weight(shape=(4,), initializer="zeros")

        def call(self, x):
            return entry(x, self.w, self.b)

    rng = np.random.default_rng(0)
    x, y = rng.random((32, 6), np.float32), rng.random((32, 4), np.float32)
    model = keras.Sequential([keras.Input((6,), batch_size=8), Dense()])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    first = model.evaluate(x, y, batch_size=8, verbose=0)
    model.fit(x, y, batch_size=8, epochs=5, verbose=0)
    assert model.evaluate(x, y, batch_size=8, verbose=0) < first
