"""``LazyTensor`` and ``Variable``: the eager tensor API, recorded instead of executed.

Python operators and ``tf.*`` calls (through TensorFlow's type-based dispatch, see
``dispatch.py``) on lazy tensors go to :func:`record`, which binds the call's arguments, turns
tensor arguments into IR nodes and everything else into attrs, looks up (or infers) the output
spec and returns new lazy tensors.  Nothing runs until a forcing point: ``.numpy()``, ``bool()``,
``float()``, ``int()``, ``repr``/``print``/``format``, iteration, ``tf.convert_to_tensor``;
each is a barrier (``runtime.barrier``).  Static shapes (``.shape``, ``len``, ``tf.shape``) never
force.

``LazyTensor`` is a plain Python class with ``__slots__`` rather than a
``tf.experimental.ExtensionType``: constructing an ExtensionType costs tens of microseconds,
this costs well under one, and ``register_dispatchable_type`` gives it the same dispatch.

Example:
    >>> import tensorflow as tf
    >>> x = tensor([[1.0, 2.0]])
    >>> y = tf.nn.relu(x * 3.0 - 4.0)
    >>> y.shape
    TensorShape([1, 2])
    >>> y.numpy().tolist()
    [[0.0, 2.0]]
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf

from . import metrics, runtime
from tensorflow.python.eager import context as _tf_context

from .errors import LazyError, LazyShapeError
from .ir import Node
from .ops import GETITEM, OPS, OpDef, Unrecordable, _spec_cache, freeze, freeze_index, infer

__all__ = ["LazyTensor", "Variable", "tensor", "value", "force", "record", "check_assign"]

_SymbolicTensor = tf.__internal__.SymbolicTensor
_PY_NUMBER = (int, float)


class LazyTensor:
    """A tensor whose value is a pending computation (an IR node) or materialized data.

    Made by :func:`tensor` (and :class:`Variable`); ``tf.*`` calls and Python operators on it
    record new lazy tensors; ``.numpy()``, ``float()``, ``bool()``, printing, iteration and
    ``lazy.to_tensor`` force it (a barrier); ``.shape``, ``.dtype``, ``len`` never do.

    >>> import tensorflow as tf
    >>> x = tensor([[1.0, -2.0]])
    >>> y = tf.nn.relu(x) * 2.0
    >>> y.shape, y.dtype.name
    (TensorShape([1, 2]), 'float32')
    >>> y.numpy().tolist()
    [[2.0, 0.0]]
    """

    __slots__ = ("_node", "__weakref__")
    __array_priority__ = 100  # numpy defers ``ndarray + lazy`` to our reflected operators

    def __init__(self, node: Node):
        # tf.executing_eagerly() inlined (what TF's generated op wrappers do): this runs once
        # per recorded op and the function call was a tenth of the recording time.
        ctx = _tf_context._context or _tf_context.context()
        if not ctx._thread_local_data.is_eager:
            raise LazyError("lazy tensors are for eager code: an op on a lazy tensor was called "
                            f"while tracing a tf.function or graph (at {runtime.user_frame()}); "
                            "convert with lazy.to_tensor() before entering it")
        self._node = node
        if node.pending:
            runtime.register(self)

    @staticmethod
    def _recorded(node: Node) -> "LazyTensor":
        """``LazyTensor(node)`` for an op node the device's callback just recorded: TensorFlow
        calls that callback for eager ops only, so the check of ``__init__`` always passes."""
        t = _new_lazy(LazyTensor)
        t._node = node
        runtime.register(t)
        return t

    def _pending(self) -> bool:
        return self._node.pending

    # -- static properties (never force) ------------------------------------------------
    @property
    def shape(self) -> tf.TensorShape:
        return tf.TensorShape(self._node.shape)

    def get_shape(self) -> tf.TensorShape:
        return self.shape

    @property
    def dtype(self) -> tf.DType:
        return self._node.dtype

    @property
    def ndim(self) -> int:
        return len(self._node.shape)

    def __len__(self) -> int:
        if not self._node.shape:
            raise TypeError("len() of a 0-d lazy tensor")
        return self._node.shape[0]

    # -- forcing points ------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """Force the value (a barrier when pending) and return it as NumPy."""
        return value(self, ".numpy()").numpy()

    def __bool__(self) -> bool:
        return bool(value(self, "bool()"))

    def __float__(self) -> float:
        return float(value(self, "float()"))

    def __int__(self) -> int:
        return int(value(self, "int()"))

    def __index__(self) -> int:
        if not self.dtype.is_integer:
            raise TypeError(f"only integer lazy tensors can be used as an index, got {self.dtype}")
        return int(value(self, "__index__"))

    def __iter__(self) -> Iterator["LazyTensor"]:
        if not self._node.shape:
            raise TypeError("iteration over a 0-d lazy tensor")
        return iter([tensor(row) for row in value(self, "iteration")])

    def __repr__(self) -> str:
        v = value(self, "repr")
        return f"<LazyTensor: shape={self.shape}, dtype={self.dtype.name}, numpy={v.numpy()!r}>"

    def __str__(self) -> str:
        return str(value(self, "str").numpy())

    def __format__(self, spec: str) -> str:
        v = value(self, "format").numpy()
        return format(v.item() if v.ndim == 0 else v, spec)

    __hash__ = object.__hash__  # identity, so lazy tensors can key dicts and weak sets

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # Not a silent forcing point: TensorFlow's conversion of op arguments tries this
        # protocol first, and an op without a lazy rule must reach the counted fallback.
        raise TypeError("a lazy tensor is not converted implicitly: call .numpy() (a forcing "
                        "point) or lazy.to_tensor()")

    # -- operators (recorded) ------------------------------------------------------------
    def __getitem__(self, index: Any) -> "LazyTensor":
        try:
            frozen = freeze_index(index)
        except Unrecordable as why:
            return runtime.fallback("__getitem__", lambda t, i: t[i], (self, index), {},
                                    str(why))
        return record(GETITEM, (self, frozen), {})

    def __neg__(self) -> "LazyTensor":
        return record(OPS["math.negative"], (self,), {})

    def __abs__(self) -> "LazyTensor":
        return record(OPS["math.abs"], (self,), {})

    def __invert__(self) -> "LazyTensor":
        op = "math.logical_not" if self.dtype == tf.bool else "bitwise.invert"
        return record(OPS[op], (self,), {})

    def __pos__(self) -> "LazyTensor":
        return self


_new_lazy = LazyTensor.__new__


def _operator(name: str, reflected: bool = False, logical: str | None = None):
    op, logical_op = OPS[name], OPS[logical] if logical else None
    layout = tuple((p, -1) for p in op.tensors)
    base = (op.name, layout, ())

    def node(a: Node, other: Any) -> Node | None:
        """The fast path: the result node when ``other`` is lazy or a Python number and the
        output spec is cached (``None``: go through :func:`record`)."""
        if isinstance(other, LazyTensor):
            b = other._node
        elif type(other) in _PY_NUMBER:
            b = _number(other, op.scalars, a.dtype)
        else:
            return None
        if reflected:
            a, b = b, a
        spec = _spec_cache.get(base + (a.sig if a.op != "const" else a.attrs,
                                       b.sig if b.op != "const" else b.attrs))
        if spec is None or spec.structure is not None:
            return None
        _counters["ops_recorded"] += 1
        shape, dtype = spec.flat[0]
        return Node(op.name, (a, b), (layout, ()), shape, dtype)

    def method(self, other):
        chosen = logical_op if logical_op is not None and self.dtype == tf.bool else op
        if chosen is op:
            n = node(self._node, other)
            if n is not None:
                return LazyTensor(n)
        return record(chosen, (other, self) if reflected else (self, other), {})
    method.node = node
    return method


for _name, _op, _logical in (
        ("add", "math.add", None), ("sub", "math.subtract", None),
        ("mul", "math.multiply", None), ("truediv", "math.truediv", None),
        ("floordiv", "math.floordiv", None), ("mod", "math.floormod", None),
        ("pow", "math.pow", None), ("matmul", "matmul", None),
        ("and", "bitwise.bitwise_and", "math.logical_and"),
        ("or", "bitwise.bitwise_or", "math.logical_or"),
        ("xor", "bitwise.bitwise_xor", "math.logical_xor")):
    setattr(LazyTensor, f"__{_name}__", _operator(_op, False, _logical))
    setattr(LazyTensor, f"__r{_name}__", _operator(_op, True, _logical))
for _name, _op in (("lt", "math.less"), ("le", "math.less_equal"), ("gt", "math.greater"),
                   ("ge", "math.greater_equal")):
    setattr(LazyTensor, f"__{_name}__", _operator(_op))


def _equality(name: str, if_none: bool):
    compare = _operator(name)

    def method(self, other):
        if other is None:  # as tf.Tensor: comparing with None is a Python bool
            return if_none
        return compare(self, other)
    return method


LazyTensor.__eq__ = _equality("math.equal", False)
LazyTensor.__ne__ = _equality("math.not_equal", True)


class Variable(LazyTensor):
    """A lazy view of a ``tf.Variable``: reads record, ``assign*`` substitute the value.

    The new value is written to the ``tf.Variable`` inside the next barrier's compiled program
    (an XLA resource update).  Example:

        >>> v = Variable([1.0, 2.0])
        >>> _ = v.assign_add([10.0, 10.0])
        >>> v.numpy().tolist()
        [11.0, 12.0]
    """

    __slots__ = ("_var", "_read", "_trainable")

    def __init__(self, initial_value: Any, dtype: tf.DType | None = None,
                 trainable: bool = True, name: str | None = None):
        runtime.check_no_strategy("lazy.Variable()")
        if isinstance(initial_value, LazyTensor):
            initial_value = value(initial_value, "Variable()")
        with runtime.on_host():   # a host variable, also inside lazy.device()
            self._var = tf.Variable(initial_value, dtype=dtype, trainable=trainable, name=name)
        self._trainable = self._var.trainable  # fixed; read per source by every gradient
        self._read = Node.leaf("var", self._var)
        self._node = self._read

    def _pending(self) -> bool:
        return self._node is not self._read

    @property
    def variable(self) -> tf.Variable:
        """The underlying ``tf.Variable`` (its value is current after a barrier)."""
        runtime.wait()
        return self._var

    @property
    def name(self) -> str:
        return self._var.name

    @property
    def trainable(self) -> bool:
        return self._trainable

    def read_value(self) -> LazyTensor:
        """The current value as a lazy tensor (later ``assign``s do not change it)."""
        return LazyTensor(self._node)

    def _substitute(self, new: Any, what: str) -> "Variable":
        if not isinstance(new, LazyTensor):
            new = tensor(tf.convert_to_tensor(new, dtype=self.dtype))
        self._check(new._node, what)
        self._node = new._node
        runtime.mark_variable(self)
        return self

    def _check(self, n: Node, what: str) -> None:
        check_assign(self._read, n, self.name, what)

    def assign(self, new: Any) -> "Variable":
        """Substitute the variable's value with ``new``."""
        return self._substitute(new, "assign")

    def _update(self, op: str, delta: Any, what: str) -> "Variable":
        if not isinstance(delta, LazyTensor):
            delta = tensor(tf.convert_to_tensor(delta, dtype=self.dtype))
        self._check(delta._node, what)  # like tf.Variable: no broadcasting of the delta
        method = LazyTensor.__add__ if op == "math.add" else LazyTensor.__sub__
        # The operators' fast path, without a lazy tensor for the sum: only the variable
        # holds it (and the barrier has one dead weak reference less to skip).
        new = method.node(self._node, delta)
        self._node = new if new is not None else method(self, delta)._node
        runtime.mark_variable(self)
        return self

    def assign_add(self, delta: Any) -> "Variable":
        """``self.assign(self + delta)``, recorded (``delta`` has the variable's shape)."""
        return self._update("math.add", delta, "assign_add")

    def assign_sub(self, delta: Any) -> "Variable":
        """``self.assign(self - delta)``, recorded (``delta`` has the variable's shape)."""
        return self._update("math.subtract", delta, "assign_sub")

    def numpy(self) -> np.ndarray:
        """Force pending updates and return the variable's value as NumPy."""
        if not _tf_context.context().executing_eagerly():
            raise LazyError(f"lazy.Variable {self.name!r} read while tracing a tf.function (at "
                            f"{runtime.user_frame()}): its value would be baked into the graph")
        if self._pending():
            runtime.barrier(".numpy()")
        runtime.wait()
        return self._var.numpy()


