"""Calls recorded as one node: a Keras layer's or model's call, a loss, a metric update, and
the methods of the program's ``tf.Module`` subclasses (``module_units.py`` says which, and
what more they must pass).

Inside ``lazy.device()`` a Keras layer call runs Keras' and TensorFlow's Python for every op
(input conversion, name scopes, call contexts, dtype policies, the op wrappers): on small
models this Python, not the arithmetic, is most of a step.  So, as for a Keras optimizer's
``apply`` (``calls.py``), the *outermost* call of a Keras ``Layer`` (models included), a Keras
``Loss`` or a Keras ``Metric.update_state`` is recorded as one ``call`` node once it is known
to be replayable: the compiled program replays Keras' own call on the program's tensors and
variables, exactly as ``model.fit`` traces ``call`` into its step.

The first call with a given signature is a **probe**: it runs op by op (recorded as usual)
while the device notes which variables the call reads and assigns and whether anything in it
cannot be replayed.  It becomes a unit only when:

- its arguments are device or host tensors, bools, ``None`` or strings, nested in lists,
  tuples and dicts (a Python number could change every step: it would be baked);
- every output is a tensor computed inside the call; no output carries a Keras mask, no layer
  added a loss (activity regularizers), the call is not inside another Keras call, no
  autocast scope is active;
- nothing inside it forced a value, ran a host or fallback op, created a variable, used a
  gradient tape or a custom gradient, gathered from a variable (an embedding: TensorFlow's
  gradient is then ``IndexedSlices``), or used a lazy tensor that is not one of its arguments;
- every variable it touches belongs to the layer, loss or metric (or, for a ``tf.Module``
  method, to the module or is one of its arguments).

A later call hits the unit when its signature (argument structure, each tensor's shape and
dtype, the other arguments' values) is the same **and** the Python state of the object is
unchanged: the attributes of the object and of every layer inside it (values of numbers,
strings and flags, identity of everything else, one level into lists, tuples and dicts) and
Keras' global dtype policy.  Changing ``layer.trainable``, a ``Dropout`` rate or an
activation, or a layer that counts its calls in an attribute, makes the next call a probe
again (counted as ``unit_eager::python state changed``), never a stale replay.  What a call
computes from anything else (a global, a closure, the clock) is the one thing a unit assumes
fixed: Keras' own contract for ``call``, which ``model.fit`` relies on when it compiles it.

Gradients: a unit inside a ``tf.GradientTape`` marks the variables it reads as accessed (the
tape watches them, as eager reads would) and is replayed inside the recorded gradient's
window.  It is recorded on the tape too: should the gradient have to run op by op (see
``tape_capture``), the unit's backward raises a clear :class:`LazyGradientError` instead of
returning a gradient that misses the call.  ``lazy.configure(record_calls=False)`` records
every call op by op.

Counters: ``units_recorded`` per call recorded as one node, ``unit_probes``, and
``unit_eager::<why>`` per call run op by op for a reason.

Example:
    >>> import keras, numpy as np, tensorflow as tf
    >>> from tfx_vec import lazy
    >>> with lazy.device():
    ...     layer = keras.layers.Dense(2, kernel_initializer="ones")
    ...     x = tf.constant(np.ones((1, 3), np.float32))
    ...     for _ in range(3):
    ...         y = layer(x)
    ...         lazy.mark_step()
    >>> y.numpy().tolist(), lazy.metrics()["units_recorded"] >= 1
    ([[3.0, 3.0]], True)
"""
from __future__ import annotations

import itertools
import operator
import sys
import weakref
from typing import Any, Callable

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import record as _record_module
from tensorflow.python.eager import context as _context
from tensorflow.python import pywrap_tfe as _pywrap_tfe
from tensorflow.python.distribute import distribute_lib as _distribute_lib
from tensorflow.python.eager import tape as _tape_module
from tensorflow.python.framework import ops

from . import calls, ir, metrics, module_units, runtime, tape_capture
from . import custom_device as _device   # (it imports this module: names read at call time)
from .errors import LazyCompileError, LazyGradientError
from .tensor import LazyTensor

