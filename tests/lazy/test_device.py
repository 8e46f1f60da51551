"""``lazy.device()``: ordinary TensorFlow code recorded unchanged, and every way it used to fail
silently now a right answer or a clear error (one regression test each)."""
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.support import eager_then_lazy, random_array
from tfx_vec import lazy


def _close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


# {{{ the surfaces programs are written against

class _Linear(tf.Module):
    def __init__(self, w, b):
        super().__init__()
        self.w, self.b = tf.Variable(w), tf.Variable(b)

    def __call__(self, x):
        return tf.matmul(x, self.w) + self.b


def _fit_module(w, b, xs, ys):
    model = _Linear(w, b)
    losses = []
    for x, y in zip(xs, ys):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        assert len(grads) == 2 and all(g is not None for g in grads)
        for g, v in zip(grads, model.trainable_variables):
            v.assign_sub(0.1 * g)
        lazy.mark_step()
        losses.append(float(loss))
    return losses, [v.numpy() for v in model.trainable_variables]


def test_tf_module_sees_the_variables_and_trains():
    rng = np.random.default_rng(0)
    w, b = random_array(rng, (3, 2)), random_array(rng, (2,))
    xs = [random_array(rng, (4, 3)) for _ in range(3)]
    ys = [random_array(rng, (4, 2)) for _ in range(3)]
    eager = _fit_module(w, b, xs, ys)
    with lazy.device():
        lz = _fit_module(w, b, xs, ys)
    _close(lz[0], eager[0])
    for a, e in zip(lz[1], eager[1]):
        _close(a, e)
    assert not np.allclose(lz[1][0], w)    # it trained


def test_lazy_variables_in_a_tf_module_are_a_clear_error_not_an_empty_gradient():
    """``tf.Module.trainable_variables`` does not list ``lazy.Variable``s: the gradient over it
    would silently be ``[]`` and the model would never train."""
    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = lazy.Variable([1.0, 2.0])

    model = Model()
    assert model.trainable_variables == ()
    with lazy.GradientTape() as tape:
        loss = tf.reduce_sum(model.w * 3.0)
    with pytest.raises(lazy.LazyGradientError, match="trainable_variables list tf.Variables"):
        tape.gradient(loss, model.trainable_variables)


def test_python_control_flow_print_and_float_on_values(capsys):
    with lazy.device():
        x = tf.constant([1.0, -2.0, 3.0]) * 2.0
        total = tf.reduce_sum(x)
        branch = tf.abs(x) if float(total) > 0 else -x    # a value decides: a barrier
        print(branch)
        steps = 0
        while float(tf.reduce_max(x)) > 1.0 and steps < 10:
            x = x / 2.0
            steps += 1
    assert "[2. 4. 6.]" in capsys.readouterr().out
    assert steps == 3 and lazy.metrics()["forced"] >= 4


def test_variables_created_outside_the_scope_are_counted_fallbacks_never_stale():
    """A variable that lives outside the device is read and updated at once, on the host, as in
    eager (counted per line); with fallbacks as errors it is an error."""
    v = tf.Variable([1.0, 2.0])
    with lazy.device():
        x = tf.constant([3.0, 4.0]) * 2.0
        v.assign_add(x)                    # forces x, updates v now
        y = v * 10.0                       # a lazy read of the new value
        v.assign([0.0, 0.0])
        got = y.numpy()
        assert "fallback::AssignAddVariableOp" in lazy.metrics()
        lazy.set_fallback_error(True)
        with pytest.raises(lazy.LazyFallbackError, match="outside lazy.device.*test_device"):
            v.assign_add([1.0, 1.0])
    _close(got, [70.0, 100.0])
    _close(v.numpy(), [0.0, 0.0])


def test_a_checkpoint_saves_and_restores_device_variables(tmp_path):
    with lazy.device():
        v = tf.Variable([1.0, 2.0])
        v.assign_add([1.0, 1.0])
        checkpoint = tf.train.Checkpoint(v=v)
        path = checkpoint.save(str(tmp_path / "ck"))   # its save counter lives on the CPU
        v.assign([0.0, 0.0])
        checkpoint.restore(path)
        _close(v.numpy(), [2.0, 3.0])


