"""Stage 1: trace a loop body once into a FuncGraph with symbolic per-iteration inputs.

``trace_function(fn, specs)`` traces ``fn(*args)`` with ``tf.function(...)
.get_concrete_function``; the result records the output structure, the captured
(loop-invariant) values and any cross-iteration reductions requested through
:class:`PforConfig`.  ``trace_count()`` says how many traces happened (tests use it to prove
that repeated eager calls do not retrace).

Outputs of the body, leaf by leaf (:class:`Leaf`), as TensorFlow's pfor takes them:

- a tensor (or anything ``tf.convert_to_tensor`` accepts) -> stacked along a new axis 0;
- ``None`` -> ``None`` (e.g. a gradient that does not depend on the source);
- a ``tf.Operation`` (``tf.Assert``, ``tf.print``, a variable update) -> its vectorized side
  effects: an op grouping them in a graph, ``None`` eagerly;
- a ``tf.SparseTensor`` -> one SparseTensor with a leading iteration dimension;
- ``tf.IndexedSlices`` -> its dense value (with a warning, as TensorFlow does);
- any other ``CompositeTensor`` (``tf.RaggedTensor``, a ``BatchableExtensionType``) -> the
  batched value of its ``BatchableTypeSpec``.

Example:
    >>> import tensorflow as tf
    >>> t = trace_function(lambda i: {"sq": i * i}, [tf.TensorSpec([], tf.int32)])
    >>> [o.dtype.name for o in t.graph.outputs], sorted(t.structure)
    (['int32'], ['sq'])
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Sequence

import tensorflow as tf
from tensorflow.python.autograph.core import ag_ctx
from tensorflow.python.autograph.impl import api as autograph
from tensorflow.python.framework import composite_tensor, type_spec

from tfx_vec.pfor.errors import VectorizationError
from tfx_vec.pfor.registry import WrappedTensor
from tfx_vec.pfor.vectorizer import Reduction

__all__ = ["PforConfig", "TracedBody", "Leaf", "trace_function", "trace_count",
           "composite_spec", "GraphView", "V1_CONTROL_FLOW"]

_count = [0]


def trace_count() -> int:
    """Number of loop bodies traced so far in this process.

    Example:
        >>> isinstance(trace_count(), int)
        True
    """
    return _count[0]


class PforConfig:
    """Passed to the loop body: cross-iteration reductions inside a pfor body.

    The body receives it as ``loop_fn(i, config)`` (a second required positional parameter)
    or, as TensorFlow's pfor passes it, as the keyword ``pfor_config``.  Each method returns,
    in every iteration, a value computed from ``x`` of *all* iterations (loop-invariant).

    Example:
        >>> import tensorflow as tf, tfx_vec
        >>> def body(i, config):
        ...     x = tf.cast(i, tf.float32)
        ...     return x - config.reduce_mean(x)
        >>> tfx_vec.pfor(body, 3).numpy().tolist()
        [-1.0, 0.0, 1.0]
    """

    def __init__(self, iters: int | None = None):
        self.reductions: dict[str, tuple[Reduction, int]] = {}
        self._iters = iters

    def reduce(self, fn: Callable[..., Any], *args: tf.Tensor) -> Any:
        """``fn(*stacked_args)``, each argument stacked over all iterations (``[n, ...]``).

        ``fn`` returns one tensor or a tuple/list of tensors; so does ``reduce``.

        Example:
            >>> import tensorflow as tf, tfx_vec
            >>> def body(i, config):
            ...     x = tf.cast(i, tf.float32)
            ...     lo, hi = config.reduce(lambda s: (tf.reduce_min(s), tf.reduce_max(s)), x)
            ...     return (x - lo) / (hi - lo)
            >>> tfx_vec.pfor(body, 3).numpy().tolist()
            [0.0, 0.5, 1.0]
        """
        if not args:
            raise ValueError("config.reduce(fn, *args) needs at least one tensor argument")
        values = []
        for a in args:
            if isinstance(a, (tf.SparseTensor, tf.RaggedTensor, tf.IndexedSlices)):
                raise ValueError(f"config.reduce: got a {type(a).__name__} argument; "
                                 "only dense tensors can be reduced")
            values.append(tf.convert_to_tensor(a))
        specs = [tf.TensorSpec(tf.TensorShape([self._iters]).concatenate(v.shape), v.dtype)
                 for v in values]
        structure = tf.function(fn, autograph=False).get_concrete_function(
            *specs).structured_outputs
        flat = tf.nest.flatten(structure)
        if not flat or not all(isinstance(o, tf.Tensor) for o in flat):
            raise ValueError(f"config.reduce: fn must return tensors, got {structure!r}")
        red = Reduction(fn, values)
        outs = []
        for k, o in enumerate(flat):
            with tf.control_dependencies(values):
                ph = tf.compat.v1.placeholder(o.dtype, o.shape, name="pfor_reduction")
            self.reductions[ph.name] = (red, k)
            outs.append(ph)
        return tf.nest.pack_sequence_as(structure, outs)

    def reduce_sum(self, x: tf.Tensor) -> tf.Tensor:
        """The sum of ``x`` over all iterations.

        Example:
            >>> import tensorflow as tf, tfx_vec
            >>> tfx_vec.pfor(lambda i, c: c.reduce_sum(i), 4).numpy().tolist()
            [6, 6, 6, 6]
        """
        return self.reduce(lambda s: tf.reduce_sum(s, axis=0), x)

    def reduce_mean(self, x: tf.Tensor) -> tf.Tensor:
        """The mean of ``x`` over all iterations.

        Example:
            >>> import tensorflow as tf, tfx_vec
            >>> tfx_vec.pfor(lambda i, c: c.reduce_mean(tf.cast(i, tf.float32)), 2).numpy()
            array([0.5, 0.5], dtype=float32)
        """
        return self.reduce(lambda s: tf.reduce_mean(s, axis=0), x)

    def reduce_concat(self, x: tf.Tensor) -> tf.Tensor:
        """Every iteration's ``x`` stacked along a new axis 0 (``[n, *x.shape]``), as in
        TensorFlow's ``PForConfig.reduce_concat``.

        Example:
            >>> import tensorflow as tf, tfx_vec
            >>> tfx_vec.pfor(lambda i, c: c.reduce_concat(i * 10), 3).numpy().tolist()
            [[0, 10, 20], [0, 10, 20], [0, 10, 20]]
        """
        return self.reduce(lambda s: s, x)


@dataclasses.dataclass(frozen=True)
class Leaf:
    """How one leaf of the body's output structure maps to ``graph.outputs``.

    ``kind``: ``"tensor"``, ``"none"``, ``"op"`` (index ``slots[0]`` into
    ``TracedBody.op_outputs``), ``"sparse"`` (indices, values, dense_shape) or
    ``"composite"`` (``spec._to_tensor_list`` of the per-iteration value).

    Example:
        >>> Leaf("sparse", (0, 1, 2)).kind
        'sparse'
    """

    kind: str
    slots: tuple = ()
    spec: Any = None


@dataclasses.dataclass
class TracedBody:
    """A traced loop body: ``graph.inputs`` = the explicit args then the captured values.

    Example:
        >>> import tensorflow as tf
        >>> t = trace_function(lambda i: (i, None), [tf.TensorSpec([], tf.int32)])
        >>> [leaf.kind for leaf in t.leaves], t.pack([7, None])
        (['tensor', 'none'], (7, None))
    """

    graph: Any                       # FuncGraph
    structure: Any                   # nested output structure (leaves: positions in `leaves`)
    leaves: list                     # one Leaf per leaf of the structure
    n_args: int
    captured: list                   # external values bound to the captured placeholders
    reductions: dict
    op_outputs: list                 # ops returned by the body (Operation leaves)

    def capture_inputs(self) -> list[WrappedTensor]:
        """The captured (loop-invariant) values, wrapped, in ``graph.inputs`` order (eager
        values captured into the graph being built, so that converters see graph tensors
        with their handle data)."""
        graph = tf.compat.v1.get_default_graph()
        capture = getattr(graph, "capture", None)
        return [WrappedTensor(capture(c) if capture is not None and hasattr(c, "numpy")
                              else c, False) for c in self.captured]

    def pack(self, per_leaf: Sequence[Any]) -> Any:
        """The body's output structure with one value per leaf."""
        return tf.nest.pack_sequence_as(self.structure, list(per_leaf))


