"""Python operators on device tensors: recorded without TensorFlow's wrappers where that is the
same, TensorFlow's own path everywhere else; every result the eager one."""
import contextlib

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorflow.python.framework import tensor as tensor_lib

from tests.support import eager_then_lazy, random_array
from tfx_vec import lazy
from tfx_vec.lazy.operators import OPERATORS

NUMBERS = [0.75, 3, np.float32(1.25), np.float64(-0.5), np.int64(2), np.float16(0.3)]


def _operands(rng, dtype):
    """(left, right) pairs: tensor and tensor (broadcast), tensor and each kind of number;
    positive values so that ``**`` stays real."""
    def t(shape):
        return tf.constant(np.abs(random_array(rng, shape)) + 0.5, dtype)
    pairs = [(t((3, 4)), t((3, 4))), (t((3, 1)), t((4,)))]
    return pairs + [(t((2, 3)), n) for n in NUMBERS]


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_every_operator_on_tensors_numbers_and_variables_gives_the_eager_results(dtype):
    rng = np.random.default_rng(5)
    pairs = _operands(rng, dtype)
    start = random_array(rng, (2, 3)) + 2.0

    def run(on_device):
        on = [(tf.identity(x), y if not isinstance(y, tf.Tensor) else tf.identity(y))
              for x, y in pairs]                  # on the device when recorded
        v = tf.Variable(tf.constant(start, dtype))
        out = []
        for _ in range(3):                      # the first records, the others take the path
            for name in OPERATORS:
                out += [getattr(x, name)(y) for x, y in on]
                out += [getattr(v, name)(n) for n in NUMBERS]
            out += [-x for x, _ in on] + [-v]
        if on_device:
            lazy.mark_step()
        return [o.numpy() for o in out]

    eager, lz, metrics = eager_then_lazy(run)
    assert len(lz) == len(eager)
    for a, e in zip(lz, eager):
        assert a.dtype == e.dtype
        if a.dtype == bool:
            np.testing.assert_array_equal(a, e)
        else:
            np.testing.assert_allclose(a, e, rtol=1e-6 if dtype == tf.float32 else 1e-12)
    assert metrics["compiles"] == 1 and not any(k.startswith("fallback") for k in metrics)


def test_a_repeated_operator_skips_tensorflows_wrapper(monkeypatch):
    calls = []
    original = tensor_lib.Tensor.__mul__

    def counted(x, y):
        calls.append(1)
        return original(x, y)
    monkeypatch.setattr(tensor_lib.Tensor, "__mul__", counted)
    with lazy.device():
        x = tf.constant([1.0, 2.0]) + 0.0
        v = tf.Variable([3.0, 4.0, 5.0])
        ys, zs = [x * 0.5], [v * 2.0]     # the first of each records the op's recipe
        first = len(calls)
        ys += [x * 0.5 for _ in range(4)]
        zs += [v * 2.0 for _ in range(4)]
        lazy.mark_step()
    assert first <= 2 and len(calls) == first
    assert [y.numpy().tolist() for y in ys] == [[0.5, 1.0]] * 5
    assert [z.numpy().tolist() for z in zs] == [[6.0, 8.0, 10.0]] * 5


