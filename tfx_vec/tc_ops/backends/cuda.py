"""CUDA backend: the GPU-mapped kernel printed as CUDA C, compiled with pycuda, launched on the TF
tensors' own device memory (DLPack, no host round trip).

pycuda is an optional extra (``tfx_vec[cuda]``) and is imported only when a kernel is launched:
where it or a CUDA driver is missing, :func:`cuda_runtime` raises a
:class:`~tfx_vec.tc_ops.errors.TcBackendError` that says so.  Generating CUDA source never needs
either (``tc.generate_source(..., backend="cuda")``), and :func:`nvcc_check` compiles generated
source for a GPU architecture with ``nvcc -c`` to prove it is valid CUDA on a machine with no GPU.

Example::

    from tfx_vec.tc_ops.backends.cuda import nvcc_check
    nvcc_check('extern "C" __global__ void k(float* a) { a[threadIdx.x] = 1; }')
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
import threading
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from ..codegen.cuda import CudaPrinter
from ..errors import TcBackendError, TcCompileError
from ..lang.types import np_dtype
from ..poly.kernel import build_kernel
from ..poly.mapping import map_to_gpu

__all__ = ["nvcc_path", "nvcc_check", "dlpack_data_pointer", "cuda_runtime", "CudaRuntime",
           "CudaBackend", "CudaKernel"]


def nvcc_path() -> str | None:
    """``nvcc`` on PATH (or /usr/local/cuda/bin), else None.

    Example:
        >>> p = nvcc_path()
        >>> p is None or p.endswith("nvcc")
        True
    """
    return shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def nvcc_check(source: str, arch: str = "sm_90") -> None:
    """Compile ``source`` with ``nvcc -arch=<arch> -c``; raise TcCompileError with nvcc's output.

    Raises TcBackendError when nvcc is not installed.

    Example::

        from tfx_vec import tc_ops as tc      # needs nvcc on PATH
        nvcc_check(tc.generate_source("def neg(float(N) A) -> (B) { B(i) = -A(i) }",
                                      "neg", [(64,)], backend="cuda"), arch="sm_90")
    """
    nvcc = nvcc_path()
    if nvcc is None:
        raise TcBackendError("nvcc_check: nvcc is not on PATH")
    with tempfile.TemporaryDirectory(prefix="tfx_vec_nvcc_") as d:
        src = os.path.join(d, "kernel.cu")
        with open(src, "w") as f:
            f.write(source)
        proc = subprocess.run([nvcc, f"-arch={arch}", "-c", src, "-o",
                               os.path.join(d, "kernel.o")], capture_output=True, text=True)
    if proc.returncode != 0:
        raise TcCompileError(f"nvcc -arch={arch} failed:\n{proc.stderr}{proc.stdout}\n"
                             f"--- source ---\n{source}")


# -- DLPack ---------------------------------------------------------------------------------
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_CPU, _DL_CUDA = 1, 2


def dlpack_data_pointer(tensor: Any) -> tuple[int, int]:
    """(address of the first element, DLPack device type) of a TF tensor, without copying.

    The tensor must stay alive while the address is used.  Device type 1 is host memory, 2 CUDA.

    Example:
        >>> import tensorflow as tf
        >>> address, device = dlpack_data_pointer(tf.constant([1.0, 2.0]))
        >>> address > 0, device            # 1: host memory
        (True, 1)
    """
    capsule = tf.experimental.dlpack.to_dlpack(tensor)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    # DLManagedTensor begins with its DLTensor.
    dl = _DLTensor.from_address(get(capsule, b"dltensor"))
    address = (dl.data or 0) + dl.byte_offset
    device = dl.device.device_type
    # The capsule keeps a reference to the tensor's buffer until deleted; the caller holds the
    # tensor itself, which is what keeps the memory valid.
    del capsule
    return address, device


# -- runtime --------------------------------------------------------------------------------
_runtime: "CudaRuntime | None" = None
_runtime_lock = threading.Lock()


def cuda_runtime() -> "CudaRuntime":
    """The process' CUDA runtime; TcBackendError when pycuda or a CUDA driver/GPU is missing.

    Example::

        print(cuda_runtime().name)    # needs pycuda and a GPU, e.g. NVIDIA H100 80GB HBM3
    """
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = CudaRuntime()
        return _runtime


class CudaRuntime:
    """pycuda on the device TF uses (its primary context), kernels compiled per source text.

    Example::

        from tfx_vec import tc_ops as tc      # needs pycuda and a GPU
        rt = cuda_runtime()
        src = tc.generate_source("def neg(float(N) A) -> (B) { B(i) = -A(i) }", "neg", [(64,)],
                                 backend="cuda")
        assert rt.module(src) is rt.module(src)    # compiled once per source text
    """

    def __init__(self) -> None:
        try:
            import pycuda.driver as drv
            from pycuda.compiler import SourceModule
        except ImportError as e:
            raise TcBackendError(
                "backend 'cuda' needs pycuda (pip install tfx_vec[cuda]), which needs a CUDA "
                f"driver; it is not importable here ({e}). Use backend='opencl' or 'cpu', or "
                "tc.generate_source(..., backend='cuda') to only generate the code.") from e
        try:
            drv.init()
            if drv.Device.count() == 0:
                raise TcBackendError("backend 'cuda': the CUDA driver sees no GPU")
            self.device = drv.Device(0)
            # Share TF's primary context so device pointers from DLPack are valid here.
            self.context = self.device.retain_primary_context()
        except drv.Error as e:
            raise TcBackendError(f"backend 'cuda': CUDA driver error: {e}") from e
        self.drv, self._SourceModule = drv, SourceModule
        self._modules: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return self.device.name()

    def module(self, source: str):
        mod = self._modules.get(source)
        if mod is None:
            self.context.push()
            try:
                mod = self._SourceModule(source, no_extern_c=True)
            except self.drv.CompileError as e:
                raise TcCompileError(f"CUDA compile failed:\n{e}") from e
            finally:
                self.context.pop()
            self._modules[source] = mod
        return mod

    def run(self, source: str, launches: Sequence[Any], inputs: Sequence[Any],
            outputs: Sequence[tuple[Sequence[int], Any]],
            temps: Sequence[tuple[Sequence[int], Any]] = ()) -> list:
        """Launch on TF GPU tensors; outputs and temporaries are TF tensors allocated on the GPU.

        ``launches`` are ``opencl.Launch``-like (kernel, global size, local size): the grid is
        global // local per dimension.
        """
        def fresh(shape, dtype) -> tf.Tensor:
            # A new zeroed buffer (tf.zeros may hand out a cached constant, which the kernel
            # must never write into).
            return tf.raw_ops.Empty(shape=tf.constant(list(shape), tf.int32),
                                    dtype=tf.as_dtype(np.dtype(dtype)), init=True)

        with tf.device("/GPU:0"):
            ins = [tf.identity(x) for x in inputs]
            outs = [fresh(s, d) for s, d in outputs]
            tmps = [fresh(s, d) for s, d in temps]
        # TF computes on its own streams: let the inputs be written before we read them.
        tf.test.experimental.sync_devices()
        ptrs = []
        for t in ins + outs + tmps:
            address, dev = dlpack_data_pointer(t)
            if dev != _DL_CUDA:
                raise TcBackendError(f"backend 'cuda': tensor is on DLPack device {dev}, not "
                                     "a GPU (is TensorFlow built with CUDA?)")
            ptrs.append(np.intp(address))
        mod = self.module(source)
        self.context.push()
        try:
            for ln in launches:
                grid = tuple(g // b for g, b in zip(ln.global_size, ln.local_size))
                block = tuple(ln.local_size) + (1,) * (3 - len(ln.local_size))
                grid = grid + (1,) * (3 - len(grid))
                mod.get_function(ln.kernel)(*ptrs, block=block, grid=grid[:3])
            self.context.synchronize()
        finally:
            self.context.pop()
        return outs


class CudaKernel:
    """A TC mapped and printed as CUDA.  ``source`` needs no GPU; ``run`` needs pycuda + a GPU.

    ``run(args)`` takes NumPy buffers in the ABI order (outputs written in place, through the
    GPU); :meth:`run_tensors` takes TF tensors already on the GPU and returns TF tensors, with no
    host round trip.

    Example:
        >>> from tfx_vec.tc_ops.backends import KernelSpec
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.pipeline import infer
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> cdef = check_program("def neg(float(N) A) -> (B) { B(i) = -A(i) }")["neg"]
        >>> opts = MappingOptions(tile=(16,), map_to_threads=(16,))
        >>> kernel = CudaBackend().compile(KernelSpec(cdef, infer(cdef, {"A": (64,)}), opts))
        >>> kernel.launches
        [Launch(kernel='tc_neg_k0', global_size=(64,), local_size=(16,))]
        >>> kernel.outputs
        [((64,), dtype('float32'))]
    """

    def __init__(self, spec: Any, mapping: Any, source: str):
        self.spec, self.mapping, self.source = spec, mapping, source
        self.launches = mapping.launches()
        cdef, shapes = spec.cdef, spec.ranges.shapes
        self.n_inputs = len(cdef.inputs)
        self.outputs = [(shapes[n], np_dtype(cdef.tensors[n].dtype)) for n in cdef.outputs]
        self.temps = [(shapes[n], np_dtype(cdef.tensors[n].dtype)) for n in cdef.temps]

    def run_tensors(self, inputs: Sequence[Any]) -> list:
        return cuda_runtime().run(self.source, self.launches, inputs, self.outputs, self.temps)

    def run(self, args: list) -> None:
        outs = self.run_tensors([np.reshape(a, (1,)) if np.ndim(a) == 0 else a
                                 for a in args[:self.n_inputs]])
        for dst, src in zip(args[self.n_inputs:], outs):
            dst[...] = src.numpy()


class CudaBackend:
    """``backend="cuda"``: generation needs nothing; running needs pycuda and a CUDA GPU.

    Example:
        >>> from tfx_vec.tc_ops.backends import KernelSpec
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.pipeline import infer
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> cdef = check_program("def neg(float(N) A) -> (B) { B(i) = -A(i) }")["neg"]
        >>> spec = KernelSpec(cdef, infer(cdef, {"A": (64,)}), MappingOptions())
        >>> kernel = CudaBackend().compile(spec)                  # no GPU needed to generate
        >>> 'extern "C" __global__ void tc_neg_k0(' in kernel.source
        True
    """

    name = "cuda"

    def compile(self, spec: Any) -> CudaKernel:
        mapping = map_to_gpu(build_kernel(spec.cdef, spec.ranges), spec.options)
        return CudaKernel(spec, mapping, CudaPrinter(mapping).source())

