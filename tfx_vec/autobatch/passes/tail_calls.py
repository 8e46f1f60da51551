"""Self tail calls become loops (Function IR, before lowering; every runtime benefits).

``return f(a, b)`` inside ``f`` itself -- after the front end, a block whose last op is
``r = call f(a, b)`` and whose terminator returns ``r`` -- becomes ``a, b = a', b'`` (one
parallel move into the parameters) and a jump back to ``f``'s entry.  Nothing is pushed, so the
recursion depth of a tail-recursive function no longer counts against ``max_stack_depth``, and
the local-static runtime does not recurse in Python.  A tail-recursive function whose only
recursion is in tail position ends up with no calls to itself at all, and so (stack elision)
without variable stacks.  Calls to *other* functions in tail position are kept as calls: their
result lives in the callee's result variable.

Example:
    >>> from tfx_vec import autobatch as ab
    >>> from tfx_vec.autobatch import ir
    >>> from tfx_vec.autobatch.frontend import compile_program
    >>> @ab.function
    ... def iota_sum(n, acc):
    ...     if n <= 0:
    ...         return acc
    ...     return iota_sum(n - 1, acc + n)
    >>> f = tail_calls(compile_program(iota_sum)).functions["iota_sum"]
    >>> [type(op).__name__ for b in f.blocks for op in b.ops if isinstance(op, ir.Call)]
    []
    >>> f.blocks[-1].terminator
    Jump(target=0)
"""
from __future__ import annotations

import dataclasses

from .. import ir

__all__ = ["tail_calls"]


def tail_calls(program: ir.Program) -> ir.Program:
    """Turn self tail calls of every function into jumps to its entry (see module doc)."""
    if program.lowered:
        raise ValueError("tail_calls: runs on the Function IR, before lowering")
    functions, count = {}, 0
    for name, f in program.functions.items():
        blocks = list(f.blocks)
        for i, b in enumerate(blocks):
            t, last = b.terminator, b.ops[-1] if b.ops else None
            if (isinstance(t, ir.Return) and isinstance(last, ir.Call) and last.callee == name
                    and last.output == t.value):
                blocks[i] = dataclasses.replace(
                    b, ops=b.ops[:-1] + (ir.move(f.params, last.args, last.loc),),
                    terminator=ir.Jump(0))
                count += 1
        functions[name] = dataclasses.replace(f, blocks=tuple(blocks))
    return dataclasses.replace(program, functions=functions, notes=program.notes + (
        f"tail calls: {count} self calls in tail position became jumps to the entry",))
