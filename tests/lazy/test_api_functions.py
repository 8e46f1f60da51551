"""TensorFlow's reductions, reshapes, casts and activations on device tensors: recorded without
TensorFlow's wrappers once its own path has shown the op, every value and gradient the eager
one, TensorFlow's path wherever the device does not answer."""
import inspect

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorflow.python.ops import gen_array_ops, gen_math_ops, gen_nn_ops

from tests.support import eager_then_lazy, random_array
from tfx_vec import lazy
from tfx_vec.lazy import api_functions
from tfx_vec.lazy.api_functions import FUNCTIONS

# Calls on a [2, 3, 4] tensor (and a host batch ``h`` of its shape): every function, several
# forms each
CALLS = [
    lambda x, h: tf.reduce_sum(x), lambda x, h: tf.reduce_sum(x, 1),
    lambda x, h: tf.reduce_sum(x, [0, -1], True), lambda x, h: tf.reduce_mean(x),
    lambda x, h: tf.math.reduce_mean(x, np.int64(2)), lambda x, h: tf.reduce_max(x, (0, 1)),
    lambda x, h: tf.reduce_min(x, -1, True), lambda x, h: tf.reduce_prod(x, 2),
    lambda x, h: tf.math.reduce_logsumexp(x, axis=1),
    lambda x, h: tf.math.reduce_variance(x, axis=[0, 2]), lambda x, h: tf.math.reduce_std(x),
    lambda x, h: tf.reshape(x, [6, 4]), lambda x, h: tf.reshape(x, [-1]),
    lambda x, h: tf.reshape(x, (4, -1, 2)), lambda x, h: tf.transpose(x),
    lambda x, h: tf.transpose(x, [1, 0, 2]), lambda x, h: tf.expand_dims(x, 1),
    lambda x, h: tf.squeeze(tf.expand_dims(x, 0)), lambda x, h: tf.cast(x, tf.float64),
    lambda x, h: tf.cast(x, "float16"), lambda x, h: tf.matmul(x, tf.transpose(x, [0, 2, 1])),
    lambda x, h: tf.matmul(x, h, transpose_b=True), lambda x, h: tf.argmax(x, axis=2),
    lambda x, h: tf.norm(x, axis=-1), lambda x, h: tf.sigmoid(x), lambda x, h: tf.math.abs(x),
    lambda x, h: tf.math.log_sigmoid(x), lambda x, h: tf.nn.softmax(x),
    lambda x, h: tf.nn.log_softmax(x), lambda x, h: tf.nn.softmax(x, 1),
    lambda x, h: tf.nn.l2_loss(x),
    lambda x, h: tf.nn.sigmoid_cross_entropy_with_logits(labels=h, logits=x),
    lambda x, h: tf.nn.sigmoid_cross_entropy_with_logits(x, h),
    lambda x, h: tf.matmul(x, x, transpose_b=True),   # one tensor twice: TensorFlow's path
    lambda x, h: x[0], lambda x, h: x[:, 1:], lambda x, h: x[..., 0], lambda x, h: x[1, :, None],
    lambda x, h: x[::-1, -2:, np.int64(1)], lambda x, h: x[-1, 2, 3],
    lambda x, h: h[1] * x[0],                          # a host batch sliced on the device
]


def _assert_like_eager(lz, eager, rtol):
    """The lazy results have the eager ones' dtypes and shapes and values within ``rtol`` (of
    the largest value, for values near zero)."""
    assert len(lz) == len(eager)
    for a, e in zip(lz, eager):
        assert a.dtype == e.dtype and a.shape == e.shape
        tol = max(rtol, 1e-3) if a.dtype == np.float16 else rtol
        np.testing.assert_allclose(a, e, rtol=tol, atol=tol * max(1.0, np.abs(e).max()))


