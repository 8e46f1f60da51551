"""Converters for functional control flow: conditionals, loops and function calls (§3.6, §3.7).

- ``If``/``StatelessIf``/``Case``/``StatelessCase``.  A loop-variant predicate (branch index):
  the iterations are partitioned by branch (``tf.dynamic_partition`` of the active indices),
  each branch is vectorized recursively for its own iterations only (its stacked inputs --
  the loop index among them -- gathered to those rows) and the results are stitched back
  (``tf.dynamic_stitch``).  A loop-invariant predicate keeps one ``tf.cond``/``tf.switch_case``
  whose branches are the vectorized branches.
- ``While``/``StatelessWhile``.  Which loop variables are stacked is found first, by a fixed
  point (a loop-invariant variable becomes stacked when the body makes it loop-variant).  A
  loop-invariant condition keeps one ``tf.while_loop`` over the vectorized body.  A loop-variant
  condition gives one ``tf.while_loop`` that tracks the still-active iterations: each step
  runs the vectorized body on them, evaluates the vectorized condition and writes the
  finished ones' values into per-iteration ``TensorArray``s.  TensorLists it carries are not
  compacted: they get per-row element counts (``lists.RowCountedList``) and the body reaches
  the active rows through their indices (under XLA such loops run per iteration).
- ``PartitionedCall``/``StatefulPartitionedCall`` (a ``tf.function`` called from the body):
  the function body is vectorized inline.
- Under ``tf.function(jit_compile=True)`` (or the vectorizer's ``xla`` option), where the
  data-dependent shapes of partitioning cannot compile, a loop-variant predicate or condition
  uses the *masked* form instead: every branch (the body) runs on all iterations and
  ``tf.where`` on the predicate (the still-active mask) selects each iteration's values.

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> f = lambda i: tf.cond(i % 2 == 0, lambda: i * 10, lambda: -i)
    >>> tfx_vec.pfor(f, 4).numpy().tolist()
    [0, -1, 20, -3]
"""
from __future__ import annotations

import collections
import contextlib
from typing import Callable, Sequence

import tensorflow as tf
from tensorflow.python.framework import func_graph as func_graph_module
from tensorflow.python.framework import function_def_to_graph
from tensorflow.python.ops import control_flow_util, handle_data_util, list_ops

from tfx_vec.pfor.converters._helpers import (DRY_RUN_SOURCES, conversion_state, copy_state,
                                              create_op_like, where_positions)
from tfx_vec.pfor.converters.lists import (PER_ROW, SHARED, RowCountedList, aligned_entry,
                                           counted_parts, handle_dtype, layout_of,
                                           list_element_shape,
                                           restore_shapes, slice_counted, stack_like)
from tfx_vec.pfor.converters.parsing_ops import unbatch_inputs
from tfx_vec.pfor.registry import (ConversionInput, WrappedTensor, register_converter,
                                   tile_to_stacked)

#: Registration modules: their converters are reached through the registry (``While`` is
#: also the TF1 while loops' converter, see ``v1_while.py``).
__all__ = ["While"]


# {{{ helpers

def function_graph(op: tf.Operation, attr: str | None = None, name: str | None = None
                   ) -> tf.Graph:
    """The FuncGraph of the function named by ``op``'s attr ``attr`` (or by ``name``)."""
    if name is None:
        name = op.get_attr(attr).name
    g, fn = op.graph, None
    while g is not None and fn is None:
        fn = g._get_function(name)  # pylint: disable=protected-access
        g = getattr(g, "outer_graph", None)
    if fn is None:
        raise ValueError(f"function {name} of op {op.name} not found in its graph")
    graph = getattr(fn, "graph", None)
    if graph is None:
        graph = function_def_to_graph.function_def_to_graph(fn.definition)
    return graph


def in_xla_context(x: ConversionInput) -> bool:
    """Whether the vectorized ops are emitted inside a ``jit_compile=True`` trace."""
    if getattr(x.vectorizer, "xla", False):
        return True
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _stack(w: WrappedTensor, n: tf.Tensor, original: tf.Tensor | None = None) -> tf.Tensor:
    return stack_like(w, n, original)


