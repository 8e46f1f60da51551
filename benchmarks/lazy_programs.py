"""Unchanged eager TensorFlow programs run four ways: eager, ``lazy.device()``, ``tf.function``
and ``tf.function(jit_compile=True)``.

The programs are written here from scratch, after the kinds of code TensorFlow's guides and
tutorials teach (synthetic data, no downloads), as ordinary eager code: ``tf.Variable``,
``tf.Module``, ``tf.GradientTape``, Keras 3 layers, models, losses, metrics and optimizers,
``tf.data`` batches, ``float(loss)`` and Python control flow on values.  ``tests/lazy``
trains each one eagerly and lazily and compares losses and weights; this module times them.

Each :class:`Program` builds a fresh model (``make``) whose ``step(x, y)`` runs one training
step and returns the loss.  The lazy rows run the *same* step inside ``with lazy.device():``
with ``lazy.mark_step()`` after it; the ``tf.function`` rows wrap the same step (programs
whose step branches on a value in Python, or counts steps in a Python number that a trace
would bake, get no such row).  Two
variants per program: the loss read every step (``float(loss)``, what most loops do) and not
read.  Reported: steps/s per implementation, lazy's first step (record + compile), recording
cost per recorded op, and the compilations after warm-up (must be 0).

Run: ``.venv/bin/python -m benchmarks lazy_programs`` (``--quick``: smaller sizes, fewer repeats).
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf

from benchmarks.harness import Report, time_fn
from tfx_vec import lazy

# {{{ the programs


class Run:
    """One built program: ``step(x, y) -> loss`` and the state to compare."""

    def __init__(self, step: Callable, variables: Callable[[], list], traceable: bool = True):
        self.step = step
        self._variables = variables
        self.traceable = traceable

    def weights(self) -> list[np.ndarray]:
        return [np.array(v.numpy()) for v in self._variables()]


class Program:
    """A training program: ``make()`` builds model and optimizer (eagerly or inside
    ``lazy.device()``), ``data(steps)`` yields the same synthetic batches every time."""

    name = ""
    small_ops = True        # dominated by small ops (the "3x eager" class)
    batches = {"test": 8, "quick": 32, "bench": 64}

    def __init__(self, size: str = "test", seed: int = 0):
        self.size, self.seed = size, seed
        self.batch = self.batches[size]

    def _rng(self, k: int = 0) -> np.random.Generator:
        return np.random.default_rng(self.seed * 1000 + k)

    def arrays(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def data(self, steps: int) -> tf.data.Dataset:
        """The batches as a ``tf.data`` pipeline (build it where it is iterated)."""
        x, y = self.arrays(steps)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(self.batch)

    def make(self) -> Run:
        raise NotImplementedError


def _init(variables: list, rng: np.random.Generator, scale: float = 0.3) -> None:
    """Deterministic random values for ``variables`` (the same in every mode)."""
    for v in variables:
        v.assign(rng.normal(0.0, scale, v.shape).astype(tf.as_dtype(v.dtype).as_numpy_dtype))


def _classes(rng: np.random.Generator, n: int, features: int, classes: int
             ) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=(n, features)).astype(np.float32)
    w = rng.normal(size=(features, classes))
    return x, np.argmax(x @ w + 0.3 * rng.normal(size=(n, classes)), 1).astype(np.int32)


class GuideLinear(Program):
    """The basic training loop of TensorFlow's guide: a ``tf.Module`` ``y = w x + b`` fit by
    hand-written gradient descent (``assign_sub``)."""

    name = "guide_linear"

    def arrays(self, steps):
        rng = self._rng()
        x = rng.normal(size=(steps * self.batch,)).astype(np.float32)
        return x, (3.0 * x + 2.0 + rng.normal(size=x.shape)).astype(np.float32)

    def make(self):
        class Linear(tf.Module):
            def __init__(self):
                super().__init__()
                self.w = tf.Variable(5.0)
                self.b = tf.Variable(0.0)

            def __call__(self, x):
                return self.w * x + self.b

        model = Linear()

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(y - model(x)))
            dw, db = tape.gradient(loss, [model.w, model.b])
            model.w.assign_sub(0.1 * dw)
            model.b.assign_sub(0.1 * db)
            return loss
        return Run(step, lambda: model.trainable_variables)


class Dense(tf.Module):
    """A dense layer made of ``tf.Variable``s (the core MLP tutorial's own layer)."""

    def __init__(self, n_in: int, n_out: int, activation: Callable | None = None):
        super().__init__()
        self.w = tf.Variable(tf.zeros([n_in, n_out]))
        self.b = tf.Variable(tf.zeros([n_out]))
        self.activation = activation

    def __call__(self, x):
        z = tf.matmul(x, self.w) + self.b
        return self.activation(z) if self.activation else z


class Adam(tf.Module):
    """Adam written with ``tf.Variable``s, slots created on first use (the core tutorials')."""

    def __init__(self, lr: float = 1e-2, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-7):
        super().__init__()
        self.lr, self.b1, self.b2, self.eps = lr, b1, b2, eps
        self.t = tf.Variable(0.0)
        self.m: list = []
        self.v: list = []

    def apply_gradients(self, grads, variables):
        if not self.m:
            self.m = [tf.Variable(tf.zeros_like(v)) for v in variables]
            self.v = [tf.Variable(tf.zeros_like(v)) for v in variables]
        self.t.assign_add(1.0)
        c1 = 1.0 - tf.pow(self.b1, self.t)
        c2 = 1.0 - tf.pow(self.b2, self.t)
        for g, var, m, v in zip(grads, variables, self.m, self.v):
            m.assign(self.b1 * m + (1.0 - self.b1) * g)
            v.assign(self.b2 * v + (1.0 - self.b2) * tf.square(g))
            var.assign_sub(self.lr * (m / c1) / (tf.sqrt(v / c2) + self.eps))


class CoreAdam:
    """The core MLP tutorial's Adam as it is written there: a plain class, slots created on
    the first call, the step count a Python float incremented by every call."""

    def __init__(self, learning_rate: float = 1e-2, beta_1: float = 0.9,
                 beta_2: float = 0.999, ep: float = 1e-7):
        self.beta_1, self.beta_2, self.learning_rate, self.ep = beta_1, beta_2, learning_rate, ep
        self.t = 1.0
        self.v_dvar: list = []
        self.s_dvar: list = []
        self.built = False

    def apply_gradients(self, grads, variables):
        if not self.built:
            for var in variables:
                self.v_dvar.append(tf.Variable(tf.zeros(shape=var.shape)))
                self.s_dvar.append(tf.Variable(tf.zeros(shape=var.shape)))
            self.built = True
        for i, (d_var, var) in enumerate(zip(grads, variables)):
            self.v_dvar[i].assign(self.beta_1 * self.v_dvar[i] + (1 - self.beta_1) * d_var)
            self.s_dvar[i].assign(self.beta_2 * self.s_dvar[i]
                                  + (1 - self.beta_2) * tf.square(d_var))
            v_dvar_bc = self.v_dvar[i] / (1 - (self.beta_1 ** self.t))
            s_dvar_bc = self.s_dvar[i] / (1 - (self.beta_2 ** self.t))
            var.assign_sub(self.learning_rate * (v_dvar_bc / (tf.sqrt(s_dvar_bc) + self.ep)))
        self.t += 1.0


class ModuleMlpAdam(Program):
    """The core MLP tutorial: a ``tf.Module`` MLP, sparse softmax cross-entropy, its own Adam
    (a ``tf.Module`` keeping its step count in a variable)."""

    name = "module_mlp_adam"
    traceable = True

    def __init__(self, size="test", seed=0):
        super().__init__(size, seed)
        self.widths = {"test": [12, 16, 16, 5], "quick": [32] * 6 + [10],
                       "bench": [32] * 8 + [10]}[size]

    def arrays(self, steps):
        return _classes(self._rng(), steps * self.batch, self.widths[0], self.widths[-1])

    def make(self):
        ws = self.widths

        class MLP(tf.Module):
            def __init__(self):
                super().__init__()
                self.layers = [Dense(a, b, tf.nn.relu if i < len(ws) - 2 else None)
                               for i, (a, b) in enumerate(zip(ws[:-1], ws[1:]))]

            def __call__(self, x):
                for layer in self.layers:
                    x = layer(x)
                return x

        model, opt = MLP(), self.optimizer()
        _init(model.trainable_variables, self._rng(1))

        def step(x, y):
            with tf.GradientTape() as tape:
                logits = model(x)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
            opt.apply_gradients(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables)
            return loss
        return Run(step, lambda: list(model.trainable_variables) + self.slots(opt),
                   self.traceable)

    def optimizer(self) -> Any:
        return Adam()

    def slots(self, opt: Any) -> list:
        return opt.m + opt.v


class ModuleMlpCoreAdam(ModuleMlpAdam):
    """The same MLP with the tutorial's Adam as written there (:class:`CoreAdam`): its Python
    step count changes every call, so ``tf.function`` would bake it and a lazy step records the
    update op by op."""

    name = "module_mlp_core_adam"
    traceable = False

    def optimizer(self) -> Any:
        return CoreAdam()

    def slots(self, opt: Any) -> list:
        return opt.v_dvar + opt.s_dvar


class LogisticRegression(Program):
    """The core logistic-regression tutorial, with a learning rate decayed from a step count
    read as a NumPy scalar (``.numpy()``) and reused in tensor math every step."""

    name = "logistic_regression"

    def arrays(self, steps):
        x, y = _classes(self._rng(), steps * self.batch, 6, 2)
        return x, y.astype(np.float32)

    def make(self):
        class LogReg(tf.Module):
            def __init__(self):
                super().__init__()
                self.w = tf.Variable(tf.zeros([6, 1]))
                self.b = tf.Variable(tf.zeros([1]))

            def __call__(self, x):
                return tf.squeeze(tf.matmul(x, self.w) + self.b, axis=1)

        model, steps = LogReg(), tf.Variable(0, dtype=tf.int64)
        _init(model.trainable_variables, self._rng(1))
        accuracy = tf.Variable(0.0)

        def step(x, y):
            with tf.GradientTape() as tape:
                logits = model(x)
                loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(y, logits))
            grads = tape.gradient(loss, model.variables)
            lr = 0.5 / (1.0 + 0.05 * steps.numpy())   # a NumPy scalar from a forced value
            for g, v in zip(grads, model.variables):
                v.assign_sub(lr * g)
            steps.assign_add(1)
            predicted = tf.cast(tf.sigmoid(logits) > 0.5, tf.float32)
            accuracy.assign(tf.reduce_mean(tf.cast(tf.equal(predicted, y), tf.float32)))
            return loss
        return Run(step, lambda: list(model.variables) + [accuracy], traceable=False)


