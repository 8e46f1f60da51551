"""Lowering: Function IR -> stack-machine IR (the paper's Figure 2 -> Figure 4).

All functions' blocks are merged into one list (main's first, so "earliest block first" prefers
the caller's code), variables are qualified ``function.var``, and each block is split after every
``Call``.  A call becomes, in the caller's block::

    push f.v            # for every caller variable live after the call (caller-saves, one
                        # stack per variable: optimization 1)
    g.p1, g.p2 = prim(f.a1, f.a2)   # arguments moved into the callee's parameters at once
    pushjump g.entry then f.k

and the continuation block ``f.k`` starts with ``pop f.v`` (reverse order) and
``f.out = prim(g.result)``.  A function's ``Return`` pops the program counter.

Stack discipline of the output: within a member's execution, every ``push v`` is matched by
exactly one later ``pop v`` at the continuation of the same call, so each variable's stack depth
equals the number of pending calls that saved it.  Pushes that the callee cannot clobber are
removed later by :mod:`.stack_elision`.

Precondition: a Function-IR program (``ValueError`` otherwise); liveness is computed if absent.

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec import autobatch as ab
    >>> from tfx_vec.autobatch.frontend import compile_program
    >>> @ab.function
    ... def twice(x):
    ...     return x + x
    >>> @ab.function
    ... def main(x):
    ...     return twice(x) * 3
    >>> low = lower(compile_program(main))
    >>> low.entries
    {'main': 0, 'twice': 2}
"""
from __future__ import annotations

import dataclasses

from .. import ir
from .liveness import liveness as liveness_pass

__all__ = ["lower"]


def _q(fname: str, var: str) -> str:
    return f"{fname}.{var}"


def _qualify(op, fname: str):
    if isinstance(op, ir.Primitive):
        return dataclasses.replace(op, inputs=tuple(_q(fname, v) for v in op.inputs),
                                   outputs=tuple(_q(fname, v) for v in op.outputs))
    raise TypeError(op)


def lower(program: ir.Program) -> ir.Program:
    """Lower calls to explicit per-variable stack operations; see the module docstring."""
    if program.lowered:
        raise ValueError("lower: the program is already lowered")
    if not program.liveness:
        program = liveness_pass(program)
    live = program.liveness
    order = [program.main] + [n for n in program.functions if n != program.main]
    # Index of the first lowered block of every (function, source block).
    first: dict[tuple[str, int], int] = {}
    n = 0
    for fname in order:
        for i, b in enumerate(program.functions[fname].blocks):
            first[(fname, i)] = n
            n += 1 + sum(isinstance(op, ir.Call) for op in b.ops)
    entries = {fname: first[(fname, 0)] for fname in order}

    def target(fname: str, j: int) -> int:
        return first[(fname, j)]

    blocks: list[ir.Block] = []
    owners: list[str] = []
    for fname in order:
        f = program.functions[fname]
        for i, b in enumerate(f.blocks):
            ops: list = []
            segment = 0
            for k, op in enumerate(b.ops):
                if isinstance(op, ir.Primitive):
                    ops.append(_qualify(op, fname))
                    continue
                callee = program.functions[op.callee]
                saved = sorted(live[(fname, i, k)] - {op.output})
                ops += [ir.Push(_q(fname, v)) for v in saved]
                ops.append(ir.move(tuple(_q(callee.name, p) for p in callee.params),
                                tuple(_q(fname, a) for a in op.args), op.loc))
                cont = first[(fname, i)] + segment + 1
                blocks.append(ir.Block(f"{b.name}" + (f"/{segment}" if segment else ""),
                                       tuple(ops), ir.PushJump(entries[op.callee], cont)))
                owners.append(fname)
                segment += 1
                ops = [ir.Pop(_q(fname, v)) for v in reversed(saved)]
                ops.append(ir.move((_q(fname, op.output),), (_q(callee.name, callee.result),),
                                op.loc))
            t = b.terminator
            if isinstance(t, ir.Jump):
                t = ir.Jump(target(fname, t.target))
            elif isinstance(t, ir.Branch):
                t = ir.Branch(_q(fname, t.cond), target(fname, t.true),
                              target(fname, t.false), t.loc)
            else:
                t = ir.Return()
            blocks.append(ir.Block(f"{b.name}" + (f"/{segment}" if segment else ""),
                                   tuple(ops), t))
            owners.append(fname)
    main = program.functions[program.main]
    return dataclasses.replace(
        program, lowered=True, blocks=tuple(blocks), owners=tuple(owners), entries=entries,
        params=tuple(_q(main.name, p) for p in main.params), result=_q(main.name, main.result),
        liveness={}, notes=program.notes + (
            "lowering: calls -> caller-saves push/pop on one stack per variable "
            "(optimization 1: per-variable stacks)",))
