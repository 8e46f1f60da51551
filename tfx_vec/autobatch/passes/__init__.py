"""Compiler passes, one per module, each ``Program -> Program`` (never mutating its input).

:func:`pipeline` is the one place the chain is written:
liveness -> lowering -> stack elision -> pop/push fusion -> static returns -> layout ->
allocation.

Example:
    >>> from tfx_vec import autobatch as ab
    >>> from tfx_vec.autobatch.frontend import compile_program
    >>> @ab.function
    ... def f(x):
    ...     return x + 1
    >>> pipeline(compile_program(f)).lowered
    True
"""
from __future__ import annotations

from .. import ir
from .allocation import allocate
from .fuse_pop_push import fuse_pop_push
from .layout import LAYOUTS, layout
from .liveness import liveness
from .lowering import lower
from .stack_elision import elide_stacks
from .static_returns import static_returns

__all__ = ["pipeline", "liveness", "lower", "elide_stacks", "fuse_pop_push", "static_returns",
           "layout", "LAYOUTS", "allocate"]

STAGES = (liveness, lower, elide_stacks, fuse_pop_push, static_returns, layout, allocate)


def pipeline(program: ir.Program, *, block_layout: str = "source") -> ir.Program:
    """Function IR -> optimized, allocated stack-machine IR (``block_layout``: see
    :data:`LAYOUTS`)."""
    for stage in STAGES:
        program = stage(program, rule=block_layout) if stage is layout else stage(program)
    return program
