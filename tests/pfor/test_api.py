"""pfor / vectorized_map entry points: modes, structures, axes, chunking, caching, XLA."""
import numpy as np
import pytest
import tensorflow as tf

import tfx_vec
from tests.pfor.oracle import assert_all_close, check_pfor, reference
from tests.support import random_array

R = np.random.default_rng(3)


def arr(*shape):
    return tf.constant(random_array(R, shape, np.float32))


def test_module_is_callable_and_subpackage_importable():
    from tfx_vec.pfor import register_converter, vectorized_map  # noqa: F401
    import tfx_vec.pfor.api  # noqa: F401
    assert callable(tfx_vec.pfor)
    assert tfx_vec.vectorized_map is tfx_vec.pfor.vectorized_map
    assert tfx_vec.VectorizationError is tfx_vec.pfor.VectorizationError
    assert tfx_vec.pfor(lambda i: i * 2, 3).numpy().tolist() == [0, 2, 4]


def test_nested_outputs_and_invariant_outputs_in_every_mode():
    x, w = arr(5, 3), arr(3)

    def loop_fn(i):
        row = tf.gather(x, i)
        return {"row": row * w, "pair": (tf.reduce_sum(row), w + 1.0), "const": tf.constant(2.0)}
    check_pfor(loop_fn, 5)


def test_iters_zero_gives_an_empty_stack_of_the_right_shape():
    x = arr(4, 3)
    out = tfx_vec.pfor(lambda i: tf.gather(x, i) * 2.0, 0)
    assert out.shape == (0, 3)
    out = tf.function(lambda n: tfx_vec.pfor(lambda i: tf.gather(x, i) + 1.0, n))(tf.constant(0))
    assert out.shape == (0, 3)
    out = tfx_vec.pfor(lambda i: tf.reshape(tf.gather(x, i), [-1, 1]) @ tf.ones([1, 2]), 0)
    assert out.shape == (0, 3, 2)
    out = tfx_vec.vectorized_map(lambda r: tf.reduce_sum(r), tf.zeros([0, 3]), chunk_size=2)
    assert out.shape == (0,)


def test_dynamic_iters_tensor_in_eager():
    x = arr(6, 2)
    got = tfx_vec.pfor(lambda i: tf.gather(x, i) ** 2, tf.constant(4))
    assert_all_close(got, x.numpy()[:4] ** 2, 1e-6, 1e-6, "dynamic eager")


def test_config_reductions():
    x = arr(4, 3)

    def loop_fn(i, config):
        row = tf.gather(x, i)
        return (row - config.reduce_mean(row), config.reduce_sum(row) + 0.0 * row,
                config.reduce_concat(row), config.reduce(lambda s: tf.reduce_max(s), row))
    a, b, c, d = tfx_vec.pfor(loop_fn, 4)
    xv = x.numpy()
    np.testing.assert_allclose(a.numpy(), xv - xv.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), np.broadcast_to(xv.sum(0), (4, 3)), rtol=1e-5)
    np.testing.assert_allclose(c.numpy(), np.broadcast_to(xv, (4, 4, 3)))  # stacked, as TF
    np.testing.assert_allclose(d.numpy(), np.full([4], xv.max()))
    # the reduced value is used only through the reduction
    got = tfx_vec.pfor(lambda i, config: tf.gather(x, i) - config.reduce_mean(tf.gather(x, i)), 4)
    np.testing.assert_allclose(got.numpy(), xv - xv.mean(0), rtol=1e-5, atol=1e-6)


