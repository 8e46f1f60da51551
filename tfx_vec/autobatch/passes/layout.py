"""Block layout: in a recursive function, the blocks that continue after a call come first.

The earliest-block scheduler runs the lowest-numbered block some member waits at, and the
sweep schedulers run blocks in index order, so the order of the flat block list is a schedule.
Source order puts a recursive function's entry (the *descent*: test, first call) before its
continuations (the *climb*: merge the callee's result, call again, return).  Then members
climbing back out of a call wait behind every member still descending, each level of a climb
costs a full descent pass of the others, and a recursive program takes O(climb x descent)
steps between the evaluations it synchronizes on (NUTS: 17 loop steps per gradient at 30
chains).  This pass lays out each recursive function as: the blocks reachable from each call
continuation without passing another call (later calls' continuations first, each group in
source order), then the rest (the entry's segment) in source order, so climbing members catch
up before descending ones run (rule ``"continuations_first"``; the default rule
``"source"`` keeps the lowering's order: which is faster depends on the program and the
scheduler, e.g. NUTS gains, fib under the sweep schedulers does not).  Non-recursive
functions keep source order; ``entries``,
``owners`` and every block reference are renumbered (the program entry is
``entries[main]``, no longer necessarily block 0).

Example:
    >>> from tfx_vec import autobatch as ab
    >>> from tfx_vec.autobatch.frontend import compile_program
    >>> from tfx_vec.autobatch.passes import lower
    >>> @ab.function
    ... def fib(n):
    ...     if n <= 1:
    ...         return n
    ...     return fib(n - 2) + fib(n - 1)
    >>> [b.name for b in layout(lower(compile_program(fib)), rule="continuations_first").blocks]
    ['fib.2/2', 'fib.2/1', 'fib.0', 'fib.1', 'fib.2']
"""
from __future__ import annotations

import dataclasses

from .. import ir

__all__ = ["layout", "block_order", "renumber", "LAYOUTS"]

LAYOUTS = ("source", "continuations_first")


def _recursive(program: ir.Program) -> set[str]:
    """Functions that can call themselves, directly or through others."""
    callee_of = {entry: name for name, entry in program.entries.items()}
    calls: dict[str, set[str]] = {name: set() for name in program.entries}
    for owner, b in zip(program.owners, program.blocks):
        if isinstance(b.terminator, ir.PushJump):
            calls[owner].add(callee_of[b.terminator.target])
    recursive = set()
    for f in calls:
        seen, todo = set(), list(calls[f])
        while todo:
            g = todo.pop()
            if g not in seen:
                seen.add(g)
                todo.extend(calls[g])
        if f in seen:
            recursive.add(f)
    return recursive


def _segment(program: ir.Program, start: int, owner: str) -> set[int]:
    """Blocks of ``owner`` reachable from ``start`` without passing a call."""
    seen, todo = set(), [start]
    while todo:
        i = todo.pop()
        if i in seen or program.owners[i] != owner:
            continue
        seen.add(i)
        t = program.blocks[i].terminator
        if not isinstance(t, ir.PushJump):
            todo.extend(ir.successors(t))
    return seen


def block_order(program: ir.Program) -> list[int]:
    """The new position -> old block index (see the module docstring for the rule)."""
    recursive = _recursive(program)
    order: list[int] = []
    for name in dict.fromkeys(program.owners):
        mine = [i for i, owner in enumerate(program.owners) if owner == name]
        if name not in recursive:
            order += mine
            continue
        placed: list[int] = []
        continuations = [program.blocks[i].terminator.return_to for i in mine
                         if isinstance(program.blocks[i].terminator, ir.PushJump)]
        for k in reversed(continuations):
            group = _segment(program, k, name)
            placed += [i for i in mine if i in group and i not in placed]
        order += placed + [i for i in mine if i not in placed]
    return order


def renumber(program: ir.Program, order: list[int]) -> ir.Program:
    """Reorder the blocks of a lowered program (``order``: new position -> old index; blocks
    left out must be unreachable)."""
    new = {old: pos for pos, old in enumerate(order)}
    new[len(program.blocks)] = len(order)  # halt stays halt

    def move(t):
        if isinstance(t, ir.Jump):
            return dataclasses.replace(t, target=new[t.target])
        if isinstance(t, ir.Branch):
            return dataclasses.replace(t, true=new[t.true], false=new[t.false])
        if isinstance(t, ir.PushJump):
            return dataclasses.replace(t, target=new[t.target], return_to=new[t.return_to])
        if isinstance(t, ir.Return) and t.target is not None:
            return dataclasses.replace(t, target=new[t.target])
        return t
    blocks = tuple(dataclasses.replace(program.blocks[old], terminator=move(
        program.blocks[old].terminator)) for old in order)
    return dataclasses.replace(
        program, blocks=blocks, owners=tuple(program.owners[old] for old in order),
        entries={name: new[i] for name, i in program.entries.items()}, liveness={})


def layout(program: ir.Program, *, rule: str = "source") -> ir.Program:
    """Lay out the blocks of a lowered program by ``rule`` (one of :data:`LAYOUTS`)."""
    if not program.lowered:
        raise ValueError("layout: the program must be lowered first")
    if rule not in LAYOUTS:
        raise ValueError(f"unknown block layout {rule!r}; choose one of {LAYOUTS}")
    if rule == "source":
        return dataclasses.replace(program, notes=program.notes + ("layout: source order",))
    order = block_order(program)
    moved = sum(1 for pos, old in enumerate(order) if pos != old)
    return dataclasses.replace(renumber(program, order), notes=program.notes + (
        f"layout: continuations first, {moved} blocks moved (recursive functions: call "
        "continuations before the entry, so climbing members run before descending ones)",))
