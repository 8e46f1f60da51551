"""Compiler passes, one per module, each ``Program -> Program`` (never mutating its input).

:func:`function_pipeline` runs on the Function IR that every runtime runs: jump threading
over flags, then tail calls.
:func:`pipeline` is the one place the chain to the stack machine is written:
liveness -> lowering -> stack elision -> pop/push fusion -> static returns -> result forwarding
-> block merging -> layout -> allocation.

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

from typing import Callable

from .. import ir
from .allocation import allocate
from .forward_result import forward_result
from .fuse_pop_push import fuse_pop_push
from .layout import LAYOUTS, layout
from .liveness import liveness
from .lowering import lower
from .merge_blocks import merge_blocks
from .stack_elision import elide_stacks
from .static_returns import static_returns
from .tail_calls import tail_calls
from .thread_jumps import thread_jumps

__all__ = ["function_pipeline", "pipeline", "thread_jumps", "tail_calls", "liveness", "lower",
           "elide_stacks", "fuse_pop_push", "static_returns", "forward_result", "merge_blocks",
           "layout", "LAYOUTS", "allocate"]

FUNCTION_STAGES = (thread_jumps, tail_calls)
STAGES = (liveness, lower, elide_stacks, fuse_pop_push, static_returns, forward_result,
          merge_blocks, layout, allocate)


def function_pipeline(program: ir.Program) -> ir.Program:
    """Function IR -> Function IR: what every runtime runs (branches that flags decide are
    skipped, self tail calls become loops)."""
    for stage in FUNCTION_STAGES:
        program = stage(program)
    return program


def pipeline(program: ir.Program, *, block_layout: str = "source",
             cheap: Callable[[str], bool] | None = None) -> ir.Program:
    """Function IR -> optimized, allocated stack-machine IR.

    ``block_layout``: see :data:`LAYOUTS`.  ``cheap(variable)``: is it a per-member scalar (from
    the types of one input signature)?  Without it, blocks are not merged.
    """
    options = {layout: {"rule": block_layout}, merge_blocks: {"cheap": cheap}}
    for stage in STAGES:
        program = stage(program, **options.get(stage, {}))
    return program
