"""The greedy vectorizer (paper §3.5): walk a loop body's ops in topological order.

Every value of the body is kept as a :class:`~tfx_vec.pfor.registry.WrappedTensor`: *stacked*
(``[n, ...]``, one row per iteration) or *loop-invariant* (the per-iteration value, never tiled
unless an op needs it).  For each op:

1. all inputs invariant and the op stateless → the op is re-emitted unchanged (invariant);
2. otherwise the op type's converter (``registry.lookup``) emits the vectorized ops;
3. no converter, or the converter returns None → the op alone runs in a ``tf.while_loop`` over
   the iterations (outputs stacked through TensorArrays, shapes checked to agree across
   iterations), counted in :func:`fallback_report`; with ``fallback_to_while_loop=False`` a
   :class:`~tfx_vec.pfor.errors.VectorizationError` names the op and its source line instead.

The walker never names an op type.

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec.pfor.trace import trace_function
    >>> traced = trace_function(lambda x: tf.sin(x) * 2.0, [tf.TensorSpec([3], tf.float32)])
    >>> @tf.function
    ... def run(xs):
    ...     v = Vectorizer(tf.shape(xs)[0])
    ...     out, = v.convert_graph(traced.graph, [WrappedTensor(xs, True)] + traced.capture_inputs())
    ...     return out.t
    >>> run(tf.ones([4, 3])).shape
    TensorShape([4, 3])
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import warnings
from typing import Any, Callable, Sequence

import tensorflow as tf
from tensorflow.python.ops import handle_data_util

from tfx_vec.pfor import converters as _converters  # noqa: F401  (registers converters)
from tfx_vec.pfor.converters._helpers import create_op_like, emit_op
from tfx_vec.pfor.converters.parsing_ops import forward_batched, unbatch_inputs
from tfx_vec.pfor.converters.v1_while import group_loops
from tfx_vec.pfor.errors import VectorizationError, op_error, runtime_message, user_source_line
from tfx_vec.pfor.registry import ConversionInput, WrappedTensor, lookup, tile_to_stacked

__all__ = ["Vectorizer", "FallbackReport", "fallback_report", "reset_fallbacks", "Reduction",
           "per_iteration_loop", "RANDOMNESS"]

RANDOMNESS = ("different", "same", "error")


# {{{ fallback bookkeeping

class FallbackReport(dict):
    """``{op_type: count}`` of ops that ran in a per-iteration loop; ``.sources`` gives the
    user source lines (``{op_type: {"file:line": count}}``).

    Example:
        >>> r = FallbackReport({"WriteFile": 2}, {"WriteFile": {"model.py:3": 2}})
        >>> print(r)
        pfor fallbacks (op type: count  [source lines]):
          WriteFile: 2  [model.py:3 x2]
    """

    def __init__(self, counts: dict[str, int], sources: dict[str, dict[str, int]]):
        super().__init__(counts)
        self.sources = sources

    def __str__(self) -> str:
        if not self:
            return "no pfor fallbacks"
        lines = ["pfor fallbacks (op type: count  [source lines]):"]
        for op_type, count in sorted(self.items(), key=lambda kv: -kv[1]):
            where = ", ".join(f"{s} x{c}" for s, c in self.sources[op_type].items())
            lines.append(f"  {op_type}: {count}  [{where}]")
        return "\n".join(lines)


_FALLBACKS: collections.Counter = collections.Counter()


def fallback_report() -> FallbackReport:
    """Every op that pfor ran in a per-iteration loop since the last reset (process-wide).

    Example:
        >>> reset_fallbacks(); dict(fallback_report())
        {}
    """
    counts: dict[str, int] = collections.Counter()
    sources: dict[str, dict[str, int]] = collections.defaultdict(dict)
    for (op_type, source), c in _FALLBACKS.items():
        counts[op_type] += c
        sources[op_type][source or "?"] = c
    return FallbackReport(dict(counts), dict(sources))


def reset_fallbacks() -> None:
    """Forget every recorded fallback.

    Example:
        >>> reset_fallbacks(); len(fallback_report())
        0
    """
    _FALLBACKS.clear()

# }}}


@dataclasses.dataclass(eq=False)
class Reduction:
    """A cross-iteration reduction requested through ``config.reduce*`` in the loop body:
    ``fn`` of the per-iteration ``values`` (tensors of the traced graph) stacked over all
    iterations.

    Example:
        >>> import tensorflow as tf
        >>> Reduction(lambda s: tf.reduce_sum(s, 0), []).values
        []
    """

    fn: Callable[..., Any]
    values: list


class Vectorizer:
    """Converts loop bodies into vectorized ops emitted into the current default graph.

    Options (carried for converters): ``fallback_to_while_loop``, ``parallel_iterations`` (of
    fallback loops), ``randomness`` ("different": each iteration draws its own random numbers;
    "same": one draw shared by all; "error": refuse random ops), ``xla`` (emitting inside a
    ``jit_compile=True`` trace, where data-dependent shapes are not allowed).

    Example (what ``pfor`` does, written out):
        >>> import tensorflow as tf
        >>> from tfx_vec.pfor.trace import trace_function
        >>> body = trace_function(lambda x: x * 3.0, [tf.TensorSpec([2], tf.float32)])
        >>> @tf.function
        ... def run(xs):
        ...     out, = Vectorizer(tf.shape(xs)[0]).convert_graph(
        ...         body.graph, [WrappedTensor(xs, True)] + body.capture_inputs())
        ...     return out.t
        >>> run(tf.ones([3, 2])).numpy().tolist()
        [[3.0, 3.0], [3.0, 3.0], [3.0, 3.0]]
    """

    def __init__(self, loop_len: tf.Tensor | int, *, fallback_to_while_loop: bool = True,
                 parallel_iterations: int | None = None, randomness: str = "different",
                 xla: bool = False,
                 reductions: dict[str, tuple[Reduction, int]] | None = None):
        if randomness not in RANDOMNESS:
            raise ValueError(f"randomness must be one of {RANDOMNESS}, got {randomness!r}")
        self.loop_len = tf.cast(tf.convert_to_tensor(loop_len), tf.int32)
        self.fallback_to_while_loop = fallback_to_while_loop
        self.parallel_iterations = parallel_iterations
        self.randomness = randomness
        self.xla = xla
        self.reductions = dict(reductions or {})
        #: (op type, source line) of every op of this conversion that fell back to a loop.
        self.fallbacks: list[tuple[str, str | None]] = []
        #: For each converted op without outputs (a side effect), the ops emitted for it.
        self.side_effects: dict[tf.Operation, list[tf.Operation]] = {}
        self._inherited: dict[tf.Operation, frozenset] = {}
        #: True when this conversion is one chunk of a sequential loop over chunks of the
        #: iterations (``pfor(..., parallel_iterations=k)``): its ops run once per chunk.
        self.chunked = False
        #: How many masked forms (under XLA: every branch / the loop body run on all
        #: iterations, the inactive ones' results discarded) the current conversion is in.
        self.masked_depth = 0
        #: What converters keep for the length of this conversion, one entry per converter
        #: family (see :func:`~tfx_vec.pfor.converters._helpers.conversion_state`).
        self.converter_state: dict[str, Any] = {}

    # {{{ graph walk

    def convert_graph(self, graph: tf.Graph, inputs: Sequence[WrappedTensor],
                      loop_len: tf.Tensor | None = None) -> list[WrappedTensor]:
        """Vectorize the function body ``graph`` whose ``graph.inputs`` are bound to ``inputs``.

        Emits into the current default graph and returns one value per ``graph.outputs``.
        ``loop_len`` (default: this vectorizer's) is the number of rows of stacked values.
        """
        loop_len = self.loop_len if loop_len is None else tf.cast(loop_len, tf.int32)
        if len(inputs) != len(graph.inputs):
            raise VectorizationError(f"convert_graph: {len(graph.inputs)} graph inputs but "
                                     f"{len(inputs)} values given")
        env: dict[Any, WrappedTensor] = {}
        for t, w in zip(graph.inputs, inputs):
            if not isinstance(w, WrappedTensor):
                raise TypeError(f"convert_graph inputs must be WrappedTensor, got {w!r}")
            env[t.ref()] = w
        extra = {}  # a reduction's placeholder depends on the reduced values
        underlying = getattr(graph, "graph", graph)   # (a trace.GraphView: the real graph)
        members = set(graph.get_operations())
        for red_name, (red, _) in self.reductions.items():
            if red.values and red.values[0].graph is underlying and red.values[0].op in members:
                extra[graph.get_tensor_by_name(red_name).op] = [v.op for v in red.values]
        roots = list(getattr(graph, "control_outputs", []))
        needed = _needed_ops(graph.outputs, roots, extra, members)
        # A TF1 while loop's ops form a cycle: each loop is converted as one unit, which
        # needs all of its ops (and what they read).
        units = group_loops(graph.get_operations())
        while True:
            touched = {units[op] for op in needed if op in units}
            more = [op for op in units if units[op] in touched and op not in needed]
            if not more:
                break
            roots += more
            needed = _needed_ops(graph.outputs, roots, extra, members)
        for op in _topological_order(graph, needed, extra, units):
            if not (op.outputs and all(o.ref() in env for o in op.outputs)):
                self._convert_op(op, env, loop_len)
        return [env[t.ref()] for t in graph.outputs]

    def _convert_op(self, op: tf.Operation, env: dict, loop_len: tf.Tensor) -> None:
        # The body's control dependencies (e.g. on a print) hold between the emitted ops.
        deps = self._converted_control_inputs(op, env)
        with tf.control_dependencies(deps) if deps else contextlib.nullcontext():
            if not op.outputs:
                graph = tf.compat.v1.get_default_graph()
                before = len(graph.get_operations())
                self._convert_op_outputs(op, env, loop_len)
                self.side_effects[op] = graph.get_operations()[before:]
            else:
                self._convert_op_outputs(op, env, loop_len)

    def _converted_control_inputs(self, op: tf.Operation, env: dict) -> list:
        """The emitted ops standing for ``op``'s control inputs (those of this graph).

        Side effects (ops without outputs, e.g. a print) are inherited along data edges too:
        a converter may drop an input that carried the dependency (a constant axis read as a
        Python value), so every op downstream of one keeps it.
        """
        inherited: set = set()
        for t in op.inputs:
            inherited |= self._inherited.get(t.op, frozenset())
        deps = []
        for c in op.control_inputs:
            inherited |= self._inherited.get(c, frozenset())
            if c in self.side_effects:
                inherited |= set(self.side_effects[c])
            elif c.outputs and c.outputs[0].ref() in env:
                deps.append(env[c.outputs[0].ref()].t.op)
        if inherited:
            self._inherited[op] = frozenset(inherited)
        graph = tf.compat.v1.get_default_graph()
        return [d for d in deps + sorted(inherited, key=lambda o: o.name)
                if getattr(d, "graph", None) is graph]

    def _convert_op_outputs(self, op: tf.Operation, env: dict, loop_len: tf.Tensor) -> None:
        if op.type == "Placeholder":
            self._convert_placeholder(op, env, loop_len)
            return
        inputs = [env[t.ref()] for t in op.inputs]
        if any(getattr(w, "batched", False) for w in inputs):
            forwarded = forward_batched(op, inputs)
            if forwarded is not None:
                env.update((t.ref(), w) for t, w in zip(op.outputs, forwarded))
                return
            inputs = unbatch_inputs(inputs, loop_len)
        stateful = _is_stateful(op)
        converter = lookup(op.type)
        any_stacked = any(w.is_stacked for w in inputs)
        if not any_stacked and (not stateful or self._invariant_stateful_ok(op, converter)):
            outs = create_op_like(op, [w.t for w in inputs])
            for old, new in zip(op.outputs, outs):  # a list's element dtype and shape
                handle_data_util.copy_handle_data(old, new)
            result = [WrappedTensor(t, False) for t in outs]
        else:
            result, reason = None, None
            if converter is not None:
                result, reason = self._call_converter(converter, op, inputs, loop_len)
            if result is None:
                result = self._fallback(op, inputs, loop_len, reason)
        for t, w in zip(op.outputs, result):
            env[t.ref()] = w

    def _invariant_stateful_ok(self, op: tf.Operation, converter) -> bool:
        """A stateful op with invariant inputs and no converter: run it once, shared by all
        iterations, when that cannot be told apart from running it per iteration."""
        if converter is not None:
            return False
        return not op.outputs or self.randomness == "same"

    def _convert_placeholder(self, op: tf.Operation, env: dict, loop_len: tf.Tensor) -> None:
        entry = self.reductions.get(op.outputs[0].name)
        if entry is None:
            raise op_error(op, f"placeholder {op.name} of the loop body is not bound to a value")
        red, k = entry
        # fn runs once per conversion of the graph holding the reduction, for all of its
        # outputs: a reduction in a while loop's condition is recomputed by every conversion
        # of that condition (a dry run's scratch graph, then the loop's own condition).
        key = ("pfor_reduction", id(red))
        if key not in env:
            stacked = []
            for v in red.values:
                w = env[v.ref()]
                stacked.append(w.t if w.is_stacked else tile_to_stacked(w.t, loop_len))
            env[key] = [tf.convert_to_tensor(o) for o in tf.nest.flatten(red.fn(*stacked))]
        env[op.outputs[0].ref()] = WrappedTensor(env[key][k], False)

    def _call_converter(self, converter, op, inputs, loop_len):
        """(outputs or None, why the converter declined)."""
        x = ConversionInput(op, inputs, loop_len, self)
        try:
            result = converter(x)
        except VectorizationError:
            raise
        except Exception as e:  # a converter bug or an unsupported corner: name the op
            err = op_error(op, f"converter {getattr(converter, '__name__', converter)} failed: "
                               f"{type(e).__name__}: {e}")
            if not self.fallback_to_while_loop:
                raise err from e
            warnings.warn(f"{err}; running this op in a per-iteration loop instead")
            return None, None
        if result is None:
            return None, x.decline_reason
        if isinstance(result, WrappedTensor):
            result = [result]
        result = list(result)
        _check_result(op, result)
        return result, None

    # }}}

    # {{{ fallback: one op in a per-iteration loop

    def _fallback(self, op: tf.Operation, inputs: list[WrappedTensor], loop_len: tf.Tensor,
                  reason: str | None = None) -> list[WrappedTensor]:
        source = user_source_line(op)
        stacked = [w.is_stacked for w in inputs]
        why = f" ({reason})" if reason else ""
        if any(w.is_stacked and w.t.dtype == tf.variant and w.t.shape.rank == 0
               for w in inputs):
            raise op_error(op, f"No pfor vectorization defined for this op{why}, and it takes a "
                               "TensorList holding every iteration's elements, which a "
                               "per-iteration loop cannot split; inputs "
                               f"stacked={stacked}")
        if not self.fallback_to_while_loop:
            raise op_error(op, f"No pfor vectorization defined for this op{why}: no vectorized "
                               f"converter for this op with inputs stacked={stacked} and "
                               "fallback_to_while_loop=False")
        return self.run_per_iteration(op, inputs, loop_len, source)

    def run_per_iteration(self, op: tf.Operation, inputs: list[WrappedTensor],
                          loop_len: tf.Tensor, source: str | None = None
                          ) -> list[WrappedTensor]:
        """``op`` in a per-iteration loop, counted in :func:`fallback_report`."""
        source = source or user_source_line(op)
        if self.xla:
            warnings.warn(f"{op_error(op, 'falls back to a per-iteration loop inside an XLA trace')}")
        self.fallbacks.append((op.type, source))
        _FALLBACKS[(op.type, source)] += 1
        return per_iteration_loop(op, inputs, loop_len, self.parallel_iterations)

    # }}}


def per_iteration_loop(op: tf.Operation, inputs: Sequence[WrappedTensor], loop_len: tf.Tensor,
                       parallel_iterations: int | None = None) -> list[WrappedTensor]:
    """Run ``op`` once per iteration in a ``tf.while_loop`` and stack its outputs.

    Every output must have the same shape in every iteration; otherwise a run-time assertion
    fails with a message naming the op (turned into a VectorizationError by the eager API).

    Example:
        >>> import tensorflow as tf
        >>> g = tf.function(lambda x: tf.reduce_sum(x)).get_concrete_function(
        ...     tf.TensorSpec([3], tf.float32)).graph
        >>> op = [o for o in g.get_operations() if o.type == "Sum"][0]
        >>> @tf.function
        ... def run(xs):
        ...     out, = per_iteration_loop(op, [WrappedTensor(xs, True),
        ...                                    WrappedTensor(tf.constant(0), False)], 2)
        ...     return out.t
        >>> run(tf.ones([2, 3])).numpy().tolist()
        [3.0, 3.0]
    """
    out_dtypes = [o.dtype for o in op.outputs]
    if not out_dtypes:  # side effects only (e.g. Assert, Print): run it, nothing to stack
        def side_effect_body(i):
            new_op = emit_op(op, _slice_inputs(inputs, i))
            with tf.control_dependencies([new_op]):
                return tf.identity(i + 1)
        tf.while_loop(lambda i: i < loop_len, side_effect_body, (tf.constant(0),),
                      parallel_iterations=parallel_iterations or 10)
        return []
    tas = [tf.TensorArray(d, size=loop_len, infer_shape=False,
                          element_shape=_element_shape(o)) for d, o in zip(out_dtypes, op.outputs)]
    shape_tas = [tf.TensorArray(tf.int32, size=loop_len, infer_shape=False) for _ in out_dtypes]

    def body(i, tas, shape_tas):
        outs = create_op_like(op, _slice_inputs(inputs, i))
        tas = [ta.write(i, o) for ta, o in zip(tas, outs)]
        shape_tas = [sta.write(i, tf.shape(o)) for sta, o in zip(shape_tas, outs)]
        return i + 1, tas, shape_tas

    _, tas, shape_tas = tf.while_loop(
        lambda i, *_: i < loop_len, body, (tf.constant(0), tas, shape_tas),
        parallel_iterations=parallel_iterations or 10)
    results = []
    for o, ta, sta in zip(op.outputs, tas, shape_tas):
        results.append(WrappedTensor(_stack_checked(op, o, ta, sta, loop_len), True))
    return results


def _slice_inputs(inputs: Sequence[WrappedTensor], i: tf.Tensor) -> list[tf.Tensor]:
    return [tf.gather(w.t, i) if w.is_stacked else w.t for w in inputs]


def _element_shape(o: tf.Tensor):
    return o.shape if o.shape.is_fully_defined() else None


def _stack_checked(op, o, ta, sta, loop_len) -> tf.Tensor:
    rank = o.shape.rank
    if rank == 0 or o.shape.is_fully_defined():
        stacked = ta.stack()
    else:
        shapes = sta.stack() if rank is not None else None
        checks = []
        if shapes is not None:
            same = tf.reduce_all(tf.equal(shapes, shapes[:1]))
            checks.append(tf.debugging.Assert(same, [runtime_message(
                op, "output shapes differ across iterations (a ragged result cannot be "
                    "stacked); per-iteration shapes:"), shapes], summarize=30))
        with tf.control_dependencies(checks):
            stacked = ta.stack()
    stacked.set_shape(tf.TensorShape([None]).concatenate(o.shape))
    n = tf.get_static_value(loop_len)
    if n is not None:
        stacked.set_shape([int(n)] + [None] * (stacked.shape.rank - 1)
                          if stacked.shape.rank is not None else None)
    return stacked


def _is_stateful(op: tf.Operation) -> bool:
    try:
        return bool(op._is_stateful)  # pylint: disable=protected-access
    except AttributeError:
        return op.op_def.is_stateful if op.op_def else False


def _needed_ops(outputs: Sequence[tf.Tensor], control_outputs: Sequence[tf.Operation],
                extra: dict | None = None, members: set | None = None) -> set:
    """Ops the outputs depend on (through data and control edges, and ``extra`` ones),
    among ``members`` (the body's ops) when given."""
    seen: set = set()
    stack = [t.op for t in outputs] + list(control_outputs)
    while stack:
        op = stack.pop()
        if op in seen or (members is not None and op not in members):
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
        stack.extend((extra or {}).get(op, ()))
    return seen


def _topological_order(graph: tf.Graph, needed: set, extra: dict, units: dict | None = None
                       ) -> list:
    """``needed`` ops in dependency order, creation order breaking ties; the ops of each
    value of ``units`` (a TF1 while loop, ``{op: unit}``) are replaced by the unit.

    Creation order alone is not enough: building a while loop's gradient adds accumulator
    outputs to the forward ``While`` op after ops that consume them were created.
    """
    units = units or {}
    position = {}
    for k, op in enumerate(graph.get_operations()):
        position.setdefault(units.get(op, op), k)
    needed = {units.get(op, op) for op in needed}
    ops = sorted(needed, key=lambda o: position.get(o, -1))
    deps = {op: {units.get(d, d) for d in [t.op for t in op.inputs] + list(op.control_inputs)
                 + list(extra.get(op, ()))}
            for op in ops}
    users: dict = collections.defaultdict(list)
    pending = {}
    for op in ops:
        ds = {d for d in deps[op] if d in needed and d is not op}
        pending[op] = len(ds)
        for d in ds:
            users[d].append(op)
    ready = [(position.get(op, -1), k, op) for k, op in enumerate(ops) if pending[op] == 0]
    heapq.heapify(ready)
    order, tie = [], len(ops)
    while ready:
        _, _, op = heapq.heappop(ready)
        order.append(op)
        for u in users[op]:
            pending[u] -= 1
            if pending[u] == 0:
                tie += 1
                heapq.heappush(ready, (position.get(u, -1), tie, u))
    if len(order) != len(ops):
        cyclic = [op.name for op in ops if pending[op] > 0][:5]
        raise VectorizationError(f"the loop body graph has a dependency cycle through {cyclic}")
    return order


def _check_result(op: tf.Operation, result: list[WrappedTensor]) -> None:
    if len(result) != len(op.outputs):
        raise op_error(op, f"converter returned {len(result)} values for {len(op.outputs)} "
                           "outputs")
    for k, (o, w) in enumerate(zip(op.outputs, result)):
        if not isinstance(w, WrappedTensor):
            raise op_error(op, f"converter output {k} is {type(w).__name__}, not WrappedTensor")
        if w.t.dtype != o.dtype:
            raise op_error(op, f"converter output {k} has dtype {w.t.dtype.name}, expected "
                               f"{o.dtype.name}")
        if getattr(w, "batched", False):
            continue  # (a sparse component of all iterations, see parsing_ops)
        if o.dtype in (tf.variant, tf.resource):
            continue  # handles (e.g. internally stacked TensorLists) keep their own shapes
        shape = w.t.shape[1:] if w.is_stacked and w.t.shape.rank else w.t.shape
        if w.is_stacked and w.t.shape.rank == 0:
            raise op_error(op, f"converter output {k} is stacked but a scalar")
        if not shape.is_compatible_with(o.shape):
            raise op_error(op, f"converter output {k} has per-iteration shape {shape}, "
                               f"expected {o.shape}")
