"""The public face: ``define`` a TC source, call its defs on tensors.

``tc.define(source)`` parses and checks every ``def`` once and returns a :class:`Module`; each
def is an :class:`Entry`, compiled per input-shape signature on first call (JIT, §6.1).

Calling an entry:

- on NumPy arrays: the kernel runs on their buffers (no copy) and returns ``tf.Tensor``s;
- on ``tf.Tensor``/``tf.Variable`` inputs (eager, in ``tf.function``, in Keras): the call *is*
  the TF op of the backend (``TcKernel`` on cpu, ``TcCudaKernel`` on cuda) with its gradient: a
  backward TC derived from the TC (``grad.py``), so ``tf.GradientTape`` differentiates it.  A TC
  whose gradient cannot be derived raises :class:`~.errors.TcGradientError` (line and column)
  when the gradient is asked for, never a ``None``.  The opencl backend has no TF op: eagerly
  its entries are differentiable the same way (the backward TC runs on opencl), inside
  ``tf.function`` they raise ``TcBackendError``;
- ``outputs=[...]``: outputs provided by the caller.  NumPy arrays are written in place,
  ``tf.Variable``s assigned; their contents (tensors too) are what a reduction without ``!``
  reduces into when no earlier statement initialises the output (``MaxVal(n) max= I(n,d)``),
  zeros when ``outputs`` is not given.

Example:
    >>> import numpy as np, tensorflow as tf
    >>> from tfx_vec import tc_ops as tc
    >>> mod = tc.define('''
    ... def tmm(float(M,K) A, float(N,K) B) -> (C) {
    ...     C(m,n) +=! A(m,kk) * B(n,kk)
    ... }''')
    >>> A = np.ones((2, 3), np.float32); B = np.ones((4, 3), np.float32)
    >>> mod.tmm(A, B).numpy().tolist()[0]
    [3.0, 3.0, 3.0, 3.0]
    >>> a = tf.constant(A)
    >>> with tf.GradientTape() as tape:
    ...     tape.watch(a)
    ...     loss = tf.reduce_sum(mod.tmm(a, B))
    >>> tape.gradient(loss, a).numpy().tolist()[0]
    [4.0, 4.0, 4.0]
"""
from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from . import grad as tc_grad
from .autotune import cached_options
from .backends import get_backend
from .errors import TcBackendError, TcError, TcNameError, TcOptionsError, TcShapeError
from .lang import ast as A
from .lang.ranges import Ranges, check_values
from .lang.sema import CheckedDef, check_program
from .lang.types import np_dtype
from .options import MappingOptions
from .pipeline import (INIT_PREFIX, compile_def, generate_source, host_arrays,  # noqa: F401
                       host_view, infer, initial_outputs_tc, output_specs)
from .tf_op import TcFunction

__all__ = ["define", "Module", "Entry", "generate_source", "compile_def"]

#: Backends with a TF op (``tf_op.TcFunction``): what an entry on TF tensors becomes.
_TF_OP_BACKENDS = ("cpu", "cuda")


def define(source: str, backend: str = "cpu", options: MappingOptions | None = None,
           cache: Any = None) -> "Module":
    """Parse and check every ``def`` of ``source``; returns a :class:`Module` of entries.

    Args:
        source: TC text with one or more ``def``.
        backend: a registered backend name ("cpu", "opencl", "cuda").  On ``tf.Tensor``
            inputs a "cpu" entry is the ``TcKernel`` op and a "cuda" entry the
            ``TcCudaKernel`` op (GPU only), both with gradients; "opencl" entries run eagerly
            only (differentiable there too).
        options: default MappingOptions of every entry (None: ``MappingOptions.default_for``).
        cache: an autotuning cache (path or ``CompilationCache``): a call without ``options=``
            first looks up tuned options for its input shapes there.

    Raises:
        TcError: syntax, name, type, semantic and range-inference errors, with line/column.

    Example:
        >>> import numpy as np
        >>> from tfx_vec import tc_ops as tc
        >>> mod = tc.define("def axpy(float a, float(N) X, float(N) Y) -> (Z) "
        ...                 "{ Z(i) = a * X(i) + Y(i) }")
        >>> mod.axpy(np.float32(2), np.ones(3, np.float32), np.ones(3, np.float32)).numpy()
        array([3., 3., 3.], dtype=float32)
        >>> mod.names
        ('axpy',)
    """
    checked = check_program(source)
    get_backend(backend)  # fail early on an unknown backend
    return Module(checked, backend, options, cache)


