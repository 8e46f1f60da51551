"""OpenCL backend: the GPU-mapped kernel printed as OpenCL C and run with pyopencl.

On the build and CI machines this runs on PoCL (``pocl-opencl-icd``), which executes work-groups,
``__local`` memory and barriers on the CPU, so the GPU mapping (blocks, threads, shared-memory
promotion, barriers) is executed and checked without a GPU.

The runtime is generic: a program is OpenCL source plus a list of launches
``(kernel name, global size, local size)`` run in order on the same buffers, inputs then outputs
then temporaries (scalars passed as one-element buffers, as in the C ABI).

Example::

    import numpy as np
    from tfx_vec.tc_ops.backends.opencl import OpenCLRuntime, Launch
    src = "__kernel void k(__global const float* a, __global float* b)"
          "{ int i = get_global_id(0); b[i] = 2 * a[i]; }"
    b = np.zeros(8, np.float32)
    OpenCLRuntime.get().run(src, [Launch("k", (8,), (4,))], [np.ones(8, np.float32)], [b])
"""
from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import os
import threading
import warnings
from typing import Any, Sequence

import numpy as np

from ..codegen.opencl import OpenCLPrinter
from ..errors import TcBackendError, TcCompileError
from ..lang.types import np_dtype
from ..poly.kernel import build_kernel
from ..poly.mapping import Launch, map_to_gpu

__all__ = ["Launch", "OpenCLRuntime", "OpenCLBackend", "OpenCLKernel", "available",
           "device_name"]


def _preload_icd_drivers() -> None:
    """dlopen the OpenCL drivers (PoCL) with RTLD_DEEPBIND before the ICD loader does.

    TensorFlow puts its own copy of LLVM in the global symbol scope; PoCL's libclang-cpp then
    binds its LLVM references to TF's (another LLVM version) and crashes while loading.  With
    DEEPBIND the driver and its dependencies resolve their own LLVM first; the ICD loader's later
    dlopen of the same library returns this handle.
    """
    for icd in glob.glob("/etc/OpenCL/vendors/*.icd"):
        try:
            with open(icd) as f:
                lib = f.read().strip()
            ctypes.CDLL(lib, mode=os.RTLD_NOW | os.RTLD_LOCAL | os.RTLD_DEEPBIND)
        except OSError:
            continue  # the ICD loader will report a broken driver itself