def test_tensorflows_own_path_where_something_else_sees_the_op(monkeypatch):
    """For other dtypes, with mismatched dtypes, under another device's scope and for integers
    a double cannot hold, the operator is TensorFlow's; under a gradient tape it is recorded
    on the tape too: the same results, gradients, errors and placements as eager."""
    rng = np.random.default_rng(7)
    a0, b0 = random_array(rng, (3,)), random_array(rng, (3,))

    def run(on_device):
        a, b = tf.Variable(a0), tf.constant(b0) + 0.0
        i = tf.constant([7, 8, 9]) + 0
        _ = [b * 2.0 for _ in range(2)]
        with tf.GradientTape(persistent=True) as tape:
            y = a * b * 2.0 + a ** 2.0 - 1.0 / a
            loss = tf.reduce_sum(y)
        grad = tape.gradient(loss, a)
        # several targets: TensorFlow's own backward, from the ops its tape recorded
        grad_tf = tape.gradient([loss, y], a)
        ints = [i * 3, i / 2, i - 1]
        big = b * (2 ** 60 + 1)
        with pytest.raises((TypeError, tf.errors.InvalidArgumentError, lazy.LazyError)):
            _ = b * tf.constant([1.0, 2.0, 3.0], tf.float64)
        with tf.device("CPU:0"):
            placed = b * 3.0
        if on_device:
            assert placed.device.endswith("CPU:0")
            lazy.mark_step()
        return [x.numpy() for x in [loss, grad, grad_tf, *ints, big, placed]]

    eager, lz, _ = eager_then_lazy(run)
    for a, e in zip(lz, eager):
        assert a.dtype == e.dtype
        np.testing.assert_allclose(a, e, rtol=1e-6)


def _taped_program(on_device):
    """Operators under tapes on device tensors, host tensors (either side), numbers and
    variables (either side); gradients TensorFlow's way and the recorded way; forward-mode
    derivatives."""
    rng = np.random.default_rng(21)
    a0, b0, h0 = (random_array(rng, (3,)) + 2.0 for _ in range(3))
    a, b = tf.Variable(a0), tf.constant(b0) * 1.0
    with tf.device("CPU:0"):
        h = tf.constant(h0)                 # a host tensor, as a tf.data batch is
    out = []
    for _ in range(3):                      # the first records the recipes
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(b)
            y = a * b + h * a - b / h + 2.0 ** b - a ** 2.0
            z = h - y * 0.5 + a + (b - a) * h
            loss = tf.reduce_sum(z)
        out.append(tape.gradient(loss, a))           # one target: recorded as one node
        out += tape.gradient([loss, z], [a, b])      # several: TensorFlow's own backward
        with tf.GradientTape() as outer:
            outer.watch(b)
            with tf.GradientTape() as inner:
                inner.watch(b)
                c = b * b * b + 3.0 * b
            d = inner.gradient(c, b)
        out += [d, outer.gradient(d, b)]             # a second derivative
        with tf.GradientTape() as host_tape:
            host_tape.watch(h)
            e = tf.reduce_sum(h * a * h - 1.0 / h)
        out.append(host_tape.gradient(e, h))         # a watched host tensor
        out += [loss, z]
    if on_device:
        lazy.mark_step()
    for _ in range(3):
        with tf.autodiff.ForwardAccumulator(b, tf.ones_like(b)) as acc:
            f = b * b * 0.5 + b * h - 2.0 / b
        out += [f, acc.jvp(f)]
    return [o.numpy() for o in out]


def test_operators_under_tapes_give_tensorflows_gradients_and_skip_its_wrappers(monkeypatch):
    eager, lz, metrics = eager_then_lazy(_taped_program)
    assert len(lz) == len(eager)
    for a, e in zip(lz, eager):
        assert a.dtype == e.dtype
        np.testing.assert_allclose(a, e, rtol=1e-6)
    assert metrics["tape_recorded"] >= 3 and not any(k.startswith("fallback") for k in metrics)
    calls = []
    for name in ("__mul__", "__rmul__", "__sub__", "__add__"):
        original = getattr(tensor_lib.Tensor, name)
        monkeypatch.setattr(tensor_lib.Tensor, name,
                            lambda x, y, _o=original: calls.append(1) or _o(x, y))
    with lazy.device():
        a, b = tf.Variable([1.0, 2.0]), tf.constant([3.0, 4.0]) * 1.0
        for k in range(3):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(a * b - 2.0 * a + b * a)
            g = tape.gradient(loss, a)
            if k == 0:
                first = len(calls)
        lazy.mark_step()
    assert g.numpy().tolist() == [4.0, 6.0]
    assert len(calls) == first     # the two last rounds recorded every operator directly


