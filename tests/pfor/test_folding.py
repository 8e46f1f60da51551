"""Folded values stay folded (``folded_form`` / ``map_folded`` in ``converters/_helpers.py``).

An op run on iteration-folded inputs (``Conv2D`` on ``[n*b, h, w, c]``) has its output
unfolded to ``[n, b, ...]``; the next bias add, relu, pooling or convolution works on the folded
value behind that reshape instead of on a 5-D tensor, so the vectorized graph holds
``Conv2D -> BiasAdd -> Relu`` on 4-D tensors and grappler fuses it exactly as in hand-batched
code.  Every case is checked element for element against the per-iteration oracle (all modes,
including a run-time loop length); structural tests check the graph and grappler's fusion.
"""
from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
from tensorflow.python.grappler import tf_optimizer

import tfx_vec
from tfx_vec.pfor.converters._helpers import fold_batch, folded_form, map_folded, unfold_batch
from tests.pfor.oracle import check_pfor
from tests.support import random_array

RNG = np.random.default_rng(77)


def rand(*shape: int) -> np.ndarray:
    return random_array(RNG, shape, np.float32, -1.0, 1.0)


def convnet(k1, b1, k2, b2, w3, b3):
    """Conv-bias-relu-pool twice, then a dense layer, written for one batch of images."""
    def features(x):
        h = tf.nn.max_pool2d(tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, k1, 1, "SAME"), b1)),
                             2, 2, "VALID")
        h = tf.nn.max_pool2d(tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(h, k2, 1, "SAME"), b2)),
                             2, 2, "VALID")
        h = tf.reshape(h, [tf.shape(h)[0], -1])
        return tf.nn.relu(h @ w3 + b3)
    return features