class Module:
    """The defs of one TC source; ``mod.<name>`` / ``mod["name"]`` is an :class:`Entry`.

    Example:
        >>> from tfx_vec import tc_ops as tc
        >>> mod = tc.define("def f(float(N) A) -> (B) { B(i) = A(i) }  "
        ...                 "def g(float(N) A) -> (B) { B(i) = -A(i) }")
        >>> [e.name for e in mod], mod["g"].backend
        (['f', 'g'], 'cpu')
    """

    def __init__(self, checked: dict, backend: str, options: MappingOptions | None,
                 cache: Any = None):
        self.backend = backend
        self._entries = {name: Entry(cdef, backend, options, cache)
                         for name, cdef in checked.items()}

    def __getattr__(self, name: str) -> "Entry":
        entries = self.__dict__.get("_entries", {})
        if name in entries:
            return entries[name]
        raise AttributeError(f"TC module has no def {name!r} (defs: {', '.join(entries)})")

    def __getitem__(self, name: str) -> "Entry":
        try:
            return self._entries[name]
        except KeyError:
            raise TcNameError(f"TC module has no def {name!r} "
                              f"(defs: {', '.join(self._entries)})") from None

    def __iter__(self):
        return iter(self._entries.values())

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)


class Entry:
    """One TC def, callable on tensors: ``entry(*inputs, options=None, outputs=None)``.

    See the module docstring for what a call does on NumPy arrays, on TF tensors and with
    ``outputs=``.

    Example:
        >>> import numpy as np
        >>> from tfx_vec import tc_ops as tc
        >>> acc = tc.define("def acc(float(N,K) A) -> (S) { S(n) += A(n,k) }").acc
        >>> S = np.ones(2, np.float32)                   # reduced into, in place
        >>> _ = acc(np.ones((2, 3), np.float32), outputs=[S])
        >>> S.tolist()
        [4.0, 4.0]
    """

    def __init__(self, cdef: CheckedDef, backend: str, options: MappingOptions | None,
                 cache: Any = None):
        self.cdef, self.backend, self.cache = cdef, backend, cache
        self.options = options or MappingOptions.default_for(cdef.ast)
        self._compiled: dict = {}
        self._last = None
        self._lock = threading.Lock()
        self._index_inputs = cdef.index_inputs
        self._params = cdef.inputs

    @property
    def name(self) -> str:
        return self.cdef.name

    def __repr__(self) -> str:
        return f"<TC entry {self.name} ({self.backend})>"

    # -- inputs ----------------------------------------------------------------------------
    def _convert(self, args: Sequence[Any]) -> list[np.ndarray]:
        return host_arrays(self.cdef, args)

    def _check_count(self, args: Sequence[Any]) -> None:
        if len(args) != len(self._params):
            raise TcShapeError(f"{self.name} takes {len(self._params)} input(s) "
                               f"({', '.join(p.name for p in self._params)}), got {len(args)}")

    def _key_and_scalars(self, arrays: list[np.ndarray]) -> tuple[tuple, dict]:
        shapes = tuple(a.shape for a in arrays)
        scalars = {p.name: int(a) for p, a in zip(self._params, arrays)
                   if p.name in self.cdef.structural_scalars}
        return (shapes, tuple(sorted(scalars.items()))), scalars

    def _prepare(self, arrays: list[np.ndarray], options: MappingOptions):
        if not isinstance(options, MappingOptions):
            raise TcOptionsError(f"{self.name}: options must be a tc.MappingOptions, "
                                 f"got {type(options).__name__}")
        key, scalars = self._key_and_scalars(arrays)
        full = key + (options,)     # frozen dataclass: hashable, equal options share a kernel
        hit = self._compiled.get(full)
        if hit is None:
            shapes = {p.name: a.shape for p, a in zip(self._params, arrays) if not p.is_scalar}
            with self._lock:
                hit = self._compiled.get(full)
                if hit is None:
                    hit = compile_def(self.cdef, shapes, scalars, self.backend, options)
                    self._compiled[full] = hit
        self._check_values(arrays, hit[1])
        self._last = hit[0]
        return hit

    def _check_values(self, arrays: list[np.ndarray], ranges: Ranges) -> None:
        """Index values change per call: check the data-dependent subscripts every time."""
        if self._index_inputs:
            values = {p.name: ((int(a.min()), int(a.max())) if a.size else (0, 0))
                      for p, a in zip(self._params, arrays) if p.name in self._index_inputs}
            check_values(self.cdef, ranges, values)

    def compile(self, *inputs: Any, options: MappingOptions | None = None):
        """Compile for these inputs (or anything with their shapes) without running."""
        kernel, _ = self._prepare(self._convert(inputs), options or self._default_options(inputs))
        return kernel

    def _default_options(self, inputs: Sequence[Any]) -> MappingOptions:
        """Tuned options from ``cache`` for these input shapes if any, else the entry's."""
        if self.cache is not None:
            tuned = cached_options(self, *inputs, cache=self.cache)
            if tuned is not None:
                return tuned
        return self.options

    # -- outputs ---------------------------------------------------------------------------
    def _output_buffers(self, ranges: Ranges, outputs: Sequence[Any] | None) -> list[np.ndarray]:
        """The arrays the kernel writes: the caller's NumPy arrays themselves (in place),
        copies of other given outputs (their contents are the initial values), else zeros."""
        specs = output_specs(self.cdef, ranges)
        given = self._given_outputs(outputs, specs)
        bufs = []
        for (name, shape, dtype), x in zip(specs, given):
            if x is None:
                bufs.append(np.zeros(shape, dtype))
            elif isinstance(x, np.ndarray):
                if not (x.flags.c_contiguous and x.flags.writeable):
                    raise TcShapeError(f"{self.name}: outputs= array for {name} must be "
                                       "writable and C-contiguous (it is written in place)")
                bufs.append(x)
            else:
                bufs.append(np.array(host_view(tf.convert_to_tensor(x)), dtype, copy=True))
        return bufs

    def _given_outputs(self, outputs: Sequence[Any] | None, specs: list) -> list:
        """``outputs`` checked against the inferred output specs (None: one None per output)."""
        if outputs is None:
            return [None] * len(specs)
        if not isinstance(outputs, (list, tuple)):
            outputs = [outputs]
        if len(outputs) != len(specs):
            raise TcShapeError(f"{self.name}: outputs= has {len(outputs)} tensor(s) but the TC "
                               f"has {len(specs)} output(s) ({', '.join(n for n, _, _ in specs)})")
        for (name, shape, dtype), x in zip(specs, outputs):
            if x is None:
                continue
            xs = tuple(x.shape)
            xd = np.dtype(x.dtype.as_numpy_dtype if isinstance(x.dtype, tf.DType) else x.dtype)
            if xs != tuple(shape) or xd != dtype:
                raise TcShapeError(f"{self.name}: outputs= tensor for {name} has shape {xs} and "
                                   f"dtype {xd}; the TC computes shape {tuple(shape)}, {dtype}")
        return list(outputs)

    @staticmethod
    def _assign_variables(outputs: Sequence[Any] | None, results: Sequence[Any]) -> None:
        for x, r in zip(outputs or (), results):
            if isinstance(x, tf.Variable):
                x.assign(r)

    # -- running ---------------------------------------------------------------------------
    def run_numpy(self, *inputs: Any, options: MappingOptions | None = None,
                  outputs: Sequence[Any] | None = None) -> tuple[np.ndarray, ...]:
        """Run and return the outputs as NumPy arrays (in ``-> (...)`` order); ``outputs``
        as for a call (NumPy arrays given there are the arrays returned, written in place)."""
        arrays = self._convert(inputs)
        kernel, ranges = self._prepare(arrays, options or self._default_options(inputs))
        outs = self._output_buffers(ranges, outputs)
        kernel.run(arrays + outs)
        return tuple(outs)

    def __call__(self, *inputs: Any, options: MappingOptions | None = None,
                 outputs: Sequence[Any] | None = None):
        """Run on tf.Tensor/NumPy inputs; one ``tf.Tensor`` per output (a tuple if several).

        TF tensors make the call the backend's TF op, with its gradient (module docstring)."""
        if options is not None and not isinstance(options, MappingOptions):
            raise TcOptionsError(f"{self.name}: options must be a tc.MappingOptions, "
                                 f"got {type(options).__name__}")
        uses_tf = any(isinstance(x, (tf.Tensor, tf.Variable)) for x in inputs)
        if uses_tf or not tf.executing_eagerly():
            if self.cdef.inout:
                res = self._call_with_initial_outputs(inputs, options, outputs)
            elif self.backend in _TF_OP_BACKENDS:
                res = self._op_call(inputs, options, outputs)
            elif tf.executing_eagerly():
                res = self._eager_differentiable_call(inputs, options, outputs)
            else:
                raise TcBackendError(
                    f"{self.name}: backend {self.backend!r} has no TF op, so it cannot run "
                    f"inside tf.function; call the entry eagerly, or define it with "
                    f"backend='cpu' (the TcKernel op) or backend='cuda' (the TcCudaKernel op, "
                    "on a GPU)")
        else:
            res = tuple(tf.convert_to_tensor(o) for o in
                        self.run_numpy(*inputs, options=options, outputs=outputs))
        self._assign_variables(outputs, res)
        return res[0] if len(res) == 1 else res

    def _tensors(self, inputs: Sequence[Any]) -> list[tf.Tensor]:
        self._check_count(inputs)
        out = []
        for p, x in zip(self._params, inputs):
            want = _tf_dtype(p.dtype)
            out.append(x if isinstance(x, tf.Tensor) and x.dtype == want
                       else tf.convert_to_tensor(x, dtype=want))
        return out

    def _call_with_initial_outputs(self, inputs: Sequence[Any], options: MappingOptions | None,
                                   outputs: Sequence[Any] | None) -> tuple:
        """A def that reduces into its outputs' initial contents, on TF tensors: the same def
        taking those contents as inputs (``pipeline.initial_outputs_tc``), so the TF op
        computes it and the gradient reaches the initial values too."""
        tensors = self._tensors(inputs)
        ranges = self._static_ranges(tensors)
        given = self._given_outputs(outputs, output_specs(self.cdef, ranges))
        source = initial_outputs_tc(self.cdef, ranges)
        key = ("initial outputs", source)
        entry = self._compiled.get(key)
        if entry is None:
            entry = self._compiled[key] = Entry(check_program(source)[self.name], self.backend,
                                                self.options, self.cache)
        init = [_initial_value(given[self.cdef.outputs.index(n)], n, ranges, self.cdef)
                for n in self.cdef.inout]
        res = entry(*tensors, *init, options=options)
        self._last = entry._last
        return res if isinstance(res, tuple) else (res,)

    def _op_call(self, inputs: Sequence[Any], options: MappingOptions | None,
                 outputs: Sequence[Any] | None) -> tuple:
        """The backend's TF op on these inputs."""
        tensors = self._tensors(inputs)
        options = options or self._default_options(tensors)
        if outputs is not None:        # checked; no output is read before it is written
            self._given_outputs(outputs, output_specs(self.cdef, self._static_ranges(tensors)))
        if tf.executing_eagerly() and self._index_inputs:
            # ids are known now: check them (in graphs the op clamps them into range)
            self._check_values(self._convert(tensors), self._static_ranges(tensors))
        fn = self._tf_function(self.cdef.source, options)
        res = fn(*tensors)
        specs = [tf.TensorSpec(x.shape, x.dtype) for x in tensors]
        self._last = _OpSource(lambda: fn.kernel_source(*(tf.zeros(s.shape, s.dtype)
                                                           for s in specs)))
        return res if isinstance(res, tuple) else (res,)

    def _static_ranges(self, tensors: Sequence[tf.Tensor]) -> Ranges:
        shapes, scalars = {}, {}
        for p, x in zip(self._params, tensors):
            if p.is_scalar:
                if p.name in self.cdef.structural_scalars:
                    v = tf.get_static_value(x)
                    if v is None:
                        raise TcShapeError(f"{self.name}: scalar {p.name} sizes or indexes "
                                           "tensors, so it must be a constant")
                    scalars[p.name] = int(v)
            elif not x.shape.is_fully_defined():
                raise TcShapeError(f"{self.name}: input {p.name} has a shape {x.shape} that is "
                                   "not fully known")
            else:
                shapes[p.name] = tuple(x.shape)
        return infer(self.cdef, shapes, scalars, {n: (0, 0) for n in self._index_inputs})

    def _tf_function(self, source: str, options: MappingOptions) -> TcFunction:
        """The TF op wrapper for ``source`` (this def, or its initial-outputs form) and options,
        made once."""
        key = ("op", source, options)
        fn = self._compiled.get(key)
        if fn is None:
            with self._lock:
                fn = self._compiled.get(key)
                if fn is None:
                    fn = self._compiled[key] = TcFunction(source, self.name, options=options,
                                                          backend=self.backend)
        return fn

    def _eager_differentiable_call(self, inputs: Sequence[Any], options: MappingOptions | None,
                                   outputs: Sequence[Any] | None) -> tuple:
        """A backend without TF op, eagerly: the kernel run with ``tf.custom_gradient``, whose
        gradient runs the derived backward TC on the same backend."""
        tensors = self._tensors(inputs)
        if outputs is not None:
            self._given_outputs(outputs, output_specs(self.cdef, self._static_ranges(tensors)))

        @tf.custom_gradient
        def run(*xs):
            outs = tuple(tf.convert_to_tensor(o) for o in self.run_numpy(*xs, options=options))

            def backward(*dys):
                return self._backward(xs, dys, options)
            return outs, backward
        return tuple(run(*tensors))

    def _backward(self, xs: Sequence[tf.Tensor], dys: Sequence[Any], options) -> list:
        """d(inputs) from the outputs' gradients through the derived backward TC."""
        ranges = self._static_ranges(list(xs))
        key = ("backward", ranges.key())
        bwd = self._compiled.get(key)
        if bwd is None:
            b = tc_grad.backward_tc(self.cdef.source, self.name, ranges=ranges)
            bwd = self._compiled[key] = (b, Entry(check_program(b.source)[b.entry],
                                                  self.backend, options, None))
        b, entry = bwd
        types = [np_dtype(p.dtype) for p in entry.cdef.inputs[len(xs):]]
        dys = [np.zeros(s, t) if g is None else np.asarray(g, t) for g, (_, s, _), t in
               zip(dys, output_specs(self.cdef, ranges), types)]
        ds = entry.run_numpy(*xs, *dys)
        pos = {name: k for k, name in enumerate(b.wrt)}
        return [tf.convert_to_tensor(ds[pos[p.name]]) if p.name in pos else None
                for p in self._params]

    # -- inspection ------------------------------------------------------------------------
    def source(self) -> str:
        """The generated code for the last compiled sizes."""
        if self._last is None:
            raise TcError(f"{self.name} has not been compiled yet: call it (or .compile) first")
        return self._last.source

    def output_shapes(self, *input_shapes: Sequence[int], scalars: dict | None = None
                      ) -> tuple[tuple[int, ...], ...]:
        """Inferred output shapes for the given input tensor shapes (no compilation)."""
        tensor_params = [p for p in self._params if not p.is_scalar]
        shapes = {p.name: tuple(s) for p, s in zip(tensor_params, input_shapes)}
        r = infer(self.cdef, shapes, scalars)
        return tuple(r.shapes[n] for n in self.cdef.outputs)


class _OpSource:
    """The code an entry's TF op carries, generated when asked for (``Entry.source``)."""

    def __init__(self, make):
        self._make = make

    @property
    def source(self) -> str:
        return self._make()


def _initial_value(x: Any, name: str, ranges: Ranges, cdef: CheckedDef) -> tf.Tensor:
    """The initial contents of output ``name`` for the op (zeros when not given)."""
    dtype = _tf_dtype(cdef.tensors[name].dtype)
    if x is None:
        return tf.zeros(ranges.shapes[name], dtype)
    return tf.convert_to_tensor(x.read_value() if isinstance(x, tf.Variable) else x, dtype)


def _tf_dtype(t: str) -> tf.DType:
    return tf.as_dtype(np_dtype(t))