def test_tensors_off_the_device_keep_tensorflows_operators():
    with lazy.device():
        pass                                  # the operators are installed
    x = tf.constant([1.0, 2.0])
    results = [(x * 2.0), (2.0 * x), (x + x), (x ** 2), (1.0 / x), (x - 1)]
    assert all(r.device.endswith("CPU:0") for r in results)
    assert [r.numpy().tolist() for r in results] == [[2.0, 4.0], [2.0, 4.0], [2.0, 4.0],
                                                      [1.0, 4.0], [1.0, 0.5], [0.0, 1.0]]

    @tf.function
    def traced(v):
        return v * 2.0 + 1.0
    assert traced(x).numpy().tolist() == [3.0, 5.0]


def test_a_variable_operand_reads_the_value_of_that_moment():
    def run(on_device):
        v = tf.Variable([1.0, 2.0])
        reads = []
        for k in range(3):
            reads += [v * 2.0, 1.0 - v, v / v]
            v.assign_add([0.5, float(k)])
            reads.append(v ** 2.0)
        if on_device:
            lazy.mark_step()
        return [r.numpy() for r in reads]

    eager, lz, metrics = eager_then_lazy(run)
    for a, e in zip(lz, eager):
        np.testing.assert_allclose(a, e, rtol=1e-6)
    assert metrics["compiles"] == 1


def test_updates_by_device_tensors_and_variables_give_the_eager_values_and_return_values(
        monkeypatch):
    from tensorflow.python.ops import gen_resource_variable_ops as gen
    calls = []
    for name in ("assign_variable_op", "assign_add_variable_op", "assign_sub_variable_op"):
        original = getattr(gen, name)
        monkeypatch.setattr(gen, name, lambda *a, _o=original, **k: calls.append(1) or _o(*a, **k))
    rng = np.random.default_rng(11)
    start, delta = random_array(rng, (2, 3)), random_array(rng, (2, 3))

    def run(on_device):
        v = tf.Variable(start)
        u = tf.Variable(delta * 3.0)
        d = tf.constant(delta) + 0.0           # on the device when recorded
        out, through_tf = [], []
        for _ in range(3):
            before = len(calls)
            out.append(v.assign_add(d) + 0.0)
            out.append(tf.identity(v.assign_sub(0.5 * d)))
            assert v.assign(v * 2.0, read_value=False) is None
            out.append(v.read_value())
            u.assign_sub(d)                    # a variable's value: the one after this update
            v.assign_add(u)
            out.append(v.read_value())
            through_tf.append(len(calls) - before)
        with pytest.raises(Exception, match="shape|expected float32"):
            v.assign_add(tf.constant([1.0, 2.0]) + 0.0)
        if on_device:
            lazy.mark_step()
        return [o.numpy() for o in out], through_tf

    eager, lz, _ = eager_then_lazy(run)
    for a, e in zip(lz[0], eager[0]):
        np.testing.assert_allclose(a, e, rtol=1e-6)
    assert eager[1] == [5, 5, 5] and lz[1] == [0, 0, 0]   # no update through TF's wrappers


def test_a_variable_numpy_reads_its_value_after_pending_updates_as_eager_does():
    """``v.numpy()`` reads the host resource directly (no op recorded on the device): the value
    after the updates pending or in flight, and the tape told of the read as eagerly."""
    def run(on_device):
        v = tf.Variable([1.0, 2.0])
        steps = tf.Variable(0, dtype=tf.int64)
        out, watched = [], []
        for k in range(3):
            v.assign_add(tf.constant([0.5, -1.0]) * float(k + 1))
            out.append(v.numpy())                         # a pending update: computed first
            steps.assign_add(1)
            if on_device:
                before = lazy.metrics().get("ops_recorded", 0)
                lazy.mark_step(wait=False)                # an update in flight
                out.append(steps.numpy())
                assert lazy.metrics().get("ops_recorded", 0) == before
            else:
                out.append(steps.numpy())
            with tf.GradientTape() as tape:
                out.append(np.array(v.numpy()))
            watched.append([w.name for w in tape.watched_variables()])
        return out, watched

    eager, lz, _ = eager_then_lazy(run)
    for a, e in zip(lz[0], eager[0]):
        assert np.asarray(a).dtype == np.asarray(e).dtype
        np.testing.assert_array_equal(a, e)
    assert lz[1] == eager[1]


