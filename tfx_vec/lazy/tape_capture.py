"""``tf.GradientTape`` on the lazy device: a gradient recorded as one node, not op by op.

Without this stage a ``tf.GradientTape`` works on device tensors unchanged: its backward
functions are ordinary eager ops, which the device records.  But those backward functions are
Python, and on small models they cost more than everything else in a step.  So, when it is
safe, ``tape.gradient`` records a single ``grad`` node instead (as ``lazy.GradientTape``
does): the compiled program replays the tape's window of recorded ops under a
``tf.GradientTape`` and calls TensorFlow's own ``gradient`` there, so forward and backward
compile together and the backward Python runs once per compilation, not once per step.

The hooks wrap four of TensorFlow's tape functions (``tape.push_new_tape``, ``push_tape``,
``pop_tape``, ``watch``) to know each tape's recording window (creation stamps of the recorded
nodes) and watched tensors, ``record.record_operation`` (custom gradients and ``tf.function``
calls record Python backward functions that a replay cannot see) and
``imperative_grad.imperative_grad`` (where ``GradientTape.gradient`` computes).  A gradient is
recorded as a node only when the replay is exact; otherwise TensorFlow's own backward runs on
the device (recorded op by op, correct, slower), counted as ``tape_eager::<reason>``:

- one target, a lazy device tensor; sources are lazy device tensors or variables on the device;
- the tape recorded in one window (no ``stop_recording``) and no other tape is recording;
- nothing in the window that a replay cannot differentiate: a barrier (a value read), a host
  or fallback op, a custom gradient or a ``tf.function`` call; no watched host tensor;
- no source variable assigned since the window began;
- no source gathered from (an embedding): TensorFlow's gradient is then ``IndexedSlices``,
  which Keras' optimizers apply as a sparse update, unlike a dense gradient.

Sources follow TensorFlow's rules: a variable counts when the tape watched it (trainable and
read inside the window, or ``watch``-ed), a tensor when it was watched or computed inside the
window from something watched, and a gradient flows along floating and complex values only,
never through an integer cast, ``tf.stop_gradient`` or an op whose gradient TensorFlow
leaves None (``tf.floor``, ``tf.round``); others get ``None`` (or zeros with
``unconnected_gradients=ZERO``).  A recorded gradient still pending when a forward
accumulator computes an op's derivative (a ``tf.function`` call that reads its inputs) is a
:class:`LazyGradientError` (:func:`check_barrier`): traced there, its replay came back zero.

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec import lazy
    >>> with lazy.device():
    ...     w = tf.Variable([1.0, 2.0])
    ...     lazy.mark_step()
    ...     with tf.GradientTape() as tape:
    ...         loss = tf.reduce_sum(w * w)
    ...     g = tape.gradient(loss, w)
    ...     g.numpy().tolist(), lazy.metrics()["tape_recorded"]
    ([2.0, 4.0], 1)
"""
from __future__ import annotations

import collections
import sys
from typing import Any

import tensorflow as tf
from tensorflow.python import pywrap_tfe as _pywrap_tfe
from tensorflow.python.eager import backprop as _backprop
from tensorflow.python.eager import forwardprop as _forwardprop
from tensorflow.python.eager import imperative_grad as _imperative_grad_module
from tensorflow.python.eager import record as _record_module
from tensorflow.python.eager import tape as _tape_module
from tensorflow.python.framework import dtypes as _dtypes
from tensorflow.python.framework import ops as _ops
from tensorflow.python.ops import resource_variable_ops as _rv

from . import custom_device as _device   # (both import this module: names read at call time)
from . import ir, metrics, runtime, units
from .errors import LazyGradientError
from .ir import LEAF_OPS, Node
from .tape import _ancestors, differentiable
from .tensor import LazyTensor

__all__ = ["install", "TapeState", "taint_recording", "taint_live", "float_or_complex",
           "check_barrier"]

_MAX_TAPES = 256
_FLOAT_OR_COMPLEX = frozenset(e for e, d in _dtypes._INTERN_TABLE.items()
                              if d.is_floating or d.is_complex)   # dtype enums
_DIFFERENTIABLE = _FLOAT_OR_COMPLEX | {tf.resource.as_datatype_enum}