def test_data_fetch_starts_a_step():
    """Without ``mark_step``, each ``tf.data`` batch fetched inside the scope is a barrier:
    the loop compiles one program and reuses it."""
    data = np.arange(24, dtype=np.float32).reshape(6, 4)
    with lazy.device():
        w = tf.Variable(tf.ones([4]))
        for x in tf.data.Dataset.from_tensor_slices(data).batch(2):
            w.assign_add(tf.reduce_mean(x, axis=0))
        result = w.numpy()
    _close(result, 1.0 + data.reshape(3, 2, 4).mean(axis=1).sum(axis=0))
    m = lazy.metrics()
    assert m["host::IteratorGetNext"] == 4 and m["compiles"] <= 3

def test_what_an_update_returns_reads_the_variable_when_used_as_in_eager():
    """``assign*`` returns the variable itself, to be read later (kept once per variable on
    the device): every use reads the value of that moment, and gradients flow through it."""
    rng = np.random.default_rng(3)
    start, delta = random_array(rng, (3,)), random_array(rng, (3,))

    def run(on_device):
        v = tf.Variable(start)
        with tf.GradientTape() as tape:
            added = v.assign_add(delta)
            subtracted = v.assign_sub(0.5 * delta)
            loss = tf.reduce_sum(added * subtracted * v)   # all three read start + delta / 2
        grad = tape.gradient(loss, v)
        scaled = v.assign(2.0 * v)
        later = [added.read_value(), subtracted + 0.0, tf.identity(scaled)]
        if on_device:
            lazy.mark_step()
        return [x.numpy() for x in [loss, grad, *later]], added is v.assign_add(delta)

    eager, lazy_result, _ = eager_then_lazy(run)
    for a, e in zip(lazy_result[0], eager[0]):
        _close(a, e)
    assert lazy_result[1]        # one object per variable on the device; new ones eagerly
    assert not eager[1]

# }}}


# {{{ never silent

def test_forced_numpy_scalars_are_parameters_not_constants():
    """A value read with ``.numpy()`` and reused in tensor math changes every step: baked in,
    it would compile a new program each step."""
    with lazy.device():
        w = tf.Variable([1.0, 2.0])
        count = tf.Variable(0.0)
        for _ in range(6):
            lr = 0.5 / (1.0 + count.numpy())           # a NumPy scalar from a forced value
            w.assign_sub(lr * w)
            count.assign_add(1.0)
            lazy.mark_step()
        got = w.numpy()
    expected = np.array([1.0, 2.0])
    for k in range(6):
        expected = expected - 0.5 / (1.0 + k) * expected
    _close(got, expected)
    assert lazy.metrics()["compiles"] <= 2, lazy.metrics_report()
    w2 = lazy.Variable([1.0, 2.0])
    lazy.reset_metrics()
    for k in range(6):
        w2.assign_sub(np.float32(0.5 / (1.0 + k)) * w2)   # the explicit API alike
        lazy.mark_step()
    _close(w2.numpy(), expected)
    assert lazy.metrics()["compiles"] == 1


@pytest.mark.parametrize("api", ["device", "explicit"])
def test_max_graph_size_cuts_chains_of_variable_updates(api):
    lazy.configure(max_graph_size=50)
    if api == "device":
        with lazy.device():
            v = tf.Variable(tf.zeros([3]))
            for _ in range(300):
                v.assign_sub(tf.fill([3], 0.5))
            got = v.numpy()
    else:
        v = lazy.Variable(np.zeros(3, np.float32))
        for _ in range(300):
            v.assign_sub(np.full(3, 0.5, np.float32))
        got = v.numpy()
    _close(got, np.full(3, -150.0))
    assert lazy.metrics()["graph_size_cuts"] >= 5


def _unstack_step(x, h, s):
    a, b, c = tf.unstack(tf.tanh(x) * s, axis=0)   # several outputs; a host scalar
    return tf.reduce_sum(a * h + b - c) + h          # a host tensor; a baked axis


