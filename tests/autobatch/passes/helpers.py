"""Shared helpers for the pass tests."""
from tfx_vec.autobatch import ir
from tfx_vec.autobatch.frontend import compile_program


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
    return compile_program(fn)
