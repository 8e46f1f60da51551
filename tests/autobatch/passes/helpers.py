"""Shared helpers for the pass tests."""
from tfx_vec.autobatch import ir
from tfx_vec.autobatch.frontend import compile_program
from tfx_vec.autobatch.passes import function_pipeline


def ops_of(program, kind):
    return [op for b in program.blocks for op in b.ops if isinstance(op, kind)]


def check_pure(stage, program):
    """Run a pass and check it did not mutate its input (its printed form is unchanged)."""
    before = ir.format_program(program)
    out = stage(program)
    assert ir.format_program(program) == before
    assert out is not program
    return out


def function_ir(fn):
    """The Function IR every runtime runs (front end, jump threading, tail calls)."""
    return function_pipeline(compile_program(fn))
