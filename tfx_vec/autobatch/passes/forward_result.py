"""Result forwarding: ``main`` returns the variable it would copy into its result.

Every ``return x`` assigns ``x`` to the function's result variable before returning.  For
``main``, when nothing calls it and every return is such a move from the same variable ``x``,
that copy is pure cost: a register written (masked) in every sweep of the program-counter
runtime, one more output of the loop.  Since a member that returns from ``main`` halts and
nothing writes its variables afterwards, the program's result can be ``x`` itself: the moves are
dropped and ``Program.result`` names ``x``.  (Callers of other functions read the callee's
result variable, so only ``main`` gains.)

Example:
    >>> from tfx_vec import autobatch as ab
    >>> from tfx_vec.autobatch.frontend import compile_program
    >>> from tfx_vec.autobatch.passes import lower
    >>> @ab.function
    ... def count_down(n):
    ...     steps = n * 0
    ...     while n > 0:
    ...         n -= 1
    ...         steps += 1
    ...     return steps
    >>> forward_result(lower(compile_program(count_down))).result
    'count_down.steps'
"""
from __future__ import annotations

import dataclasses

from .. import ir

__all__ = ["forward_result"]


def _forwardable(program: ir.Program) -> str | None:
    """The variable main's result can be, or None."""
    main, result = program.main, program.result
    if any(isinstance(b.terminator, ir.PushJump)
           and b.terminator.target == program.entries[main] for b in program.blocks):
        return None  # main is called: its callers read the result variable
    sources = set()
    for owner, b in zip(program.owners, program.blocks):
        for k, op in enumerate(b.ops):
            if result in ir.reads(op):
                return None
            if result not in ir.writes(op):
                continue
            later = b.ops[k + 1:]
            if (owner != main or not isinstance(b.terminator, ir.Return) or not ir.is_move(op)
                    or any(set(op.inputs + op.outputs) & set(ir.writes(o)) for o in later)):
                return None
            sources.add(op.inputs[0])
    return next(iter(sources)) if len(sources) == 1 else None


def forward_result(program: ir.Program) -> ir.Program:
    """Drop main's final copies into its result variable when they all copy one variable."""
    if not program.lowered:
        raise ValueError("forward_result: the program must be lowered first")
    source = _forwardable(program)
    if source is None:
        return dataclasses.replace(program, notes=program.notes + (
            "result forwarding: not applicable",))
    blocks = tuple(dataclasses.replace(b, ops=tuple(
        op for op in b.ops if program.result not in ir.writes(op))) for b in program.blocks)
    return dataclasses.replace(program, blocks=blocks, result=source, notes=program.notes + (
        f"result forwarding: main returns {source} itself (no copy into {program.result})",))