def _keras_run(model: Any, opt: Any, loss_fn: Any, metric: Any) -> Run:
    """The Keras custom-training step: forward under a tape, the loss object, the optimizer's
    ``apply_gradients`` and a metric updated with the predictions."""
    def step(x, y):
        with tf.GradientTape() as tape:
            pred = model(x, training=True)
            loss = loss_fn(y, pred)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        metric.update_state(y, pred)
        return loss
    return Run(step, lambda: [v.value for v in model.weights + opt.variables
                              + metric.variables])


class KerasSequentialAdam(Program):
    """A Keras ``Sequential`` model, Keras' Adam, a loss object and a metric, in a custom loop
    (the Keras custom-training walkthrough)."""

    name = "keras_sequential_adam"

    def __init__(self, size="test", seed=0):
        super().__init__(size, seed)
        self.widths = {"test": [10, 16, 16, 4], "quick": [32] * 6 + [10],
                       "bench": [32] * 8 + [10]}[size]

    def arrays(self, steps):
        return _classes(self._rng(), steps * self.batch, self.widths[0], self.widths[-1])

    def make(self):
        import keras
        ws = self.widths
        model = keras.Sequential([keras.Input((ws[0],))]
                                 + [keras.layers.Dense(w, activation="relu") for w in ws[1:-1]]
                                 + [keras.layers.Dense(ws[-1])])
        _init(model.trainable_variables, self._rng(1))
        return _keras_run(model, keras.optimizers.Adam(0.01),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          keras.metrics.SparseCategoricalAccuracy())


