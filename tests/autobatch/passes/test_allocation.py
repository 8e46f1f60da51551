import pytest

from tests.autobatch.passes.helpers import check_pure, function_ir
from tests.autobatch.programs import clamp_abs, fib
from tfx_vec.autobatch import ir
from tfx_vec.autobatch.passes import allocate, lower, pipeline


def test_fib_allocation_classes():
    alloc = check_pure(allocate, lower(function_ir(fib))).allocation
    # n - 1 (t3) is saved around the first call, its result (t4) around the second
    assert alloc == {"fib.n": ir.REGISTER, "fib._ab_t1": ir.TEMPORARY,
                     "fib.retval_": ir.REGISTER, "fib._ab_t2": ir.TEMPORARY,
                     "fib._ab_t3": ir.STACK, "fib._ab_t4": ir.STACK, "fib._ab_t5": ir.TEMPORARY}


def test_non_recursive_program_has_registers_and_temporaries_only():
    alloc = pipeline(function_ir(clamp_abs)).allocation
    assert set(alloc.values()) == {ir.REGISTER, ir.TEMPORARY}
    assert alloc["clamp_abs.x"] == ir.REGISTER  # live across the call to square


def test_rejects_unlowered_input():
    with pytest.raises(ValueError, match="lowered"):
        allocate(function_ir(fib))