def composite_spec(value: Any) -> type_spec.BatchableTypeSpec | None:
    """The ``BatchableTypeSpec`` of a composite value pfor stacks through its tensor list
    (``None`` for plain tensors; SparseTensor and IndexedSlices are handled apart).

    Example:
        >>> import tensorflow as tf
        >>> type(composite_spec(tf.ragged.constant([[1], []]))).__name__
        'RaggedTensorSpec'
    """
    if not isinstance(value, composite_tensor.CompositeTensor) or isinstance(
            value, (tf.SparseTensor, tf.IndexedSlices)):
        return None
    spec = value._type_spec  # pylint: disable=protected-access
    if not isinstance(spec, type_spec.BatchableTypeSpec):
        raise ValueError(f"pfor: the composite value {type(value).__name__} has a "
                         f"{type(spec).__name__}, which is not a BatchableTypeSpec; pfor can "
                         "only stack composites that can be batched (e.g. "
                         "tf.experimental.BatchableExtensionType)")
    return spec


def _flatten_leaf(leaf: Any, flat: list, ops: list) -> Leaf:
    """Append the tensors standing for output ``leaf`` to ``flat``; return its Leaf."""
    start = len(flat)
    if leaf is None:
        return Leaf("none")
    if isinstance(leaf, tf.Operation):
        if hasattr(leaf, "mark_used"):   # a tf_should_use wrapper (e.g. from tf.Assert)
            leaf.mark_used()
            leaf = leaf.graph.get_operation_by_name(leaf.name)
        ops.append(leaf)
        return Leaf("op", (len(ops) - 1,))
    if isinstance(leaf, tf.SparseTensor):
        flat.extend([leaf.indices, leaf.values, leaf.dense_shape])
        return Leaf("sparse", (start, start + 1, start + 2))
    if isinstance(leaf, tf.IndexedSlices):
        warnings.warn("pfor: the loop body returned tf.IndexedSlices; they are converted to a "
                      "dense tensor (return the indices and values separately to keep them "
                      "sparse)", stacklevel=4)
        leaf = tf.convert_to_tensor(leaf)
    spec = composite_spec(leaf)
    if spec is not None:
        tensors = spec._to_tensor_list(leaf)  # pylint: disable=protected-access
        flat.extend(tensors)
        return Leaf("composite", tuple(range(start, start + len(tensors))), spec)
    flat.append(tf.convert_to_tensor(leaf))
    return Leaf("tensor", (start,))


