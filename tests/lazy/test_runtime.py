"""The runtime: compile cache (hits, recompiles, LRU), scalar parameters, the max_graphs guard,
the graph-size cut, debug output, metrics."""
import numpy as np
import pytest
import tensorflow as tf

from tests.support import random_array
from tfx_vec import lazy
from tfx_vec.lazy import lowering


def _step(x, w, lr=0.1):
    """A tiny training-like step: lazy ops, a variable update, a barrier."""
    with lazy.GradientTape() as tape:
        loss = tf.reduce_sum(tf.tanh(x @ w))
    w.assign_sub(lr * tape.gradient(loss, w))
    lazy.mark_step()
    return loss


def _reference_step(x, w, lr=0.1):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.tanh(x @ w))
    w.assign_sub(lr * tape.gradient(loss, w))
    return loss


def test_second_identical_step_hits_the_cache_and_matches_eager():
    rng = np.random.default_rng(0)
    xa, wa = random_array(rng, (4, 3)), random_array(rng, (3, 2))
    x, w = lazy.tensor(xa), lazy.Variable(wa)
    ex, ew = tf.constant(xa), tf.Variable(wa)
    for _ in range(3):
        loss = _step(x, w)
        np.testing.assert_allclose(loss.numpy(), _reference_step(ex, ew).numpy(), rtol=1e-5)
    np.testing.assert_allclose(w.numpy(), ew.numpy(), rtol=1e-5, atol=1e-6)
    m = lazy.metrics()
    assert (m["compiles"], m["cache_hits"], m["executions"]) == (1, 2, 3)


def test_a_hit_needs_no_compiler(monkeypatch):
    """Null the lowering after the first step: later steps must be served from the cache."""
    rng = np.random.default_rng(1)
    x, w = lazy.tensor(random_array(rng, (4, 3))), lazy.Variable(random_array(rng, (3, 2)))
    _step(x, w)

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again: the cache key is not stable")
    monkeypatch.setattr(lowering, "build", no_compiler)
    for _ in range(2):
        _step(lazy.tensor(random_array(rng, (4, 3))), w, lr=float(rng.uniform(0.01, 0.5)))
    assert lazy.metrics()["cache_hits"] == 2
    with pytest.raises(AssertionError, match="compiled again"):
        _step(lazy.tensor(random_array(rng, (5, 3))), w)   # a new shape must compile


def test_shape_change_recompiles_and_learning_rate_does_not():
    rng = np.random.default_rng(2)
    w = lazy.Variable(random_array(rng, (3, 2)))
    _step(lazy.tensor(random_array(rng, (4, 3))), w, lr=0.1)
    _step(lazy.tensor(random_array(rng, (4, 3))), w, lr=0.37)   # new scalar: a parameter
    assert lazy.metrics()["compiles"] == 1
    _step(lazy.tensor(random_array(rng, (6, 3))), w)            # new shape
    assert lazy.metrics()["compiles"] == 2
    _step(lazy.tensor(random_array(rng, (6, 3))), w, lr=1.0)    # 1 is baked: new program
    assert lazy.metrics()["compiles"] == 3


def test_max_graphs_guard_turns_a_recompilation_storm_into_an_error():
    lazy.configure(max_graphs=2)
    rng = np.random.default_rng(3)
    w = lazy.Variable(random_array(rng, (3, 2)))
    _step(lazy.tensor(random_array(rng, (1, 3))), w)
    _step(lazy.tensor(random_array(rng, (2, 3))), w)
    with pytest.raises(lazy.LazyRecompilationError, match=r"max_graphs=2.*test_runtime\.py"):
        _step(lazy.tensor(random_array(rng, (3, 3))), w)


def test_cache_is_lru_bounded():
    lazy.clear_cache()
    lazy.configure(cache_size=2)
    rng = np.random.default_rng(4)
    for n in (1, 2, 3, 1):     # 1 was evicted by 3
        float(tf.reduce_sum(lazy.tensor(random_array(rng, (n, 2))) * 3.0))
    assert lazy.metrics()["compiles"] == 4
    float(tf.reduce_sum(lazy.tensor(random_array(rng, (1, 2))) * 3.0))   # 1 is recent now
    assert lazy.metrics()["compiles"] == 4 and lazy.metrics()["cache_hits"] == 1


def test_graph_size_limit_cuts_long_traces():
    lazy.configure(max_graph_size=40)
    a = np.float32(0.5)
    x, e = lazy.tensor(a), tf.constant(a)
    for k in range(100):
        x = tf.sin(x) + 0.25
        e = tf.sin(e) + 0.25
    np.testing.assert_allclose(x.numpy(), e.numpy(), rtol=1e-5)
    assert lazy.metrics()["graph_size_cuts"] >= 4


