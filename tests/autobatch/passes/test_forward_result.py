"""Result forwarding: main's final copy into its result variable is dropped when every return
copies the same variable and nothing calls main."""
import numpy as np
import pytest
import tensorflow as tf

from tests.autobatch.passes.helpers import check_pure, function_ir
from tests.autobatch.programs import clamp_abs, collatz, fib, reference
from tfx_vec import autobatch as ab
from tfx_vec.autobatch import ir
from tfx_vec.autobatch.passes import forward_result, lower, static_returns


def _forwarded(fn):
    return check_pure(forward_result, static_returns(lower(function_ir(fn))))


@ab.function
def two_exits(n):
    """Two returns of the same variable, one of them early."""
    total = tf.zeros_like(n)
    while n > 0:
        if n == 7:
            return total
        total += n
        n -= 1
    return total


@ab.function
def returns_different_variables(n):
    m = n * 2
    if n > 3:
        return m
    return n


@ab.function
def returns_an_expression(n):
    return n + 1


def test_collatz_returns_its_step_counter():
    out = _forwarded(collatz)
    assert out.result == "collatz.steps"
    assert not any("collatz.retval_" in ir.writes(op) for b in out.blocks for op in b.ops)


def test_every_return_copying_the_same_variable_is_dropped():
    out = _forwarded(two_exits)
    assert out.result == "two_exits.total"
    assert "two_exits.retval_" not in out.variables()


def test_main_calling_others_still_forwards_its_own_result():
    assert _forwarded(clamp_abs).result == "clamp_abs.y"
    x = tf.constant(np.random.default_rng(13).normal(size=11) * 2, tf.float32)
    np.testing.assert_allclose(clamp_abs(x, jit_compile=True), reference(clamp_abs, x),
                               rtol=1e-6)


@pytest.mark.parametrize("fn", [returns_different_variables, returns_an_expression, fib],
                         ids=lambda f: f.__name__)
def test_not_applicable_keeps_the_result_variable(fn):
    out = _forwarded(fn)
    assert out.result == f"{fn.__name__}.retval_"
    assert "result forwarding: not applicable" in out.notes


@pytest.mark.parametrize("opts", [{"runtime": "numpy"}, {}, {"jit_compile": True},
                                  {"jit_compile": True, "scheduler": "sweep_guarded"}], ids=str)
@pytest.mark.parametrize("fn", [two_exits, returns_different_variables],
                         ids=lambda f: f.__name__)
def test_forwarded_programs_match_the_reference(fn, opts):
    n = tf.constant(np.random.default_rng(12).integers(-2, 15, size=19), tf.int32)
    np.testing.assert_array_equal(fn(n, **opts), reference(fn, n))