__all__ = ["install", "note_read", "note_assign", "taint", "PROBES"]

PROBES: list = []          # the probes running (innermost last); empty almost always
_depth = [0]               # Keras calls being probed or replayed: only the outermost is a unit
_units: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # owner -> {key: Unit|str}
_MAX_KEYS = 16             # signatures remembered per object
_SCALARS = frozenset({bool, int, float, complex, str, bytes, type(None)})
_GATHERS = frozenset({"GatherV2", "Gather", "ResourceGather", "GatherNd", "ResourceGatherNd"})
_chain = itertools.chain.from_iterable
_values = operator.methodcaller("values")   # also of mapping wrappers (not dict.values)
_tokens = itertools.count(1 << 40)   # call tokens of their own (calls.py counts from 0)
# Keras' global_state module, get_autocast_scope and its TensorFlow Variable class (install())
_keras: list = [None, None, None]


class _Refuse(Exception):
    """A call that cannot be a unit (the message says why)."""


class _Symbolic(Exception):
    """A Keras symbolic call (building a functional model): never a unit, not counted."""


class _Tensor:
    """A tensor's place in an argument or output template."""


_T = _Tensor()
_VARIABLE = "variable"   # a variable argument's entry in a signature: (_VARIABLE, id)


class Probe:
    """What the device saw during one op-by-op run of a call."""

    __slots__ = ("reads", "assigns", "allowed", "tainted")

    def __init__(self) -> None:
        self.reads: dict = {}       # id -> DeviceVariable, in order of first use
        self.assigns: dict = {}
        self.allowed: set = set()   # nodes the call read from variables
        self.tainted = ""


def note_read(state: Any) -> None:
    """A variable read on the device (``ReadVariableOp``) during a probe."""
    for p in PROBES:
        p.reads.setdefault(id(state), state)
        p.allowed.add(state._node)


def note_assign(state: Any) -> None:
    """A variable assigned on the device during a probe."""
    for p in PROBES:
        p.assigns.setdefault(id(state), state)


def taint(reason: str) -> None:
    """Something a replay cannot reproduce happened inside the probes running now."""
    for p in PROBES:
        p.tainted = p.tainted or reason


class Unit:
    """A call known to be replayable for one signature and one Python state of its owner."""

    __slots__ = ("token", "spec", "states", "in_template", "out_template", "read", "watch",
                 "snapshot", "vjps")

    def __init__(self, spec: calls.CallSpec, states: list, in_template: Any,
                 out_template: Any, read: tuple, snapshot: Any):
        self.token = next(_tokens)
        self.read = read                       # positions of the variables the call reads
        self.watch = [spec.variables[i] for i in read]
        self.vjps: dict = {}                   # present output gradients -> (token, spec)
        calls.CALLS[self.token] = spec   # weakly: the unit (kept by its owner) holds it
        self.spec, self.states, self.snapshot = spec, states, snapshot
        self.in_template, self.out_template = in_template, out_template


# {{{ signatures, templates, Python state

def _template(x: Any, tensors: list, sig: list) -> Any:
    """``x`` with every tensor replaced by ``_T`` (appended to ``tensors``, its shape and
    dtype to ``sig``); other leaves appended to ``sig`` by value."""
    t = type(x)
    if t is np.ndarray:      # Keras converts it at the call's entry: a host tensor here
        x, t = tf.convert_to_tensor(x), ops.EagerTensor
    if t is ops.EagerTensor or isinstance(x, tf.Tensor):
        tensors.append(x)
        sig.append(x)   # replaced by its shape and dtype below (graph tensors: not needed)
        return _T
    if t in _SCALARS:
        if t not in (bool, str, bytes, type(None)):
            raise _Refuse(f"a Python {t.__name__} argument (it would be baked)")
        sig.append(x)
        return x
    if t is list or t is tuple:
        sig.append((t, len(x)))
        return t([_template(i, tensors, sig) for i in x])
    if t is dict:
        sig.append((dict, tuple(x)))
        return {k: _template(v, tensors, sig) for k, v in x.items()}
    if t.__name__ == "KerasTensor":
        raise _Symbolic()
    if isinstance(x, tf.Variable):   # kept by identity: the replay updates it in place
        sig.append((_VARIABLE, id(x)))
        return x
    raise _Refuse(f"an argument of type {t.__name__}")