def test_an_op_recorded_again_records_what_its_first_recording_did():
    """From its second recording on, an op on inputs of the same signatures skips describing
    and inferring it (a cached recipe): the values, the ops counted and the size cuts stay
    those of the first recording, host inputs included."""
    rng = np.random.default_rng(5)
    x0, h0 = random_array(rng, (3, 4)), random_array(rng, (4,))
    scales = [np.float32(v) for v in rng.uniform(0.5, 1.5, 4)]
    expected = [_unstack_step(tf.constant(x0) * s, tf.constant(h0), tf.constant(s)).numpy()
                for s in scales]
    counts, got = [], []
    with lazy.device():
        for s in scales:
            before = lazy.metrics().get("ops_recorded", 0)
            y = _unstack_step(tf.constant(x0) * s, tf.constant(h0), tf.constant(s))
            counts.append(lazy.metrics()["ops_recorded"] - before)
            got.append(y.numpy())
        lazy.configure(max_graph_size=30)
        z, e = tf.constant(x0) * 1.0, tf.constant(x0)
        for _ in range(100):
            z = tf.sin(z) + scales[0]
        z = z.numpy()
    for _ in range(100):
        e = tf.sin(e) + scales[0]
    assert len(set(counts)) == 1 and counts[0] >= 6
    for a, b in zip(got, expected):
        _close(a, b)
    _close(z, e)
    assert lazy.metrics()["graph_size_cuts"] >= 5


def _constant_inputs_step(x):
    """TensorFlow API calls whose axes, shapes, permutations and multiples are host tensors
    made each call (compile-time constants of the program), some of them int64."""
    out = [tf.reduce_sum(x, axis=0), tf.reduce_sum(x, axis=1), tf.reduce_mean(x, axis=-1),
           tf.reduce_max(x, axis=[0, 1]), tf.reduce_sum(x, axis=tf.constant(1, tf.int64)),
           tf.reduce_mean(x, axis=0, keepdims=True), tf.reshape(x, [4, 3]),
           tf.reshape(x, [2, 6]), tf.reshape(x, tf.constant([6, 2], tf.int64)),
           tf.transpose(x, [1, 0]), tf.tile(x, [2, 1]), tf.tile(x, [1, 2]),
           tf.expand_dims(x, 0), tf.expand_dims(x, -1), tf.reduce_mean(x)]
    return [tf.reshape(o, [-1]) for o in out]


def test_an_op_with_host_constant_inputs_is_recorded_again_without_describing_it(
        monkeypatch):
    """The second time, an op whose compile-time constant inputs are host tensors with the
    values of an earlier call is recorded from its kept recipe: calls with other values, in
    any order, each keep their own."""
    from tfx_vec.lazy import raw
    rng = np.random.default_rng(9)
    xs = [random_array(rng, (3, 4)) for _ in range(3)]
    expected = [[o.numpy() for o in _constant_inputs_step(tf.constant(x))] for x in xs]
    described = []
    original = raw.describe
    monkeypatch.setattr(raw, "describe", lambda *a: described.append(a[0]) or original(*a))
    got = []
    with lazy.device():
        for k, x in enumerate(xs):
            if k == 1:
                described.clear()
            got.append(_constant_inputs_step(tf.constant(x) * 1.0))
            lazy.mark_step()
    assert described == []
    for row, want in zip(got, expected):
        for a, e in zip(row, want):
            _close(a.numpy(), e)


def test_a_lazy_variable_captured_by_tf_function_is_an_error_at_trace_time():
    w = lazy.Variable([1.0, 2.0])
    for fn in (lambda x: x * w, lambda x: w * x, lambda x: w.assign_add(x),
               lambda x: w.numpy() * x):
        with pytest.raises(lazy.LazyError, match="tf.function"):
            tf.function(fn, autograph=False)(tf.constant([1.0, 1.0]))
    with pytest.raises(lazy.LazyError, match="tf.function"):
        tf.function(lambda: w * 2.0)()


def test_a_tf_function_on_device_variables_runs_after_the_pending_work():
    """A ``tf.function`` (its own compiled program) may update a device variable in place: the
    pending work that reads it is computed first, so it sees the old value, as in eager."""
    def run():
        v = tf.Variable([1.0, 2.0])
        before = v * 3.0
        f = tf.function(lambda a: v.assign_add(a) * 2.0)
        after = f(tf.constant([1.0, 1.0]))
        return [before.numpy(), after.numpy(), v.numpy()]
    eager = run()
    with lazy.device():
        lz = run()
    for a, e in zip(lz, eager):
        _close(a, e)
    assert any(k.startswith("host::__inference") for k in lazy.metrics())


