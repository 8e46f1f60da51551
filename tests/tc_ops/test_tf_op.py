"""The generic TcKernel op on hand-written C kernels: eager, tf.function, SavedModel, errors."""
import os
import uuid

import numpy as np
import pytest
import tensorflow as tf

from tests.support import random_array
from tfx_vec.tc_ops import tf_op

SAXPY = """
void tc_saxpy(void* const* a) {
  const float* x = (const float*)a[0]; const float* y = (const float*)a[1];
  const float* s = (const float*)a[2]; float* o = (float*)a[3]; float* n = (float*)a[4];
  for (int i = 0; i < %(n)d; ++i) o[i] = s[0] * x[i] + y[i] + %(c)s;
  n[0] = 0.0f; for (int i = 0; i < %(n)d; ++i) n[0] += o[i] * o[i];
}
"""


def _saxpy(n, c="0.0f"):
    return SAXPY % {"n": n, "c": c}


def _call(x, y, s, source):
    return tf_op.kernel_op([x, y, s], source=source, entry="saxpy",
                           output_shapes=[x.shape, ()], output_dtypes=[tf.float32] * 2)


def _reference(x, y, s, c=0.0):
    o = s * x + y + c
    return o, np.sum(o * o)


def test_eager_two_outputs_and_scalar_argument():
    rng = np.random.default_rng(0)
    x, y = random_array(rng, (37,)), random_array(rng, (37,))
    s = np.float32(1.5)
    o, n = _call(x, y, s, _saxpy(37))
    ro, rn = _reference(x, y, s)
    np.testing.assert_allclose(o.numpy(), ro, rtol=1e-6)
    np.testing.assert_allclose(n.numpy(), rn, rtol=1e-4)


def test_inside_tf_function_and_graph_has_the_op():
    rng = np.random.default_rng(1)
    x, y = random_array(rng, (9,)), random_array(rng, (9,))

    @tf.function
    def f(x, y):
        return _call(x, y, tf.constant(2.0), _saxpy(9))[0] * 2.0

    np.testing.assert_allclose(f(x, y).numpy(), 2 * (2 * x + y), rtol=1e-6)
    graph = f.get_concrete_function(tf.TensorSpec([9]), tf.TensorSpec([9])).graph
    assert "TcKernel" in [op.type for op in graph.get_operations()]


def test_wrong_input_shape_is_an_error_not_an_out_of_bounds_read():
    lib = tf_op.load_op_library()
    src = _saxpy(8)
    with pytest.raises(tf.errors.InvalidArgumentError, match="compiled for"):
        lib.tc_kernel(inputs=[tf.ones([9]), tf.ones([9]), tf.constant(1.0)],
                      Tout=[tf.float32] * 2, input_shapes=[(8,), (8,), ()],
                      output_shapes=[(8,), ()], entry="saxpy", source=src,
                      source_hash=tf_op.source_hash(src, "cc", tf_op.DEFAULT_C_FLAGS),
                      compile_flags=tf_op.DEFAULT_C_FLAGS)


def test_compile_error_names_the_kernel():
    with pytest.raises(tf.errors.InternalError, match="tc_saxpy.*failed"):
        _call(tf.ones([3]), tf.ones([3]), tf.constant(1.0), "this is not C")


def test_missing_symbol_is_reported():
    src = "void tc_other(void* const* a) {}"
    with pytest.raises(tf.errors.NotFoundError, match="tc_saxpy"):
        _call(tf.ones([3]), tf.ones([3]), tf.constant(1.0), src)


def test_savedmodel_reload_rebuilds_kernel_in_a_fresh_cache(tmp_path, monkeypatch):
    # A source never run in this process: the kernel is built when the reloaded graph first
    # executes, from the source attribute alone, into an empty kernel cache.
    tag = uuid.uuid4().hex[:8]
    src = _saxpy(5, c=f"0.25f /* {tag} */")

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([5], tf.float32)] * 2)
        def f(self, x, y):
            return _call(x, y, tf.constant(3.0), src)[0]

    tf.saved_model.save(M(), str(tmp_path / "model"))
    monkeypatch.setenv("TFX_VEC_CACHE_DIR", str(tmp_path / "fresh_cache"))
    loaded = tf.saved_model.load(str(tmp_path / "model"))
    x = np.arange(1, 6, dtype=np.float32)
    y = np.full(5, 0.5, np.float32)
    np.testing.assert_allclose(loaded.f(x, y).numpy(), 3 * x + y + 0.25, rtol=1e-6)
    built = os.listdir(tmp_path / "fresh_cache" / "kernels")
    assert any(name.endswith(".so") for name in built), built


