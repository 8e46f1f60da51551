"""Local-static runtime (Algorithm 1): masked, gathered and hybrid (XLA per primitive)."""
import numpy as np
import pytest
import tensorflow as tf

from tests.autobatch.programs import fib, reference
from tfx_vec import autobatch as ab


@pytest.mark.parametrize("mode", [{}, {"gather": True}, {"xla_blocks": True}])
def test_fib_matches_per_member_reference(mode):
    x = tf.constant([3, 7, 4, 5, 0, 1])
    np.testing.assert_array_equal(fib(x, runtime="local_static", **mode).numpy(),
                                  reference(fib, x))


@ab.function
def forever(n):
    while n > 0:
        n = n + 1
    return n


@pytest.mark.parametrize("runtime", ["local_static", "numpy", "program_counter"])
def test_non_terminating_member_hits_max_steps(runtime):
    with pytest.raises(ab.MaxStepsExceededError, match="max_steps=40"):
        forever(tf.constant([0, 2, -1]), runtime=runtime, max_steps=40)


@pytest.mark.parametrize("runtime", ["local_static", "numpy"])
def test_stack_overflow_is_an_error(runtime):
    with pytest.raises(ab.StackOverflowError, match="max_stack_depth=4"):
        fib(tf.constant([2, 9]), runtime=runtime, max_stack_depth=4)


def test_hybrid_compiles_each_primitive_once_across_calls():
    counts = []
    for values in ([3, 7, 4], [2, 5, 6]):
        x = tf.constant(values)
        np.testing.assert_array_equal(fib(x, runtime="local_static", xla_blocks=True).numpy(),
                                      reference(fib, x))
        jitted = fib._compiled["local_static_xla"]
        counts.append({k: f.experimental_get_tracing_count() for k, f in jitted.items()})
    assert counts[0] and counts[0] == counts[1]  # the second call compiled nothing
