"""The generic TcKernel op: it carries a TC (never code), runs in eager, tf.function and after
a SavedModel reload, zero-fills its outputs, and reports bad calls clearly."""
import uuid

import numpy as np
import pytest
import tensorflow as tf

from tests.support import random_array
from tfx_vec.tc_ops import op_builder, tf_op
from tfx_vec.tc_ops.errors import TcShapeError, TcSyntaxError

SAXPY = """def saxpy(float(N) X, float(N) Y, float s) -> (O, S) {
    O(i) = s * X(i) + Y(i) + %(c)s
    S(j) +=! O(i) * O(i) where j in 0:1
}"""
TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"


def _saxpy(c="0.0"):
    return SAXPY % {"c": c}


def _call(x, y, s, tc=None):
    return tf_op.kernel_op([x, y, s], tc=tc or _saxpy(), entry="saxpy")


def _reference(x, y, s, c=0.0):
    o = s * x + y + c
    return o, np.array([np.sum(o * o)])


def test_eager_two_outputs_and_scalar_argument():
    rng = np.random.default_rng(0)
    x, y = random_array(rng, (37,)), random_array(rng, (37,))
    s = np.float32(1.5)
    o, n = _call(x, y, s)
    ro, rn = _reference(x, y, s)
    np.testing.assert_allclose(o.numpy(), ro, rtol=1e-6)
    np.testing.assert_allclose(n.numpy(), rn, rtol=1e-4)


def test_the_graph_holds_the_tc_and_no_code():
    rng = np.random.default_rng(1)
    x, y = random_array(rng, (9,)), random_array(rng, (9,))

    @tf.function
    def f(x, y):
        return _call(x, y, tf.constant(2.0))[0] * 2.0

    np.testing.assert_allclose(f(x, y).numpy(), 2 * (2 * x + y), rtol=1e-6)
    graph = f.get_concrete_function(tf.TensorSpec([9]), tf.TensorSpec([9])).graph
    (op,) = [op for op in graph.get_operations() if op.type == "TcKernel"]
    assert op.get_attr("tc").decode() == _saxpy() and op.get_attr("entry") == b"saxpy"
    assert sorted(op.node_def.attr) == ["Tin", "Tout", "derivative", "entry", "grad_key",
                                        "input_shapes", "options", "output_shapes", "scalars",
                                        "tc"]


def test_wrong_input_shape_is_an_error_not_an_out_of_bounds_read():
    lib = tf_op.load_op_library()
    with pytest.raises(tf.errors.InvalidArgumentError, match="input 0 has shape .9. but the "
                                                             "graph declares .8."):
        lib.tc_kernel(inputs=[tf.ones([9]), tf.ones([9]), tf.constant(1.0)],
                      Tout=[tf.float32] * 2, tc=_saxpy(), entry="saxpy", options="",
                      input_shapes=[(8,), (8,), ()], output_shapes=[(8,), (1,)])


def test_bad_tc_in_the_raw_op_is_invalid_argument_naming_the_tc_error():
    lib = tf_op.load_op_library()
    with pytest.raises(tf.errors.InvalidArgumentError, match="TcKernel tc_saxpy: TcSyntaxError"):
        lib.tc_kernel(inputs=[tf.ones([3])], Tout=[tf.float32], tc="this is not a TC",
                      entry="saxpy", options="", input_shapes=[(3,)], output_shapes=[(3,)])
    with pytest.raises(TcSyntaxError):          # the Python wrapper says it before any op
        _call(tf.ones([3]), tf.ones([3]), tf.constant(1.0), "this is not a TC")


def test_every_output_element_is_written():
    """An output's range is its first statement's (``i in 2:5``: three elements, B(2)..B(4)),
    so the op writes every element: none reads what the memory held before (the allocator is
    first churned with NaN-filled buffers of the same size)."""
    tc = "def part(float(N) A) -> (B) { B(i) = A(i) where i in 2:5 }"
    a = np.arange(1, 9, dtype=np.float32)
    for _ in range(3):
        garbage = [tf.fill([3], float("nan")) + 0.0 for _ in range(64)]
        del garbage
        (b,) = tf_op.kernel_op([a], tc=tc, entry="part")
        np.testing.assert_array_equal(b.numpy(), a[2:5])