def float_or_complex(t: Any, resource: bool = False) -> bool:
    """Whether a tensor's dtype is floating or complex (or ``resource``, when asked): an eager
    tensor's is read as its enum, without ``tf.DType``'s Python properties.

    >>> float_or_complex(tf.constant(1.0)), float_or_complex(tf.constant(1))
    (True, False)
    """
    if type(t) is _ops.EagerTensor:
        return t._datatype_enum() in (_DIFFERENTIABLE if resource else _FLOAT_OR_COMPLEX)
    return t.dtype.is_floating or t.dtype.is_complex or (resource and t.dtype == tf.resource)


class TapeState:
    """What the hooks know about one TensorFlow tape: its window, watches and taint."""

    __slots__ = ("start", "end", "windows", "tainted", "watched")

    def __init__(self) -> None:
        self.start = next(ir.serials)
        self.end: int | None = None
        self.windows = 1
        self.tainted = ""                 # why a replay would not be exact ("" if it would)
        self.watched: set = set()         # nodes watched by tape.watch


_states: "collections.OrderedDict[int, TapeState]" = collections.OrderedDict()
_grads_pending = [0]   # gradients recorded as one node since the last barrier
_untainted: dict[int, TapeState] = {}   # the states of _states no barrier tainted yet
_recording: dict[int, TapeState] = {}
_original: dict = {}


def taint_recording(reason: str) -> None:
    """Something a replay cannot differentiate happened: tapes recording now cannot replay."""
    for state in _recording.values():
        state.tainted = state.tainted or reason


def taint_live(reason: str) -> None:
    """A barrier replaced recorded values by data: no tape alive now can replay.  (Each
    barrier calls it: it visits the tapes created since the last one, not all kept.)"""
    _grads_pending[0] = 0
    for state in _untainted.values():
        state.tainted = state.tainted or reason
    _untainted.clear()


# {{{ the hooks

def _push_new_tape(persistent: bool = False, watch_accessed_variables: bool = True) -> Any:
    units.taint("a gradient tape")
    t = _original["push_new_tape"](persistent, watch_accessed_variables)
    state = _states[id(t)] = _untainted[id(t)] = TapeState()
    while len(_states) > _MAX_TAPES:   # a tape gone long ago: its gradient runs eagerly
        _untainted.pop(_states.popitem(last=False)[0], None)
    _recording[id(t)] = state
    return t


def _push_tape(t: Any) -> None:
    _original["push_tape"](t)
    state = _states.get(id(t))
    if state is not None:
        state.windows += 1
        _recording[id(t)] = state


def _pop_tape(t: Any) -> None:
    _original["pop_tape"](t)
    state = _recording.pop(id(t), None)
    if state is not None:
        state.end = next(ir.serials)


def _watch(t: Any, tensor: Any) -> None:
    _original["watch"](t, tensor)
    state = _states.get(id(t))
    if state is None:
        return
    from .custom_device import payload_of
    p = payload_of(tensor)
    if type(p) is LazyTensor:
        state.watched.add(p._node)
    else:
        state.tainted = state.tainted or "a host tensor is watched"


def _record_operation(*args: Any, **kwargs: Any) -> Any:
    units.taint("a custom gradient or tf.function call")
    if _recording:
        taint_recording("a custom gradient or tf.function call")
    return _original["record_operation"](*args, **kwargs)


def _record_operation_backprop_only(*args: Any, **kwargs: Any) -> Any:
    units.taint("a custom gradient or tf.function call")
    if _recording:
        taint_recording("a custom gradient or tf.function call")
    return _original["record_operation_backprop_only"](*args, **kwargs)


