"""CUDA backend pieces that need no GPU: nvcc checks, DLPack pointers, the missing-driver error."""
import ctypes
import re

import numpy as np
import pytest
import tensorflow as tf

from tests.support import random_array, require
from tfx_vec.tc_ops.backends import cuda
from tfx_vec.tc_ops.errors import TcBackendError, TcCompileError


def test_nvcc_accepts_valid_and_rejects_invalid_cuda():
    require(cuda.nvcc_path() is not None, "nvcc")
    cuda.nvcc_check('extern "C" __global__ void k(float* a) { a[threadIdx.x] = 1.0f; }')
    with pytest.raises(TcCompileError, match="nvcc -arch=sm_90 failed"):
        cuda.nvcc_check('extern "C" __global__ void k(float* a) { a[threadIdx.x] = undefined; }')


def test_dlpack_pointer_is_the_tensor_buffer():
    x = random_array(np.random.default_rng(0), (3, 5))
    t = tf.constant(x)
    address, device = cuda.dlpack_data_pointer(t)
    assert device == 1  # host memory on this machine
    view = np.ctypeslib.as_array((ctypes.c_float * x.size).from_address(address)).reshape(x.shape)
    np.testing.assert_array_equal(view, x)


def test_runtime_without_pycuda_or_driver_says_so():
    try:
        import pycuda.driver as drv  # noqa: F401
        drv.init()
        has_gpu = drv.Device.count() > 0
    except Exception:
        has_gpu = False
    if has_gpu:  # on a GPU machine the runtime must come up
        assert cuda.cuda_runtime().name
    else:
        with pytest.raises(TcBackendError, match="backend 'cuda'"):
            cuda.CudaRuntime()


def _corpus_cuda_sources(options):
    from tests.tc_ops.corpus import CASES
    from tfx_vec.tc_ops.api import define

    rng = np.random.default_rng(0)
    out = []
    for case in CASES:
        entry = define(case.source, backend="cuda")[case.entry]
        out.append(entry.compile(*case.inputs(rng), options=options).source)
    return out


def test_every_corpus_tc_compiles_with_nvcc_for_sm90():
    """One translation unit with every corpus TC under the default mapping and under a mapping
    with shared-memory promotion and unrolling: nvcc must accept all of it."""
    require(cuda.nvcc_path() is not None, "nvcc")
    from tfx_vec.tc_ops.options import MappingOptions

    promoted = MappingOptions(tile=(4, 4, 4), map_to_threads=(4, 2), map_to_blocks=(3, 2),
                              use_shared_memory=True, unroll=2)
    registers = MappingOptions(tile=(2, 2), map_to_threads=(1, 1), map_to_blocks=(4, 4),
                               use_private_memory=True)
    default = _corpus_cuda_sources(None)
    shared = [re.sub(r"_k(\d+)\(", r"_s\1(", s) for s in _corpus_cuda_sources(promoted)]
    tiled = [re.sub(r"_k(\d+)\(", r"_r\1(", s) for s in _corpus_cuda_sources(registers)]
    assert any("__shared__" in s for s in shared) and any("__syncthreads()" in s for s in shared)
    assert sum("register tile per thread" in s for s in tiled) >= 5
    cuda.nvcc_check("\n".join(default + shared + tiled))


def test_generate_source_for_cuda_needs_no_gpu():
    from tfx_vec.tc_ops.api import generate_source

    src = generate_source("def tmm(float(M,K) A, float(N,K) B) -> (C) "
                          "{ C(m,n) +=! A(m,kk) * B(n,kk) }", "tmm", [(64, 32), (48, 32)],
                          backend="cuda")
    assert 'extern "C" __global__ void tc_tmm_k0(' in src and "blockIdx.x" in src


def test_launch_glue_with_a_fake_pycuda(monkeypatch):
    """The CUDA launch path (DLPack pointers, grid/block, context, outputs) against a recording
    stand-in for pycuda: what the test machines can check without a GPU."""
    import sys
    import types

    from tfx_vec import tc_ops as tc
    from tfx_vec.tc_ops.options import MappingOptions

    calls, pointers = [], {}

    class Fn:
        def __init__(self, name):
            self.name = name

        def __call__(self, *args, block, grid):
            calls.append((self.name, [int(a) for a in args], block, grid))

    class Module:
        def __init__(self, source, no_extern_c):
            assert no_extern_c and 'extern "C" __global__' in source

        def get_function(self, name):
            return Fn(name)

    class Context:
        def push(self):
            calls.append("push")

        def pop(self):
            calls.append("pop")

        def synchronize(self):
            calls.append("sync")

    class Device:
        count = staticmethod(lambda: 1)

        def __init__(self, i):
            pass

        def retain_primary_context(self):
            return Context()

        def name(self):
            return "fake GPU"

    drv = types.SimpleNamespace(init=lambda: None, Device=Device, Error=RuntimeError,
                                CompileError=RuntimeError)
    pkg = types.ModuleType("pycuda")
    pkg.driver = drv
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", drv)
    monkeypatch.setitem(sys.modules, "pycuda.compiler", types.SimpleNamespace(SourceModule=Module))
    monkeypatch.setattr(cuda, "_runtime", None)
    real = cuda.dlpack_data_pointer

    def on_gpu(t):
        address, _ = real(t)
        pointers[address] = t
        return address, 2
    monkeypatch.setattr(cuda, "dlpack_data_pointer", on_gpu)

    tmm = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"
    kernel = tc.define(tmm, backend="cuda").tmm.compile(
        np.ones((40, 3), np.float32), np.ones((50, 3), np.float32),
        options=MappingOptions(tile=(16, 16), map_to_threads=(8, 4), map_to_blocks=(3, 2)))
    outs = kernel.run_tensors([tf.ones([40, 3]), tf.ones([50, 3])])
    (name, args, block, grid), = [c for c in calls if isinstance(c, tuple)]
    assert name == "tc_tmm_k0" and block == (8, 4, 1) and grid == (3, 2, 1)
    assert len(args) == 3 and outs[0].shape == (40, 50)
    assert pointers[args[2]] is outs[0]        # the kernel writes the returned TF tensor
    assert [c for c in calls if not isinstance(c, tuple)] == ["push", "pop", "push", "sync",
                                                             "pop"]
    assert cuda.cuda_runtime().name == "fake GPU"