def _containers(x: Any, out: list) -> list:
    """The lists, tuples and dicts nested in ``x`` as ``(type, length or keys)``, and their
    other elements themselves: what a call changes in an argument shows there."""
    t = type(x)
    if t is list or t is tuple:
        out.append((t, len(x)))
        for i in x:
            _containers(i, out)
    elif t is dict:
        out.append((dict, tuple(x)))
        for i in x.values():
            _containers(i, out)
    else:
        out.append(x)
    return out


def _fill(template: Any, values: Any) -> Any:
    """The template with its tensors taken from the iterator ``values``."""
    if template is _T:
        return next(values)
    t = type(template)
    if t is list or t is tuple:
        return t([_fill(i, values) for i in template])
    if t is dict:
        return {k: _fill(v, values) for k, v in template.items()}
    return template


def _layers(owner: Any) -> list:
    """The objects whose attributes are the owner's Python state: a Keras object's layers, a
    ``tf.Module``'s submodules."""
    if isinstance(owner, tf.Module):
        return module_units.module_objects(owner)
    flatten = getattr(owner, "_flatten_layers", None)
    return list(flatten(include_self=True, recursive=True)) if flatten is not None else [owner]


class Snapshot:
    """The Python state of an owner: its layers' attributes (names and values, compared by
    identity and kept alive, so an identity is never reused), one level into the lists,
    tuples, sets and dicts among them, and Keras' global dtype policy.  Any attribute set,
    added or removed, a container changed, a float or string replaced even by an equal one,
    makes :meth:`same` false.

    :meth:`same` runs once per recorded call, so it makes no Python loop over the layers: one
    native call (``same_state`` in ``custom_device.cc``) compares the objects' types, their
    ``__dict__`` sizes, keys and values, then (those being the same objects) the containers'
    sizes and contents against the flat lists kept here: by identity, except the attribute
    names (an equal name is the same attribute).  Sizes are compared before contents, so
    flattened sequences line up; a container iterates as Python's loop would (a subclass's
    own ``__iter__`` and ``values``)."""

    __slots__ = ("objects", "policy", "types", "sizes", "keys", "values", "containers",
                 "container_sizes", "contents", "mappings", "mapping_values", "guard")

    def __init__(self, objects: list, guard: Any = None):
        self.objects = objects
        self.guard = guard   # a tf.Module method's globals and closure values (module_units)
        self.policy = _dtype_policy()
        self.types = list(map(type, objects))
        dicts = list(map(vars, objects))
        self.sizes = list(map(len, dicts))
        self.keys = list(_chain(dicts))
        self.values = list(_chain(map(dict.values, dicts)))
        self.containers = [v for v in self.values if isinstance(v, (list, tuple, set, dict))]
        self.container_sizes = list(map(len, self.containers))
        self.contents = list(_chain(self.containers))
        self.mappings = [v for v in self.containers if isinstance(v, dict)]
        self.mapping_values = list(_chain(map(_values, self.mappings)))

    def same(self) -> bool:
        """Whether the state is what it was when the snapshot was taken."""
        if _dtype_policy() is not self.policy:
            return False
        same_state = _same_state[0]
        if same_state is None:
            same_state = _same_state[0] = _device.native().same_state
        return same_state(self.objects, self.types, self.sizes, self.keys, self.values,
                          self.containers, self.container_sizes, self.contents, self.mappings,
                          self.mapping_values) and (self.guard is None or self.guard.same())


_same_state: list = [None]   # the native check (custom_device.cc), bound on first use


def _dtype_policy() -> Any:
    if _keras[0] is None:   # a snapshot taken before install(), or Keras is not used
        if "keras" not in sys.modules:
            return None
        _bind_keras()
    return _keras[0].get_global_attribute("dtype_policy")