class KerasSubclassedBN(Program):
    """A subclassed Keras model with BatchNormalization, Dropout and the ``training`` flag,
    Keras' SGD with momentum, a mean-squared-error loss and a ``Mean`` metric."""

    name = "keras_subclassed_bn"
    small_ops = False

    def __init__(self, size="test", seed=0, dropout: float = 0.0):
        super().__init__(size, seed)
        self.dropout = dropout
        self.width = {"test": 12, "quick": 64, "bench": 128}[size]

    def arrays(self, steps):
        rng = self._rng()
        x = rng.normal(size=(steps * self.batch, 8)).astype(np.float32)
        y = np.sin(x @ rng.normal(size=(8, 2))).astype(np.float32)
        return x, y

    def make(self):
        import keras
        width, rate = self.width, self.dropout

        class Net(keras.Model):
            def __init__(self):
                super().__init__()
                self.d1 = keras.layers.Dense(width)
                self.bn = keras.layers.BatchNormalization()
                self.drop = keras.layers.Dropout(rate, seed=7)
                self.d2 = keras.layers.Dense(2)

            def call(self, x, training=False):
                h = tf.nn.relu(self.bn(self.d1(x), training=training))
                return self.d2(self.drop(h, training=training))

        model = Net()
        model(tf.zeros([1, 8]))
        _init(model.trainable_variables, self._rng(1))
        opt = keras.optimizers.SGD(0.05, momentum=0.9)
        loss_fn = keras.losses.MeanSquaredError()
        mean = keras.metrics.Mean()

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            mean.update_state(loss)
            return loss
        return Run(step, lambda: [v.value for v in model.weights + opt.variables
                                  + mean.variables])


