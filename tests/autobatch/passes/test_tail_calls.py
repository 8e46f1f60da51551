"""Self tail calls become loops: no stack for them on any runtime."""
import numpy as np
import pytest

from tests.autobatch.passes.helpers import check_pure, function_ir
from tests.autobatch.programs import fib, on_every_runtime, reference
from tfx_vec import autobatch as ab
from tfx_vec.autobatch import ir
from tfx_vec.autobatch.frontend import compile_program
from tfx_vec.autobatch.passes import tail_calls, thread_jumps


@ab.function
def iota_sum(n, acc):
    if n <= 0:
        return acc
    else:
        return iota_sum(n - 1, acc + n)


@ab.function
def gcd(a, b):
    if a == 0:
        return b
    elif a <= b:
        return gcd(a, b - a)
    return gcd(b, a)  # the parameters swap: one parallel move


def test_self_tail_calls_leave_no_call():
    # (jump threading first: the return converter's flags put gcd's first recursive call
    # before a guard on do_return, which threading resolves into a return)
    out = check_pure(tail_calls, thread_jumps(compile_program(gcd)))
    f = out.functions["gcd"]
    assert not any(isinstance(op, ir.Call) for b in f.blocks for op in b.ops)
    jumps = [b.terminator for b in f.blocks if b.terminator == ir.Jump(0)]
    assert len(jumps) == 2
    assert "tail calls: 2 self calls" in out.notes[-1]


def test_no_stack_and_no_program_counter_push():
    low = iota_sum.lowered()
    assert ir.STACK not in low.allocation.values()
    assert not any(isinstance(b.terminator, ir.PushJump) for b in low.blocks)


@pytest.mark.parametrize("fn,args", [
    (iota_sum, (np.array([12, -13, 100], np.int32), np.array([0, 0, 0], np.int32))),
    (gcd, (np.array([7, 12, 49, 0], np.int32), np.array([9, 9, 56, 4], np.int32))),
], ids=["iota_sum", "gcd"])
def test_deep_tail_recursion_at_a_small_stack_depth(fn, args):
    want = reference(fn, *args)
    for name, got in on_every_runtime(fn, *args, max_stack_depth=3).items():
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_calls_not_in_tail_position_stay_calls():
    f = function_ir(fib).functions["fib"]
    assert sum(isinstance(op, ir.Call) for b in f.blocks for op in b.ops) == 2


def test_rejects_lowered_input():
    with pytest.raises(ValueError, match="Function IR"):
        tail_calls(fib.lowered())