def trace_function(fn: Callable, specs: Sequence[tf.TensorSpec], *, with_config: Any = False,
                   pack_args: Callable[[list], Sequence[Any]] | None = None,
                   iters: int | None = None) -> TracedBody:
    """Trace ``fn`` once on symbolic inputs described by ``specs``.

    ``pack_args`` turns the flat symbolic inputs into ``fn``'s positional arguments (default:
    one argument per spec).  ``with_config``: ``True`` passes a :class:`PforConfig` as the last
    positional argument, ``"keyword"`` as ``pfor_config=``.  ``iters`` (static loop length,
    if known) gives reductions their static leading dimension.

    Called eagerly or inside a ``tf.function``, the body is traced into a function graph of
    its own.  In a TF1 graph it is built in the caller's graph, as TensorFlow's pfor does, so
    that variables and layers it creates, graph collections and ``tf.compat.v1`` APIs behave
    as in the rest of the user's graph (:class:`GraphView`); a body that builds TF1 control
    flow (``Switch``/``Merge``/``Enter`` ops) or a TF1 TensorArray is traced into a function
    graph instead, where its loops, conditionals and arrays are functional.

    Example:
        >>> import tensorflow as tf
        >>> t = trace_function(lambda x: tf.reduce_sum(x), [tf.TensorSpec([3], tf.float32)])
        >>> [o.shape.as_list() for o in t.graph.outputs]
        [[]]
    """
    config = PforConfig(iters)
    holder: dict[str, Any] = {}
    name = getattr(fn, "__name__", "loop_fn").replace("<", "_").replace(">", "_")

    def body(*flat_in):
        args = list(pack_args(list(flat_in)) if pack_args else flat_in)
        kwargs = {}
        if with_config == "keyword":
            kwargs["pfor_config"] = config
        elif with_config:
            args.append(config)
        out = fn(*args, **kwargs)
        flat, ops = [], []
        leaves = [_flatten_leaf(leaf, flat, ops) for leaf in tf.nest.flatten(out)]
        holder.update(structure=tf.nest.map_structure(lambda _: 0, out), leaves=leaves,
                      ops=ops)
        return [tf.identity(t) for t in flat]

    # Like tf.vectorized_map: AutoGraph converts the body only when the caller's context has
    # AutoGraph on (e.g. inside a default tf.function); converting costs ~30 ms per trace.
    fn = autograph.tf_convert(fn, ag_ctx.control_status_ctx())
    _count[0] += 1
    graph = _inline_trace(body, specs, holder) if _in_tf1_graph() else None
    if graph is None:
        config.reductions.clear()  # (an inline trace given up builds them again)
        graph = _function_trace(body, specs, name, holder)
        captured = [ext for ext, _ in graph.captures]
    else:
        captured = graph.external
    n_args = len(specs)
    structure = holder["structure"]
    n_leaves = len(tf.nest.flatten(structure))
    structure = tf.nest.pack_sequence_as(structure, list(range(n_leaves)))
    op_outputs = [_body_op(graph, op) for op in holder["ops"]]
    return TracedBody(graph, structure, holder["leaves"], n_args, captured,
                      config.reductions, op_outputs)