class KerasFunctional(Program):
    """A functional Keras model (LayerNormalization, a residual add), RMSprop, Huber loss and
    a mean-absolute-error metric."""

    name = "keras_functional"

    def __init__(self, size="test", seed=0):
        super().__init__(size, seed)
        self.width = {"test": 8, "quick": 32, "bench": 32}[size]

    def arrays(self, steps):
        rng = self._rng()
        x = rng.normal(size=(steps * self.batch, 6)).astype(np.float32)
        return x, (x[:, :1] * x[:, 1:2] + 0.1 * rng.normal(size=(len(x), 1))).astype(np.float32)

    def make(self):
        import keras
        inputs = keras.Input((6,))
        h = keras.layers.Dense(self.width, activation="tanh")(inputs)
        h = keras.layers.LayerNormalization()(h)
        h = keras.layers.Add()([h, keras.layers.Dense(self.width)(inputs)])
        model = keras.Model(inputs, keras.layers.Dense(1)(h))
        _init(model.trainable_variables, self._rng(1))
        return _keras_run(model, keras.optimizers.RMSprop(0.01), keras.losses.Huber(),
                          keras.metrics.MeanAbsoluteError())


class RawConvnet(Program):
    """A convnet written with raw ops (``tf.nn.conv2d``, ``max_pool2d``) and a dict of
    ``tf.Variable``s, trained with Keras' Adam, as in a popular collection of TF examples."""

    name = "raw_convnet"
    small_ops = False

    def __init__(self, size="test", seed=0):
        super().__init__(size, seed)
        self.side, self.c1, self.c2 = {"test": (8, 4, 8), "quick": (16, 8, 16),
                                       "bench": (28, 16, 32)}[size]

    def arrays(self, steps):
        rng = self._rng()
        x = rng.normal(size=(steps * self.batch, self.side, self.side, 1)).astype(np.float32)
        return x, (x.mean(axis=(1, 2, 3)) > 0).astype(np.int32) + 2 * (x[:, 0, 0, 0] > 0)

    def make(self):
        import keras
        s, c1, c2 = self.side, self.c1, self.c2
        weights = {"wc1": tf.Variable(tf.zeros([3, 3, 1, c1])),
                   "wc2": tf.Variable(tf.zeros([3, 3, c1, c2])),
                   "wd1": tf.Variable(tf.zeros([(s // 4) ** 2 * c2, 32])),
                   "out": tf.Variable(tf.zeros([32, 4]))}
        biases = {k: tf.Variable(tf.zeros([n])) for k, n in
                  (("bc1", c1), ("bc2", c2), ("bd1", 32), ("out", 4))}
        params = list(weights.values()) + list(biases.values())
        _init(params, self._rng(1), 0.2)
        opt = keras.optimizers.Adam(0.005)

        def conv_net(x):
            x = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, weights["wc1"], 1, "SAME"),
                                          biases["bc1"]))
            x = tf.nn.max_pool2d(x, 2, 2, "SAME")
            x = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, weights["wc2"], 1, "SAME"),
                                          biases["bc2"]))
            x = tf.nn.max_pool2d(x, 2, 2, "SAME")
            x = tf.reshape(x, [-1, weights["wd1"].shape[0]])
            x = tf.nn.relu(tf.matmul(x, weights["wd1"]) + biases["bd1"])
            return tf.matmul(x, weights["out"]) + biases["out"]

        def step(x, y):
            with tf.GradientTape() as tape:
                logits = conv_net(x)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    tf.cast(y, tf.int64), logits))
            grads = tape.gradient(loss, params)
            opt.apply_gradients(zip(grads, params))
            return loss
        return Run(step, lambda: params + [v.value for v in opt.variables])