def test_stale_binary_is_rebuilt_from_source(tmp_path, monkeypatch):
    monkeypatch.setenv("TFX_VEC_CACHE_DIR", str(tmp_path))
    src = _saxpy(4, c=f"1.0f /* {uuid.uuid4().hex} */")
    h = tf_op.source_hash(src, "cc", tf_op.DEFAULT_C_FLAGS)
    kdir = tmp_path / "kernels"
    kdir.mkdir()
    (kdir / f"{h}.c").write_text("void tc_saxpy(void* const* a) {}  /* a different source */")
    (kdir / f"{h}.so").write_bytes(b"not an ELF file")
    x = np.ones(4, np.float32)
    o, _ = _call(x, x, tf.constant(2.0), src)
    np.testing.assert_allclose(o.numpy(), 2 * x + x + 1.0)
    assert (kdir / f"{h}.c").read_text() == src


# -- TC entry points as TF ops -------------------------------------------------------------
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"


def test_tc_function_in_a_savedmodel_with_its_gradient_graph(tmp_path):
    from tfx_vec.tc_ops.tf_op import tc_function

    f = tc_function(TMM, "tmm")

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([4, 3], tf.float32),
                                      tf.TensorSpec([5, 3], tf.float32)])
        def value_and_grad(self, A, B):
            with tf.GradientTape() as tape:
                tape.watch(A)
                loss = tf.reduce_sum(f(A, B) ** 2)
            return loss, tape.gradient(loss, A)

    tf.saved_model.save(M(), str(tmp_path / "m"))
    loaded = tf.saved_model.load(str(tmp_path / "m"))
    rng = np.random.default_rng(4)
    A, B = random_array(rng, (4, 3)), random_array(rng, (5, 3))
    loss, dA = loaded.value_and_grad(A, B)
    C = A @ B.T
    np.testing.assert_allclose(loss.numpy(), np.sum(C * C), rtol=1e-4)
    np.testing.assert_allclose(dA.numpy(), 2 * C @ B, rtol=1e-4, atol=1e-5)


def test_tc_function_errors_name_the_input():
    from tfx_vec.tc_ops.errors import TcShapeError
    from tfx_vec.tc_ops.tf_op import tc_function

    f = tc_function(TMM, "tmm")
    with pytest.raises(TcShapeError, match="input A is declared float but got int32"):
        f(tf.ones([2, 2], tf.int32), tf.ones([2, 2]))
    with pytest.raises(TcShapeError, match="takes 2 input"):
        f(tf.ones([2, 2]))

    @tf.function(input_signature=[tf.TensorSpec([None, 3]), tf.TensorSpec([4, 3])],
                 autograph=False)
    def dynamic(a, b):
        return f(a, b)

    with pytest.raises(TcShapeError, match="not fully known"):
        dynamic.get_concrete_function()
    g = tc_function(TMM, "tmm", backward=None)
    a = tf.ones([2, 3])
    with tf.GradientTape() as tape:
        tape.watch(a)
        out = g(a, tf.ones([2, 3]))
    with pytest.raises(LookupError, match="no gradient is registered"):
        tape.gradient(out, a)


def test_out_of_range_ids_are_clamped_in_the_op_not_read_out_of_bounds():
    from tfx_vec.tc_ops.tf_op import tc_function

    f = tc_function("def g(float(N) X, int32(M) I) -> (Z) { Z(i) = X(I(i)) }", "g")
    X = np.arange(1, 5, dtype=np.float32)
    out = f(X, np.array([0, 3, 7, -2], np.int32)).numpy()
    np.testing.assert_array_equal(out, [1, 4, 4, 1])
