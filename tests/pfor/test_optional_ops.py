"""tf.experimental.Optional values inside a loop body."""
import tensorflow as tf

from tfx_vec.pfor.converters import optional_ops  # noqa: F401  (the converters under test)
from tests.pfor.oracle import check_pfor


def test_optional_from_value_and_get_value():
    x = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])

    def loop_fn(i):
        opt = tf.experimental.Optional.from_value((tf.gather(x, i), i + 1, tf.constant(3)))
        a, b, c = opt.get_value()
        return a * tf.cast(b + c, tf.float32), opt.has_value()
    check_pfor(loop_fn, 3)