def _program(dtype):
    def run(on_device):
        rng = np.random.default_rng(3)
        x0 = random_array(rng, (2, 3, 4)) + 0.5
        w = tf.Variable(tf.constant(random_array(rng, (4,)), dtype))
        x = tf.constant(x0, dtype) * 1.0      # on the device when recorded
        with tf.device("CPU:0"):              # host batches, a new one every round
            hs = [tf.constant(rng.uniform(size=(2, 3, 4)), dtype) for _ in range(3)]
        out = []
        for h in hs:                          # the first call of each shows the op
            with tf.GradientTape(persistent=True) as tape:
                tape.watch(x)
                ys = [call(x * w, h) for call in CALLS]
                loss = tf.add_n([tf.reduce_sum(tf.cast(y, dtype) ** 2) for y in ys
                                 if y.dtype.is_floating])
            out += [loss, *tape.gradient(loss, [w, x])]        # recorded as one node
            out += tape.gradient([loss, ys[0], ys[-3]], [w, x])  # TensorFlow's own backward
            out += ys
        if on_device:
            lazy.mark_step()        # no recorded gradient pending in the accumulator
        with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as acc:
            zs = [tf.reduce_mean(x * x, axis=1), tf.reshape(x, [4, 6]), tf.nn.softmax(x),
                  tf.nn.sigmoid_cross_entropy_with_logits(labels=hs[0], logits=x)]
        out += zs + [acc.jvp(z) for z in zs]
        if on_device:
            lazy.mark_step()
        return [o.numpy() for o in out]
    return run


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_every_function_gives_the_eager_values_gradients_and_derivatives(dtype):
    eager, lz, metrics = eager_then_lazy(_program(dtype))
    _assert_like_eager(lz, eager, 2e-5 if dtype == tf.float32 else 1e-11)
    assert metrics["tape_recorded"] >= 3
    assert not any(k.startswith("fallback") for k in metrics)


def test_a_repeated_call_skips_tensorflows_wrappers(monkeypatch):
    seen = []
    for module, name in [(gen_math_ops, "mean"), (gen_array_ops, "reshape"),
                         (gen_math_ops, "sigmoid"), (gen_array_ops, "transpose"),
                         (gen_math_ops, "log1p"), (gen_math_ops, "mat_mul"),
                         (gen_array_ops, "strided_slice")]:
        original = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, _o=original, **k: seen.append(1) or _o(*a, **k))
    with lazy.device():
        x = tf.constant([[1.0, 2.0], [3.0, 5.0]]) * 1.0
        with tf.device("CPU:0"):
            labels = tf.constant([[0.0], [1.0], [1.0], [0.0]])
        results = []
        for k in range(4):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = tf.sigmoid(tf.transpose(tf.reshape(x, [1, 4])))[:, ::-1][..., ::-1]
                z = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=y)
                loss = tf.reduce_mean(tf.matmul(z, y, transpose_a=True))
            results.append((loss, tape.gradient(loss, x)))
            if k == 0:
                first = len(seen)
        recorded = len(seen)
        lazy.mark_step()                       # (the compiled program calls them: not counted)
    assert first >= 5 and recorded == first    # later rounds: none of the generated functions
    assert lazy.metrics()["compiles"] == 1
    for loss, grad in results:
        np.testing.assert_allclose(loss.numpy(), results[0][0].numpy())
        np.testing.assert_allclose(grad.numpy(), results[0][1].numpy())
    y = 1 / (1 + np.exp(-np.array([[1.0], [2.0], [3.0], [5.0]])))
    t = np.array([[0.0], [1.0], [1.0], [0.0]])
    z = np.maximum(y, 0) - y * t + np.log1p(np.exp(-np.abs(y)))
    np.testing.assert_allclose(results[-1][0].numpy(), np.mean(z.T @ y), rtol=1e-6)


def test_tensorflows_path_where_the_device_does_not_answer():
    """A tensor argument, an integer tensor, a keyword tensor, another device's scope, a
    graph being built: TensorFlow's own path, with the eager results and placements; a
    function that transposes, and one value passed twice (the same tensor, two tensors of one
    value, a variable and its read) then two values: the eager results."""
    rng = np.random.default_rng(11)
    x0 = random_array(rng, (3, 4))

    @tf.function
    def traced(x):
        return tf.reduce_sum(tf.reshape(x, [-1]))

    def run(on_device):
        x = tf.constant(x0) * 1.0
        i = tf.constant([[1, 2], [3, 4]]) + 0
        sq, sq2 = x[:, :3] * 1.0, x[:, 1:] * 2.0     # the same value twice, then two
        nar, nar2 = x[:, :2] * 1.0, x[:, 2:] * 1.0
        v = tf.Variable(x0[:, :3] * 3.0)
        out = []
        for _ in range(2):
            out += [tf.reduce_sum(x, tf.constant(1)), tf.reduce_max(i, 0),
                    tf.reshape(i, [4]), tf.reduce_mean(input_tensor=x, axis=0),
                    tf.reshape(x, tf.constant([4, 3])), tf.nn.log_softmax(x, axis=0),
                    tf.cast(i, tf.float32), traced(x),
                    tf.matmul(sq, sq), tf.matmul(sq, sq2), tf.matmul(sq2, sq),
                    # one value through two tensors, or a variable and its read, first
                    tf.matmul(nar, tf.identity(nar), transpose_b=True),
                    tf.matmul(nar, nar2, transpose_b=True),
                    tf.matmul(v, v.read_value(), transpose_b=True),
                    tf.matmul(v, sq2, transpose_b=True)]
            with tf.device("CPU:0"):
                placed = tf.reduce_sum(x, 1)
            if on_device:
                assert placed.device.endswith("CPU:0")
            out.append(placed)
        if on_device:
            lazy.mark_step()
        return [o.numpy() for o in out]

    eager, lz, _ = eager_then_lazy(run)
    _assert_like_eager(lz, eager, 1e-6)
    with lazy.device():
        x = tf.constant(x0) * 1.0
        for _ in range(2):          # the device's error naming the op, every time
            with pytest.raises(lazy.LazyError, match="Sum: Invalid reduction dimension"):
                tf.reduce_sum(x, 2)


