"""Block merging: if-conversion, chain merging and loop-test duplication of per-member scalar
code; every merged program checked against the per-member reference on every runtime that
runs the stack machine."""
import io

import numpy as np
import pytest
import tensorflow as tf

from tests.autobatch.passes.helpers import check_pure, function_ir
from tests.autobatch.programs import collatz, fib, reference
from tfx_vec import autobatch as ab
from tfx_vec.autobatch import ir
from tfx_vec.autobatch.passes import lower, merge_blocks, static_returns
from tfx_vec.autobatch.types import infer_types, qualified_types, spec_of

RUNTIMES = [{"runtime": "numpy"}, {}, {"jit_compile": True},
            {"jit_compile": True, "scheduler": "sweep_guarded"}, {"scheduler": "sweep"}]


def _as_run(fn, *args):
    """The stack-machine program the program-counter runtime runs for ``args``."""
    types = qualified_types(infer_types(fn.program(), tuple(spec_of(a) for a in args)))
    return fn.lowered(types)


def _predicated(program):
    return [op for b in program.blocks for op in b.ops
            if isinstance(op, ir.Primitive) and op.when]


@ab.function
def nested_branches(a, b):
    """Nested diamonds in a loop; ``t`` is written on every path and read after the join."""
    total = tf.zeros_like(a)
    while a > 0:
        if a % 3 == 0:
            if b > 2:
                t = a * b
            else:
                t = a - b
        else:
            t = a + 1
        total += t
        a -= 1
    return total


@ab.function
def rewrites_its_condition(x, c):
    """The arm writes the branch condition: predicating it on ``c`` would read the new value."""
    n = tf.zeros_like(x)
    while x > 0:
        if c:
            c = x % 2 == 0
            n += 2
        x -= 1
    return n


@ab.function
def damped(x, k):
    """Arms update a [B, 3] vector: not per-member scalars, so they keep their blocks."""
    while k > 0:
        if tf.reduce_sum(x, -1) > 0:
            x = x * 0.5
        else:
            x = x + 1.0
        k -= 1
    return x


def _ints(seed, size, lo, hi):
    return tf.constant(np.random.default_rng(seed).integers(lo, hi, size=size), tf.int32)


def test_collatz_loop_becomes_one_self_looping_block():
    n = _ints(0, 13, 1, 60)
    low = static_returns(lower(function_ir(collatz)))
    merged = check_pure(lambda p: merge_blocks(p, cheap=lambda v: True), low)
    assert len(low.blocks) == 7 and len(merged.blocks) == 3
    loops = [i for i, b in enumerate(merged.blocks)
             if isinstance(b.terminator, ir.Branch) and i in (b.terminator.true,
                                                              b.terminator.false)]
    assert len(loops) == 1
    assert {op.text for op in _predicated(merged)} == {"n = n // 2", "n = 3 * n + 1"}
    assert {op.when for op in _predicated(merged)} == {(("collatz._ab_t1", True),),
                                                       (("collatz._ab_t1", False),)}
    assert len(_as_run(collatz, n).blocks) == 3


@pytest.mark.parametrize("opts", RUNTIMES, ids=str)
def test_collatz_merged_matches_the_reference(opts):
    n = _ints(1, 37, 1, 200)
    np.testing.assert_array_equal(collatz(n, **opts), reference(collatz, n))


@pytest.mark.parametrize("opts", RUNTIMES, ids=str)
def test_nested_branches_get_conjoined_predicates(opts):
    a, b = _ints(2, 29, -2, 12), _ints(3, 29, -3, 6)
    program = _as_run(nested_branches, a, b)
    assert max(len(op.when) for op in _predicated(program)) == 2
    np.testing.assert_array_equal(nested_branches(a, b, **opts),
                                  reference(nested_branches, a, b))


@pytest.mark.parametrize("opts", RUNTIMES, ids=str)
def test_an_arm_writing_its_condition_is_not_predicated_on_it(opts):
    x = _ints(4, 23, 0, 9)
    c = tf.constant(np.random.default_rng(5).random(23) < 0.5)
    program = _as_run(rewrites_its_condition, x, c)
    assert all("rewrites_its_condition.c" not in dict(op.when) for op in _predicated(program))
    np.testing.assert_array_equal(rewrites_its_condition(x, c, **opts),
                                  reference(rewrites_its_condition, x, c))


@pytest.mark.parametrize("opts", RUNTIMES, ids=str)
def test_vector_arms_keep_their_blocks(opts):
    rng = np.random.default_rng(6)
    x = tf.constant(rng.normal(size=(17, 3)), tf.float32)
    k = _ints(7, 17, 0, 6)
    program = _as_run(damped, x, k)
    writers = [(i, op) for i, b in enumerate(program.blocks) for op in b.ops
               if isinstance(op, ir.Primitive) and "damped.x" in op.outputs]
    assert len(writers) == 2 and not any(op.when for _, op in writers)
    assert len({i for i, _ in writers}) == 2  # each arm still its own block
    np.testing.assert_allclose(damped(x, k, **opts), reference(damped, x, k), rtol=1e-6)


def test_recursion_blocks_with_stacks_only_absorb():
    # fib's base case returns and its recursive case calls: different terminators, no merge;
    # nothing with a push or pop moves.
    n = _ints(8, 9, 0, 12)
    program = _as_run(fib, n)
    assert ir.format_program(program) == ir.format_program(fib.lowered())
    np.testing.assert_array_equal(fib(n, runtime="numpy"), reference(fib, n))


def test_without_types_nothing_merges_and_describe_takes_example_arguments():
    low = static_returns(lower(function_ir(collatz)))
    assert merge_blocks(low, cheap=None).blocks == low.blocks
    out = io.StringIO()
    text = ab.describe(collatz, _ints(9, 4, 1, 9), file=out)
    assert "block merging: 7 -> 3 blocks (1 branches if-converted" in text
    assert "when collatz._ab_t1" in text and text == out.getvalue()


def test_redecorating_an_ab_function_uses_its_python_function():
    again = ab.function(collatz, max_steps=7)
    assert again.options["max_steps"] == 7
    n = _ints(10, 5, 1, 30)
    np.testing.assert_array_equal(again(n, max_steps=1000), reference(collatz, n))
