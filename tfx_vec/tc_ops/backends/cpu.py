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
-> ``$CC -O3 -march=native -fopenmp -shared -fPIC`` (run without a shell by ``native``) -> a
``.so`` in the signed store ``$TFX_VEC_CACHE_DIR/kernels`` (keyed by source, flags, compiler
and CPU) -> loaded from its verified bytes with ``ctypes``.

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
import threading

from .. import native
from ..codegen.c import CPrinter
from ..errors import TcShapeError
from ..lang.ranges import infer_ranges
from ..lang.sema import check_program
from ..lang.types import np_dtype
from ..options import MappingOptions
from ..poly.kernel import annotate_cpu, build_kernel
from . import KernelSpec
from .bounds import check_native_bounds

__all__ = ["CpuBackend", "CpuKernel", "compile_shared", "CFLAGS", "kernel_source", "generate"]

# -fno-math-errno etc. let the compiler vectorise reductions (TC reductions are declared
# associative and commutative) without assuming away infinities (min=!/max=! start at +-inf).
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11",
          "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math")
_LOCK = threading.Lock()


def compile_shared(source: str, extra_flags: tuple[str, ...] = (), tag: str = ""
                   ) -> native.Artifact:
    """``source`` compiled to a shared object with ``$CC`` and :data:`CFLAGS` (plus
    ``extra_flags``), from the signed kernel store or built now.

    Raises:
        TcCompileError: with the compiler's messages.
        TcBackendError: when ``$CC`` names no compiler (the message says how to fix it).
    """
    return native.compile_source("kernels", tag or "tc", source, (*CFLAGS, *extra_flags),
                                 what="C compiler")


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
    """A kernel loaded from its verified bytes: ``run(args)`` calls ``symbol`` (``tc_<def>``)
    on the buffers' data pointers."""

    def __init__(self, artifact: native.Artifact, symbol: str, source: str = ""):
        self.source, self.path = source, artifact.path
        self._lib = native.load_shared(artifact)
        self._fn = getattr(self._lib, symbol)
        self._fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self._fn.restype = None

    @property
    def address(self) -> int:
        """The entry point's address (what the TF op calls)."""
        return ctypes.cast(self._fn, ctypes.c_void_p).value

    def run(self, args: list) -> None:
        ptrs = (ctypes.c_void_p * max(1, len(args)))(*[a.ctypes.data for a in args])
        self._fn(ptrs)


class CpuBackend:
    """``backend="cpu"``: compiled C with OpenMP (see module docstring)."""

    name = "cpu"

    def compile(self, spec: KernelSpec) -> CpuKernel:
        check_native_bounds(spec)
        source = kernel_source(spec)
        with _LOCK:
            artifact = compile_shared(source, tag=f"tc_{spec.cdef.name}")
            return CpuKernel(artifact, "tc_" + spec.cdef.name, source)


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