def test_the_functions_keep_tensorflows_names_documents_and_signatures():
    with lazy.device():
        pass                                   # installed
    for name, (home, attribute) in FUNCTIONS.items():
        public = tf
        for part in name.split("."):
            public = getattr(public, part)
        original = getattr(home, attribute)
        assert inspect.signature(public) == inspect.signature(original.__wrapped__) or \
            inspect.signature(public) == inspect.signature(original)
        assert public.__doc__ == original.__doc__ and public.__name__ == original.__name__
    for name, (cls, attribute) in api_functions.METHODS.items():
        public, original = getattr(type(tf.constant(0.0)), attribute), getattr(cls, attribute)
        assert public.__doc__ == original.__doc__ and public.__name__ == original.__name__
    x = tf.constant([[1.0, 2.0]])              # eager tensors off the device: TensorFlow's
    assert tf.reduce_sum(x).numpy() == 3.0 and not x.device.endswith("LAZY:0")
    assert x[0, 1].numpy() == 2.0 and not x[0].device.endswith("LAZY:0")


_SHAPES = st.lists(st.integers(1, 4), min_size=0, max_size=3)


@st.composite
def _reduction(draw):
    shape = draw(_SHAPES)
    function = draw(st.sampled_from([tf.reduce_sum, tf.reduce_mean, tf.reduce_max,
                                     tf.reduce_min, tf.reduce_prod]))
    rank = len(shape)
    axes = draw(st.one_of(st.none(), st.lists(st.integers(-rank, rank - 1), unique_by=lambda
                                              a: a % rank, max_size=rank) if rank else
                          st.just([])))
    if axes is not None and len(axes) == 1 and draw(st.booleans()):
        axes = axes[0]
    return shape, function, axes, draw(st.booleans())


@settings(max_examples=10, deadline=None)
@given(case=_reduction(), seed=st.integers(0, 2 ** 16), split=st.integers(0, 3))
def test_random_reductions_and_reshapes_give_the_eager_values_and_gradients(case, seed,
                                                                            split):
    shape, function, axes, keepdims = case
    x0 = random_array(np.random.default_rng(seed), shape) + 0.25

    def run(on_device):
        x = tf.constant(x0) * 1.0
        out = []
        for _ in range(2):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = function(x, axes, keepdims)
                size = int(np.prod(y.shape))
                z = tf.reshape(y, [-1, size] if split % 2 else [size])
                loss = tf.reduce_sum(tf.sigmoid(z) * tf.abs(z))
            out += [y, z, loss, tape.gradient(loss, x)]
        if on_device:
            lazy.mark_step()
        return [o.numpy() for o in out]

    eager, lz, _ = eager_then_lazy(run)
    _assert_like_eager(lz, eager, 1e-6)


