"""A Tensor Comprehension as a real TensorFlow op, on the CPU or on a GPU.

A graph carries a TC, never code.  The op ``TcKernel`` (``tf_op/tc_kernel_op.cc``) holds the
TC's source text, the def to run, its mapping options (JSON) and the input/output shapes known
when the graph was built (``None`` dimensions allowed).  For each tuple of concrete input shapes
it asks the *builder* (:mod:`tfx_vec.tc_ops.op_builder`, this process's TC compiler, registered
when :func:`load_op_library` loads the op library) for a kernel: the request is checked like
any untrusted input, C is generated from the TC, compiled with the locally configured compiler
into the signed private cache (:mod:`tfx_vec.tc_ops.native`) and called on the tensors' buffers,
outputs zero-filled first.  So the op works in eager, in ``tf.function``, in Keras models with
an unknown batch size (a kernel per size, made on first use) and after a SavedModel reload on
another machine with an empty cache (:func:`load_saved_model`, or :func:`load_op_library`
before ``tf.saved_model.load``), and a crafted graph can make it run nothing but our compiler's
output for some TC: see SECURITY.md.

Its GPU twin, ``TcCudaKernel`` (``tf_op/tc_cuda_kernel_op.cc``, its own library built with
``-DGOOGLE_CUDA=1`` and CUDA's ``cuda.h``: :func:`load_cuda_op_library`), carries the same
attributes; the builder maps the TC to the GPU, prints CUDA, makes PTX with the local nvcc, and
the op launches the kernels with the CUDA driver API (``dlopen("libcuda.so.1")``, so the library
loads where there is no driver) on TF's own stream on the tensors' device memory.  It has no CPU
kernel, and TcKernel no GPU kernel, so the placer never mixes them up.

Stages: :func:`load_op_library` / :func:`load_cuda_op_library` (build, verify, load a library;
register the builder) -> :func:`kernel_op` / :func:`cuda_kernel_op` (one op running a TC entry)
-> :class:`TcFunction` (a TC entry point on ``backend="cpu"`` or ``"cuda"``, with a gradient from
backward TCs registered on both op types).

Example::

    import numpy as np, tensorflow as tf
    from tfx_vec.tc_ops import tf_op
    AXPY = "def axpy(float(N) X) -> (Y) { Y(i) = 2 * X(i) + 1 }"
    (y,) = tf_op.kernel_op([tf.ones([4])], tc=AXPY, entry="axpy")   # [3. 3. 3. 3.]
"""
from __future__ import annotations

import ctypes
import functools
import json
import os
import threading
from typing import Sequence

import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from . import native, op_builder
from .errors import TcBackendError, TcCompileError, TcOptionsError, TcShapeError
from .grad import backward_tc
from .lang.types import canonical, np_dtype
from .op_builder import DEFAULT_CUDA_ARCH, CudaLaunchSpec, OpRequest, cuda_ptx
from .options import MappingOptions

__all__ = ["load_op_library", "kernel_op", "OpLibraryError", "TcFunction", "tc_function",
           "load_cuda_op_library", "cuda_kernel_op", "cuda_ptx", "cuda_include_dir",
           "cuda_op_library_path", "CudaLaunchSpec", "require_gpu", "DEFAULT_CUDA_ARCH",
           "load_saved_model"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_OP_SOURCE = os.path.join(_HERE, "tf_op", "tc_kernel_op.cc")
_CUDA_OP_SOURCE = os.path.join(_HERE, "tf_op", "tc_cuda_kernel_op.cc")

_lock = threading.Lock()
_library = None
_cuda_library = None


class OpLibraryError(RuntimeError):
    """The generic TC op library could not be built or loaded."""


# -- the builder hook: how an op asks this process for a kernel ---------------------------------
_ReplyWriter = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)
_Builder = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                            _ReplyWriter)


def _serve(request: int, size: int, reply: int, write) -> int:
    try:
        answer = op_builder.serve(ctypes.string_at(request, size))
        write(reply, answer, len(answer))
        return 0
    except BaseException:  # noqa: BLE001 - never unwind into the op; it reports rc != 0
        return 1


_BUILDER = _Builder(_serve)   # kept alive for the life of the process


