"""Library calls recorded as one node: a Keras optimizer's update, replayed by Keras itself.

A Keras optimizer's ``apply_gradients`` issues ten to twenty small ops per variable from
Python; run op by op on the device it costs more than everything else in a training step.
Inside ``lazy.device()``, once the optimizer is built, ``apply`` is recorded as a single
``call`` node instead: its inputs are the gradients and the variables it updates (its own and
the model's), its outputs their new values.  When the compiled program is traced, the node
replays Keras' own ``apply`` on the program's variable arguments (each variable's handle is
pointed at the program's resource for the duration of the trace), exactly as ``model.fit``
traces it into its ``tf.function``; XLA compiles it with the rest of the step.  The next read of
each variable sees the new value, as in eager.

A call is recorded only when the replay is exact: the gradients are lazy device tensors (no
``None``, no ``IndexedSlices``), every variable involved lives on the device, no gradient tape
is recording and the optimizer is built (its first call, which
creates its slots, runs op by op); a variable's pending update is written before the call.
Otherwise Keras' own ``apply`` runs on the device op by op, counted as
``call_eager::<reason>``.  Python-side hyperparameters (``beta_1``...) are part
of the compiled program, as in ``model.fit``; values kept in variables (``learning_rate``,
``iterations``) are read at run time.

Example:
    >>> import keras, tensorflow as tf
    >>> from tfx_vec import lazy
    >>> with lazy.device():
    ...     w = keras.Variable([1.0, 2.0])
    ...     opt = keras.optimizers.SGD(0.5)
    ...     g = tf.constant([1.0, 1.0]) * 1.0            # a lazy gradient
    ...     opt.apply([g], [w])                         # builds the optimizer (op by op)
    ...     opt.apply([g], [w])                         # recorded as one node
    ...     lazy.mark_step()
    ...     w.numpy().tolist(), lazy.metrics()["calls_recorded"]
    ([0.0, 1.0], 1)
"""
from __future__ import annotations

import itertools
import sys
import weakref
from typing import Any, Callable

import tensorflow as tf

from . import custom_device as _device   # (it imports this module: names read at call time)
from . import metrics, runtime, tape_capture
from .ir import Node
from .tensor import LazyTensor

__all__ = ["CallSpec", "CALLS", "record_call", "replay_call", "install_keras"]

_tokens = itertools.count()


class CallSpec:
    """A recordable call: ``fn(inputs)`` replayed with ``variables`` pointed at the program's
    resources; the node's outputs are ``fn``'s flat outputs (``outs``: their (shape, dtype)),
    then the values after it of the variables at the ``assigned`` positions."""

    __slots__ = ("fn", "variables", "outs", "assigned", "sigs", "states", "assigned_sigs",
                 "memo", "__weakref__")

    def __init__(self, fn: Callable[[list], Any], variables: list, outs: tuple = (),
                 assigned: tuple | None = None):
        self.fn = fn
        self.variables = variables   # tf.Variables, in the node's order
        self.outs = outs
        self.assigned = tuple(range(len(variables))) if assigned is None else assigned
        self.sigs: list | None = None   # (shape, dtype, sig) of the outs, on first record
        # the variable states of the last record and the (shape, dtype, sig) of the assigned
        # ones (a state's are fixed), and Node.outputs' memos of the outs and the new values
        self.states: list = []
        self.assigned_sigs: list = []
        self.memo: tuple = ([], [])


CALLS: "weakref.WeakValueDictionary[int, CallSpec]" = weakref.WeakValueDictionary()


def record_call(spec: CallSpec, token: int, inputs: list, states: list) -> list:
    """Record ``spec`` on input nodes; returns the nodes of its outputs and substitutes each
    assigned variable state by its new value.

    The node's inputs are the call's own, then each variable's ``var`` leaf (its resource in the
    program), then its current value (a pending update is written before the call).
    """
    base = Node("call", (*inputs, *[s._read for s in states], *[s._node for s in states]),
                (token, len(inputs)), None, None)
    sigs = spec.sigs
    if sigs is None:
        sigs = spec.sigs = [(shape, dtype, (shape, dtype.as_datatype_enum))
                            for shape, dtype in spec.outs]
    outs = Node.outputs(base, sigs, 0, spec.memo[0])
    assigned = [states[i] for i in spec.assigned]
    if spec.states != states:   # DeviceVariables compare by identity
        # An ``out`` node of a variable has the variable's shape and dtype: no check to make.
        spec.assigned_sigs = [(s.shape, s.dtype, s._read.sig) for s in assigned]
        spec.states = list(states)
    news = Node.outputs(base, spec.assigned_sigs, len(outs), spec.memo[1])
    _device.assign_all(assigned, news)
    metrics.bump("calls_recorded")
    return outs


