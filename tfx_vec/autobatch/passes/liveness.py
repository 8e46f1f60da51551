"""Liveness analysis (backward data flow), for both IRs.

Function IR: per function, the live-in set of each block and the set live *after* each op
(``liveness[(function, block, op_index)]``), which lowering uses to decide what a caller saves
around a call.  Stack-machine IR: the live-in set of each block (``liveness[block]``), over the
interprocedural control-flow graph (``PushJump`` -> callee entry, ``Return`` -> every return
address of the function), which allocation uses to find temporaries.

Loops are handled (iteration to a fixed point).

Example:
    >>> from tfx_vec.autobatch import ir
    >>> f = ir.Function("f", ("x",), (ir.Block("f.0", (), ir.Return("x")),), "x")
    >>> liveness(ir.Program({"f": f}, "f")).liveness[("f", 0)]
    frozenset({'x'})
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from .. import ir

__all__ = ["liveness", "block_liveness"]


def _backward(ops: Sequence[Any], terminator: Any, live_out: frozenset) -> list[frozenset]:
    """Live sets after each op and (last) before the first op."""
    live = set(live_out) | set(ir.terminator_reads(terminator))
    after = [frozenset()] * len(ops)
    for k in range(len(ops) - 1, -1, -1):
        after[k] = frozenset(live)
        live -= set(ir.writes(ops[k]))
        live |= set(ir.reads(ops[k]))
    return after + [frozenset(live)]


def block_liveness(blocks: Sequence[ir.Block],
                   succ: Callable[[int], Sequence[int]]) -> tuple[list[frozenset], dict]:
    """Fixed point of live-in sets; also the live-after sets of every op."""
    live_in = [frozenset()] * len(blocks)
    changed = True
    while changed:
        changed = False
        for i in range(len(blocks) - 1, -1, -1):
            out = frozenset().union(*[live_in[j] for j in succ(i)])
            new = _backward(blocks[i].ops, blocks[i].terminator, out)[-1]
            if new != live_in[i]:
                live_in[i], changed = new, True
    after = {}
    for i, b in enumerate(blocks):
        out = frozenset().union(*[live_in[j] for j in succ(i)])
        for k, s in enumerate(_backward(b.ops, b.terminator, out)[:-1]):
            after[(i, k)] = s
    return live_in, after


def _return_edges(program: ir.Program) -> dict[str, list[int]]:
    returns: dict[str, list[int]] = {}
    for b in program.blocks:
        t = b.terminator
        if isinstance(t, ir.PushJump):
            returns.setdefault(program.owners[t.target], []).append(t.return_to)
    return returns


def liveness(program: ir.Program) -> ir.Program:
    """Return ``program`` with its ``liveness`` analysis attached (input unchanged)."""
    table: dict[Any, Any] = {}
    if not program.lowered:
        for f in program.functions.values():
            live_in, after = block_liveness(f.blocks, lambda i, f=f: ir.successors(
                f.blocks[i].terminator))
            table.update({(f.name, i): s for i, s in enumerate(live_in)})
            table.update({(f.name, i, k): s for (i, k), s in after.items()})
    else:
        returns = _return_edges(program)

        def succ(i: int) -> Sequence[int]:
            t = program.blocks[i].terminator
            if isinstance(t, ir.Return):
                return returns.get(program.owners[i], [])
            return ir.successors(t)

        live_in, _ = block_liveness(program.blocks, succ)
        table.update(dict(enumerate(live_in)))
    return dataclasses.replace(program, liveness=table)
