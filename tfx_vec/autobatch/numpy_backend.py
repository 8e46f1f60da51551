"""The program-counter machine over NumPy: a readable reference for the stack-machine IR.

Runs the lowered, allocated program step by step in Python with explicit NumPy stacks
(``[max_stack_depth, batch, ...]`` per stack variable, per-member stack pointers, a program
counter stack), executing primitives on the values converted to tensors (results come back with
``np.asarray``).  It checks the lowering and the stack optimizations independently of
``tf.while_loop``/``tf.switch_case``, and raises the same errors as the other runtimes.

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec import autobatch as ab
    >>> @ab.function
    ... def fib(n):
    ...     if n <= 1:
    ...         return tf.ones_like(n)
    ...     return fib(n - 2) + fib(n - 1)
    >>> fib(tf.constant([3, 7, 4, 5]), runtime="numpy").tolist()
    [3, 21, 5, 8]
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from . import ir
from .errors import AutobatchError, MaxStepsExceededError, StackOverflowError, TypeInferenceError
from .types import fit, qualified_types, run_primitive

__all__ = ["run"]


def _np(x: Any) -> Any:
    return tf.nest.map_structure(np.asarray, x)


def _select(mask: np.ndarray, new: Any, old: Any) -> Any:
    return tf.nest.map_structure(
        lambda n, o: np.where(mask.reshape((-1,) + (1,) * (np.ndim(n) - 1)), n, o), new, old)


def _zeros(spec: Any, leading: tuple = ()) -> Any:
    return tf.nest.map_structure(
        lambda s: np.zeros(leading + tuple(s.shape.as_list()), s.dtype.as_numpy_dtype), spec)


@tf.autograph.experimental.do_not_convert
def run(fn: Any, args: Sequence[Any], weak: Sequence[tuple] | None = None, *,
        max_stack_depth: int = 32, max_steps: int = 100_000, shapes: str = "exact") -> Any:
    """Run the ``ab.function`` ``fn`` on batched ``args`` (``weak``: which leaves were Python
    literals); returns NumPy arrays."""
    if not tf.executing_eagerly():
        raise AutobatchError("the numpy runtime runs eagerly (it steps the machine in Python "
                             "over NumPy arrays); use runtime='program_counter' in a graph")
    types = qualified_types(fn.types_for(tuple(args), weak, shapes))
    lowered = fn.lowered(types)
    batch = int(tf.nest.flatten(args)[0].shape[0])
    depth, halt = max_stack_depth, len(lowered.blocks)
    alloc = lowered.allocation
    vals: dict[str, Any] = {}
    for v, a in alloc.items():
        if a != ir.TEMPORARY:
            if v not in types:
                raise TypeInferenceError(f"variable {v!r} has no type: it is read before any "
                                         "assignment on every path")
            vals[v] = _zeros(types[v])
    stacks = {v: _zeros(types[v], (depth,)) for v, a in alloc.items() if a == ir.STACK}
    sps = {v: np.zeros(batch, np.int64) for v in stacks}
    vals.update((p, _np(tf.nest.map_structure(lambda x, s: fit(x, s, batch), a, types[p])))
                for p, a in zip(lowered.params, args))
    pc = np.full(batch, lowered.entries[lowered.main], np.int64)
    pc_stack = np.full((depth + 1, batch), halt, np.int64)
    pc_sp = np.ones(batch, np.int64)
    members = np.arange(batch)
    for _ in range(max_steps):
        if pc.min() >= halt:
            return vals[lowered.result]
        i = int(pc.min())
        active = pc == i
        block = lowered.blocks[i]
        temps: dict[str, Any] = {}
        for op in block.ops:
            if isinstance(op, ir.Primitive):
                # As tensors: a primitive's `x += 1` must not update a stored array in place.
                ins = [tf.nest.map_structure(tf.convert_to_tensor,
                                             temps[v] if v in temps else vals[v])
                       for v in op.inputs]
                outs = _np(run_primitive(op, ins, batch, [types[v] for v in op.outputs]))
                when = ir.when_mask(op, lambda c: np.asarray(
                    temps[c] if c in temps else vals[c]).astype(bool), np.logical_and)
                for v, new in zip(op.outputs, outs):
                    if alloc[v] == ir.TEMPORARY:
                        temps[v] = new if when is None or v not in temps else _select(
                            when, new, temps[v])
                    else:
                        vals[v] = _select(active if when is None else active & when, new,
                                          vals[v])
            elif isinstance(op, ir.Push):
                v = op.var
                if np.any(active & (sps[v] >= depth)):
                    _overflow(active & (sps[v] >= depth), depth, lowered.main)
                for leaf, top in zip(tf.nest.flatten(stacks[v]), tf.nest.flatten(vals[v])):
                    leaf[sps[v][active], members[active]] = top[active]
                sps[v][active] += 1
            elif isinstance(op, (ir.Pop, ir.Peek, ir.Update)):
                v = op.var
                if isinstance(op, ir.Pop):
                    sps[v][active] -= 1
                slot = np.clip(sps[v] if isinstance(op, ir.Pop) else sps[v] - 1, 0, depth - 1)
                if isinstance(op, ir.Update):
                    for leaf, top in zip(tf.nest.flatten(stacks[v]), tf.nest.flatten(vals[v])):
                        leaf[slot[active], members[active]] = top[active]
                else:
                    saved = tf.nest.map_structure(lambda s: s[slot, members], stacks[v])
                    vals[v] = _select(active, saved, vals[v])
        t = block.terminator
        if isinstance(t, ir.Jump):
            pc[active] = t.target
        elif isinstance(t, ir.Branch):
            cond = np.asarray(temps[t.cond] if t.cond in temps else vals[t.cond]).astype(bool)
            pc[active & cond] = t.true
            pc[active & ~cond] = t.false
        elif isinstance(t, ir.PushJump):
            if t.push:
                if np.any(active & (pc_sp > depth)):
                    _overflow(active & (pc_sp > depth), depth, lowered.main)
                pc_stack[pc_sp[active], members[active]] = t.return_to
                pc_sp[active] += 1
            pc[active] = t.target
        elif t.target is not None:  # a static return address
            pc[active] = t.target
        else:
            pc_sp[active] -= 1
            pc[active] = pc_stack[pc_sp[active], members[active]]
    if pc.min() >= halt:
        return vals[lowered.result]
    raise MaxStepsExceededError(
        f"{lowered.main}: batch members {np.nonzero(pc < halt)[0].tolist()} had not finished "
        f"after max_steps={max_steps} steps; raise max_steps if the program does terminate")


def _overflow(members: np.ndarray, depth: int, name: str) -> None:
    raise StackOverflowError(f"{name}: batch members {np.nonzero(members)[0].tolist()} "
                             f"recursed deeper than max_stack_depth={depth}; raise "
                             "max_stack_depth")
