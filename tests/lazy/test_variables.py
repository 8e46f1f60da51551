"""In-place updates by substitution, and the paper's two aliasing hazards (section 4.3)."""
import contextlib

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import random_array
from tfx_vec import lazy


def test_hazard_printing_twice_after_an_increment():
    """``a += 1; print(a); print(a)`` must not increment twice."""
    a0 = random_array(np.random.default_rng(0), (2, 3))
    v = lazy.Variable(a0)
    v.assign_add(np.ones_like(a0))
    first, second = str(v.read_value()), str(v.read_value())
    assert first == second == str(a0 + 1)
    np.testing.assert_allclose(v.numpy(), a0 + 1)
    np.testing.assert_allclose(v.variable.numpy(), a0 + 1)   # written back in place
    t = lazy.tensor(a0)
    t += 1.0
    assert str(t) == str(t) == str(a0 + 1)


@pytest.mark.parametrize("print_b_first", [False, True])
def test_hazard_value_computed_before_an_update_keeps_the_old_input(print_b_first):
    """``b = a + 2; a += 1; print(a); print(b)``: b uses the old a."""
    a0 = random_array(np.random.default_rng(1), (3,))
    a = lazy.Variable(a0)
    b = a + 2.0
    a.assign_add(np.ones_like(a0))
    if print_b_first:
        np.testing.assert_allclose(b.numpy(), a0 + 2)
        np.testing.assert_allclose(a.numpy(), a0 + 1)
    else:
        np.testing.assert_allclose(a.numpy(), a0 + 1)
        np.testing.assert_allclose(b.numpy(), a0 + 2)
    assert lazy.metrics()["executions"] == 1   # both computed by one program


def test_read_value_is_a_snapshot_and_assign_chains():
    a0 = random_array(np.random.default_rng(2), (2, 2))
    v = lazy.Variable(a0)
    r = v.read_value()
    v.assign(v * 3.0)
    v.assign_sub(r)
    c = v + 0.5
    lazy.mark_step()
    np.testing.assert_allclose(r.numpy(), a0)
    np.testing.assert_allclose(v.numpy(), 2 * a0, rtol=1e-6)
    np.testing.assert_allclose(c.numpy(), 2 * a0 + 0.5, rtol=1e-6)


def test_assign_checks_shape_and_dtype_naming_the_variable():
    v = lazy.Variable(np.ones([2, 3], np.float32), name="weights")
    with pytest.raises(lazy.LazyShapeError, match=r"'weights.*f32|weights.*float32\[2, 3\]"):
        v.assign(lazy.tensor(np.ones([3, 2], np.float32)))
    with pytest.raises(lazy.LazyShapeError, match="weights"):
        v.assign(lazy.tensor(np.ones([2, 3], np.int32)))
    with pytest.raises(lazy.LazyShapeError, match=r"assign_sub .*test_variables\.py"):
        v.assign_sub(1.0)   # tf.Variable does not broadcast a delta either
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.Variable(np.ones([2, 3], np.float32)).assign_sub(1.0)


_update = st.tuples(st.sampled_from(["assign", "add", "sub", "read", "force"]),
                    st.integers(0, 2), st.floats(0.25, 2.0))


@settings(max_examples=6)
@given(updates=st.lists(_update, min_size=1, max_size=10), seed=st.integers(0, 999))
def test_random_variable_updates_match_tf_variables(updates, seed):
    rng = np.random.default_rng(seed)
    inits = [random_array(rng, (3,)) for _ in range(3)]
    lv, ev = [lazy.Variable(a) for a in inits], [tf.Variable(a) for a in inits]
    lreads, ereads = [], []
    for kind, k, s in updates:
        other = (k + 1) % 3
        if kind == "assign":
            lv[k].assign(lv[other] * s)
            ev[k].assign(ev[other] * s)
        elif kind == "add":
            lv[k].assign_add(tf.sin(lv[other]))
            ev[k].assign_add(tf.sin(ev[other]))
        elif kind == "sub":
            lv[k].assign_sub(tf.fill([3], s))
            ev[k].assign_sub(tf.fill([3], s))
        elif kind == "read":
            lreads.append(lv[k] + s)
            ereads.append(ev[k] + s)
        else:
            np.testing.assert_allclose(lv[k].numpy(), ev[k].numpy(), rtol=1e-5)
    lazy.mark_step()
    for a, b in zip(lv + lreads, ev + ereads):
        np.testing.assert_allclose(a.numpy(), np.asarray(b.numpy()), rtol=1e-5, atol=1e-6)


def test_device_variable_values_read_mid_step_match_eager():
    """``.numpy()`` of a device variable's read (no pending update: no barrier) before and
    after an update recorded in the same step, and of the earlier read after it, as eager."""
    rng = np.random.default_rng(11)
    v0 = random_array(rng, (2, 3))
    with lazy.device():
        v = tf.Variable(v0)
    ev = tf.Variable(v0)
    for _ in range(3):
        x = random_array(rng, (2, 3))
        got, want = [], []
        for var, out, scope in ((v, got, lazy.device), (ev, want, _no_scope)):
            with scope():
                before = var.read_value()
                out.append(before.numpy())
                var.assign_add(x * before)
                out.append(var.read_value().numpy())
                out.append(before.numpy())
        lazy.mark_step()
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6)
    np.testing.assert_allclose(v.numpy(), ev.numpy(), rtol=1e-6)


@contextlib.contextmanager
def _no_scope():
    yield
