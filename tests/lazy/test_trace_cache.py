"""The trace cache: a step that records the same ops as an earlier one reuses its canonical
program without walking the graph, and a step that differs in anything the program depends on
(an attribute, a shape, a dtype, the wiring, a gradient window) never does."""
import numpy as np
import tensorflow as tf
from hypothesis import given, settings, strategies as st

from tests.support import random_array
from tfx_vec import lazy
from tfx_vec.lazy import ir


def _hits() -> int:
    return lazy.metrics().get("trace_hits", 0)


def _forced(fn, *arrays):
    """``fn`` on lazy tensors, forced, with the trace hits that barrier scored."""
    before = _hits()
    out = fn(*[lazy.tensor(a) for a in arrays]).numpy()
    return out, _hits() - before


def _check(fn, *arrays):
    """``fn`` lazily equals ``fn`` in eager TF on every element; returns the trace hits."""
    got, hits = _forced(fn, *arrays)
    np.testing.assert_allclose(got, fn(*[tf.constant(a) for a in arrays]).numpy(),
                               rtol=1e-5, atol=1e-6)
    return hits


def test_a_repeated_step_hits_and_matches_eager():
    rng = np.random.default_rng(0)
    fn = lambda x, y: tf.nn.relu(tf.matmul(x, y) * 0.5 + 1.0)  # noqa: E731
    hits = [_check(fn, random_array(rng, (3, 4), np.float32),
                   random_array(rng, (4, 2), np.float32)) for _ in range(4)]
    assert hits == [0, 1, 1, 1]
    assert lazy.metrics()["compiles"] == 1


def test_a_different_python_scalar_is_a_parameter_and_hits():
    rng = np.random.default_rng(1)
    x = random_array(rng, (5,), np.float32)
    assert _check(lambda t: t * 0.25, x) == 0
    assert _check(lambda t: t * 0.75, x) == 1


def test_a_different_attribute_does_not_hit():
    rng = np.random.default_rng(2)
    x = random_array(rng, (4, 4), np.float32)  # both reductions give f32[4]
    assert _check(lambda t: tf.reduce_sum(t, axis=0), x) == 0
    assert _check(lambda t: tf.reduce_sum(t, axis=1), x) == 0
    assert _check(lambda t: tf.reduce_sum(t, axis=0), x) == 1
    assert _check(lambda t: tf.transpose(t, [1, 0]), x) == 0
    assert _check(lambda t: tf.transpose(t, [0, 1]), x) == 0


def test_a_different_shape_does_not_hit():
    rng = np.random.default_rng(3)
    fn = lambda x: tf.exp(x) - x  # noqa: E731
    assert _check(fn, random_array(rng, (2, 3), np.float32)) == 0
    assert _check(fn, random_array(rng, (3, 2), np.float32)) == 0
    assert _check(fn, random_array(rng, (2, 3), np.float32)) == 1


def test_a_different_dtype_does_not_hit():
    rng = np.random.default_rng(4)
    fn = lambda x: x * x + x  # noqa: E731
    assert _check(fn, random_array(rng, (6,), np.float32)) == 0
    assert _check(fn, random_array(rng, (6,), np.float64)) == 0
    assert _check(fn, random_array(rng, (6,), np.int32)) == 0
    assert _check(fn, random_array(rng, (6,), np.float64)) == 1


def test_different_wiring_of_the_same_ops_does_not_hit():
    rng = np.random.default_rng(5)
    a, b = random_array(rng, (3,), np.float32), random_array(rng, (3,), np.float32)
    assert _check(lambda x, y: x * y - y, a, b) == 0
    assert _check(lambda x, y: x * x - y, a, b) == 0   # same ops, a leaf used twice
    assert _check(lambda x, y: y * x - y, a, b) == 0   # operands swapped
    assert _check(lambda x, y: x * y - y * 1.0, a, b) == 0
    assert _check(lambda x, y: x * x - y, a, b) == 1
    # The same graph with its leaves in the other order: the same program on other data.
    assert _check(lambda x, y: x * y - x, a, b) == 1


def test_a_baked_constant_is_structure():
    rng = np.random.default_rng(6)
    x = random_array(rng, (4,), np.float32)
    assert _check(lambda t: t * 1.0 + t, x) == 0
    assert _check(lambda t: t * -1.0 + t, x) == 0  # 1 and -1 are baked, not parameters
    assert _check(lambda t: t * 1.0 + t, x) == 1


def test_which_tensors_are_live_is_part_of_the_key():
    rng = np.random.default_rng(7)
    x = lazy.tensor(random_array(rng, (3,), np.float32))
    kept = x * 3.0
    y = tf.sin(kept)
    lazy.mark_step()          # outputs: kept and y
    before = _hits()
    y2 = tf.sin(x * 3.0)      # the product dies: only y2 is an output
    lazy.mark_step()
    assert _hits() == before
    ref = np.sin(x.numpy() * 3.0)
    np.testing.assert_allclose(y2.numpy(), ref, rtol=1e-6)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-6)
    np.testing.assert_allclose(kept.numpy(), x.numpy() * 3.0, rtol=1e-6)


def _grad_step(w, x, inside: bool):
    """A gradient with the product recorded inside or outside the tape's window."""
    if not inside:
        h = w * x
    with lazy.GradientTape() as tape:
        if inside:
            h = w * x
        loss = tf.reduce_sum(tf.square(h) + w)
    return tape.gradient(loss, w)