class ModuleMnistMlp(ModuleMlpAdam):
    """The core MLP tutorial at its own size: 784-512-512-10 on batches of 128."""

    name = "module_mlp_784"
    small_ops = False
    batches = {"test": 8, "quick": 64, "bench": 128}

    def __init__(self, size="test", seed=0):
        super().__init__(size, seed)
        self.widths = {"test": [20, 16, 16, 10], "quick": [784, 256, 10],
                       "bench": [784, 512, 512, 10]}[size]


class KerasMnistMlp(KerasSequentialAdam):
    """The Keras walkthrough's model at MNIST size: ``Sequential`` 784-512-512-10, Adam, an
    accuracy metric, batches of 128."""

    name = "keras_mlp_784"
    small_ops = False
    batches = {"test": 8, "quick": 64, "bench": 128}

    def __init__(self, size="test", seed=0):
        super().__init__(size, seed)
        self.widths = {"test": [20, 16, 16, 10], "quick": [784, 256, 10],
                       "bench": [784, 512, 512, 10]}[size]


class KerasConvnet(Program):
    """A Keras convnet on 28 x 28 images (two ``Conv2D`` + ``MaxPooling2D``, ``Dense``), Adam,
    an accuracy metric, batches of 128."""

    name = "keras_convnet"
    small_ops = False
    batches = {"test": 4, "quick": 32, "bench": 128}

    def __init__(self, size="test", seed=0):
        super().__init__(size, seed)
        self.side, self.c1, self.c2 = {"test": (8, 4, 8), "quick": (28, 16, 32),
                                       "bench": (28, 32, 64)}[size]

    def arrays(self, steps):
        rng = self._rng()
        x = rng.normal(size=(steps * self.batch, self.side, self.side, 1)).astype(np.float32)
        return x, (x.mean(axis=(1, 2, 3)) > 0).astype(np.int32) + 2 * (x[:, 0, 0, 0] > 0)

    def make(self):
        import keras
        layers = keras.layers
        model = keras.Sequential([
            keras.Input((self.side, self.side, 1)),
            layers.Conv2D(self.c1, 3, padding="same", activation="relu"), layers.MaxPooling2D(),
            layers.Conv2D(self.c2, 3, padding="same", activation="relu"), layers.MaxPooling2D(),
            layers.Flatten(), layers.Dense(4)])
        _init(model.trainable_variables, self._rng(1), 0.2)
        return _keras_run(model, keras.optimizers.Adam(0.005),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          keras.metrics.SparseCategoricalAccuracy())


class KerasLSTM(Program):
    """A Keras ``LSTM`` over sequences (20 steps of 16 features, 64 units), a ``Dense``
    classifier, Adam, an accuracy metric."""

    name = "keras_lstm"
    small_ops = False

    def __init__(self, size="test", seed=0):
        super().__init__(size, seed)
        self.steps, self.features, self.units = {"test": (5, 3, 6), "quick": (10, 8, 32),
                                                 "bench": (20, 16, 64)}[size]

    def arrays(self, steps):
        rng = self._rng()
        x = rng.normal(size=(steps * self.batch, self.steps, self.features)).astype(np.float32)
        return x, (x[:, :, 0].sum(axis=1) > 0).astype(np.int32) + 2 * (x[:, -1, -1] > 0)

    def make(self):
        import keras
        model = keras.Sequential([keras.Input((self.steps, self.features)),
                                  keras.layers.LSTM(self.units), keras.layers.Dense(4)])
        _init(model.trainable_variables, self._rng(1), 0.3)
        return _keras_run(model, keras.optimizers.Adam(0.01),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          keras.metrics.SparseCategoricalAccuracy())