def check_assign(read: Node, new: Node, name: str, what: str) -> None:
    """A :class:`LazyShapeError` when ``new`` cannot be assigned to the variable read by
    ``read`` (as ``tf.Variable``: no broadcasting, no casting)."""
    if new.sig != read.sig:
        raise LazyShapeError(
            f"{what} to variable {name!r}: expected {read.dtype.name}{list(read.shape)}, got "
            f"{new.dtype.name}{list(new.shape)} at {runtime.user_frame()}")


def tensor(data: Any, dtype: tf.DType | None = None) -> LazyTensor:
    """Factory: a lazy tensor holding ``data`` (anything ``tf.convert_to_tensor`` accepts).

    >>> tensor([1, 2]).dtype
    tf.int32
    """
    if isinstance(data, LazyTensor):
        return data if dtype is None or data.dtype == dtype else \
            record(OPS["cast"], (data, dtype), {})
    runtime.check_no_strategy("lazy.tensor()")
    if isinstance(data, tf.Tensor):
        t = data if dtype is None else tf.cast(data, dtype)
    else:
        with runtime.on_host():
            t = tf.convert_to_tensor(data, dtype=dtype)
    if isinstance(t, _SymbolicTensor) or not _tf_context.context().executing_eagerly():
        raise LazyError(f"lazy.tensor needs an eager value, got a symbolic tf.Tensor (at "
                        f"{runtime.user_frame()}): lazy tensors are for eager code, not "
                        "tf.function tracing")
    return LazyTensor(Node.leaf("data", t))