def test_config_reductions_in_while_conditions_in_every_mode():
    """A reduction in a loop's condition makes the trip count loop-invariant: the loop runs,
    in lock step, until no iteration is active (the body masks the finished ones)."""
    x = arr(4, 6)
    lengths = tf.constant(R.integers(0, 7, size=4), tf.int32)

    def loop_fn(i, config):
        row, length = tf.gather(x, i), tf.gather(lengths, i)

        def body(active, j, total):
            active = tf.logical_and(active, j < length)
            step = tf.gather(row, tf.minimum(j, 5))
            return active, tf.where(active, j + 1, j), tf.where(active, total + step, total)
        _, steps, total = tf.while_loop(
            lambda active, *_: tf.reduce_any(config.reduce_concat(active)), body,
            [True, 0, 0.0])
        doubled, = tf.while_loop(lambda t: config.reduce_sum(t) < 50.0, lambda t: t * 2.0,
                                [tf.abs(row[0]) + 0.5])
        return steps, total, doubled

    xv, lv = x.numpy(), lengths.numpy()
    doubled = np.abs(xv[:, 0]) + 0.5
    while doubled.sum() < 50.0:
        doubled = doubled * 2.0
    want = (lv, np.array([xv[k, :lv[k]].sum() for k in range(4)], np.float32),
            doubled.astype(np.float32))
    run = lambda: tfx_vec.pfor(loop_fn, 4, fallback_to_while_loop=False)
    for mode, got in [("eager", run()), ("function", tf.function(run)()),
                      ("xla", tf.function(run, jit_compile=True)())]:
        assert_all_close(tuple(got), want, 1e-5, 1e-5, mode)


def test_repeated_eager_calls_do_not_retrace():
    x = arr(4, 3)
    before = tfx_vec.pfor.cache_stats()["traces"]
    for k in range(4):
        y = arr(4, 3)                 # a new tensor, same signature: same trace
        out = tfx_vec.pfor(lambda i: tf.gather(y, i) * tf.gather(x, i), 4)
        np.testing.assert_allclose(out.numpy(), y.numpy() * x.numpy(), rtol=1e-6)
    assert tfx_vec.pfor.cache_stats()["traces"] - before == 1
    before = tfx_vec.pfor.cache_stats()["traces"]
    for _ in range(3):
        tfx_vec.vectorized_map(lambda r: tf.reduce_sum(r * 2.0), arr(5, 2))
    assert tfx_vec.pfor.cache_stats()["traces"] - before == 1


def test_vectorized_map_axes():
    x, y = arr(3, 4, 2), arr(2, 5)
    got = tfx_vec.vectorized_map(lambda e: tf.matmul(e[0], e[1]), (x, y), in_axes=(1, None))
    want = np.stack([x.numpy()[:, k] @ y.numpy() for k in range(4)])
    assert_all_close(got, want, 1e-5, 1e-5, "in_axes")
    got = tfx_vec.vectorized_map(lambda e: tf.matmul(e[0], e[1]), (x, y), in_axes=(1, None),
                                 out_axes=2)
    assert_all_close(got, np.moveaxis(want, 0, 2), 1e-5, 1e-5, "out_axes")
    got = tfx_vec.vectorized_map(lambda e: {"a": e["a"] + e["b"][0, :2]},
                                 {"a": x, "b": y}, in_axes={"a": 0, "b": None})
    assert_all_close(got, {"a": x.numpy() + y.numpy()[0, :2]}, 1e-6, 1e-6, "dict in_axes")
    got = tfx_vec.vectorized_map(lambda e: (e * 2.0, tf.reduce_sum(y)), x, out_axes=(0, None))
    assert_all_close(got, (x.numpy() * 2, np.float32(y.numpy().sum())), 1e-5, 1e-5, "None out")


