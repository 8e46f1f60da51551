"""Stack elision (the paper's optimization 3): no stack for variables not live across a call
that can reach back into their function.

Lowering saves every caller variable live across a call.  A call to a function that cannot
(transitively) call the caller cannot clobber the caller's variables, so the ``push`` before it
and the matching ``pop`` at its continuation are removed.  A non-recursive program ends up
with no ``push``/``pop`` at all: its variables become registers (or temporaries).

Precondition: a lowered program straight out of :func:`.lowering.lower` (pushes immediately
precede the argument move and ``pushjump`` of their call; pops lead the continuation block).

Example:
    >>> from tfx_vec import autobatch as ab
    >>> from tfx_vec.autobatch.frontend import compile_program
    >>> from tfx_vec.autobatch.passes.lowering import lower
    >>> @ab.function
    ... def inc(x):
    ...     return x + 1
    >>> @ab.function
    ... def main(x):
    ...     y = inc(x)
    ...     return inc(y) + x
    >>> from tfx_vec.autobatch import ir
    >>> low = elide_stacks(lower(compile_program(main)))
    >>> any(isinstance(op, (ir.Push, ir.Pop)) for b in low.blocks for op in b.ops)
    False
"""
from __future__ import annotations

import dataclasses

from .. import ir

__all__ = ["elide_stacks", "reachable_functions"]


def reachable_functions(program: ir.Program) -> dict[str, set[str]]:
    """For each function, the functions it can reach through calls (itself only if recursive)."""
    calls = {name: {op.callee for b in f.blocks for op in b.ops if isinstance(op, ir.Call)}
             for name, f in program.functions.items()}
    reach: dict[str, set[str]] = {}
    for name in calls:
        seen: set[str] = set()
        stack = list(calls[name])
        while stack:
            g = stack.pop()
            if g not in seen:
                seen.add(g)
                stack.extend(calls[g])
        reach[name] = seen
    return reach


def elide_stacks(program: ir.Program) -> ir.Program:
    """Drop push/pop pairs around calls whose callee cannot re-enter the caller."""
    if not program.lowered:
        raise ValueError("elide_stacks: the program must be lowered first")
    reach = reachable_functions(program)
    blocks = list(program.blocks)
    removed = 0
    for i, b in enumerate(program.blocks):
        t = b.terminator
        if not isinstance(t, ir.PushJump):
            continue
        caller, callee = program.owners[i], program.owners[t.target]
        if caller == callee or caller in reach[callee]:
            continue
        pushed = {op.var for op in b.ops if isinstance(op, ir.Push)}
        removed += len(pushed)
        blocks[i] = dataclasses.replace(
            blocks[i], ops=tuple(op for op in blocks[i].ops if not isinstance(op, ir.Push)))
        cont = blocks[t.return_to]
        blocks[t.return_to] = dataclasses.replace(
            cont, ops=tuple(op for op in cont.ops
                            if not (isinstance(op, ir.Pop) and op.var in pushed)))
    return dataclasses.replace(program, blocks=tuple(blocks), liveness={}, notes=program.notes + (
        f"stack elision: {removed} push/pop pairs removed around calls that cannot recurse "
        "(optimization 3)",))
