import numpy as np
import pytest
import tensorflow as tf

from tests.autobatch.passes.helpers import check_pure, function_ir
from tests.autobatch.programs import CASES, collatz, fib, reference
from tfx_vec import autobatch as ab
from tfx_vec.autobatch import ir
from tfx_vec.autobatch.passes import layout, lower, static_returns
from tfx_vec.autobatch.passes.layout import block_order


def _lowered(fn):
    return static_returns(lower(function_ir(fn)))


def test_recursive_function_puts_continuations_first_and_renumbers_everything():
    low = _lowered(fib)
    out = check_pure(lambda p: layout(p, rule="continuations_first"), low)
    order = block_order(low)
    assert sorted(order) == list(range(len(low.blocks)))
    assert [b.name for b in out.blocks] == ["fib.2/2", "fib.2/1", "fib.0", "fib.1", "fib.2"]
    assert out.entries["fib"] == order.index(low.entries["fib"]) == 2
    # every reference points at the block it pointed at before
    names_before = [b.name for b in low.blocks]
    for b_old, b_new in zip((low.blocks[i] for i in order), out.blocks):
        old_t, new_t = b_old.terminator, b_new.terminator
        for field in ("target", "true", "false", "return_to"):
            if getattr(old_t, field, None) is not None:
                assert out.blocks[getattr(new_t, field)].name == names_before[getattr(old_t, field)]


def test_non_recursive_programs_and_the_source_rule_keep_the_order():
    low = _lowered(collatz)
    assert [b.name for b in layout(low, rule="continuations_first").blocks] == \
        [b.name for b in low.blocks]
    assert layout(_lowered(fib)).blocks == _lowered(fib).blocks


def test_bad_rule_and_unlowered_input_are_errors():
    with pytest.raises(ValueError, match="unknown block layout"):
        layout(_lowered(fib), rule="random")
    with pytest.raises(ValueError, match="lowered"):
        layout(function_ir(fib))
    with pytest.raises(ab.AutobatchError, match="block_layout"):
        ab.function(lambda n: n, block_layout="random")


@pytest.mark.parametrize("name,fn,make", CASES, ids=[c[0] for c in CASES])
def test_every_corpus_program_is_unchanged_by_the_layout(name, fn, make):
    relaid = ab.function(fn._autobatch_python_fn, block_layout="continuations_first",
                         max_stack_depth=fn.options["max_stack_depth"])
    args = make(np.random.default_rng(len(name) + 1), 9)
    want = reference(fn, *args)
    for opts in ({"runtime": "numpy"}, {"scheduler": "earliest"},
                 {"jit_compile": True, "scheduler": "sweep_guarded"}):
        got = relaid(*args, **opts)
        for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6, err_msg=str(opts))
    assert any("layout: continuations first" in n for n in relaid.lowered().notes)