# -- op libraries -------------------------------------------------------------------------------
def _op_library(name: str, source: str, extra_flags: Sequence[str] = (), keep_log: bool = False
                ) -> native.Artifact:
    """One op library, built with ``$CXX`` and TF's flags into the signed cache (rebuilt when
    its source, headers, TF's version, the flags or the compiler change)."""
    headers = {}
    folder = os.path.join(_HERE, "tf_op")
    for h in sorted(os.listdir(folder)):
        if h.endswith(".h"):
            with open(os.path.join(folder, h)) as f:
                headers[f"header {h}"] = f.read()
    with open(source) as f:
        text = f.read()
    flags = ["-O2", "-fPIC", "-shared", f"-I{folder}", *extra_flags,
             *tf.sysconfig.get_compile_flags()]
    try:
        return native.compile_source(
            "ops", name, text, flags, setting="CXX", source_suffix=".cc",
            libs=(*tf.sysconfig.get_link_flags(), "-ldl"), keep_log=keep_log,
            depends={**headers, "tensorflow": tf.__version__},
            what=f"building the {name} op library")
    except TcCompileError as e:
        raise OpLibraryError(e.message) from e


def _load(artifact: native.Artifact):
    """``tf.load_op_library`` of the verified library, with the builder registered in it."""
    with native.loadable_copy(artifact) as path:
        lib = tf.load_op_library(path)
        ctypes.CDLL(path).tfx_vec_tc_set_builder(_BUILDER)   # the same handle as TF's
    return lib


def load_op_library():
    """Build (once, cached and signed on disk) and load the ``TcKernel`` op library, and
    register this process's TC compiler as its builder.

    Returns the module of ``tf.load_op_library``; its ``tc_kernel`` is the raw op.  Call it
    before loading a graph or SavedModel holding TcKernel ops (or use :func:`load_saved_model`).

    >>> lib = load_op_library(); callable(lib.tc_kernel)
    True
    """
    global _library
    with _lock:
        if _library is None:
            _library = _load(_op_library("tc_kernel_op", _OP_SOURCE))
        return _library


def cuda_include_dir() -> str | None:
    """The CUDA toolkit's include directory holding ``cuda.h`` (``$CUDA_HOME``, ``$CUDA_PATH``,
    ``/usr/local/cuda``, then next to ``nvcc``), or None."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = native.tool("NVCC", required=False)
    if nvcc is not None:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc[0]))))
    for root in roots:
        if root and os.path.exists(os.path.join(root, "include", "cuda.h")):
            return os.path.join(root, "include")
    return None


def _cuda_op_artifact() -> native.Artifact:
    inc = cuda_include_dir()
    if inc is None:
        raise OpLibraryError(
            "the TcCudaKernel op library needs cuda.h from a CUDA toolkit (set CUDA_HOME); none "
            "was found in $CUDA_HOME, $CUDA_PATH, /usr/local/cuda or next to nvcc")
    # Warnings on: the build log (kept next to the library) shows whether our code has any.
    return _op_library("tc_cuda_kernel_op", _CUDA_OP_SOURCE,
                       ["-DGOOGLE_CUDA=1", f"-I{inc}", "-Wall", "-Wextra"], keep_log=True)


def load_cuda_op_library():
    """Build (once, cached and signed) and load the ``TcCudaKernel`` op library: the GPU kernel
    of the TC op, compiled with ``-DGOOGLE_CUDA=1`` against TF's headers and CUDA's ``cuda.h``,
    with this process's TC compiler registered as its builder.

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
            _cuda_library = _load(_cuda_op_artifact())
        return _cuda_library


def cuda_op_library_path() -> str:
    """Where :func:`load_cuda_op_library` caches the library (its build log: that + ``.log``)."""
    return str(_cuda_op_artifact().path)


def load_saved_model(path: str, **kwargs):
    """``tf.saved_model.load(path, **kwargs)`` after loading the op libraries its graphs use.

    The documented way to load a model holding TC ops, on any machine: nothing in the model is
    executed as code; each op's kernel is generated here from the TC it carries (built into an
    empty cache the first time it runs).
    """
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        model = saved_model_pb2.SavedModel.FromString(f.read())
    ops = {n.op for mg in model.meta_graphs for n in mg.graph_def.node}
    ops |= {n.op for mg in model.meta_graphs for fd in mg.graph_def.library.function
            for n in fd.node_def}
    load_op_library()
    if "TcCudaKernel" in ops:
        load_cuda_op_library()
    return tf.saved_model.load(path, **kwargs)


