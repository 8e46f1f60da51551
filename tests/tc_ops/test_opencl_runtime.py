"""The OpenCL runtime on PoCL: local memory, barriers, several launches, errors."""
import numpy as np
import pytest

from tests.support import random_array, require
from tfx_vec.tc_ops.backends import opencl
from tfx_vec.tc_ops.errors import TcCompileError

# Reverse each block of 16 through local memory: wrong without the barrier.
REVERSE = """
__kernel void rev(__global const float* a, __global float* b, __global float* t) {
  __local float tile[16];
  int l = get_local_id(0), g = get_group_id(0);
  tile[l] = a[g * 16 + l];
  barrier(CLK_LOCAL_MEM_FENCE);
  t[g * 16 + l] = tile[15 - l];
}
__kernel void twice(__global const float* a, __global float* b, __global float* t) {
  int i = get_global_id(0);
  b[i] = 2.0f * t[i];
}
"""


@pytest.fixture(scope="module")
def runtime():
    require(opencl.available(), "an OpenCL platform (pocl-opencl-icd)")
    return opencl.OpenCLRuntime.get()


def test_local_memory_barrier_and_two_launches(runtime):
    a = random_array(np.random.default_rng(0), (64,))
    launches = [opencl.Launch("rev", (64,), (16,)), opencl.Launch("twice", (64,), (16,))]
    b = np.zeros(64, np.float32)
    seconds = runtime.run(REVERSE, launches, [a], [b], temps=[((64,), np.float32)], timed=True)
    np.testing.assert_array_equal(b, 2 * a.reshape(4, 16)[:, ::-1].reshape(-1))
    assert seconds > 0


def test_build_error_carries_the_log(runtime):
    with pytest.raises(TcCompileError, match="OpenCL build failed"):
        runtime.build("__kernel void k(__global float* a) { a[0] = nope; }")
