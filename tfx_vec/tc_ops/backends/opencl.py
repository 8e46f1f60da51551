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
    (b,) = OpenCLRuntime.get().run(src, [Launch("k", (8,), (4,))], [np.ones(8, np.float32)],
                                   [((8,), np.float32)])
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import threading
import time
from typing import Any, Sequence

import numpy as np

from ..errors import TcBackendError, TcCompileError

__all__ = ["Launch", "OpenCLRuntime", "available", "device_name", "launches_for"]


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch: global and local work sizes (x fastest), as OpenCL takes them."""

    kernel: str
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]


def launches_for(mapping) -> list[Launch]:
    """The launches of a :class:`~..poly.mapping.GpuMapping`, grid and block padded to one rank."""
    out = []
    for gk in mapping.kernels:
        n = max(len(gk.grid), len(gk.block))
        grid = tuple(gk.grid) + (1,) * (n - len(gk.grid))
        block = tuple(gk.block) + (1,) * (n - len(gk.block))
        out.append(Launch(gk.name, tuple(g * b for g, b in zip(grid, block)), block))
    return out


def _preload_icd_drivers() -> None:
    """dlopen the OpenCL drivers (PoCL) with RTLD_DEEPBIND before the ICD loader does.

    TensorFlow puts its own copy of LLVM in the global symbol scope; PoCL's libclang-cpp then
    binds its LLVM references to TF's (another LLVM version) and crashes while loading.  With
    DEEPBIND the driver and its dependencies resolve their own LLVM first; the ICD loader's later
    dlopen of the same library returns this handle.
    """
    import ctypes
    import glob
    import os

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
    """Whether an OpenCL device can be used here."""
    try:
        OpenCLRuntime.get()
        return True
    except TcBackendError:
        return False


def device_name() -> str:
    """The OpenCL device's name (part of cache keys)."""
    return OpenCLRuntime.get().device.name.strip()


class OpenCLRuntime:
    """A context and queue on the first OpenCL device (CPU devices included), and built programs."""

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
        self.device = devices[0]
        self.context = cl.Context([self.device])
        self.queue = cl.CommandQueue(self.context,
                                     properties=cl.command_queue_properties.PROFILING_ENABLE)
        self._programs: dict[str, Any] = {}
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
        try:
            prog = self.cl.Program(self.context, source).build(options=["-cl-std=CL1.2"])
        except self.cl.Error as e:
            raise TcCompileError(f"OpenCL build failed:\n{e}\n--- source ---\n{source}") from e
        with self._build_lock:
            self._programs[key] = prog
        return prog

    def run(self, source: str, launches: Sequence[Launch], inputs: Sequence[np.ndarray],
            outputs: Sequence[tuple[Sequence[int], Any]],
            temps: Sequence[tuple[Sequence[int], Any]] = (), *, timed: bool = False):
        """Run ``launches`` in order; returns the outputs as NumPy arrays.

        With ``timed=True`` returns ``(outputs, seconds)`` where seconds is the device time of
        the launches (profiling events), not counting transfers.
        """
        cl = self.cl
        prog = self.build(source)
        mf = cl.mem_flags
        bufs = [cl.Buffer(self.context, mf.READ_ONLY | mf.COPY_HOST_PTR,
                          hostbuf=np.ascontiguousarray(np.asarray(x).reshape(-1)
                                                       if np.asarray(x).ndim == 0
                                                       else np.asarray(x)))
                for x in inputs]
        out_arrays = [np.empty(tuple(s), np.dtype(d)) for s, d in outputs]
        for a in out_arrays + [np.empty(tuple(s), np.dtype(d)) for s, d in temps]:
            bufs.append(cl.Buffer(self.context, mf.READ_WRITE, size=max(a.nbytes, 1)))
        events = []
        for ln in launches:
            kernel = getattr(prog, ln.kernel)
            try:
                events.append(kernel(self.queue, ln.global_size, ln.local_size, *bufs))
            except cl.Error as e:
                raise TcBackendError(f"OpenCL launch of {ln.kernel} {ln} failed: {e}") from e
        for a, b in zip(out_arrays, bufs[len(inputs):]):
            cl.enqueue_copy(self.queue, a, b)
        self.queue.finish()
        if not timed:
            return out_arrays
        seconds = sum((ev.profile.end - ev.profile.start) * 1e-9 for ev in events)
        return out_arrays, seconds
