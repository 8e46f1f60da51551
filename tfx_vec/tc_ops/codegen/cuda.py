"""CUDA printer: the same mapped isl AST as ``codegen/opencl.py``, in the CUDA dialect.

Only attributes differ (``extern "C" __global__``, ``__shared__``, ``__syncthreads()``,
``blockIdx``/``threadIdx``, ``#pragma unroll``, ``__restrict__``, ``__half``): a dialect is
a set of spellings, not a second printer.

Example:
    >>> from tfx_vec.tc_ops.lang import parse
    >>> from tfx_vec.tc_ops.lang.sema import check
    >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
    >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
    >>> from tfx_vec.tc_ops.poly.mapping import map_to_gpu
    >>> from tfx_vec.tc_ops.options import MappingOptions
    >>> d = check(parse("def scale(float(N) A) -> (B) { B(i) = 2 * A(i) }").defs[0])
    >>> k = build_kernel(d, infer_ranges(d, {"A": (64,)}))
    >>> src = CudaPrinter(map_to_gpu(k, MappingOptions(tile=(16,), map_to_threads=(16,)))).source()
    >>> 'extern "C" __global__ void tc_scale_k0(' in src and "threadIdx.x" in src
    True
"""
from __future__ import annotations

from .opencl import GpuPrinter

__all__ = ["CudaPrinter"]

class CudaPrinter(GpuPrinter):
    """CUDA C++ for nvcc (pycuda's SourceModule with ``no_extern_c``; NVRTC lacks the C
    headers the prelude includes).

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
        >>> from tfx_vec.tc_ops.poly.mapping import map_to_gpu
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> d = check_program("def neg(float(N) A) -> (B) { B(i) = -A(i) }")["neg"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (64,)}))
        >>> m = map_to_gpu(k, MappingOptions(tile=(16,), map_to_threads=(16,)))
        >>> "__global__" in CudaPrinter(m).source()
        True
    """

    kernel_prefix = 'extern "C" __global__'
    global_space = ""
    shared_space = "__shared__ "
    barrier = "__syncthreads();"
    block_id = "(int)blockIdx.{axis}"
    thread_id = "(int)threadIdx.{axis}"
    restrict = "__restrict__"
    pragma_unroll = "#pragma unroll {n}"
    half_type = "__half"
    dialect_prelude = """#include <cuda_fp16.h>
#include <stdint.h>
#include <math.h>
"""

    def access(self, name: str, subs, call) -> str:
        """Reads of ``half`` tensors are widened to float: CUDA's ``__half`` operators are
        ambiguous with int/float operands, and TC computes in the promoted type anyway."""
        text = super().access(name, subs, call)
        if call is not None and self.cdef.tensors[name].dtype == "half":
            return f"((float){text})"
        return text