def test_savedmodel_reload_builds_the_kernel_in_a_fresh_cache(tmp_path, monkeypatch):
    # A TC never run in this process: the kernel is built when the reloaded graph first
    # executes, from the op's TC alone, into an empty kernel cache.
    tc = _saxpy(c=f"0.25 + 0 * {len(uuid.uuid4().hex)}")

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([5], tf.float32)] * 2)
        def f(self, x, y):
            return _call(x, y, tf.constant(3.0), tc)[0]

    tf.saved_model.save(M(), str(tmp_path / "model"))
    monkeypatch.setenv("TFX_VEC_CACHE_DIR", str(tmp_path / "fresh_cache"))
    monkeypatch.setattr(op_builder, "_built", {})   # forget the kernels made while tracing
    loaded = tf_op.load_saved_model(str(tmp_path / "model"))
    x = np.arange(1, 6, dtype=np.float32)
    y = np.full(5, 0.5, np.float32)
    np.testing.assert_allclose(loaded.f(x, y).numpy(), 3 * x + y + 0.25, rtol=1e-6)
    built = list((tmp_path / "fresh_cache" / "kernels").glob("*.so"))
    assert built and all((p.parent / (p.name + ".manifest")).exists() for p in built)


# -- TC entry points as TF ops -------------------------------------------------------------
def test_tc_function_in_a_savedmodel_with_its_gradient_graph(tmp_path):
    f = tf_op.tc_function(TMM, "tmm")

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([4, 3], tf.float32),
                                      tf.TensorSpec([5, 3], tf.float32)])
        def value_and_grad(self, A, B):
            with tf.GradientTape() as tape:
                tape.watch(A)
                loss = tf.reduce_sum(f(A, B) ** 2)
            return loss, tape.gradient(loss, A)

    tf.saved_model.save(M(), str(tmp_path / "m"))
    loaded = tf_op.load_saved_model(str(tmp_path / "m"))
    rng = np.random.default_rng(4)
    A, B = random_array(rng, (4, 3)), random_array(rng, (5, 3))
    loss, dA = loaded.value_and_grad(A, B)
    C = A @ B.T
    np.testing.assert_allclose(loss.numpy(), np.sum(C * C), rtol=1e-4)
    np.testing.assert_allclose(dA.numpy(), 2 * C @ B, rtol=1e-4, atol=1e-5)


def test_tc_function_errors_name_the_input():
    f = tf_op.tc_function(TMM, "tmm")
    with pytest.raises(TcShapeError, match="input A is declared float but got int32"):
        f(tf.ones([2, 2], tf.int32), tf.ones([2, 2]))
    with pytest.raises(TcShapeError, match="takes 2 input"):
        f(tf.ones([2, 2]))
    with pytest.raises(TcShapeError, match="size K is 3 from A"):
        f(tf.ones([2, 3]), tf.ones([2, 4]))
    g = tf_op.tc_function(TMM, "tmm", backward=None)
    a = tf.ones([2, 3])
    with tf.GradientTape() as tape:
        tape.watch(a)
        out = g(a, tf.ones([2, 3]))
    with pytest.raises(LookupError, match="the op has no gradient"):
        tape.gradient(out, a)


def test_out_of_range_ids_are_clamped_in_the_op_not_read_out_of_bounds():
    f = tf_op.tc_function("def g(float(N) X, int32(M) I) -> (Z) { Z(i) = X(I(i)) }", "g")
    X = np.arange(1, 5, dtype=np.float32)
    out = f(X, np.array([0, 3, 7, -2], np.int32)).numpy()
    np.testing.assert_array_equal(out, [1, 4, 4, 1])
