"""A Tensor Comprehension as a real TensorFlow op, on the CPU or on a GPU.

One generic op library (``tf_op/tc_kernel_op.cc``) is compiled once against TensorFlow's own
headers (``tf.sysconfig`` flags), cached under :func:`tfx_vec.tc_ops.cache.cache_root` (rebuilt
when its source, TF version or flags change) and loaded with ``tf.load_op_library``.  Its op,
``TcKernel``, carries the kernel's C source and hash as attributes; at graph construction it
compiles (or finds in the cache) the shared object, dlopens it and later calls
``tc_<entry>(void* const* args)`` on the tensors' buffers, inputs then outputs.  No Python runs
when the op executes, so it works in eager, in ``tf.function``, in Keras models and after a
SavedModel reload (load the library first: :func:`load_op_library`).

Its GPU twin, ``TcCudaKernel`` (``tf_op/tc_cuda_kernel_op.cc``, its own library built with
``-DGOOGLE_CUDA=1`` and CUDA's ``cuda.h``: :func:`load_cuda_op_library`), carries the PTX of the
cuda backend's kernels (``nvcc --ptx``), their names and the mapping's grid/block sizes; its
``DEVICE_GPU`` kernel loads the module with the CUDA driver API (resolved with
``dlopen("libcuda.so.1")``, so the library loads where there is no driver) and launches the
kernels on TF's own stream on the tensors' device memory: inputs, outputs, then TC temporaries.
It has no CPU kernel, and TcKernel no GPU kernel, so the placer never mixes them up.

Stages: :func:`load_op_library` / :func:`load_cuda_op_library` (build/load a library) →
:func:`kernel_op` / :func:`cuda_kernel_op` (one op on an ABI-conforming C source / a
:class:`CudaLaunchSpec`) → :class:`TcFunction` (a TC entry point on ``backend="cpu"`` or
``"cuda"``, with a gradient from backward TCs registered on both op types).

Example::

    import numpy as np, tensorflow as tf
    from tfx_vec.tc_ops import tf_op
    src = '''
    void tc_axpy(void* const* a) {
      const float* x = (const float*)a[0]; float* y = (float*)a[1];
      for (int i = 0; i < 4; ++i) y[i] = 2.0f * x[i] + 1.0f;
    }'''
    (y,) = tf_op.kernel_op([tf.ones([4])], source=src, entry="axpy",
                           output_shapes=[(4,)], output_dtypes=[tf.float32])
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import os
import subprocess
import tempfile
import threading
from typing import Sequence

import tensorflow as tf

from .cache import cache_root
from .grad import backward_tc
from .lang.types import np_dtype

__all__ = ["load_op_library", "kernel_op", "source_hash", "DEFAULT_C_FLAGS", "OpLibraryError",
           "TcFunction", "tc_function", "load_cuda_op_library", "cuda_kernel_op", "cuda_ptx",
           "cuda_include_dir", "cuda_op_library_path", "CudaLaunchSpec", "require_gpu",
           "DEFAULT_CUDA_ARCH"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_OP_SOURCE = os.path.join(_HERE, "tf_op", "tc_kernel_op.cc")
DEFAULT_C_FLAGS = "-O3 -march=native -fopenmp -fPIC -shared -lm"

_lock = threading.Lock()
_library = None


class OpLibraryError(RuntimeError):
    """The generic TC op library could not be built or loaded."""


def _op_library_path(name: str, source: str, extra_flags: Sequence[str] = ()
                     ) -> tuple[str, list[str]]:
    """(cached .so path, g++ command with ``{OUT}`` for the output) of one op library.

    The path hashes the op source, the headers next to it, TF's version and every flag, so a
    change to any of them builds a new library.
    """
    texts = []
    for path in [source] + sorted(glob.glob(os.path.join(_HERE, "tf_op", "*.h"))):
        with open(path, "rb") as f:
            texts.append(f.read())
    cflags, lflags = tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()
    flags = [*extra_flags, *cflags]
    digest = hashlib.sha256(
        b"\0".join([*texts, tf.__version__.encode(), " ".join(flags + lflags).encode()])
    ).hexdigest()[:20]
    out = os.path.join(cache_root(), "ops", f"{name}-{digest}.so")
    cmd = ["g++", "-O2", "-fPIC", "-shared", *flags, source, "-o", "{OUT}", *lflags, "-ldl"]
    return out, cmd


def _build_and_load(out: str, cmd: list[str], what: str, keep_log: bool = False):
    """``tf.load_op_library`` of ``out``, first building it with ``cmd`` when missing (with
    ``keep_log``, the compiler's messages go to ``out + ".log"``)."""
    if not os.path.exists(out) or (keep_log and not os.path.exists(out + ".log")):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(out))
        os.close(fd)
        cmd = [tmp if c == "{OUT}" else c for c in cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            os.unlink(tmp)
            raise OpLibraryError(
                f"building the {what} op library failed:\n{' '.join(cmd)}\n{proc.stderr}")
        if keep_log:
            with open(out + ".log", "w") as f:
                f.write(f"{' '.join(cmd)}\n{proc.stderr}")
        os.replace(tmp, out)  # atomic: a concurrent builder's result is equivalent
    try:
        return tf.load_op_library(out)
    except Exception as e:  # a truncated/foreign file: rebuild once
        os.unlink(out)
        raise OpLibraryError(f"loading {out} failed ({e}); removed it, call again") from e


def load_op_library():
    """Build (once, cached on disk) and load the generic ``TcKernel`` op library.

    Returns the module of ``tf.load_op_library``; its ``tc_kernel`` is the raw op.

    >>> lib = load_op_library(); callable(lib.tc_kernel)
    True
    """
    global _library
    with _lock:
        if _library is None:
            _library = _build_and_load(*_op_library_path("tc_kernel_op", _OP_SOURCE), "TcKernel")
        return _library


# -- the GPU op: TcCudaKernel -------------------------------------------------------------
_CUDA_OP_SOURCE = os.path.join(_HERE, "tf_op", "tc_cuda_kernel_op.cc")
_cuda_library = None
#: The virtual architecture PTX is generated for: the oldest CUDA 12/13's nvcc both accept, so
#: the driver JIT-compiles it for any newer GPU (sm_80, sm_90, ...).
DEFAULT_CUDA_ARCH = "compute_75"


def cuda_include_dir() -> str | None:
    """The CUDA toolkit's include directory holding ``cuda.h`` (``$CUDA_HOME``, ``$CUDA_PATH``,
    ``/usr/local/cuda``, then next to ``nvcc``), or None."""
    from .backends.cuda import nvcc_path

    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = nvcc_path()
    if nvcc is not None:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    for root in roots:
        if root and os.path.exists(os.path.join(root, "include", "cuda.h")):
            return os.path.join(root, "include")
    return None


def load_cuda_op_library():
    """Build (once, cached) and load the ``TcCudaKernel`` op library: the GPU kernel of the
    generic op, compiled with ``-DGOOGLE_CUDA=1`` against TF's headers and CUDA's ``cuda.h``.

    It resolves the CUDA driver at run time (``dlopen("libcuda.so.1")``), so it builds and loads
    on a machine without a driver or GPU too (where TensorFlow has no GPU device to run it on).
    Raises OpLibraryError when ``cuda.h`` is not found or TensorFlow is not built with CUDA.
    Load it before ``tf.saved_model.load`` of a graph holding ``TcCudaKernel`` ops.

    Example::

        lib = load_cuda_op_library()   # needs a CUDA toolkit's headers, not a GPU
        lib.tc_cuda_kernel             # the raw op (see cuda_kernel_op)
    """
    global _cuda_library
    with _lock:
        if _cuda_library is None:
            if not tf.test.is_built_with_cuda():
                raise OpLibraryError("the TcCudaKernel op library needs a TensorFlow built with "
                                     "CUDA; this one is not")
            inc = cuda_include_dir()
            if inc is None:
                raise OpLibraryError(
                    "the TcCudaKernel op library needs cuda.h from a CUDA toolkit (set "
                    "CUDA_HOME); none was found in $CUDA_HOME, $CUDA_PATH, /usr/local/cuda or "
                    "next to nvcc")
            out, cmd = _op_library_path("tc_cuda_kernel_op", _CUDA_OP_SOURCE,
                                        _cuda_op_flags(inc))
            _cuda_library = _build_and_load(out, cmd, "TcCudaKernel", keep_log=True)
        return _cuda_library


def _cuda_op_flags(cuda_include: str) -> list[str]:
    # Warnings on: the build log (kept next to the library) shows whether our code has any.
    return ["-DGOOGLE_CUDA=1", f"-I{cuda_include}", "-Wall", "-Wextra"]


def cuda_op_library_path() -> str:
    """Where :func:`load_cuda_op_library` builds the library (its log: the same + ``.log``)."""
    inc = cuda_include_dir()
    if inc is None:
        raise OpLibraryError("no cuda.h found (set CUDA_HOME)")
    return _op_library_path("tc_cuda_kernel_op", _CUDA_OP_SOURCE, _cuda_op_flags(inc))[0]


@functools.lru_cache(maxsize=None)
def _nvcc_version(nvcc: str) -> str:
    proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    return f"{os.path.realpath(nvcc)}\n{proc.stdout}"


def cuda_ptx(source: str, arch: str = DEFAULT_CUDA_ARCH) -> str:
    """PTX of a CUDA source (``nvcc --ptx -arch=<arch>``), cached on disk by source and arch.

    Raises TcBackendError without nvcc, TcCompileError with nvcc's output when it fails.

    Example::

        ptx = cuda_ptx('extern "C" __global__ void k(float* a) { a[threadIdx.x] = 1; }')
        assert ".entry k(" in ptx
    """
    from .backends.cuda import nvcc_path
    from .errors import TcBackendError, TcCompileError

    nvcc = nvcc_path()
    if nvcc is None:
        raise TcBackendError("backend 'cuda': making PTX for the TcCudaKernel op needs nvcc, "
                             "which is not on PATH")
    # The nvcc version is in the key: PTX from another toolkit has another PTX ISA version,
    # which decides the oldest driver that can load it.
    key = hashlib.sha256("\0".join([source, arch, _nvcc_version(nvcc), "ptx1"]).encode()
                         ).hexdigest()[:32]
    path = os.path.join(cache_root(), "ptx", f"{key}.ptx")
    if os.path.exists(path):
        with open(path) as f:
            return f.read()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tfx_vec_ptx_") as d:
        src, ptx = os.path.join(d, "kernel.cu"), os.path.join(d, "kernel.ptx")
        with open(src, "w") as f:
            f.write(source)
        proc = subprocess.run([nvcc, "--ptx", f"-arch={arch}", src, "-o", ptx],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise TcCompileError(f"nvcc --ptx -arch={arch} failed:\n{proc.stderr}{proc.stdout}"
                                 f"\n--- source ---\n{source}")
        with open(ptx) as f:
            text = f.read()
    fd, tmp = tempfile.mkstemp(suffix=".ptx", dir=os.path.dirname(path))
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return text


@dataclasses.dataclass(frozen=True)
class CudaLaunchSpec:
    """Everything a ``TcCudaKernel`` op carries: the module and how to launch it.

    ``kernels`` are launched in order on TF's stream, kernel ``k`` with ``grid[k]`` blocks of
    ``block[k]`` threads (x, y, z), each taking one device pointer per buffer: the inputs, the
    outputs, then one scratch buffer of ``temp_bytes[i]`` bytes per TC temporary.
    """

    entry: str
    source: str                       # the generated CUDA
    module: str                       # its PTX
    kernels: tuple[str, ...]
    grid: tuple[tuple[int, int, int], ...]
    block: tuple[tuple[int, int, int], ...]
    temp_bytes: tuple[int, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[tf.DType, ...]

    @classmethod
    def from_kernel(cls, kernel, arch: str = DEFAULT_CUDA_ARCH) -> "CudaLaunchSpec":
        """From a :class:`~tfx_vec.tc_ops.backends.cuda.CudaKernel` (source, launches, buffers)."""
        import numpy as np

        def pad3(t) -> tuple[int, int, int]:
            t = tuple(int(x) for x in t)
            return t + (1,) * (3 - len(t))

        grid, block = [], []
        for ln in kernel.launches:
            grid.append(pad3(g // b for g, b in zip(ln.global_size, ln.local_size)))
            block.append(pad3(ln.local_size))
        return cls(
            entry=kernel.spec.cdef.name, source=kernel.source, module=cuda_ptx(kernel.source, arch),
            kernels=tuple(ln.kernel for ln in kernel.launches), grid=tuple(grid),
            block=tuple(block),
            temp_bytes=tuple(int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize
                             for s, d in kernel.temps),
            output_shapes=tuple(tuple(int(x) for x in s) for s, _ in kernel.outputs),
            output_dtypes=tuple(tf.as_dtype(d) for _, d in kernel.outputs))


def require_gpu() -> None:
    """TcBackendError unless TensorFlow sees a GPU (the only place ``TcCudaKernel`` runs)."""
    from .errors import TcBackendError

    if not tf.config.list_physical_devices("GPU"):
        why = ("this TensorFlow is not built with CUDA" if not tf.test.is_built_with_cuda()
               else "no CUDA driver or no GPU")
        raise TcBackendError(
            f"backend 'cuda': TensorFlow sees no GPU here ({why}); the TcCudaKernel op runs only "
            "on a GPU. Use backend='cpu' (the TcKernel op), or TcFunction.cuda_spec(...) to "
            "generate and inspect the kernel without one.")


def cuda_kernel_op(inputs: Sequence, spec: CudaLaunchSpec, *, grad_key: str = ""
                   ) -> list[tf.Tensor]:
    """Launch ``spec``'s kernels as one ``TcCudaKernel`` op on the inputs (placed on a GPU).

    Raises TcBackendError where TensorFlow has no GPU (checked first: the op has no CPU kernel).

    Example::

        f = TcFunction(TMM, "tmm", backend="cuda")
        (C,) = cuda_kernel_op([A, B], f.cuda_spec(A, B))   # what f(A, B) does, minus the gradient
    """
    require_gpu()
    lib = _cuda_library or load_cuda_op_library()
    inputs = [tf.convert_to_tensor(x) for x in inputs]
    return lib.tc_cuda_kernel(
        inputs=inputs, Tout=list(spec.output_dtypes),
        input_shapes=[tuple(x.shape) for x in inputs],
        output_shapes=list(spec.output_shapes), entry=spec.entry, module=spec.module,
        kernels=list(spec.kernels),
        grid=[x for g in spec.grid for x in g], block=[x for b in spec.block for x in b],
        temp_bytes=list(spec.temp_bytes), grad_key=grad_key)


def source_hash(source: str, compiler: str, flags: str) -> str:
    """The hash naming a kernel's shared object: it covers the source, compiler and flags."""
    h = hashlib.sha256("\0".join([source, compiler, flags]).encode()).hexdigest()
    return "k" + h[:32]


def kernel_op(inputs: Sequence, *, source: str, entry: str,
              output_shapes: Sequence[Sequence[int]], output_dtypes: Sequence,
              compiler: str = "cc", flags: str = DEFAULT_C_FLAGS,
              hash_: str | None = None, grad_key: str = "") -> list[tf.Tensor]:
    """Run the compiled C kernel ``tc_<entry>`` of ``source`` as one ``TcKernel`` op.

    Args:
      inputs: tensors (or arrays) passed in order; their shapes are fixed in the op, a call with
        other shapes raises ``InvalidArgumentError`` instead of reading out of bounds.
      source: C source defining ``void tc_<entry>(void* const* args)``.
      output_shapes, output_dtypes: what the kernel writes, in order.
      hash_: ``source_hash(source, compiler, flags)`` when the caller has it already.
    Returns:
      the list of output tensors.
    """
    lib = _library or load_op_library()
    inputs = [tf.convert_to_tensor(x) for x in inputs]
    return lib.tc_kernel(
        inputs=inputs,
        Tout=[tf.as_dtype(d) for d in output_dtypes],
        input_shapes=[tuple(x.shape) for x in inputs],
        output_shapes=[tuple(int(d) for d in s) for s in output_shapes],
        entry=entry, source=source,
        source_hash=hash_ or source_hash(source, compiler, flags),
        compiler=compiler, compile_flags=flags, grad_key=grad_key)


# -- TC entry points as TF ops with gradients -------------------------------------------------
class TcFunction:
    """A TC def as a TensorFlow op: ``TcKernel`` on the cpu backend's generated C
    (``backend="cpu"``), or ``TcCudaKernel`` launching the cuda backend's kernels on TF's GPU
    stream (``backend="cuda"``; a TcBackendError where TensorFlow sees no GPU).

    Call it on tensors (eager or inside ``tf.function``; static shapes required): the kernel is
    generated once per input signature and options, and travels in the op.  The gradient is a
    backward TC (run on the same backend): ``backward="auto"`` derives it
    (``grad.backward_tc``), a ``(source, entry)`` pair gives one by hand (parameters: forward
    inputs, then one gradient per forward output; returns one gradient per floating-point tensor
    input), ``None`` makes the op non-differentiable.

    Example::

        f = TcFunction("def tmm(float(M,K) A, float(N,K) B) -> (C) "
                       "{ C(m,n) +=! A(m,kk) * B(n,kk) }", "tmm")
        with tf.GradientTape() as tape:
            tape.watch(A)
            C = f(A, B)
        dA = tape.gradient(C, A)
        g = TcFunction(f.source, "tmm", backend="cuda")   # the same on the GPU (TcCudaKernel)
        spec = g.cuda_spec(A, B)        # its PTX, kernels, grid/block: needs nvcc, not a GPU
    """

    def __init__(self, source: str, entry: str, *, backward="auto", options=None,
                 wrt: Sequence[str] | None = None, backend: str = "cpu",
                 cuda_arch: str = DEFAULT_CUDA_ARCH):
        from .errors import TcBackendError
        from .lang.sema import check_program

        if backend not in ("cpu", "cuda"):
            raise TcBackendError(f"TC {entry}: a TF op runs on backend 'cpu' (TcKernel) or "
                                 f"'cuda' (TcCudaKernel), not {backend!r}")
        self.source, self.entry, self.backend, self.cuda_arch = source, entry, backend, cuda_arch
        self.cdef = check_program(source)[entry]
        self.options = options
        self._specs: dict = {}     # input signature -> KernelSpec
        self._kernels: dict = {}   # (backend, input signature) -> generated kernel
        self._lock = threading.Lock()
        self._backward_spec = backward
        self._backwards: dict = {}     # forward ranges key -> backward TcFunction
        floats = tuple(p.name for p in self.cdef.inputs
                       if not p.is_scalar and p.dtype in ("float", "double", "half"))
        self.wrt = floats if wrt is None else tuple(wrt)
        for n in self.wrt:
            if n not in floats:
                raise ValueError(f"TC {entry}: wrt={n!r} is not a floating-point tensor input "
                                 f"(those are {list(floats)})")

    @property
    def backward(self) -> "TcFunction":
        """The backward TC as a TcFunction, shape-generic (derived on first use when
        ``backward="auto"``); :meth:`gradient` uses :meth:`backward_for` the call's shapes."""
        return self.backward_for(None)

    def backward_for(self, ranges) -> "TcFunction":
        """The backward TC for the forward's ``ranges`` at some shapes (``lang.ranges.Ranges``,
        None: shape-generic), made once per ranges: it runs every statement over exactly the
        ranges its forward statement ran over."""
        key = None if ranges is None else ranges.key()
        if key not in self._backwards:
            spec = self._backward_spec
            if spec is None:
                raise TypeError(f"TC {self.entry} was made without a gradient (backward=None)")
            if spec == "auto":
                b = backward_tc(self.source, self.entry, self.wrt, ranges)
                spec = (b.source, b.entry)
            self._backwards[key] = TcFunction(spec[0], spec[1], backward=None,
                                              options=self.options, backend=self.backend,
                                              cuda_arch=self.cuda_arch)
        return self._backwards[key]

    def _kernel_spec(self, inputs: list[tf.Tensor]) -> tuple:
        """(the backends' ``KernelSpec``: checked TC, sizes, options; the input signature) for
        these inputs."""
        from .backends import KernelSpec
        from .errors import TcShapeError
        from .lang.ranges import infer_ranges
        from .lang.types import np_dtype
        from .options import MappingOptions

        params = self.cdef.inputs
        if len(inputs) != len(params):
            raise TcShapeError(f"{self.entry} takes {len(params)} input(s) "
                               f"({', '.join(p.name for p in params)}), got {len(inputs)}")
        shapes, scalars = {}, {}
        for p, x in zip(params, inputs):
            if x.dtype != tf.as_dtype(np_dtype(p.dtype)):
                raise TcShapeError(f"{self.entry}: input {p.name} is declared {p.dtype} but got "
                                   f"{x.dtype.name}")
            if not x.shape.is_fully_defined():
                raise TcShapeError(f"{self.entry}: input {p.name} has a shape {x.shape} that is "
                                   "not fully known; TC kernels are compiled per static shape")
            if p.is_scalar:
                if p.name in self.cdef.structural_scalars:
                    v = tf.get_static_value(x)
                    if v is None:
                        raise TcShapeError(f"{self.entry}: scalar {p.name} sizes or indexes "
                                           "tensors, so it must be a constant")
                    scalars[p.name] = int(v)
            else:
                shapes[p.name] = tuple(x.shape)
        key = (tuple(sorted(shapes.items())), tuple(sorted(scalars.items())))
        with self._lock:
            spec = self._specs.get(key)
            if spec is None:
                values = {n: (0, 0) for n in self.cdef.index_inputs}
                ranges = infer_ranges(self.cdef, shapes, scalars, values)
                # Index values are unknown when the graph is built and no Python runs later:
                # data-dependent subscripts are clamped into their tensor in the kernel, so a
                # bad id reads the nearest valid element instead of out of bounds.
                ranges = dataclasses.replace(ranges, clamp=ranges.clamp | _data_dependent_reads(
                    self.cdef))
                options = self.options or MappingOptions.default_for(self.cdef.ast)
                spec = self._specs[key] = KernelSpec(self.cdef, ranges, options)
        return spec, key

    def _compiled(self, inputs: list[tf.Tensor], backend: str):
        """This backend's kernel for these inputs, generated once per signature: the cpu tuple
        (C source, output shapes, output dtypes, compiler, flags, hash) or a CudaLaunchSpec."""
        spec, key = self._kernel_spec(inputs)
        with self._lock:
            hit = self._kernels.get((backend, key))
            if hit is None:
                hit = self._kernels[(backend, key)] = (
                    _cpu_kernel(spec) if backend == "cpu" else _cuda_spec(spec, self.cuda_arch))
        return hit

    def kernel_source(self, *inputs) -> str:
        """The generated code the op carries for inputs like these (C, or CUDA)."""
        hit = self._compiled([tf.convert_to_tensor(x) for x in inputs], self.backend)
        return hit.source if self.backend == "cuda" else hit[0]

    def cuda_spec(self, *inputs) -> CudaLaunchSpec:
        """What the ``TcCudaKernel`` op launches for these inputs (PTX, kernels, grid/block,
        temporaries); needs nvcc but no GPU."""
        return self._compiled([tf.convert_to_tensor(x) for x in inputs], "cuda")

    @tf.autograph.experimental.do_not_convert
    def raw(self, *inputs, grad_key: str = "") -> list[tf.Tensor]:
        """The outputs; differentiable (through the registered op gradient) when ``grad_key``
        names this function's gradient."""
        inputs = [tf.convert_to_tensor(x) for x in inputs]
        if self.backend == "cuda":
            require_gpu()  # before nvcc runs: without a GPU the op could never execute
            return cuda_kernel_op(inputs, self._compiled(inputs, "cuda"), grad_key=grad_key)
        src, shapes, dtypes, cc, flags, h = self._compiled(inputs, "cpu")
        return kernel_op(inputs, source=src, entry=self.cdef.name, output_shapes=shapes,
                         output_dtypes=dtypes, compiler=cc, flags=flags, hash_=h,
                         grad_key=grad_key)

    @tf.autograph.experimental.do_not_convert
    def __call__(self, *inputs):
        # The gradient is registered for the op type (not a tf.custom_gradient wrapper), so an
        # eager call costs one op; the op's grad_key finds this function's backward TC.
        key = ""
        if self._backward_spec is not None:
            key = f"tcfn{id(self):x}"
            _GRADIENTS[key] = self
        outs = self.raw(*inputs, grad_key=key)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def gradient(self, inputs: Sequence[tf.Tensor], grads: Sequence) -> list:
        """d(inputs) from the output gradients, via the backward TC (None for non-``wrt``)."""
        spec, _ = self._kernel_spec([tf.convert_to_tensor(x) for x in inputs])
        backward = self.backward_for(spec.ranges if self._backward_spec == "auto" else None)
        # the backward TC declares each output gradient's type (non-float outputs get zeros)
        types = [p.dtype for p in backward.cdef.inputs[len(inputs):]]
        dys = [tf.zeros(s, tf.as_dtype(np_dtype(t))) if g is None else
               tf.cast(g, tf.as_dtype(np_dtype(t)))
               for g, s, t in zip(grads, self._out_specs(inputs)[0], types)]
        d = backward.raw(*inputs, *dys)
        res: list = [None] * len(inputs)
        pos = {p.name: i for i, p in enumerate(self.cdef.inputs)}
        for k, name in enumerate(self.wrt):
            res[pos[name]] = d[k]
        return res

    def _out_specs(self, inputs: Sequence[tf.Tensor]) -> tuple[list, list]:
        from .lang.types import np_dtype

        spec, _ = self._kernel_spec([tf.convert_to_tensor(x) for x in inputs])
        return ([spec.ranges.shapes[n] for n in self.cdef.outputs],
                [tf.as_dtype(np_dtype(self.cdef.tensors[n].dtype)) for n in self.cdef.outputs])


def _cpu_kernel(spec) -> tuple:
    from .backends.cpu import CFLAGS, compiler, kernel_source
    from .lang.types import np_dtype

    src = kernel_source(spec)
    outs = [spec.ranges.shapes[n] for n in spec.cdef.outputs]
    dts = [tf.as_dtype(np_dtype(spec.cdef.tensors[n].dtype)) for n in spec.cdef.outputs]
    cc, flags = compiler(), " ".join(CFLAGS) + " -lm"
    return src, outs, dts, cc, flags, source_hash(src, cc, flags)


def _cuda_spec(spec, arch: str) -> CudaLaunchSpec:
    from .backends.cuda import CudaBackend

    return CudaLaunchSpec.from_kernel(CudaBackend().compile(spec), arch)


# grad_key -> TcFunction.  Entries live as long as the process: a TcFunction is small and a
# graph may be differentiated long after the Python object that built it went away.
_GRADIENTS: dict[str, "TcFunction"] = {}


def _tc_kernel_gradient(op, *grads):
    key = op.get_attr("grad_key").decode()
    fn = _GRADIENTS.get(key)
    if fn is None:
        entry = op.get_attr("entry").decode()
        raise LookupError(f"TcKernel tc_{entry}: no gradient is registered in this process "
                          "(the TC was made with backward=None, or the graph was reloaded "
                          "without rebuilding its TcFunction)")
    return fn.gradient(list(op.inputs), list(grads))


for _op_type in ("TcKernel", "TcCudaKernel"):
    try:
        tf.RegisterGradient(_op_type)(_tc_kernel_gradient)
    except KeyError:  # module reloaded: the first registration stays
        pass


def _data_dependent_reads(cdef) -> frozenset:
    from .lang import ast as A
    return frozenset(id(x) for cs in cdef.stmts for x in cs.reads
                     if any(isinstance(y, A.Call) for a in x.args for y in A.walk(a)))


def tc_function(source: str, entry: str, *, backward="auto", options=None,
                wrt: Sequence[str] | None = None, backend: str = "cpu") -> TcFunction:
    """``TcFunction(source, entry, backward=..., options=..., wrt=..., backend=...)``: a TC
    def as a TF op (``backend="cuda"``: the GPU op, see :class:`TcFunction`).

    ``wrt`` limits the gradient to some inputs (the others get None), e.g. a convolution's
    weights when its input's subscripts (``I(h + kh)``) are not differentiable automatically.
    """
    return TcFunction(source, entry, backward=backward, options=options, wrt=wrt,
                      backend=backend)
