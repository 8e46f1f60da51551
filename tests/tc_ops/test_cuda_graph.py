"""``tc.define(..., backend="cuda")`` entries and Keras layers with ``backend="cuda"`` inside
graphs: they build ``TcCudaKernel`` ops (forward and gradient) carrying the PTX and launch sizes
of the GPU mapping, never the CPU ``TcKernel``; run without a GPU they are TcBackendError
"TensorFlow sees no GPU"; the Keras config keeps the backend; cpu entries and layers are
unchanged.  As in test_tf_op_cuda.py, graphs are built with ``require_gpu`` patched out (they are
never run here); on a machine with a GPU the same calls are checked against NumPy instead."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.support import random_array, require, square_loss_and_grad
from tests.tc_ops.corpus import CASES
from tfx_vec import tc_ops as tc
from tfx_vec.tc_ops import op_builder, tf_op
from tfx_vec.tc_ops.backends.cuda import nvcc_path
from tfx_vec.tc_ops.errors import TcBackendError, TcOptionsError, TcShapeError
from tfx_vec.tc_ops.keras import EmbeddingBag, FusedMLP, GroupedConv, TcLayer

HAS_GPU = bool(tf.config.list_physical_devices("GPU"))
CASE = {c.name: c for c in CASES}
TMM, FCRELU = CASE["tmm"].source, CASE["fcrelu"].source
NO_GPU = r"backend 'cuda': TensorFlow sees no GPU here .*TcCudaKernel op runs only on a GPU"


@pytest.fixture
def graph_only(monkeypatch):
    """Build graphs holding TcCudaKernel ops on this GPU-less machine (they are never run)."""
    require(nvcc_path() is not None and tf_op.cuda_include_dir() is not None,
            "nvcc and CUDA's cuda.h (a CUDA toolkit)")
    monkeypatch.setattr(tf_op, "require_gpu", lambda: None)


def _op_types(graph: tf.Graph) -> list[str]:
    return [op.type for op in graph.get_operations()]


def _cuda_ops(graph: tf.Graph) -> dict[str, tf.Operation]:
    """The graph's TcCudaKernel ops by TC entry name, ``<entry> derivative`` for a gradient op
    (which carries the forward TC; no TcKernel may be among the graph's ops)."""
    types = _op_types(graph)
    assert "TcKernel" not in types, types
    return {op.get_attr("entry").decode() + (" derivative" if op.get_attr("derivative") else ""):
            op for op in graph.get_operations() if op.type == "TcCudaKernel"}


def _launches(op: tf.Operation) -> tf_op.CudaLaunchSpec:
    """What ``op`` launches when it runs on its inputs' shapes: the builder's answer to the
    op's own attributes (the op carries a TC, never PTX)."""
    assert "module" not in op.node_def.attr and op.get_attr("tc")
    shapes = [inp.shape.as_list() for inp in op.inputs]
    return op_builder.build(op_builder.request_for(op.node_def, shapes))


def _assert_launches(op: tf.Operation, spec: tf_op.CudaLaunchSpec) -> None:
    """``op`` launches exactly ``spec``: PTX, kernels, grid/block, temporaries, output shapes."""
    assert _launches(op) == spec
    shapes = [list(s) for s in spec.output_shapes]
    assert [tf.TensorShape(s).as_list() for s in op.get_attr("output_shapes")] == shapes
    assert [o.shape.as_list() for o in op.outputs] == shapes


def _pad3(t) -> tuple:
    t = tuple(int(x) for x in t)
    return t + (1,) * (3 - len(t))


# -- tc.define(..., backend="cuda") entries inside tf.function ------------------------------
def test_cuda_entry_in_tf_function_traces_to_the_gpu_op_and_its_gradient(graph_only):
    mod = tc.define(TMM, backend="cuda")
    concrete = square_loss_and_grad(lambda a, b: mod.tmm(a, b)).get_concrete_function(
        tf.TensorSpec([40, 24]), tf.TensorSpec([50, 24]))
    C, dA = concrete.structured_outputs
    assert C.shape == (40, 50) and dA.shape == (40, 24)
    ops = _cuda_ops(concrete.graph)
    # The attributes are those of a TcFunction made independently of the entry, forward and
    # backward (the backward TC takes A, B and dC).
    f = tf_op.TcFunction(TMM, "tmm", backend="cuda")
    A, B = tf.ones([40, 24]), tf.ones([50, 24])
    assert sorted(ops) == ["tmm", "tmm derivative"]
    _assert_launches(ops["tmm"], f.cuda_spec(A, B))
    _assert_launches(ops["tmm derivative"],
                     f.backward_at(A, B).cuda_spec(A, B, tf.ones([40, 50])))


def test_cuda_entry_uses_the_per_call_options_in_the_graph(graph_only):
    """``options=`` at the call picks the mapping the op launches: its block sizes are the
    threads of those options, as the cuda backend maps them (computed without tf_op)."""
    opts = tc.MappingOptions(tile=(8, 8, 8), map_to_threads=(8, 4), map_to_blocks=(4, 4),
                             use_shared_memory=True, unroll=2)
    mod = tc.define(TMM, backend="cuda")
    graph_fn = tf.function(lambda a, b: mod.tmm(a, b, options=opts), autograph=False)
    plain_fn = tf.function(lambda a, b: mod.tmm(a, b), autograph=False)
    sig = (tf.TensorSpec([32, 16]), tf.TensorSpec([24, 16]))
    (op,) = _cuda_ops(graph_fn.get_concrete_function(*sig).graph).values()
    (plain,) = _cuda_ops(plain_fn.get_concrete_function(*sig).graph).values()

    rng = np.random.default_rng(4)
    A, B = random_array(rng, (32, 16)), random_array(rng, (24, 16))
    kernel = tc.define(TMM, backend="cuda").tmm.compile(A, B, options=opts)
    launches, plain_launches = _launches(op), _launches(plain)
    assert launches.block == tuple(_pad3(gk.block) for gk in kernel.mapping.kernels)
    assert launches.grid == tuple(_pad3(gk.grid) for gk in kernel.mapping.kernels)
    assert launches.block == ((8, 4, 1),) and plain_launches.block != ((8, 4, 1),)
    assert ".shared" in launches.module
    _assert_launches(op, tf_op.TcFunction(TMM, "tmm", backend="cuda", options=opts)
                     .cuda_spec(A, B))
    with pytest.raises(TcOptionsError, match="options must be a tc.MappingOptions"):
        tf.function(lambda a, b: mod.tmm(a, b, options={"tile": (8,)}),
                    autograph=False).get_concrete_function(*sig)


def test_cuda_entry_run_without_a_gpu_is_the_clear_error():
    rng = np.random.default_rng(8)
    A, B = random_array(rng, (33, 7)), random_array(rng, (21, 7))
    mod = tc.define(TMM, backend="cuda")
    loss_and_grad = square_loss_and_grad(lambda a, b: mod.tmm(a, b))
    if HAS_GPU:  # there the graph runs on the GPU: forward and gradient against NumPy
        C, dA = loss_and_grad(tf.constant(A), tf.constant(B))
        assert "GPU" in C.device
        np.testing.assert_allclose(C.numpy(), A @ B.T, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(dA.numpy(), 2 * (A @ B.T) @ B, rtol=1e-4, atol=1e-3)
        return
    with pytest.raises(TcBackendError, match=NO_GPU):
        loss_and_grad(tf.constant(A), tf.constant(B))
    with pytest.raises(TcBackendError, match=NO_GPU):   # AutoGraph keeps the error's type
        tf.function(lambda a, b: mod.tmm(a, b))(A, B)


def test_an_entry_without_a_tf_op_is_a_clear_error_in_tf_function():
    mod = tc.define(TMM, backend="opencl")
    with pytest.raises(TcBackendError, match=r"tmm: backend 'opencl' has no TF op, so it cannot "
                                             r"run inside tf.function; call the entry eagerly, or "
                                             r"define it with backend='cpu' .* backend='cuda'"):
        tf.function(lambda a, b: mod.tmm(a, b)).get_concrete_function(
            tf.TensorSpec([4, 3]), tf.TensorSpec([5, 3]))


def test_cpu_entry_in_tf_function_still_the_cpu_op_with_per_call_options():
    rng = np.random.default_rng(6)
    A, B = random_array(rng, (20, 9)), random_array(rng, (13, 9))
    mod = tc.define(TMM)
    naive = tf.function(lambda a, b: mod.tmm(a, b, options=tc.MappingOptions.naive()),
                        autograph=False)
    graph = naive.get_concrete_function(tf.TensorSpec([20, 9]), tf.TensorSpec([13, 9])).graph
    (op,) = [op for op in graph.get_operations() if op.type == "TcKernel"]
    assert "TcCudaKernel" not in _op_types(graph)
    built = op_builder.build(op_builder.request_for(op.node_def, [(20, 9), (13, 9)]))
    assert "#pragma" not in built.kernel.source     # the naive schedule's C
    np.testing.assert_allclose(naive(A, B).numpy(), A @ B.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(TcShapeError, match="size K is 9 from A"):   # not AutoGraph's StagingError
        tf.function(lambda a, b: mod.tmm(a, b))(A, B[:, :4])


# -- Keras layers with backend="cuda" -------------------------------------------------------
def _fcrelu_layer(backend: str) -> TcLayer:
    return TcLayer(FCRELU, "fcrelu", weights={"W": (5, "M"), "bias": (5,)},
                   initializers={"bias": "ones"}, backend=backend)


def test_model_with_a_cuda_layer_trains_through_gpu_ops(graph_only):
    """One training step of a model holding a cuda TcLayer: TcCudaKernel for the forward and
    the backward TC, gradients for both of the layer's weights."""
    layer = _fcrelu_layer("cuda")
    model = keras.Sequential([keras.Input((3,), batch_size=8), layer, keras.layers.Dense(2)])
    weights = model.trainable_variables

    @tf.function(autograph=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        return loss, tape.gradient(loss, weights)

    concrete = step.get_concrete_function(tf.TensorSpec([8, 3]), tf.TensorSpec([8, 2]))
    _, grads = concrete.structured_outputs
    assert [tuple(g.shape) for g in grads] == [tuple(w.shape) for w in weights]
    assert [w.name for w in weights[:2]] == ["W", "bias"]
    ops = _cuda_ops(concrete.graph)
    f = tf_op.TcFunction(FCRELU, "fcrelu", backend="cuda")
    x, W, b = tf.ones([8, 3]), tf.ones([5, 3]), tf.ones([5])
    assert sorted(ops) == ["fcrelu", "fcrelu derivative"]
    _assert_launches(ops["fcrelu"], f.cuda_spec(x, W, b))
    _assert_launches(ops["fcrelu derivative"],
                     f.backward_at(x, W, b).cuda_spec(x, W, b, tf.ones([8, 5])))


@pytest.mark.parametrize("make, shape, dtype", [
    (lambda: FusedMLP([6, 3], backend="cuda"), (8, 4), tf.float32),
    (lambda: GroupedConv(2, (2, 2), backend="cuda"), (4, 2, 3, 5, 5), tf.float32),
    (lambda: EmbeddingBag(10, 4, backend="cuda"), (8, 3), tf.int32),
], ids=["fused_mlp", "grouped_conv", "embedding_bag"])
def test_ready_layers_build_the_gpu_op(graph_only, make, shape, dtype):
    layer = make()
    model = keras.Sequential([keras.Input(shape[1:], batch_size=shape[0], dtype=dtype.name),
                              layer])
    graph = tf.function(model, autograph=False).get_concrete_function(
        tf.TensorSpec(shape, dtype)).graph
    (op,) = _cuda_ops(graph).values()
    args = [tf.ones(shape, dtype) if p.name in layer.input_names
            else tf.ones(layer.tc_weights[p.name].shape) for p in layer.fn.cdef.inputs]
    _assert_launches(op, tf_op.TcFunction(layer.source, layer.entry, backend="cuda")
                     .cuda_spec(*args))


def test_cuda_layer_called_without_a_gpu_is_the_clear_error():
    rng = np.random.default_rng(9)
    layer = _fcrelu_layer("cuda")
    x = random_array(rng, (8, 3))
    if HAS_GPU:
        out = layer(x).numpy()
        W, b = layer.tc_weights["W"].numpy(), layer.tc_weights["bias"].numpy()
        np.testing.assert_allclose(out, np.maximum(x @ W.T + b, 0), rtol=1e-4, atol=1e-4)
        return
    with pytest.raises(TcBackendError, match=NO_GPU):
        layer(x)
    with pytest.raises(TcBackendError, match=NO_GPU):
        tf.function(lambda v: layer(v))(x)
    model = keras.Sequential([keras.Input((3,), batch_size=8), _fcrelu_layer("cuda")])
    with pytest.raises(TcBackendError, match=NO_GPU):
        model.predict(x, batch_size=8, verbose=0)


def test_get_config_round_trip_keeps_the_backend(tmp_path):
    layers = [_fcrelu_layer("cuda"), FusedMLP([6, 3], backend="cuda"),
              GroupedConv(2, (2, 2), backend="cuda"), EmbeddingBag(10, 4, backend="cuda")]
    for layer in layers:
        config = layer.get_config()
        assert config["backend"] == "cuda"
        clone = type(layer).from_config(config)
        assert clone.backend == clone.fn.backend == "cuda" and clone.get_config() == config
    cpu = FusedMLP([6, 3])
    assert cpu.get_config()["backend"] == "cpu" and cpu.fn.backend == "cpu"
    old = {k: v for k, v in cpu.get_config().items() if k != "backend"}  # saved before backend=
    assert FusedMLP.from_config(old).fn.backend == "cpu"

    # A saved model (built, never run: building needs no GPU) reloads as cuda layers.
    model = keras.Sequential([keras.Input((4,), batch_size=8), FusedMLP([6, 3], backend="cuda")])
    path = str(tmp_path / "cuda_mlp.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.layers[-1].backend == loaded.layers[-1].fn.backend == "cuda"
    for a, b in zip(loaded.weights, model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_layer_backend_without_a_tf_op_is_a_clear_error():
    with pytest.raises(TcBackendError, match=r"'cpu' \(TcKernel\) or 'cuda' \(TcCudaKernel\), "
                                             r"not 'opencl'"):
        FusedMLP([4], backend="opencl")
