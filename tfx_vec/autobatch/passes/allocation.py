"""Allocation (the paper's optimizations 2 and 4): temporary, register or stack.

* ``temporary``: never live into a block (optimization 2): exists only inside one block's
  execution, never stored in the runtime state, never masked.
* ``register``: live across blocks but never pushed: one ``[batch, ...]`` value updated with a
  mask.
* ``stack``: pushed somewhere: a ``[max_stack_depth, batch, ...]`` stack with per-member stack
  pointers, plus a cached top (optimization 4) that primitives read and write, so only
  push/pop/peek/update touch the stack.

Main's parameters and result are at least registers (the runtime writes/reads them outside
blocks).

Example:
    >>> from tfx_vec import autobatch as ab
    >>> from tfx_vec.autobatch.frontend import compile_program
    >>> from tfx_vec.autobatch.passes import pipeline
    >>> @ab.function
    ... def f(x):
    ...     if x > 0:
    ...         x = x * 2
    ...     return x + 1
    >>> sorted(pipeline(compile_program(f)).allocation.items())
    [('f._ab_t1', 'temporary'), ('f.retval_', 'register'), ('f.x', 'register')]
"""
from __future__ import annotations

import dataclasses

from .. import ir
from .liveness import liveness as liveness_pass

__all__ = ["allocate"]


def allocate(program: ir.Program) -> ir.Program:
    """Classify every variable of a lowered program; attaches ``allocation`` and liveness."""
    if not program.lowered:
        raise ValueError("allocate: the program must be lowered first")
    program = liveness_pass(program)
    live_anywhere = set().union(*program.liveness.values()) if program.liveness else set()
    stacked = {op.var for b in program.blocks for op in b.ops
               if isinstance(op, (ir.Push, ir.Pop, ir.Peek, ir.Update))}
    pinned = set(program.params) | {program.result}
    allocation = {}
    for v in program.variables():
        if v in stacked:
            allocation[v] = ir.STACK
        elif v in live_anywhere or v in pinned:
            allocation[v] = ir.REGISTER
        else:
            allocation[v] = ir.TEMPORARY
    counts = {k: sum(a == k for a in allocation.values())
              for k in (ir.TEMPORARY, ir.REGISTER, ir.STACK)}
    return dataclasses.replace(program, allocation=allocation, notes=program.notes + (
        f"allocation: {counts[ir.TEMPORARY]} temporaries never stored (optimization 2), "
        f"{counts[ir.REGISTER]} registers without stacks, {counts[ir.STACK]} stacks with "
        "cached tops (optimization 4)",))