def test_vectorized_map_chunked_static_and_dynamic_remainders():
    x = arr(7, 3)
    want = np.tanh(x.numpy()) * 3
    for chunk in (1, 2, 3, 7, 10):
        got = tfx_vec.vectorized_map(lambda r: tf.tanh(r) * 3.0, x, chunk_size=chunk,
                                     fallback_to_while_loop=False)
        assert_all_close(got, want, 1e-5, 1e-6, f"chunk={chunk}")
    dyn = tf.function(lambda v: tfx_vec.vectorized_map(lambda r: tf.tanh(r) * 3.0, v,
                                                       chunk_size=3),
                      input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    assert_all_close(dyn(x), want, 1e-5, 1e-6, "dynamic chunked")
    assert_all_close(dyn(x[:2]), want[:2], 1e-5, 1e-6, "dynamic chunked, one short chunk")


def test_jit_compile_with_no_fallback():
    x, w = arr(6, 4), arr(4, 3)

    @tf.function(jit_compile=True)
    def f(x):
        return tfx_vec.pfor(lambda i: tf.nn.softplus(tf.linalg.matvec(w, tf.gather(x, i),
                                                                      transpose_a=True)),
                            6, fallback_to_while_loop=False)
    got = f(x)
    assert_all_close(got, np.log1p(np.exp(x.numpy() @ w.numpy())), 1e-5, 1e-5, "xla")
    chunked = tf.function(lambda x: tfx_vec.vectorized_map(lambda r: r * 2.0, x, chunk_size=4),
                          jit_compile=True)
    assert_all_close(chunked(x), x.numpy() * 2, 1e-6, 1e-6, "xla chunked")


def test_captured_variable_is_a_loop_invariant_input():
    v = tf.Variable(random_array(R, [3], np.float32))
    x = arr(4, 3)
    check_pfor(lambda i: tf.gather(x, i) * v, 4, modes=("eager", "function"))


def test_gradient_through_pfor():
    x, w = arr(4, 3), tf.Variable(random_array(R, [3, 2], np.float32))
    with tf.GradientTape() as tape:
        y = tfx_vec.pfor(lambda i: tf.tanh(tf.linalg.matvec(w, tf.gather(x, i),
                                                            transpose_a=True)), 4)
        loss = tf.reduce_sum(y)
    g = tape.gradient(loss, w)
    with tf.GradientTape() as tape:
        ref = tf.reduce_sum(tf.tanh(x @ w))
    np.testing.assert_allclose(g.numpy(), tape.gradient(ref, w).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("call,err", [
    (lambda: tfx_vec.pfor(lambda i: i, -1), ValueError),
    (lambda: tfx_vec.pfor(lambda i: i, 2.5), TypeError),
    (lambda: tfx_vec.pfor(lambda i: i, tf.constant([2])), TypeError),
    (lambda: tfx_vec.pfor(3, 2), TypeError),
    (lambda: tfx_vec.pfor(lambda i: i, 2, randomness="maybe"), ValueError),
    (lambda: tfx_vec.vectorized_map(lambda r: r, tf.ones([3]), chunk_size=0), ValueError),
    (lambda: tfx_vec.vectorized_map(lambda r: r, tf.ones([3]), in_axes=None), ValueError),
    (lambda: tfx_vec.vectorized_map(lambda r: r, tf.ones([3]), in_axes=2), ValueError),
    (lambda: tfx_vec.vectorized_map(lambda e: e, (tf.ones([3]), tf.ones([4]))), ValueError),
    (lambda: tfx_vec.vectorized_map(lambda e: e, (tf.ones([3]),), in_axes=(0, 0)), ValueError),
    (lambda: tfx_vec.vectorized_map(lambda r: r * 2, tf.ones([3]), out_axes=None),
     tfx_vec.VectorizationError),
])
def test_bad_arguments_give_clear_errors(call, err):
    with pytest.raises(err):
        call()


def test_reference_helper_stacks_structures():
    out = reference(lambda i: {"a": i, "b": (i * 2,)}, 3)
    assert out["a"].tolist() == [0, 1, 2] and out["b"][0].tolist() == [0, 2, 4]


_G = tf.constant(1.0)


def _uses_global(i):
    return tf.cast(i, tf.float32) + _G


def test_rebinding_a_global_tensor_hits_the_cache_and_is_seen():
    global _G
    before = tfx_vec.pfor.cache_stats()["traces"]
    for v in (1.0, 5.0, -2.0):
        _G = tf.constant(v)
        assert tfx_vec.pfor(_uses_global, 2).numpy().tolist() == [v, v + 1]
    assert tfx_vec.pfor.cache_stats()["traces"] - before == 1


PUBLIC_MODULES = ["tfx_vec.pfor", "tfx_vec.pfor.api", "tfx_vec.pfor.trace",
                  "tfx_vec.pfor.vectorizer", "tfx_vec.pfor.registry", "tfx_vec.pfor.errors",
                  "tfx_vec.pfor.gradients", "tfx_vec.pfor.data", "tfx_vec.pfor.composites",
                  "tfx_vec.pfor.eager_cache"]


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_name_has_a_runnable_example(module):
    import importlib
    import inspect
    m = importlib.import_module(module)
    assert ">>>" in (m.__doc__ or ""), module
    for name in m.__all__:
        value = getattr(m, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert ">>>" in (value.__doc__ or ""), f"{module}.{name} has no example"


def test_data_submodule_needs_no_import():
    import subprocess
    import sys
    code = "import tfx_vec; print(tfx_vec.pfor.data.map_and_batch.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "map_and_batch", out.stderr[-2000:]
