import pytest

from tests.autobatch.passes.helpers import check_pure, function_ir
from tests.autobatch.programs import clamp_abs, fib
from tfx_vec.autobatch import ir
from tfx_vec.autobatch.passes import allocate, lower, pipeline


def test_fib_allocation_classes():
    alloc = check_pure(allocate, lower(function_ir(fib))).allocation
    assert alloc == {"fib.n": ir.STACK, "fib._ab_c1": ir.TEMPORARY, "fib._ab_ret": ir.REGISTER,
                     "fib._ab_t2": ir.TEMPORARY, "fib._ab_r3": ir.STACK,
                     "fib._ab_t4": ir.TEMPORARY, "fib._ab_r5": ir.TEMPORARY}


def test_non_recursive_program_has_registers_and_temporaries_only():
    alloc = pipeline(function_ir(clamp_abs)).allocation
    assert set(alloc.values()) == {ir.REGISTER, ir.TEMPORARY}
    assert alloc["clamp_abs.x"] == ir.REGISTER  # live across the call to square


def test_rejects_unlowered_input():
    with pytest.raises(ValueError, match="lowered"):
        allocate(function_ir(fib))
