"""Block merging: fewer, larger blocks where the code is cheap per-member scalar arithmetic.

Each block the program-counter runtime visits costs a loop step (earliest-block scheduler) or
one masked pass over the batch (sweeps), and each variable live between blocks is carried in
the runtime's state.  A loop like Collatz's (test, branch, two arms, join, back to the test)
is six blocks per iteration straight out of lowering.  Three rewrites, applied to a fixed
point, make it one:

* **if-conversion** (predication): a branch whose arms are straight-line primitives meeting
  at the same place (both arms end with the same terminator: a *diamond*; or one arm jumps to
  the other: a *triangle*) becomes one block.  Each arm's primitives carry a predicate
  (:attr:`ir.Primitive.when`: the branch condition and its polarity) and write their outputs
  only for the members whose condition matches.
* **chain merging**: a block that jumps to a block nothing else reaches absorbs it.
* **loop-test duplication** (loop rotation): a jump to a small block of primitives ending in a
  branch (a loop's test) is replaced by a copy of it, so a loop body tests and branches back
  to itself; the test block disappears once no jump reaches it.

No member computes anything new: the runtimes evaluate a block's primitives on the whole batch
and mask the results, so both arms of a branch already ran on every member whenever their
block ran.  What changes is *when* code runs, which matters for expensive code: merging a
model gradient into a cheap block would run it in more loop steps, or with fewer members.
So only primitives whose every variable (inputs, outputs, predicates) is a per-member scalar
(``cheap``) move; blocks with stack operations may absorb cheap blocks but never move.
Variables' shapes come from type inference, so the pass runs per input signature (see
:meth:`tfx_vec.autobatch.AutobatchFunction.lowered`).  Not one of the paper's five
optimizations: classic if-conversion and block merging from vectorizing compilers.

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec import autobatch as ab
    >>> from tfx_vec.autobatch import ir
    >>> from tfx_vec.autobatch.frontend import compile_program
    >>> from tfx_vec.autobatch.passes import lower
    >>> @ab.function
    ... def halve_or_bump(n):
    ...     while n > 1:
    ...         if n % 2 == 0:
    ...             n = n // 2
    ...         else:
    ...             n = 3 * n + 1
    ...     return n
    >>> low = lower(compile_program(halve_or_bump))
    >>> merged = merge_blocks(low, cheap=lambda v: True)
    >>> len(low.blocks), len(merged.blocks)
    (6, 3)
    >>> print(ir.format_program(merged).splitlines()[7])
          halve_or_bump.n = prim(halve_or_bump.n) when halve_or_bump._ab_t1  # n = n // 2
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from .. import ir
from .layout import renumber

__all__ = ["merge_blocks", "MAX_DUPLICATED_OPS"]

# A loop test is copied into each block that jumps to it: only small ones (a comparison or two).
MAX_DUPLICATED_OPS = 4


def _live_blocks(program: ir.Program, blocks: list[ir.Block]) -> list[int]:
    """Blocks reachable from the functions' entries (calls and returns included), in order."""
    seen, todo = set(), list(program.entries.values())
    while todo:
        i = todo.pop()
        if i in seen or i >= len(blocks):
            continue
        seen.add(i)
        todo.extend(ir.transfers(blocks[i].terminator))
    return sorted(seen)


def _references(program: ir.Program, blocks: list[ir.Block], live: list[int]
                ) -> dict[int, list[tuple[str, int | None]]]:
    """For each live block, how it is reached: ``(kind, from block)``, kind one of
    ``jump``, ``branch``, ``call``, ``return``, ``entry``."""
    refs: dict[int, list[tuple[str, int | None]]] = {i: [] for i in live}
    for i in set(program.entries.values()) & set(refs):
        refs[i].append(("entry", None))
    for i in live:
        t = blocks[i].terminator
        edges = []
        if isinstance(t, ir.Jump):
            edges = [("jump", t.target)]
        elif isinstance(t, ir.Branch):
            edges = [("branch", t.true), ("branch", t.false)]
        elif isinstance(t, ir.PushJump):
            edges = [("call", t.target), ("return", t.return_to)]
        elif isinstance(t, ir.Return) and t.target is not None:
            edges = [("return", t.target)]
        for kind, j in edges:
            if j in refs:
                refs[j].append((kind, i))
    return refs