def _cl():
    _preload_icd_drivers()
    try:
        import pyopencl as cl
    except ImportError as e:
        raise TcBackendError("backend 'opencl' needs pyopencl (pip install tfx_vec[opencl]) "
                             f"and an OpenCL driver such as PoCL: {e}") from e
    return cl


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether an OpenCL device can be used here.

    Example:
        >>> isinstance(available(), bool)
        True
    """
    try:
        OpenCLRuntime.get()
        return True
    except TcBackendError:
        return False


def device_name() -> str:
    """The OpenCL device's name (part of cache keys).

    Example::

        print(device_name())    # needs an OpenCL platform; on PoCL, e.g. pthread-skylake-...
    """
    return OpenCLRuntime.get().device.name.strip()


class OpenCLRuntime:
    """A context and queue on the first OpenCL device (CPU devices included), and built programs.

    Example::

        import numpy as np
        src = ("__kernel void twice(__global const float* a, __global float* b)"
               "{ int i = get_global_id(0); b[i] = 2 * a[i]; }")
        b = np.zeros(8, np.float32)
        OpenCLRuntime.get().run(src, [Launch("twice", (8,), (4,))], [np.ones(8, np.float32)], [b])
        print(b[:3])            # [2. 2. 2.]
    """

    _instance: "OpenCLRuntime | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        cl = _cl()
        try:
            platforms = cl.get_platforms()
        except cl.Error as e:
            raise TcBackendError(f"backend 'opencl': no OpenCL platform ({e}); install "
                                 "pocl-opencl-icd (make system-deps)") from e
        devices = [d for p in platforms for d in p.get_devices()]
        if not devices:
            raise TcBackendError("backend 'opencl': no OpenCL device found")
        self.cl = cl
        # PoCL's notes on successful builds (a failed build raises with its log); a filter, not
        # catch_warnings, because the autotuner builds from several threads
        warnings.filterwarnings("ignore", category=cl.CompilerWarning)
        self.device = devices[0]
        self.context = cl.Context([self.device])
        self.queue = cl.CommandQueue(self.context,
                                     properties=cl.command_queue_properties.PROFILING_ENABLE)
        self._programs: dict[str, Any] = {}
        self._kernels: dict[tuple, Any] = {}
        self._build_lock = threading.Lock()

    @classmethod
    def get(cls) -> "OpenCLRuntime":
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    @property
    def max_work_group_size(self) -> int:
        return int(self.device.max_work_group_size)

    @property
    def local_mem_size(self) -> int:
        return int(self.device.local_mem_size)

    def build(self, source: str):
        """Build (cached per source text) and return the program; errors carry the build log."""
        key = hashlib.sha256(source.encode()).hexdigest()
        with self._build_lock:
            prog = self._programs.get(key)
        if prog is not None:
            return prog
        prog = self.cl.Program(self.context, source)
        try:
            prog.build(options=["-cl-std=CL1.2"])
        except self.cl.Error as e:
            try:
                log = prog.get_build_info(self.device, self.cl.program_build_info.LOG)
            except self.cl.Error:
                log = str(e)
            raise TcCompileError(f"OpenCL build failed:\n{log}\n--- source ---\n{source}") from e
        with self._build_lock:
            self._programs[key] = prog
        return prog

    def _kernel(self, prog: Any, name: str) -> Any:
        key = (id(prog), name)
        with self._build_lock:
            k = self._kernels.get(key)
            if k is None:
                k = self._kernels[key] = self.cl.Kernel(prog, name)
        return k

    def run(self, source: str, launches: Sequence[Launch], inputs: Sequence[np.ndarray],
            outputs: Sequence[np.ndarray], temps: Sequence[tuple[Sequence[int], Any]] = (),
            *, timed: bool = False) -> float | None:
        """Run ``launches`` in order, writing ``outputs`` (preallocated, C-contiguous) in place.

        Output buffers start as the arrays' contents (zeros from the caller: elements a TC leaves
        undefined read as 0, as on the CPU), temporaries as zeros.  With ``timed=True`` returns
        the device seconds of the launches (profiling events), transfers excluded.
        """
        cl = self.cl
        prog = self.build(source)
        mf = cl.mem_flags

        def buffer(a: np.ndarray, flags) -> Any:
            a = np.ascontiguousarray(a).reshape(-1)
            if a.nbytes == 0:
                return cl.Buffer(self.context, flags & ~mf.COPY_HOST_PTR, size=1)
            return cl.Buffer(self.context, flags, hostbuf=a)

        bufs = [buffer(np.asarray(x), mf.READ_ONLY | mf.COPY_HOST_PTR) for x in inputs]
        bufs += [buffer(o, mf.READ_WRITE | mf.COPY_HOST_PTR) for o in outputs]
        bufs += [buffer(np.zeros(tuple(s), np.dtype(d)), mf.READ_WRITE | mf.COPY_HOST_PTR)
                 for s, d in temps]
        events = []
        for ln in launches:
            kernel = self._kernel(prog, ln.kernel)
            try:
                events.append(kernel(self.queue, ln.global_size, ln.local_size, *bufs))
            except cl.Error as e:
                raise TcBackendError(f"OpenCL launch of {ln.kernel} {ln} failed: {e}") from e
        for o, b in zip(outputs, bufs[len(inputs):]):
            if o.nbytes:
                cl.enqueue_copy(self.queue, o, b)
        self.queue.finish()
        if not timed:
            return None
        return sum((ev.profile.end - ev.profile.start) * 1e-9 for ev in events)


class OpenCLKernel:
    """A compiled TC on OpenCL: ``source``, ``run(args)`` in the ABI order (outputs in place).

    Example::

        import numpy as np
        from tfx_vec import tc_ops as tc
        mod = tc.define("def neg(float(N) A) -> (B) { B(i) = -A(i) }", backend="opencl")
        kernel = mod.neg.compile(np.ones(8, np.float32))     # an OpenCLKernel
        b = np.zeros(8, np.float32)
        kernel.run([np.ones(8, np.float32), b])                # inputs, then outputs
        print(b[:2], "__kernel void tc_neg_k0(" in kernel.source)   # [-1. -1.] True
    """

    def __init__(self, spec: Any, mapping: Any, source: str):
        self.spec, self.mapping, self.source = spec, mapping, source
        self.launches = mapping.launches()
        cdef, shapes = spec.cdef, spec.ranges.shapes
        self.n_inputs = len(cdef.inputs)
        self.temps = [(shapes[n], np_dtype(cdef.tensors[n].dtype)) for n in cdef.temps]

    def run(self, args: list) -> None:
        OpenCLRuntime.get().run(self.source, self.launches, args[:self.n_inputs],
                                args[self.n_inputs:], self.temps)

    def run_timed(self, args: list) -> float:
        """Run and return the device time in seconds (for the autotuner)."""
        return OpenCLRuntime.get().run(self.source, self.launches, args[:self.n_inputs],
                                       args[self.n_inputs:], self.temps, timed=True)


class OpenCLBackend:
    """``backend="opencl"``: the GPU mapping printed as OpenCL C, run with pyopencl (PoCL here).

    Example::

        import numpy as np
        from tfx_vec import tc_ops as tc
        mod = tc.define("def neg(float(N) A) -> (B) { B(i) = -A(i) }", backend="opencl")
        print(mod.neg(np.ones(4, np.float32)).numpy())   # [-1. -1. -1. -1.], compiled by
                                                         # OpenCLBackend().compile(spec)
    """

    name = "opencl"

    def compile(self, spec: Any) -> OpenCLKernel:
        rt = OpenCLRuntime.get()
        budget = min(rt.local_mem_size, 48 * 1024)
        mapping = map_to_gpu(build_kernel(spec.cdef, spec.ranges), spec.options, budget)
        for gk in mapping.kernels:
            threads = 1
            for b in gk.block:
                threads *= b
            if threads > rt.max_work_group_size:
                raise TcBackendError(
                    f"{spec.cdef.name}: {gk.block} = {threads} threads per block exceed the "
                    f"OpenCL device's work-group limit {rt.max_work_group_size}")
        printer = OpenCLPrinter(mapping)
        if printer.uses_half() and "cl_khr_fp16" not in rt.device.extensions:
            raise TcBackendError(f"{spec.cdef.name}: half tensors need the cl_khr_fp16 extension, "
                                 f"which OpenCL device {rt.device.name.strip()!r} lacks")
        source = printer.source()
        rt.build(source)
        return OpenCLKernel(spec, mapping, source)