def _bind_keras() -> None:
    """Keep Keras' global state module, ``get_autocast_scope`` (read on every call) and its
    variable class when it acts as a TensorFlow resource variable (the TensorFlow backend)."""
    from keras.src.backend import Variable, get_autocast_scope
    from keras.src.backend.common import global_state
    resource = hasattr(Variable, "_should_act_as_resource_variable")
    _keras[:] = [global_state, get_autocast_scope, Variable if resource else None]


# }}}


# {{{ probing and recording

def _precheck() -> str:
    """Why no call can be a unit now ("" when one can)."""
    if not _device._registered[0] or not runtime.CONFIG.record_calls:
        return "off"
    if not tf.executing_eagerly():
        return "off"
    global_state, get_autocast_scope, _ = _keras
    if global_state is not None:
        if global_state.get_global_attribute("current_call_ctx") is not None:
            return "off"   # inside a Keras layer call that is not a unit: its layers decide
        if get_autocast_scope() is not None:
            return "an autocast scope"
    if len(tape_capture._recording) > 1:
        return "several tapes are recording"
    if any(s.tainted for s in tape_capture._recording.values()):
        return "the tape recording cannot be replayed"
    return ""


def _on_device(tensors: list) -> bool:
    """Inside ``lazy.device()``, or a tensor argument lives on the device."""
    return _context.context().device_name == _device.DEVICE_NAME or any(
        map(_device.is_device_tensor, tensors))


def _input_node(t: Any) -> Any:
    p = _device.payload_of(t)
    if type(p) is LazyTensor:
        return p._node
    if p is not None:
        raise _Refuse("a variable's resource handle as an argument")
    return _device._node_of(t)


def _owned(owner: Any, arguments: list) -> dict:
    """id(DeviceVariable) -> tf.Variable for every variable the owner holds on the device
    and every variable argument."""
    from .custom_device import payload_of
    out = {}
    for v in list(getattr(owner, "variables", ()) or ()) + arguments:
        tfv = calls._tf_variable(v)
        p = None if tfv is None else payload_of(tfv.handle)
        if p is not None:
            out[id(p)] = tfv
    return out


def _check_window(outs: list, assigned: list, inputs: set, probe: Probe, start: int) -> None:
    """Raise ``_Refuse`` unless the ops under the outputs and assigned values were recorded in
    the call from its arguments, its variables and host values."""
    ok = inputs | probe.allowed
    seen: set = set()
    stack = list(outs) + list(assigned)
    while stack:
        n = stack.pop()
        if n in seen or n in ok:
            continue
        seen.add(n)
        if n.op in ("data", "scalar", "const"):
            continue          # a host value the call's Python made: its replay makes it again
        if n.op == "var":
            raise _Refuse("it reads a variable it was not seen reading")
        if n.serial < start:
            raise _Refuse("it uses a lazy tensor that is not one of its arguments")
        if n.op == "raw" and n.attrs[0] in _GATHERS and n.inputs[0].op == "var":
            raise _Refuse("a gather from a variable (TensorFlow's gradient is IndexedSlices)")
        if n.op in ("grad", "call"):
            raise _Refuse("a recorded gradient or call inside it")
        stack.extend(n.inputs)