def test_variable_arguments_are_read_when_called_and_give_eager_gradients():
    """A device variable passed to a function is read as TensorFlow's conversion reads it: its
    value at the call (after earlier updates), the read given to the tape."""
    rng = np.random.default_rng(13)
    v0, x0 = random_array(rng, (3, 4)), random_array(rng, (4, 2))

    def run(on_device):
        v = tf.Variable(v0)
        x = tf.constant(x0) * 1.0
        out = []
        for k in range(3):
            with tf.GradientTape() as tape:
                y = tf.reduce_sum(tf.abs(v)) + tf.reduce_mean(tf.matmul(v, x)) + \
                    tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
                        labels=tf.sigmoid(v), logits=v))
            out += [y, tape.gradient(y, v)]
            v.assign_add(tf.abs(v) * 0.25 + float(k))     # a new value for the next reads
            out.append(tf.reduce_max(v, axis=1))
        if on_device:
            lazy.mark_step()
        return [o.numpy() for o in out]

    eager, lz, metrics = eager_then_lazy(run)
    _assert_like_eager(lz, eager, 1e-5)
    assert metrics["tape_recorded"] == 3


# Random programs of the functions on square matrices (so every map keeps the shape): each
# step maps one earlier value (and maybe a second one, or the host batch) to a new one, or
# reduces one to an output; the values change every round, a variable is updated between.
_MAPS = [
    lambda a, b, h, l: tf.sigmoid(a), lambda a, b, h, l: tf.abs(a),
    lambda a, b, h, l: tf.math.log_sigmoid(a), lambda a, b, h, l: tf.nn.softmax(a),
    lambda a, b, h, l: tf.nn.log_softmax(a, axis=0), lambda a, b, h, l: tf.transpose(a),
    lambda a, b, h, l: tf.matmul(a, b), lambda a, b, h, l: tf.matmul(a, h, transpose_a=True),
    lambda a, b, h, l: tf.reshape(tf.reshape(a, [-1]), tf.shape(a).numpy().tolist()),
    lambda a, b, h, l: tf.squeeze(tf.expand_dims(a, 0), [0]),
    lambda a, b, h, l: tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.sigmoid(b), logits=a),
    lambda a, b, h, l: tf.nn.sigmoid_cross_entropy_with_logits(labels=h, logits=a),
    lambda a, b, h, l: a * tf.expand_dims(tf.nn.softmax_cross_entropy_with_logits(
        labels=tf.nn.softmax(b), logits=a), 1),
    lambda a, b, h, l: b + tf.expand_dims(
        tf.nn.sparse_softmax_cross_entropy_with_logits(l, a), 0),
    lambda a, b, h, l: a[::-1] * h[0] + b[:, -1:],
]
_REDUCE = [tf.reduce_sum, tf.reduce_mean, tf.reduce_max, tf.reduce_min,
           tf.math.reduce_logsumexp, tf.math.reduce_std]
_AXES = [None, 0, 1, -1, [0, 1]]


@settings(max_examples=8, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, len(_MAPS) + len(_REDUCE) - 1),
                                st.integers(0, 50), st.integers(0, 50),
                                st.integers(0, len(_AXES) - 1), st.booleans()),
                      min_size=2, max_size=8),
       n=st.integers(2, 4), seed=st.integers(0, 2 ** 16))
def test_random_programs_of_the_functions_give_the_eager_values_and_gradients(steps, n, seed):
    rng = np.random.default_rng(seed)
    data = [random_array(rng, (n, n)) for _ in range(7)]
    rng_labels = [rng.integers(0, n, n) for _ in range(3)]   # int64 label batches

    def run(on_device):
        v = tf.Variable(data[0])
        out = []
        for r in range(3):                 # new values every round: nothing may be baked
            x = tf.constant(data[1 + r]) * 1.0
            with tf.device("CPU:0"):
                h = tf.constant(data[4 + r])
                l = tf.constant(rng_labels[r])
            with tf.GradientTape() as tape:
                tape.watch(x)
                values, outputs = [x, v * 1.0], []
                for op, i, j, axis, keepdims in steps:
                    a, b = values[i % len(values)], values[j % len(values)]
                    if op < len(_MAPS):
                        values.append(_MAPS[op](a, b, h, l))
                    else:
                        outputs.append(_REDUCE[op - len(_MAPS)](a, _AXES[axis], keepdims))
                loss = tf.add_n([tf.reduce_sum(o) for o in outputs + values[2:]] +
                                [tf.reduce_sum(v)])
            out += [loss, *tape.gradient(loss, [v, x], unconnected_gradients="zero"),
                    *outputs, *values[2:]]
            v.assign_add(x * 0.1)
        if on_device:
            lazy.mark_step()
        return [o.numpy() for o in out]

    eager, lz, _ = eager_then_lazy(run)
    _assert_like_eager(lz, eager, 1e-4)