class _Merger:
    """The three rewrites over a mutable block list (see the module docstring)."""

    def __init__(self, program: ir.Program, cheap: Callable[[str], bool]):
        self.program, self.cheap = program, cheap
        self.blocks = list(program.blocks)
        self.counts = {"if-converted": 0, "absorbed": 0, "tests duplicated": 0}

    def movable(self, block: ir.Block) -> bool:
        """Only cheap primitives move (their predicates' variables included)."""
        return all(isinstance(op, ir.Primitive) and all(
            self.cheap(v) for v in ir.reads(op) + ir.writes(op)) for op in block.ops)

    def if_convert(self, i: int, refs: dict) -> bool:
        t = self.blocks[i].terminator
        if not isinstance(t, ir.Branch) or t.true == t.false or i in (t.true, t.false):
            return False

        def arm(j: int) -> ir.Block | None:
            b = self.blocks[j]
            ok = (refs.get(j) == [("branch", i)] and self.movable(b) and self.cheap(t.cond)
                  and not isinstance(b.terminator, ir.Branch)
                  and not any(t.cond in ir.writes(op) for op in b.ops))
            return b if ok else None

        yes, no = arm(t.true), arm(t.false)
        if yes and no and yes.terminator == no.terminator and not (
                isinstance(yes.terminator, ir.Jump) and yes.terminator.target in (i, t.true,
                                                                                  t.false)):
            ops, end = _predicated(yes, t.cond, True) + _predicated(no, t.cond, False), \
                yes.terminator
        elif yes and yes.terminator == ir.Jump(t.false):
            ops, end = _predicated(yes, t.cond, True), yes.terminator
        elif no and no.terminator == ir.Jump(t.true):
            ops, end = _predicated(no, t.cond, False), no.terminator
        else:
            return False
        return self._extend(i, ops, end, "if-converted")

    def absorb(self, i: int, refs: dict) -> bool:
        j = self._jumps_to(i)
        if j is None or refs.get(j) != [("jump", i)] or not self.movable(self.blocks[j]):
            return False
        return self._extend(i, self.blocks[j].ops, self.blocks[j].terminator, "absorbed")

    def duplicate_test(self, i: int, refs: dict) -> bool:
        j = self._jumps_to(i)
        if j is None:
            return False
        test = self.blocks[j]
        if (not isinstance(test.terminator, ir.Branch) or len(test.ops) > MAX_DUPLICATED_OPS
                or not self.movable(test)
                or any(kind not in ("jump", "branch") or k == j for kind, k in refs[j])):
            # (a test that branches reach too stays, for them)
            return False
        return self._extend(i, test.ops, test.terminator, "tests duplicated")

    def _jumps_to(self, i: int) -> int | None:
        """The block ``i`` jumps to, unless it is ``i`` itself or ``i`` does not jump."""
        t = self.blocks[i].terminator
        return t.target if isinstance(t, ir.Jump) and t.target != i else None

    def _extend(self, i: int, ops: tuple, terminator, rewrite: str) -> bool:
        b = self.blocks[i]
        self.blocks[i] = dataclasses.replace(b, ops=b.ops + tuple(ops), terminator=terminator)
        self.counts[rewrite] += 1
        return True

    def run(self) -> list[int]:
        """Rewrite to a fixed point; return the blocks still reachable."""
        rewrites = (self.if_convert, self.absorb, self.duplicate_test)
        while True:
            live = _live_blocks(self.program, self.blocks)
            refs = _references(self.program, self.blocks, live)
            if not any(rewrite(i, refs) for i in live for rewrite in rewrites):
                return live


def _predicated(block: ir.Block, cond: str, polarity: bool) -> tuple:
    """``block``'s primitives, each to write only where ``cond`` is ``polarity``."""
    return tuple(dataclasses.replace(op, when=((cond, polarity),) + op.when)
                 for op in block.ops)


def merge_blocks(program: ir.Program, *, cheap: Callable[[str], bool] | None) -> ir.Program:
    """Merge blocks of cheap primitives (see the module docstring).

    ``cheap(variable)``: is it a per-member scalar?  ``None`` (types unknown): no change.
    """
    if not program.lowered:
        raise ValueError("merge_blocks: the program must be lowered first")
    if cheap is None:
        return dataclasses.replace(program, notes=program.notes + (
            "block merging: per input signature (needs the variables' shapes)",))
    merger = _Merger(program, cheap)
    live = merger.run()
    merged = renumber(dataclasses.replace(program, blocks=tuple(merger.blocks)), live)
    c = merger.counts
    return dataclasses.replace(merged, notes=program.notes + (
        f"block merging: {len(program.blocks)} -> {len(merged.blocks)} blocks "
        f"({c['if-converted']} branches if-converted, {c['absorbed']} blocks absorbed by their "
        f"only predecessor, {c['tests duplicated']} loop tests duplicated into their jumps)",))