@pytest.mark.parametrize("api", ["device", "explicit"])
def test_mixed_eager_and_lazy_operands_record_in_either_order(api):
    e, eb = tf.constant([3.0, 4.0]), tf.constant([True, False])
    with lazy.device():
        x = tf.constant([1.0, 2.0]) * 1.0 if api == "device" else lazy.tensor([1.0, 2.0])
        b = tf.logical_not(tf.constant([False, True])) if api == "device" else \
            lazy.tensor([True, True])
        pairs = [(e + x, x + e), (e * x, x * e), (e - x, x - e), (e / x, x / e),
                 (e == x, x == e), (e != x, x != e), (e < x, x > e), (eb & b, b & eb)]
        values = [(p.numpy(), q.numpy()) for p, q in pairs]
    en, xn, ebn, bn = e.numpy(), np.array([1.0, 2.0]), eb.numpy(), np.array([True, True])
    expected = [(en + xn, xn + en), (en * xn, xn * en), (en - xn, xn - en), (en / xn, xn / en),
                (en == xn, xn == en), (en != xn, xn != en), (en < xn, xn > en),
                (ebn & bn, bn & ebn)]
    for (p, q), (ep, eq) in zip(values, expected):
        _close(p, ep)
        _close(q, eq)
    assert not [k for k in lazy.metrics() if k.startswith("fallback::")], lazy.metrics()


@pytest.mark.parametrize("api", ["device", "explicit"])
def test_fallbacks_are_counted_per_op_and_line_and_can_be_errors(api):
    def unique():
        if api == "device":
            with lazy.device():
                x = tf.constant([3.0, 1.0, 3.0, 2.0]) * 1.0
                return tf.unique(x).y                     # a value-dependent output shape
        return tf.unique(lazy.tensor([3.0, 1.0, 3.0, 2.0])).y
    np.testing.assert_array_equal(unique().numpy(), [3.0, 1.0, 2.0])
    op = "Unique" if api == "device" else "unique"
    assert lazy.metrics()[f"fallback::{op}"] == 1
    (site,) = lazy.fallback_sites()[op]
    assert re.search(r"test_device\.py:\d+ in unique", site), site
    assert "test_device.py" in lazy.metrics_report()
    lazy.set_fallback_error(True)
    with pytest.raises(Exception, match=rf"{op}.*test_device\.py:\d+"):
        unique()


def test_metrics_report_names_the_cause_of_every_recompilation():
    def step(x, w, columns=2):
        y = tf.reduce_sum(tf.reshape(x, [-1, columns]) * tf.cast(w, x.dtype))
        lazy.mark_step()
        return y
    rng = np.random.default_rng(0)
    with lazy.device():
        w = tf.Variable(2.0)
        lazy.mark_step()
        step(rng.normal(size=(4, 2)).astype(np.float32), w)
        step(rng.normal(size=(4, 2)).astype(np.float32), w)   # same program: no recompilation
        step(rng.normal(size=(6, 2)).astype(np.float32), w)   # a new input shape
        step(rng.normal(size=(6, 2)).astype(np.float32), w, 3)   # a new baked constant
        step(rng.normal(size=(6, 2)).astype(np.float64), w)   # a new dtype
    report = lazy.metrics_report()
    causes = lazy.recompilations()
    assert len(causes) == 3, causes
    for cause, what in zip(causes, [r"input %\d+ \(data\) changed shape: f32\[4,2\] -> "
                                    r"f32\[6,2\]",
                                    r"constant %\d+ \(an input of Reshape\) changed: "
                                    r"\(-1, 2\) -> \(-1, 3\)",
                                    r"input %\d+ \(data\) changed dtype: f32\[6,2\] -> "
                                    r"f64\[6,2\]"]):
        assert re.search(r"mark_step at .*test_device\.py:\d+ in step: " + what, cause), cause
        assert cause in report


def test_configure_rejects_bad_arguments_at_once():
    for kwargs, error, text in [({"max_graphs": "3"}, TypeError, "int >= 1 or None, got str"),
                                ({"max_graphs": 0}, ValueError, ">= 1"),
                                ({"cache_size": 2.5}, TypeError, "an int >= 1"),
                                ({"max_graph_size": True}, TypeError, "got bool"),
                                ({"fallback_error": "yes"}, TypeError, "True or False"),
                                ({"record_calls": 1}, TypeError, "True or False")]:
        with pytest.raises(error, match=re.escape(text)):
            lazy.configure(**kwargs)
    with pytest.raises(TypeError):
        lazy.configure(max_graph=3)     # a misspelt name is not silently ignored
    assert lazy.configure()["max_graphs"] is None   # nothing was changed by the failures