def _cross_entropies(on_device, labels_dtype, rounds=3):
    """Both softmax cross-entropies on logits of the device, a new host batch of labels (and of
    class probabilities) every round, under a tape: values, the recorded gradient and
    TensorFlow's own backward."""
    rng = np.random.default_rng(17)
    w = tf.Variable(random_array(rng, (5, 4)))
    x = tf.constant(random_array(rng, (6, 5))) * 1.0
    with tf.device("CPU:0"):
        labels = [tf.constant(rng.integers(0, 4, 6), labels_dtype) for _ in range(rounds)]
        probs = [tf.nn.softmax(tf.constant(random_array(rng, (6, 4)))) for _ in range(rounds)]
        labels3 = [tf.constant(rng.integers(0, 4, (2, 3)), labels_dtype) for _ in range(rounds)]
    out = []
    for y, p, y3 in zip(labels, probs, labels3):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            logits = tf.matmul(x, w)
            sparse = tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
            dense = tf.nn.softmax_cross_entropy_with_logits(labels=p, logits=logits)
            rank3 = tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=y3, logits=tf.reshape(logits, [2, 3, 4]))
            loss = tf.reduce_mean(sparse) + tf.reduce_sum(dense * dense) + \
                tf.reduce_sum(rank3)
        out += [sparse, dense, rank3, loss, tape.gradient(loss, w),
                *tape.gradient([sparse, dense], [w, x])]
    if on_device:
        lazy.mark_step()
    return [o.numpy() for o in out]


@pytest.mark.parametrize("labels_dtype", [tf.int32, tf.int64])
def test_cross_entropies_take_new_label_batches_every_call(labels_dtype, monkeypatch):
    """The labels are host batches whose values change every call: a replay takes each as it
    comes (none is baked), with the eager values and gradients, and skips TensorFlow's
    wrappers after the first call."""
    eager, lz, metrics = eager_then_lazy(lambda on: _cross_entropies(on, labels_dtype))
    _assert_like_eager(lz, eager, 1e-5)
    assert not any(k.startswith("fallback") for k in metrics)
    seen = []
    original = gen_nn_ops.sparse_softmax_cross_entropy_with_logits
    monkeypatch.setattr(gen_nn_ops, "sparse_softmax_cross_entropy_with_logits",
                        lambda *a, **k: seen.append(1) or original(*a, **k))
    with lazy.device():
        _cross_entropies(True, labels_dtype, rounds=4)
    # the rank-2 call replays what the first pass learnt; the rank-3 call flattens its
    # labels on the host (a fold of their values, which a template would bake): TensorFlow's
    # path every round
    assert len(seen) == 4


def test_an_index_argument_whose_value_is_folded_or_baked_is_not_learnt(monkeypatch):
    """Were a function whose integer argument becomes a constant (a shape, a permutation, an
    axis) taken as one taking labels, the first call's values would be baked into its
    template: such a call is never learnt, so later values give the eager results."""
    monkeypatch.setattr(api_functions, "INDEX_ARGUMENTS", api_functions.INDEX_ARGUMENTS | {
        "reshape", "transpose", "reduce_sum", "argmax"})
    rng = np.random.default_rng(19)
    x0 = random_array(rng, (3, 3))

    def run(on_device):
        x = tf.constant(x0) * 1.0
        out = []
        with tf.device("CPU:0"):
            shapes = [tf.constant(s) for s in ([9, 1], [1, 9], [3, 3])]
            perms = [tf.constant(p) for p in ([1, 0], [0, 1], [1, 0])]
            axes = [tf.constant(a) for a in ([1], [0], [1])]
        for shape, perm, axis in zip(shapes, perms, axes):
            out += [tf.reshape(x, shape), tf.transpose(x, perm), tf.reduce_sum(x, axis)]
        if on_device:
            lazy.mark_step()
        return [o.numpy() for o in out]

    eager, lz, _ = eager_then_lazy(run)
    _assert_like_eager(lz, eager, 1e-6)