def _has_stacked_variant(ws: Sequence[WrappedTensor]) -> bool:
    return any(w.is_stacked and w.t.dtype == tf.variant for w in ws)


def _gather_rows(inputs: Sequence[WrappedTensor], rows: tf.Tensor) -> list[WrappedTensor]:
    return [WrappedTensor(tf.gather(w.t, rows), True) if w.is_stacked else w for w in inputs]


def _convert(x: ConversionInput, graph, inputs, loop_len) -> list[WrappedTensor]:
    # (a branch's or a step's results are stitched and carried as stacked tensors)
    return unbatch_inputs(x.vectorizer.convert_graph(graph, list(inputs), loop_len), loop_len)


def _placeholder_like(w: WrappedTensor, stacked: bool, layout=(0, False, False, False)
                      ) -> WrappedTensor:
    """A placeholder standing for ``w`` made ``stacked`` (lists keep their scalar handle;
    ``layout``: a list with per-row element counts, see ``lists.layout_of``)."""
    kind, aligned, at_end, constant = layout
    if kind:
        ints = lambda: tf.compat.v1.placeholder(tf.int32, [None])
        rows = ints() if isinstance(w, RowCountedList) and w.rows is not None else None
        return RowCountedList(tf.compat.v1.placeholder(tf.variant, []), ints(), ints(), rows,
                              shared=kind == SHARED, aligned=aligned, at_end=at_end,
                              constant=constant)
    shape = w.t.shape
    if stacked and not w.is_stacked and w.t.dtype != tf.variant:
        shape = tf.TensorShape([None]).concatenate(shape)
    p = tf.compat.v1.placeholder(w.t.dtype, shape)
    # A list's handle data describes its per-iteration elements; a stacked list's do not match.
    if w.t.dtype == tf.resource or (w.t.dtype == tf.variant and w.is_stacked == stacked):
        handle_data_util.copy_handle_data(w.t, p)
    return WrappedTensor(p, stacked)


def dry_run(x: ConversionInput, graph, inputs: Sequence[WrappedTensor],
            flags: Sequence[bool] | None = None) -> list[bool]:
    """Which outputs of ``graph`` come out stacked for ``inputs`` (made stacked where
    ``flags`` says so), converted in a scratch graph that is then thrown away."""
    return dry_run_kinds(x, graph, inputs, flags)[0]


def dry_run_kinds(x: ConversionInput, graph, inputs: Sequence[WrappedTensor],
                  flags: Sequence[bool] | None = None,
                  layouts: Sequence | None = None) -> tuple[list[bool], list]:
    """:func:`dry_run`, also giving the ``lists.layout_of`` of each output (``layouts``:
    that of each input; default: as given)."""
    flags = [w.is_stacked for w in inputs] if flags is None else flags
    if layouts is None:
        layouts = [layout_of(w) for w in inputs]
    from tfx_vec.pfor import vectorizer as vmod
    saved_counts = collections.Counter(getattr(vmod, "_FALLBACKS", {}))
    saved_list = list(getattr(x.vectorizer, "fallbacks", []))
    scratch = func_graph_module.FuncGraph("pfor_dry_run")
    # What converters record (stacks created, gradient arrays) must not outlive the dry run;
    # they may look through its placeholders to the values they stand for.
    saved_state = {k: copy_state(v) for k, v in x.vectorizer.converter_state.items()}
    try:
        with scratch.as_default():
            n = tf.compat.v1.placeholder(tf.int32, [])
            placeholders = [_placeholder_like(w, f, c)
                            for w, f, c in zip(inputs, flags, layouts)]
            sources = conversion_state(x, DRY_RUN_SOURCES, dict)
            sources[n.ref()] = x.loop_len
            for p, w in zip(placeholders, inputs):
                if w.t.dtype == tf.resource:
                    sources[p.t.ref()] = w.t
            outs = _convert(x, graph, placeholders, n)
            return [w.is_stacked for w in outs], [layout_of(w) for w in outs]
    finally:
        x.vectorizer.converter_state.clear()
        x.vectorizer.converter_state.update(saved_state)
        if hasattr(vmod, "_FALLBACKS"):
            vmod._FALLBACKS.clear()
            vmod._FALLBACKS.update(saved_counts)
        if hasattr(x.vectorizer, "fallbacks"):
            x.vectorizer.fallbacks[:] = saved_list