# }}}


# {{{ where XLA's semantics differ from eager TensorFlow (docs/lazy.md lists them)

def _jit(fn, *args):
    return tf.function(fn, jit_compile=True)(*args).numpy()


def test_float_to_int_casts_saturate_as_xla_does():
    x = np.array([300.0, -300.0, 127.9, 1e10, np.nan], np.float32)
    with lazy.device():
        lz8 = tf.cast(tf.constant(x) * 1.0, tf.int8).numpy()
        lz32 = tf.cast(tf.constant(x) * 1.0, tf.int32).numpy()
    np.testing.assert_array_equal(lz8, [127, -128, 127, 127, 0])
    np.testing.assert_array_equal(lz8, _jit(lambda a: tf.cast(a, tf.int8), x))
    np.testing.assert_array_equal(lz32, _jit(lambda a: tf.cast(a, tf.int32), x))
    np.testing.assert_array_equal(tf.cast(x, tf.int8).numpy()[:2], [44, -44])   # eager wraps


def test_out_of_range_gather_and_integer_division_by_zero_follow_xla():
    params, idx = np.array([1.0, 2.0, 3.0], np.float32), np.array([0, 5, -1], np.int32)
    with lazy.device():
        got = tf.gather(tf.constant(params) * 1.0, tf.constant(idx)).numpy()
        seven, zero = tf.constant([7.0]) * 1.0, tf.constant([0.0]) * 1.0
        div = (tf.cast(seven, tf.int32) // tf.cast(zero, tf.int32)).numpy()
    np.testing.assert_array_equal(got, _jit(tf.gather, params, idx))   # clamped
    np.testing.assert_array_equal(div, [-1])
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.gather(params, idx)                                            # eager raises


def test_a_negative_zero_operand_keeps_its_sign_once_its_op_is_known():
    """``x / -0.0`` on the device is IEEE's (``-inf`` for a positive ``x``), as NumPy computes
    it, in every step after an op's first recording; eager TensorFlow converts a Python -0.0
    through a scalar cache that hands back an earlier 0.0 of the same dtype."""
    x = np.array([1.0, -2.0], np.float32)
    with lazy.device():
        t = tf.constant(x) * 1.0
        steps = []
        for _ in range(3):
            steps.append([t + 0.0, t / -0.0, t / 0.0, t * -0.0])
            lazy.mark_step()
    with np.errstate(divide="ignore"):
        expected = [x + 0.0, x / np.float32(-0.0), x / np.float32(0.0), x * np.float32(-0.0)]
    for step in steps[1:]:
        for got, want in zip(step, expected):
            np.testing.assert_array_equal(got.numpy(), want)
            np.testing.assert_array_equal(np.signbit(got.numpy()), np.signbit(want))
    with lazy.device():     # one program, its scalar 0.0 then -0.0 then 0.0: its parameter
        quotients = []
        for zero in [0.0, -0.0, 0.0, -0.0, -0.0, 0.0]:
            quotients.append(t / zero)
            lazy.mark_step()
    with np.errstate(divide="ignore"):
        for got, zero in zip(quotients[1:], [-0.0, 0.0, -0.0, -0.0, 0.0]):
            np.testing.assert_array_equal(got.numpy(), x / np.float32(zero))
# }}}


# {{{ tf.GradientTape: one recorded node when exact, TensorFlow's backward otherwise

def _tape_cases(variable):
    w, unused = variable([1.5, -0.5, 2.0]), variable([5.0])
    out = {}
    with tf.GradientTape(persistent=True) as tape:
        h = tf.tanh(w * 2.0)
        loss = tf.reduce_sum(h * h * w)
    out["persistent"] = tape.gradient(loss, w)
    out["intermediate"] = tape.gradient(loss, h)       # computed in the window from w
    assert tape.gradient(loss, unused) is None
    out["zero"] = tape.gradient(loss, unused, unconnected_gradients="zero")
    with tf.GradientTape() as tape:
        with tape.stop_recording():
            frozen = w * 3.0
        loss = tf.reduce_sum(frozen * w)
    out["stop_recording"] = tape.gradient(loss, w)

    @tf.custom_gradient
    def clip_grad(x):
        return tf.identity(x), lambda dy: tf.clip_by_value(dy, -0.1, 0.1)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(clip_grad(w) * 5.0)
    out["custom_gradient"] = tape.gradient(loss, w)
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            cube = tf.reduce_sum(w * w * w)
        g = inner.gradient(cube, w)
    out["second_order"] = outer.gradient(g, w)
    return {k: v.numpy() for k, v in out.items()}


def test_tape_gradients_match_eager_whether_recorded_or_not():
    eager = _tape_cases(tf.Variable)
    with lazy.device():
        lz = _tape_cases(tf.Variable)
    for k in eager:
        _close(lz[k], eager[k])
    m = lazy.metrics()
    assert m["tape_recorded"] >= 4
    for reason in ("stop_recording", "a custom gradient or tf.function call",
                   "another tape is recording"):
        assert m[f"tape_eager::{reason}"] >= 1, m


def test_a_variable_source_never_read_gets_zeros_of_its_shape():
    def run(on_device):
        v0, v1 = tf.Variable([1.0, 2.0]), tf.Variable([[3.0], [4.0]])
        c = tf.constant([1.0, 1.0]) * 1.0
        out = []
        for _ in range(2):
            with tf.GradientTape() as tape:
                t = v0 * 2.0 + c
            out += tape.gradient(tf.reduce_sum(t), [v0, v1],
                                 unconnected_gradients=tf.UnconnectedGradients.ZERO)
            if on_device:
                lazy.mark_step()
        return [g.numpy() for g in out]
    eager, lz, metrics = eager_then_lazy(run)
    for a, e in zip(lz, eager):
        np.testing.assert_array_equal(a, e)
    assert metrics["tape_recorded"] == 2


def test_no_gradient_flows_through_integers_stop_gradient_or_floor_as_in_eager():
    """A path through an integer cast, ``tf.stop_gradient`` or an op whose gradient is None
    (``tf.floor``, ``tf.round``) carries no gradient: ``None`` (or zeros when asked), whether
    the gradient is recorded as one node or not."""
    def run(on_device):
        w, x = tf.Variable([1.5, 2.5]), tf.constant([1.0, 2.0]) * 1.0
        out = []
        for _ in range(2):
            with tf.GradientTape(persistent=True) as tape:
                tape.watch(x)
                rounded = tf.reduce_sum(tf.cast(tf.cast(w * x, tf.int32), tf.float32))
                stopped = tf.reduce_sum(tf.stop_gradient(w) * tf.floor(x) + tf.round(w * x))
                loss = rounded + stopped + tf.reduce_sum(w * tf.stop_gradient(x) * x)
            out += tape.gradient(loss, [w, x])
            for part in (rounded, stopped):
                out += tape.gradient(part, [w, x])
                out += tape.gradient(part, [w, x], unconnected_gradients="zero")
            if on_device:
                lazy.mark_step()
        return [None if g is None else g.numpy() for g in out]
    eager, lz, metrics = eager_then_lazy(run)
    for a, e in zip(lz, eager):
        assert (a is None) == (e is None)
        if e is not None:
            _close(a, e)
    assert metrics["tape_recorded"] >= 4


def test_a_pending_recorded_gradient_inside_a_forward_accumulator_is_a_clear_error():
    """A forward accumulator computes each op's derivative as a tf.function call, which reads
    its inputs: a recorded gradient still pending then is a clear error (traced there it would
    come back zero), the pending work stays intact, and read first it is exact."""
    with lazy.device():
        a, b = tf.Variable([1.0, 2.0]), tf.constant([3.0, 4.0]) * 1.0
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(b)
            loss = tf.reduce_sum(a * b)
        g = tape.gradient(loss, a)
        with pytest.raises(Exception, match="ForwardAccumulator.*mark_step"):
            with tf.autodiff.ForwardAccumulator(b, tf.ones_like(b)):
                _ = b * b
        assert g.numpy().tolist() == [3.0, 4.0]
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(a * b * b)
        g = tape.gradient(loss, a)
        first = g.numpy()
        with tf.autodiff.ForwardAccumulator(b, tf.ones_like(b)) as acc:
            f = b * b * a
        assert first.tolist() == [9.0, 16.0]
        assert acc.jvp(f).numpy().tolist() == [6.0, 16.0]


def _gradient_surface(w0, x0):
    """What ``tape.gradient`` returns and how the tape behaves afterwards, for the plain calls
    (list and tuple sources, variables and watched tensors, persistent or not)."""
    w, x = tf.Variable(w0), tf.constant(x0)
    out = {}
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(tf.tanh(w * x) ** 2)
    grads = tape.gradient(loss, (w, x))
    out["tuple"] = type(grads).__name__
    out["tuple grads"] = [g.numpy() for g in grads]
    with pytest.raises(RuntimeError, match="non-persistent"):
        tape.gradient(loss, [w])
    out["watched"] = [v.name for v in tape.watched_variables()]
    with tf.GradientTape(persistent=True) as tape:
        h = tf.sin(w) * x
        loss = tf.reduce_sum(h * h)
    out["persistent"] = [g.numpy() for g in tape.gradient(loss, [w])]
    out["again"] = [g.numpy() for g in tape.gradient(loss, [h, w])]
    out["list"] = type(tape.gradient(loss, [w])).__name__
    for source in (w, x):                         # one source, not in a list
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(w * x * x)
        single = tape.gradient(loss, source)
        out["single"] = out.get("single", []) + [type(single).__name__]
        out["single grads"] = out.get("single grads", []) + [single.numpy()]
    return out


def test_tape_gradient_returns_what_eager_returns():
    rng = np.random.default_rng(7)
    w0 = random_array(rng, (3,))
    x0 = random_array(rng, (3,))
    eager = _gradient_surface(w0, x0)
    with lazy.device():
        lz = _gradient_surface(w0, x0)
    assert {k: lz[k] for k in ("tuple", "list", "watched", "single")} == \
        {k: eager[k] for k in ("tuple", "list", "watched", "single")}
    for k in ("tuple grads", "persistent", "again", "single grads"):
        for a, b in zip(lz[k], eager[k]):
            _close(a, b)


def test_a_value_read_inside_the_tape_keeps_the_gradient_exact():
    def run():
        w = tf.Variable([0.3, -0.7])
        with tf.GradientTape() as tape:
            h = tf.sin(w * 2.0)
            scale = 2.0 if float(tf.reduce_sum(h)) > 0 else -3.0   # a barrier mid-tape
            loss = tf.reduce_sum(h * h) * scale
        return tape.gradient(loss, w).numpy()
    eager = run()
    with lazy.device():
        _close(run(), eager)
    assert lazy.metrics()["tape_eager::a value was read"] == 1
# }}}


# {{{ Keras

def _keras_fit(on_batch=False, **compile_kwargs):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype(np.float32)
    y = rng.normal(size=(32, 1)).astype(np.float32)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    for v in model.weights:   # the same start in every mode (XLA's initializer streams differ)
        v.assign(rng.normal(size=v.shape).astype(np.float32))
    model.compile(keras.optimizers.SGD(0.1), "mse", **compile_kwargs)
    if on_batch:
        return [float(model.train_on_batch(x[i:i + 8], y[i:i + 8])) for i in range(0, 32, 8)]
    return model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False).history["loss"]


