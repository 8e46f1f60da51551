"""nn converters (``tfx_vec/pfor/converters/nn_ops.py``) against the per-iteration oracle.

Every case runs under every stacked/invariant combination of its inputs (never all
invariant) with random shapes and values, fallback disabled, every output element compared.
Structural tests check the formulation (one convolution, no loop) where it is the point.
"""
from __future__ import annotations

import collections
from typing import Callable

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import tfx_vec
from tests.pfor.oracle import assert_all_close, check_op, reference
from tests.support import random_array

RNG = np.random.default_rng(2024)


# {{{ helpers shared by the converter test files

def rand(*shape: int, low: float = -2.0, high: float = 2.0, dtype=np.float32) -> np.ndarray:
    """Random values without zeros (see ``tests.support.random_array``)."""
    return random_array(RNG, shape, dtype, low, high)


def together(**ops: Callable) -> Callable:
    """One op computing several: ``together(a=f, b=g)(*args) == {"a": f(*args), ...}``.

    A table of ops with the same input shapes is then vectorized in one trace per
    stacked/invariant combination, which keeps the suite fast; every output is compared.
    """
    return lambda *args: {name: fn(*args) for name, fn in ops.items()}


def pfor_op_types(loop_fn: Callable, iters: int) -> collections.Counter:
    """Op types (with multiplicity) of the vectorized graph, nested functions included."""
    fn = tf.function(lambda: tfx_vec.pfor(loop_fn, iters, fallback_to_while_loop=False))
    graph_def = fn.get_concrete_function().graph.as_graph_def()
    nodes = list(graph_def.node)
    for f in graph_def.library.function:
        nodes.extend(f.node_def)
    return collections.Counter(n.op for n in nodes)


def gathered(stack: np.ndarray) -> Callable:
    """``i -> stack[i]`` as a TF op on a closed-over constant."""
    t = tf.constant(stack)
    return lambda i: tf.gather(t, i)

# }}}


# {{{ convolutions

