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