def test_keras_fit_runs_compiled_or_lazily_or_says_what_to_do():
    expected = _keras_fit(jit_compile=True)
    with lazy.device():
        jit = _keras_fit(jit_compile=True)          # Keras' own XLA step, as a host call
        eagerly = _keras_fit(run_eagerly=True)      # each step recorded and compiled lazily
        with pytest.raises(Exception, match="jit_compile=True"):
            _keras_fit(jit_compile=False)
    _close(jit, expected, 1e-4)
    _close(eagerly, expected, 1e-4)
    assert lazy.metrics()["tape_recorded"] >= 8
    expected = _keras_fit(on_batch=True, jit_compile=True)
    with lazy.device():
        _close(_keras_fit(on_batch=True, run_eagerly=True), expected, 1e-4)
        with pytest.raises(Exception, match="train_on_batch.*jit_compile=True"):
            _keras_fit(on_batch=True)


def test_an_embedding_trains_as_in_eager():
    """TensorFlow's gradient of a gather is IndexedSlices, which Keras' Adam applies as a sparse
    update (rows not looked up keep their slots): a dense recorded gradient would diverge."""
    def run():
        rng = np.random.default_rng(0)
        model = keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(20, 4),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
        for v in model.weights:
            v.assign(rng.normal(size=v.shape).astype(np.float32))
        opt = keras.optimizers.Adam(0.1)
        x = rng.integers(0, 20, (8, 5)).astype(np.int32)
        y = rng.normal(size=(8, 1)).astype(np.float32)
        losses = []
        for _ in range(3):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            lazy.mark_step()
            losses.append(float(loss))
        return losses, [w.numpy() for w in model.weights]
    eager = run()
    with lazy.device():
        lz = run()
    _close(lz[0], eager[0])
    for a, e in zip(lz[1], eager[1]):
        _close(a, e)
    assert lazy.metrics()["tape_eager::a gather from a source (TensorFlow's gradient is "
                          "IndexedSlices)"] == 3