def small_convnet(hw: int = 8, c: int = 2):
    consts = [rand(3, 3, c, 4), rand(4), rand(3, 3, 4, 3), rand(3), rand((hw // 4) ** 2 * 3, 5),
              rand(5)]
    return convnet(*[tf.constant(a) for a in consts])


# {{{ the helpers

def test_folded_form_recognises_unfolding_reshapes_only():
    with tf.Graph().as_default():
        x = tf.constant(rand(6, 4, 3))
        folded = tf.reshape(x, [2, 3, 4, 3])                # [n*b, *rest] -> [n, b, *rest]
        assert folded_form(folded) is x
        flat, lead = fold_batch(folded)
        assert flat is x                                    # no second reshape
        assert tf.get_static_value(lead).tolist() == [2, 3]
        assert folded_form(tf.reshape(x, [6, 2, 2, 3])) is None   # rest differs
        assert folded_form(tf.reshape(x, [6, 12])) is None         # not one rank more
        assert folded_form(tf.identity(folded)) is None            # not a reshape
        dynamic = tf.compat.v1.placeholder(tf.float32, [None, 4, 3])
        lead_dyn = tf.constant([2, 3])
        unfolded = unfold_batch(dynamic, lead_dyn)
        assert folded_form(unfolded) is dynamic
        assert map_folded(tf.identity(folded), tf.nn.relu) is None


def test_map_folded_is_exact():
    x = rand(6, 4, 3)

    @tf.function
    def run(v):
        t = tf.reshape(v, [2, 3, 4, 3])
        assert map_folded(tf.reshape(t, [6, 4, 3]), tf.nn.relu) is None   # [N, ...] has none
        return map_folded(t, lambda f: tf.nn.bias_add(f, tf.constant([1.0, 2.0, 3.0])))
    out = run(tf.constant(x)).numpy()
    assert out.shape == (2, 3, 4, 3)
    np.testing.assert_array_equal(out, x.reshape(2, 3, 4, 3) + np.float32([1.0, 2.0, 3.0]))
    assert map_folded(tf.reshape(tf.constant(x), [2, 3, 4, 3]), tf.nn.relu) is None  # eager

# }}}


# {{{ results: every element against the per-iteration oracle

@settings(max_examples=4)
@given(iters=st.integers(1, 4), batch=st.integers(1, 3), hw=st.sampled_from([4, 8]),
       c=st.integers(1, 3))
def test_convnet_matches_per_iteration(iters, batch, hw, c):
    features = small_convnet(hw, c)
    images = tf.constant(rand(iters, batch, hw, hw, c))
    check_pfor(lambda i: features(tf.gather(images, i)), iters, rtol=1e-4, atol=1e-4)


def test_single_example_convnet_matches_hand_batched():
    """The benchmark's shape: the model written for one image, batch axis added inside."""
    features = small_convnet()
    images = tf.constant(rand(5, 8, 8, 2))
    one = lambda x: features(x[tf.newaxis])[0]  # noqa: E731
    check_pfor(lambda i: one(tf.gather(images, i)), 5, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tfx_vec.vectorized_map(one, images).numpy(),
                               features(images).numpy(), rtol=1e-4, atol=1e-4)


def test_ops_that_must_not_fold_stay_exact():
    """An invariant operand spanning the per-iteration batch axis, a shape-changing bitcast, and
    a channels-first bias add all read a folded value; none may be run on the folded form."""
    images = tf.constant(rand(3, 2, 4, 4, 2))
    k = tf.constant(rand(3, 3, 2, 4))
    per_row = tf.constant(rand(2, 4, 4, 4))                 # shaped like one iteration's batch
    bias = tf.constant(rand(4))

    def conv(i):
        return tf.nn.conv2d(tf.gather(images, i), k, 1, "SAME")
    check_pfor(lambda i: conv(i) * per_row, 3)
    # Bytes compare exactly only for exact sums: integer-valued images and filter (a batched
    # convolution may add in another order than one iteration's).
    whole = lambda i: tf.nn.conv2d(tf.round(tf.gather(images, i) * 8.0), tf.round(k * 8.0), 1,
                                   "SAME")  # noqa: E731
    check_pfor(lambda i: tf.bitcast(whole(i), tf.uint8), 3)
    check_pfor(lambda i: tf.nn.bias_add(tf.transpose(conv(i), [0, 3, 1, 2]), bias,
                                        data_format="NCHW"), 3)
    check_pfor(lambda i: tf.nn.relu(conv(i)) + bias, 3)

# }}}


# {{{ structure: the chain stays 4-D and grappler fuses it

def _vectorized_graph(features, n: int = 4) -> tf.types.experimental.ConcreteFunction:
    one = lambda x: features(x[tf.newaxis])[0]  # noqa: E731
    f = tf.function(lambda xs: tfx_vec.vectorized_map(one, xs))
    return f.get_concrete_function(tf.TensorSpec([n, 8, 8, 2], tf.float32))


def test_conv_bias_relu_pool_chain_is_four_d():
    graph = _vectorized_graph(small_convnet()).graph
    ops = {t: [op for op in graph.get_operations() if op.type == t]
           for t in ("Conv2D", "BiasAdd", "Relu", "MaxPool")}
    assert [len(ops[t]) for t in ("Conv2D", "BiasAdd", "MaxPool")] == [2, 2, 2], ops
    producer = {"BiasAdd": "Conv2D", "MaxPool": "Relu"}
    for t, src in producer.items():
        for op in ops[t]:
            assert op.inputs[0].op.type == src, f"{op.name} reads {op.inputs[0].op.type}"
            assert op.inputs[0].shape.rank == 4
    assert ops["Conv2D"][1].inputs[0].op.type == "MaxPool"
    assert sum(op.inputs[0].op.type == "BiasAdd" for op in ops["Relu"]) == 2
    adds = [op for op in graph.get_operations() if op.type == "AddV2"]
    assert any(op.inputs[0].op.type == "MatMul" for op in adds)   # dense bias on [n*b, 5]


def _optimized_op_types(concrete) -> collections.Counter:
    """Op types after grappler's default CPU pipeline (the one tf.function runs)."""
    graph_def = concrete.graph.as_graph_def()
    for node in graph_def.node:
        node.device = "/job:localhost/replica:0/task:0/device:CPU:0"
    meta = tf.compat.v1.train.export_meta_graph(graph_def=graph_def, graph=concrete.graph)
    fetch = meta_graph_pb2.CollectionDef()
    fetch.node_list.value.extend(t.name for t in concrete.outputs)
    meta.collection_def["train_op"].CopyFrom(fetch)
    optimized = tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), meta)
    return collections.Counter(n.op for n in optimized.node)


def test_grappler_fuses_as_in_hand_batched_code():
    features = small_convnet()
    ours = _optimized_op_types(_vectorized_graph(features))
    hand = _optimized_op_types(
        tf.function(features).get_concrete_function(tf.TensorSpec([4, 8, 8, 2], tf.float32)))
    assert hand["_FusedConv2D"] == 2, hand
    assert ours["_FusedConv2D"] == hand["_FusedConv2D"], ours
    assert ours["Conv2D"] == ours["BiasAdd"] == 0, ours

# }}}
