"""Runtime 2: program-counter autobatching (the paper's Algorithm 2 and Figure 5).

One ``tf.while_loop``; its body picks a block (the earliest one some member waits at, or the
one most members wait at) and dispatches with ``tf.switch_case`` to that block, compiled with
its index static.  The state is: the program counter (cached top, ``[D+1, B]`` stack and
per-member stack pointer), one ``[B, ...]`` value per register, and for every stack variable a
cached top, a ``[D, B, ...]`` stack and per-member stack pointers.  Temporaries live only inside
a block.  Everything has a static shape, so the runtime runs eagerly (through a cached
``tf.function``), inside ``tf.function`` and under ``jit_compile=True`` as one XLA program.

A member that would recurse deeper than ``max_stack_depth`` stops and is flagged; so is every
member still running after ``max_steps`` loop steps.  Called eagerly, flags raise
:class:`StackOverflowError` / :class:`MaxStepsExceededError`; inside a graph a
``tf.debugging.Assert`` fails at run time.  Under an outer ``jit_compile=True`` (where XLA drops
asserts) use :func:`run` and check the returned status yourself.

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec import autobatch as ab
    >>> @ab.function
    ... def fib(n):
    ...     if n <= 1:
    ...         return tf.ones_like(n)
    ...     return fib(n - 2) + fib(n - 1)
    >>> fib(tf.constant([3, 7, 4, 5]), jit_compile=True).numpy().tolist()
    [3, 21, 5, 8]
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from . import ir
from .errors import MaxStepsExceededError, StackOverflowError, TypeInferenceError
from .types import infer_types, qualified_types, run_primitive, select, spec_of, zeros_of

__all__ = ["run", "call", "Status", "SCHEDULERS"]


class Status(NamedTuple):
    """Per-member flags after a run, and the number of loop steps taken."""
    overflow: tf.Tensor     # [B] bool: recursed deeper than max_stack_depth
    unfinished: tf.Tensor   # [B] bool: still running when max_steps ran out
    steps: tf.Tensor        # scalar int32


def _earliest(pc: tf.Tensor, halt: int) -> tf.Tensor:
    return tf.reduce_min(pc)


def _most_active(pc: tf.Tensor, halt: int) -> tf.Tensor:
    counts = tf.reduce_sum(tf.one_hot(pc, halt, dtype=tf.int32), axis=0)
    best = tf.cast(tf.argmax(counts), tf.int32)
    return tf.where(tf.reduce_max(counts) > 0, best, halt)


SCHEDULERS: dict[str, Callable[[tf.Tensor, int], tf.Tensor]] = {
    "earliest": _earliest, "most_active": _most_active}


# {{{ stack helpers: one slot per member at its own stack pointer

def _slots(sp: tf.Tensor, depth: int) -> tf.Tensor:
    batch = tf.shape(sp)[0]
    return tf.stack([tf.clip_by_value(sp, 0, depth - 1), tf.range(batch)], axis=1)


def _read_slot(stack: Any, sp: tf.Tensor, depth: int) -> Any:
    idx = _slots(sp, depth)
    return tf.nest.map_structure(lambda s: tf.gather_nd(s, idx), stack)


def _write_slot(stack: Any, sp: tf.Tensor, value: Any, mask: tf.Tensor, depth: int) -> Any:
    idx = _slots(sp, depth)

    def leaf(s, v):
        old = tf.gather_nd(s, idx)
        return tf.tensor_scatter_nd_update(s, idx, select(mask, v, old))
    return tf.nest.map_structure(leaf, stack, value)

# }}}


class _Machine:
    """Builds the graph of the runtime for one lowered program and one set of types."""

    def __init__(self, program: ir.Program, types: Mapping[str, Any], depth: int):
        self.p, self.types, self.depth = program, types, depth
        self.halt = len(program.blocks)
        self.registers = [v for v, a in program.allocation.items() if a == ir.REGISTER]
        self.stacks = [v for v, a in program.allocation.items() if a == ir.STACK]
        for v in self.registers + self.stacks:
            if v not in types:
                raise TypeInferenceError(f"variable {v!r} has no type: it is read before any "
                                         "assignment on every path")

    def initial_state(self, args: Sequence[Any], batch: int) -> dict:
        d = self.depth
        state = {
            "pc": tf.zeros([batch], tf.int32),
            "pc_stack": tf.tensor_scatter_nd_update(
                tf.zeros([d + 1, batch], tf.int32), [[0]], tf.fill([1, batch], self.halt)),
            "pc_sp": tf.ones([batch], tf.int32),
            "overflow": tf.zeros([batch], tf.bool),
            "vals": {v: zeros_of(self.types[v]) for v in self.registers + self.stacks},
            "stack": {v: zeros_of(self.types[v], [d]) for v in self.stacks},
            "sp": {v: tf.zeros([batch], tf.int32) for v in self.stacks},
        }
        for v, a in zip(self.p.params, args):
            state["vals"][v] = tf.nest.map_structure(
                lambda x, s: tf.cast(x, s.dtype), a, self.types[v])
        return state

    def block(self, i: int, state: dict) -> dict:
        b = self.p.blocks[i]
        batch = state["pc"].shape[0]
        active = tf.equal(state["pc"], i)
        vals, stack, sp = dict(state["vals"]), dict(state["stack"]), dict(state["sp"])
        overflow = state["overflow"]
        temps: dict[str, Any] = {}

        def read(v):
            return temps[v] if v in temps else vals[v]

        for op in b.ops:
            if isinstance(op, ir.Primitive):
                outs = run_primitive(op, [read(v) for v in op.inputs], batch)
                for v, new in zip(op.outputs, outs):
                    if self.p.allocation[v] == ir.TEMPORARY:
                        temps[v] = new
                    else:
                        vals[v] = select(active, tf.nest.map_structure(
                            lambda n, s: tf.cast(n, s.dtype), new, self.types[v]),
                            vals[v], f"{op.loc}: {v}")
            elif isinstance(op, ir.Push):
                v = op.var
                fits = sp[v] < self.depth
                overflow = overflow | (active & ~fits)
                stack[v] = _write_slot(stack[v], sp[v], vals[v], active & fits, self.depth)
                sp[v] = sp[v] + tf.cast(active & fits, tf.int32)
            elif isinstance(op, (ir.Pop, ir.Peek)):
                v = op.var
                if isinstance(op, ir.Pop):
                    sp[v] = sp[v] - tf.cast(active, tf.int32)
                    top = sp[v]
                else:
                    top = sp[v] - 1
                vals[v] = select(active, _read_slot(stack[v], top, self.depth), vals[v])
            elif isinstance(op, ir.Update):
                v = op.var
                stack[v] = _write_slot(stack[v], sp[v] - 1, vals[v], active, self.depth)
        pc, pc_stack, pc_sp = state["pc"], state["pc_stack"], state["pc_sp"]
        t = b.terminator
        if isinstance(t, ir.Jump):
            pc = tf.where(active, t.target, pc)
        elif isinstance(t, ir.Branch):
            cond = tf.cast(read(t.cond), tf.bool)
            pc = tf.where(active, tf.where(cond, t.true, t.false), pc)
        elif isinstance(t, ir.PushJump):
            fits = pc_sp < self.depth + 1
            overflow = overflow | (active & ~fits)
            ok = active & fits
            pc_stack = _write_slot(pc_stack, pc_sp, tf.fill([batch], t.return_to), ok,
                                   self.depth + 1)
            pc_sp = pc_sp + tf.cast(ok, tf.int32)
            pc = tf.where(ok, t.target, pc)
        else:  # Return
            pc_sp = pc_sp - tf.cast(active, tf.int32)
            pc = tf.where(active, _read_slot(pc_stack, pc_sp, self.depth + 1), pc)
        pc = tf.where(overflow, self.halt, pc)
        return {"pc": pc, "pc_stack": pc_stack, "pc_sp": pc_sp, "overflow": overflow,
                "vals": vals, "stack": stack, "sp": sp}

    def run(self, args: Sequence[Any], max_steps: int, scheduler: str) -> tuple[Any, Status]:
        batch = int(tf.nest.flatten(args)[0].shape[0])
        choose = SCHEDULERS[scheduler]
        state = self.initial_state(args, batch)

        def body(steps, state):
            nxt = choose(state["pc"], self.halt)
            new = tf.switch_case(tf.minimum(nxt, self.halt - 1),
                                 [lambda i=i: self.block(i, state) for i in range(self.halt)])
            return steps + 1, new

        def cond(steps, state):
            return tf.logical_and(steps < max_steps, tf.reduce_min(state["pc"]) < self.halt)

        steps, state = tf.while_loop(cond, body, (tf.constant(0), state),
                                     maximum_iterations=max_steps)
        result = state["vals"][self.p.result]
        status = Status(state["overflow"], tf.not_equal(state["pc"], self.halt) &
                        ~state["overflow"], steps)
        return result, status


def run(program: ir.Program, types: Mapping[str, Any], args: Sequence[Any], *,
        max_stack_depth: int = 32, max_steps: int = 100_000,
        scheduler: str = "earliest") -> tuple[Any, Status]:
    """Build (in the current graph or eagerly) the runtime loop; return (result, status).

    Args:
      program: an allocated stack-machine program (:func:`tfx_vec.autobatch.passes.pipeline`).
      types: qualified variable -> spec structure (:func:`types.qualified_types`).
      args: one batched structure per parameter of main.
    """
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; choose one of {sorted(SCHEDULERS)}")
    return _Machine(program, types, max_stack_depth).run(args, max_steps, scheduler)


def _check(status: Status, max_stack_depth: int, max_steps: int, name: str) -> None:
    over = np.nonzero(status.overflow.numpy())[0]
    if over.size:
        raise StackOverflowError(
            f"{name}: batch members {over.tolist()} recursed deeper than max_stack_depth="
            f"{max_stack_depth}; raise max_stack_depth")
    late = np.nonzero(status.unfinished.numpy())[0]
    if late.size:
        raise MaxStepsExceededError(
            f"{name}: batch members {late.tolist()} had not finished after max_steps="
            f"{max_steps} steps; raise max_steps if the program does terminate")


def _graph_checks(result: Any, status: Status, opts: Mapping[str, Any], name: str) -> Any:
    checks = [
        tf.debugging.Assert(~tf.reduce_any(status.overflow),
                            [f"{name}: a batch member recursed deeper than max_stack_depth="
                             f"{opts['max_stack_depth']}; members:", tf.where(status.overflow)]),
        tf.debugging.Assert(~tf.reduce_any(status.unfinished),
                            [f"{name}: a batch member had not finished after max_steps="
                             f"{opts['max_steps']}; members:", tf.where(status.unfinished)])]
    with tf.control_dependencies(checks):
        return tf.nest.map_structure(tf.identity, result)


def call(fn: Any, args: Sequence[Any], opts: Mapping[str, Any]) -> Any:
    """``fn(*args)`` with the program-counter runtime (what ``ab.function`` calls)."""
    args = tuple(tf.nest.map_structure(tf.convert_to_tensor, a) for a in args)
    program = fn.lowered()
    specs = tuple(spec_of(a) for a in args)
    key = (repr(specs), opts["max_stack_depth"], opts["max_steps"], opts["scheduler"])
    if key not in fn._compiled:
        fn._compiled[key] = qualified_types(infer_types(fn.program(), specs))
    types = fn._compiled[key]

    def go(*a):
        return run(program, types, a, max_stack_depth=opts["max_stack_depth"],
                   max_steps=opts["max_steps"], scheduler=opts["scheduler"])

    if not tf.executing_eagerly():
        result, status = go(*args)
        return _graph_checks(result, status, opts, fn.__name__)
    jkey = key + (bool(opts["jit_compile"]),)
    if jkey not in fn._compiled:
        fn._compiled[jkey] = tf.function(go, jit_compile=bool(opts["jit_compile"]),
                                         autograph=False)
    result, status = fn._compiled[jkey](*args)
    _check(status, opts["max_stack_depth"], opts["max_steps"], fn.__name__)
    return result