def test_an_optimizer_update_after_a_pending_update_of_its_variable_is_exact():
    def run():
        keras.utils.set_random_seed(0)
        w = keras.Variable([1.0, -2.0])
        opt = keras.optimizers.Adam(0.1)
        for k in range(3):
            w.assign(w * 0.9)                       # a pending update before the optimizer's
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * w)
            opt.apply_gradients([(tape.gradient(loss, [w])[0], w)])
            lazy.mark_step()
        return w.numpy()
    eager = run()
    with lazy.device():
        _close(run(), eager)
    assert lazy.metrics()["calls_recorded"] >= 2


def test_an_optimizer_update_recorded_at_another_place_of_the_step_is_exact():
    """A recorded call's outputs keep their log entries between steps: steps that record one
    or two extra ops before the update, in an irregular order, train as eagerly, and a
    repeated step shape finds its program again."""
    rng = np.random.default_rng(5)
    w0, xs = random_array(rng, (3,)), [random_array(rng, (3,)) for _ in range(7)]
    extra = [0, 1, 1, 0, 2, 0, 2]

    def run():
        w = keras.Variable(w0)
        opt = keras.optimizers.Adam(0.1)
        losses = []
        for x, n in zip(xs, extra):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * w * x)
            g = tape.gradient(loss, [w])[0]
            for _ in range(n):
                g = g * 0.5                           # moves the update in the step's log
            opt.apply_gradients([(g, w)])
            lazy.mark_step()
            losses.append(float(loss))
        return losses, w.numpy()
    eager = run()
    lazy.reset_metrics()
    with lazy.device():
        lz = run()
    _close(lz[0], eager[0])
    _close(lz[1], eager[1])
    m = lazy.metrics()
    assert m["calls_recorded"] >= 5 and m["trace_hits"] >= 2, m