def _expand_mask(mask: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """``[n]`` bool -> ``[n, 1, ...]`` to broadcast against ``like``."""
    extra = tf.rank(like) - 1
    return tf.reshape(mask, tf.concat([tf.shape(mask), tf.ones([extra], tf.int32)], 0))


def _select(mask: tf.Tensor, a: WrappedTensor, b: WrappedTensor, n) -> WrappedTensor:
    if not a.is_stacked and not b.is_stacked and a.t is b.t:
        return a
    ta, tb = _stack(a, n), _stack(b, n)
    return WrappedTensor(tf.where(_expand_mask(mask, ta), ta, tb), True)

# }}}


# {{{ per-iteration execution of one control-flow op

def _slice_iteration(w: WrappedTensor, original: tf.Tensor, j: tf.Tensor) -> tf.Tensor:
    """Iteration ``j``'s value of ``w`` (an internally stacked list is unstacked too)."""
    if not w.is_stacked:
        return w.t
    if isinstance(w, RowCountedList):
        return slice_counted(w, j, handle_dtype(original))
    if w.t.dtype == tf.variant and w.t.shape.rank == 0:
        dense = list_ops.tensor_list_stack(w.t, handle_dtype(original))  # [length, n, ...]
        return list_ops.tensor_list_from_tensor(tf.gather(dense, j, axis=1),
                                                tf.constant(-1, tf.int32))
    return tf.gather(w.t, j)


def run_per_iteration(x: ConversionInput, same: dict, why: str) -> list[WrappedTensor]:
    """Run ``x.op`` once per iteration in a ``tf.while_loop`` and stack its outputs, except
    output ``i`` in ``same`` (returned as given).  Counted like the vectorizer's fallback; an
    error naming the op (and ``why``) when fallbacks are off."""
    from tfx_vec.pfor import vectorizer as vmod
    from tfx_vec.pfor.errors import user_source_line
    v, op = x.vectorizer, x.op
    if not getattr(v, "fallback_to_while_loop", True):
        raise x.error(f"{why}; allow fallback_to_while_loop to run it per iteration")
    source = user_source_line(op)
    if hasattr(v, "fallbacks"):
        v.fallbacks.append((op.type, source))
    if hasattr(vmod, "_FALLBACKS"):
        vmod._FALLBACKS[(op.type, source)] += 1
    keep = [i for i in range(len(op.outputs)) if i not in same]
    tas = [tf.TensorArray(op.outputs[i].dtype, size=x.loop_len, infer_shape=False)
           for i in keep]

    def body(j, *tas_):
        args = [_slice_iteration(w, o, j) for w, o in zip(x.inputs, op.inputs)]
        outs = create_op_like(op, args)
        return (j + 1,) + tuple(ta.write(j, outs[i]) for ta, i in zip(tas_, keep))

    res = tf.while_loop(lambda j, *_: j < x.loop_len, body, (tf.constant(0),) + tuple(tas),
                        parallel_iterations=getattr(v, "parallel_iterations", None) or 10)
    stacked = dict(zip(keep, res[1:]))
    outs = []
    for i, o in enumerate(op.outputs):
        if i in stacked:
            t = stacked[i].stack()
            t.set_shape(tf.TensorShape([None]).concatenate(o.shape))
            outs.append(WrappedTensor(t, True))
        else:
            outs.append(same[i])
    return outs

# }}}


# {{{ If / Case

def _branch_index(x: ConversionInput, num_branches: int) -> WrappedTensor:
    """If: 1 for the then branch, 0 for else. Case: out-of-range indices run the last branch."""
    w = x.inputs[0]
    if x.op_type in ("If", "StatelessIf"):
        pred = w.t if w.t.dtype == tf.bool else tf.cast(w.t, tf.bool)
        return WrappedTensor(tf.cast(pred, tf.int32), w.is_stacked)
    idx = tf.cast(w.t, tf.int32)
    idx = tf.where((idx < 0) | (idx >= num_branches), num_branches - 1, idx)
    return WrappedTensor(idx, w.is_stacked)


def _branch_graphs(x: ConversionInput) -> list:
    if x.op_type in ("If", "StatelessIf"):
        # Partition index 0 = else, 1 = then.
        return [function_graph(x.op, "else_branch"), function_graph(x.op, "then_branch")]
    return [function_graph(x.op, name=f.name) for f in x.attr("branches")]


@register_converter("If", "StatelessIf", "Case", "StatelessCase")
def _convert_conditional(x: ConversionInput):
    return restore_shapes(x, _conditional(x))


def _conditional(x: ConversionInput):
    graphs = _branch_graphs(x)
    index = _branch_index(x, len(graphs))
    args = x.inputs[1:]
    if not index.is_stacked:
        return _invariant_conditional(x, index.t, graphs, args)
    if _has_stacked_variant(args) or any(o.dtype == tf.variant for o in x.op.outputs):
        return run_per_iteration(x, {}, "TensorLists cannot be partitioned by a predicate "
                                        "that depends on the loop index")
    if in_xla_context(x):
        return _masked_conditional(x, index.t, graphs, args)
    return _partitioned_conditional(x, index.t, graphs, args)


def _invariant_conditional(x, index, graphs, args):
    kinds = [dry_run_kinds(x, g, args) for g in graphs]
    if (any(isinstance(w, RowCountedList) for w in args)
            or any(any(layout[0] for layout in layouts) for _, layouts in kinds)):
        return run_per_iteration(x, {}, "lists whose iterations hold different numbers of "
                                        "elements cannot pass through a conditional")
    flags = [any(fs) for fs in zip(*(stacked for stacked, _ in kinds))]

    def branch(g):
        def run():
            outs = _convert(x, g, args, x.loop_len)
            return [_stack(w, x.loop_len) if f else w.t for w, f in zip(outs, flags)]
        return run

    outs = tf.switch_case(index, [branch(g) for g in graphs])
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    return [WrappedTensor(t, f) for t, f in zip(outs, flags)]


def _partitioned_conditional(x, index, graphs, args):
    k = len(graphs)
    rows = tf.dynamic_partition(tf.range(x.loop_len), index, k)
    results = []
    for g, r in zip(graphs, rows):
        m = tf.size(r)
        outs = _convert(x, g, _gather_rows(args, r), m)
        results.append([_stack(w, m) for w in outs])
    return [WrappedTensor(tf.dynamic_stitch(rows, list(parts)), True)
            for parts in zip(*results)] if results and results[0] else []


@contextlib.contextmanager
def _masked_form(x: ConversionInput):
    """Marks conversions whose ops also run for iterations whose results are discarded
    (converters of stateful ops check ``masked_depth``)."""
    x.vectorizer.masked_depth += 1
    try:
        yield
    finally:
        x.vectorizer.masked_depth -= 1


def _masked_conditional(x, index, graphs, args):
    with _masked_form(x):
        outs = [_convert(x, g, args, x.loop_len) for g in graphs]
    merged = outs[-1]
    for b in range(len(graphs) - 2, -1, -1):
        mask = tf.equal(index, b)
        merged = [_select(mask, a, m, x.loop_len) for a, m in zip(outs[b], merged)]
    return merged

# }}}


# {{{ PartitionedCall

@register_converter("PartitionedCall", "StatefulPartitionedCall")
def _convert_call(x: ConversionInput):
    return restore_shapes(x, _convert(x, function_graph(x.op, "f"), x.inputs, x.loop_len))

# }}}


# {{{ While

def _merge_layout(loop: tuple, out: tuple) -> tuple:
    """A loop variable's layout at each step's start, given the body's output layout: what
    holds at entry and after the body (an uncounted output is a uniform list: aligned)."""
    if out[0] == loop[0]:
        return (loop[0],) + tuple(a and b for a, b in zip(loop[1:], out[1:]))
    if out[0] == SHARED:  # tiled each step: rows' ends differ
        return loop[0], False, False, False
    return loop


class While:
    """Vectorizes one While op (see the module docstring); ``cond`` and ``body`` (default:
    the op's functions) are the graphs the condition and the body are converted from.

    Loop variables the body passes through unchanged and that are loop-invariant (captured
    weights, variable handles) are not carried by the new loop: the body closes over them.
    A list loop variable with per-row element counts (:class:`RowCountedList`) is carried as
    three tensors (buffer, starts, ends); in the loop over the still-active rows it is never
    compacted: the body sees it with ``rows`` = the buffer rows of the active iterations.
    """

    def __init__(self, x: ConversionInput, cond=None, body=None):
        self.x = x
        self.cond = function_graph(x.op, "cond") if cond is None else cond
        self.body = function_graph(x.op, "body") if body is None else body
        self.n = x.loop_len
        self.k = len(x.inputs)
        self.pass_through = [i is o for i, o in zip(self.body.inputs, self.body.outputs)]
        self.parallel_iterations = x.attr("parallel_iterations") or 10
        self.carried: list[bool] = []
        #: ``lists.layout_of`` of each variable in the new loop, at the start of every step
        #: (kind 0: not a counted list).  A counted list enters with aligned rows.
        self.layouts = [(k, True, True, False) if k == PER_ROW else (k, False, False, c)
                        for k, _, _, c in map(layout_of, x.inputs)]
        self.is_list = [t.dtype == tf.variant for t in x.op.inputs]

    @property
    def counted(self) -> list[int]:
        return [layout[0] for layout in self.layouts]

    def set_kinds(self, kinds: Sequence[int]) -> None:
        """New layout kinds (a list newly counted, or newly per-row, enters aligned)."""
        self.layouts = [l if k == l[0] else (k, k == PER_ROW, k == PER_ROW, False)
                        for k, l in zip(kinds, self.layouts)]

    def stacked_flags(self, flags: list[bool]) -> list[bool]:
        """Fixed point: a variable is stacked if its initial value or the body makes it so
        (a list has per-row counts if its initial value or the body gives it some, and its
        rows are aligned at each step's start if they are at entry and after the body)."""
        while True:
            stacked, layouts = dry_run_kinds(self.x, self.body, self.x.inputs, flags,
                                             self.layouts)
            new = [f or o for f, o in zip(flags, stacked)]
            old = self.layouts
            self.set_kinds([max(a[0], b[0]) for a, b in zip(old, layouts)])
            self.layouts = [_merge_layout(l, b) for l, b in zip(self.layouts, layouts)]
            if new == flags and self.layouts == old:
                return flags
            flags = new

    def _set_flags(self, flags: list[bool]) -> list[bool]:
        self.carried = [not (p and not f) for p, f in zip(self.pass_through, flags)]
        return flags

    def _carry(self, values: Sequence) -> list:
        return [v for v, c in zip(values, self.carried) if c]

    # {{{ loop state: carried variables <-> flat tensors (a counted list is three)

    def _init(self, flags) -> list[tf.Tensor]:
        """Initial values of the carried variables (stacked ones tiled as needed)."""
        flat = []
        for i, (w, f, o) in enumerate(zip(self.x.inputs, flags, self.x.op.inputs)):
            if not self.carried[i]:
                continue
            if self.counted[i] == PER_ROW:
                if not isinstance(w, RowCountedList):   # uniform: every row at [0, length)
                    w = RowCountedList(*counted_parts(w, self.n, o), at_end=True)
                elif w.shared:
                    w = RowCountedList(*counted_parts(w, self.n, o))
                w = aligned_entry(w, handle_dtype(o), list_element_shape(o))
                flat.extend([w.t, w.starts, w.ends])
            elif self.counted[i]:
                flat.extend(counted_parts(w, self.n, o, self.counted[i])[:3])
            else:
                flat.append(_stack(w, self.n, o) if f else w.t)
        return flat

    def _invariants(self, flags) -> list[tf.TensorShape]:
        out = []
        for i, f in enumerate(flags):
            if self.carried[i]:
                out.extend([tf.TensorShape([]), tf.TensorShape([None]), tf.TensorShape([None])]
                           if self.counted[i] else [self.shape_invariant(i, f)])
        return out

    def _list_rows(self, i: int, rows: tf.Tensor | None) -> tf.Tensor | None:
        """Buffer rows of list ``i`` owned by the loop rows ``rows`` (None: all, in order)."""
        base = self.x.inputs[i].rows if isinstance(self.x.inputs[i], RowCountedList) else None
        if rows is None:
            return base
        return rows if base is None else tf.gather(base, rows)

    def _values(self, flat: Sequence[tf.Tensor], flags, rows=None) -> list[WrappedTensor]:
        """All loop variables from the flat carried state (``rows``: the active loop rows)."""
        it, out = iter(flat), []
        for i, f in enumerate(flags):
            if not self.carried[i]:
                out.append(self.x.inputs[i])
            elif self.counted[i]:
                buf, starts, ends = next(it), next(it), next(it)
                kind, aligned, at_end, constant = self.layouts[i]
                out.append(RowCountedList(buf, starts, ends, self._list_rows(i, rows),
                                          shared=kind == SHARED, aligned=aligned,
                                          at_end=at_end, constant=constant))
            else:
                out.append(WrappedTensor(next(it), f))
        return out

    def _flat(self, outs: Sequence[WrappedTensor], ins: Sequence[WrappedTensor], flags, n
              ) -> list[tf.Tensor]:
        """Flat carried state from the body's outputs ``outs`` (``ins``: its inputs)."""
        flat = []
        for i, (w, f) in enumerate(zip(outs, flags)):
            if not self.carried[i]:
                continue
            if not self.counted[i]:
                flat.append(_stack(w, n) if f else w.t)
                continue
            expected = ins[i].rows
            if isinstance(w, RowCountedList) and w.rows is expected:
                flat.extend(counted_parts(w, n, self.x.op.outputs[i], self.counted[i])[:3])
            elif not isinstance(w, RowCountedList) and expected is None:
                flat.extend(counted_parts(w, n, None, self.counted[i])[:3])
            else:
                raise self.x.error(
                    f"loop variable {i} (a TensorList) is replaced in the body by a list not "
                    "derived from it, in a while loop whose trip count depends on the loop "
                    "index; pfor cannot keep each iteration's own list")
        return flat

    # }}}

    def shape_invariant(self, i: int, stacked: bool) -> tf.TensorShape:
        shape = self.x.op.outputs[i].shape
        if not stacked or self.x.op.outputs[i].dtype == tf.variant:
            return shape
        return tf.TensorShape([None]).concatenate(shape)

    def convert(self):
        x = self.x
        flags = self._set_flags(self.stacked_flags([w.is_stacked for w in x.inputs]))
        cond_stacked = dry_run_kinds(x, self.cond, x.inputs, flags, self.layouts)[0][0]
        if not cond_stacked:
            return self.invariant_cond(flags)
        lists = [(f or not p) and v for f, p, v in zip(flags, self.pass_through, self.is_list)]
        if any(lists):
            if in_xla_context(x):
                return self.per_iteration()  # per-row list counts need data-dependent shapes
            # Iterations finish at different steps: their lists get per-row counts (shared
            # elements while only loop-invariant values are pushed).
            self.set_kinds([c or ((PER_ROW if f else SHARED) if l else 0)
                            for c, l, f in zip(self.counted, lists, flags)])
            flags = self._set_flags(self.stacked_flags([f or l for f, l in zip(flags, lists)]))
            for i, layout in enumerate(self.layouts):
                if layout[0] == SHARED and self.pushes_one_value(i, flags):
                    self.layouts[i] = (SHARED, False, False, True)
            return self.partitioned(flags)
        if in_xla_context(x):
            return self.masked(flags)
        return self.partitioned(flags)

    def pushes_one_value(self, i: int, flags) -> bool:
        """Whether list variable ``i`` starts as a fresh empty list and every step pushes the
        same value onto it: one ``TensorListPushBack`` of a value computed from invariant
        pass-through variables and constants only, reading variables that nothing in the
        body writes (the weight reads a while-loop gradient accumulates)."""
        if self.x.op.inputs[i].op.type != "EmptyTensorList" or self.x.inputs[i].is_stacked:
            return False
        push = self.body.outputs[i].op
        while push.type == "Identity":
            push = push.inputs[0].op
        if push.type != "TensorListPushBack" or push.inputs[0] is not self.body.inputs[i]:
            return False
        writes = ("Assign", "ResourceApply", "ResourceSparseApply", "ResourceScatter")
        if any(op.type.startswith(writes) for op in self.body.get_operations()):
            return False
        invariant = {self.body.inputs[j].ref() for j in range(self.k)
                     if self.pass_through[j] and not flags[j]}
        todo, seen = [push.inputs[1].op], set()
        while todo:
            op = todo.pop()
            if op in seen:
                continue
            seen.add(op)
            if op.type == "Placeholder":
                if not all(o.ref() in invariant for o in op.outputs):
                    return False
            elif op.type != "ReadVariableOp" and op._is_stateful:  # pylint: disable=protected-access
                return False
            todo.extend(t.op for t in op.inputs)
            todo.extend(op.control_inputs)
        return True

    def per_iteration(self):
        """Stacked TensorLists in a loop whose trip count varies, under XLA: the While op
        runs once per iteration; invariant pass-through inputs stay invariant."""
        x = self.x
        same = {i: x.inputs[i] for i in range(self.k)
                if self.pass_through[i] and not x.inputs[i].is_stacked}
        return run_per_iteration(x, same, "a while loop whose trip count depends on the loop "
                                          "index carries TensorLists, which need "
                                          "data-dependent shapes that XLA cannot compile")

    def _cond_value(self, values, n) -> WrappedTensor:
        return _convert(self.x, self.cond, values, n)[0]

    def _run_body(self, values, flags, n) -> list[tf.Tensor]:
        return self._flat(_convert(self.x, self.body, values, n), values, flags, n)

    def invariant_cond(self, flags):
        """One loop: every iteration runs the same number of steps."""
        def cond(*flat):
            return tf.reshape(self._cond_value(self._values(flat, flags), self.n).t, [])

        def body(*flat):
            return self._run_body(self._values(flat, flags), flags, self.n)

        outs = tf.while_loop(cond, body, self._init(flags),
                             shape_invariants=self._invariants(flags),
                             parallel_iterations=self.parallel_iterations)
        return self._values(outs if isinstance(outs, (list, tuple)) else [outs], flags)

    def masked(self, flags):
        """XLA form: run the body on every iteration, keep the values of the active ones
        (no carried lists here)."""
        n = self.n
        flags = self._set_flags([f or not p for f, p in zip(flags, self.pass_through)])
        carried_flags = self._carry(flags)

        def active_of(flat):
            return tf.reshape(_stack(self._cond_value(self._values(flat, flags), n), n), [-1])

        def body(active, *flat):
            new = self._run_body(self._values(flat, flags), flags, n)
            merged = [_select(active, WrappedTensor(a, f), WrappedTensor(b, f), n).t if f else a
                      for a, b, f in zip(new, flat, carried_flags)]
            return [active & active_of(merged)] + merged

        with _masked_form(self.x):
            init = self._init(flags)
            outs = tf.while_loop(lambda active, *_: tf.reduce_any(active), body,
                                 [active_of(init)] + init,
                                 shape_invariants=[tf.TensorShape([None])]
                                 + self._invariants(flags),
                                 parallel_iterations=self.parallel_iterations)
        return self._values(outs[1:], flags)

    def partitioned(self, flags):
        """Paper §3.7: track the active iterations; finished ones go to TensorArrays.

        Each step evaluates the condition on the active rows; only when some row finished
        (a ``tf.cond``, so steps where none finishes pay nothing) are the finished rows written
        to per-iteration TensorArrays and the loop state compacted to the remaining rows.
        Counted lists are not compacted: they keep every row, the body touches the active
        ones (``RowCountedList.rows``), and their final state is the loop's.
        """
        x, n = self.x, self.n
        carried_idx = self._carry(range(self.k))
        tensor_idx = [i for i in carried_idx if not self.counted[i]]
        list_idx = [i for i in carried_idx if self.counted[i]]
        kt, kl = len(tensor_idx), 3 * len(list_idx)
        # Carried tensors whose final value is per iteration (not a pass-through).
        tracked = [j for j, i in enumerate(tensor_idx) if not self.pass_through[i]]
        tas = [tf.TensorArray(x.op.outputs[tensor_idx[j]].dtype, size=n, infer_shape=False,
                              element_shape=(x.op.outputs[tensor_idx[j]].shape
                                             if x.op.outputs[tensor_idx[j]].shape
                                             .is_fully_defined() else None))
               for j in tracked]
        tflags = [flags[i] for i in tensor_idx]
        invariants = self._invariants(flags)

        def split(flat):  # the flat carried state (in variable order) -> tensors, list parts
            it, tensors, parts = iter(flat), [], []
            for i in carried_idx:
                if self.counted[i]:
                    parts.extend([next(it), next(it), next(it)])
                else:
                    tensors.append(next(it))
            return tensors, parts

        def join(tensors, parts):
            ti, pi, flat = iter(tensors), iter(parts), []
            for i in carried_idx:
                flat.extend([next(pi), next(pi), next(pi)] if self.counted[i] else [next(ti)])
            return flat

        def compact(c, rows, vars_, tas_):
            # (not a dynamic_partition of range(m): see helpers.positions_of)
            done_pos, keep_pos = where_positions(tf.logical_not(c)), where_positions(c)
            done_rows = tf.gather(rows, done_pos)
            new_tas = []
            for j, ta in zip(tracked, tas_):
                done_vals = (tf.gather(vars_[j], done_pos) if tflags[j]
                             else tile_to_stacked(vars_[j], tf.size(done_pos)))
                new_tas.append(ta.scatter(done_rows, done_vals))
            kept = [tf.gather(v, keep_pos) if f else v for v, f in zip(vars_, tflags)]
            return [tf.gather(rows, keep_pos)] + kept + new_tas

        def finish(rows, vars_, parts, tas_):
            """Evaluate the condition on the active rows; write the finished ones out."""
            m = tf.size(rows)
            c = self._cond_value(self._values(join(vars_, parts), flags, rows), m)
            c = tf.reshape(_stack(c, m), [-1])
            out = tf.cond(tf.reduce_all(c), lambda: [rows] + vars_ + tas_,
                          lambda: compact(c, rows, vars_, tas_))
            rows, vars_, tas_ = out[0], list(out[1:1 + kt]), list(out[1 + kt:])
            rows.set_shape([None])
            for v, shape in zip(vars_, t_inv):
                v.set_shape(shape)
            return [rows] + vars_ + parts + tas_

        def body(rows, *state):
            # The loop only runs while some row is active: no guard around the body.
            flat = join(list(state[:kt]), list(state[kt:kt + kl]))
            new = self._run_body(self._values(flat, flags, rows), flags, tf.size(rows))
            new_vars, new_parts = split(new)
            return finish(rows, new_vars, new_parts, list(state[kt + kl:]))

        init_vars, init_parts = split(self._init(flags))
        t_inv, p_inv = split(invariants)
        res = tf.while_loop(lambda rows, *_: tf.size(rows) > 0, body,
                            finish(tf.range(n), init_vars, init_parts, tas),
                            shape_invariants=([tf.TensorShape([None])] + t_inv + p_inv
                                              + [tf.TensorShape(None)] * len(tracked)),
                            parallel_iterations=self.parallel_iterations)
        res = [None] + list(res)   # (the former not_done slot) keeps the offsets below
        final = dict(zip(tracked, res[2 + kt + kl:]))
        lists = iter(res[2 + kt:2 + kt + kl])
        outs = []
        for i in range(self.k):
            if self.carried[i] and self.counted[i]:
                buf, starts, ends = next(lists), next(lists), next(lists)
                outs.append(RowCountedList(buf, starts, ends, self._list_rows(i, None),
                                           shared=self.counted[i] == SHARED,
                                           constant=self.layouts[i][3]))
                continue
            j = tensor_idx.index(i) if i in tensor_idx else None
            if j is not None and j in final:
                stacked_out = final[j].stack()
                stacked_out.set_shape(self.shape_invariant(i, True))
                outs.append(WrappedTensor(stacked_out, True))
            else:
                outs.append(x.inputs[i])
        return outs


@register_converter("While", "StatelessWhile")
def _convert_while(x: ConversionInput):
    return restore_shapes(x, While(x).convert())

# }}}