class OptimizersTutorial(Program):
    """The optimizers tutorial: hand-written gradient descent with momentum on a convex
    function, stopped by a Python ``while`` on the loss value read every step."""

    name = "optimizers_tutorial"

    def arrays(self, steps):
        rng = self._rng()
        return (rng.normal(size=(steps, 4)).astype(np.float32),
                rng.uniform(1.0, 2.0, size=(steps, 4)).astype(np.float32))

    def data(self, steps):
        x, y = self.arrays(steps)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(1)

    def make(self):
        x = tf.Variable(tf.zeros([4]))
        velocity = tf.Variable(tf.zeros([4]))
        history: list = []

        def loss_fn(target, scale):
            return tf.reduce_sum(scale * (x - target) ** 2 + 0.1 * tf.abs(x))

        def step(target, scale):
            target, scale = target[0], scale[0]
            previous, change, inner = np.inf, np.inf, 0
            while change > 1e-4 and inner < 3:          # Python control flow on values
                with tf.GradientTape() as tape:
                    loss = loss_fn(target, scale)
                g = tape.gradient(loss, x)
                velocity.assign(0.9 * velocity - 0.05 * g)
                x.assign_add(velocity)
                value = loss.numpy()                    # a NumPy scalar, reused below
                change, previous, inner = abs(previous - value), value, inner + 1
                history.append(value)
            return loss
        return Run(step, lambda: [x, velocity], traceable=False)


PROGRAMS: dict[str, type[Program]] = {p.name: p for p in (
    GuideLinear, ModuleMlpAdam, ModuleMlpCoreAdam, LogisticRegression, KerasSequentialAdam,
    KerasSubclassedBN, KerasFunctional, RawConvnet, OptimizersTutorial, ModuleMnistMlp,
    KerasMnistMlp, KerasConvnet, KerasLSTM)}
# }}}


# {{{ running them

def train(program: Program, steps: int, mode: str = "eager", read_loss: bool = True,
          after_step: Callable[[int], None] | None = None) -> tuple[list[float], Run]:
    """Train ``program`` for ``steps`` batches in ``mode`` ("eager", "lazy" or "jit": the step in
    ``tf.function(jit_compile=True)``); the losses (read after every step, or at the end) and
    the built run.  ``after_step(i)`` runs after step ``i``."""
    losses: list = []

    def loop() -> Run:
        run = program.make()
        step = tf.function(run.step, jit_compile=True, autograph=False) if mode == "jit" \
            else run.step
        for i, (x, y) in enumerate(program.data(steps)):
            loss = step(x, y)
            if mode == "lazy":
                lazy.mark_step()
            losses.append(float(loss) if read_loss else loss)
            if after_step is not None:
                after_step(i)
        return run
    if mode == "lazy":
        with lazy.device():
            run = loop()
    else:
        run = loop()
    return [float(v) for v in losses], run


def _batches(program: Program, n: int) -> list:
    with tf.device("CPU:0"):
        return list(program.data(n))


def _loop(step: Callable, batches: list, read_loss: bool, barrier: Callable | None) -> Callable:
    cursor = [0]

    def one() -> Any:
        x, y = batches[cursor[0] % len(batches)]
        cursor[0] += 1
        loss = step(x, y)
        if barrier is not None:
            barrier()
        return float(loss) if read_loss else loss
    return one


def _in_scope(fn: Callable) -> Callable:
    def call() -> Any:
        with lazy.device():
            return fn()
    return call


def _implementations(program: Program, read_loss: bool, batches: list) -> dict:
    eager = program.make()
    impls = {"eager": _loop(eager.step, batches, read_loss, None)}
    with lazy.device():
        lz = program.make()
    impls["tfx_vec.lazy"] = _in_scope(_loop(lz.step, batches, read_loss, lazy.mark_step))
    if eager.traceable:
        for jit in (False, True):
            run = program.make()
            fn = tf.function(run.step, jit_compile=jit, autograph=False)
            impls["tf.function(jit)" if jit else "tf.function"] = _loop(fn, batches,
                                                                         read_loss, None)
    return impls