# -- one op -------------------------------------------------------------------------------------
def kernel_op(inputs: Sequence, *, tc: str, entry: str, options: MappingOptions | None = None,
              derivative: Sequence[str] = (), grad_key: str = "") -> list[tf.Tensor]:
    """Run def ``entry`` of the TC source ``tc`` as one ``TcKernel`` op on ``inputs``.

    Inputs may have dimensions unknown when the graph is built (``None``): the op makes a kernel
    for each concrete shape it meets.  Int scalars that size or index tensors must be constants.
    With ``derivative`` (input names) the op runs the TC's backward TC with respect to them,
    derived at each run's shapes, on the forward's inputs followed by one gradient per output.
    Returns the list of output tensors (their static shapes from range inference).

    Raises a TcError subclass for a bad TC or call (input count, dtypes, sizes).
    """
    lib = _library or load_op_library()
    return _op(lib.tc_kernel, "TcKernel", inputs, tc, entry, options, derivative, grad_key)


def require_gpu() -> None:
    """TcBackendError unless TensorFlow sees a GPU (the only place ``TcCudaKernel`` runs)."""
    if not tf.config.list_physical_devices("GPU"):
        why = ("this TensorFlow is not built with CUDA" if not tf.test.is_built_with_cuda()
               else "no CUDA driver or no GPU")
        raise TcBackendError(
            f"backend 'cuda': TensorFlow sees no GPU here ({why}); the TcCudaKernel op runs only "
            "on a GPU. Use backend='cpu' (the TcKernel op), or TcFunction.cuda_spec(...) to "
            "generate and inspect the kernel without one.")


def cuda_kernel_op(inputs: Sequence, *, tc: str, entry: str,
                   options: MappingOptions | None = None, cuda_arch: str = DEFAULT_CUDA_ARCH,
                   derivative: Sequence[str] = (), grad_key: str = "") -> list[tf.Tensor]:
    """Run def ``entry`` of ``tc`` as one ``TcCudaKernel`` op (placed on a GPU).

    Raises TcBackendError where TensorFlow has no GPU (checked first: the op has no CPU kernel).

    Example::

        (C,) = cuda_kernel_op([A, B], tc=TMM, entry="tmm")
    """
    require_gpu()
    lib = _cuda_library or load_cuda_op_library()
    return _op(lib.tc_cuda_kernel, "TcCudaKernel", inputs, tc, entry, options, derivative,
               grad_key, cuda_arch=cuda_arch)


def _op(raw_op, op: str, inputs: Sequence, tc: str, entry: str,
        options: MappingOptions | None, derivative: Sequence[str], grad_key: str,
        **extra) -> list[tf.Tensor]:
    inputs = [tf.convert_to_tensor(x) for x in inputs]
    cdef = op_builder.checked_def(tc, entry)
    if options is not None and not isinstance(options, MappingOptions):
        raise TcOptionsError(f"{entry}: options must be a tc.MappingOptions, got "
                             f"{type(options).__name__}")
    options_json = "" if options is None else options.to_json()   # "": the TC's defaults
    derivative_json = json.dumps(list(derivative)) if derivative else ""
    dtypes = tuple(x.dtype.name for x in inputs)
    shapes = tuple(None if x.shape.rank is None else tuple(x.shape.as_list()) for x in inputs)
    scalars = json.dumps(_static_scalars(cdef, inputs), sort_keys=True)
    out_shapes, out_dtypes = _signature(op, tc, entry, options_json, scalars, dtypes, shapes,
                                        extra.get("cuda_arch", DEFAULT_CUDA_ARCH),
                                        derivative_json)
    return raw_op(inputs=inputs, Tout=list(out_dtypes), tc=tc, entry=entry, options=options_json,
                  scalars=scalars, derivative=derivative_json,
                  input_shapes=[tf.TensorShape(s) for s in shapes],
                  output_shapes=[tf.TensorShape(s) for s in out_shapes], grad_key=grad_key,
                  **extra)


