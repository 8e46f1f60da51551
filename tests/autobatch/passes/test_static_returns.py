import numpy as np
import pytest
import tensorflow as tf

from tests.autobatch.passes.helpers import check_pure, function_ir
from tests.autobatch.programs import clamp_abs, fib, is_even, reference, square
from tfx_vec import autobatch as ab
from tfx_vec.autobatch import ir
from tfx_vec.autobatch.passes import elide_stacks, lower, static_returns


def _lowered(fn):
    return elide_stacks(lower(function_ir(fn)))


def _terminators(program, kind):
    return [(program.owners[i], b.terminator) for i, b in enumerate(program.blocks)
            if isinstance(b.terminator, kind)]


def test_single_call_sites_return_statically_and_push_nothing():
    out = check_pure(static_returns, _lowered(clamp_abs))
    halt = len(out.blocks)
    returns = dict(_terminators(out, ir.Return))
    (_, call), = _terminators(out, ir.PushJump)
    assert returns["clamp_abs"].target == halt
    assert returns["square"].target == call.return_to and not call.push


def test_recursive_functions_keep_the_program_counter_stack():
    out = static_returns(_lowered(fib))
    assert all(t.target is None for _, t in _terminators(out, ir.Return))
    assert all(t.push for _, t in _terminators(out, ir.PushJump))


def test_mutual_recursion_only_the_single_site_callee_is_static():
    out = static_returns(_lowered(is_even))
    targets = {owner: t.target for owner, t in _terminators(out, ir.Return)}
    assert targets["is_even"] is None and targets["is_odd"] is not None
    pushes = {out.owners[t.target]: t.push for _, t in _terminators(out, ir.PushJump)}
    assert pushes == {"is_even": True, "is_odd": False}


@ab.function
def sum_of_squares(n):
    total = tf.zeros_like(n)
    while n > 0:
        total += square(n)  # one call site, called a data-dependent number of times
        n -= 1
    return total


@pytest.mark.parametrize("opts", [{"runtime": "numpy"}, {"jit_compile": True},
                                  {"scheduler": "sweep_guarded"}], ids=str)
def test_a_static_callee_called_in_a_loop_matches_the_reference(opts):
    assert "static returns: 2 of 2 functions" in "\n".join(sum_of_squares.lowered().notes)
    n = tf.constant(np.random.default_rng(3).integers(0, 9, size=11), tf.int32)
    np.testing.assert_array_equal(sum_of_squares(n, **opts), reference(sum_of_squares, n))


def test_rejects_unlowered_input():
    with pytest.raises(ValueError, match="lowered"):
        static_returns(function_ir(fib))
