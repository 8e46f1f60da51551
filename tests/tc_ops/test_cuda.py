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
    default = _corpus_cuda_sources(None)
    shared = [re.sub(r"_k(\d+)\(", r"_s\1(", s) for s in _corpus_cuda_sources(promoted)]
    assert any("__shared__" in s for s in shared) and any("__syncthreads()" in s for s in shared)
    cuda.nvcc_check("\n".join(default + shared))


def test_generate_source_for_cuda_needs_no_gpu():
    from tfx_vec.tc_ops.api import generate_source

    src = generate_source("def tmm(float(M,K) A, float(N,K) B) -> (C) "
                          "{ C(m,n) +=! A(m,kk) * B(n,kk) }", "tmm", [(64, 32), (48, 32)],
                          backend="cuda")
    assert 'extern "C" __global__ void tc_tmm_k0(' in src and "blockIdx.x" in src
