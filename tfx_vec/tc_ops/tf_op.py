"""A Tensor Comprehension as a real TensorFlow op.

One generic op library (``tf_op/tc_kernel_op.cc``) is compiled once against TensorFlow's own
headers (``tf.sysconfig`` flags), cached under :func:`tfx_vec.tc_ops.cache.cache_root` (rebuilt
when its source, TF version or flags change) and loaded with ``tf.load_op_library``.  Its op,
``TcKernel``, carries the kernel's C source and hash as attributes; at graph construction it
compiles (or finds in the cache) the shared object, dlopens it and later calls
``tc_<entry>(void* const* args)`` on the tensors' buffers, inputs then outputs.  No Python runs
when the op executes, so it works in eager, in ``tf.function``, in Keras models and after a
SavedModel reload (load the library first: :func:`load_op_library`).

Stages: :func:`load_op_library` (build/load the library) → :func:`kernel_op` (one call of a
compiled C kernel, any ABI-conforming source) → :func:`tc_op` (a TC entry point: generated C
from the cpu backend, a gradient from backward TCs via ``tf.custom_gradient``).

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
import hashlib
import os
import subprocess
import tempfile
import threading
from typing import Sequence

import tensorflow as tf

from .cache import cache_root

__all__ = ["load_op_library", "kernel_op", "source_hash", "DEFAULT_C_FLAGS", "OpLibraryError",
           "TcFunction", "tc_function"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_OP_SOURCE = os.path.join(_HERE, "tf_op", "tc_kernel_op.cc")
DEFAULT_C_FLAGS = "-O3 -march=native -fopenmp -fPIC -shared -lm"

_lock = threading.Lock()
_library = None


class OpLibraryError(RuntimeError):
    """The generic TC op library could not be built or loaded."""


def _library_path() -> tuple[str, list[str]]:
    with open(_OP_SOURCE, "rb") as f:
        text = f.read()
    cflags, lflags = tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()
    digest = hashlib.sha256(
        b"\0".join([text, tf.__version__.encode(), " ".join(cflags + lflags).encode()])
    ).hexdigest()[:20]
    out = os.path.join(cache_root(), "ops", f"tc_kernel_op-{digest}.so")
    cmd = ["g++", "-O2", "-fPIC", "-shared", *cflags, _OP_SOURCE, "-o", "{OUT}", *lflags, "-ldl"]
    return out, cmd


def load_op_library():
    """Build (once, cached on disk) and load the generic ``TcKernel`` op library.

    Returns the module of ``tf.load_op_library``; its ``tc_kernel`` is the raw op.

    >>> lib = load_op_library(); callable(lib.tc_kernel)
    True
    """
    global _library
    with _lock:
        if _library is not None:
            return _library
        out, cmd = _library_path()
        if not os.path.exists(out):
            os.makedirs(os.path.dirname(out), exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(out))
            os.close(fd)
            cmd = [tmp if c == "{OUT}" else c for c in cmd]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                os.unlink(tmp)
                raise OpLibraryError(
                    f"building the TcKernel op library failed:\n{' '.join(cmd)}\n{proc.stderr}")
            os.replace(tmp, out)  # atomic: a concurrent builder's result is equivalent
        try:
            _library = tf.load_op_library(out)
        except Exception as e:  # a truncated/foreign file: rebuild once
            os.unlink(out)
            raise OpLibraryError(f"loading {out} failed ({e}); removed it, call again") from e
        return _library


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
    """A TC def as a TensorFlow op (the ``TcKernel`` op on the cpu backend's generated C).

    Call it on tensors (eager or inside ``tf.function``; static shapes required): the C source is
    generated once per input signature and options, and travels in the op.  The gradient is a
    backward TC: ``backward="auto"`` derives it (``grad.backward_tc``), a ``(source, entry)``
    pair gives one by hand (parameters: forward inputs, then one gradient per forward output;
    returns one gradient per floating-point tensor input), ``None`` makes the op
    non-differentiable.

    Example::

        f = TcFunction("def tmm(float(M,K) A, float(N,K) B) -> (C) "
                       "{ C(m,n) +=! A(m,kk) * B(n,kk) }", "tmm")
        with tf.GradientTape() as tape:
            tape.watch(A)
            C = f(A, B)
        dA = tape.gradient(C, A)
    """

    def __init__(self, source: str, entry: str, *, backward="auto", options=None,
                 wrt: Sequence[str] | None = None):
        from .api import define

        self.source, self.entry = source, entry
        self.cdef = define(source)[entry].cdef
        self.options = options
        self._specs: dict = {}
        self._lock = threading.Lock()
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
                from .grad import backward_tc
                b = backward_tc(self.source, self.entry, self.wrt)
                spec = (b.source, b.entry)
            self._backward = TcFunction(spec[0], spec[1], backward=None, options=self.options)
        return self._backward

    def _kernel(self, inputs: list[tf.Tensor]) -> tuple:
        """(C source, output shapes, output dtypes, compiler, flags, hash) for these inputs."""
        from .backends import KernelSpec
        from .backends.cpu import CFLAGS, compiler, kernel_source
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
            hit = self._specs.get(key)
            if hit is None:
                values = {n: (0, 0) for n in _index_inputs(self.cdef)}
                ranges = infer_ranges(self.cdef, shapes, scalars, values)
                # Index values are unknown when the graph is built and no Python runs later:
                # data-dependent subscripts are clamped into their tensor in the kernel, so a
                # bad id reads the nearest valid element instead of out of bounds.
                ranges = dataclasses.replace(ranges, clamp=ranges.clamp | _data_dependent_reads(
                    self.cdef))
                options = self.options or MappingOptions.default_for(self.cdef.ast)
                src = kernel_source(KernelSpec(self.cdef, ranges, options))
                outs = [ranges.shapes[n] for n in self.cdef.outputs]
                dts = [tf.as_dtype(np_dtype(self.cdef.tensors[n].dtype))
                       for n in self.cdef.outputs]
                cc, flags = compiler(), " ".join(CFLAGS) + " -lm"
                hit = self._specs[key] = (src, outs, dts, cc, flags, source_hash(src, cc, flags))
        return hit

    @tf.autograph.experimental.do_not_convert
    def raw(self, *inputs, grad_key: str = "") -> list[tf.Tensor]:
        """The outputs; differentiable (through the registered ``TcKernel`` gradient) when
        ``grad_key`` names this function's gradient."""
        inputs = [tf.convert_to_tensor(x) for x in inputs]
        src, shapes, dtypes, cc, flags, h = self._kernel(inputs)
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
        outs_like = [g for g in grads]
        dys = [tf.zeros(s, d) if g is None else g
               for g, s, d in zip(outs_like, *self._out_specs(inputs))]
        d = self.backward.raw(*inputs, *dys)
        res: list = [None] * len(inputs)
        pos = {p.name: i for i, p in enumerate(self.cdef.inputs)}
        for k, name in enumerate(self.wrt):
            res[pos[name]] = d[k]
        return res

    def _out_specs(self, inputs: Sequence[tf.Tensor]) -> tuple[list, list]:
        _, shapes, dtypes, *_ = self._kernel([tf.convert_to_tensor(x) for x in inputs])
        return shapes, dtypes


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


try:
    tf.RegisterGradient("TcKernel")(_tc_kernel_gradient)
except KeyError:  # module reloaded: the first registration stays
    pass


def _data_dependent_reads(cdef) -> frozenset:
    from .lang import ast as A
    return frozenset(id(x) for cs in cdef.stmts for x in cs.reads
                     if any(isinstance(y, A.Call) for a in x.args for y in A.walk(a)))


def _index_inputs(cdef) -> tuple[str, ...]:
    from .api import _index_inputs as f
    return f(cdef)


def tc_function(source: str, entry: str, *, backward="auto", options=None,
                wrt: Sequence[str] | None = None) -> TcFunction:
    """``TcFunction(source, entry, backward=..., options=..., wrt=...)``: a TC def as a TF op.

    ``wrt`` limits the gradient to some inputs (the others get None), e.g. a convolution's
    weights when its input's subscripts (``I(h + kh)``) are not differentiable automatically.
    """
    return TcFunction(source, entry, backward=backward, options=options, wrt=wrt)