# }}}


# {{{ tf.distribute

def test_strategies_are_a_clear_error():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        with pytest.raises(lazy.LazyError, match="tf.distribute strategy"):
            with lazy.device():
                pass
        with pytest.raises(lazy.LazyError, match="tf.distribute strategy"):
            lazy.tensor([1.0])
        with pytest.raises(lazy.LazyError, match="tf.distribute strategy"):
            lazy.mark_step()
    with lazy.device():
        x = tf.constant([1.0, 2.0]) * 3.0
        with pytest.raises(Exception, match="tf.distribute strategy"):
            strategy.run(lambda: x * 2.0)
# }}}


def test_a_constant_input_and_a_tensor_input_never_share_a_recipe():
    """A baked constant is keyed by its value and a tensor by (shape, dtype enum); a DType
    equals its enum, so the constant [2] and a [2]-shaped int32 tensor must still differ."""
    from tfx_vec.lazy import custom_device, raw
    from tfx_vec.lazy.ir import Node
    from tfx_vec.lazy.tensor import _const
    rng = np.random.default_rng(7)
    x = Node("data", (), (), (3, 1), tf.int32, tf.constant(rng.integers(0, 9, (3, 1)), tf.int32))
    y = Node("data", (), (), (2,), tf.int32, tf.constant(rng.integers(0, 9, (2,)), tf.int32))
    add = raw.describe("AddV2", raw.attrs_bytes({"T": tf.int32}), 2)
    assert custom_device._record(add, [_const((2,), tf.int32), x])[0].shape == (3, 1)
    assert custom_device._record(add, [y, x])[0].shape == (3, 2)