def value(t: Any, cause: str = "to_tensor") -> tf.Tensor:
    """The eager ``tf.Tensor`` value of ``t`` (forcing a barrier when it is pending)."""
    if not isinstance(t, LazyTensor):
        return tf.convert_to_tensor(t)
    if not _tf_context.context().executing_eagerly():
        raise LazyError(f"{cause} of a lazy tensor while tracing a tf.function or graph (at "
                        f"{runtime.user_frame()}): its value would be baked into the graph.  "
                        "Pass lazy.to_tensor(x) into the function instead")
    return force(t, cause)


READS = [0]   # lazy tensors' values read, pending or not: Python may branch on them


def force(t: LazyTensor, cause: str | Callable[[], str]) -> tf.Tensor:
    """The host value of ``t``, computing pending work first (a barrier).  ``cause`` names the
    barrier; a callable is called only when one runs (a call site costs a stack walk)."""
    READS[0] += 1
    if t._pending() and t._node.op != "var":  # a variable's current value needs no program
        metrics.bump("forced")
        runtime.barrier(cause)
    return runtime._eager(t)


# {{{ recording

_consts: dict = {}


def _const(v: Any, dtype: tf.DType | None = None) -> Node:
    """A baked constant: a Python value (replayed as is, so TF converts it as eager would) or,
    with ``dtype``, the frozen value of a small eager tensor (replayed with its dtype)."""
    key = (type(v), v, dtype, _negative_zero(v))
    node = _consts.get(key)
    if node is None:
        arr = np.asarray(v)
        shown = dtype or (tf.as_dtype(arr.dtype) if arr.dtype != np.float64 else tf.float32)
        if len(_consts) > 10000:  # baked constants that never repeat must not grow it forever
            _consts.clear()
        node = _consts[key] = Node("const", (), (v, dtype), tuple(arr.shape), shown)
    return node