def test_debug_env_prints_cause_hash_and_user_frame(monkeypatch, capfd):
    monkeypatch.setenv("TFX_VEC_LAZY_DEBUG", "1")
    lazy.clear_cache()
    x = lazy.tensor(np.ones([2, 7], np.float32))
    float(tf.reduce_sum(x * 3.0))
    err = capfd.readouterr().err
    assert "[tfx_vec.lazy] compile #" in err and "cause=float()" in err
    assert "hash=" in err and "test_runtime.py:" in err


def test_metrics_report_lists_counters_fallbacks_and_timers():
    float(tf.reduce_sum(lazy.tensor(np.ones([3], np.float32)) * 2.0))
    tf.unique(lazy.tensor([1.0, 1.0]))
    report = lazy.metrics_report()
    for word in ("compiles", "executions", "ops_recorded", "unique", "timers"):
        assert word in report
    assert lazy.metrics()["executions"] >= 1 and lazy.metrics()["compile_n"] >= 1


def test_unsupported_xla_op_is_reported_and_still_correct():
    """An op XLA cannot compile (via the table-less path it would fall back eagerly); here a
    program is forced through the no-XLA safety net by recording an op XLA rejects."""
    from tfx_vec.lazy import ops
    from tfx_vec.lazy.tensor import record
    det = ops.OpDef("linalg.det", tf.linalg.det, ("input", "name"), ("input",), (), False, None)
    ops.OPS["linalg.det"] = det
    try:
        m = random_array(np.random.default_rng(5), (3, 3)) + 3 * np.eye(3, dtype=np.float32)
        out = record(det, (lazy.tensor(m),), {})
        np.testing.assert_allclose(out.numpy(), np.linalg.det(m), rtol=1e-4)
        assert lazy.metrics()["fallback::no_xla"] == 1
    finally:
        del ops.OPS["linalg.det"]


def test_mark_step_runs_cached_programs_asynchronously():
    """Like PyTorch/XLA: a cached program runs in the background; uses of results wait."""
    from tfx_vec.lazy import runtime
    a0 = random_array(np.random.default_rng(6), (3,))
    x, e = lazy.tensor(a0), tf.constant(a0)
    v, ev = lazy.Variable(a0), tf.Variable(a0)
    launched = 0
    for _ in range(5):
        x = x * 0.5 + 1.0
        v.assign_add(x)
        e = e * 0.5 + 1.0
        ev.assign_add(e)
        lazy.mark_step(wait=False)
        launched += isinstance(x._node.value, runtime.Pending)
    assert launched == 4          # the first step compiles synchronously, then cache hits
    np.testing.assert_allclose(x.numpy(), e.numpy(), rtol=1e-6)
    np.testing.assert_allclose(v.numpy(), ev.numpy(), rtol=1e-6)
    lazy.mark_step(wait=True)
    assert lazy.metrics()["executions"] == 5


def test_an_error_in_a_background_run_surfaces_at_the_first_use(monkeypatch):
    x = lazy.tensor(np.ones([2], np.float32))
    y = x * 3.0
    lazy.mark_step()                                   # compiles and runs synchronously

    def broken(self, *args):
        raise tf.errors.InvalidArgumentError(None, None, "simulated device failure")
    monkeypatch.setattr(lowering.Compiled, "__call__", broken)
    z = y * 3.0
    lazy.mark_step(wait=False)                         # a cache hit: launched in background
    with pytest.raises(lazy.LazyCompileError, match="simulated device failure"):
        z.numpy()


def test_a_hit_runs_the_compiled_function_as_one_op_unless_something_could_record_it(
        monkeypatch):
    """Cache hits with no tape active call the traced function as one op; under an active
    ``tf.GradientTape`` a hit takes the concrete function's own call; both match eager."""
    seen: list = []
    plain = lowering._plain_call
    monkeypatch.setattr(lowering, "_plain_call", lambda: seen.append(plain()) or seen[-1])
    rng = np.random.default_rng(7)
    wa = random_array(rng, (3, 2))
    w, ew = lazy.Variable(wa), tf.Variable(wa)
    for i in range(4):
        xa, lr = random_array(rng, (4, 3)), float(rng.uniform(0.01, 0.5))
        if i == 3:
            with tf.GradientTape() as outer:
                outer.watch(tf.constant(1.0))
                loss = _step(lazy.tensor(xa), w, lr)
        else:
            loss = _step(lazy.tensor(xa), w, lr)
        expected = _reference_step(tf.constant(xa), ew, lr)
        np.testing.assert_allclose(loss.numpy(), expected.numpy(), rtol=1e-5)
        np.testing.assert_allclose(w.numpy(), ew.numpy(), rtol=1e-5, atol=1e-6)
    assert seen == [True, True, False]
    assert lazy.metrics()["cache_hits"] == 3