def _recording_us(program: Program, batches: list, repeats: int) -> tuple[float, int]:
    """Best time to record one step (no barrier inside) in µs, TensorFlow's and Keras' own
    Python included, and the ops recorded one by one per step (a Keras call, optimizer update
    or gradient recorded as one node counts none)."""
    best, ops = float("inf"), 0
    with lazy.device():
        run = program.make()
        for i in range(repeats + 2):
            x, y = batches[i % len(batches)]
            before = lazy.metrics().get("ops_recorded", 0)
            t0 = time.perf_counter()
            loss = run.step(x, y)  # noqa: F841 (live until the barrier, as in a loop)
            elapsed = time.perf_counter() - t0
            ops = lazy.metrics()["ops_recorded"] - before
            lazy.mark_step()
            if i >= 2:
                best = min(best, elapsed)
    return best * 1e6, ops


def _recorder_us(repeats: int, n: int = 300) -> tuple[float, float, float]:
    """The recorder's own cost per op: a loop of ``n`` small ops per step on the lazy device,
    against the same loop on a device whose callback returns a fixed answer (TensorFlow's
    Python and C++ and the native bridge only) and against eager; best per-op times in µs."""
    from tensorflow.python.eager import context
    from tfx_vec.lazy import custom_device
    a0 = tf.ones([4, 4])
    with lazy.device():
        a = a0 * 1.0
        lazy.mark_step()
    fixed = custom_device.payload_of(a)
    answer = [(fixed, a.dtype.as_datatype_enum, (4, 4))]
    name = "/job:localhost/replica:0/task:0/device:LAZYBASELINE:0"
    if not context.context().is_custom_device(name):
        dev, info = custom_device.native().capsules(name, lambda *args: answer,
                                                    lambda t: answer[0], lambda p: a0)
        context.context().register_custom_device(dev, name, info)
    with tf.device(name):
        b = tf.identity(a0)

    def loop(device: str | None, x: Any) -> float:
        best = float("inf")
        for _ in range(repeats):
            with tf.device(device) if device else _nothing():
                t0 = time.perf_counter()
                for _ in range(n):
                    tf.nn.relu(x)
                best = min(best, time.perf_counter() - t0)
                lazy.mark_step()
        return best / n * 1e6
    with lazy.device():
        lazy_us = loop(None, a)
    return lazy_us, loop(name, b), loop(None, a0)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def run(quick: bool) -> Report:
    size, rounds, inner = ("quick", 5, 3) if quick else ("bench", 11, 8)
    report = Report("lazy_programs", unit="steps/s", ours="tfx_vec.lazy", higher_is_better=True)
    notes = []
    for name, cls in PROGRAMS.items():
        program = cls(size)
        batches = _batches(program, 8)
        for read_loss in (True, False):
            case = f"{name}{'' if read_loss else ', loss not read'}"
            impls = _implementations(program, read_loss, batches)
            t0 = time.perf_counter()
            impls["tfx_vec.lazy"]()
            first = time.perf_counter() - t0
            for fn in impls.values():   # warm-up: every compilation happens here
                for _ in range(3):
                    fn()
            compiles = lazy.metrics().get("compiles", 0)
            report.measure_interleaved(case, impls, rounds=rounds, inner=inner, warmup=1)
            recompiles = lazy.metrics().get("compiles", 0) - compiles
            notes.append(f"{case}: lazy first step {first:.2f} s; compilations after warm-up "
                         f"{recompiles}")
        us, ops = _recording_us(program, batches, rounds)
        per_op = f", {us / ops:.1f} us per op" if ops else ""
        notes.append(f"{name}: recording a step takes {us:.0f} us ({ops} ops recorded one by "
                     f"one{per_op}; TensorFlow's and Keras' Python included)")
    lazy_us, base_us, eager_us = _recorder_us(rounds)
    notes.append(f"tf.nn.relu on a 4x4 tensor, per op: lazy {lazy_us:.2f} us, the same device "
                 f"with a callback that records nothing {base_us:.2f} us (the recorder's own "
                 f"cost: {lazy_us - base_us:.2f} us), eager {eager_us:.2f} us")
    report.notes = "\n".join(notes)
    return report
# }}}
