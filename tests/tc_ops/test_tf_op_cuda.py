"""The GPU op of tf_op (``TcCudaKernel``), proven as far as a machine without a GPU can:
the op library compiles warning-free and loads, its kernel is registered for GPU only, the PTX
it would launch assembles for sm_90 and fits the launch, the launch attributes are the
mapping's, the launcher's driver calls (against a recording fake libcuda) are the right ones in
the right order, graphs (and their gradients, and SavedModels) build with it, and asking to run
it without a GPU is a clear error.  On a machine with a GPU the op also runs against NumPy."""
import os
import pathlib
import re
import subprocess
from dataclasses import replace as dataclasses_replace

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels as tf_kernels

from tests.support import random_array, require, require_tool, square_loss_and_grad
from tests.tc_ops.corpus import CASES
from tfx_vec.tc_ops import native, op_builder, tf_op
from tfx_vec.tc_ops.api import define
from tfx_vec.tc_ops.backends.cuda import nvcc_path
from tfx_vec.tc_ops.errors import TcBackendError, TcCompileError
from tfx_vec.tc_ops.lang.types import from_np_dtype

HAS_GPU = bool(tf.config.list_physical_devices("GPU"))
CASE = {c.name: c for c in CASES}
TMM = CASE["tmm"].source


def _require_cuda_toolkit() -> None:
    require(nvcc_path() is not None and tf_op.cuda_include_dir() is not None,
            "nvcc and CUDA's cuda.h (a CUDA toolkit)")


def _registered_devices(op: str) -> list[str]:
    return sorted(k.device_type for k in tf_kernels.get_registered_kernels_for_op(op).kernel)


def test_gpu_op_library_compiles_without_warnings_and_loads():
    _require_cuda_toolkit()
    readelf = require_tool("readelf")
    lib = tf_op.load_cuda_op_library()          # compiled and linked here when not cached
    assert callable(lib.tc_cuda_kernel)
    assert _registered_devices("TcCudaKernel") == ["GPU"]
    tf_op.load_op_library()
    assert _registered_devices("TcKernel") == ["CPU"]

    # Built with -Wall -Wextra: the library's own code (not TF's headers) is warning-free.
    so = tf_op.cuda_op_library_path()
    with open(so + ".log") as log:
        ours = [ln for ln in log.read().splitlines()
                if re.search(r"(tc_cuda_kernel_op\.cc|tc_cuda_launch\.h|tc_op_common\.h):\d+:\d+: "
                         r"warning", ln)]
    assert not ours, "\n".join(ours)
    # No link-time dependency on the driver: it is dlopen'ed when a GPU kernel is built.
    needed = subprocess.run([readelf, "-d", so], capture_output=True, text=True).stdout
    assert "libtensorflow_framework" in needed and "libcuda" not in needed


def test_cpu_op_still_right_with_the_gpu_library_loaded():
    _require_cuda_toolkit()
    tf_op.load_cuda_op_library()
    case = CASE["fcrelu"]
    rng = np.random.default_rng(11)
    inputs = case.inputs(rng)
    f = tf_op.tc_function(case.source, case.entry)          # backend="cpu": TcKernel
    (ref,) = case.reference(*inputs)
    np.testing.assert_allclose(f(*inputs).numpy(), ref, rtol=case.rtol, atol=case.atol)
    graph_f = tf.function(lambda *xs: f(*xs))
    np.testing.assert_allclose(graph_f(*inputs).numpy(), ref, rtol=case.rtol, atol=case.atol)


def _pad3(t) -> tuple:
    t = tuple(int(x) for x in t)
    return t + (1,) * (3 - len(t))


