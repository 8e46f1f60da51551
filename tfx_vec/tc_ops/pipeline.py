"""The compile stage: a checked TC def at concrete input shapes -> a backend's kernel.

Everything that turns a :class:`~.lang.sema.CheckedDef` into something runnable goes through
here: the public face (``api``), the TF op (``tf_op``), the autotuner and the Keras layers call
these functions, never each other's internals.

1. :func:`infer` -- range inference at the inputs' shapes (``lang.ranges``);
2. :func:`compile_def` -- the backend's ``compile`` on a :class:`~.backends.KernelSpec`;
3. :func:`output_specs` -- shape and dtype of every output (what callers allocate).

:func:`initial_outputs_tc` rewrites a def whose outputs are reduced into without ``!`` (they start
from the caller's values) into one taking those values as extra inputs, so the TF op, which
allocates its outputs, computes the same thing (and its gradient reaches the initial values).

Example:
    >>> from tfx_vec.tc_ops.lang.sema import check_program
    >>> cdef = check_program("def tmm(float(M,K) A, float(N,K) B) -> (C) "
    ...                      "{ C(m,n) +=! A(m,kk) * B(n,kk) }")["tmm"]
    >>> kernel, ranges = compile_def(cdef, {"A": (4, 3), "B": (5, 3)})
    >>> [(name, shape) for name, shape, _ in output_specs(cdef, ranges)]
    [('C', (4, 5))]
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .backends import KernelSpec, get_backend
from .errors import TcShapeError
from .lang.printer import def_to_tc
from .lang.ranges import Ranges, infer_ranges
from .lang.sema import CheckedDef, check_program
from .lang.types import np_dtype
from .options import MappingOptions

__all__ = ["infer", "compile_def", "output_specs", "generate_source", "tensor_shapes",
           "host_arrays", "host_view", "initial_outputs_tc", "INIT_PREFIX"]

#: Extra inputs of :func:`initial_outputs_tc` are named ``INIT_PREFIX + output``.
INIT_PREFIX = "tc__init_"


def infer(cdef: CheckedDef, shapes: Mapping[str, tuple], scalars: Mapping[str, int] | None = None,
          value_ranges: Mapping[str, tuple] | None = None) -> Ranges:
    """Sizes, shapes and index ranges of ``cdef`` at these input shapes (``lang.ranges``).

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> cdef = check_program("def sh(float(N) A) -> (B) "
        ...                      "{ B(i) = A(i + 1) where i in 0:N-1 }")["sh"]
        >>> r = infer(cdef, {"A": (5,)})
        >>> r.shapes["B"], r.stmt_ranges[0]
        ((4,), {'i': (0, 4)})
    """
    return infer_ranges(cdef, shapes, scalars, value_ranges)


def compile_def(cdef: CheckedDef, shapes: Mapping[str, tuple], scalars: dict | None = None,
                backend: str = "cpu", options: MappingOptions | None = None,
                value_ranges: dict | None = None) -> tuple[Any, Ranges]:
    """Infer ranges at ``shapes`` and compile with ``backend``; returns (kernel, ranges).

    Example:
        >>> import numpy as np
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> cdef = check_program("def neg(float(N) A) -> (B) { B(i) = -A(i) }")["neg"]
        >>> kernel, ranges = compile_def(cdef, {"A": (3,)})
        >>> a, b = np.arange(3, dtype=np.float32), np.zeros(3, np.float32)
        >>> kernel.run([a, b]); b                 # inputs, then outputs, in place
        array([-0., -1., -2.], dtype=float32)
    """
    ranges = infer(cdef, shapes, scalars, value_ranges)
    options = options or MappingOptions.default_for(cdef.ast)
    return get_backend(backend).compile(KernelSpec(cdef, ranges, options)), ranges


def output_specs(cdef: CheckedDef, ranges: Ranges) -> list[tuple[str, tuple, np.dtype]]:
    """(name, shape, NumPy dtype) of every output, in ``-> (...)`` order.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> cdef = check_program("def f(float(N) A) -> (int32(N) I, S) "
        ...                      "{ I(i) = int32(A(i))  S(i) = A(i) }")["f"]
        >>> output_specs(cdef, infer(cdef, {"A": (2,)}))
        [('I', (2,), dtype('int32')), ('S', (2,), dtype('float32'))]
    """
    return [(n, tuple(ranges.shapes[n]), np_dtype(cdef.tensors[n].dtype)) for n in cdef.outputs]


def tensor_shapes(cdef: CheckedDef, input_shapes: Sequence[Sequence[int]]) -> dict:
    """{parameter: shape} from the shapes of the *tensor* parameters in signature order.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> cdef = check_program("def f(float a, float(N,K) X) -> (Y) { Y(n) +=! a * X(n,k) }")["f"]
        >>> tensor_shapes(cdef, [(2, 3)])          # the scalar a has no shape
        {'X': (2, 3)}
    """
    params = [p for p in cdef.inputs if not p.is_scalar]
    if len(input_shapes) != len(params):
        raise TcShapeError(f"{cdef.name}: expected {len(params)} input shapes "
                           f"({', '.join(p.name for p in params)}), got {len(input_shapes)}")
    return {p.name: tuple(int(x) for x in s) for p, s in zip(params, input_shapes)}


def host_view(t: Any) -> np.ndarray:
    """A NumPy view of an eager CPU tensor's buffer (``.numpy()`` would copy it); a copy for
    anything else with ``.numpy()``.

    Example:
        >>> import tensorflow as tf
        >>> host_view(tf.constant([1.0, 2.0]))
        array([1., 2.], dtype=float32)
    """
    view = getattr(t, "_numpy", None)     # EagerTensor: shares memory; kernels only read inputs
    if view is not None:
        try:
            return view()
        except Exception:  # noqa: BLE001 - e.g. a non-CPU tensor: fall back to the copy
            pass
    return t.numpy()


def host_arrays(cdef: CheckedDef, inputs: Sequence[Any]) -> list[np.ndarray]:
    """The inputs of ``cdef`` as the kernels take them: C-contiguous NumPy arrays of the
    declared element types (scalars as 0-d arrays), eager tensors viewed without a copy.

    Raises:
        TcShapeError: a wrong number of inputs, a tensor of another dtype, or an array where
            the signature has a scalar.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> cdef = check_program("def f(float a, float(N) X) -> (Y) { Y(i) = a * X(i) }")["f"]
        >>> [(x.shape, x.dtype.name) for x in host_arrays(cdef, [2, np.ones(3, np.float32)])]
        [((), 'float32'), ((3,), 'float32')]
    """
    params = cdef.inputs
    if len(inputs) != len(params):
        raise TcShapeError(f"{cdef.name} takes {len(params)} input(s) "
                           f"({', '.join(p.name for p in params)}), got {len(inputs)}")
    out = []
    for p, x in zip(params, inputs):
        want = np_dtype(p.dtype)
        if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
            x = host_view(x)
        if p.is_scalar:
            arr = np.asarray(x)
            if arr.ndim != 0:
                raise TcShapeError(f"{cdef.name}: scalar argument {p.name} got an array of "
                                   f"shape {arr.shape}")
            try:
                out.append(np.array(arr, dtype=want))
            except (TypeError, ValueError) as e:
                raise TcShapeError(f"{cdef.name}: scalar argument {p.name} is declared "
                                   f"{p.dtype}, got {x!r}") from e
            continue
        arr = np.asarray(x)
        if arr.dtype != want:
            raise TcShapeError(f"{cdef.name}: input {p.name} is declared {p.dtype} "
                               f"({want}) but got dtype {arr.dtype}")
        # (np.ascontiguousarray would turn a 0-d array into shape (1,))
        out.append(arr if arr.flags.c_contiguous else np.ascontiguousarray(arr))
    return out


def generate_source(source: str, entry: str, input_shapes: Sequence[Sequence[int]],
                    backend: str = "cpu", options: MappingOptions | None = None,
                    scalars: dict | None = None) -> str:
    """The code ``backend`` generates for def ``entry`` at the given input shapes.

    ``input_shapes`` lists the shapes of the tensor parameters in signature order;
    ``scalars`` gives the int scalar arguments that subscripts depend on.

    Example:
        >>> src = generate_source("def neg(float(N) A) -> (B) { B(i) = -A(i) }", "neg", [(8,)])
        >>> "void tc_neg(void* const* args)" in src
        True
        >>> cl = generate_source("def neg(float(N) A) -> (B) { B(i) = -A(i) }", "neg", [(8,)],
        ...                      backend="cuda")
        >>> '__global__ void tc_neg_k0(' in cl
        True
    """
    cdef = check_program(source)[entry]
    kernel, _ = compile_def(cdef, tensor_shapes(cdef, input_shapes), scalars, backend, options)
    return kernel.source


def initial_outputs_tc(cdef: CheckedDef, ranges: Ranges) -> str:
    """The def with one more input per output in ``cdef.inout`` (those a reduction without
    ``!`` reads before anything writes them), named ``INIT_PREFIX + output``, copied into the
    output by a first statement: the TC then computes from explicit initial values.

    >>> from tfx_vec.tc_ops.lang.sema import check_program
    >>> d = check_program("def acc(float(N) A) -> (S) { S(i) += A(i) }")["acc"]
    >>> print(initial_outputs_tc(d, infer(d, {"A": (4,)})))
    def acc(float(N) A, float(tc__init_S_0) tc__init_S) -> (S) {
        S(tc__i0) = tc__init_S(tc__i0)
        S(i) += A(i)
    }

    Example:
        >>> import warnings
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")      # max= without ! warns: it is meant here
        ...     src = "def rowmax(float(N,K) A) -> (M) { M(n) max= A(n,k) }"
        ...     cdef = check_program(src)["rowmax"]
        >>> print(initial_outputs_tc(cdef, infer(cdef, {"A": (2, 3)})))
        def rowmax(float(N,K) A, float(tc__init_M_0) tc__init_M) -> (M) {
            M(tc__i0) = tc__init_M(tc__i0)
            M(n) max= A(n, k)
        }
    """
    params, prologue = [], []
    for name in cdef.inout:
        info, shape, origin = cdef.tensors[name], ranges.shapes[name], ranges.origin(name)
        init = INIT_PREFIX + name
        idx = [f"tc__i{k}" for k in range(len(shape))]
        dims = ",".join(f"{init}_{k}" for k in range(len(shape)))
        params.append(f"{info.dtype}({dims}) {init}" if shape else f"{info.dtype} {init}")
        subs = [f"{i} - {o}" if o else i for i, o in zip(idx, origin)]
        where = [f"{i} in {o}:{o + n}" for i, o, n in zip(idx, origin, shape) if o]
        lhs = f"{name}({','.join(idx)})" if shape else name
        read = f"{init}({','.join(subs)})" if shape else init
        prologue.append(f"{lhs} = {read}" + (f" where {', '.join(where)}" if where else ""))
    return def_to_tc(cdef.ast, extra_params=tuple(params), prologue=tuple(prologue))
