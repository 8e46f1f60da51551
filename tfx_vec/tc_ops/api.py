"""The public entry point: ``define`` a TC source, call its defs on tensors.

The pipeline, once per definition (at ``define``): parse -> check (names, types, TC rules, the
range-inference plan); once per input-shape signature (JIT): infer ranges at those sizes ->
backend compile (poly kernel, schedule, code, compiled object, cached); per call: convert inputs
(NumPy views of the TF tensors, no copy when already contiguous), check shapes/dtypes, run,
return ``tf.Tensor`` outputs.

Example:
    >>> import numpy as np
    >>> from tfx_vec import tc_ops as tc
    >>> mod = tc.define('''
    ... def tmm(float(M,K) A, float(N,K) B) -> (C) {
    ...     C(m,n) +=! A(m,kk) * B(n,kk)
    ... }''')
    >>> A = np.ones((2, 3), np.float32); B = np.ones((4, 3), np.float32)
    >>> mod.tmm(A, B).numpy().tolist()[0]
    [3.0, 3.0, 3.0, 3.0]
    >>> "void tc_tmm(void* const* args)" in mod.tmm.source()
    True
"""
from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

from . import lang
from .backends import KernelSpec, get_backend
from .errors import TcBackendError, TcError, TcNameError, TcOptionsError, TcShapeError
from .lang import ast as A
from .lang.ranges import Ranges, check_values, infer_ranges
from .lang.sema import CheckedDef, check
from .lang.types import np_dtype
from .options import MappingOptions

__all__ = ["define", "Module", "Entry", "generate_source", "compile_def"]

#: Backends with a TF op (``tf_op.TcFunction``): what an entry becomes inside ``tf.function``.
_TF_OP_BACKENDS = ("cpu", "cuda")


def define(source: str, backend: str = "cpu", options: MappingOptions | None = None,
           cache: Any = None) -> "Module":
    """Parse and check every ``def`` of ``source``; returns a :class:`Module` of entries.

    Args:
        source: TC text with one or more ``def``.
        backend: a registered backend name ("cpu"; "cuda"/"opencl" when registered).  Inside
            ``tf.function`` a "cpu" entry is the ``TcKernel`` op and a "cuda" entry the
            ``TcCudaKernel`` op (GPU only); "opencl" entries run eagerly only.
        options: default MappingOptions of every entry (None: ``MappingOptions.default_for``).
        cache: an autotuning cache (path or ``CompilationCache``): a call without ``options=``
            first looks up tuned options for its input shapes there.

    Raises:
        TcError: syntax, name, type, semantic and range-inference errors, with line/column.
    """
    prog = lang.parse(source)
    seen = set()
    for d in prog.defs:
        if d.name in seen:
            raise TcNameError(f"def {d.name} is defined twice", d.span, source)
        seen.add(d.name)
    get_backend(backend)  # fail early on an unknown backend
    return Module(prog, backend, options, cache)


class Module:
    """The defs of one TC source; ``mod.<name>`` / ``mod["name"]`` is an :class:`Entry`."""

    def __init__(self, program: A.Program, backend: str, options: MappingOptions | None,
                 cache: Any = None):
        self.program, self.backend = program, backend
        self._entries = {d.name: Entry(check(d, program.source), backend, options, cache)
                         for d in program.defs}

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


def _index_inputs(cdef: CheckedDef) -> tuple[str, ...]:
    """Input tensors whose values are used as subscripts (checked against bounds per call)."""
    names = []
    for cs in cdef.stmts:
        for r in cs.reads:
            for a in r.args:
                for x in A.walk(a):
                    if isinstance(x, A.Call) and x.name in cdef.tensors and \
                            cdef.tensors[x.name].kind == "input":
                        names.append(x.name)
    return tuple(dict.fromkeys(names))


def compile_def(cdef: CheckedDef, shapes: dict, scalars: dict | None = None,
                backend: str = "cpu", options: MappingOptions | None = None,
                value_ranges: dict | None = None):
    """Infer ranges at ``shapes`` and compile with ``backend``; returns (kernel, ranges)."""
    ranges = infer_ranges(cdef, shapes, scalars, value_ranges)
    options = options or MappingOptions.default_for(cdef.ast)
    return get_backend(backend).compile(KernelSpec(cdef, ranges, options)), ranges


def generate_source(source: str, entry: str, input_shapes: Sequence[Sequence[int]],
                    backend: str = "cpu", options: MappingOptions | None = None,
                    scalars: dict | None = None) -> str:
    """The code ``backend`` generates for def ``entry`` at the given input shapes.

    ``input_shapes`` lists the shapes of the tensor parameters in signature order;
    ``scalars`` gives the int scalar arguments that subscripts depend on.
    """
    cdef = define(source, backend=backend)[entry].cdef
    tensor_params = [p for p in cdef.inputs if not p.is_scalar]
    if len(input_shapes) != len(tensor_params):
        raise TcShapeError(f"{entry}: expected {len(tensor_params)} input shapes "
                           f"({', '.join(p.name for p in tensor_params)}), got {len(input_shapes)}")
    shapes = {p.name: tuple(s) for p, s in zip(tensor_params, input_shapes)}
    kernel, _ = compile_def(cdef, shapes, scalars, backend, options)
    return kernel.source


def _host_view(t: Any) -> np.ndarray:
    """A NumPy view of an eager CPU tensor's buffer (``.numpy()`` would copy it)."""
    view = getattr(t, "_numpy", None)     # EagerTensor: shares memory; kernels only read inputs
    if view is not None:
        try:
            return view()
        except Exception:  # noqa: BLE001 - e.g. a non-CPU tensor: fall back to the copy
            pass
    return t.numpy()