def _static_scalars(cdef, inputs: list[tf.Tensor]) -> dict[str, int]:
    scalars = {}
    for p, x in zip(cdef.inputs, inputs):
        if p.name in cdef.structural_scalars:
            v = tf.get_static_value(x)
            if v is None:
                raise TcShapeError(f"{cdef.name}: scalar {p.name} sizes or indexes tensors, so "
                                   "it must be a constant")
            scalars[p.name] = int(v)
    return scalars


@functools.lru_cache(maxsize=1024)
def _signature(op: str, tc: str, entry: str, options: str, scalars: str,
               dtypes: tuple[str, ...], shapes: tuple, cuda_arch: str, derivative: str) -> tuple:
    """(output shapes, output dtypes) of one call, checked as the op will check it; when every
    shape is known the kernel is built now, so a bad call is a TcError here, not at run time."""

    cdef = op_builder.checked_def(tc, entry)
    if derivative:   # the gradients of the inputs named: their shapes and types
        return _derivative_signature(op, tc, entry, options, scalars, dtypes, shapes,
                                     cuda_arch, derivative)
    params = cdef.inputs
    if len(dtypes) != len(params):
        raise TcShapeError(f"{entry} takes {len(params)} input(s) "
                           f"({', '.join(p.name for p in params)}), got {len(dtypes)}")
    for p, dt, shape in zip(params, dtypes, shapes):
        if canonical(dt) != p.dtype:
            raise TcShapeError(f"{entry}: input {p.name} is declared {p.dtype} but got {dt}")
        if p.is_scalar and shape not in (None, ()):
            raise TcShapeError(f"{entry}: scalar argument {p.name} got shape {shape}")
    specs = op_builder.output_specs(cdef, shapes, json.loads(scalars))
    if all(s is not None and None not in s for s in shapes):
        op_builder.build(OpRequest(op, tc, entry, options, scalars,
                                   tuple(p.dtype for p in params), tuple(t for _, t in specs),
                                   tuple(tuple(s) for s in shapes), cuda_arch, derivative))
    return (tuple(s for s, _ in specs),
            tuple(tf.as_dtype(np_dtype(t)) for _, t in specs))


def _derivative_signature(op: str, tc: str, entry: str, options: str, scalars: str,
                          dtypes: tuple[str, ...], shapes: tuple, cuda_arch: str,
                          derivative: str) -> tuple:
    """(output shapes, output dtypes) of a derivative op: one gradient per input named, shaped
    like it.  The backward TC itself is derived at each run's shapes (its statements run over
    the forward's ranges there), and built now when every shape is known."""
    cdef = op_builder.checked_def(tc, entry)
    wrt = op_builder.derivative_wrt(cdef, derivative)
    n_in = len(cdef.inputs)
    if len(dtypes) != n_in + len(cdef.outputs):
        raise TcShapeError(f"{entry}'s gradient takes its {n_in} input(s) and one gradient per "
                           f"output ({len(cdef.outputs)}), got {len(dtypes)}")
    pos = {p.name: k for k, p in enumerate(cdef.inputs)}
    for p, dt in zip(cdef.inputs, dtypes):
        if canonical(dt) != p.dtype:
            raise TcShapeError(f"{entry}: input {p.name} is declared {p.dtype} but got {dt}")
    if all(s is not None and None not in s for s in shapes):
        bwd = op_builder.backward_def(tc, entry, wrt)
        op_builder.build(OpRequest(op, tc, entry, options, scalars,
                                   tuple(canonical(d) or d for d in dtypes),
                                   tuple(bwd.tensors[n].dtype for n in bwd.outputs),
                                   tuple(tuple(s) for s in shapes), cuda_arch, derivative))
    return (tuple(shapes[pos[n]] for n in wrt),
            tuple(tf.as_dtype(np_dtype(cdef.inputs[pos[n]].dtype)) for n in wrt))