def test_the_gradient_window_is_part_of_the_key():
    rng = np.random.default_rng(8)
    x = lazy.tensor(random_array(rng, (3,), np.float32))
    w = lazy.Variable(random_array(rng, (3,), np.float32))
    results = {}
    for inside in (True, False, True, False):
        before = _hits()
        results[inside] = _grad_step(w, x, inside).numpy()
        results[(inside, "hits")] = _hits() - before
    wv, xv = w.numpy(), x.numpy()
    np.testing.assert_allclose(results[True], 2 * wv * xv * xv + 1, rtol=1e-5)
    np.testing.assert_allclose(results[False], np.ones(3), rtol=1e-6)  # h is a constant there
    assert results[(True, "hits")] == 1 and results[(False, "hits")] == 1  # second visits


def test_training_loop_hits_every_step_and_matches_eager():
    rng = np.random.default_rng(9)
    w0, x0 = random_array(rng, (4, 3), np.float32), random_array(rng, (5, 4), np.float32)
    eager_w, lazy_w = tf.Variable(w0), lazy.Variable(w0)
    lx = lazy.tensor(x0)
    for step in range(4):
        for w, x, tape_cls in ((eager_w, tf.constant(x0), tf.GradientTape),
                               (lazy_w, lx, lazy.GradientTape)):
            with tape_cls() as tape:
                loss = tf.reduce_mean(tf.tanh(tf.matmul(x, w)))
            w.assign_sub(0.1 * tape.gradient(loss, w))
        before = _hits()
        lazy.mark_step()
        assert _hits() - before == (1 if step else 0)
        np.testing.assert_allclose(lazy_w.numpy(), eager_w.numpy(), rtol=1e-5, atol=1e-6)


def test_a_value_forced_inside_the_tape_is_correct_without_the_trace_cache_proof():
    rng = np.random.default_rng(10)
    w = lazy.Variable(random_array(rng, (3,), np.float32))
    for _ in range(2):
        with lazy.GradientTape() as tape:
            h = w * w
            _ = float(tf.reduce_sum(h))   # forced: the gradient rewrites the graph
            loss = tf.reduce_sum(h * 3.0)
        g = tape.gradient(loss, w)
        np.testing.assert_allclose(g.numpy(), 6.0 * w.numpy(), rtol=1e-5)


def test_disabling_the_trace_cache_gives_the_same_results():
    rng = np.random.default_rng(11)
    x = random_array(rng, (3, 3), np.float32)
    fn = lambda t: tf.reduce_max(t @ t, axis=1)  # noqa: E731
    lazy.configure(trace_cache=False)
    try:
        assert [_check(fn, x) for _ in range(2)] == [0, 0]
    finally:
        lazy.configure(trace_cache=True)
    assert [_check(fn, x) for _ in range(2)] == [0, 1]


_UNARY = {"exp": tf.exp, "tanh": tf.tanh, "neg": lambda t: -t, "abs": tf.abs}


@settings(max_examples=10)
@given(ops=st.lists(st.sampled_from(sorted(_UNARY)), min_size=1, max_size=4),
       other=st.lists(st.sampled_from(sorted(_UNARY)), min_size=1, max_size=4),
       shape=st.sampled_from([(2,), (3,), (2, 2)]), seed=st.integers(0, 2 ** 16))
def test_a_hit_only_for_the_same_op_sequence(ops, other, shape, seed):
    rng = np.random.default_rng(seed)

    def chain(names):
        def fn(t):
            for name in names:
                t = _UNARY[name](t) * 0.5
            return t
        return fn

    x = random_array(rng, shape, np.float32)
    lazy.clear_cache()
    _check(chain(ops), x)
    assert _check(chain(other), x) == (1 if other == ops else 0)


def test_the_fingerprint_names_leaves_by_kind_shape_and_dtype_not_value():
    rng = np.random.default_rng(12)
    prints = []
    for _ in range(2):
        y = lazy.tensor(random_array(rng, (2,), np.float32)) * 2.5
        prints.append(ir.RECORDING.fingerprint([y._node], []))
        lazy.mark_step()
    assert prints[0] is not None and prints[0] == prints[1]


def test_a_graph_size_cut_inside_a_multi_output_op_stays_correct():
    # The cut lands between the outputs of one tf.unstack: the outputs recorded after it use
    # a node of the previous log, which the fingerprint cannot vouch for.
    lazy.configure(max_graph_size=7)
    rng = np.random.default_rng(13)
    a = random_array(rng, (5, 3), np.float32)
    x, e = lazy.tensor(a), tf.constant(a)
    for _ in range(6):
        x = tf.add_n(tf.unstack(tf.tanh(x) * 0.5, axis=0)) + x
        e = tf.add_n(tf.unstack(tf.tanh(e) * 0.5, axis=0)) + e
    np.testing.assert_allclose(x.numpy(), e.numpy(), rtol=1e-5)
    assert lazy.metrics()["graph_size_cuts"] >= 3


def test_negative_zero_is_not_served_the_program_of_zero():
    # -0.0 == 0.0 (and hashes alike): baked, it would share 0.0's cached node and program.
    # NumPy is the reference: eager TF's own scalar-conversion cache can hand -0.0 the tensor
    # it made for 0.0.
    rng = np.random.default_rng(14)
    x = np.abs(random_array(rng, (4,), np.float32))
    for scale in (0.0, -0.0, 0.0, -0.0):
        got, _ = _forced(lambda t: 1.0 / (t * scale), x)
        with np.errstate(divide="ignore"):
            want = np.float32(1.0) / (x * np.float32(scale))
        np.testing.assert_array_equal(got, want)
