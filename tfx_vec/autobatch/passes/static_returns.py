"""Static return addresses: a function called from one place returns there without the
program-counter stack.

Lowering makes every call a ``pushjump`` (push the return address, jump to the callee) and
every return a pop of that stack.  When all of a function's callers are one ``pushjump`` (or,
for ``main``, no ``pushjump`` at all: it returns to *halt*), the return address is a constant:
its ``return`` blocks jump there directly (``Return.target``) and the call stores nothing
(``PushJump.push=False``).  The runtimes then skip a stack read per return and a stack write
per call -- a gather and a scatter over the batch per loop step on the program-counter runtime.
Not one of the paper's five optimizations; it is the classic "return to a known continuation".

Example:
    >>> from tfx_vec import autobatch as ab
    >>> from tfx_vec.autobatch import ir
    >>> from tfx_vec.autobatch.frontend import compile_program
    >>> from tfx_vec.autobatch.passes import lower
    >>> @ab.function
    ... def double(x):
    ...     return 2 * x
    >>> @ab.function
    ... def main(x):
    ...     return double(x) + 1
    >>> low = static_returns(lower(compile_program(main)))
    >>> [line.strip() for line in ir.format_program(low).splitlines() if "return" in line]
    ['jump (return address static) double.0 then main.0/1', 'return to halt', 'return to main.0/1']
"""
from __future__ import annotations

import dataclasses

from .. import ir

__all__ = ["static_returns", "return_addresses"]


def return_addresses(program: ir.Program) -> dict[str, set[int]]:
    """Every block each function can return to (``len(program.blocks)`` is *halt*)."""
    found: dict[str, set[int]] = {name: set() for name in program.entries}
    found[program.main].add(len(program.blocks))
    callee_of = {entry: name for name, entry in program.entries.items()}
    for b in program.blocks:
        t = b.terminator
        if isinstance(t, ir.PushJump):
            found[callee_of[t.target]].add(t.return_to)
    return found


def static_returns(program: ir.Program) -> ir.Program:
    """Give functions with a single return address static returns and push-free calls."""
    if not program.lowered:
        raise ValueError("static_returns: the program must be lowered first")
    single = {name: next(iter(addrs)) for name, addrs in return_addresses(program).items()
              if len(addrs) == 1}
    callee_of = {entry: name for name, entry in program.entries.items()}
    blocks = []
    for owner, b in zip(program.owners, program.blocks):
        t = b.terminator
        if isinstance(t, ir.Return) and owner in single:
            t = dataclasses.replace(t, target=single[owner])
        elif isinstance(t, ir.PushJump) and callee_of[t.target] in single:
            t = dataclasses.replace(t, push=False)
        blocks.append(dataclasses.replace(b, terminator=t))
    return dataclasses.replace(program, blocks=tuple(blocks), notes=program.notes + (
        f"static returns: {len(single)} of {len(program.entries)} functions return to a single "
        "address (no program-counter stack traffic for their calls and returns)",))
