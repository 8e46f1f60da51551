import pytest

from tests.autobatch.passes.helpers import check_pure, function_ir, ops_of
from tests.autobatch.programs import fib, is_even
from tfx_vec.autobatch import ir
from tfx_vec.autobatch.passes import lower


def test_fib_lowers_to_push_pop_pushjump():
    low = check_pure(lower, function_ir(fib))
    assert low.lowered and low.entries == {"fib": 0}
    assert [b.name for b in low.blocks] == ["fib.0", "fib.1", "fib.2", "fib.2/1", "fib.2/2"]
    assert {op.var for op in ops_of(low, ir.Push)} == {"fib._ab_t3", "fib._ab_t4"}
    assert sorted(op.var for op in ops_of(low, ir.Pop)) == ["fib._ab_t3", "fib._ab_t4"]
    pushjumps = [b.terminator for b in low.blocks if isinstance(b.terminator, ir.PushJump)]
    assert [(t.target, t.return_to) for t in pushjumps] == [(0, 3), (0, 4)]


def test_mutual_recursion_merges_functions_main_first():
    low = lower(function_ir(is_even))
    assert list(low.entries) == ["is_even", "is_odd"]
    assert low.owners[0] == "is_even" and low.owners[-1] == "is_odd"


def test_rejects_lowered_input():
    with pytest.raises(ValueError, match="already lowered"):
        lower(lower(function_ir(fib)))