def _make_unit(owner: Any, original: Callable, probe: Probe, start: int, tensors: list,
               in_template: Any, out: Any) -> Unit:
    from .custom_device import payload_of
    if probe.tainted:
        raise _Refuse(probe.tainted)
    flat: list = []
    out_template = _template(out, flat, [])
    out_nodes = []
    for t in flat:
        p = payload_of(t)
        if type(p) is not LazyTensor or not p._node.pending or p._node.serial < start:
            raise _Refuse("an output is not computed by the call")
        if getattr(t, "_keras_mask", None) is not None:
            raise _Refuse("an output carries a Keras mask")
        out_nodes.append(p._node)
    layers = _layers(owner)
    if any(getattr(l, "_losses", None) or getattr(l, "activity_regularizer", None) is not None
           for l in layers):
        raise _Refuse("a layer adds losses")
    arguments = [v for v in _containers(in_template, []) if isinstance(v, tf.Variable)]
    owned = _owned(owner, arguments)
    if len(owned) != len({id(v) for v in list(getattr(owner, "variables", ()) or ())
                          + arguments}):
        raise _Refuse("a variable off the lazy device")
    guard = None
    if isinstance(owner, tf.Module):
        guard = module_units.scan(original, layers)
        if isinstance(guard, str):
            raise _Refuse(guard)
    if not out_nodes and not probe.assigns:
        raise _Refuse("no output or update on the lazy device")
    states = list(probe.reads.values())
    states += [s for k, s in probe.assigns.items() if k not in probe.reads]
    if any(id(s) not in owned for s in states):
        raise _Refuse("it uses a variable it does not hold")
    _check_window(out_nodes, [s._node for s in probe.assigns.values()],
                  {_input_node(t) for t in tensors}, probe, start)
    tf_vars = [owned[id(s)] for s in states]
    assigned = tuple(i for i, s in enumerate(states) if id(s) in probe.assigns)
    n_out = len(out_nodes)

    def replay(values: list) -> list:
        args, kwargs = _fill(in_template, iter(values))
        _depth[0] += 1
        try:
            result = original(owner, *args, **kwargs)
        finally:
            _depth[0] -= 1
        flat_out: list = []
        _template(result, flat_out, [])
        if len(flat_out) != n_out:
            raise LazyCompileError(f"the replayed call of {type(owner).__name__} returned "
                                   f"{len(flat_out)} tensors, recorded {n_out}")
        return flat_out
    spec = calls.CallSpec(replay, tf_vars, tuple((n.shape, n.dtype) for n in out_nodes),
                          assigned)
    read = tuple(i for i, s in enumerate(states) if id(s) in probe.reads)
    return Unit(spec, states, in_template, out_template, read, Snapshot(layers, guard))


def _record(unit: Unit, tensors: list) -> Any:
    nodes = list(map(_input_node, tensors))
    recording = bool(tape_capture._recording)
    if recording:
        _variables_accessed(unit.watch)   # as the eager reads would
        pending = any(s._node is not s._read for s in unit.states)
    outs = calls.record_call(unit.spec, unit.token, nodes, unit.states)
    metrics.bump("units_recorded")
    results = _device.make_tensors(outs)
    if recording and results:
        _on_tape(unit, tensors, nodes, results, pending)
    return _fill(unit.out_template, iter(results))


def _variables_accessed(variables: list) -> None:
    """TensorFlow's ``tape.variables_accessed``: tell the tapes and variable watchers that the
    trainable ``variables`` were read.  With no ``tf.distribute`` strategy in scope its resolver
    maps each variable to itself, so the per-variable strategy lookup is skipped."""
    if not variables:   # a loss or metric reads none: nothing to tell
        return
    if _tape_module._variables_override is not \
            _distribute_lib.get_local_results_or_value_container or \
            _distribute_lib.has_strategy():
        _tape_module.variables_accessed(variables)
        return
    for v in variables:
        if v.trainable:
            _pywrap_tfe.TFE_Py_TapeVariableAccessed(v)
            _pywrap_tfe.TFE_Py_VariableWatcherVariableAccessed(v)


def _on_tape(unit: Unit, tensors: list, nodes: list, results: list, pending: bool) -> None:
    """Record the unit on TensorFlow's tape too, with a backward that records its
    vector-Jacobian product as one more node (used only when a gradient runs op by op)."""
    stamp = next(ir.serials)
    differentiable = [k for k, t in enumerate(tensors) if tape_capture.float_or_complex(t)]
    trainable = [i for i, v in zip(unit.read, unit.watch) if v.trainable]

    def backward(*grads: Any) -> list:
        why = "it updates variables" if unit.spec.assigned else \
            "a variable it reads had a pending update" if pending else \
            "a variable it reads was assigned since" if any(
                s.last_assign > stamp for s in unit.states) else ""
        if why:
            raise LazyGradientError(
                f"a gradient through a call recorded as one node had to run op by op, "
                f"and that call cannot be differentiated afterwards ({why}; at "
                f"{runtime.user_frame()}; lazy.metrics() 'tape_eager::*' says why the gradient "
                "was not recorded).  Remove what stops the gradient from being recorded (a "
                "value read or a host op inside the tape, several targets, nested tapes), or "
                "record calls op by op with lazy.configure(record_calls=False)")
        present = tuple(g is not None for g in grads)
        vjp = unit.vjps.get(present)
        if vjp is None:
            vjp = unit.vjps[present] = _vjp(unit, nodes, differentiable, trainable, present)
        metrics.bump("unit_vjps")
        ogs = [_input_node(g) for g in grads if g is not None]
        outs = calls.record_call(vjp[1], vjp[0], nodes + ogs, unit.states)
        return _device.make_tensors(outs)
    sources = [tensors[k] for k in differentiable]
    sources += [unit.spec.variables[i].handle for i in trainable]
    tape_capture._original["record_operation"]("TfxVecLazyUnit", results, sources, backward)