def _negative_zero(v: Any) -> bool:
    return type(v) is float and v == 0.0 and math.copysign(1.0, v) < 0


def _leaf(v: Any, scalars: bool) -> Node | None:
    """The node for a non-lazy tensor argument; ``None`` marks a number (decided later).

    NumPy scalars (what ``.numpy()`` of a forced value gives) are numbers, never baked; so is
    a rank-0 eager tensor in elementwise math (``scalars``), where it is data, not a shape.
    """
    if isinstance(v, tf.Tensor):
        if isinstance(v, _SymbolicTensor):
            raise LazyError(f"a lazy tensor met a symbolic tf.Tensor (at {runtime.user_frame()})"
                            ": lazy tensors are for eager code, not tf.function tracing; "
                            "pass lazy.to_tensor(x) into the function instead")
        if scalars and not v.shape:
            return Node.leaf("data", v)
        try:
            return _const(freeze(v), v.dtype)
        except Unrecordable:
            return Node.leaf("data", v)
    if isinstance(v, bool) or v is None:
        return _const(v)
    if isinstance(v, _PY_NUMBER) or (isinstance(v, (np.floating, np.integer)) and scalars):
        return None
    if isinstance(v, tf.Variable):
        return Node.leaf("data", v.read_value())
    if isinstance(v, np.ndarray) and v.size > 64:
        return Node.leaf("data", tf.constant(v))
    return _const(freeze(v))


