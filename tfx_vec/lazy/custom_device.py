"""``lazy.device()``: unchanged TensorFlow programs recorded through a TensorFlow custom device.

TensorFlow's eager C API lets a library register a *custom device*
(``TFE_RegisterCustomDevice``; TensorFlow's parallel device and DTensor are built on it).  Inside
``with lazy.device():`` every eager op is placed on the device ``LAZY:0``, and so is every op
with an input living there, whoever issues it: user code, ``tf.GradientTape``'s backward
functions, Keras layers, losses, metrics and optimizers, ``tf.Module``.  The native bridge
(``custom_device.cc``) hands each op to :func:`_execute` here, which records it as an IR node
(``raw.py`` knows the op) and answers with a tensor handle on the device that carries a
:class:`~tfx_vec.lazy.tensor.LazyTensor` as its payload.  Those handles are ordinary
``tf.Tensor`` objects to every Python caller (shapes and dtypes are static); reading a value
(``.numpy()``, ``float()``, ``print``, ``if``) copies it off the device, which forces it: a
barrier over all pending work, exactly as ``lazy.mark_step()``.

Per op, in order:

- variables: ``VarHandleOp`` creates the real variable on the host and returns a device handle
  whose payload is a :class:`DeviceVariable`; reads return its current value, ``assign*``
  substitute it (the paper's in-place updates), the barrier writes it back;
- static answers: ``Shape``/``Size``/``Rank`` of a device tensor come from its static shape;
- ``record`` ops (an XLA kernel, tensor types): inputs XLA needs as compile-time constants are
  baked into the program (forced first if pending), other host values become parameters;
  integer ops on small known values are *folded* (evaluated now, counted);
- ``host`` ops (strings, variants, resources other than variables, function calls): datasets,
  iterators, summaries, ``tf.print``, ``tf.function`` calls run on the host after forcing
  their lazy inputs (counted per op); fetching a ``tf.data`` batch is a barrier, as PyTorch/XLA's
  data loader marks a step per batch;
- ``fallback`` ops (no XLA kernel, or an output shape that depends on values): forced inputs,
  run eagerly, counted per op and source line, or a :class:`LazyFallbackError`.

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec import lazy
    >>> with lazy.device():
    ...     w = tf.Variable([[1.0], [2.0]])
    ...     with tf.GradientTape() as tape:
    ...         loss = tf.reduce_sum(tf.matmul(tf.ones([3, 2]), w) ** 2)
    ...     _ = w.assign_sub(0.01 * tape.gradient(loss, w))
    ...     lazy.mark_step()
    ...     print(round(float(loss), 3), [round(float(v), 3) for v in w.numpy().ravel()])
    27.0 [0.82, 1.82]
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf
from tensorflow.python import pywrap_tfe
from tensorflow.python.eager import context
from tensorflow.python.framework import dtypes, errors_impl, ops
from tensorflow.python.ops import handle_data_util, resource_variable_ops

from . import (api_functions, calls, ir, metrics, operators, raw, runtime, tape_capture,
               units)
from .errors import LazyError, LazyShapeError
from .ir import Node
from .ops import Unrecordable
from .tensor import READS, LazyTensor, _const, check_assign, force, value

__all__ = ["device", "DEVICE_NAME", "HOST", "DeviceVariable", "native", "payload_of",
           "is_device_tensor", "make_tensor", "make_tensors"]

DEVICE_NAME = "/job:localhost/replica:0/task:0/device:LAZY:0"
HOST = "/job:localhost/replica:0/task:0/device:CPU:0"
_RESOURCE = tf.resource.as_datatype_enum
_lock = threading.Lock()
_native: list = [None]
_registered = [False]


def native() -> Any:
    """The native bridge (built against the installed TensorFlow on first use, then cached)."""
    if _native[0] is None:
        from tfx_vec._native import load_extension
        source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "custom_device.cc")
        _native[0] = load_extension("_tfx_vec_lazy_device", source)
    return _native[0]


def _host_run(cap: Any, inputs: list, device: str = HOST) -> list:
    """Run the op being recorded (``cap``) on a physical device; TensorFlow's own exception
    class on failure."""
    try:
        return native().run_on_host(cap, inputs, device)
    except RuntimeError as e:
        if len(e.args) == 2 and isinstance(e.args[0], int):
            code, message = e.args
            raise errors_impl.exception_type_from_error_code(code)(None, None, message) \
                from None
        raise


def _register() -> None:
    with _lock:
        if _registered[0]:
            return
        dev, info = native().capsules(DEVICE_NAME, _execute, _to_device, _from_device)
        context.context().register_custom_device(dev, DEVICE_NAME, info)
        tape_capture.install()
        _keep_unread_variables()
        operators.install(_record_operator, _record_unary, _read_operand, _update_variable,
                          _variable_value)
        api_functions.install(_record_function)
        runtime.BARRIER_HOOKS.append(lambda: tape_capture.taint_live("a value was read"))
        runtime.BARRIER_HOOKS.append(lambda: units.taint("a value was read"))
        runtime.BARRIER_CHECKS.append(tape_capture.check_barrier)
        _registered[0] = True


def _keep_unread_variables() -> None:
    """``assign``, ``assign_add`` and ``assign_sub`` of a device variable return one
    ``_UnreadVariable`` per variable, built once.

    Eagerly, TensorFlow builds a new ``_UnreadVariable`` (a whole resource-variable object) for
    every update that returns its value; its parent op is ``None`` there and reading it reads
    the variable at that time, so the kept one differs from a new one in identity only.  An
    optimizer written op by op makes three updates per variable per step, and on the lazy
    device, where the update itself is only recorded, building that object cost as much as
    the rest of the update."""
    base = resource_variable_ops.BaseResourceVariable
    original = base._lazy_read

    def _lazy_read(self, op):
        if op is not None or not context.executing_eagerly():
            return original(self, op)
        kept = self.__dict__.get("_tfx_vec_unread")
        if kept is None:   # decided once per variable: its handle never moves
            on_device = _variable_state(self) is not None
            kept = original(self, op) if on_device else False
            self.__dict__["_tfx_vec_unread"] = kept
            return original(self, op) if kept is False else kept
        if kept is False:
            return original(self, op)
        resource_variable_ops.variable_accessed(self)
        return kept
    _lazy_read.__wrapped__ = original
    base._lazy_read = _lazy_read


@contextlib.contextmanager
def device() -> Iterator[None]:
    """Run the enclosed eager TensorFlow code lazily on the ``LAZY:0`` custom device.

    Variables created inside live on the device (reads and updates are recorded); every op
    with an input on the device is recorded, inside the block or after it.  Call
    ``lazy.mark_step()`` once per training step; reading a value forces pending work.

    >>> import tensorflow as tf
    >>> from tfx_vec import lazy
    >>> with lazy.device():
    ...     x = tf.constant([1.0, 2.0]) * 3.0
    >>> x.device.endswith("LAZY:0"), x.numpy().tolist()
    (True, [3.0, 6.0])
    """
    runtime.check_no_strategy("lazy.device() entered")
    _register()
    calls.install_keras()
    units.install()
    with ops.device(DEVICE_NAME):
        yield


def payload_of(t: Any) -> Any:
    """The payload (a ``LazyTensor`` or :class:`DeviceVariable`) of a device tensor, else None."""
    if not _registered[0] or not isinstance(t, ops.EagerTensor):
        return None
    return _native[0].payload(t, DEVICE_NAME)   # loaded before the device was registered


def make_tensor(t: LazyTensor) -> tf.Tensor:
    """A tensor on the device whose payload is ``t`` (outside an op's recording)."""
    return native().make_tensor(context.context()._handle, DEVICE_NAME, _spec(t))


def make_tensors(nodes: list) -> list:
    """``[make_tensor(LazyTensor(n)) for n in nodes]`` for the output nodes of one recorded
    library call (a unit, a gradient): one eager-mode check and one context lookup for all.

    >>> from tfx_vec import lazy
    >>> with lazy.device():
    ...     x = tf.constant([1.0, 2.0]) * 2.0
    ...     y, z = make_tensors([payload_of(x)._node] * 2)
    ...     lazy.mark_step()
    >>> y.numpy().tolist(), z.device == x.device
    ([2.0, 4.0], True)
    """
    if not nodes:
        return []
    tensors = [LazyTensor(nodes[0])]   # checks eager mode once
    tensors += [LazyTensor._recorded(n) for n in nodes[1:]]
    make, handle = native().make_tensor, context.context()._handle
    return [make(handle, DEVICE_NAME, (t, t._node.sig[1], t._node.shape)) for t in tensors]


def is_device_tensor(t: Any) -> bool:
    """Whether ``t`` is a tensor on the lazy device."""
    return payload_of(t) is not None


# {{{ variables

class DeviceVariable:
    """The payload of a variable's resource handle on the device.

    ``_read`` is the ``var`` leaf (the value at the start of the next program) and ``_node`` the
    current value (``_read`` unless an ``assign*`` substituted it); the barrier writes ``_node``
    back, as for ``lazy.Variable``.  ``handle`` is the real resource on the host.
    """

    __slots__ = ("handle", "name", "dtype", "shape", "_read", "_node", "initialized",
                 "last_assign", "__weakref__")

    def __init__(self, handle: tf.Tensor, dtype: tf.DType, shape: tuple, name: str):
        self.handle, self.dtype, self.shape, self.name = handle, dtype, shape, name
        self._read = Node("var", (), (), shape, dtype, handle)
        self._node = self._read
        self.initialized = False
        self.last_assign = -1   # creation stamp of the last assign (a gradient checks it)

    def _pending(self) -> bool:
        return self._node is not self._read

    def _check(self, node: Node, what: str) -> None:
        check_assign(self._read, node, self.name, what)

    def assign(self, node: Node, what: str) -> None:
        self._check(node, what)
        if units.PROBES:
            units.note_assign(self)
        self._node = node
        self.initialized = True
        self.last_assign = next(ir.serials)
        runtime.mark_variable(self)

    def flush(self, cause: str) -> tf.Tensor:
        """The host resource, current: pending updates are written first (a barrier)."""
        if self._pending():
            runtime.barrier(cause)
        runtime.wait()
        return self.handle

    def __repr__(self) -> str:
        return f"<lazy DeviceVariable {self.name!r} {self.dtype.name}{list(self.shape)}>"


def _variable_state(v: Any) -> DeviceVariable | None:
    """The :class:`DeviceVariable` behind resource variable ``v``; None for a variable that
    lives elsewhere."""
    state = payload_of(v._handle)
    return state if type(state) is DeviceVariable else None


def assign_all(states: list, nodes: list) -> None:
    """``states[k].assign(nodes[k])`` for nodes of the right shape and dtype already (the
    outputs of one recorded call: one creation stamp for all)."""
    if units.PROBES:
        for s in states:
            units.note_assign(s)
    stamp = next(ir.serials)
    for s, n in zip(states, nodes):
        s._node = n
        s.initialized = True
        s.last_assign = stamp
    runtime.mark_variables(states)


def _var_handle(op_type: str, attrs: bytes, inputs: tuple, cap: Any) -> list:
    runtime.check_no_strategy("a variable was created on the lazy device")
    units.taint("a variable was created")
    (handle,) = _host_run(cap, [], HOST)
    amap = raw.attr_map(attrs)
    dtype = tf.as_dtype(amap["dtype"].type)
    shape = tf.TensorShape(amap["shape"].shape)
    if not shape.is_fully_defined():
        raise LazyError(f"a variable of unknown shape {shape} cannot live on the lazy device "
                        f"(created at {runtime.user_frame()})")
    name = amap["debug_name"].s.decode() if "debug_name" in amap else ""
    name = name or (amap["shared_name"].s.decode() if "shared_name" in amap else "")
    handle_data_util.set_handle_data(handle, handle_data_util.create_handle_data(shape, dtype))
    state = DeviceVariable(handle, dtype, tuple(shape.as_list()), name)
    return [(state, _RESOURCE, ())]


def _on_variable(handler: Any) -> Any:
    """The handler of an op on a variable of the device.  An op on a variable that lives
    elsewhere (created outside ``lazy.device()``, by a ``tf.distribute`` strategy, or pinned to
    the CPU by TensorFlow itself, as a checkpoint's save counter) runs at once on the host where
    that variable is, as eager would, after forcing its lazy inputs: a counted fallback, so its
    readers never see a stale value."""
    def op(op_type: str, attrs: bytes, inputs: tuple, cap: Any) -> list:
        if type(inputs[0]) is DeviceVariable:
            return handler(op_type, attrs, inputs, cap)
        return _run_on_host(raw.describe(op_type, attrs, len(inputs)), inputs, cap, "fallback",
                             "a variable created outside lazy.device()")
    return op


@_on_variable
def _read_variable(op_type: str, attrs: bytes, state: tuple, cap: Any) -> list:
    if units.PROBES:
        units.note_read(state[0])
    return [_spec(LazyTensor(state[0]._node))]


@_on_variable
def _assign(op_type: str, attrs: bytes, inputs: tuple, cap: Any) -> list:
    _update(inputs[0], op_type, _node_of(inputs[1]))
    return []


def _update(state: DeviceVariable, op_type: str, new: Node) -> None:
    """``state``'s ``AssignVariableOp``, ``AssignAddVariableOp`` or ``AssignSubVariableOp``
    of ``new``, substituted."""
    if op_type != "AssignVariableOp":
        if units.PROBES:
            units.note_read(state)
        what = "AddV2" if op_type == "AssignAddVariableOp" else "Sub"
        state._check(new, op_type)
        (new,) = _record(raw.describe(what, _t_attrs(state.dtype), 2), [state._node, new])
    state.assign(new, op_type)


@_on_variable
def _is_initialized(op_type: str, attrs: bytes, inputs: tuple, cap: Any) -> list:
    return [_host_constant(np.array(inputs[0].initialized))]


def _destroy(op_type: str, attrs: bytes, inputs: tuple, cap: Any) -> list:
    x = inputs[0]
    if type(x) is DeviceVariable:
        runtime.forget_variable(x)
        x = x.handle
    _host_run(cap, [x], HOST)
    return []


@_on_variable
def _resource_gather(op_type: str, attrs: bytes, inputs: tuple, cap: Any) -> list:
    state = inputs[0]
    amap = raw.attr_map(attrs)
    indices = _node_of(inputs[1])
    gather = raw.describe("GatherV2", raw.attrs_bytes({
        "Tparams": state.dtype, "Tindices": indices.dtype, "Taxis": tf.int32,
        "batch_dims": amap["batch_dims"].i if "batch_dims" in amap else 0}), 3)
    return [_spec(LazyTensor(n)) for n in _record(gather, [state._node, indices,
                                                           _const(0, tf.int32)])]
# }}}


# {{{ static answers, constants

_host_constants: dict = {}


def _host_constant(array: np.ndarray) -> tf.Tensor:
    """An eager host tensor of ``array`` (cached: shapes repeat every step)."""
    key = (array.dtype.str, array.shape, array.tobytes())
    t = _host_constants.get(key)
    if t is None:
        with ops.device(HOST):
            t = tf.constant(array)
        if len(_host_constants) > 10000:
            _host_constants.clear()
        _host_constants[key] = t
    return t


def _static_shape(x: Any) -> tuple:
    if type(x) is LazyTensor:
        return x._node.shape
    if type(x) is DeviceVariable:
        return ()
    return tuple(x.shape.as_list())


def _out_type(attrs: bytes) -> np.dtype:
    amap = raw.attr_map(attrs)
    return tf.as_dtype(amap["out_type"].type).as_numpy_dtype if "out_type" in amap else np.int32


def _shape(op_type: str, attrs: bytes, inputs: tuple, cap: Any) -> list:
    dtype = _out_type(attrs)
    if op_type == "ShapeN":
        return [_host_constant(np.array(_static_shape(x), dtype)) for x in inputs]
    shape = _static_shape(inputs[0])
    if op_type == "Shape":
        return [_host_constant(np.array(shape, dtype))]
    if op_type == "Size":
        return [_host_constant(np.array(int(np.prod(shape)), dtype))]
    return [_host_constant(np.array(len(shape), np.int32))]  # Rank


def _eager_const(op_type: str, attrs: bytes, inputs: tuple, cap: Any) -> list:
    return [inputs[0]]  # a host value: it becomes a parameter where a program uses it


def _identity(op_type: str, attrs: bytes, inputs: tuple, cap: Any) -> list:
    x = inputs[0]
    return [_spec(x) if type(x) is LazyTensor else x]


def _no_op(op_type: str, attrs: bytes, inputs: tuple, cap: Any) -> list:
    return []


_SPECIAL = {
    "_EagerConst": _eager_const, "Identity": _identity, "NoOp": _no_op,
    "VarHandleOp": _var_handle, "ReadVariableOp": _read_variable,
    "AssignVariableOp": _assign, "AssignAddVariableOp": _assign,
    "AssignSubVariableOp": _assign, "VarIsInitializedOp": _is_initialized,
    "DestroyResourceOp": _destroy, "ResourceGather": _resource_gather,
    "Shape": _shape, "ShapeN": _shape, "Size": _shape, "Rank": _shape,
}
# }}}


# {{{ recording

def _spec(t: LazyTensor) -> tuple:
    n = t._node
    return (t, n.dtype.as_datatype_enum, n.shape)


_SCALAR_DTYPES = frozenset({tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32,
                            tf.bool})
_SCALAR_ENUMS = frozenset({d.as_datatype_enum for d in _SCALAR_DTYPES})
_DTYPES = dtypes._INTERN_TABLE   # what a tensor's .dtype looks its enum up in


def _node_of(x: Any, sig: tuple | None = None) -> Node:
    """The IR node of an op input: a lazy tensor's node, or a leaf for a host tensor (a rank-0
    host value becomes a ``scalar`` parameter: all of a program's scalars travel in one
    vector, instead of one argument each); ``sig``: the host tensor's, when known."""
    if type(x) is LazyTensor:
        return x._node
    if type(x) is DeviceVariable:
        raise LazyError(f"the resource handle of variable {x.name!r} used as a value")
    if sig is None:
        sig = (tuple(x._shape_tuple()), x._datatype_enum())
    shape, enum = sig
    dtype = _DTYPES[enum]
    if not shape and enum in _SCALAR_ENUMS:
        return Node("scalar", (), (), (), dtype, _scalar_value(x), None, sig)
    return Node("data", (), (), shape, dtype, x, None, sig)


# id -> (host tensor, its value): a step passes the same few host scalars again and again (the
# tensors TensorFlow converted a Python number to), and reading one costs microseconds.  The
# tensor is kept, so its id names it while it is here; tensors never change value.
_scalar_values: dict = {}


def _scalar_value(x: tf.Tensor) -> Any:
    known = _scalar_values.get(id(x))
    if known is None:
        if len(_scalar_values) >= 1000:
            _scalar_values.clear()
        known = _scalar_values[id(x)] = (x, x.numpy().item())
    return known[1]


_t_attrs_cache: dict = {}


def _t_attrs(dtype: tf.DType) -> bytes:
    b = _t_attrs_cache.get(dtype)
    if b is None:
        b = _t_attrs_cache[dtype] = raw.attrs_bytes({"T": dtype})
    return b


class _Recipe:
    """What recording an op makes for inputs of given signatures: its node attrs and output
    signatures, found once (``raw.describe``, ``raw.infer``) and kept per ``(op type, attrs,
    input signatures)``.  ``direct``: :func:`_execute` may use it before describing the op (a
    recorded op with no compile-time constant inputs, never folded); ``on_floats``: so may the
    operators, whose inputs are floats (then a comparison is never folded either)."""

    __slots__ = ("attrs", "flat", "single", "direct", "on_floats")

    def __init__(self, op: raw.RawOp, spec: Any):
        self.attrs = (op.type, op.attrs)
        self.flat = tuple([(shape, dtype, (shape, dtype.as_datatype_enum))
                           for shape, dtype in spec.flat])
        self.single = self.flat[0] if len(self.flat) == 1 else None
        # on float inputs an op is never folded (folding takes small integers and bools)
        self.on_floats = op.kind == "record" and not op.constant and op.type not in _SPECIAL
        self.direct = self.on_floats and not op.foldable

    def nodes(self, inputs: tuple) -> list:
        """The op's output nodes on ``inputs`` (nodes), recorded."""
        metrics._counters["ops_recorded"] += 1
        if self.single is not None:
            shape, dtype, sig = self.single
            return [Node("raw", inputs, self.attrs, shape, dtype, None, None, sig)]
        return Node.outputs(Node("raw", inputs, self.attrs, None, None), self.flat)

    def specs(self, inputs: tuple) -> list:
        """The device's output specs (new lazy tensors) of the op on ``inputs``, recorded."""
        if self.single is None:
            return [(LazyTensor._recorded(n), n.sig[1], n.shape) for n in self.nodes(inputs)]
        metrics._counters["ops_recorded"] += 1
        shape, dtype, sig = self.single
        return [(LazyTensor._recorded(Node("raw", inputs, self.attrs, shape, dtype, None, None,
                                           sig)), sig[1], shape)]


_recipes: dict = {}


def _recipe_sig(n: Node) -> tuple:
    """An input node's part of a recipe key (:func:`_execute` inlines it on its hot path)."""
    # A constant is keyed by its value, tagged: (value, tf.int32) would equal and hash as a
    # (shape, dtype enum) signature, since a DType compares equal to its enum.
    return n.sig if n.op != "const" else ("const", n.attrs)


def _record(op: raw.RawOp, nodes: list) -> list:
    """Record ``op`` on input nodes; returns its output nodes (raises Unrecordable)."""
    return _recipe(op, nodes).nodes(tuple(nodes))


def _recipe(op: raw.RawOp, nodes: list) -> _Recipe:
    """The recipe of ``op`` on input nodes of these signatures (raises Unrecordable)."""
    sig = (op.type, op.attrs, *map(_recipe_sig, nodes))
    recipe = _recipes.get(sig)
    if recipe is None:
        try:
            spec = raw.infer(op, nodes, sig)
        except Unrecordable:
            raise
        except (ValueError, TypeError, tf.errors.OpError) as err:
            raise LazyShapeError(f"{op.type}: {str(err).splitlines()[0]} (recorded at "
                                 f"{runtime.user_frame()})") from err
        if len(_recipes) >= raw.SPECS_MAX:
            _recipes.clear()
        recipe = _recipes[sig] = _Recipe(op, spec)
    return recipe


def _small_known(n: Node) -> bool:
    if n.op == "const":
        return True
    return n.op in ("data", "scalar") and n.dtype in _FOLDABLE_IN and \
        int(np.prod(n.shape)) <= raw.FOLD_LIMIT


_FOLDABLE_IN = frozenset({tf.int32, tf.int64, tf.bool})


def _bake(x: Any, n: Node, op: raw.RawOp, position: int) -> Node:
    """The node of a compile-time constant input: its value, baked into the program."""
    if n.op == "const":
        return n
    if n.op == "scalar":
        return _const(n.value, n.dtype)
    if n.op != "data":
        if type(x) is not LazyTensor:
            raise LazyError(f"input {position} of {op.type} must be a compile-time constant")
        metrics.bump("constant_inputs_forced")
        v = value(x, f"compile-time constant input {position} of {op.type}")
    else:
        v = runtime._eager_value(n)
        _note_value_use([v])
    arr = v.numpy()
    return _const(_freeze_array(arr), n.dtype)


def _freeze_array(arr: np.ndarray) -> Any:
    items = arr.tolist()

    def tup(v: Any) -> Any:
        return tuple(tup(i) for i in v) if isinstance(v, list) else v
    return tup(items)


_owner: list = [None]   # the thread that uses the device (the runtime's state is global)
_get_ident = threading.get_ident


def _check_thread() -> None:
    ident = threading.get_ident()
    if ident != _owner[0]:
        if _owner[0] is None:
            _owner[0] = ident
            return
        runtime.check_no_strategy("a lazy tensor was used")
        raise LazyError(f"a lazy device tensor was used from a second thread (at "
                        f"{runtime.user_frame()}): the lazy runtime records one thread's ops")


def _execute(op_type: str, attrs: bytes, inputs: tuple, cap: Any) -> list:
    """The device's execute callback: record the op (or run it on the host) and return output
    specs (see ``custom_device.cc``)."""
    if _get_ident() != _owner[0]:
        _check_thread()
    special = _SPECIAL.get(op_type)
    if special is not None:
        return special(op_type, attrs, inputs, cap)
    # The path of an op recorded before on inputs of the same signatures: its recipe, keyed
    # as _record keys it (a host tensor's signature is its data or scalar leaf's).
    sig = [op_type, attrs]
    nodes = []
    host = False
    key = None
    for x in inputs:
        if type(x) is LazyTensor:
            n = x._node
            sig.append(n.sig if n.op != "const" else ("const", n.attrs))
            nodes.append(n)
        elif type(x) is DeviceVariable:
            break
        else:
            sig.append((x._shape_tuple(), x._datatype_enum()))
            nodes.append(x)
            host = True
    else:
        key = tuple(sig)
        recipe = _recipes.get(key)
        if recipe is not None and recipe.direct:
            if host:  # a host tensor's leaf is made once the op is known to be recorded
                nodes = [x if type(x) is Node else _node_of(x, s)
                         for x, s in zip(nodes, sig[2:])]
            return recipe.specs(tuple(nodes))
        positions = _baked_positions.get(key[:2]) if host else None
        if positions is not None:
            if _value_guard[0] is not None:
                _note_value_use([nodes[p] for p in positions])
            hit = _baked_recipes.get(_baked_key(key, positions, nodes))
            if hit is not None:
                recipe, consts = hit
                return recipe.specs(tuple([
                    consts[k] if k in consts else x if type(x) is Node else _node_of(x, s)
                    for k, (x, s) in enumerate(zip(nodes, sig[2:]))]))
    op = raw.describe(op_type, attrs, len(inputs))
    if op.kind != "record":
        return _run_on_host(op, inputs, cap, op.kind, op.reason)
    nodes = []
    for x in inputs:
        nodes.append(x._node if type(x) is LazyTensor else _node_of(x))
    try:
        for p in op.constant:
            nodes[p] = _bake(inputs[p], nodes[p], op, p)
        if op.foldable and all(_small_known(n) for n in nodes):
            return _fold(op, nodes, cap)
        recipe = _recipe(op, nodes)
    except Unrecordable as why:
        return _run_on_host(op, inputs, cap, "fallback", str(why))
    if key is not None and op.constant and not op.foldable:
        _remember_baked(key, op, inputs, nodes, recipe)
    return [_spec(LazyTensor(n)) for n in recipe.nodes(tuple(nodes))]


# An op whose compile-time constant inputs are host tensors (an axis, a shape: TensorFlow's
# API functions make them each call) is recorded again without describing it or baking its
# constants when those have the values of an earlier call: (op type, attrs) -> constant
# positions, and (signature key, the constants' bytes) -> (recipe, position -> baked node).
_baked_positions: dict = {}
_baked_recipes: dict = {}
_BAKED_ENUMS = frozenset({tf.int32.as_datatype_enum, tf.int64.as_datatype_enum,
                          tf.bool.as_datatype_enum})


def _baked_key(key: tuple, positions: tuple, inputs: Any) -> tuple | None:
    """``key`` extended by the values of the host tensors at the constant ``positions`` of
    ``inputs`` (None when one is not an integer or bool host tensor)."""
    values = []
    for p in positions:
        x = inputs[p]
        if type(x) is not ops.EagerTensor or key[2 + p][1] not in _BAKED_ENUMS:
            return None
        values.append(x._numpy_internal().tobytes())
    return (key, *values)


def _remember_baked(key: tuple, op: raw.RawOp, inputs: tuple, nodes: list,
                    recipe: _Recipe) -> None:
    """Keep the recipe of an op just recorded with host tensors baked as its constants."""
    positions = tuple(op.constant)
    bkey = _baked_key(key, positions, inputs)
    if bkey is None:
        return
    if len(_baked_recipes) >= raw.SPECS_MAX:
        _baked_recipes.clear()
    _baked_positions[key[:2]] = positions
    _baked_recipes[bkey] = (recipe, {p: nodes[p] for p in positions})


def _reaching_device() -> Any:
    """The eager context when an op issued now on device tensors would reach the device
    (under its scope or none, from the device's thread), else None: under another device's
    scope TensorFlow copies the inputs there, which forces them."""
    ctx = context.context()
    if ctx.device_name not in ("", DEVICE_NAME):
        return None
    if _get_ident() != _owner[0]:
        _check_thread()
    return ctx


_OPERATOR_ENUMS = frozenset({tf.float32.as_datatype_enum, tf.float64.as_datatype_enum})
_T_ATTRS = {e: ("T", e) for e in _OPERATOR_ENUMS}   # an operator's attrs, as a tape gets them


def _record_operator(op_type: str, x: Any, y: Any, swapped: bool,
                     watchers: Callable[[], int]) -> tf.Tensor | None:
    """``x <op> y`` (``y <op> x`` when ``swapped``) recorded as :func:`_execute` records it
    once it knows the op, without TensorFlow's op wrappers (``operators.py``): for a float
    device tensor and a device or host tensor of its dtype or a number, when the op was
    recorded before on operands of these signatures and ``watchers`` are none or gradient
    tapes (given the op as TensorFlow's fast path gives it); None otherwise (TensorFlow's
    path)."""
    t = payload_of(x)
    if type(t) is not LazyTensor:   # the device tensor may be the other operand
        if type(y) is not ops.EagerTensor:
            return None
        t = payload_of(y)
        if type(t) is not LazyTensor:
            return None
        x, y, swapped = y, x, not swapped
    operand = _float_operand(t, watchers)
    if operand is None:
        return None
    a, seen = operand
    enum = a.sig[1]
    host = None
    if type(y) is ops.EagerTensor:
        u = payload_of(y)
        if u is None:       # a host tensor: its leaf, as _execute makes it
            host = y
            b_sig = (y._shape_tuple(), y._datatype_enum())
        elif type(u) is LazyTensor:
            b = u._node
            b_sig = _recipe_sig(b)
        else:
            return None
        if b_sig[1] != enum:
            return None
    else:
        number = _as_double(y)
        if number is None:
            return None
        b_sig = ((), enum)
    a_sig = _recipe_sig(a)
    found = _direct_recipe((op_type, _t_attrs(a.dtype), b_sig, a_sig) if swapped else
                           (op_type, _t_attrs(a.dtype), a_sig, b_sig))
    if found is None:
        return None
    if host is not None:
        b = _node_of(host, b_sig)
    elif type(y) is not ops.EagerTensor:   # a number: a scalar parameter, as its host tensor
        b = Node("scalar", (), (), (), a.dtype, number, None, b_sig)

    def tape_inputs() -> list:
        other = y if type(y) is ops.EagerTensor else make_tensor(LazyTensor(b))
        return [other, x] if swapped else [x, other]
    return _emit(found, op_type, (b, a) if swapped else (a, b), seen, tape_inputs)


def _record_unary(op_type: str, x: Any, watchers: Callable[[], int]) -> tf.Tensor | None:
    """``-x`` (``op_type``: its op) recorded directly, as :func:`_record_operator` records a
    binary operator; None where that does not apply (TensorFlow's path)."""
    operand = _float_operand(payload_of(x), watchers)
    if operand is None:
        return None
    a, seen = operand
    found = _direct_recipe((op_type, _t_attrs(a.dtype), _recipe_sig(a)))
    return None if found is None else _emit(found, op_type, (a,), seen, lambda: [x])


def _float_operand(t: Any, watchers: Callable[[], int]) -> tuple | None:
    """(node, ``watchers()``) of an operator's operand whose payload is ``t`` when it is a
    float lazy tensor and nothing but gradient tapes watches; else None."""
    if type(t) is not LazyTensor or t._node.sig[1] not in _OPERATOR_ENUMS:
        return None
    seen = watchers()
    return None if seen == operators.BLOCKED else (t._node, seen)


def _direct_recipe(key: tuple) -> tuple | None:
    """(recipe, eager context) of the op keyed ``key``, on float inputs, when it can be
    recorded directly now: recorded before on inputs of these signatures, with no constant
    input, reaching the device; else None."""
    recipe = _recipes.get(key)
    if recipe is None or not recipe.on_floats:
        return None
    ctx = _reaching_device()
    return None if ctx is None else (recipe, ctx)


def _emit(found: tuple, op_type: str, nodes: tuple, seen: int,
          tape_inputs: Callable[[], list]) -> tf.Tensor:
    """The device tensor of an operator's op recorded on float ``nodes`` with ``found`` (see
    :func:`_direct_recipe`), given to recording tapes with ``tape_inputs()`` as its inputs."""
    recipe, ctx = found
    (spec,) = recipe.specs(nodes)
    out = _native[0].make_tensor(ctx._handle, DEVICE_NAME, spec)
    if seen == operators.TAPED:
        _record_gradient(op_type, tape_inputs(), _T_ATTRS[nodes[0].sig[1]], [out])
    return out


def _record_gradient(op_type: str, inputs: list, attrs: tuple, outs: list) -> None:
    """Give the recording gradient tapes and forward accumulators the op (its output tensors
    ``outs``), as TensorFlow's eager fast path gives it to them (the generated op functions'
    ``record_gradient``)."""
    pywrap_tfe.TFE_Py_RecordGradient(op_type, inputs, attrs, outs, ops.get_name_scope())


# {{{ TensorFlow API functions from what their first call recorded (api_functions.py)

class _Template:
    """The ops a TensorFlow API function recorded on its tensor arguments: replayed for a later
    call with the same arguments (their signatures, the other arguments' values).

    ``steps``: per op, in order, ``(recipe, input refs, op type, tape attrs)``; an input ref is
    ``(ARG, k)`` (the ``k``-th tensor argument), ``(STEP, (j, i))`` (output ``i`` of step
    ``j``) or ``(LEAF, node)`` (a constant or host value the function made itself, the same
    every call).  ``tape_leaves``: each leaf ref's host tensor, as the tape gets it.
    ``result``: the step output the function returns, ``(j, i)``."""

    __slots__ = ("steps", "tape_leaves", "taped", "result")

    def __init__(self, steps: list, tape_leaves: dict, taped: bool, result: tuple):
        self.steps = steps
        self.tape_leaves = tape_leaves
        self.taped = taped            # every op's attrs are ones a tape can be given
        self.result = result

    def replay(self, args: list, nodes: list, seen: int, ctx: Any) -> tf.Tensor:
        """The function's result recorded on the tensor arguments ``args`` (their ``nodes``),
        each op given to recording tapes (``seen``) as TensorFlow's fast path gives it (with
        all its outputs, as tensors)."""
        outs: list = []       # per step, its output nodes
        tensors: list = []    # per step, its output tensors (made for the tapes only)
        make, handle = _native[0].make_tensor, ctx._handle
        taped = seen == operators.TAPED
        for recipe, refs, op_type, attrs in self.steps:
            produced = recipe.nodes(tuple([
                nodes[k] if kind is _ARG else outs[k[0]][k[1]] if kind is _STEP else k
                for kind, k in refs]))
            outs.append(produced)
            if taped:
                made = [make(handle, DEVICE_NAME, (LazyTensor._recorded(n), n.sig[1], n.shape))
                        for n in produced]
                tensors.append(made)
                _record_gradient(op_type, [
                    args[k] if kind is _ARG else tensors[k[0]][k[1]] if kind is _STEP
                    else self.tape_leaves[id(k)] for kind, k in refs], attrs, made)
        j, i = self.result
        if taped:
            return tensors[j][i]
        n = outs[j][i]
        return make(handle, DEVICE_NAME, (LazyTensor._recorded(n), n.sig[1], n.shape))


_ARG, _STEP, _LEAF = "arg", "step", "leaf"
# (function, argument keys) -> its _Template, or None where its first call recorded something
# a template cannot replay
_templates: dict = {}
_ARGUMENT_TYPES = frozenset({type(None), bool, int, str, np.bool_, np.int32, np.int64,
                             dtypes.DType, type(Ellipsis)})
_host_runs = [0]     # ops run on the host (_run_on_host): a template cannot replay them
_VARIABLES = resource_variable_ops.BaseResourceVariable
_INDEX_ENUMS = frozenset({tf.int32.as_datatype_enum, tf.int64.as_datatype_enum})
_COMPUTED_ENUMS = _INDEX_ENUMS | {tf.bool.as_datatype_enum}
_DEVICE_ARGUMENT_ENUMS = _OPERATOR_ENUMS | _COMPUTED_ENUMS   # device tensors taken
_INDEX_ARGUMENT_ENUMS = _OPERATOR_ENUMS | _INDEX_ENUMS       # host ones, for INDEX_ARGUMENTS
# While a first call learns: the host buffers of its integer tensor arguments.  Their values
# may differ next call, so a fold or bake of one (which a template would repeat as a
# constant) makes the call's key one never replayed (TensorFlow's path does the same for
# the same arguments every call).
_value_guard: list = [None]
_value_uses = [0]    # such folds and bakes


def _note_value_use(tensors: Any) -> None:
    """A host computation or constant is being made of the values of host ``tensors``: when
    one is an integer argument of a function call being learnt, that call is not replayed."""
    guard = _value_guard[0]
    if guard is not None and any(type(x) is ops.EagerTensor and _buffer(x) in guard
                                 for x in tensors):
        _value_uses[0] += 1


def _record_function(name: str, function: Callable, args: tuple,
                     kwargs: dict) -> tf.Tensor | None:
    """TensorFlow API function ``name`` on float tensors of the device (and float host
    tensors, plain Python values), recorded from what its first call with these arguments
    recorded (``function(*args, **kwargs)``: TensorFlow's path, which this runs and learns
    from); None where that does not apply (TensorFlow's path): see ``api_functions.py``."""
    if not any(_native[0].payload(v, DEVICE_NAME) is not None if type(v) is ops.EagerTensor
               else isinstance(v, _VARIABLES) for v in (*args, *kwargs.values())) and \
            context.context().device_name != DEVICE_NAME:
        return None       # eager code: nothing more to check
    found: list = []      # (tensor or variable, its node or host signature, on the device)
    try:
        indices = name in api_functions.INDEX_ARGUMENTS
        key = (name, tuple([_argument_key(v, found, indices) for v in args]),
               tuple(sorted([(k, _argument_key(v, found, indices)) for k, v in kwargs.items()])))
    except TypeError:     # an argument that is not a plain value (a shape, an int tensor)
        return None
    seen = operators.watchers()
    ctx = _reaching_device()
    if seen == operators.BLOCKED or ctx is None or not found or (
            not any(on for _, _, on in found) and ctx.device_name != DEVICE_NAME):
        return None       # host tensors outside the device's scope: TensorFlow's path
    tensors = [t for t, _, _ in found]
    if len(found) > 1:    # which arguments are the same value: part of what was recorded
        places = [_place(*f) for f in found]
        key += (tuple([places.index(p) for p in places]),)
    if key not in _templates:
        return _first_call(key, function, args, kwargs, found, indices)
    template = _templates[key]
    if template is None or (seen == operators.TAPED and not template.taped):
        return None
    # a variable is read as TensorFlow's conversion reads it (the tape told), then replayed on
    tensors = [_read_operand(t, operators.watchers) if isinstance(t, _VARIABLES) else t
               for t in tensors]
    return template.replay(tensors, [n if on else _node_of(t, n) for t, n, on in found],
                           seen, ctx)


def _first_call(key: tuple, function: Callable, args: tuple, kwargs: dict, found: list,
                indices: bool) -> Any:
    """``function(*args, **kwargs)`` by TensorFlow's path, its template kept under ``key``
    when what it recorded can be replayed (see :func:`_record_function`)."""
    if any(on and n.sig[1] in _COMPUTED_ENUMS and n.op in ir.LEAF_OPS for _, n, on in found):
        # the values of an integer or bool leaf are known: TensorFlow's path may fold them
        return function(*args, **kwargs)      # (learnt from a call on computed ones)
    before = (metrics._counters["barriers"], READS[0], _host_runs[0])
    uses = _value_uses[0]
    serial = next(ir.serials)
    guarded = _value_guard[0]
    if indices:
        _value_guard[0] = (guarded or frozenset()) | {
            _buffer(t) for t, sig, on in found if not on and sig[1] in _INDEX_ENUMS}
    try:
        out = function(*args, **kwargs)
    finally:
        _value_guard[0] = guarded
    if before == (metrics._counters["barriers"], READS[0], _host_runs[0]):
        if len(_templates) >= raw.SPECS_MAX:
            _templates.clear()
        _templates[key] = None if _value_uses[0] != uses else _learn(found, serial, out)
    # else a barrier, a value read or a host op ran inside (a forward accumulator's
    # derivative, a graph-size cut): learnt from a later call
    return out


def _argument_key(value: Any, found: list, indices: bool = False) -> tuple:
    """A function argument as part of a key: a float tensor or variable of the device (or an
    int32, int64 or bool tensor of the device: a comparison, an argmax), or a float host
    tensor of rank 1 or more (a batch; with ``indices``, an int32/int64 one too: a batch of
    labels), by its signature (appended to ``found``), a Python value (a number, flag, name,
    dtype, or list of them) by its value and type (``np.int64`` axes give another constant
    than ``int`` ones); TypeError for anything else."""
    kind = type(value)
    if isinstance(value, _VARIABLES):   # read by TensorFlow's conversion: its current value
        state = _readable_state(value)
        if state is None or state._node.sig[1] not in _OPERATOR_ENUMS:
            raise TypeError(kind)
        found.append((value, state._node, True))
        return "tensor", True, state._node.sig
    if kind is ops.EagerTensor:
        t = payload_of(value)
        if type(t) is LazyTensor:
            sig = t._node.sig
            found.append((value, t._node, True))
        elif t is None:   # (a host scalar's leaf would hold its number, not the tensor)
            sig = (value._shape_tuple(), value._datatype_enum())
            if not sig[0]:
                raise TypeError("a host scalar")
            found.append((value, sig, False))
        else:
            raise TypeError(kind)
        if sig[1] not in (_DEVICE_ARGUMENT_ENUMS if t is not None else
                          _INDEX_ARGUMENT_ENUMS if indices else _OPERATOR_ENUMS):
            raise TypeError(kind)
        return "tensor", t is not None, sig
    return _python_key(value)


def _python_key(value: Any) -> tuple:
    """A Python argument by its value and type: a number, flag, name, dtype, ``...``, a slice
    of them, or a list or tuple of these (an index ``x[1:, ..., 0]``); TypeError for anything
    else."""
    kind = type(value)
    if kind in _ARGUMENT_TYPES:
        return kind, value
    if kind is slice:
        return kind, _python_key(value.start), _python_key(value.stop), _python_key(value.step)
    if kind in (list, tuple):
        return kind, tuple([_python_key(v) for v in value])
    raise TypeError(kind)


def _learn(found: list, serial: int, out: Any) -> _Template | None:
    """The template of what a function call just recorded (``out``, its result; nodes made
    after creation stamp ``serial``) on its tensor arguments ``found``, or None where a
    replay could differ: a result that is not an output of a new op, an input from outside
    the call (a tensor recorded before it, a variable, a value computed before it).  A host
    value made inside the call (``tf.zeros_like``'s zeros, a shape) is a leaf of the
    template: these functions make them from shapes and dtypes."""
    t = payload_of(out) if type(out) is ops.EagerTensor else None
    if type(t) is not LazyTensor or t._node.serial < serial:
        return None
    # an argument's value passed twice: its first place (the key says which are the same)
    where: dict = {}
    for k, f in enumerate(found):
        where.setdefault(_place(*f), k)
    done: dict = {}
    order: list = []
    stack = [(t._node, False)]
    while stack:                          # the ops under the result, inputs first
        n, ready = stack.pop()
        if id(n) in done:
            continue
        k = where.get(("node", id(n)))
        if k is None and n.op == "data" and n.serial >= serial:
            k = where.get(("host", _buffer(n.value)))
        if k is not None:
            done[id(n)] = (_ARG, k)
        elif n.op in ("const", "scalar") or (n.op == "data" and n.serial >= serial):
            done[id(n)] = (_LEAF, n)      # a constant or host value made inside the call
        elif n.op not in ("raw", "out") or n.serial < serial:
            return None
        elif ready:
            if n.op == "out":             # output i of an op of several: that op's step's
                (j, _) = done[id(n.inputs[0])][1]
                done[id(n)] = (_STEP, (j, n.attrs[0]))
            else:
                done[id(n)] = (_STEP, (len(order), 0))
                order.append(n)
        else:
            stack.append((n, True))
            stack.extend((x, False) for x in reversed(n.inputs))
    steps = []
    leaves: dict = {}
    for n in order:
        recipe = _recipes.get((*n.attrs, *map(_recipe_sig, n.inputs)))
        if recipe is None:
            return None
        refs = tuple([done[id(x)] for x in n.inputs])
        leaves.update((id(leaf), _leaf_tensor(leaf)) for kind, leaf in refs if kind is _LEAF)
        steps.append((recipe, refs, n.attrs[0], _tape_attrs(n.attrs[1])))
    return _Template(steps, leaves, all(attrs is not None for *_, attrs in steps),
                     done[id(t._node)][1])


def _place(x: Any, n: Any, on_device: bool) -> tuple:
    """Where an argument's value lives: a device argument in its node (two tensors, or a
    variable and its read, may share one); a host argument in its buffer (the device sees a new
    Python tensor sharing it)."""
    return ("node", id(n)) if on_device else ("host", _buffer(x))


def _buffer(t: tf.Tensor) -> tuple:
    """The host buffer of eager host tensor ``t`` (its address, dtype and shape)."""
    array = t._numpy_internal()
    return array.__array_interface__["data"][0], array.dtype.str, array.shape


def _tape_attrs(attrs: bytes) -> tuple | None:
    """Canonical attrs bytes as the flat ``(name, value, ...)`` tuple a gradient tape gets
    (types, bools, ints, floats and lists of ints only; None for other kinds)."""
    flat: list = []
    for name, value in sorted(raw.attr_map(attrs).items()):
        kind = value.WhichOneof("value")
        if kind in ("type", "b", "i", "f"):
            flat += [name, getattr(value, kind)]
        elif kind == "list" and all(f.name == "i" for f, _ in value.list.ListFields()):
            flat += [name, list(value.list.i)]
        else:
            return None
    return tuple(flat)


def _leaf_tensor(leaf: Node) -> tf.Tensor:
    """The host tensor of a constant or host-value leaf, as a tape gets it."""
    if leaf.op == "data":
        return leaf.value
    value, dtype = (leaf.attrs if leaf.op == "const" else (leaf.value, leaf.dtype))
    if dtype is None:           # a Python value: converted as TensorFlow converts it
        with ops.device(HOST):
            return tf.constant(value)
    return _host_constant(np.array(value, dtype.as_numpy_dtype))


# }}}


def _readable_state(v: Any) -> DeviceVariable | None:
    """The device state of variable ``v`` when TensorFlow would read it with a plain
    ``ReadVariableOp`` (no cached value, no caching device); else None."""
    state = _variable_state(v)
    if state is None or v._cached_value is not None or \
            getattr(v, "_caching_device", None) is not None:
        return None
    return state


def _read_operand(v: Any, watchers: Callable[[], int]) -> tf.Tensor | None:
    """``v.value()`` of a device variable, an operand of a Python operator, read as
    :func:`_read_variable` reads it but without TensorFlow's op wrappers, when ``watchers``
    are none or gradient tapes (given the read as TensorFlow gives it); None otherwise
    (TensorFlow's path)."""
    state = _readable_state(v)
    if state is None:
        return None
    seen = watchers()
    if seen == operators.BLOCKED or _reaching_device() is None:
        return None
    resource_variable_ops.variable_accessed(v)     # as TensorFlow's read: the tape and graph
    v._variable_read = True
    if units.PROBES:
        units.note_read(state)
    out = make_tensor(LazyTensor(state._node))
    if seen == operators.TAPED:
        _record_gradient("ReadVariableOp", [v._handle], ("dtype", state.dtype.as_datatype_enum),
                         [out])
    return out


def _variable_value(v: Any) -> tf.Tensor | None:
    """What ``v.numpy()`` reads of a device variable, eagerly and with no op callback: its
    current value on the host (pending updates computed first), told to the tape as
    TensorFlow's read tells it, without recording a read on the device; None otherwise
    (TensorFlow's path)."""
    state = _readable_state(v)
    if state is None or not context.executing_eagerly() or context.context().op_callbacks:
        return None
    resource_variable_ops.variable_accessed(v)
    return runtime.read_host(state.flush(f"variable {state.name!r} read off the lazy device"),
                             state.dtype)


def _update_variable(op_type: str, v: Any, value: Any, watchers: Callable[[], int]) -> bool:
    """``v.assign(value)`` (``op_type``: its op, or the ``_add``/``_sub`` one's) of a device
    variable and a device tensor or variable of its shape and dtype, or of a number when the
    variable is a scalar (a step counter's ``assign_add(1)``), substituted as :func:`_assign`
    does but without TensorFlow's op wrappers, when nothing else watches it (``watchers``);
    False when not done (TensorFlow's path)."""
    state = _variable_state(v)
    if state is None or watchers() != operators.FREE or _reaching_device() is None:
        return False
    if isinstance(value, _VARIABLES):     # as TensorFlow's conversion: its value, read now
        value = _read_operand(value, watchers)
        if value is None:
            return False
    if type(value) is ops.EagerTensor:
        t = payload_of(value)
        if type(t) is not LazyTensor or t._node.sig != state._read.sig:
            return False
        node = t._node
    else:
        node = _number_node(value, state)
        if node is None:
            return False
    _update(state, op_type, node)
    return True


_INT_ENUMS = frozenset({tf.int32.as_datatype_enum, tf.int64.as_datatype_enum})


def _number_node(value: Any, state: DeviceVariable) -> Node | None:
    """The node of a Python or NumPy number assigned to scalar variable ``state``, as
    TensorFlow would convert it (a parameter, never a constant); None where TensorFlow's
    conversion differs or fails (a float for an integer variable, an integer a double cannot
    hold, other dtypes)."""
    if state.shape != ():
        return None
    enum = state._read.sig[1]
    if enum in _OPERATOR_ENUMS:
        number = _as_double(value)
        return None if number is None else \
            Node("scalar", (), (), (), state.dtype, number, None, ((), enum))
    if enum not in _INT_ENUMS or not isinstance(value, (int, np.integer)):
        return None
    bounds = np.iinfo(state.dtype.as_numpy_dtype)
    if not bounds.min <= int(value) <= bounds.max:
        return None
    return _node_of(_host_constant(np.array(int(value), state.dtype.as_numpy_dtype)))


def _as_double(number: Any) -> float | None:
    """A Python or NumPy number as the double a scalar parameter carries; None for an integer
    a double cannot hold (it would be rounded twice on its way to the tensor's dtype)."""
    value = float(number)
    if not isinstance(number, (float, np.floating)) and value != int(number):
        return None
    return value


def _fold(op: raw.RawOp, nodes: list, cap: Any) -> list:
    """Evaluate an integer op on small values known on the host now (its outputs are host
    tensors, so the shapes they make stay static)."""
    metrics.bump(f"folded::{op.type}")
    values = [runtime._eager_value(n) for n in nodes]
    _note_value_use(values)
    return _host_run(cap, values, HOST)


_DATA_FETCH = frozenset({"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional"})


def _run_on_host(op: raw.RawOp, inputs: tuple, cap: Any, kind: str, reason: str) -> list:
    """Run the op on the host, as eager TensorFlow would, after forcing its lazy inputs."""
    _host_runs[0] += 1
    tape_capture.taint_recording(f"{kind} op {op.type}")
    units.taint(f"a {kind} op {op.type}")
    if kind == "fallback":
        runtime.count_fallback(op.type, reason)
    else:
        metrics.bump(f"host::{op.type}")
        if reason == "a function call":
            _check_keras_loop()
    if op.type in _DATA_FETCH:
        runtime.barrier("tf.data batch fetched")  # a new batch starts a step
    elif any(type(x) is DeviceVariable for x in inputs):
        # The op may update the variable in place: every pending read of it (and its pending
        # update) is computed first.
        runtime.barrier(f"{kind} op {op.type} uses a variable")
    values = []
    for x in inputs:
        if type(x) is LazyTensor:
            x = value(x, f"{kind} op {op.type}")
        elif type(x) is DeviceVariable:
            x = x.flush(f"{kind} op {op.type} uses variable {x.name!r}")
        values.append(x)
    runtime.wait()
    return _host_run(cap, values, HOST)


_KERAS_LOOPS = ("fit", "train_on_batch", "evaluate", "test_on_batch", "predict",
                "predict_on_batch")


def _check_keras_loop() -> None:
    """A Keras training loop inside the scope must run compiled by XLA or record lazily."""
    f = sys._getframe(2)
    while f is not None:
        code = f.f_code
        if code.co_name in _KERAS_LOOPS and "/keras/" in code.co_filename:
            model = f.f_locals.get("self")
            if model is not None and getattr(model, "jit_compile", True) is not True:
                raise LazyError(
                    f"Keras {code.co_name}() inside lazy.device() runs its own tf.function "
                    "step, and this model's step is not XLA-compiled (jit_compile="
                    f"{getattr(model, 'jit_compile', None)!r}).  Compile the model with "
                    "jit_compile=True (the step then runs as one XLA program), or with "
                    "run_eagerly=True so that lazy.device() records each step")
            return
        f = f.f_back
# }}}


# {{{ copies on and off the device

def _to_device(t: tf.Tensor) -> tuple:
    n = Node("data", (), (), tuple(t._shape_tuple()), t.dtype, t)
    return _spec(LazyTensor(n))


def _from_device(payload: Any) -> tf.Tensor:
    if threading.get_ident() != _owner[0]:
        _check_thread()
    runtime.check_no_strategy("a lazy tensor was read")
    if type(payload) is DeviceVariable:
        return payload.flush(f"variable {payload.name!r} read off the lazy device")
    # tf.function captures a small eager tensor by value when it traces: so does this.
    return force(payload, lambda: f"value read at {runtime.user_frame()}")
# }}}