def test_a_scalar_variable_updated_by_numbers_gives_the_eager_values_as_parameters(
        monkeypatch):
    """``steps.assign_add(1)`` on a scalar device variable is substituted directly (a
    parameter, one program for every value); numbers TensorFlow would convert otherwise, or
    refuse, and non-scalar variables take TensorFlow's path with its results and errors."""
    from tensorflow.python.ops import gen_resource_variable_ops as gen
    calls = []
    original = gen.assign_add_variable_op
    monkeypatch.setattr(gen, "assign_add_variable_op",
                        lambda *a, **k: calls.append(1) or original(*a, **k))

    def run(on_device):
        steps = tf.Variable(0, dtype=tf.int64)
        count = tf.Variable(3, dtype=tf.int32)
        lr = tf.Variable(0.5)
        vec = tf.Variable([1.0, 2.0])
        out = []
        for k in range(4):
            steps.assign_add(1)
            count.assign_sub(np.int32(k))
            lr.assign(lr * 0.5 + k)
            lr.assign_add(np.float64(0.25) * k)
            out.append(steps + 0)
            vec.assign_add([0.5, 1.0])                    # not a scalar: TensorFlow's path
            if on_device:
                lazy.mark_step()
        with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError)):
            steps.assign_add(1.5)
        big = tf.Variable(0.0)
        big.assign(2 ** 60 + 1)
        return [o.numpy() for o in out] + [v.numpy() for v in (steps, count, lr, vec, big)]

    eager = run(False)
    through_tf = len(calls)
    _, lz, metrics = eager_then_lazy(run)
    for a, e in zip(lz, eager):
        assert a.dtype == e.dtype
        np.testing.assert_allclose(a, e, rtol=1e-6)
    assert metrics["compiles"] <= 3, metrics
    # eagerly steps, lr and vec each step; lazily only vec (eager_then_lazy runs eagerly too)
    assert through_tf == 12 and len(calls) - 2 * through_tf == 4


def test_numbers_become_parameters_not_constants():
    """Each step's new learning rate is a parameter of the same compiled program."""
    with lazy.device():
        w = tf.Variable([1.0, 2.0])
        lazy.reset_metrics()
        for lr in np.linspace(0.1, 0.5, 6):
            w.assign_sub(lr * (w * 0.5))
            lazy.mark_step()
    m = lazy.metrics()
    expected = np.array([1.0, 2.0])
    for lr in np.linspace(0.1, 0.5, 6):
        expected = expected - lr * expected * 0.5
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6)
    assert m["compiles"] <= 2, m


def test_operator_pairs_cover_both_orders():
    """``2.0 - x`` is ``Sub(2.0, x)``, not ``Sub(x, 2.0)``: the swapped operators keep order;
    ``2.0 < x`` is Python's ``x > 2.0``."""
    with lazy.device():
        x = tf.constant([1.0, 4.0]) + 0.0
        pairs = [(2.0 - x, 2.0 / x, 2.0 ** x, 2.0 < x, 2.0 >= x) for _ in range(3)]
        lazy.mark_step()
    for s, d, p, lt, ge in pairs:
        assert s.numpy().tolist() == [1.0, -2.0]
        assert d.numpy().tolist() == [2.0, 0.5]
        assert p.numpy().tolist() == [2.0, 16.0]
        assert lt.numpy().tolist() == [False, True] and ge.numpy().tolist() == [True, False]
    for name, (_, swapped) in OPERATORS.items():
        assert name.replace("__r", "__", 1) in OPERATORS
        assert swapped == name.startswith("__r")


# {{{ random programs of operators, reads and updates