def record(op: OpDef, args: tuple, kwargs: dict) -> Any:
    """Record one call of ``op`` and return its lazy result(s), or fall back to eager."""
    try:
        return _record(op, args, kwargs)
    except Unrecordable as why:
        return runtime.fallback(op.name, op.api, args, kwargs, str(why))


def _record(op: OpDef, args: tuple, kwargs: dict) -> Any:
    params = op.params
    lists = op.lists
    if op.varargs:  # einsum(equation, *inputs)
        vals = {params[0]: args[0] if args else kwargs.pop(params[0]), op.varargs: list(args[1:])}
        vals.update(kwargs)
        lists = (op.varargs,)
        items = vals.items()
    elif kwargs:
        if len(args) > len(params):
            raise TypeError(f"tf.{op.name} takes {len(params)} arguments, got {len(args)}")
        vals = dict(zip(params, args))
        vals.update(kwargs)
        items = vals.items()
    else:
        if len(args) > len(params):
            raise TypeError(f"tf.{op.name} takes {len(params)} arguments, got {len(args)}")
        items = zip(params, args)
    layout, raw, attrs = [], [], []
    tensors = op.tensors
    for p, v in items:
        if p == "name":
            continue
        if p in tensors:
            layout.append((p, -1))
            raw.append(v)
        elif p in lists:
            if isinstance(v, (list, tuple)):
                layout.append((p, len(v)))
                raw.extend(v)
            else:
                layout.append((p, -1))
                raw.append(v)
        else:
            attrs.append((p, freeze(v)))
    layout_t, attrs_t = tuple(layout), tuple(attrs)
    nodes = []
    main = None
    for v in raw:
        if isinstance(v, LazyTensor):
            n = v._node
            if main is None:
                main = n.dtype
        else:
            n = _leaf(v, op.scalars)
            if main is None and n is not None and n.op == "data":
                main = n.dtype
        nodes.append(n)
    sig = [op.name, layout_t, attrs_t]
    for i, n in enumerate(nodes):
        if n is None:  # a Python number: a parameter of the program, or baked
            nodes[i] = n = _number(raw[i], op.scalars, main)
        sig.append(n.sig if n.op != "const" else n.attrs)
    try:
        spec = infer(op, layout_t, attrs_t, nodes, tuple(sig))
    except Unrecordable:
        raise
    except (ValueError, TypeError, tf.errors.OpError) as err:
        raise LazyShapeError(f"tf.{op.name}: {str(err).splitlines()[0]} (recorded at "
                             f"{runtime.user_frame()})") from err
    _counters["ops_recorded"] += 1
    inputs = tuple(nodes)
    if spec.structure is None:
        shape, dtype = spec.flat[0]
        return LazyTensor(Node(op.name, inputs, (layout_t, attrs_t), shape, dtype))
    base = Node(op.name, inputs, (layout_t, attrs_t), None, None)
    outs = [LazyTensor(Node("out", (base,), (i,), s, d)) for i, (s, d) in enumerate(spec.flat)]
    return tf.nest.pack_sequence_as(spec.structure, outs)


_counters = metrics._counters


def _number(v: Any, scalars: bool, main: tf.DType | None) -> Node:
    """A Python number argument: baked when 0/+-1 or without a tensor to take a dtype from.

    -0.0 is a parameter, not baked: it equals 0.0, so as a baked constant it would share 0.0's
    program (and cached node) and lose its sign (``1 / (x * -0.0)`` must be ``-inf``).
    """
    if isinstance(v, np.generic):   # a forced value: a parameter even when it is 0 or 1
        v = v.item()
        if main is not None and (main.is_floating or main.is_complex or (
                main.is_integer and isinstance(v, int))):
            return Node("scalar", (), (), (), main, v)
        return _const(v)
    if (v in (0, 1, -1) and not _negative_zero(v)) or not scalars or main is None or not (
            main.is_floating or main.is_complex or (main.is_integer and isinstance(v, int))):
        return _const(v)
    return Node("scalar", (), (), (), main, v)
# }}}
