"""The vectorizer itself: invariance (§3.4), graph walk, registry size, convert_graph."""
import numpy as np
import tensorflow as tf

import tfx_vec
from tfx_vec.pfor import registry
from tfx_vec.pfor.registry import WrappedTensor
from tfx_vec.pfor.trace import trace_function
from tfx_vec.pfor.vectorizer import Vectorizer
from tests.pfor.oracle import check_pfor
from tests.support import random_array

R = np.random.default_rng(9)


def arr(*shape):
    return tf.constant(random_array(R, shape, np.float32))


def op_types(fn) -> list[str]:
    return [op.type for op in tf.function(fn).get_concrete_function().graph.get_operations()]


def test_registry_covers_many_op_types():
    import tfx_vec.pfor.converters.array_ops as array_ops
    import tfx_vec.pfor.converters.math_ops as math_ops
    types = registry.registered_op_types()
    mine = [t for t in types if registry.defined_in(t) in (math_ops.__name__, array_ops.__name__)]
    assert len(mine) >= 150, len(mine)
    assert len(types) >= 150
    assert registry.DUPLICATES == []


def test_loop_invariant_values_are_never_tiled():
    x, w, b = arr(6, 4), arr(4, 3), arr(3)

    def body(i):
        h = tf.reshape(tf.gather(x, i), [2, 2])            # stacked reshape: no tile
        inv = tf.tanh(w) * 2.0 + b                          # invariant: emitted once
        return tf.reshape(h, [1, 4]) @ inv + tf.reduce_sum(inv)
    types = op_types(lambda: tfx_vec.pfor(body, 6))
    assert "Tile" not in types and "TensorListReserve" not in types and "While" not in types
    assert types.count("Tanh") == 1
    check_pfor(body, 6, modes=("eager",))


def test_invariant_outputs_are_tiled_only_at_the_end():
    w = arr(3)
    types = op_types(lambda: tfx_vec.pfor(lambda i: tf.exp(w), 5))
    assert types.count("Tile") == 1 and types.count("Exp") == 1


def test_unused_ops_are_not_converted():
    x = arr(3, 5)

    def body(i):
        tf.histogram_fixed_width(tf.gather(x, i), [-1.0, 1.0])   # dead, and has no converter
        return tf.gather(x, i) + 1.0
    tfx_vec.reset_fallbacks()
    tfx_vec.pfor(body, 3, fallback_to_while_loop=False)
    assert dict(tfx_vec.fallback_report()) == {}


def test_invariant_cond_is_reemitted_with_its_functions():
    x, flag = arr(4, 2), tf.constant(True)

    def body(i):
        scale = tf.cond(flag, lambda: tf.constant(2.0), lambda: tf.constant(3.0))
        return tf.gather(x, i) * scale
    check_pfor(body, 4, modes=("eager", "function"))


def test_convert_graph_binds_inputs_and_captures():
    w = arr(3)
    traced = trace_function(lambda a, b: (a * w + b, b * 2.0),
                            [tf.TensorSpec([3], tf.float32), tf.TensorSpec([], tf.float32)])
    xs = arr(5, 3)

    @tf.function
    def run(xs):
        vec = Vectorizer(5, fallback_to_while_loop=False, randomness="same", xla=False)
        assert vec.randomness == "same" and not vec.xla
        inputs = [WrappedTensor(xs, True), WrappedTensor(tf.constant(1.5), False)]
        out, inv = vec.convert_graph(traced.graph, inputs + traced.capture_inputs())
        assert out.is_stacked and not inv.is_stacked
        return out.t, inv.t
    out, inv = run(xs)
    np.testing.assert_allclose(out.numpy(), xs.numpy() * w.numpy() + 1.5, rtol=1e-6)
    assert inv.numpy() == 3.0


def test_loop_index_arithmetic_and_shapes_from_index():
    x = arr(5, 4)
    check_pfor(lambda i: tf.gather(x, (i * 3 + 1) % 5)[: 2] * tf.cast(i, tf.float32), 5)


def test_nested_pfor():
    x = arr(3, 4)
    check_pfor(lambda i: tfx_vec.pfor(lambda j: tf.gather(tf.gather(x, i), j) * 2.0, 4), 3,
               modes=("eager", "function"))


def test_ops_are_walked_in_dependency_order_not_creation_order():
    """A while loop's gradient adds accumulator outputs to the forward While op after their
    consumers exist, so creation order is not topological."""
    xs, w = arr(4, 3), arr(3)

    def body(i):
        x = tf.gather(xs, i)
        with tf.GradientTape() as tape:
            tape.watch(x)
            _, h = tf.while_loop(lambda t, h: t < 3, lambda t, h: (t + 1, tf.tanh(h * w)),
                                 (0, x))
            loss = tf.reduce_sum(h * h)
        return tape.gradient(loss, x)
    check_pfor(body, 4, modes=("eager", "function"), fallback_to_while_loop=True)