# (no -0.0: eager TensorFlow converts it through a scalar cache that may hand back an earlier
# 0.0; the device keeps its sign, see test_device.py)
_NUMBER = st.one_of(st.floats(-2, 2, width=32).map(lambda v: v if v else 0.0), st.integers(-3, 3),
                    st.floats(0.125, 2, width=32).map(np.float32),
                    st.floats(0.1, 2).map(np.float64), st.integers(1, 4).map(np.int64))
_STEP = st.one_of(
    st.tuples(st.just("op"), st.sampled_from([k for k, (op, _) in OPERATORS.items()
                                               if op in ("AddV2", "Sub", "Mul", "RealDiv")]),
              st.integers(0, 3), st.sampled_from(["number", "tensor", "variable"]), _NUMBER,
              st.integers(0, 3)),
    st.tuples(st.just("update"), st.sampled_from(["assign", "assign_add", "assign_sub"]),
              st.integers(0, 1), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("read"), st.integers(0, 1), st.integers(0, 3)),
    st.tuples(st.just("neg"), st.integers(0, 3)))


def _program(steps, dtype, values, taped=False):
    """Run ``steps`` three times over two variables and four tensors, under a gradient tape
    when ``taped`` (then with the gradient of every value made towards the variables); every
    value made."""
    def run(on_device):
        vs = [tf.Variable(tf.constant(values[k], dtype)) for k in range(2)]
        ts = [tf.constant(values[2 + k], dtype) * 1.0 for k in range(4)]
        out = []
        for _ in range(3):
            made = []
            with tf.GradientTape(persistent=True) if taped else contextlib.nullcontext() as tape:
                for step in steps:
                    made += _step(step, vs, ts)
            if taped and made:
                made += [tf.convert_to_tensor(g) for g in tape.gradient(
                    tf.add_n([tf.reduce_sum(m) for m in made]), vs,
                    unconnected_gradients=tf.UnconnectedGradients.ZERO)]
            out += made
            if on_device:
                lazy.mark_step()
        return [o.numpy() for o in out + [v.read_value() for v in vs]]
    return run


def _step(step, vs, ts):
    """One step of a random program on variables ``vs`` and tensors ``ts``; what it made."""
    if step[0] == "op":
        _, name, i, kind, number, j = step
        y = {"number": number, "tensor": ts[j], "variable": vs[j % 2]}[kind]
        ts[i] = tf.clip_by_value(getattr(ts[i], name)(y), -10.0, 10.0)
        return [ts[i]]
    if step[0] == "update":
        _, name, k, j, read_value = step
        got = getattr(vs[k], name)(tf.clip_by_value(ts[j] * 0.1, -1.0, 1.0),
                                   read_value=read_value)
        return [got + 0.0] if read_value else []
    if step[0] == "neg":
        ts[step[1]] = -ts[step[1]]
        return [ts[step[1]]]
    _, k, i = step
    ts[i] = vs[k] * 1.0 + ts[i] * 0.5
    return [ts[i]]


@settings(max_examples=8)
@given(steps=st.lists(_STEP, min_size=3, max_size=15),
       dtype=st.sampled_from([tf.float32, tf.float64]),
       shape=st.sampled_from([(3,), (2, 3)]), seed=st.integers(0, 2 ** 16),
       taped=st.booleans())
def test_random_programs_of_operators_reads_and_updates_give_the_eager_values(
        steps, dtype, shape, seed, taped):
    values = np.random.default_rng(seed).uniform(0.5, 1.5, size=(6,) + shape)
    eager, lz, metrics = eager_then_lazy(_program(steps, dtype, values, taped))
    assert len(lz) == len(eager)
    # XLA fuses and orders the arithmetic its own way: float32 rounding, amplified where a
    # gradient sums terms that nearly cancel, is measured against the largest value
    tol = 1e-4 if dtype == tf.float32 else 1e-9
    for a, e in zip(lz, eager):
        assert a.dtype == e.dtype
        np.testing.assert_allclose(a, e, rtol=tol, atol=tol * max(1.0, np.abs(e).max()))
    assert not any(k.startswith("fallback") for k in metrics)
# }}}