def _function_trace(body: Callable, specs, name: str, holder: dict):
    """The body traced into a FuncGraph of its own."""
    def traced(*flat_in):
        outs = body(*flat_in)
        # Returned ops must be converted even when no output depends on them (stateful ones
        # are added by tf.function's automatic control dependencies).
        control = tf.compat.v1.get_default_graph().control_outputs
        control.extend(op for op in holder["ops"]
                       if not op._is_stateful and op not in control)  # pylint: disable=protected-access
        return outs

    traced.__name__ = name
    return tf.function(traced, autograph=False).get_concrete_function(*specs).graph


#: Op types of TF1 (non-functional) control flow.
V1_CONTROL_FLOW = frozenset({"Enter", "Exit", "Switch", "Merge", "NextIteration", "LoopCond",
                             "RefEnter", "RefExit", "RefSwitch", "RefMerge",
                             "RefNextIteration"})


def _in_tf1_graph() -> bool:
    """Building a TF1 graph (not eager, not inside a function or a TF1 control-flow body)."""
    if tf.executing_eagerly():
        return False
    graph = tf.compat.v1.get_default_graph()
    return (not getattr(graph, "building_function", False)
            and graph._get_control_flow_context() is None)  # pylint: disable=protected-access


class GraphView:
    """The ops a loop body created in the caller's (TF1) graph, seen as a function graph.

    ``inputs`` are the per-iteration placeholders then the ``external`` tensors the body's
    ops read; ``outputs`` the flat outputs; :meth:`get_operations` the body's ops in
    creation order.  Everything else is the underlying graph's.

    Example:
        >>> import tensorflow as tf
        >>> with tf.Graph().as_default() as g:
        ...     x = tf.constant(2.0)
        ...     i = tf.compat.v1.placeholder(tf.int32, [])
        ...     y = tf.cast(i, tf.float32) * x
        ...     view = GraphView(g, [y.op.inputs[0].op, y.op], [i], [y])
        >>> [t.name for t in view.external]
        ['Const:0']
    """

    def __init__(self, graph: tf.Graph, ops: list, placeholders: list, outputs: list,
                 control_outputs: Sequence = ()):
        self.graph = graph
        self._ops = list(ops)
        members = set(self._ops)
        external, seen = [], set()
        for op in self._ops:
            for t in op.inputs:
                if t.op not in members and t.ref() not in seen:
                    seen.add(t.ref())
                    external.append(t)
        placeholder_refs = {p.ref() for p in placeholders}
        self.external = [t for t in external if t.ref() not in placeholder_refs]
        self.inputs = list(placeholders) + self.external
        self.outputs = list(outputs)
        self.control_outputs = list(control_outputs)

    def get_operations(self) -> list:
        return list(self._ops)

    def __getattr__(self, name):
        return getattr(self.graph, name)