@pytest.mark.parametrize("name", ["tmm", "softmax", "fcrelu", "MLP3", "layernorm", "gather"])
def test_ptx_assembles_for_sm90_and_launch_attributes_are_the_mappings(name, tmp_path):
    """matmul, reductions (softmax: max and sum), a fused MLP layer, three fused layers (one
    kernel per layer), a TC with a temporary and a gather (int32 ids, clamped in the op)."""
    _require_cuda_toolkit()
    ptxas = require_tool("ptxas")
    case = CASE[name]
    inputs = case.inputs(np.random.default_rng(3))
    f = tf_op.TcFunction(case.source, case.entry, backward=None, backend="cuda")
    spec = f.cuda_spec(*inputs)

    # The launch attributes are the GPU mapping's, computed here independently of tf_op.
    kernel = define(case.source, backend="cuda")[case.entry].compile(*inputs)
    mapping, cdef = kernel.mapping, kernel.spec.cdef
    # (the same source, but for the op's clamping of data-dependent subscripts)
    assert re.sub(r"tc_clamp\((.*?), 0, \d+\)", r"\1", spec.source) == kernel.source
    assert spec.kernels == tuple(gk.name for gk in mapping.kernels)
    assert spec.grid == tuple(_pad3(gk.grid) for gk in mapping.kernels)
    assert spec.block == tuple(_pad3(gk.block) for gk in mapping.kernels)
    shapes = kernel.spec.ranges.shapes
    assert spec.temp_bytes == tuple(4 * int(np.prod(shapes[t])) for t in cdef.temps)
    refs = case.reference(*inputs)
    assert spec.output_shapes == tuple(np.shape(r) for r in refs)
    assert spec.output_dtypes == tuple(from_np_dtype(np.asarray(r).dtype) for r in refs)
    if name == "layernorm":
        assert spec.temp_bytes and all(b > 0 for b in spec.temp_bytes)
    if name == "gather":  # ids are unknown when the graph is built: reads are clamped
        assert "tc_clamp(I[" in spec.source

    # The PTX defines those kernels, each taking one pointer per input, output and temporary
    # (the order the op passes them in).
    n_args = len(cdef.inputs) + len(cdef.outputs) + len(cdef.temps)
    entries = re.findall(r"\.entry (\w+)\(([^)]*)\)", spec.module)
    assert tuple(e for e, _ in entries) == spec.kernels
    for _, params in entries:
        assert len(re.findall(r"\.param \.u64 ", params)) == n_args

    # It assembles for an H100 and each kernel fits its launch: registers for the block, and
    # static shared memory within 48 KiB (the op launches with no dynamic shared memory).
    ptx = tmp_path / "k.ptx"
    ptx.write_text(spec.module)
    proc = subprocess.run([ptxas, "-arch=sm_90", "-v", str(ptx), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    parts = re.split(r"Compiling entry function '(\w+)'", proc.stderr)[1:]
    infos = dict(zip(parts[0::2], parts[1::2]))
    assert sorted(infos) == sorted(spec.kernels)
    for name, block in zip(spec.kernels, spec.block):
        regs = int(re.search(r"Used (\d+) registers", infos[name]).group(1))
        smem = re.search(r"(\d+) bytes smem", infos[name])
        assert regs * np.prod(block) <= 65536
        assert smem is None or int(smem.group(1)) <= 48 * 1024


def test_shared_memory_mapping_fits_the_launch(tmp_path):
    """With shared-memory promotion the kernels declare __shared__ tiles; they still assemble."""
    _require_cuda_toolkit()
    ptxas = require_tool("ptxas")
    from tfx_vec.tc_ops.options import MappingOptions

    options = MappingOptions(tile=(8, 8, 8), map_to_threads=(8, 4), map_to_blocks=(4, 4),
                             use_shared_memory=True, unroll=2)
    case = CASE["tmm"]
    inputs = case.inputs(np.random.default_rng(5))
    spec = tf_op.TcFunction(TMM, "tmm", backward=None, backend="cuda",
                            options=options).cuda_spec(*inputs)
    assert "__shared__" in spec.source and ".shared" in spec.module
    assert spec.block == ((8, 4, 1),) * len(spec.kernels)
    ptx = tmp_path / "k.ptx"
    ptx.write_text(spec.module)
    proc = subprocess.run([ptxas, "-arch=sm_90", str(ptx), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# -- the launcher against a recording fake driver ------------------------------------------
FAKE = pathlib.Path(__file__).with_name("cuda_fake")


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    """(harness, fake libcuda, fake libcuda without cuLaunchKernel): the launcher of
    ``tf_op/tc_cuda_launch.h`` built into a program, and two stand-ins for the driver."""
    _require_cuda_toolkit()
    gcc, gxx = require_tool("gcc"), require_tool("g++")
    out = tmp_path_factory.mktemp("cuda_fake")
    inc = tf_op.cuda_include_dir()
    libs = []
    for name, extra in [("libfake.so", []), ("libold.so", ["-DOMIT_LAUNCH"])]:
        subprocess.run([gcc, "-shared", "-fPIC", f"-I{inc}", *extra, str(FAKE / "fake_libcuda.c"),
                        "-o", str(out / name)], check=True)
        libs.append(str(out / name))
    tf_dir = os.path.dirname(tf.__file__)
    cmd = [gxx, "-O1", *tf.sysconfig.get_compile_flags(), f"-I{inc}",
           f"-I{os.path.dirname(tf_op._CUDA_OP_SOURCE)}", str(FAKE / "launch_harness.cc"),
           "-o", str(out / "harness"), *tf.sysconfig.get_link_flags(), f"-Wl,-rpath,{tf_dir}",
           "-ldl"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return str(out / "harness"), libs[0], libs[1]


def _launch(fake_driver, spec, args, zeroed, *, driver=1, fail=None, kernels=None, tmp=None):
    """Run the launcher twice on ``spec`` with fake pointers; the driver's call log lines."""
    harness = fake_driver[0]
    module = tmp / "module.ptx"
    module.write_text(spec.module)
    tokens = [f"k:{k}:{':'.join(map(str, g))}:{':'.join(map(str, b))}"
              for k, g, b in zip(kernels or spec.kernels, spec.grid, spec.block)]
    tokens += [f"a:{a}" for a in args] + [f"z:{p}:{n}" for p, n in zeroed]
    tokens += [f"t:{n}" for n in spec.temp_bytes]
    env = dict(os.environ, FAKE_CUDA_FAIL=fail or "")
    proc = subprocess.run([harness, fake_driver[driver], str(module), spec.entry, *tokens],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def _layernorm_spec():
    case = CASE["layernorm"]
    f = tf_op.TcFunction(case.source, case.entry, backward=None, backend="cuda")
    return case, f.cuda_spec(*case.inputs(np.random.default_rng(9)))


def test_launcher_makes_the_right_driver_calls(fake_driver, tmp_path):
    """On TF's stream (0x5000) in its context: the module loaded once, outputs and temporaries
    zero-filled, every kernel launched in order with the mapping's grid/block and the pointers
    of inputs, outputs, temporaries; the context popped after each run."""
    case, spec = _layernorm_spec()
    n_in, n_out = len(case.inputs(np.random.default_rng(9))), len(spec.output_shapes)
    args = [1000 + i for i in range(n_in)] + [2000 + i for i in range(n_out)]
    args += [3000 + i for i in range(len(spec.temp_bytes))]
    sizes = [4 * int(np.prod(s)) for s in spec.output_shapes] + list(spec.temp_bytes)
    zeroed = list(zip(args[n_in:], sizes))
    log = _launch(fake_driver, spec, args, zeroed, tmp=tmp_path)
    assert log[0] == "check: OK"
    per_run = (["ctx_of 0x5000", "push 0xc0"]
               + [f"memset {p} value=0 bytes={n} stream=0x5000" for p, n in zeroed]
               + [f"launch {k} grid={','.join(map(str, g))} block={','.join(map(str, b))} "
                  f"smem=0 stream=0x5000 extra=(nil) args={','.join(map(str, args))}"
                  for k, g, b in zip(spec.kernels, spec.grid, spec.block)]
               + ["pop"])
    first = per_run[:2] + ["load_module"] + per_run[2:]
    assert log[1:] == first + ["run 0: OK"] + per_run + ["run 1: OK"]
    assert len(spec.kernels) >= 2 and spec.temp_bytes   # several launches, a temporary


def test_launcher_reports_driver_errors(fake_driver, tmp_path):
    _, spec = _layernorm_spec()
    args, zeroed = [1, 2, 3, 4, 5, 6], []
    log = _launch(fake_driver, spec, args, zeroed, fail="cuModuleLoadDataEx", tmp=tmp_path)
    text = "\n".join(log)
    assert "run 0: INTERNAL: TcCudaKernel tc_layernorm: cuModuleLoadData failed: " \
           "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" in text
    assert "ptxas fatal: fake JIT log" in text            # the JIT's own log is in the message
    assert log.count("push 0xc0") == log.count("pop") == 2
    log = _launch(fake_driver, spec, args, zeroed, fail="cuLaunchKernel", tmp=tmp_path)
    assert (f"run 0: INTERNAL: TcCudaKernel tc_layernorm: launching {spec.kernels[0]} failed: "
            "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (701): fake driver") in log
    assert log.count("push 0xc0") == log.count("pop") == 2
    log = _launch(fake_driver, spec, args, zeroed, tmp=tmp_path,
                  kernels=("tc_nope",) + spec.kernels[1:])
    assert "unload_module" in log
    assert any("cuModuleGetFunction(tc_nope) failed: CUDA_ERROR_NOT_FOUND" in ln for ln in log)
    assert _launch(fake_driver, spec, args, zeroed, driver=2, tmp=tmp_path) == [
        "driver: the CUDA driver lacks cuLaunchKernel (too old?)"]


def test_launch_attributes_are_checked(fake_driver, tmp_path):
    _, spec = _layernorm_spec()
    wide = dataclasses_replace(spec, block=((32, 64, 1),) + spec.block[1:])
    log = _launch(fake_driver, wide, [], [], tmp=tmp_path)
    assert log == [f"check: INVALID_ARGUMENT: TcCudaKernel tc_layernorm: kernel {spec.kernels[0]} "
                   "has 2048 threads per block (CUDA allows 1024)"]
    empty = dataclasses_replace(spec, grid=((0, 1, 1),) + spec.grid[1:])
    assert "has a bad grid or block size" in _launch(fake_driver, empty, [], [], tmp=tmp_path)[0]


def test_graph_with_the_gpu_op_and_its_gradient(monkeypatch):
    """A tf.function with the op and its gradient traces to TcCudaKernel nodes carrying the TC
    (no PTX), with static output shapes, whose builder answers with the launches of the
    mapping; the backward TC is a GPU op too."""
    _require_cuda_toolkit()
    monkeypatch.setattr(tf_op, "require_gpu", lambda: None)  # build the graph, never run it
    f = tf_op.tc_function(TMM, "tmm", backend="cuda")

    concrete = square_loss_and_grad(f).get_concrete_function(tf.TensorSpec([40, 24]),
                                                             tf.TensorSpec([50, 24]))
    C, dA = concrete.structured_outputs
    assert C.shape == (40, 50) and dA.shape == (40, 24)
    ops = [op for op in concrete.graph.get_operations() if op.type == "TcCudaKernel"]
    assert len(ops) == 2, [op.type for op in concrete.graph.get_operations()]
    forward = f.cuda_spec(tf.ones([40, 24]), tf.ones([50, 24]))
    fwd = next(op for op in ops if not op.get_attr("derivative"))
    assert fwd.get_attr("tc").decode() == TMM and "module" not in fwd.node_def.attr
    launches = op_builder.build(op_builder.request_for(fwd.node_def, [(40, 24), (50, 24)]))
    assert launches == forward and ".entry tc_tmm" in launches.module
    bwd = next(op for op in ops if op is not fwd)      # the backward TC, derived per shape
    assert bwd.get_attr("tc").decode() == TMM and bwd.get_attr("derivative") == b'["A", "B"]'
    A, B = tf.ones([40, 24]), tf.ones([50, 24])
    assert op_builder.build(op_builder.request_for(bwd.node_def, [(40, 24), (50, 24), (40, 50)])
                            ) == f.backward_at(A, B).cuda_spec(A, B, tf.ones([40, 50]))


def test_savedmodel_with_the_gpu_op_reloads_with_its_attributes(tmp_path, monkeypatch):
    """The op's attributes (its TC) survive a SavedModel round trip: the reloaded function holds
    the same TcCudaKernel node (with the library loaded first), which makes the same launches."""
    _require_cuda_toolkit()
    monkeypatch.setattr(tf_op, "require_gpu", lambda: None)  # build the graph, never run it
    f = tf_op.tc_function(TMM, "tmm", backend="cuda")

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([4, 3]), tf.TensorSpec([5, 3])],
                     autograph=False)
        def tmm(self, a, b):
            return f(a, b)

    tf.saved_model.save(M(), str(tmp_path / "m"))
    loaded = tf_op.load_saved_model(str(tmp_path / "m"))
    graph = loaded.tmm.get_concrete_function().graph.as_graph_def()
    nodes = [n for fd in graph.library.function for n in fd.node_def if n.op == "TcCudaKernel"]
    assert len(nodes) == 1
    spec = f.cuda_spec(tf.ones([4, 3]), tf.ones([5, 3]))
    assert op_builder.build(op_builder.request_for(nodes[0], [(4, 3), (5, 3)])) == spec


def test_asking_for_the_cuda_op_without_a_gpu_is_a_clear_error():
    rng = np.random.default_rng(8)
    A, B = random_array(rng, (33, 7)), random_array(rng, (21, 7))
    f = tf_op.tc_function(TMM, "tmm", backend="cuda")
    if HAS_GPU:  # on a GPU machine the op must run, forward and backward, on the GPU
        _require_cuda_toolkit()
        At = tf.constant(A)
        with tf.GradientTape() as tape:
            tape.watch(At)
            C = f(At, B)
            loss = tf.reduce_sum(C * C)
        dA = tape.gradient(loss, At)
        assert "GPU" in C.device
        np.testing.assert_allclose(C.numpy(), A @ B.T, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(dA.numpy(), 2 * (A @ B.T) @ B, rtol=1e-4, atol=1e-3)
        return
    with pytest.raises(TcBackendError, match=r"backend 'cuda': TensorFlow sees no GPU here .*"
                                             r"TcCudaKernel op runs only on a GPU"):
        f(A, B)
    with pytest.raises(TcBackendError, match="sees no GPU"):
        tf.function(lambda a, b: f(a, b), autograph=False)(A, B)


def test_the_op_never_falls_back_to_the_cpu():
    """Asked to run on the CPU (no soft placement), the op is an error naming it: there is no
    CPU kernel, and nothing silently executes it elsewhere."""
    _require_cuda_toolkit()
    lib = tf_op.load_cuda_op_library()
    soft = tf.config.get_soft_device_placement()
    tf.config.set_soft_device_placement(False)
    try:
        with tf.device("/CPU:0"), pytest.raises(
                (tf.errors.NotFoundError, tf.errors.InvalidArgumentError), match="TcCudaKernel"):
            lib.tc_cuda_kernel(inputs=[tf.ones([4, 3]), tf.ones([5, 3])], Tout=[tf.float32],
                               input_shapes=[(4, 3), (5, 3)], output_shapes=[(4, 5)],
                               tc=TMM, entry="tmm", options="")
    finally:
        tf.config.set_soft_device_placement(soft)


def test_bad_backend_and_missing_toolkit_errors(monkeypatch):
    with pytest.raises(TcBackendError, match="'cpu' \\(TcKernel\\) or 'cuda'"):
        tf_op.TcFunction(TMM, "tmm", backend="opencl")
    monkeypatch.setattr(tf_op, "_cuda_library", None)
    monkeypatch.setattr(tf_op, "cuda_include_dir", lambda: None)
    with pytest.raises(tf_op.OpLibraryError, match="needs cuda.h"):
        tf_op.load_cuda_op_library()


def test_ptx_is_cached_and_nvcc_errors_are_compile_errors(monkeypatch, tmp_path):
    _require_cuda_toolkit()
    monkeypatch.setenv("TFX_VEC_CACHE_DIR", str(tmp_path))
    src = 'extern "C" __global__ void k(float* a) { a[threadIdx.x] = 2.0f; }'
    ptx = tf_op.cuda_ptx(src)
    assert ".entry k(" in ptx and ".target sm_75" in ptx

    def no_nvcc(*a, **k):
        raise AssertionError("nvcc ran on a cache hit")
    monkeypatch.setattr(native, "run_tool", no_nvcc)
    assert tf_op.cuda_ptx(src) == ptx
    monkeypatch.undo()
    with pytest.raises(TcCompileError, match="nvcc --ptx -arch=compute_75 failed"):
        tf_op.cuda_ptx('extern "C" __global__ void k(float* a) { a[0] = undefined_name; }')
