"""CUDA backend pieces that need no GPU: nvcc checks, DLPack pointers, the missing-driver error."""
import ctypes

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
