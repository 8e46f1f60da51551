"""Local-static runtime (Algorithm 1): masked, gathered and hybrid (XLA per primitive)."""
import numpy as np
import pytest
import tensorflow as tf

from tests.autobatch.programs import fib, reference


@pytest.mark.parametrize("mode", [{}, {"gather": True}, {"xla_blocks": True}])
def test_fib_matches_per_member_reference(mode):
    x = tf.constant([3, 7, 4, 5, 0, 1])
    np.testing.assert_array_equal(fib(x, runtime="local_static", **mode).numpy(),
                                  reference(fib, x))
