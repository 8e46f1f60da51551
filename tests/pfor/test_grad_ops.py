"""Gradient-op converters (``tfx_vec/pfor/converters/grad_ops.py``) against the oracle.

Backward kernels are checked directly (raw ops on random inputs, or the tape of one forward
op with ``output_gradients`` as an input, so that every stacked/invariant combination of
forward inputs and upstream gradient is covered), then end to end: a loop body that takes
``tf.GradientTape().gradient`` of a small convnet / MLP / LSTM loss for example ``i`` with
respect to the weights, vectorized with fallback disabled, against the per-iteration loop.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfx_vec

from tests.pfor.oracle import check_op, check_pfor
from tfx_vec.pfor.converters import grad_ops, nn_ops
from tfx_vec.pfor.converters.nn_ops import grouped_gradient_kernels
from tests.pfor.test_nn_ops import RNG, check_channels_first, gathered, rand, together

R = tf.raw_ops


def vjp(forward):
    """``(inputs..., dy) -> gradients of forward(inputs...) w.r.t. inputs`` for upstream dy."""
    def op(*args):
        *xs, dy = args
        with tf.GradientTape() as tape:
            tape.watch(xs)
            y = forward(*xs)
        return tape.gradient(y, xs, output_gradients=dy)
    return op


# {{{ single kernels

def test_elementwise_grads():
    pairs = {"ReluGrad": R.ReluGrad, "Relu6Grad": R.Relu6Grad, "SoftplusGrad": R.SoftplusGrad,
             "SoftsignGrad": R.SoftsignGrad}
    y_dy = {"TanhGrad": R.TanhGrad, "SigmoidGrad": R.SigmoidGrad, "SqrtGrad": R.SqrtGrad,
            "RsqrtGrad": R.RsqrtGrad, "ReciprocalGrad": R.ReciprocalGrad, "InvGrad": R.InvGrad}
    ops = {k: (lambda a, b, f=f: f(gradients=a, features=b)) for k, f in pairs.items()}
    ops.update({k: (lambda a, b, f=f: f(y=b, dy=a)) for k, f in y_dy.items()})
    ops.update({k: (lambda a, b, f=f: f(gradients=a, outputs=b))
                for k, f in {"EluGrad": R.EluGrad, "SeluGrad": R.SeluGrad}.items()})
    ops["LeakyReluGrad"] = lambda a, b: R.LeakyReluGrad(gradients=a, features=b, alpha=0.3)
    check_op(together(**ops), [rand(3, 4), rand(3, 4, low=0.2, high=2.0)],
             rtol=1e-5, atol=1e-5)


def test_cholesky_grad():
    def lower():
        a = rand(3, 3)
        return np.tril(a @ a.T + 3 * np.eye(3, dtype=np.float32)).astype(np.float32)
    l_stack, g_stack = np.stack([lower() for _ in range(3)]), rand(3, 3, 3)
    check_op(lambda l, g: R.CholeskyGrad(l=l, grad=g), [l_stack[0], g_stack[0]],
             stacked_arrays=[l_stack, g_stack], rtol=1e-4, atol=1e-4)


def test_bias_add_grad():
    check_op(together(nhwc=lambda g: R.BiasAddGrad(out_backprop=g),
                      nchw=lambda g: R.BiasAddGrad(out_backprop=g, data_format="NCHW")),
             [rand(2, 3, 4, 5)], rtol=1e-5, atol=1e-5)


def test_conv2d_backprop_every_combination():
    """(images, filter, upstream) -> Conv2DBackpropInput and Conv2DBackpropFilter."""
    conv = lambda x, f: tf.nn.conv2d(x, f, [1, 2, 1, 1], "SAME")  # noqa: E731
    check_op(vjp(conv), [rand(2, 5, 4, 3), rand(3, 2, 3, 4), rand(2, 3, 4, 4)],
             rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("strides,dilations,padding,channels", [
    ([1, 2, 1, 1], 1, "SAME", 3), (1, 2, "VALID", 1), (1, 1, [[0, 0], [1, 2], [0, 1], [0, 0]], 3),
    ([1, 1, 2, 1], 1, "SAME", 8), (1, 2, "SAME", 6)],
    ids=["strided", "dilated_valid", "explicit", "strided_long_patches", "dilated_long_patches"])
def test_conv2d_per_iteration_images_and_filters_under_xla(strides, dilations, padding,
                                                           channels):
    """Under XLA, per-example filter gradients are one batched matmul per filter tap, and
    per-iteration filters either one batched matmul of patches (patches of at most
    ``XLA_PATCH_MAX_LENGTH`` entries) or one grouped convolution (longer ones)."""
    conv = lambda x, f: tf.nn.conv2d(x, f, strides, padding, dilations=dilations)  # noqa: E731
    f_shape = [3, 2, channels, 4]
    assert nn_ops.short_patches(tf.TensorShape(f_shape), 2) == (channels * 6 <= 32)
    stacks = _conv_grad_stacks(conv, 3, [2, 6, 5, channels], f_shape)
    check_op(vjp(conv), [s[0] for s in stacks], combos=[(True, True, True)], modes=("xla",),
             rtol=1e-4, atol=1e-4, stacked_arrays=stacks)
    check_op(conv, [rand(2, 6, 5, channels), rand(*f_shape)], combos=[(True, True)],
             modes=("xla",), rtol=1e-4, atol=1e-4)


def test_conv3d_per_example_filter_gradient_under_xla():
    conv = lambda x, f: tf.nn.conv3d(x, f, [1, 1, 2, 1, 1], "SAME")  # noqa: E731
    def filter_grad(x, f, dy):
        with tf.GradientTape() as tape:
            tape.watch(f)
            y = conv(x, f)
        return tape.gradient(y, f, output_gradients=dy)
    stacks = _conv_grad_stacks(conv, 3, [1, 4, 5, 4, 2], [2, 3, 2, 2, 3])
    check_op(filter_grad, [s[0] for s in stacks], combos=[(True, True, True)], modes=("xla",),
             rtol=1e-4, atol=1e-4, stacked_arrays=stacks)


def _conv_grad_stacks(conv, n, x_shape, f_shape):
    """Per-iteration (images, filter, upstream) with the upstream shaped like the output."""
    xs = np.stack([rand(*x_shape) for _ in range(n)])
    fs = np.stack([rand(*f_shape) for _ in range(n)])
    out_shape = conv(tf.constant(xs[0]), tf.constant(fs[0])).shape.as_list()
    return [xs, fs, np.stack([rand(*out_shape) for _ in range(n)])]


def test_conv2d_backprop_run_time_loop_length():
    conv = lambda x, f: tf.nn.conv2d(x, f, 1, "SAME")  # noqa: E731
    for combo in [(True, True, True), (False, True, True), (True, False, True)]:
        check_op(vjp(conv), [rand(1, 4, 4, 2), rand(2, 2, 2, 3), rand(1, 4, 4, 3)],
                 combos=[combo], modes=("dynamic", "one", "chunked"), rtol=1e-4, atol=1e-4)


def test_channels_first_conv_backprops():
    """NCHW backprops with a per-iteration filter / images run as channels-last kernels."""
    def conv_vjp(fmt):
        pads = [[0, 0], [1, 0], [0, 2], [0, 0]]
        pads = pads if fmt == "NHWC" else [pads[0], pads[3], pads[1], pads[2]]
        strides = [1, 2, 1, 1] if fmt == "NHWC" else [1, 1, 2, 1]
        return vjp(lambda x, f: tf.nn.conv2d(x, f, strides, pads, data_format=fmt))
    check_channels_first(conv_vjp, [rand(1, 5, 4, 3), rand(2, 2, 3, 4), rand(1, 3, 5, 4)],
                         {0, 2}, {0}, [(True, True, True), (False, True, True),
                                       (True, True, False)])

    def depthwise_vjp(fmt):
        return vjp(lambda x, f: tf.nn.depthwise_conv2d(x, f, [1] * 4, "SAME", data_format=fmt))
    check_channels_first(depthwise_vjp, [rand(1, 4, 4, 2), rand(2, 2, 2, 2), rand(1, 4, 4, 4)],
                         {0, 2}, {0}, [(True, True, True), (False, True, True)])


def test_grouped_conv2d_backprop():
    """A grouped convolution's own gradients: TensorFlow's CPU kernels take them only with
    oneDNN, XLA always, so without oneDNN the loop and its reference run under XLA."""
    conv = lambda x, f: tf.nn.conv2d(x, f, 1, "VALID")  # noqa: E731
    modes = "rotate" if grouped_gradient_kernels() else ("xla",)
    check_op(vjp(conv), [rand(1, 4, 4, 4), rand(2, 2, 2, 6), rand(1, 3, 3, 6)],
             rtol=1e-4, atol=1e-4, modes=modes)


def test_per_iteration_filter_backprops_without_grouped_kernels(monkeypatch):
    """The formulations used where TensorFlow's CPU kernels take no grouped gradients (a
    block-diagonal filter, filter gradients from patches), forced on any build."""
    monkeypatch.setattr(grad_ops, "grouped_gradient_kernels", lambda: False)
    conv = lambda x, f: tf.nn.conv2d(x, f, [1, 2, 1, 1], "SAME")  # noqa: E731
    check_op(vjp(conv), [rand(2, 5, 4, 3), rand(3, 2, 3, 4), rand(2, 3, 4, 4)],
             rtol=1e-4, atol=1e-4, combos=[(True, True, True), (False, True, True)],
             modes=("eager", "function", "dynamic"))


def test_conv3d_backprop():
    conv = lambda x, f: tf.nn.conv3d(x, f, [1, 1, 2, 1, 1], "SAME")  # noqa: E731
    args = [rand(2, 3, 4, 3, 2), rand(2, 2, 2, 2, 3), rand(2, 3, 2, 3, 3)]
    # Per-example gradients (images and upstream stacked) take volume patches and one
    # batched matmul for the filter gradient.
    combos = [(True, False, False), (False, False, True), (False, True, False),
              (True, False, True)]
    check_op(vjp(conv), args, rtol=1e-4, atol=1e-4, combos=combos)
    # A per-iteration filter and upstream gradient would need a grouped 3-D kernel.
    fs, dys = gathered(np.stack([args[1]] * 2)), gathered(np.stack([args[2]] * 2))
    x = tf.constant(args[0])
    with pytest.raises(tfx_vec.VectorizationError, match="Conv3DBackpropInputV2"):
        tfx_vec.pfor(lambda i: vjp(conv)(x, fs(i), dys(i)), 2, fallback_to_while_loop=False)


def test_depthwise_backprop():
    conv = lambda x, f: tf.nn.depthwise_conv2d(x, f, [1, 1, 1, 1], "SAME")  # noqa: E731
    check_op(vjp(conv), [rand(2, 4, 5, 3), rand(2, 3, 3, 2), rand(2, 4, 5, 6)],
             rtol=1e-4, atol=1e-4)


def test_pool_grads():
    x, dy = rand(2, 6, 5, 3), rand(2, 3, 2, 3)
    check_op(together(max=vjp(lambda a: tf.nn.max_pool2d(a, 2, 2, "VALID")),
                      avg=vjp(lambda a: tf.nn.avg_pool2d(a, 2, 2, "VALID")),
                      argmax=vjp(lambda a: tf.nn.max_pool_with_argmax(a, 2, 2, "VALID")[0]),
                      lrn=lambda a, g: vjp(lambda b: tf.nn.local_response_normalization(
                          b, 1, 1.0, 0.5, 0.5))(a, tf.ones_like(a) * g[0, 0, 0, 0])),
             [x, dy], rtol=1e-4, atol=1e-4)
    check_op(together(max=vjp(lambda a: tf.nn.max_pool3d(a, 2, 2, "VALID")),
                      avg=vjp(lambda a: tf.nn.avg_pool3d(a, 2, 2, "VALID"))),
             [rand(1, 4, 4, 4, 2), rand(1, 2, 2, 2, 2)], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pool,shape,size,padding", [
    (tf.nn.max_pool2d, [2, 7, 5, 3], 2, "VALID"), (tf.nn.max_pool2d, [1, 7, 8, 2], 3, "SAME"),
    (tf.nn.max_pool2d, [2, 6, 4, 2], [2, 1], "SAME"), (tf.nn.max_pool3d, [1, 5, 4, 3, 2], 2, "SAME"),
    (tf.nn.max_pool2d, [1, 6, 5, 2], [2, 2], "VALID")],
    ids=["valid_crop", "same_pad_both_sides", "unequal_windows", "3d_same", "overlap_free"])
def test_max_pool_grad_under_xla_with_ties(pool, shape, size, padding):
    """Under XLA, max-pool gradients with non-overlapping windows compare each window with its
    maximum; the first maximal entry takes the gradient, as in XLA's kernel.  The images come
    through a ReLU, so windows of equal zeros (ties) are common."""
    def grad(a, dy):
        return vjp(lambda b: pool(b, size, size, padding))(tf.nn.relu(a), dy)
    x = np.round(rand(*shape), 1)           # repeated values: ties inside windows
    dy = rand(*pool(tf.constant(x), size, size, padding).shape)
    check_op(grad, [x, dy], modes=("xla",), combos=[(True, True), (True, False), (False, True)])
    overlapping = vjp(lambda b: tf.nn.max_pool2d(b, 3, 2, "SAME"))
    check_op(overlapping, [rand(1, 6, 5, 2), rand(1, 3, 3, 2)], modes=("xla",),
             combos=[(True, True)])


def test_resize_grads():
    resize = {m: vjp(lambda a, m=m: tf.image.resize(a, [5, 3], method=m))
              for m in ("bilinear", "nearest", "bicubic")}
    check_op(together(**resize), [rand(2, 4, 6, 3), rand(2, 5, 3, 3)], rtol=1e-4, atol=1e-4)


def test_mirror_pad_and_dilation2d_grads():
    check_op(together(reflect=vjp(lambda a: tf.pad(a, [[1, 1], [2, 0]], "REFLECT")),
                      symmetric=vjp(lambda a: tf.pad(a, [[0, 2], [1, 1]], "SYMMETRIC"))),
             [rand(3, 4), rand(5, 6)])
    dilation = vjp(lambda a, f: tf.nn.dilation2d(a, f, [1, 1, 1, 1], "SAME", "NHWC",
                                                 [1, 1, 1, 1]))
    check_op(dilation, [rand(2, 4, 5, 3), rand(2, 3, 3), rand(2, 4, 5, 3)], rtol=1e-4,
             atol=1e-4)


def test_max_pool_second_order_and_v2_kernels():
    def kernels(a, dy):
        y = tf.nn.max_pool2d(a, 2, 2, "VALID")
        k, st = tf.constant([1, 2, 2, 1]), tf.constant([1, 2, 2, 1])
        common = dict(orig_input=a, orig_output=y, padding="VALID")
        return {"v2": R.MaxPoolGradV2(grad=dy, ksize=k, strides=st, **common),
                "gradgrad": R.MaxPoolGradGrad(grad=a * 0.5, ksize=[1, 2, 2, 1],
                                              strides=[1, 2, 2, 1], **common),
                "gradgrad_v2": R.MaxPoolGradGradV2(grad=a * 0.5, ksize=k, strides=st, **common)}

    def kernels_3d(a, dy):
        y = tf.nn.max_pool3d(a, 2, 2, "VALID")
        return R.MaxPool3DGradGrad(orig_input=a, orig_output=y, grad=a * 0.5, ksize=[1] + [2] * 3
                                   + [1], strides=[1] + [2] * 3 + [1], padding="VALID")
    check_op(kernels, [rand(2, 4, 6, 3), rand(2, 2, 3, 3)])
    check_op(kernels_3d, [rand(1, 4, 4, 4, 2), rand(1, 2, 2, 2, 2)])


def test_fused_batch_norm_grad_v1_v2():
    empty = tf.zeros([0])

    def grads(forward, backward):
        def op(x, s, o, dy):
            _, _, _, r1, r2 = forward(x=x, scale=s, offset=o, mean=empty, variance=empty,
                                      is_training=True)
            return backward(y_backprop=dy, x=x, scale=s, reserve_space_1=r1,
                            reserve_space_2=r2, is_training=True)[:3]
        return op
    check_op(together(v1=grads(R.FusedBatchNorm, R.FusedBatchNormGrad),
                      v2=grads(R.FusedBatchNormV2, R.FusedBatchNormGradV2)),
             [rand(2, 3, 4, 3), rand(3, low=0.5), rand(3), rand(2, 3, 4, 3)], rtol=2e-4,
             atol=2e-4, combos=[(True, False, False, True), (True, True, True, True)])


def test_fused_batch_norm_grad():
    population = tf.constant(rand(3)), tf.constant(rand(3, low=0.5))

    def bn(training):
        stats = (None, None) if training else population
        return vjp(lambda x, s, o: tf.compat.v1.nn.fused_batch_norm(
            x, s, o, *stats, is_training=training)[0])
    args = [rand(2, 3, 4, 3), rand(3, low=0.5), rand(3), rand(2, 3, 4, 3)]
    combos = [(True, False, False, True), (False, True, True, True), (True, True, True, False)]
    check_op(together(train=bn(True), infer=bn(False)), args, rtol=2e-4, atol=2e-4,
             combos=combos)


def test_strided_slice_grad():
    x = rand(4, 3, 5)
    for fn, dy in [(lambda a: a[1:, ::2], rand(3, 2, 5)),
                   (lambda a: a[:, 1, tf.newaxis, -3:], rand(4, 1, 3)),
                   (lambda a: a[..., 0], rand(4, 3))]:
        check_op(vjp(fn), [x, dy])


def test_broadcast_gradient_args():
    s0, s1 = np.array([2, 1, 3], np.int32), np.array([4, 1], np.int32)
    op = lambda a, b: R.BroadcastGradientArgs(s0=a, s1=b)  # noqa: E731
    check_op(op, [s0, s1], stacked_arrays=[np.stack([s0] * 3), np.stack([s1] * 3)])

# }}}


# {{{ per-example gradients end to end (paper §5.3)

def _per_example_check(loss_fn, weights, examples, n, **kw):
    consts = [tf.constant(w) for w in weights]
    data = [gathered(e) for e in examples]

    def loop_fn(i):
        with tf.GradientTape() as tape:
            tape.watch(consts)
            loss = loss_fn(consts, *[d(i) for d in data])
        return tape.gradient(loss, consts)
    check_pfor(loop_fn, n, modes=("eager", "function"), **kw)


def test_per_example_gradients_convnet():
    weights = [rand(3, 3, 1, 4), rand(4), rand(3, 3, 4, 4), rand(16, 3), rand(3)]

    def loss_fn(w, image, label):
        h = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(image[None], w[0], 1, "SAME"), w[1]))
        h = tf.nn.max_pool2d(h, 2, 2, "VALID")
        h = tf.nn.elu(tf.nn.conv2d(h, w[2], 1, "SAME"))
        h = tf.nn.avg_pool2d(h, 2, 2, "VALID")
        logits = tf.matmul(tf.reshape(h, [1, -1]), w[3]) + w[4]
        return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(label[None],
                                                                            logits))
    labels = RNG.integers(0, 3, size=4).astype(np.int32)
    _per_example_check(loss_fn, weights, [rand(4, 8, 8, 1), labels], 4, rtol=1e-4, atol=1e-4)


def test_per_example_gradients_mlp_and_lstm():
    weights = [rand(5, 8), rand(8), rand(8, 1), rand(5, 16, low=-0.5, high=0.5),
               rand(4, 16, low=-0.5, high=0.5)]

    def loss_fn(w, x, xs):
        h = tf.nn.softplus(tf.linalg.matvec(w[0], x, transpose_a=True) + w[1])
        h = tf.tanh(h) * tf.sigmoid(h) + tf.nn.relu6(h) + tf.nn.leaky_relu(h)
        mlp = tf.reduce_sum(tf.matmul(h[None], w[2]) ** 2)
        state, cell = tf.zeros([1, 4]), tf.zeros([1, 4])
        for t in range(2):  # two LSTM steps, unrolled
            z = tf.matmul(xs[t][None], w[3]) + tf.matmul(state, w[4])
            i, f, g, o = tf.split(z, 4, axis=1)
            cell = tf.sigmoid(f) * cell + tf.sigmoid(i) * tf.tanh(g)
            state = tf.sigmoid(o) * tf.tanh(cell)
        return mlp + tf.reduce_sum(state) + tf.nn.l2_loss(w[0])
    _per_example_check(loss_fn, weights, [rand(3, 5), rand(3, 2, 5)], 3, rtol=1e-4, atol=1e-4)

# }}}


def test_fused_batch_norm_grad_of_unknown_static_shape():
    """Per-iteration statistics folded into channels with no static channel count."""
    x, dy = tf.constant(rand(3, 2, 3, 4, 5)), tf.constant(rand(3, 2, 3, 4, 5))
    scale, offset = tf.constant(rand(5, low=0.5)), tf.constant(rand(5))

    def body(xs, dys):
        def loop_fn(i):
            xi = tf.gather(xs, i)
            with tf.GradientTape() as tape:
                tape.watch(xi)
                y = tf.compat.v1.nn.fused_batch_norm(xi, scale, offset, is_training=True)[0]
            return tape.gradient(y, xi, output_gradients=tf.gather(dys, i))
        return tfx_vec.pfor(loop_fn, 3, fallback_to_while_loop=False)
    unknown = tf.function(body, input_signature=[tf.TensorSpec([None] * 5, tf.float32)] * 2)
    np.testing.assert_allclose(unknown(x, dy).numpy(), tf.function(body)(x, dy).numpy(),
                               rtol=1e-5, atol=1e-5)
