"""Pop-push fusion (the paper's optimization 5).

Between two calls in one source block, lowering emits ``pop v ... push v``.  Within a block:

* neither read nor written in between: both vanish (the stack slot already holds ``v``);
* read (before any write) in between: ``pop`` becomes ``peek`` (reload the top, keep the
  pointer) and the ``push`` vanishes when ``v`` is not written;
* written in between: ``push`` becomes ``update`` (store the new value in the top slot in place).

Precondition: a lowered program.

Example:
    >>> from tfx_vec import autobatch as ab
    >>> from tfx_vec.autobatch.frontend import compile_program
    >>> from tfx_vec.autobatch.passes.lowering import lower
    >>> @ab.function
    ... def f(n):
    ...     if n <= 0:
    ...         return n
    ...     a = f(n - 1)
    ...     b = f(n - 1)
    ...     return a + b + n
    >>> [type(op).__name__ for op in fuse_pop_push(lower(compile_program(f))).blocks[3].ops]
    ['Peek', 'Primitive', 'Primitive', 'Push', 'Primitive']
"""
from __future__ import annotations

import dataclasses

from .. import ir

__all__ = ["fuse_pop_push"]


def _fuse_block(ops: tuple) -> tuple[tuple, int]:
    ops = list(ops)
    fused = 0
    for i, op in enumerate(ops):
        if not isinstance(op, ir.Pop):
            continue
        v = op.var
        j = next((j for j in range(i + 1, len(ops))
                  if isinstance(ops[j], ir.Push) and ops[j].var == v), None)
        if j is None:
            continue
        read_first = written = False
        for mid in ops[i + 1:j]:
            if v in ir.reads(mid) and not written:
                read_first = True
            if v in ir.writes(mid):
                written = True
        ops[i] = ir.Peek(v) if read_first else None
        ops[j] = ir.Update(v) if written else None
        fused += 1
    return tuple(op for op in ops if op is not None), fused


def fuse_pop_push(program: ir.Program) -> ir.Program:
    """Fuse ``pop v ... push v`` inside blocks into ``peek``/``update`` (or nothing)."""
    if not program.lowered:
        raise ValueError("fuse_pop_push: the program must be lowered first")
    blocks, total = [], 0
    for b in program.blocks:
        ops, n = _fuse_block(b.ops)
        total += n
        blocks.append(dataclasses.replace(b, ops=ops))
    return dataclasses.replace(program, blocks=tuple(blocks), liveness={}, notes=program.notes + (
        f"pop-push fusion: {total} pop/push pairs fused into peek/update (optimization 5)",))
