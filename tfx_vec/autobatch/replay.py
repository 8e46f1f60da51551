"""Primitive traces kept from type inference and replayed into the graph a runtime builds.

Type inference (:mod:`.types`) traces every primitive once, in a ``FuncGraph`` on placeholders
of its input types.  A runtime building its blocks inside a ``tf.function`` would trace each
primitive again: the user's Python and TensorFlow's op construction run a second time (for
NUTS, a quarter of the tracing).  Where a block passes values with exactly the static shapes
and dtypes the trace was made for, and the block is built under the graph the trace was made
in (the same ``tf.function`` trace, so no Python state can have changed in between), the kept
graph is imported instead (``tf.graph_util.import_graph_def``: its placeholders mapped to the
values, its captures to the same tensors captured again), which makes the same operations
without running Python.  Everything else -- eager values, another signature, a TF1 graph, a
later trace of the user's function, a capture the current graph cannot reach -- traces as
before.

It also remembers whether each primitive's trace made a stateful op (:func:`stateless_function`).

Example:
    >>> import tensorflow as tf
    >>> from tensorflow.python.framework import func_graph
    >>> def double(x):
    ...     return (x * 2.0,)
    >>> @tf.function(autograph=False)
    ... def f(v):
    ...     with func_graph.FuncGraph("types").as_default() as g:  # what type inference does
    ...         x = tf.compat.v1.placeholder(tf.float32, [3])
    ...         record(double, g, [x], double(x))
    ...     return replay(double, [v])
    >>> f(tf.constant([1.0, 2.0, 3.0]))[0].numpy().tolist()
    [2.0, 4.0, 6.0]
    >>> stateless_function(double)
    True
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

import tensorflow as tf
from tensorflow.python.framework import func_graph

__all__ = ["record", "replay", "stateless_function"]


class _Trace:
    """One kept trace: its graph (serialized on first replay), input placeholder names, each
    output leaf as ``("tensor", name)``, ``("input", index)`` or ``("value", object)``, and
    its captures as ``(external tensor, internal placeholder name)``."""

    def __init__(self, graph: func_graph.FuncGraph, inputs: list, leaves: list, structure: Any):
        self.graph, self.inputs, self.leaves, self.structure = graph, inputs, leaves, structure
        # the function trace it was made under: dead once that trace is (FuncGraph's own
        # outer_graph would then answer the outermost graph, which a later trace shares)
        self.outer = weakref.ref(graph.outer_graph)
        self.captures = [(ext, internal.name) for ext, internal in graph.captures]
        self._graph_def: Any = None
        self.used: set[str] = set()

    def graph_def(self) -> Any:
        """The graph without its placeholders (left in, XLA would refuse them even unused);
        ``used``: the placeholders' tensor names that its operations read.  None where an
        operation waits on a placeholder by a control edge."""
        if self._graph_def is None:
            full = self.graph.as_graph_def()
            mapped = {name.split(":")[0] for name in self.inputs}
            mapped.update(name.split(":")[0] for _, name in self.captures)
            nodes = [n for n in full.node if n.name not in mapped]
            for node in nodes:
                for x in node.input:
                    source = x.lstrip("^").split(":")[0]
                    if source in mapped:
                        if x.startswith("^"):
                            return None
                        self.used.add(x if ":" in x else x + ":0")
            self._graph_def = type(full)()
            self._graph_def.CopyFrom(full)
            del self._graph_def.node[:]
            self._graph_def.node.extend(nodes)
        return self._graph_def


_TRACES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # fn -> {signature: _Trace}
_STATEFUL: weakref.WeakSet = weakref.WeakSet()  # fns some trace of which made a stateful op


def _signature(flat: Sequence[Any]) -> tuple | None:
    if not all(tf.is_symbolic_tensor(x) for x in flat):
        return None
    return tuple((x.dtype, None if x.shape.rank is None else tuple(x.shape.as_list()))
                 for x in flat)


def record(fn: Callable, graph: func_graph.FuncGraph, inputs: Sequence[Any], outputs: Any,
           replayable: bool = True) -> None:
    """Keep ``outputs = fn(*inputs)``, just traced in ``graph`` on placeholders ``inputs``.
    ``replayable=False`` (a runtime builds ``fn`` differently from this trace): note only
    whether it made a stateful op, keep no trace to replay."""
    stateful = any(op._is_stateful for op in graph.get_operations())  # no public equivalent
    flat_in = tf.nest.flatten(inputs)
    signature = _signature(flat_in)
    position = {id(x): i for i, x in enumerate(flat_in)}
    leaves = []
    for x in tf.nest.flatten(outputs):
        if not tf.is_symbolic_tensor(x):
            leaves.append(("value", x))
        elif x.graph is not graph:  # a tensor of another graph returned as it is
            signature = None
        elif id(x) in position:
            leaves.append(("input", position[id(x)]))
        else:
            leaves.append(("tensor", x.name))
    try:
        if stateful:
            _STATEFUL.add(fn)
        traces = _TRACES.setdefault(fn, {})
    except TypeError:  # not weakly referenceable: neither replayed nor known stateless
        return
    # only a trace made under a function trace can be replayed (see replay)
    if replayable and signature is not None and \
            isinstance(graph.outer_graph, func_graph.FuncGraph) and \
            not graph.deferred_external_captures:
        traces[signature] = _Trace(graph, [x.name for x in flat_in], leaves, outputs)


def stateless_function(fn: Callable) -> bool:
    """Was ``fn`` traced by type inference, never making a stateful op (a variable read or
    write, a stateful random op, an assertion, a print)?"""
    try:
        return fn in _TRACES and fn not in _STATEFUL
    except TypeError:
        return False


def _within(graph: Any, ancestor: Any) -> bool:
    """Is ``ancestor`` the graph ``graph`` or one of its outer graphs?"""
    while graph is not None:
        if graph is ancestor:
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


def _reachable(graph: Any, tensor: Any) -> bool:
    """Can ``graph`` (a FuncGraph) capture ``tensor``: eager, or of ``graph`` or an outer one?"""
    return not tf.is_symbolic_tensor(tensor) or _within(graph, tensor.graph)


def replay(fn: Callable, values: Sequence[Any]) -> Any:
    """``fn(*values)`` from its kept trace, or None where it has to be traced."""
    if tf.executing_eagerly():
        return None
    current = tf.compat.v1.get_default_graph()
    if not isinstance(current, func_graph.FuncGraph):
        return None
    try:
        traces = _TRACES.get(fn)
    except TypeError:
        return None
    flat = tf.nest.flatten(values)
    trace = traces.get(_signature(flat)) if traces else None
    if trace is None or not _within(current, trace.outer()):
        return None  # not under the function trace that type inference ran in
    graph_def = trace.graph_def()
    sources = list(zip(trace.inputs, flat)) + [(internal, ext) for ext, internal in trace.captures]
    if graph_def is None or not all(_reachable(current, x) for _, x in sources):
        return None
    # values of outer graphs are captured, as an operation reading them would capture them
    input_map = {name: current.capture(x) for name, x in sources if name in trace.used}
    names = [name for kind, name in trace.leaves if kind == "tensor"]
    try:
        imported = iter(tf.graph_util.import_graph_def(
            graph_def, input_map=input_map, return_elements=names, name="replayed"))
    except (ValueError, TypeError, tf.errors.OpError):  # traced instead, as if never kept
        return None
    leaves = [next(imported) if kind == "tensor" else flat[x] if kind == "input" else x
              for kind, x in trace.leaves]
    return tf.nest.pack_sequence_as(trace.structure, leaves)
