"""TC ops and layers with dimensions unknown when the graph is traced: a kernel is made (and kept)
per concrete size when the op runs.  Keras ``fit`` with a partial last batch, ``predict`` on any
batch size, a reloaded ``.keras`` model; gradients; the GPU op's graph and its per-size PTX
(checked with nvcc and ptxas: there is no GPU here)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.support import random_array, require, require_tool
from tfx_vec.tc_ops import op_builder, tf_op
from tfx_vec.tc_ops.keras import EmbeddingBag, FusedMLP, GroupedConv, TcLayer

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"
FCRELU = """def fcrelu(float(B,M) I, float(N,M) W, float(N) bias) -> (O) {
    O(b,n) = bias(n)
    O(b,n) += I(b,m) * W(n,m)
    O(b,n) = fmaxf(O(b,n), 0)
}"""


def _mlp_reference(layer: FusedMLP, x: np.ndarray) -> np.ndarray:
    h = x
    for k in range(1, len(layer.units) + 1):
        W, b = (layer.tc_weights[f"{n}{k}"].numpy() for n in ("W", "b"))
        h = h @ W.T + b
        if k < len(layer.units):
            h = np.maximum(h, 0)
    return h


def test_an_op_traced_with_an_unknown_batch_runs_every_size_with_its_gradient():
    f = tf_op.tc_function(TMM, "tmm")

    @tf.function(input_signature=[tf.TensorSpec([None, 6]), tf.TensorSpec([5, 6])])
    def value_and_grad(a, b):
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            c = f(a, b)
            loss = tf.reduce_sum(c * c)
        return c, tape.gradient(loss, [a, b])

    graph = value_and_grad.get_concrete_function().graph
    ops = [op for op in graph.get_operations() if op.type == "TcKernel"]
    assert len(ops) == 2 and ops[0].outputs[0].shape.as_list() == [None, 5]
    assert ops[0].get_attr("input_shapes")[0].dim[0].size == -1
    # the gradient op carries the forward TC: its backward TC is derived at each run's shapes
    assert ops[1].get_attr("tc") == ops[0].get_attr("tc")
    assert ops[1].get_attr("derivative") == b'["A", "B"]'
    assert [o.shape.as_list() for o in ops[1].outputs] == [[None, 6], [5, 6]]
    rng = np.random.default_rng(0)
    B = random_array(rng, (5, 6))
    for m in (3, 32, 1, 17, 3):
        A = random_array(rng, (m, 6))
        C, (dA, dB) = value_and_grad(A, B)
        ref = A @ B.T
        np.testing.assert_allclose(C.numpy(), ref, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(dA.numpy(), 2 * ref @ B, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(dB.numpy(), 2 * ref.T @ A, rtol=1e-4, atol=1e-4)


def test_kernels_are_kept_per_size_inside_the_op(monkeypatch):
    """Once a size has run, the op reuses its kernel: the builder is not asked again."""
    f = tf_op.tc_function(TMM, "tmm", backward=None)
    g = tf.function(lambda a, b: f(a, b),
                    input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([3, 4])])
    B = np.ones((3, 4), np.float32)
    for m in (2, 9):
        g(np.ones((m, 4), np.float32), B)

    def no_builds(request):
        raise AssertionError("the builder was asked again")
    monkeypatch.setattr(op_builder, "serve", no_builds)
    for m in (9, 2, 9):
        np.testing.assert_array_equal(g(np.ones((m, 4), np.float32), B).numpy(),
                                      np.full((m, 3), 4.0))
    with pytest.raises(tf.errors.InternalError, match="the builder failed"):
        g(np.ones((5, 4), np.float32), B)     # a new size asks the (broken) builder


def test_a_run_whose_sizes_break_the_tc_is_a_clear_error():
    f = tf_op.tc_function(TMM, "tmm", backward=None)
    g = tf.function(lambda a, b: f(a, b),
                    input_signature=[tf.TensorSpec([None, None]), tf.TensorSpec([3, 4])])
    with pytest.raises(tf.errors.InvalidArgumentError, match="TcShapeError: tmm: size K is 5"):
        g(np.ones((2, 5), np.float32), np.ones((3, 4), np.float32))


def test_fit_with_a_partial_last_batch_predict_on_any_batch_and_reload(tmp_path):
    rng = np.random.default_rng(1)
    x, y = random_array(rng, (250, 8)), random_array(rng, (250, 2))
    mlp = FusedMLP([16, 2])
    model = keras.Sequential([keras.Input((8,)), mlp])     # batch size unknown
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    first = model.evaluate(x, y, batch_size=32, verbose=0)
    history = model.fit(x, y, batch_size=32, epochs=4, verbose=0)   # 7 batches of 32, one of 26
    assert history.history["loss"][-1] < first
    assert model.evaluate(x, y, batch_size=32, verbose=0) < first
    for n in (1, 7, 250):
        np.testing.assert_allclose(model.predict(x[:n], batch_size=n, verbose=0),
                                   _mlp_reference(mlp, x[:n]), rtol=1e-4, atol=1e-5)
    path = str(tmp_path / "mlp.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded.predict(x[:33], batch_size=11, verbose=0),
                               model.predict(x[:33], batch_size=11, verbose=0), rtol=1e-6)


def test_tc_layer_trains_with_an_unknown_batch():
    rng = np.random.default_rng(2)
    layer = TcLayer(FCRELU, "fcrelu", weights={"W": (6, "M"), "bias": (6,)},
                    initializers={"bias": "ones"})
    model = keras.Sequential([keras.Input((3,)), layer, keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse")
    x, y = random_array(rng, (45, 3)), random_array(rng, (45, 1))
    first = model.evaluate(x, y, batch_size=16, verbose=0)
    model.fit(x, y, batch_size=16, epochs=5, verbose=0)      # batches of 16, 16, 13
    assert model.evaluate(x, y, batch_size=16, verbose=0) < first
    W, b = layer.tc_weights["W"].numpy(), layer.tc_weights["bias"].numpy()
    np.testing.assert_allclose(layer(x[:5]).numpy(), np.maximum(x[:5] @ W.T + b, 0),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make, shape, dtype", [
    (lambda: GroupedConv(2, (2, 2)), (2, 3, 5, 5), "float32"),
    (lambda: EmbeddingBag(10, 4), (3,), "int32"),
], ids=["grouped_conv", "embedding_bag"])
def test_ready_layers_predict_on_any_batch(make, shape, dtype):
    rng = np.random.default_rng(3)
    layer = make()
    model = keras.Sequential([keras.Input(shape, dtype=dtype), layer])
    for n in (1, 6):
        x = (rng.integers(0, 10, (n, *shape)).astype(np.int32) if dtype == "int32"
             else random_array(rng, (n, *shape)))
        out = model.predict(x, batch_size=4, verbose=0)
        np.testing.assert_allclose(out, layer(x).numpy(), rtol=1e-5, atol=1e-5)
        assert out.shape[0] == n


# -- the GPU op -------------------------------------------------------------------------------
def test_the_gpu_op_with_an_unknown_batch_makes_valid_ptx_per_size(monkeypatch, tmp_path):
    require(tf_op.cuda_include_dir() is not None and op_builder.native.tool(
        "NVCC", required=False) is not None, "nvcc and CUDA's cuda.h (a CUDA toolkit)")
    ptxas = require_tool("ptxas")
    monkeypatch.setattr(tf_op, "require_gpu", lambda: None)   # build the graph, never run it
    layer = TcLayer(FCRELU, "fcrelu", weights={"W": (5, "M"), "bias": (5,)}, backend="cuda")
    model = keras.Sequential([keras.Input((3,)), layer])
    weights = model.trainable_variables

    @tf.function(autograph=False)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        return loss, tape.gradient(loss, weights)

    graph = step.get_concrete_function(tf.TensorSpec([None, 3])).graph
    ops = [op for op in graph.get_operations() if op.type == "TcCudaKernel"]
    assert len(ops) == 2 and "TcKernel" not in [op.type for op in graph.get_operations()]
    fwd = next(op for op in ops if op.get_attr("entry") == b"fcrelu")
    assert fwd.outputs[0].shape.as_list() == [None, 5]
    for batch in (7, 64):
        spec = op_builder.build(op_builder.request_for(fwd.node_def, [(batch, 3), (5, 3), (5,)]))
        assert spec.output_shapes == ((batch, 5),)
        assert spec == layer.fn.cuda_spec(tf.ones([batch, 3]), tf.ones([5, 3]), tf.ones([5]))
        ptx = tmp_path / f"k{batch}.ptx"
        ptx.write_text(spec.module)
        proc = op_builder.native.subprocess.run(
            [ptxas, "-arch=sm_90", str(ptx), "-o", str(tmp_path / "k.cubin")],
            capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