#: Ops a body creates that are vectorized in their functional form only: a TensorArray made
#: in the body is a TensorList in a function graph.
_FUNCTIONAL_ONLY = frozenset({"TensorArrayV3"})

#: Ops that create variables (loop-invariant state made once, not per iteration).
_VARIABLE_OPS = frozenset({"VariableV2", "Variable", "VarHandleOp", "TemporaryVariable"})


def _inline_trace(body: Callable, specs, holder: dict) -> GraphView | None:
    """The body built in the caller's TF1 graph (None: it built TF1 control flow)."""
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    with tf.name_scope("loop_body"):
        placeholders = [tf.compat.v1.placeholder_with_default(
            tf.zeros([], s.dtype), []) if s.shape.rank == 0 and s.dtype.is_integer
            else tf.compat.v1.placeholder(s.dtype, s.shape) for s in specs]
        outs = body(*placeholders)
    new_ops = graph.get_operations()[before:]
    outside = _extensions_of_outer_loops(new_ops, placeholders)
    if outside is None and any(op.type in V1_CONTROL_FLOW or op.type in _FUNCTIONAL_ONLY
                               for op in new_ops):
        return None
    placeholder_ops = {p.op for p in placeholders}
    # Variables the body creates exist once, outside the loop: their ops are inputs, as are
    # the ops it adds to TF1 while loops built outside it (see below).
    body_ops = [op for op in new_ops if op not in placeholder_ops
                and op.type not in _VARIABLE_OPS and op not in (outside or ())]
    return GraphView(graph, [p.op for p in placeholders] + body_ops, placeholders, outs,
                     holder["ops"])


def _extensions_of_outer_loops(new_ops: list, placeholders: list) -> set | None:
    """The ops the body added to TF1 while loops built outside it, with the body's ops they
    read; None when the body differentiates no TF1 loop or TensorArray made outside it.

    A ``tf.gradients`` in the body through such a loop extends the outer loop with
    accumulators (stack pushes, an iteration counter) and builds a gradient loop of TF1
    control flow in the body.  The body is then kept in the caller's graph, where these
    arrays and loops are what TensorFlow's gradient code expects (a function graph would make
    them functional): the outer loop's new ops run once, as part of that loop (they read
    no per-iteration value), and the body's own TF1 loops are vectorized as a whole.
    """
    members = set(new_ops)
    loops = {op._get_control_flow_context() for op in new_ops if op.type == "LoopCond"}  # pylint: disable=protected-access
    outside = [op for op in new_ops if _outer_loop_op(op, loops)]
    if not outside and not any(_outer_array_gradient(op, members) for op in new_ops):
        return None
    found, todo = set(), list(outside)
    while todo:
        op = todo.pop()
        if op in found or op not in members:
            continue
        found.add(op)
        todo.extend(t.op for t in op.inputs)
        todo.extend(op.control_inputs)
    per_iteration = found & {p.op for p in placeholders}
    if per_iteration:
        raise VectorizationError("the loop body extends a TF1 while loop built outside it with "
                                 "ops that depend on the loop index; build that while loop "
                                 "inside the loop body")
    return found


def _outer_array_gradient(op: tf.Operation, members: set) -> bool:
    """Whether ``op`` makes the gradient array of a TensorArray made outside the body."""
    if op.type != "TensorArrayGradV3":
        return False
    handle = op.inputs[0]
    while handle.op in members and handle.op.type in ("Enter", "Identity"):
        handle = handle.op.inputs[0]
    return handle.op not in members


def _outer_loop_op(op: tf.Operation, loops: set) -> bool:
    """Whether ``op`` lies in a TF1 while loop none of whose conditions is in ``loops``."""
    ctx = op._get_control_flow_context()  # pylint: disable=protected-access
    in_loop = False
    while ctx is not None:
        if ctx in loops:
            return False
        in_loop = in_loop or ctx.IsWhileContext()
        ctx = ctx.outer_context
    return in_loop


def _body_op(graph, op: tf.Operation) -> tf.Operation:
    if op.graph is not getattr(graph, "graph", graph) or (
            isinstance(graph, GraphView) and op not in graph.get_operations()):
        raise VectorizationError(f"the loop body returned the operation {op.name}, which was "
                                 "not created by the loop body")
    return op