class Entry:
    """One TC def, callable on tensors: ``entry(*inputs, options=None)``."""

    def __init__(self, cdef: CheckedDef, backend: str, options: MappingOptions | None,
                 cache: Any = None):
        self.cdef, self.backend, self.cache = cdef, backend, cache
        self.options = options or MappingOptions.default_for(cdef.ast)
        self._compiled: dict = {}
        self._last = None
        self._lock = threading.Lock()
        self._index_inputs = _index_inputs(cdef)
        self._params = cdef.inputs

    @property
    def name(self) -> str:
        return self.cdef.name

    def __repr__(self) -> str:
        return f"<TC entry {self.name} ({self.backend})>"

    def _convert(self, args: Sequence[Any]) -> list[np.ndarray]:
        if len(args) != len(self._params):
            raise TcShapeError(f"{self.name} takes {len(self._params)} input(s) "
                               f"({', '.join(p.name for p in self._params)}), got {len(args)}")
        out = []
        for p, x in zip(self._params, args):
            want = np_dtype(p.dtype)
            if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
                x = _host_view(x)
            if p.is_scalar:
                arr = np.asarray(x)
                if arr.ndim != 0:
                    raise TcShapeError(f"{self.name}: scalar argument {p.name} got an array of "
                                       f"shape {arr.shape}")
                try:
                    out.append(np.array(arr, dtype=want))
                except (TypeError, ValueError) as e:
                    raise TcShapeError(f"{self.name}: scalar argument {p.name} is declared "
                                       f"{p.dtype}, got {x!r}") from e
                continue
            arr = np.asarray(x)
            if arr.dtype != want:
                raise TcShapeError(f"{self.name}: input {p.name} is declared {p.dtype} "
                                   f"({want}) but got dtype {arr.dtype}")
            # (np.ascontiguousarray would turn a 0-d array into shape (1,))
            out.append(arr if arr.flags.c_contiguous else np.ascontiguousarray(arr))
        return out

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
        if self._index_inputs:       # index values change per call: check them every time
            values = {p.name: ((int(a.min()), int(a.max())) if a.size else (0, 0))
                      for p, a in zip(self._params, arrays) if p.name in self._index_inputs}
            check_values(self.cdef, hit[1], values)
        self._last = hit[0]
        return hit

    def compile(self, *inputs: Any, options: MappingOptions | None = None):
        """Compile for these inputs (or anything with their shapes) without running."""
        kernel, _ = self._prepare(self._convert(inputs), options or self._default_options(inputs))
        return kernel

    def _default_options(self, inputs: Sequence[Any]) -> MappingOptions:
        """Tuned options from ``cache`` for these input shapes if any, else the entry's."""
        if self.cache is not None:
            from .autotune import cached_options
            tuned = cached_options(self, *inputs, cache=self.cache)
            if tuned is not None:
                return tuned
        return self.options

    def run_numpy(self, *inputs: Any, options: MappingOptions | None = None
                  ) -> tuple[np.ndarray, ...]:
        """Run and return the outputs as NumPy arrays (in ``-> (...)`` order)."""
        arrays = self._convert(inputs)
        kernel, ranges = self._prepare(arrays, options or self._default_options(inputs))
        outs = [np.zeros(ranges.shapes[n], np_dtype(self.cdef.tensors[n].dtype))
                for n in self.cdef.outputs]
        kernel.run(arrays + outs)
        return tuple(outs)

    def __call__(self, *inputs: Any, options: MappingOptions | None = None):
        """Run on tf.Tensor/NumPy inputs; one ``tf.Tensor`` per output (a tuple if several).

        Inside ``tf.function`` (symbolic inputs) the call becomes a TF op of ``tf_op.py`` with a
        gradient, so entries compose with graphs: ``TcKernel`` (the generated C) for the cpu
        backend, ``TcCudaKernel`` (the generated CUDA as PTX, launched on TF's GPU stream) for
        the cuda backend.  Other backends have no TF op and raise ``TcBackendError`` there.
        """
        import tensorflow as tf
        if not tf.executing_eagerly() or any(
                isinstance(x, tf.Tensor) and not hasattr(x, "_numpy") for x in inputs):
            return self._graph_call(inputs, options)
        outs = self.run_numpy(*inputs, options=options)
        res = tuple(tf.convert_to_tensor(o) for o in outs)
        return res[0] if len(res) == 1 else res

    def _graph_call(self, inputs: Sequence[Any], options: MappingOptions | None):
        if self.backend not in _TF_OP_BACKENDS:
            raise TcBackendError(
                f"{self.name}: backend {self.backend!r} has no TF op, so it cannot run inside "
                f"tf.function; call the entry eagerly, or define it with backend='cpu' "
                f"(the TcKernel op) or backend='cuda' (the TcCudaKernel op, on a GPU)")
        if options is not None and not isinstance(options, MappingOptions):
            raise TcOptionsError(f"{self.name}: options must be a tc.MappingOptions, "
                                 f"got {type(options).__name__}")
        from .tf_op import tc_function
        options = options or self.options
        key = ("graph", self.backend, options)   # one TF op function per backend and mapping
        fn = self._compiled.get(key)
        if fn is None:
            with self._lock:
                fn = self._compiled.get(key)
                if fn is None:
                    fn = self._compiled[key] = tc_function(self.cdef.source, self.name,
                                                           options=options, backend=self.backend)
        return fn(*inputs)

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
        r: Ranges = infer_ranges(self.cdef, shapes, scalars)
        return tuple(r.shapes[n] for n in self.cdef.outputs)