def replay_call(token: int, args: list, resources: list, current: list) -> list:
    """Inside the program's trace: write the variables' ``current`` values (``None``: the
    resource holds it already), run the call on ``args`` with their handles pointed at
    ``resources``, and return its outputs, then the new values of the assigned variables."""
    from .lowering import assign_variable, read_variable
    spec = CALLS.get(token)
    if spec is None:
        raise RuntimeError("a recorded call whose object is gone was compiled")
    for r, value in zip(resources, current):
        if value is not None:
            assign_variable(r, value)
    saved = [v._handle for v in spec.variables]
    try:
        for v, r in zip(spec.variables, resources):
            v._handle = r
        outs = spec.fn(args)
    finally:
        for v, h in zip(spec.variables, saved):
            v._handle = h
    variables = spec.variables
    return list(outs or ()) + [read_variable(resources[i], variables[i].dtype)
                               for i in spec.assigned]


# {{{ Keras optimizers

def _tf_variable(v: Any) -> Any:
    inner = getattr(v, "_value", None)
    return inner if isinstance(inner, tf.Variable) else v if isinstance(v, tf.Variable) else None


def _state_of(v: Any) -> Any:
    from .custom_device import DeviceVariable, payload_of
    tfv = _tf_variable(v)
    p = None if tfv is None else payload_of(tfv.handle)
    return (tfv, p) if type(p) is DeviceVariable else (tfv, None)


def _plan_apply(optimizer: Any, grads: Any, trainable_variables: Any) -> Any:
    """(gradient nodes, variable states, tf.Variables, Keras variables) or a reason string."""
    if not runtime.CONFIG.record_calls:
        return "lazy.configure(record_calls=False)"
    if not getattr(optimizer, "built", False) or trainable_variables is None:
        return "not built"
    if tape_capture._recording or not tf.executing_eagerly():
        return "a tape is recording"
    grads, kvars = list(grads), list(trainable_variables)
    nodes = []
    payload, name = _device._native[0].payload, _device.DEVICE_NAME   # payload_of, inline
    for g in grads:
        p = payload(g, name)   # None for anything but a device tensor
        if type(p) is not LazyTensor:
            return "a gradient that is not a lazy tensor"
        nodes.append(p._node)
    all_vars = kvars + list(optimizer.variables)
    ids = tuple(map(id, all_vars))
    known = optimizer.__dict__.get("_tfx_vec_lazy_states")
    if known is not None and known[0] == ids:   # the same variables as last time (kept alive)
        return nodes, known[2], known[3], kvars
    states, tf_vars = [], []
    for v in all_vars:
        tfv, state = _state_of(v)
        if state is None:
            return "a variable off the lazy device"
        states.append(state)
        tf_vars.append(tfv)
    optimizer.__dict__["_tfx_vec_lazy_states"] = (ids, all_vars, states, tf_vars)
    return nodes, states, tf_vars, kvars


def _apply(original: Callable) -> Callable:
    def apply(self, grads, trainable_variables=None):
        if not _device._registered[0]:
            return original(self, grads, trainable_variables)
        plan = _plan_apply(self, grads, trainable_variables)
        if isinstance(plan, str):
            if any(isinstance(g, tf.Tensor) and g.device.endswith("LAZY:0") for g in grads):
                metrics.bump(f"call_eager::{plan}")
            return original(self, grads, trainable_variables)
        nodes, states, tf_vars, kvars = plan
        key = tuple(map(id, states))
        cache = self.__dict__.setdefault("_tfx_vec_lazy_calls", {})
        hit = cache.get(key)
        if hit is None:
            def update(args: list, kv: list = kvars) -> tuple:
                original(self, list(args), kv)
                return ()
            spec = CallSpec(update, tf_vars)
            hit = cache[key] = (next(_tokens), spec)
            CALLS[hit[0]] = spec
        record_call(hit[1], hit[0], nodes, states)
    apply.__wrapped__ = original
    return apply


_installed: list = []


def install_keras() -> None:
    """Record Keras optimizers' ``apply`` (when Keras is imported; idempotent)."""
    if _installed or "keras" not in sys.modules:
        return
    try:
        from keras.src.optimizers.base_optimizer import BaseOptimizer
    except ImportError:   # another Keras: its optimizers run op by op
        _installed.append(None)
        return
    BaseOptimizer.apply = _apply(BaseOptimizer.apply)
    _installed.append(BaseOptimizer)
# }}}
