"""Jump threading over AutoGraph's flags: early returns, breaks and continues jump straight
where they go, and flags that end up constant disappear."""
import numpy as np
import pytest

from tests.autobatch.passes.helpers import check_pure
from tests.autobatch.programs import first_divisor, nested_loops, on_every_runtime, reference
from tfx_vec import autobatch as ab
from tfx_vec.autobatch import ir
from tfx_vec.autobatch.frontend import compile_program
from tfx_vec.autobatch.passes import thread_jumps
from tfx_vec.autobatch.passes.thread_jumps import evaluate


def _flags(f):
    return {v for b in f.blocks for op in b.ops for v in ir.writes(op)
            if v.startswith(("do_return", "break_", "continue_"))}


@pytest.mark.parametrize("fn", [first_divisor, nested_loops], ids=lambda f: f.__name__)
def test_the_converters_flags_are_gone(fn):
    before = compile_program(fn)
    after = check_pure(thread_jumps, before)
    assert _flags(before.functions[fn.__name__])
    assert not _flags(after.functions[fn.__name__])
    assert len(after.functions[fn.__name__].blocks) < len(before.functions[fn.__name__].blocks)


def test_an_early_return_in_a_loop_returns_from_its_block():
    f = thread_jumps(compile_program(first_divisor)).functions["first_divisor"]
    returning = [b for b in f.blocks if isinstance(b.terminator, ir.Return)]
    assert len(returning) == 2 and all(b.ops for b in returning)


@ab.function
def search(x, target):
    found = False
    i = 0
    while i < 10 and not found:
        if x * i == target:
            found = True
        i += 1
    return i, found


def test_a_user_flag_read_by_the_loop_stays():
    f = thread_jumps(compile_program(search)).functions["search"]
    assert "found" in _reads(f)
    x, t = np.array([2, 3, 5], np.int32), np.array([8, 7, 0], np.int32)
    want = reference(search, x, t)
    for name, got in on_every_runtime(search, x, t).items():
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w, err_msg=name)


def _reads(f):
    return {v for b in f.blocks for op in b.ops for v in ir.reads(op)}


def test_three_valued_evaluation():
    f = ("and", ("?",), ("not", ("var", "do_return")))
    assert evaluate(f, {"do_return": True}) is False
    assert evaluate(f, {"do_return": False}) is None
    assert evaluate(("or", ("var", "a"), ("?",)), {"a": True}) is True
    assert evaluate(("const", True), {}) is True
