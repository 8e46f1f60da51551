import numpy as np
import pytest
import tensorflow as tf

from tests.autobatch.passes.helpers import check_pure, function_ir, ops_of
from tests.autobatch.programs import reference
from tfx_vec import autobatch as ab
from tfx_vec.autobatch import ir
from tfx_vec.autobatch.passes import elide_stacks, fuse_pop_push, lower


@ab.function
def tree(n, x):
    if n <= 0:
        return x
    a = tree(n - 1, x + 1)
    x = x * 2
    b = tree(n - 1, x)
    return a + b + x


def test_pop_then_push_become_peek_and_update():
    low = elide_stacks(lower(function_ir(tree)))
    out = check_pure(fuse_pop_push, low)
    # x is read (x * 2) then written between the calls: pop -> peek, push -> update.
    # n is not live after the second call, so its pop stays unfused.
    assert {op.var for op in ops_of(out, ir.Peek)} == {"tree.x"}
    assert {op.var for op in ops_of(out, ir.Update)} == {"tree.x"}
    assert {op.var for op in ops_of(out, ir.Pop)} == {"tree.n", "tree.x", "tree.a"}
    assert len(ops_of(out, ir.Pop)) < len(ops_of(low, ir.Pop))
    assert "fused" in out.notes[-1]


@pytest.mark.parametrize("runtime", ["numpy", "program_counter"])
def test_fused_program_matches_reference(runtime):
    n = tf.constant([0, 3, 1, 4, 2])
    x = tf.constant([1.5, -2.0, 0.5, 3.0, -1.0])
    np.testing.assert_allclose(tree(n, x, runtime=runtime), reference(tree, n, x), rtol=1e-6)
