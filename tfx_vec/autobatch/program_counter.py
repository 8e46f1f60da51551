"""Runtime 2: program-counter autobatching (the paper's Algorithm 2 and Figure 5).

One ``tf.while_loop``; its body picks a block (the earliest one some member waits at, or the
one most members wait at) and runs that block, compiled with its index static.  The state is:
the program counter (cached top, ``[D + 2, B]`` stack and per-member stack pointer), one
``[B, ...]`` value per register, and for every stack variable a cached top, a
``[D + 1, B, ...]`` stack (the last slot is a junk slot for members that do not write) and
per-member stack pointers (one for each group of variables pushed and popped together).
Temporaries live only inside a block.  Dispatch: in a TF graph a
``tf.switch_case`` (the stacks written after it, behind a ``tf.cond``); under XLA, where a
conditional copies every one of its outputs each step, each block sits in a loop of 0 or 1
trips that carries only what it changes and updates its stacks in place (scalar-only programs
keep the ``switch_case``).  Everything has a static shape, so the runtime runs eagerly (through
one traced ``ConcreteFunction`` per input signature), inside ``tf.function`` and under
``jit_compile=True`` as one XLA program.

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

import contextlib
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from . import ir
from .errors import MaxStepsExceededError, StackOverflowError, TypeInferenceError
from .gathered import running_members
from .types import (fit, leading, qualified_types, run_primitive, select, spec_of, stateless,
                    zeros_of)

__all__ = ["run", "call", "call_resumable", "idle_machine", "Status", "SCHEDULERS"]


class Status(NamedTuple):
    """Per-member flags after a run, the number of loop steps taken, and utilization counters:
    how many times each block ran and how many members were active in it, summed."""
    overflow: tf.Tensor       # [B] bool: recursed deeper than max_stack_depth
    unfinished: tf.Tensor     # [B] bool: still running when max_steps ran out
    steps: tf.Tensor          # scalar int32
    block_runs: tf.Tensor     # [num_blocks] int32
    block_members: tf.Tensor  # [num_blocks] int32


def _earliest(pc: tf.Tensor, halt: int) -> tf.Tensor:
    return tf.reduce_min(pc)


def _most_active(pc: tf.Tensor, halt: int) -> tf.Tensor:
    # members per block as a segment sum (halted members in a segment of their own): under
    # XLA one scatter, where a one-hot matrix summed over the batch was three kernels and a
    # [batch, blocks] buffer each loop step (NUTS on cheap targets: 4-5% of the step)
    counts = tf.math.unsorted_segment_sum(tf.ones_like(pc), pc, halt + 1)[:halt]
    best = tf.cast(tf.argmax(counts), tf.int32)
    return tf.where(tf.reduce_max(counts) > 0, best, halt)


# Block selection.  "earliest"/"most_active" run one block per loop step through
# tf.switch_case; "sweep" runs every block once per step in program order, each masked to the
# members waiting at it (no dispatch, members flow through forward jumps within one step: best
# for cheap blocks); "sweep_guarded" skips blocks no member waits at (tf.cond per block that
# writes stacks or touches non-scalar values: see _Machine.worth_guarding).
SCHEDULERS: dict[str, Callable[[tf.Tensor, int], tf.Tensor] | None] = {
    "earliest": _earliest, "most_active": _most_active, "sweep": None, "sweep_guarded": None}


# {{{ stack helpers: stacks are depth-major, [depth, batch, ...]; one slot per member at its
# own pointer.  Reads and writes index the stack flattened to [depth * batch, ...] with one
# scalar index per member (slot * batch + member): on XLA:CPU a 1-D scatter/gather with
# contiguous member-minor rows is about 1.6x faster than a 2-D (member, slot) one into
# [batch, depth], and the stack writes are a large part of a loop step.

def _batch(t: tf.Tensor) -> Any:
    """The batch size of a batched tensor: static if known, else a scalar tensor."""
    return leading(t.shape) if leading(t.shape) is not None else tf.shape(t)[0]


# Static shapes, where known, stand in for tf.shape arithmetic: the same values, a third of the
# operations to trace (a loop step's stack reads and writes are most of its graph).

class _Memo:
    """Values computed once per key of tensors (compared by identity) within one block: the
    stack variables of a group share one stack pointer (see ``_Machine.sp_groups``), so their
    pointer arithmetic and flat indices are the same computation, built once; so is the
    ``range(batch)`` of the flat indices."""

    def __init__(self):
        self.done: dict[tuple, Any] = {}

    def __call__(self, tag: str, inputs: tuple, fn: Callable[[], Any]) -> Any:
        key = (tag, *(x if isinstance(x, int) else id(x) for x in inputs))
        if key not in self.done:
            self.done[key] = (inputs, fn())  # the inputs kept alive: their ids stay unique
        return self.done[key][1]


def _flat_index(slot: tf.Tensor, memo: _Memo) -> tf.Tensor:
    batch = _batch(slot)
    return slot * batch + memo("members", (batch,), lambda: tf.range(batch))


def _shape_of(s: tf.Tensor) -> Any:
    return s.shape.as_list() if s.shape.is_fully_defined() else tf.shape(s)


def _flat(s: tf.Tensor) -> tf.Tensor:
    if s.shape[2:].is_fully_defined():
        return tf.reshape(s, [-1] + s.shape[2:].as_list())
    return tf.reshape(s, tf.concat([[-1], tf.shape(s)[2:]], 0))


def _read_slot(stack: Any, sp: tf.Tensor, depth: int, memo: _Memo | None = None) -> Any:
    memo = memo or _Memo()
    idx = memo("read", (sp, depth), lambda: _flat_index(tf.clip_by_value(sp, 0, depth - 1), memo))
    return tf.nest.map_structure(lambda s: tf.gather(_flat(s), idx), stack)


def _apply_write(stack: Any, write: tuple, memo: _Memo | None = None) -> Any:
    """One deferred write: ``stack[slot[b], b] = value[b]`` where ``mask[b]``.

    Stacks carry one junk slot (the last): members that do not write scatter there, so the
    write is one unconditional O(batch) scatter.
    """
    slot, mask, value = write
    memo = memo or _Memo()

    def leaf(s, v):
        junk = s.shape[0] - 1
        idx = memo("write", (slot, mask, junk),
                   lambda: _flat_index(tf.where(mask, slot, junk), memo))
        new = tf.tensor_scatter_nd_update(_flat(s), tf.expand_dims(idx, 1), v)
        return tf.reshape(new, _shape_of(s))
    return tf.nest.map_structure(leaf, stack, value)

# }}}


def _merge(small: dict, changed: dict) -> dict:
    """``small`` with the entries of ``changed`` (a sub-dict, see ``changes_of``) replaced."""
    return {**small, **{k: v for k, v in changed.items() if k not in ("vals", "sp")},
            "vals": {**small["vals"], **changed["vals"]}, "sp": {**small["sp"], **changed["sp"]}}


_NO_WRITES = {"pc_stack": None, "stack": {}}
def _big_part(big: dict, keys: tuple) -> dict:
    """The stacks a block writes (``keys`` from ``writes_of``)."""
    pc_key, stacks = keys
    part = {"stack": {v: big["stack"][v] for v in stacks}}
    if pc_key:
        part["pc_stack"] = big["pc_stack"]
    return part


def _merge_big(big: dict, part: dict) -> dict:
    """``big`` with the stacks of ``part`` (see ``_big_part``) replaced."""
    return {"pc_stack": part.get("pc_stack", big["pc_stack"]),
            "stack": {**big["stack"], **part["stack"]}}


def _none_free(branch: Callable[[], Any], structure: list) -> Callable[[], list]:
    """``branch`` returning only its tensors (the structure, Nones included, kept aside)."""
    def run():
        out = branch()
        structure[:] = [out]
        return [x for x in tf.nest.flatten(out) if x is not None]
    return run


def _repacked(structure: Any, tensors: Sequence[tf.Tensor]) -> Any:
    it = iter(tensors)
    return tf.nest.pack_sequence_as(structure, [None if x is None else next(it)
                                                for x in tf.nest.flatten(structure)])


def _cond(pred: tf.Tensor, true_fn: Callable[[], Any], false_fn: Callable[[], Any]) -> Any:
    """``tf.cond`` whose branches may return ``None`` leaves (TF1's control flow cannot)."""
    structure: list = []
    out = tf.cond(pred, _none_free(true_fn, structure), _none_free(false_fn, structure))
    return _repacked(structure[0], out)


def _switch_case(index: tf.Tensor, branches: Sequence[Callable[[], Any]]) -> Any:
    """``tf.switch_case`` whose branches may return ``None`` leaves (see :func:`_cond`)."""
    structure: list = []
    out = tf.switch_case(index, [_none_free(b, structure) for b in branches])
    return _repacked(structure[0], out)


def _pushes_pc(t: Any) -> bool:
    """Does terminator ``t`` write the program-counter stack?"""
    return isinstance(t, ir.PushJump) and t.push


def _in_xla_context() -> bool:
    """Is the graph being built compiled by XLA (``jit_compile=True``, here or outside)?"""
    if tf.executing_eagerly():
        return False
    from tensorflow.python.ops import control_flow_util  # no public equivalent
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


class _Machine:
    """Builds the graph of the runtime for one lowered program and one set of types.

    Blocks only *read* stacks; each returns at most one deferred write (slot, mask, value) per
    stack it writes (lowering guarantees at most one push/update per variable per block, after
    its reads), applied after the block: outside a ``switch_case`` / ``tf.cond`` (never
    outputs of a conditional, which XLA would copy every step), or inside an XLA loop guard
    (loop-carried, so updated in place).
    """

    def __init__(self, program: ir.Program, types: Mapping[str, Any], depth: int):
        self.p, self.types, self.depth = program, types, depth
        self.halt = len(program.blocks)
        # The program's entry block, when nothing jumps, calls or returns to it, runs once, for
        # every member, before the loop (a sweep would otherwise run it masked every step).
        entry = program.entries[program.main]
        reached = {j for b in program.blocks for j in ir.transfers(b.terminator)}
        self.prologue = None if entry in reached else entry
        self.registers = [v for v, a in program.allocation.items() if a == ir.REGISTER]
        self.stacks = [v for v, a in program.allocation.items() if a == ir.STACK]
        for v in self.registers + self.stacks:
            if v not in types:
                raise TypeInferenceError(f"variable {v!r} has no type: it is read before any "
                                         "assignment on every path")
        self.sp_of = self.sp_groups()

    def sp_groups(self) -> dict[str, str]:
        """Each stack variable -> the variable whose stack pointer it shares.  Variables pushed
        and popped in the same blocks, in the same order of pushes and pops, have equal stack
        pointers at every step (all start at 0, and every block moves them alike), so the
        state carries one pointer per group (NUTS: 3 instead of 17), and a block computes its
        pointer arithmetic and flat indices once per group, not per variable (fewer
        operations to trace, and fewer kernels for XLA to compile)."""
        moves: dict[str, list] = {v: [] for v in self.stacks}
        for i, b in enumerate(self.p.blocks):
            for op in b.ops:
                if isinstance(op, (ir.Push, ir.Pop)):
                    moves[op.var].append((i, type(op).__name__))
        first: dict[tuple, str] = {}
        return {v: first.setdefault(tuple(moves[v]), v) for v in self.stacks}

    def initial_state(self, args: Sequence[Any], batch: int) -> tuple[dict, dict]:
        d = self.depth
        shared: dict[tuple, tf.Tensor] = {}

        def zeros(spec, lead=()):
            """Zeros of ``spec``, one tensor per shape and dtype (fewer operations to trace)."""
            def leaf(s):
                key = (tuple(lead), tuple(s.shape.as_list()[1:]), s.dtype)
                if key not in shared:
                    shared[key] = zeros_of(s, batch, lead)
                return shared[key]
            return tf.nest.map_structure(leaf, spec)
        small = {
            "pc": tf.fill([batch], self.p.entries[self.p.main]),
            "pc_sp": tf.ones([batch], tf.int32),
            "overflow": tf.zeros([batch], tf.bool),
            "runs": tf.zeros([self.halt], tf.int32),
            "members": tf.zeros([self.halt], tf.int32),
            "vals": {v: zeros(self.types[v]) for v in self.registers + self.stacks},
            "sp": {g: zeros(tf.TensorSpec([None], tf.int32))
                   for g in dict.fromkeys(self.sp_of.values())},
        }
        for v, a in zip(self.p.params, args):
            small["vals"][v] = tf.nest.map_structure(
                lambda x, s: fit(x, s, batch), a, self.types[v])
        pc_stack = tf.concat([tf.fill([1, batch], self.halt),
                              tf.zeros([d + 1, batch], tf.int32)], axis=0)
        stacks = {v: zeros(self.types[v], [d + 1]) for v in self.stacks}
        return small, {"pc_stack": pc_stack, "stack": stacks}

    def _no_write(self, v: str | None, batch: int) -> tuple:
        value = tf.zeros([batch], tf.int32) if v is None else zeros_of(self.types[v], batch)
        return tf.zeros([batch], tf.int32), tf.zeros([batch], tf.bool), value

    def no_writes(self, small: dict) -> dict:
        batch = _batch(small["pc"])
        return {"pc_stack": self._no_write(None, batch),
                "stack": {v: self._no_write(v, batch) for v in self.stacks}}

    def block(self, i: int, small: dict, big: dict,
              chosen: tf.Tensor | None = None) -> tuple[dict, dict]:
        """Block ``i`` for the members waiting at it; ``chosen``: a scalar tensor equal to
        ``i`` wherever the block runs (the scheduler's pick), compared against instead of the
        constant ``i``, so that XLA compiles the selects of blocks alike in shape once (the
        constant would make every block's kernels distinct)."""
        b = self.p.blocks[i]
        batch = _batch(small["pc"])
        active = tf.equal(small["pc"], i if chosen is None else chosen)
        shaped: dict = {}  # active, reshaped for wider values (see select)
        vals = dict(small["vals"])
        sp = {v: small["sp"][g] for v, g in self.sp_of.items()}  # per variable, shared in groups
        memo, flagged = _Memo(), set()
        overflow = small["overflow"]
        writes: dict[str, tuple] = {}
        temps: dict[str, Any] = {}

        def read(v):
            return temps[v] if v in temps else vals[v]

        def write(v, slot, mask):
            writes[v] = (slot, mask, vals[v])

        for op in b.ops:
            if isinstance(op, ir.Primitive):
                when = ir.when_mask(op, lambda c: tf.cast(read(c), tf.bool), tf.logical_and)
                with running_members(active if when is None else active & when):
                    outs = run_primitive(op, [read(v) for v in op.inputs], batch,
                                         [self.types[v] for v in op.outputs])
                for v, new in zip(op.outputs, outs):
                    if self.p.allocation[v] == ir.TEMPORARY:
                        temps[v] = new if when is None or v not in temps else select(
                            when, new, temps[v], f"{op.loc}: {v}")
                    else:
                        mask = active if when is None else active & when
                        vals[v] = select(mask, new, vals[v], f"{op.loc}: {v}",
                                         shaped if when is None else None)
            elif isinstance(op, ir.Push) and _pushes_pc(b.terminator):
                # Caller-saves pushes sit in the block of the call they save around, so a
                # variable's stack never holds more frames than the program-counter stack
                # (sp[v] <= pc_sp - 1): when the call's push fits, so does this one, and when
                # it does not, sp[v] <= depth is the junk slot and the call's check flags the
                # member.  Not checking here saves fib 5-9% per call.
                v, old = op.var, sp[op.var]
                write(v, old, active)
                sp[v] = memo("push", (old,), lambda: old + tf.cast(active, tf.int32))
            elif isinstance(op, ir.Push):
                v, old = op.var, sp[op.var]
                fits = memo("fits", (old,), lambda: old < self.depth)
                if id(fits) not in flagged:  # once per group
                    flagged.add(id(fits))
                    overflow = overflow | (active & ~fits)
                ok = memo("ok", (fits,), lambda: active & fits)
                write(v, old, ok)
                sp[v] = memo("push", (old, ok), lambda: old + tf.cast(ok, tf.int32))
            elif isinstance(op, (ir.Pop, ir.Peek)):
                v, old = op.var, sp[op.var]
                if isinstance(op, ir.Pop):
                    sp[v] = memo("pop", (old,), lambda: old - tf.cast(active, tf.int32))
                    top = sp[v]
                else:
                    top = memo("top", (old,), lambda: old - 1)
                vals[v] = select(active, _read_slot(big["stack"][v], top, self.depth, memo),
                                 vals[v], shaped=shaped)
            elif isinstance(op, ir.Update):
                old = sp[op.var]
                write(op.var, memo("top", (old,), lambda: old - 1), active)
        pc, pc_sp = small["pc"], small["pc_sp"]
        pc_write = None
        t = b.terminator
        if isinstance(t, ir.Jump):
            pc = tf.where(active, t.target, pc)
        elif isinstance(t, ir.Branch):
            cond = tf.cast(read(t.cond), tf.bool)
            pc = tf.where(active, tf.where(cond, t.true, t.false), pc)
        elif isinstance(t, ir.PushJump) and not t.push:  # the callee returns statically
            pc = tf.where(active, t.target, pc)
        elif isinstance(t, ir.PushJump):
            fits = pc_sp < self.depth + 1
            overflow = overflow | (active & ~fits)
            ok = active & fits
            pc_write = (pc_sp, ok, tf.fill([batch], t.return_to))
            pc_sp = pc_sp + tf.cast(ok, tf.int32)
            pc = tf.where(ok, t.target, pc)
        elif t.target is not None:  # Return to a static address
            pc = tf.where(active, t.target, pc)
        else:  # Return
            pc_sp = pc_sp - tf.cast(active, tf.int32)
            pc = tf.where(active, _read_slot(big["pc_stack"], pc_sp, self.depth + 1), pc)
        if any(isinstance(op, ir.Push) for op in b.ops) or _pushes_pc(t):
            pc = tf.where(overflow, self.halt, pc)  # only these can overflow
        for v, g in self.sp_of.items():
            if sp[v] is not sp[g]:  # kept under python -O: a diverged group would be wrong
                raise RuntimeError(f"internal error: the stack pointers of {v!r} and {g!r}, "
                                   f"grouped as moving alike, diverged in block {i}")
        return ({"pc": pc, "pc_sp": pc_sp, "overflow": overflow, "vals": vals,
                 "sp": {g: sp[g] for g in small["sp"]},
                 "runs": small["runs"], "members": small["members"]},
                {"pc_stack": pc_write, "stack": writes})

    def worth_guarding(self, i: int) -> bool:
        """Should ``sweep_guarded`` put block ``i`` behind a guard (a ``tf.cond``; under XLA
        a loop of 0 or 1 trips)?  The guard (a reduction over the batch plus the control
        flow) costs about as many XLA kernels as a small block, so blocks that write no stack
        and only compute on per-member scalars (every variable they touch is ``[B]``) run
        masked without one; blocks with pushes, calls or wider values (whose cost is unknown
        and may be large) are guarded."""
        b = self.p.blocks[i]
        if _pushes_pc(b.terminator) or any(
                isinstance(op, (ir.Push, ir.Update)) for op in b.ops):
            return True
        touched = [v for op in b.ops if isinstance(op, ir.Primitive)
                   for v in (*op.inputs, *op.outputs)]
        touched += [op.var for op in b.ops if isinstance(op, (ir.Pop, ir.Peek))]
        return any(v not in self.types or any(
            s.shape.rank != 1 for s in tf.nest.flatten(self.types[v])) for v in touched)

    def changes_of(self, *blocks: int) -> Callable[[dict], dict]:
        """Statically, the entries of the small state that any of ``blocks`` may change, as a
        function picking them from a state.  A conditional running one of them passes only
        these through (XLA copies every output of a conditional each step, and a [B, D]
        register copied through every step costs as much as the block itself)."""
        scalars, vals, sps = ["pc"], set(), set()
        for i in blocks:
            b, t = self.p.blocks[i], self.p.blocks[i].terminator
            for op in b.ops:
                if isinstance(op, ir.Primitive):
                    vals.update(v for v in op.outputs if self.p.allocation[v] != ir.TEMPORARY)
                elif isinstance(op, (ir.Push, ir.Pop)):
                    sps.add(self.sp_of[op.var])
                if isinstance(op, (ir.Pop, ir.Peek)):
                    vals.add(op.var)
            if _pushes_pc(t) or (isinstance(t, ir.Return) and t.target is None):
                scalars.append("pc_sp")
            if _pushes_pc(t) or any(isinstance(op, ir.Push) for op in b.ops):
                scalars.append("overflow")
        scalars = list(dict.fromkeys(scalars))
        return lambda s: {**{k: s[k] for k in scalars}, "vals": {v: s["vals"][v] for v in vals},
                          "sp": {v: s["sp"][v] for v in sps}}

    def writes_of(self, i: int) -> tuple[bool, tuple[str, ...]]:
        """Statically: does block ``i`` write the pc stack, and which variable stacks."""
        b = self.p.blocks[i]
        return (_pushes_pc(b.terminator),
                tuple(dict.fromkeys(op.var for op in b.ops
                                    if isinstance(op, (ir.Push, ir.Update)))))

    def uniform(self, small: dict, writes: dict, keys: tuple | None = None) -> dict:
        """Writes for ``keys`` (default: every stack), non-writers masked off: the same
        structure from every branch of a conditional."""
        pc_key, stacks = keys if keys is not None else (True, tuple(self.stacks))
        none = self.no_writes(small)
        return {"pc_stack": (writes["pc_stack"] or none["pc_stack"]) if pc_key else None,
                "stack": {v: writes["stack"].get(v, none["stack"][v]) for v in stacks}}

    def main_registers(self, small: dict) -> dict:
        """Main's variables by their source names (the state a paused machine reports)."""
        prefix = self.p.main + "."
        return {k[len(prefix):]: v for k, v in small["vals"].items() if k.startswith(prefix)}

    def resumed(self, args: Sequence[Any], batch: int, machine: tuple,
                refresh: Sequence[str]) -> tuple[dict, dict]:
        """The state to go on from ``machine`` (a paused run's ``(small, big)``): members that
        had halted start over from ``args``; the others continue where they were, with main's
        parameters named in ``refresh`` re-read from ``args``."""
        fresh_small, _ = self.initial_state(args, batch)
        small, big = machine
        fresh = tf.equal(small["pc"], self.halt)

        def pick(new, old):
            return tf.nest.map_structure(lambda n, o: select(fresh, n, o), new, old)
        vals = {v: pick(fresh_small["vals"][v], small["vals"][v]) for v in small["vals"]}
        for name in refresh:
            v = f"{self.p.main}.{name}"
            vals[v] = fresh_small["vals"][v]
        return ({"pc": tf.where(fresh, fresh_small["pc"], small["pc"]),
                 "pc_sp": tf.where(fresh, fresh_small["pc_sp"], small["pc_sp"]),
                 "overflow": tf.where(fresh, fresh_small["overflow"], small["overflow"]),
                 "runs": fresh_small["runs"], "members": fresh_small["members"], "vals": vals,
                 "sp": {v: tf.where(fresh, 0, sp) for v, sp in small["sp"].items()}}, big)

    def run(self, args: Sequence[Any], max_steps: int, scheduler: str,
            utilization: bool, machine: tuple | None = None,
            until: Callable[[dict], tf.Tensor] | None = None,
            refresh: Sequence[str] = ()) -> tuple[Any, Status, tuple]:
        batch = _batch(tf.nest.flatten(args)[0])
        choose = SCHEDULERS[scheduler]
        if machine is None:
            small, big = self.initial_state(args, batch)
        else:
            small, big = self.resumed(args, batch, machine, refresh)

        def apply(big, writes):
            stack, memo = dict(big["stack"]), _Memo()
            for v, w in writes["stack"].items():
                stack[v] = _apply_write(stack[v], w, memo)
            pc_stack = big["pc_stack"]
            if writes["pc_stack"] is not None:
                pc_stack = _apply_write(pc_stack, writes["pc_stack"])
            return {"pc_stack": pc_stack, "stack": stack}

        def uniform_block(i, small, big, keys=None):
            new, writes = self.block(i, small, big)
            return new, self.uniform(small, writes, keys)

        def count(small, i):
            if not utilization:
                return small
            here = tf.reduce_sum(tf.cast(tf.equal(small["pc"], i), tf.int32))
            hot = tf.one_hot(i, self.halt, dtype=tf.int32)
            return dict(small, runs=small["runs"] + hot * tf.minimum(here, 1),
                        members=small["members"] + hot * here)

        xla = _in_xla_context()

        # Under XLA a switch_case copies every output each step; per-block loop guards do not,
        # but cost a loop per block: worth it once some block writes a stack or wide values
        # (fib 77 -> 21 ms, NUTS 283 -> 97 ms per step call), not for scalar-only programs
        # (Collatz 1.6 -> 1.9 ms), which keep the switch (with no stack to write).
        loop_guards = xla and any(self.worth_guarding(i) for i in range(self.halt))
        writers = {None: [i for i in range(self.halt) if self.writes_of(i)[0]]}
        writers.update({v: [i for i in range(self.halt) if v in self.writes_of(i)[1]]
                        for v in self.stacks})

        def apply_if_written(nxt, big, writes):
            """Scatter the chosen block's writes into the stacks it writes (a TF graph: a
            ``tf.cond`` skips the others' scatters for free)."""
            def maybe(key, stack, write):
                if not writers[key]:
                    return stack
                ran = tf.reduce_any(tf.equal(nxt, writers[key]))
                return tf.cond(ran, lambda: _apply_write(stack, write), lambda: stack)
            return {"pc_stack": maybe(None, big["pc_stack"], writes["pc_stack"]),
                    "stack": {v: maybe(v, big["stack"][v], writes["stack"][v])
                              for v in self.stacks}}

        def guarded(i, small, big, runs, chosen=None):
            """Block ``i`` for the members waiting at it, only where ``runs(pc)`` (a scalar)
            holds.  Under XLA a loop of 0 or 1 trips that carries just what the block can
            change (``changes_of``) and the stacks it writes, its stack writes applied inside:
            XLA updates loop-carried buffers in place, where a conditional copies each of its
            outputs every step ([B, D] registers and stacks alike) and a skipped block would
            still scatter into the junk slot (NUTS one_step at 1024 chains x 100 dimensions:
            80 -> 43 ms; fib at 1024: 15 -> 8.5 ms).  Blocks that run a dot are no exception:
            on NUTS' 100-d Gaussian at 1000 chains a conditional around the gradient block
            made one step 1.3-1.85x slower (its ten [1000, 100] outputs copied every loop
            step), and on the logistic regression ([1024, 100] x [100, 10000] matmuls) the
            loop guard is as fast (446 vs 469 ms a step).  In a TF graph a ``tf.cond``."""
            keys, part = self.writes_of(i), self.changes_of(i)
            if not xla:
                changed, writes = _cond(
                    runs(small["pc"]),
                    lambda: (lambda new, w: (part(new), w))(*uniform_block(i, small, big, keys)),
                    lambda: (part(small), self.uniform(small, _NO_WRITES, keys)))
                return _merge(small, changed), apply(big, writes)

            def once(go, changed, stacks):
                whole = _merge_big(big, stacks)
                new, writes = self.block(i, _merge(small, changed), whole, chosen)
                return tf.constant(False), part(new), _big_part(apply(whole, writes), keys)
            # the predicate is computed once, outside: the loop's condition is evaluated twice
            # (enter, then exit) and must not reduce over the batch both times; the body
            # clears it, so no maximum_iterations (its trip counter cost 3% of fib's time)
            _, changed, stacks = tf.while_loop(
                lambda go, changed, _: go, once,
                (runs(small["pc"]), part(small), _big_part(big, keys)))
            return _merge(small, changed), _merge_big(big, stacks)

        in_loop = [i for i in range(self.halt) if i != self.prologue]

        def body(steps, small, big):
            if choose is None:  # a sweep: every block once, in program order
                for i in in_loop:
                    small = count(small, i)
                    if scheduler == "sweep_guarded" and self.worth_guarding(i):
                        small, big = guarded(i, small, big,
                                             lambda pc, i=i: tf.reduce_any(tf.equal(pc, i)))
                    else:
                        small, writes = self.block(i, small, big)
                        big = apply(big, writes)
                return steps + 1, small, big
            nxt = tf.minimum(choose(small["pc"], self.halt), self.halt - 1)
            small = count(small, nxt)
            if loop_guards:  # each block guarded: only the chosen one runs, in place
                for i in in_loop:
                    small, big = guarded(i, small, big, lambda pc, i=i: tf.equal(nxt, i), nxt)
                return steps + 1, small, big
            part = self.changes_of(*range(self.halt))
            changed, writes = _switch_case(nxt, [
                lambda i=i: (lambda new, w: (part(new), w))(*uniform_block(i, small, big))
                for i in range(self.halt)])
            return steps + 1, _merge(small, changed), apply_if_written(nxt, big, writes)

        # Members at a return of main have decided to halt on values a resumed call may
        # refresh (a NUTS chain at its last trajectory): they halt before the machine pauses,
        # and start over from the next call's arguments, rather than halt on stale ones.
        returning = [i for i, b in enumerate(self.p.blocks)
                     if isinstance(b.terminator, ir.Return) and b.terminator.target == self.halt]

        def paused(small):
            if until is None:
                return tf.constant(False)
            about_to_halt = tf.reduce_any(tf.equal(small["pc"][:, None], returning))
            return until(self.main_registers(small)) & ~about_to_halt

        def cond(steps, small, big):
            return tf.logical_and(steps < max_steps, tf.reduce_min(small["pc"]) < self.halt) \
                & ~paused(small)

        if self.prologue is not None:
            small = count(small, self.prologue)
            small, writes = self.block(self.prologue, small, big)
            big = apply(big, writes)
        with _control_dependencies_only_if(not stateless(self.p)):
            steps, small, big = tf.while_loop(cond, body, (tf.constant(0), small, big),
                                              maximum_iterations=max_steps)
        result = small["vals"][self.p.result]
        status = Status(small["overflow"], tf.not_equal(small["pc"], self.halt) &
                        ~small["overflow"] & ~paused(small), steps, small["runs"],
                        small["members"])
        return result, status, (small, big)


@contextlib.contextmanager
def _control_dependencies_only_if(needed: bool):
    """Loops built inside skip TensorFlow's automatic control dependencies unless ``needed``:
    they only order stateful ops, and their pass over every op of every loop body (the
    machine's and each block guard's) was a fifth of tracing NUTS.  The switch is the
    graph's private ``_add_control_dependencies`` flag, which ``while_v2`` reads."""
    graph = tf.compat.v1.get_default_graph()
    before = getattr(graph, "_add_control_dependencies", None)
    if needed or before is None or tf.executing_eagerly():
        yield
        return
    graph._add_control_dependencies = False
    try:
        yield
    finally:
        graph._add_control_dependencies = before


@tf.autograph.experimental.do_not_convert
def run(program: ir.Program, types: Mapping[str, Any], args: Sequence[Any], *,
        max_stack_depth: int = 32, max_steps: int = 100_000,
        scheduler: str = "earliest", utilization: bool = False) -> tuple[Any, Status]:
    """Build (in the current graph or eagerly) the runtime loop; return (result, status).

    Args:
      program: an allocated stack-machine program (:func:`tfx_vec.autobatch.passes.pipeline`).
      types: qualified variable -> spec structure (:func:`types.qualified_types`).
      args: one batched structure per parameter of main.
      utilization: count runs and active members per block (``Status.block_runs`` /
        ``block_members``; zeros otherwise).
    """
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; choose one of {sorted(SCHEDULERS)}")
    return _Machine(program, types, max_stack_depth).run(args, max_steps, scheduler,
                                                         utilization)[:2]


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
    """``result``, after asserts on ``status`` that fail when the graph runs.  XLA drops
    asserts (see the docs for how to check there), so under XLA none are built."""
    if _in_xla_context():
        return result
    checks = [
        tf.debugging.Assert(~tf.reduce_any(status.overflow),
                            [f"{name}: a batch member recursed deeper than max_stack_depth="
                             f"{opts['max_stack_depth']}; members:", tf.where(status.overflow)]),
        tf.debugging.Assert(~tf.reduce_any(status.unfinished),
                            [f"{name}: a batch member had not finished after max_steps="
                             f"{opts['max_steps']}; members:", tf.where(status.unfinished)])]
    with tf.control_dependencies(checks):
        return tf.nest.map_structure(tf.identity, result)


def _signature_key(args: tuple) -> tuple:
    """A cheap hashable key for the structure, shapes and dtypes of ``args``."""
    if all(isinstance(a, tf.Tensor) for a in args):  # the common case, without tf.nest
        return len(args), tuple((_shape_key(a.shape), a.dtype) for a in args)
    return (tf.nest.map_structure(lambda _: 0, args),
            tuple((_shape_key(x.shape), x.dtype) for x in tf.nest.flatten(args)))


def _shape_key(shape: tf.TensorShape) -> tuple | None:
    """Hashable in TF1 mode too (where a shape's dimensions are ``Dimension`` objects)."""
    return None if shape.rank is None else tuple(shape.as_list())


class _Traced:
    """One traced ``ConcreteFunction``, called on the arguments flattened: this skips
    ``ConcreteFunction.__call__``'s argument binding (~25 us a call, a quarter of Collatz's at
    batch 1024; the caller's cache key already guarantees the signature).  ``_call_flat`` is
    TF's own next step (private API): where it is missing, the public call."""

    def __init__(self, concrete: Any):
        self.concrete = concrete
        self._call_flat = getattr(concrete, "_call_flat", None)

    def __call__(self, args: tuple) -> Any:
        if self._call_flat is None:
            return self.concrete(*args)
        return self._call_flat(tf.nest.flatten(args), self.concrete.captured_inputs)


def _tensors(args: Sequence[Any]) -> tuple:
    return tuple(a if isinstance(a, tf.Tensor) else
                 tf.nest.map_structure(tf.convert_to_tensor, a) for a in args)


def _prepared(fn: Any, args: tuple, opts: Mapping[str, Any],
              weak: Sequence[tuple] | None = None) -> tuple[tuple, dict, ir.Program]:
    """The cache key, types and program (blocks merged for this signature) of ``fn(*args)``;
    ``weak``: per argument, which leaves were Python literals."""
    key = (_signature_key(args), None if weak is None else tuple(weak), opts["max_stack_depth"],
           opts["max_steps"], opts["scheduler"], opts["utilization"], opts.get("shapes"))
    if key not in fn._compiled:
        types = qualified_types(fn.types_for(args, weak, opts.get("shapes")))
        fn._compiled[key] = types, fn.lowered(types)
    return (key, *fn._compiled[key])


def idle_machine(fn: Any, args: Sequence[Any], opts: Mapping[str, Any]) -> tuple:
    """A machine for :func:`call_resumable` in which every member has halted, so that the
    first call starts them all from its arguments."""
    args = _tensors(args)
    _, types, program = _prepared(fn, args, opts)
    small, big = _Machine(program, types, opts["max_stack_depth"]).initial_state(
        args, _batch(tf.nest.flatten(args)[0]))
    return dict(small, pc=tf.fill(tf.shape(small["pc"]), len(program.blocks))), big


def call_resumable(fn: Any, args: Sequence[Any], opts: Mapping[str, Any], machine: tuple,
                   until: Callable[[dict], tf.Tensor], refresh: Sequence[str] = ()) -> tuple:
    """``fn(*args)`` that pauses: the loop stops as soon as ``until(registers)`` (main's
    variables by source name, ``[B, ...]`` each) is true and no member is at a return of main
    (it returns first: it decided to on values the next call may refresh), or when every
    member has returned.
    Goes on from ``machine`` (a previous call's, or :func:`idle_machine`): members that had
    returned start over from ``args``, the others continue, re-reading main's parameters
    named in ``refresh``.  Returns ``(result, registers, machine)``; ``result`` holds only for
    members that returned.

    Example:
        >>> import tensorflow as tf
        >>> from tfx_vec import autobatch as ab
        >>> from tfx_vec.autobatch import program_counter as pc
        >>> @ab.function
        ... def count(n, stop):
        ...     i = tf.zeros_like(n)
        ...     while i < n:
        ...         i = i + 1
        ...     return i
        >>> args = (tf.constant([3, 9]), tf.constant([2, 2]))
        >>> opts = count.options
        >>> m = pc.idle_machine(count, args, opts)
        >>> until = lambda r: tf.reduce_all(r["i"] >= r["stop"])
        >>> _, regs, m = pc.call_resumable(count, args, opts, m, until)
        >>> regs["i"].numpy().tolist()
        [2, 2]
        >>> result, regs, m = pc.call_resumable(count, (args[0], tf.constant([9, 9])), opts, m,
        ...                                     until, refresh=("stop",))
        >>> result.numpy().tolist(), regs["i"].numpy().tolist()
        ([3, 9], [3, 9])
    """
    args = _tensors(args)
    _, types, program = _prepared(fn, args, opts)

    def go(a, m):
        machine = _Machine(program, types, opts["max_stack_depth"])
        result, status, new = machine.run(a, opts["max_steps"], opts["scheduler"],
                                          opts["utilization"], machine=m, until=until,
                                          refresh=refresh)
        return (result, machine.main_registers(new[0]), new, status,
                tf.reduce_any(status.overflow | status.unfinished))

    if not tf.executing_eagerly():
        result, regs, new, status, _ = go(args, machine)
        return _graph_checks(result, status, opts, fn.__name__), regs, new
    key = ("resumable", _signature_key(args), until, tuple(refresh), opts["max_stack_depth"],
           opts["max_steps"], opts["scheduler"], opts["utilization"], bool(opts["jit_compile"]))
    if key not in fn._compiled:
        def spec(t):
            return tf.TensorSpec(t.shape, t.dtype)
        fn._compiled[key] = tf.function(
            go, jit_compile=bool(opts["jit_compile"]), autograph=False).get_concrete_function(
                tuple(spec_of(a) for a in args), tf.nest.map_structure(spec, machine))
    result, regs, new, status, failed = fn._compiled[key](args, machine)
    fn.last_status = status
    if failed.numpy():
        _check(status, opts["max_stack_depth"], opts["max_steps"], fn.__name__)
    return result, regs, new


def call(fn: Any, args: Sequence[Any], opts: Mapping[str, Any],
         weak: Sequence[tuple] | None = None) -> Any:
    """``fn(*args)`` with the program-counter runtime (what ``ab.function`` calls).

    Each input signature and option set gets its types and program (blocks merged for that
    signature) once; eagerly, also one traced ``ConcreteFunction``, called directly (a
    ``tf.function`` call would redo its signature matching every time, ~60 us).  ``args`` are
    batched already (:func:`.arguments.batch`); ``weak`` marks the Python literals among them.
    """
    args = _tensors(args)
    key, types, program = _prepared(fn, args, opts, weak)

    def go(*a):
        result, status = run(program, types, a, max_stack_depth=opts["max_stack_depth"],
                             max_steps=opts["max_steps"], scheduler=opts["scheduler"],
                             utilization=opts["utilization"])
        return result, status, tf.reduce_any(status.overflow | status.unfinished)

    if not tf.executing_eagerly():
        result, status, _ = go(*args)
        return _graph_checks(result, status, opts, fn.__name__)
    jkey = key + (bool(opts["jit_compile"]),)
    if jkey not in fn._compiled:
        fn._compiled[jkey] = _Traced(tf.function(
            go, jit_compile=bool(opts["jit_compile"]), autograph=False).get_concrete_function(
                *(spec_of(a) for a in args)))
    result, status, failed = fn._compiled[jkey](args)
    fn.last_status = status
    if failed.numpy():  # one scalar read per call; the per-member flags only on failure
        _check(status, opts["max_stack_depth"], opts["max_steps"], fn.__name__)
    return result
