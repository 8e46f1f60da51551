"""The CPU backend: C/OpenMP from the isl schedule, built by the system C compiler, run by ctypes.

Kernel ABI (also what the TF op of ``tf_op.py`` calls)::

    void tc_<entry>(void* const* args);

``args`` holds one pointer per TC parameter in signature order (a scalar argument is a pointer to
one element of its type), then one per output in the ``-> (...)`` order.  Tensors are dense,
C-contiguous, of the declared element type.  Every size is a compile-time constant (one shared
object per input-shape signature), temporaries are allocated and freed inside the call, and the
kernel writes every element of every output that the TC defines (the caller zero-fills outputs,
so elements a TC leaves undefined read as 0).

Pipeline: ``PolyKernel`` -> isl scheduler (or the identity schedule for ``MappingOptions.naive()``)
-> ``annotate_cpu`` (tile the outermost band, mark the OpenMP loop and simd loops) -> ``CPrinter``
-> ``cc -O3 -march=native -fopenmp -shared -fPIC`` -> a ``.so`` cached by source hash in
``$TFX_VEC_TC_CACHE_DIR`` (default ``~/.cache/tfx_vec/tc_cpu``) -> ``ctypes``.

Reductions are race free: a reduction loop is never coincident, so it never gets the OpenMP or
simd mark (it runs inside one thread; the compiler may still vectorise it because the flags
allow reassociation, which TC's reduction semantics permits).

Example:
    >>> import numpy as np
    >>> from tfx_vec import tc_ops as tc
    >>> m = tc.define("def add1(float(N) A) -> (B) { B(i) = A(i) + 1 }")
    >>> m.add1(np.arange(3, dtype=np.float32)).numpy().tolist()
    [1.0, 2.0, 3.0]
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from ..codegen.c import CPrinter
from ..errors import TcBackendError, TcCompileError, TcShapeError
from ..lang.ranges import infer_ranges
from ..lang.sema import check_program
from ..lang.types import np_dtype
from ..options import MappingOptions
from ..poly.kernel import annotate_cpu, build_kernel
from . import KernelSpec

__all__ = ["CpuBackend", "CpuKernel", "compile_shared", "cache_dir", "CFLAGS", "kernel_source",
           "generate"]

# -fno-math-errno etc. let the compiler vectorise reductions (TC reductions are declared
# associative and commutative) without assuming away infinities (min=!/max=! start at +-inf).
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11",
          "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math")
_LOCK = threading.Lock()


def cache_dir() -> Path:
    """Where compiled kernels live: ``$TFX_VEC_TC_CACHE_DIR``, else ``~/.cache/tfx_vec/tc_cpu``,
    else (unwritable home) a folder under the system temp dir."""
    env = os.environ.get("TFX_VEC_TC_CACHE_DIR")
    candidates = [Path(env)] if env else [Path.home() / ".cache" / "tfx_vec" / "tc_cpu",
                                          Path(tempfile.gettempdir()) / "tfx_vec_tc_cpu"]
    for d in candidates:
        try:
            d.mkdir(parents=True, exist_ok=True)
            if os.access(d, os.W_OK):
                return d
        except OSError:
            continue
    raise TcBackendError(f"tc_ops cpu backend: no writable kernel cache directory "
                         f"(tried {', '.join(map(str, candidates))}; set TFX_VEC_TC_CACHE_DIR)")


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise TcBackendError("tc_ops cpu backend: no C compiler found (set CC or install gcc)")
    return cc


def compile_shared(source: str, extra_flags: tuple[str, ...] = (), tag: str = "") -> Path:
    """Compile ``source`` to a shared object, cached by a hash of source, flags and compiler.

    Raises:
        TcCompileError: with the compiler's messages.
    """
    cc = compiler()
    flags = CFLAGS + tuple(extra_flags)
    h = hashlib.sha256("\0".join((source, cc, *flags)).encode()).hexdigest()[:24]
    out = cache_dir() / f"{tag or 'tc'}_{h}.so"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(prefix="tfx_tc_") as tmp:
        src = Path(tmp) / "kernel.c"
        src.write_text(source)
        tmp_so = Path(tmp) / "kernel.so"
        proc = subprocess.run([cc, *flags, str(src), "-o", str(tmp_so), "-lm"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise TcCompileError(f"C compiler failed on the generated kernel:\n{proc.stderr}")
        os.replace(tmp_so, out)   # atomic: concurrent compilers never see a partial file
    return out


def kernel_source(spec: KernelSpec, printer: type = CPrinter) -> str:
    """The C source of ``spec`` (isl schedule + CPU annotation, or identity when naive)."""
    k = build_kernel(spec.cdef, spec.ranges)
    o = spec.options
    if o.fusion_strategy == "min" and not o.tile and o.parallel == 0 and not o.vectorize:
        schedule = k.identity_schedule()
    else:
        schedule = annotate_cpu(k.isl_schedule(o), o, k)
    return printer(k, o).kernel_source(schedule)


class CpuKernel:
    """A loaded kernel: ``run(args)`` calls ``tc_<entry>`` on the buffers' data pointers."""

    def __init__(self, source: str, so_path: Path, entry: str):
        self.source, self.path = source, so_path
        self._lib = ctypes.CDLL(str(so_path))
        self._fn = getattr(self._lib, entry)
        self._fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self._fn.restype = None

    def run(self, args: list) -> None:
        ptrs = (ctypes.c_void_p * max(1, len(args)))(*[a.ctypes.data for a in args])
        self._fn(ptrs)


class CpuBackend:
    """``backend="cpu"``: compiled C with OpenMP (see module docstring)."""

    name = "cpu"

    def compile(self, spec: KernelSpec) -> CpuKernel:
        source = kernel_source(spec)
        with _LOCK:
            path = compile_shared(source, tag=f"tc_{spec.cdef.name}")
        return CpuKernel(source, path, "tc_" + spec.cdef.name)


def generate(source: str, entry: str, input_specs, options=None, scalars: dict | None = None):
    """C source and output specs of ``entry`` for inputs of the given specs, without loading it.

    Args:
        input_specs: one ``(shape, dtype)`` per *tensor* parameter, in signature order.
        scalars: values of int scalar arguments that subscripts depend on.

    Returns:
        ``(c_source, [(name, shape, numpy dtype), ...])`` for the outputs; compile the source
        with :data:`CFLAGS` and call ``tc_<entry>``.
    """
    cdef = check_program(source)[entry]
    params = [p for p in cdef.inputs if not p.is_scalar]
    if len(input_specs) != len(params):
        raise TcShapeError(f"{entry}: expected {len(params)} input specs, got {len(input_specs)}")
    shapes = {p.name: tuple(s) for p, (s, _) in zip(params, input_specs)}
    ranges = infer_ranges(cdef, shapes, scalars)
    spec = KernelSpec(cdef, ranges, options or MappingOptions.default_for(cdef.ast))
    outs = [(n, ranges.shapes[n], np_dtype(cdef.tensors[n].dtype)) for n in cdef.outputs]
    return kernel_source(spec), outs