@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
def test_gathers_and_one_hots_take_new_index_batches_every_call(index_dtype, monkeypatch):
    """Host batches of indices and labels whose values change every call: gathered rows and
    columns of device tensors and of a variable, one-hot labels in a loss; the eager values
    and gradients, TensorFlow's wrappers skipped after the first call."""
    rng = np.random.default_rng(23)
    x0, v0 = random_array(rng, (6, 5)), random_array(rng, (6, 5))
    with tf.device("CPU:0"):
        batches = [(tf.constant(rng.integers(0, 6, 4), index_dtype),
                    tf.constant(rng.integers(0, 5, 3), index_dtype),
                    tf.constant(rng.integers(0, 5, 6), index_dtype)) for _ in range(4)]

    def run(on_device, gradients=True):
        x, v = tf.constant(x0) * 1.0, tf.Variable(v0)
        out = []
        for rows, cols, labels in batches:
            with tf.GradientTape(persistent=True) as tape:
                tape.watch(x)
                picked = tf.gather(x, rows)
                columns = tf.gather(x, cols, axis=1)
                onehot = tf.one_hot(labels, 5, dtype=x.dtype)
                loss = tf.reduce_sum(picked ** 2) + tf.reduce_sum(columns * 0.5) + \
                    tf.reduce_sum(onehot * x) + tf.reduce_sum(tf.gather(v, rows)) + \
                    tf.reduce_sum(tf.gather(x, [0, 2]))
            out += [picked, columns, onehot, loss]
            if gradients:      # (TensorFlow's backward of a gather gathers too)
                out += map(tf.convert_to_tensor, tape.gradient(loss, [x, v]))  # (v's: slices)
        if on_device:
            lazy.mark_step()
        return [o.numpy() for o in out]

    eager, lz, metrics = eager_then_lazy(run)
    _assert_like_eager(lz, eager, 1e-6)
    assert not any(k.startswith("fallback") for k in metrics)
    seen = []      # eager calls (the compiled program's trace calls them too: not counted)
    for name in ("gather_v2", "one_hot"):
        original = getattr(gen_array_ops, name)
        monkeypatch.setattr(gen_array_ops, name, lambda *a, _o=original, **k: (
            tf.executing_eagerly() and seen.append(1)) or _o(*a, **k))
    with lazy.device():
        run(True, gradients=False)
    assert not seen


def test_integer_and_bool_tensors_of_the_device_are_taken_where_they_are_computed():
    """An accuracy's comparisons, argmaxes and casts on the device (computed in the step, or
    read back by a barrier and reused: then their values are known, and a first call that
    folded them would bake them), with new values every round: the eager results."""
    rng = np.random.default_rng(29)
    xs = [random_array(rng, (2, 3, 4)) for _ in range(4)]
    with tf.device("CPU:0"):
        labels = [tf.constant(rng.integers(0, 4, (2, 3))) for _ in range(4)]

    def run(on_device):
        out, previous = [], None
        for x0, y in zip(xs, labels):
            x = tf.constant(x0) * 1.0
            predicted = tf.argmax(x, axis=-1)
            hits = tf.equal(predicted, y)
            out += [tf.cast(x > 0.0, tf.float32), tf.cast(hits, x.dtype),
                    tf.reduce_mean(tf.cast(tf.not_equal(predicted, y), tf.float32)),
                    tf.reduce_sum(tf.cast(hits, tf.int32))]
            if previous is not None:    # last round's argmax, now a value read back
                out.append(tf.nn.sparse_softmax_cross_entropy_with_logits(previous, x))
                out.append(tf.cast(tf.equal(previous, predicted), tf.float32))
            previous = predicted
            if on_device:
                lazy.mark_step()
        return [o.numpy() for o in out]

    eager, lz, _ = eager_then_lazy(run)
    _assert_like_eager(lz, eager, 1e-6)


def test_slicing_follows_numpy_behaviour_while_it_is_on(monkeypatch):
    """``x[[2, 0]]`` is an element in TensorFlow's slicing and two rows under NumPy behaviour,
    which TensorFlow switches by a global flag: a slice learnt in one mode is never replayed
    in the other."""
    import tensorflow.experimental.numpy  # noqa: F401  (NumPy-style slicing's methods)
    from tensorflow.python.framework import ops
    x0 = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    with lazy.device():
        x = tf.constant(x0) * 1.0
        element = [x[[2, 0]] for _ in range(3)]          # the first shows the op
        monkeypatch.setattr(ops, "_numpy_style_slicing", True)
        rows = [x[[2, 0]] for _ in range(3)]
        monkeypatch.setattr(ops, "_numpy_style_slicing", False)
        element.append(x[[2, 0]])
        lazy.mark_step()
    for e in element:
        assert e.numpy() == 5.0
    for r in rows:
        np.testing.assert_array_equal(r.numpy(), x0[[2, 0]])