def _imperative_grad(tape: Any, target: list, sources: list, output_gradients: Any = None,
                     sources_raw: Any = None,
                     unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> list:
    units.taint("a gradient")
    plan = _plan(tape, target, sources, output_gradients)
    if isinstance(plan, str):
        if plan:
            metrics.bump(f"tape_eager::{plan}")
        return _original["imperative_grad"](tape, target, sources, output_gradients,
                                            sources_raw, unconnected_gradients)
    return _record(plan, sources, unconnected_gradients)
# }}}


def _plan(tape: Any, targets: list, sources: list, output_gradients: Any) -> Any:
    """The nodes of a gradient that can be recorded as one node, or the reason it cannot
    ("" when no lazy tensor is involved)."""
    DeviceVariable, payload_of = _device.DeviceVariable, _device.payload_of
    if not runtime.CONFIG.record_calls:
        return ""
    if len(targets) != 1:
        return "several targets" if any(payload_of(t) is not None for t in targets) else ""
    target = payload_of(targets[0])
    if type(target) is not LazyTensor:
        return ""
    state = _states.get(id(tape))
    if state is None:
        return "an unknown tape"
    if state.tainted:
        return state.tainted
    if state.windows != 1:
        return "stop_recording"
    if any(s is not state for s in _recording.values()):
        return "another tape is recording"
    start, end = state.start, state.end if state.end is not None else next(ir.serials)
    # payload_of without its Python call per tensor (the device is registered: its hooks run)
    payload, name = _device._native[0].payload, _device.DEVICE_NAME
    watched_vars = [payload(v.handle, name) for v in tape.watched_variables()]
    watched = set(state.watched)   # what TensorFlow's tape watches, as nodes
    watched.update(p._node for p in watched_vars if type(p) is DeviceVariable)
    watched_vars = {id(p) for p in watched_vars}
    nodes = []
    for s in sources:
        if not float_or_complex(s, resource=True):
            return "an integer source"
        p = payload(s, name)
        if type(p) is DeviceVariable:
            if p.last_assign >= start:
                return "a source variable was assigned"
            nodes.append((p._node, id(p) in watched_vars))
        elif type(p) is LazyTensor:
            nodes.append((p._node, None))
        else:
            return "a host tensor source"
    og = None
    if output_gradients is not None:
        if len(output_gradients) != 1 or output_gradients[0] is None:
            return "output gradients"
        p = payload_of(output_gradients[0])
        og = p._node if type(p) is LazyTensor else None
        if og is None:
            return "a host output gradient"
    ancestors = _ancestors(target._node, start, end)
    if _gathered(ancestors, {n for n, _ in nodes}):
        return "a gather from a source (TensorFlow's gradient is IndexedSlices)"
    return target._node, nodes, og, watched, start, end, ancestors


_GATHERS = frozenset({"GatherV2", "Gather", "ResourceGather"})


def _gathered(ancestors: set, sources: set) -> bool:
    """Whether a source is gathered from on the way to the target: TensorFlow's gradient is
    then ``IndexedSlices``, which Keras' optimizers apply as a sparse update (rows not gathered
    keep their slots), so a dense recorded gradient would not give eager's answer."""
    return any(n.op == "raw" and n.attrs[0] in _GATHERS and n.inputs[0] in sources
               for n in ancestors)


def _record(plan: tuple, sources: list, unconnected_gradients: Any) -> list:
    target, nodes, og, watched, start, end, ancestors = plan
    on_tape: dict = {}

    def taped(n: Node) -> bool:   # TensorFlow's rule: watched, or made in the window from it
        hit = on_tape.get(n)          # (by an input a gradient flows through)
        if hit is None:
            hit = n in watched or (
                n.op not in LEAF_OPS and start <= n.serial < end and
                any(taped(x) and differentiable(x) for x in n.inputs))
            on_tape[n] = hit
        return hit
    zero = tf.UnconnectedGradients(unconnected_gradients) == tf.UnconnectedGradients.ZERO
    picked = []
    for k, (n, var_watched) in enumerate(nodes):
        if zero or (n in ancestors and (var_watched if var_watched is not None else taped(n))):
            picked.append(k)
    metrics.bump("tape_recorded")
    _grads_pending[0] += 1
    results: list = [None] * len(sources)
    if picked:
        inputs = (target, *[nodes[k][0] for k in picked]) + ((og,) if og is not None else ())
        g = Node("grad", inputs, (len(picked), int(og is not None), start, end), None, None)
        sources_of = [nodes[k][0] for k in picked]
        outs = Node.outputs(g, [(n.shape, n.dtype, n.sig) for n in sources_of])
        for k, t in zip(picked, _device.make_tensors(outs)):
            results[k] = t
    return results


_JVP = _forwardprop._jvp_dispatch.__code__   # where an accumulator computes an op's jvp


def check_barrier() -> None:
    """A clear error, before anything is computed, where a barrier holding a recorded gradient
    would run inside a forward accumulator's computation of an op's derivative (TensorFlow runs
    it as a ``tf.function`` call, which reads its inputs on the device): traced there, the
    gradient's replay comes back zero."""
    if not _grads_pending[0] or not _pywrap_tfe.TFE_Py_TapeSetIsStopped():
        return
    f = sys._getframe(1)
    while f is not None:
        if f.f_code is _JVP:
            raise LazyGradientError(
                "a tf.GradientTape gradient recorded on the lazy device was still pending when "
                "a tf.autodiff.ForwardAccumulator computed the derivative of an op, which "
                "reads the op's inputs; computed there, the gradient would come back zero.  "
                "Read the gradient or call lazy.mark_step() before the accumulator's block, "
                "or let gradients run op by op with lazy.configure(record_calls=False) (at "
                f"{runtime.user_frame()})")
        f = f.f_back


def _flat_sources(tape: Any, target: Any, sources: Any, output_gradients: Any) -> Any:
    """The flat sources of ``tape.gradient(target, sources)`` (``sources`` listed) when the
    call is the plain case (one lazy device tensor as target, variables and eager tensors as
    sources, no output gradients, a tape that can compute now); ``None`` otherwise."""
    if output_gradients is not None or type(target) is not _ops.EagerTensor or \
            tape._tape is None or (tape._recording and tape._persistent):
        return None
    payload_of = _device.payload_of
    if type(payload_of(target)) is not LazyTensor:
        return None
    keras_variable = _plain_keras_variable()
    flat = []
    for s in sources:
        t = type(s)
        if t is _ops.EagerTensor:
            if getattr(s, "is_packed", False):
                return None
            flat.append(s)
        elif t is keras_variable and s._value is not None:
            flat.append(s._value.handle)   # what its ``handle`` returns, without its Python
        elif _rv.is_resource_variable(s):
            flat.append(s.handle)
        else:
            return None
    return flat


def _plain_keras_variable() -> Any:
    """Keras' variable class when a Keras variable's ``handle`` is its inner ``tf.Variable``'s
    (no stateless or autocast scope is open: its ``value`` is then ``_value``), else None."""
    global_state, get_autocast_scope, variable = units._keras
    if variable is None or get_autocast_scope() is not None or \
            global_state.get_global_attribute("stateless_scope") is not None:
        return None
    return variable


def _gradient(original: Any) -> Any:
    """``GradientTape.gradient`` with a short path for the plain case on the lazy device (one
    source, or a list or tuple of them): the same steps as TensorFlow's (pop the tape,
    ``imperative_grad``, release a non-persistent tape) without its generic flattening,
    conversions and dtype logging, which cost more than recording the gradient.  Every other
    call runs TensorFlow's own method."""
    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        single = type(sources) is not list and type(sources) is not tuple
        listed = [sources] if single else sources     # what TensorFlow's flatten makes of it
        flat = _flat_sources(self, target, listed, output_gradients) if runtime.CONFIG.\
            record_calls else None
        if flat is None:
            return original(self, target, sources, output_gradients, unconnected_gradients)
        if self._recording:
            self._pop_tape()
        grads = _imperative_grad_module.imperative_grad(
            self._tape, [target], flat, output_gradients=None, sources_raw=list(listed),
            unconnected_gradients=unconnected_gradients)
        if not self._persistent:
            self._watched_variables = self._tape.watched_variables()
            self._tape = None
        return grads[0] if single else type(sources)(grads)
    gradient.__wrapped__ = original
    gradient.__doc__ = original.__doc__
    return gradient


def install() -> None:
    """Wrap TensorFlow's tape functions (idempotent; see the module docstring)."""
    if _original:
        return
    _original["gradient"] = _backprop.GradientTape.gradient
    _backprop.GradientTape.gradient = _gradient(_backprop.GradientTape.gradient)
    for module, name, hook in ((_tape_module, "push_new_tape", _push_new_tape),
                               (_tape_module, "push_tape", _push_tape),
                               (_tape_module, "pop_tape", _pop_tape),
                               (_tape_module, "watch", _watch),
                               (_record_module, "record_operation", _record_operation),
                               (_record_module, "record_operation_backprop_only",
                                _record_operation_backprop_only),
                               (_imperative_grad_module, "imperative_grad", _imperative_grad)):
        _original[name] = getattr(module, name)
        setattr(module, name, hook)