CONV_CASES = {
    "same_stride1": dict(x=(2, 7, 6, 3), f=(3, 3, 3, 4), strides=1, padding="SAME"),
    "valid_stride2": dict(x=(1, 9, 8, 2), f=(2, 3, 2, 3), strides=2, padding="VALID"),
    "explicit_dilated": dict(x=(2, 6, 7, 2), f=(2, 2, 2, 3), strides=1,
                             padding=[[0, 0], [1, 2], [2, 0], [0, 0]], dilations=2),
    "grouped": dict(x=(1, 5, 5, 4), f=(3, 3, 2, 4), strides=1, padding="SAME"),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv2d(case):
    c = dict(CONV_CASES[case])
    x, f = rand(*c.pop("x")), rand(*c.pop("f"))
    check_op(lambda a, b: tf.nn.conv2d(a, b, **c), [x, f], rtol=1e-4, atol=1e-4)


def test_depthwise_conv2d():
    x, f = rand(2, 6, 5, 3), rand(3, 2, 3, 2)
    check_op(lambda a, b: tf.nn.depthwise_conv2d(a, b, [1, 2, 2, 1], "SAME"), [x, f],
             rtol=1e-4, atol=1e-4)
    # Unequal strides: TensorFlow's CPU kernel without oneDNN refuses them, XLA takes them.
    check_op(lambda a, b: tf.nn.depthwise_conv2d(a, b, [1, 2, 1, 1], "SAME"), [x, f],
             rtol=1e-4, atol=1e-4, modes=("xla",))
    check_op(lambda a, b: tf.nn.depthwise_conv2d(a, b, [1, 1, 1, 1], "VALID",
                                                 dilations=[2, 1]), [x, f],
             rtol=1e-4, atol=1e-4)


def test_conv3d():
    x, f = rand(1, 4, 5, 4, 2), rand(2, 2, 3, 2, 3)
    conv = lambda a, b: tf.nn.conv3d(a, b, [1, 1, 2, 1, 1], "SAME")  # noqa: E731
    check_op(conv, [x, f], rtol=1e-4, atol=1e-4, combos=[(True, False), (False, True)])
    # Per-iteration images and filters need a grouped 3-D convolution, which TF lacks.
    xs, fs = gathered(np.stack([x, x])), gathered(np.stack([f, f]))
    with pytest.raises(tfx_vec.VectorizationError, match="Conv3D"):
        tfx_vec.pfor(lambda i: conv(xs(i), fs(i)), 2, fallback_to_while_loop=False)


def test_conv2d_is_one_op_without_tiling():
    """Paper §3.4: stacked images, invariant filter -> ONE Conv2D on [n*b, ...], no loop."""
    xs, f = gathered(rand(5, 2, 6, 6, 3)), tf.constant(rand(3, 3, 3, 4))
    fs = gathered(rand(5, 3, 3, 3, 4))
    for body in (lambda i: tf.nn.conv2d(xs(i), f, 1, "SAME"),
                 lambda i: tf.nn.conv2d(xs(i), fs(i), 1, "SAME")):
        types = pfor_op_types(body, 5)
        assert types["Conv2D"] == 1, types
        assert not {"While", "StatelessWhile", "Tile"} & set(types), types


@settings(max_examples=6)
@given(data=st.data())
def test_conv2d_random_shapes(data):
    """Random shapes, strides, dilations, paddings and stacked/invariant operands."""
    b, h, w, ci, co = (data.draw(st.integers(1, 4)) for _ in range(5))
    kh, kw = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    stride = data.draw(st.integers(1, 2))
    dilation = 1 if stride > 1 else data.draw(st.integers(1, 2))
    padding = data.draw(st.sampled_from(["SAME", "VALID"]))
    if padding == "VALID":
        h, w = h + (kh - 1) * dilation, w + (kw - 1) * dilation
    combo = data.draw(st.sampled_from([(True, False), (False, True), (True, True)]))
    check_op(lambda a, f: tf.nn.conv2d(a, f, stride, padding, dilations=dilation),
             [rand(b, h, w, ci), rand(kh, kw, ci, co)], combos=[combo], modes=("eager",),
             rtol=1e-4, atol=1e-4)


def test_empty_loop():
    """iters == 0: no kernel runs on zero channels/groups; outputs are [0, ...]."""
    x, f = gathered(rand(2, 1, 5, 5, 2)), gathered(rand(2, 3, 3, 2, 3))
    x0, f0 = tf.constant(rand(1, 5, 5, 2)), tf.constant(rand(3, 3, 2, 3))
    bodies = {"conv": lambda i: tf.nn.conv2d(x(i), f(i), 1, "SAME"),
              "conv_filter": lambda i: tf.nn.conv2d(x0, f(i), 1, "SAME"),
              "depthwise": lambda i: tf.nn.depthwise_conv2d(x(i), f(i), [1] * 4, "SAME"),
              "batch_norm": lambda i: tf.compat.v1.nn.fused_batch_norm(
                  x(i), f0[0, 0, :, 0], f0[0, 0, :, 1])}
    for name, body in bodies.items():
        out = tfx_vec.pfor(body, 0, fallback_to_while_loop=False)
        ref = body(tf.constant(0))
        for o, r in zip(tf.nest.flatten(out), tf.nest.flatten(ref)):
            assert o.shape.as_list() == [0] + r.shape.as_list(), name


def test_run_time_loop_length():
    """Channel/group folding with ``iters`` a run-time tensor, one iteration, and chunks."""
    ops = together(conv=lambda a, f: tf.nn.conv2d(a, f, 1, "SAME"),
                   conv_grouped=lambda a, f: tf.nn.conv2d(tf.concat([a, a], -1), f, 1, "VALID"),
                   depthwise=lambda a, f: tf.nn.depthwise_conv2d(a, f, [1] * 4, "SAME"),
                   batch_norm=lambda a, f: tf.compat.v1.nn.fused_batch_norm(
                       a, f[0, 0, :, 0], f[0, 0, :, 1]))
    for combo in [(True, True), (False, True)]:
        check_op(ops, [rand(2, 4, 4, 2), rand(2, 2, 2, 2, low=0.5)], combos=[combo],
                 modes=("dynamic", "one", "chunked"), rtol=1e-4, atol=1e-4)


def test_static_shapes_survive_a_run_time_loop_length():
    """Outputs keep the per-iteration static shape, so later converters need no fallback."""
    xs, fs = gathered(rand(3, 2, 5, 5, 2)), gathered(rand(3, 3, 3, 2, 4))
    shapes = []

    @tf.function
    def run(n):
        out = tfx_vec.pfor(lambda i: tf.nn.conv2d(xs(i), fs(i), 1, "SAME"), n,
                           fallback_to_while_loop=False)
        shapes.append(out.shape.as_list())
        return out
    run(tf.constant(3))
    assert shapes == [[None, 2, 5, 5, 4]]


def test_folded_formulations_compile_with_xla():
    """Grouped/depthwise/batch-norm folds inside ``tf.function(jit_compile=True)``."""
    xs, fs = gathered(rand(3, 2, 5, 5, 2)), gathered(rand(3, 3, 3, 2, 4))

    def body(i):
        x, f = xs(i), fs(i)
        return {"conv": tf.nn.conv2d(x, f, 1, "SAME"),
                "depthwise": tf.nn.depthwise_conv2d(x, f[..., :2], [1] * 4, "VALID"),
                "batch_norm": tf.compat.v1.nn.fused_batch_norm(x, f[0, 0, :, 0],
                                                               f[0, 0, :, 1])[0]}
    compiled = tf.function(lambda: tfx_vec.pfor(body, 3, fallback_to_while_loop=False),
                           jit_compile=True)
    assert_all_close(compiled(), reference(body, 3), 1e-4, 1e-4, "jit_compile")


def check_channels_first(op: Callable[[str], Callable], arrays, images_in, images_out,
                         combos, iters: int = 3, rtol: float = 1e-4, atol: float = 1e-4):
    """An NCHW op against the oracle of its NHWC twin (NCHW kernels do not run on CPU).

    ``op(data_format)`` gives the op; ``arrays`` are NHWC.  The NCHW loop body transposes
    the ``images_in`` operands to NCHW and the ``images_out`` results back, so only the
    channels-last rewrite of the per-iteration filter cases can make it run.
    """
    to_first, to_last = [0, 3, 1, 2], [0, 2, 3, 1]
    stacks = [np.stack([a] + [a * RNG.uniform(0.5, 1.5, a.shape).astype(a.dtype)
                              for _ in range(iters - 1)]) for a in arrays]
    for combo in combos:
        def args(i, combo=combo):
            return [tf.gather(s, i) if st else tf.constant(a)
                    for st, s, a in zip(combo, stacks, arrays)]

        def nchw_body(i):
            xs = [tf.transpose(a, to_first) if k in images_in else a
                  for k, a in enumerate(args(i))]
            outs = op("NCHW")(*xs)
            return [tf.transpose(o, to_last) if k in images_out else o
                    for k, o in enumerate(tf.nest.flatten(outs))]
        actual = tfx_vec.pfor(nchw_body, iters, fallback_to_while_loop=False)
        expected = reference(lambda i: tf.nest.flatten(op("NHWC")(*args(i))), iters)
        assert_all_close(actual, expected, rtol, atol, f"NCHW stacked={combo}")


def test_channels_first_per_iteration_filters():
    check_channels_first(lambda fmt: lambda a, f: tf.nn.conv2d(
        a, f, [1, 1, 2, 1] if fmt == "NHWC" else [1, 1, 1, 2], "SAME", data_format=fmt),
        [rand(2, 5, 6, 3), rand(3, 3, 3, 4)], {0}, {0}, [(False, True), (True, True)])
    check_channels_first(lambda fmt: lambda a, f: tf.nn.depthwise_conv2d(
        a, f, [1, 1, 1, 1], "VALID", data_format=fmt),
        [rand(2, 5, 6, 3), rand(2, 3, 3, 2)], {0}, {0}, [(False, True), (True, True)])

# }}}


# {{{ pooling, normalization, softmax & co.

def test_pooling():
    x = rand(2, 6, 7, 3)
    check_op(together(
        max=lambda a: tf.nn.max_pool2d(a, [2, 3], [2, 1], "SAME"),
        avg=lambda a: tf.nn.avg_pool2d(a, 2, 2, "VALID"),
        max_v2=lambda a: tf.raw_ops.MaxPoolV2(input=a, ksize=tf.constant([1, 2, 2, 1]),
                                              strides=tf.constant([1, 1, 2, 1]),
                                              padding="VALID"),
        lrn=lambda a: tf.nn.local_response_normalization(a, 2, 1.5, 0.5, 0.75),
    ), [x], rtol=1e-5, atol=1e-5)
    x3 = rand(1, 4, 5, 4, 2)
    check_op(together(max=lambda a: tf.nn.max_pool3d(a, 2, [1, 2, 1], "SAME"),
                      avg=lambda a: tf.nn.avg_pool3d(a, 2, 2, "VALID")), [x3])


def test_pool_with_argmax():
    check_op(lambda a: tf.nn.max_pool_with_argmax(a, 2, 2, "VALID"), [rand(2, 4, 6, 3)])


def test_bias_add():
    check_op(lambda v, b: tf.nn.bias_add(v, b), [rand(2, 3, 4), rand(4)])
    check_op(lambda v, b: tf.raw_ops.BiasAddV1(value=v, bias=b), [rand(3, 5), rand(5)])
    check_op(lambda v, b: tf.nn.bias_add(v, b, data_format="NCHW"), [rand(2, 3, 4, 5),
                                                                      rand(3)])


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_sorts_under_xla(dtype):
    """Under XLA, top-k of a large part of the row (sort, argsort) is one sort of packed int64
    keys; ties (repeated values, -0.0 and 0.0), infinities, NaNs and descending order included."""
    values = RNG.integers(-4, 5, size=[2, 9]).astype(dtype)       # many ties
    if dtype == np.float32:
        values = values * RNG.uniform(0.5, 1.5, size=values.shape).astype(dtype)
        values[0, :4] = [-0.0, 0.0, np.inf, -np.inf]
        values[1, :2] = [np.nan, -np.nan]                   # IEEE total order, as XLA's
    check_op(together(argsort=lambda a: tf.argsort(a, stable=True),
                      argsort_down=lambda a: tf.argsort(a, direction="DESCENDING", stable=True),
                      sort=lambda a: tf.sort(a),
                      top_all=lambda a: tf.math.top_k(a, 9),
                      top_third=lambda a: tf.math.top_k(a, 3),
                      top_two=lambda a: tf.math.top_k(a, 2)),
             [values], modes=("xla",), rtol=0, atol=0)


def test_softmax_family():
    logits, labels = rand(3, 6), rand(3, 6, low=0.1, high=1.0)
    check_op(together(softmax=lambda a: tf.nn.softmax(a),
                      log_softmax=lambda a: tf.nn.log_softmax(a),
                      l2=lambda a: tf.nn.l2_loss(a),
                      top_k=lambda a: tf.math.top_k(a, 3),
                      nth=lambda a: tf.raw_ops.NthElement(input=a, n=2, reverse=True)),
             [rand(2, 3, 7)], rtol=1e-5, atol=1e-5)
    check_op(lambda a, b: tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=a, labels=b),
             [logits, labels], rtol=1e-5, atol=1e-5)
    ids = RNG.integers(0, 6, size=3).astype(np.int32)
    check_op(together(
        xent=lambda a, y: tf.nn.sparse_softmax_cross_entropy_with_logits(y, a),
        in_top_k=lambda a, y: tf.math.in_top_k(y, a, 2),
        in_top_k_v1=lambda a, y: tf.raw_ops.InTopK(predictions=a, targets=y, k=3)),
        [logits, ids], rtol=1e-5, atol=1e-5)