def _vjp(unit: Unit, nodes: list, differentiable: list, trainable: list,
         present: tuple) -> tuple:
    """(token, spec) of the unit's vector-Jacobian product: its arguments and the gradients
    of its present outputs in; the gradients of its float arguments and read trainable
    variables out (the call replayed under a tape, on the program's variables)."""
    n = len(nodes)
    variables = unit.spec.variables

    def vjp(values: list) -> list:
        xs = values[:n]
        ogs = iter(values[n:])
        handles = [variables[i].handle for i in trainable]   # the program's resources now
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            for k in differentiable:
                tape.watch(xs[k])
            for h in handles:
                tape.watch(h)
            outs = unit.spec.fn(xs)
        og = [next(ogs) if p else tf.zeros_like(o) for p, o in zip(present, outs)]
        grads = tape.gradient(outs, [xs[k] for k in differentiable] + handles,
                              output_gradients=og,
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return [tf.convert_to_tensor(g) for g in grads]
    outs = tuple((nodes[k].shape, nodes[k].dtype) for k in differentiable)
    outs += tuple((tuple(variables[i].shape.as_list()), variables[i].dtype) for i in trainable)
    spec = calls.CallSpec(vjp, variables, outs, ())
    token = next(_tokens)
    calls.CALLS[token] = spec
    return token, spec


def _call(owner: Any, original: Callable, args: tuple, kwargs: dict) -> Any:
    """Run (probe), record as a unit, or pass through one Keras call or ``tf.Module``
    method."""
    if _depth[0]:
        return original(owner, *args, **kwargs)
    why = _precheck()
    if why:
        if why != "off":
            metrics.bump(f"unit_eager::{why}")
        return original(owner, *args, **kwargs)
    if _context.context().device_name != _device.DEVICE_NAME and \
            not any(type(x) is ops.EagerTensor and _device.is_device_tensor(x)
                    for x in _containers((args, kwargs), [])):
        return original(owner, *args, **kwargs)   # eager code: nothing converted or keyed
    tensors: list = []
    sig: list = [type(owner), original]
    try:
        in_template = _template((args, kwargs), tensors, sig)
        key = tuple([(x._shape_tuple(), x.dtype) if type(x) is ops.EagerTensor else x
                     for x in sig])
    except _Refuse as e:
        if _on_device(tensors):
            metrics.bump(f"unit_eager::{e}")
        return original(owner, *args, **kwargs)
    except _Symbolic:
        return original(owner, *args, **kwargs)
    if not _on_device(tensors):
        return original(owner, *args, **kwargs)
    cache = _units.get(owner)
    if cache is None:
        cache = _units[owner] = {}
    known = cache.get(key)
    if known is not None:
        if known[0].same():
            if type(known[1]) is Unit:
                try:
                    return _record(known[1], tensors)
                except _Refuse as e:
                    metrics.bump(f"unit_eager::{e}")
                    return original(owner, *args, **kwargs)
            if known[2] > 1:   # refused twice in a row in this state: no more probes
                metrics.bump(f"unit_eager::{known[1]}")
                return original(owner, *args, **kwargs)
        else:
            metrics.bump("unit_eager::python state changed")
    return _probe(owner, original, args, kwargs, cache, key, tensors, in_template)


def _probe(owner: Any, original: Callable, args: tuple, kwargs: dict, cache: dict, key: tuple,
           tensors: list, in_template: Any) -> Any:
    metrics.bump("unit_probes")
    probe = Probe()
    before = Snapshot(_layers(owner))
    arguments = _containers((args, kwargs), [])
    PROBES.append(probe)
    _depth[0] += 1
    start = next(ir.serials)
    try:
        out = original(owner, *args, **kwargs)
    finally:
        _depth[0] -= 1
        PROBES.remove(probe)
    if len(cache) >= _MAX_KEYS and key not in cache:
        metrics.bump("unit_eager::too many signatures")
        return out
    try:
        if not before.same():
            raise _Refuse("the call changes the Python state of a layer")
        after = _containers((args, kwargs), [])
        if len(after) != len(arguments) or any(
                a is not b and not (type(a) is tuple and a == b)
                for a, b in zip(arguments, after)):
            raise _Refuse("the call changes a list or dict it was passed")
        unit = _make_unit(owner, original, probe, start, tensors, in_template, out)
        cache[key] = (unit.snapshot, unit, 0)
    except _Refuse as e:
        # A first refusal may be the first call's alone (building creates the variables):
        # the call is probed again, and only a second refusal in a row is remembered.
        metrics.bump(f"unit_eager::{e}")
        known = cache.get(key)
        again = known is not None and known[1] == str(e)
        cache[key] = (Snapshot(_layers(owner)), str(e), known[2] + 1 if again else 1)
    return out
# }}}


# {{{ installation

def _wrap(original: Callable) -> Callable:
    def call(self, *args, **kwargs):
        return _call(self, original, args, kwargs)
    call.__wrapped__ = original
    call.__name__ = getattr(original, "__name__", "call")
    call.__doc__ = getattr(original, "__doc__", None)
    return call


def _subclasses(cls: type) -> list:
    out, stack = [], [cls]
    while stack:
        c = stack.pop()
        out.append(c)
        stack.extend(c.__subclasses__())
    return out


_installed: list = []
_hooked = [False]   # Metric.__init_subclass__ wraps the metric classes defined afterwards
_modules_hooked = [False]   # tf.Module.__init_subclass__: likewise for tf.Module subclasses


def _install_on(cls: type, name: str) -> None:
    fn = cls.__dict__.get(name)
    if fn is None or getattr(fn, "_tfx_vec_unit", False):
        return
    wrapped = _wrap(fn)
    wrapped._tfx_vec_unit = True
    setattr(cls, name, wrapped)
    _installed.append((cls, name))


def _install_on_module(cls: type) -> None:
    if module_units.is_user_class(cls):
        for name in module_units.methods(cls):
            _install_on(cls, name)


def _hook_subclasses(base: type, install_on: Callable[[type], None]) -> None:
    """Install on ``base``'s subclasses now, and on each one defined later when it is defined
    (a hook on ``base.__init_subclass__``), so entering ``lazy.device()`` again walks no class
    tree."""
    for c in _subclasses(base):
        install_on(c)
    previous = base.__dict__.get("__init_subclass__")

    def init_subclass(cls: type, **kwargs: Any) -> None:
        if previous is None:
            super(base, cls).__init_subclass__(**kwargs)
        else:
            previous.__func__(cls, **kwargs)
        install_on(cls)
    base.__init_subclass__ = classmethod(init_subclass)


def install() -> None:
    """Record the methods of the program's ``tf.Module`` subclasses (``module_units``) and,
    when Keras is imported, Keras layer calls, losses and metric updates as units
    (idempotent)."""
    if not _modules_hooked[0]:
        _hook_subclasses(tf.Module, _install_on_module)
        module_units.install_walk_cache(
            Snapshot, lambda: _context.context().device_name == _device.DEVICE_NAME)
        _modules_hooked[0] = True
    if _hooked[0] or "keras" not in sys.modules:
        return
    try:
        from keras.src.layers.layer import Layer
        from keras.src.losses.loss import Loss
        from keras.src.metrics.metric import Metric
    except ImportError:   # another Keras: its calls run op by op
        return
    _bind_keras()
    _install_on(Layer, "__call__")
    _install_on(Loss, "__call__")
    _hook_subclasses(Metric, lambda c: _install_on(c, "update_state"))
    _hooked[0] = True
# }}}