# -- TC entry points as TF ops with gradients -------------------------------------------------
class TcFunction:
    """A TC def as a TensorFlow op: ``TcKernel`` on the cpu backend's generated C
    (``backend="cpu"``), or ``TcCudaKernel`` launching the cuda backend's kernels on TF's GPU
    stream (``backend="cuda"``; a TcBackendError where TensorFlow sees no GPU).

    Call it on tensors (eager or inside ``tf.function``; dimensions may be unknown when a graph
    is traced, e.g. a Keras batch): the op carries the TC, and kernels are made per concrete
    shape.  The gradient is a backward TC (run on the same backend): ``backward="auto"`` derives
    it (``grad.backward_tc``), a ``(source, entry)`` pair gives one by hand (parameters: forward
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
        if backend not in ("cpu", "cuda"):
            raise TcBackendError(f"TC {entry}: a TF op runs on backend 'cpu' (TcKernel) or "
                                 f"'cuda' (TcCudaKernel), not {backend!r}")
        self.source, self.entry, self.backend, self.cuda_arch = source, entry, backend, cuda_arch
        self.cdef = op_builder.checked_def(source, entry)
        self.options = options
        self._backward_spec = backward
        self._backward: "TcFunction | None" = None
        floats = tuple(p.name for p in self.cdef.inputs
                       if not p.is_scalar and p.dtype in ("float", "double", "half"))
        self.wrt = floats if wrt is None else tuple(wrt)
        for n in self.wrt:
            if n not in floats:
                raise ValueError(f"TC {entry}: wrt={n!r} is not a floating-point tensor input "
                                 f"(those are {list(floats)})")

    @property
    def backward(self) -> "TcFunction":
        """The backward TC as a TcFunction (derived on first use when ``backward="auto"``)."""
        if self._backward is None:
            spec = self._backward_spec
            if spec is None:
                raise TypeError(f"TC {self.entry} was made without a gradient (backward=None)")
            if spec == "auto":
                b = backward_tc(self.source, self.entry, self.wrt)
                spec = (b.source, b.entry)
            self._backward = TcFunction(spec[0], spec[1], backward=None, options=self.options,
                                        backend=self.backend, cuda_arch=self.cuda_arch)
        return self._backward

    def backward_at(self, *inputs) -> "TcFunction":
        """The backward TC the op runs for inputs like these (derived at their shapes: every
        statement over its forward statement's ranges), as a TcFunction."""
        inputs = [tf.convert_to_tensor(x) for x in inputs]
        shapes = {p.name: tuple(x.shape.as_list()) for p, x in zip(self.cdef.inputs, inputs)
                  if not p.is_scalar}
        options = self.options or MappingOptions.default_for(self.cdef.ast)
        fwd = op_builder.kernel_spec(self.cdef, shapes, _static_scalars(self.cdef, inputs),
                                     options)
        bwd = op_builder.backward_def(self.source, self.entry, self.wrt, fwd.ranges)
        return TcFunction(bwd.source, bwd.name, backward=None, options=self.options,
                          backend=self.backend, cuda_arch=self.cuda_arch)

    def _built(self, inputs: Sequence, op: str):
        """The builder's answer for an ``op`` on inputs like these (made here, now)."""
        inputs = [tf.convert_to_tensor(x) for x in inputs]
        return op_builder.build(OpRequest(
            op, self.source, self.entry, "" if self.options is None else self.options.to_json(),
            json.dumps(_static_scalars(self.cdef, inputs), sort_keys=True),
            tuple(p.dtype for p in self.cdef.inputs),
            tuple(self.cdef.tensors[n].dtype for n in self.cdef.outputs),
            tuple(tuple(x.shape.as_list()) for x in inputs), self.cuda_arch))

    def cuda_spec(self, *inputs) -> CudaLaunchSpec:
        """What the ``TcCudaKernel`` op launches for these inputs (PTX, kernels, grid/block,
        temporaries): the builder's answer, made here; needs nvcc but no GPU."""
        return self._built(inputs, "TcCudaKernel")

    def kernel_source(self, *inputs) -> str:
        """The code the op runs for inputs like these: C (cpu) or CUDA (cuda), generated here
        from the TC as the op's builder generates it."""
        if self.backend == "cuda":
            return self.cuda_spec(*inputs).source
        return self._built(inputs, "TcKernel").kernel.source

    @tf.autograph.experimental.do_not_convert
    def raw(self, *inputs, grad_key: str = "") -> list[tf.Tensor]:
        """The outputs; differentiable (through the registered op gradient) when ``grad_key``
        names this function's gradient."""
        return self._op(inputs, grad_key=grad_key)

    def _op(self, inputs: Sequence, **kwargs) -> list[tf.Tensor]:
        if self.backend == "cuda":
            require_gpu()  # before nvcc runs: without a GPU the op could never execute
            return cuda_kernel_op(inputs, tc=self.source, entry=self.entry, options=self.options,
                                  cuda_arch=self.cuda_arch, **kwargs)
        return kernel_op(inputs, tc=self.source, entry=self.entry, options=self.options,
                         **kwargs)

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

    def gradient(self, inputs: Sequence[tf.Tensor], grads: Sequence,
                 outputs: Sequence[tf.Tensor] | None = None) -> list:
        """d(inputs) from the output gradients, via the backward TC (None for non-``wrt``).

        A derived backward TC (``backward="auto"``) runs as an op that derives it at each run's
        shapes (so dimensions unknown when the graph was traced are fine); a given one runs as
        a plain op.  ``outputs`` (the op's) give the shapes of missing output gradients (zeros).
        """
        if outputs is None:
            outputs = self.raw(*inputs)
        # the backward TC declares each output gradient's type (non-float outputs get zeros)
        types = [tf.as_dtype(np_dtype(p.dtype)) for p in self.backward.cdef.inputs[len(inputs):]]
        dys = [tf.zeros_like(y, t) if g is None else tf.cast(g, t)
               for g, y, t in zip(grads, outputs, types)]
        if self._backward_spec == "auto":
            d = self._op([*inputs, *dys], derivative=self.wrt)
        else:
            d = self.backward.raw(*inputs, *dys)
        res: list = [None] * len(inputs)
        pos = {p.name: i for i, p in enumerate(self.cdef.inputs)}
        for k, name in enumerate(self.wrt):
            res[pos[name]] = d[k]
        return res


# grad_key -> TcFunction.  Entries live as long as the process: a TcFunction is small and a
# graph may be differentiated long after the Python object that built it went away.
_GRADIENTS: dict[str, "TcFunction"] = {}


def _tc_kernel_gradient(op, *grads):
    key = op.get_attr("grad_key").decode()
    entry = op.get_attr("entry").decode()
    if not key:
        raise LookupError(f"{op.type} tc_{entry}: the op has no gradient (its TC was made with "
                          "backward=None)")
    fn = _GRADIENTS.get(key)
    if fn is None:   # a reloaded graph: the op carries its TC, derive the backward TC from it
        options = op.get_attr("options").decode()
        fn = _GRADIENTS[key] = TcFunction(
            op.get_attr("tc").decode(), entry,
            options=MappingOptions.from_json(options) if options else None,
            backend="cuda" if op.type == "TcCudaKernel" else "cpu")
    return fn.gradient(list(op.inputs), list(grads), list(op.outputs))


for _op_type in ("TcKernel", "TcCudaKernel"):
    try:
        tf.RegisterGradient(_op_type)(_tc_kernel_gradient)
    except KeyError:  # module reloaded: the first registration stays
        pass


def tc_function(source: str, entry: str, *, backward="auto", options=None,
                wrt: Sequence[str] | None = None, backend: str = "cpu") -> TcFunction:
    """``TcFunction(source, entry, backward=..., options=..., wrt=..., backend=...)``: a TC
    def as a TF op (``backend="cuda"``: the GPU op, see :class:`TcFunction`).

    ``wrt`` limits the gradient to some inputs (the others get None), e.g. a convolution's
    weights when its input's subscripts (``I(h + kh)``) are not differentiable automatically.

    Example:
        >>> import numpy as np, tensorflow as tf
        >>> f = tc_function("def rs(float(N,K) A) -> (S) { S(n) +=! A(n,k) }", "rs")
        >>> a = tf.ones([2, 3])
        >>> with tf.GradientTape() as tape:
        ...     tape.watch(a)
        ...     loss = tf.reduce_sum(f(a))
        >>> tape.gradient(loss, a).numpy()[0]
        array([1., 1., 1.], dtype=float32)
    """
    return TcFunction(source, entry, backward=backward, options=options, wrt=wrt,
                      backend=backend)