def _bn(training: bool, data_format: str = "NHWC"):
    def op(x, scale, offset, mean=None, var=None):
        return tf.compat.v1.nn.fused_batch_norm(x, scale, offset, mean, var, epsilon=1e-3,
                                                is_training=training, data_format=data_format)
    return op


def test_fused_batch_norm_training_statistics_are_per_iteration():
    x, scale, offset = rand(2, 4, 3, 5), rand(5, low=0.5), rand(5)
    empty = tf.zeros([0])

    def older(op):
        return lambda a, s, o: op(x=a, scale=s, offset=o, mean=empty, variance=empty,
                                  is_training=True)[:3]
    check_op(together(v3=_bn(True), v2=older(tf.raw_ops.FusedBatchNormV2),
                      v1=older(tf.raw_ops.FusedBatchNorm)),
             [x, scale, offset], rtol=1e-4, atol=1e-4)
    check_op(_bn(True, "NCHW"), [rand(2, 3, 4, 3), rand(3, low=0.5), rand(3)],
             rtol=1e-4, atol=1e-4, combos=[(True, False, False), (True, True, True)])


def test_fused_batch_norm_inference():
    args = [rand(2, 3, 3, 4), rand(4, low=0.5), rand(4), rand(4), rand(4, low=0.5, high=2.0)]
    combos = [(True, False, False, False, False), (False, True, False, False, True),
              (True, True, True, True, True), (True, False, False, True, False)]
    check_op(_bn(False), args, rtol=1e-4, atol=1e-4, combos=combos)

# }}}
