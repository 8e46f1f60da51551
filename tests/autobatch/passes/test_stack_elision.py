import pytest

from tests.autobatch.passes.helpers import check_pure, function_ir, ops_of
from tests.autobatch.programs import clamp_abs, fib
from tfx_vec.autobatch import ir
from tfx_vec.autobatch.passes import elide_stacks, lower


def test_non_recursive_calls_lose_their_stacks():
    low = lower(function_ir(clamp_abs))
    out = check_pure(elide_stacks, low)
    assert ops_of(out, ir.Push) == [] and ops_of(out, ir.Pop) == []
    assert ops_of(low, ir.Push)  # lowering alone did save x around the call


def test_recursive_calls_keep_their_stacks():
    low = lower(function_ir(fib))
    assert ops_of(elide_stacks(low), ir.Push) == ops_of(low, ir.Push)


def test_rejects_unlowered_input():
    with pytest.raises(ValueError, match="lowered"):
        elide_stacks(function_ir(fib))
