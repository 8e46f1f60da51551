"""Converters for the gradient ops that appear when a loop body takes a gradient.

``tf.GradientTape().gradient`` inside ``loop_fn`` (per-example gradients, Jacobians, paper
§5.1/§5.3) puts backward kernels into the traced body.  They follow the forward converters
of :mod:`.nn_ops`:

- **Element-wise** ``(gradients, features)`` kernels (``ReluGrad``, ``TanhGrad``,
  ``SigmoidGrad``, ...): inputs must have equal shapes, so a loop-invariant operand is tiled
  and the kernel runs once on ``[n, ...]`` (``same_shape`` family).
- **Pooling/LRN/resize gradients**: fold the iterations into the batch dimension; under XLA,
  max-pool gradients with non-overlapping windows compare each window with its maximum
  (XLA's ``select_and_scatter`` is slow on CPU).
- **Convolution gradients** (paper §3.4's "fold into a dimension the op is flexible in"):
  ``Conv2DBackpropInput`` with a loop-invariant filter folds into the batch; with a
  per-iteration filter the iterations become input-channel blocks (invariant ``out_backprop``)
  or groups of one grouped kernel.  ``Conv2DBackpropFilter`` sums over the batch, so the
  iterations become output channels (invariant input), input channels (invariant
  ``out_backprop``) or groups.  Depthwise gradients fold into the depthwise channels.
  A per-example filter gradient (images and upstream stacked) is one batched matmul
  ``taps^T @ out_backprop`` per filter tap wherever grouped gradients are slow or missing
  (XLA, CPU builds without oneDNN, ``Conv3D``, which has no grouped kernel).
  Channels-first ops are emitted channels-last (:class:`~.nn_ops.ChannelsLast`); ``EXPLICIT``
  padding of grouped gradients is applied by hand (a pad, or a crop of a ``VALID`` transposed
  convolution), since TF's CPU kernels reject groups with explicit padding.
- ``FusedBatchNormGrad*``: per-(iteration, channel) statistics, as in the forward op.
- ``BiasAddGrad``: a sum over every axis but the iteration and channel axes.
- ``StridedSliceGrad``: one more leading dimension, sliced whole.
- ``BroadcastGradientArgs`` on shape vectors that differ per iteration only nominally
  (checked at run time): computed once, loop-invariant.

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> w = tf.random.normal([4, 3])
    >>> xs = tf.random.normal([5, 2, 4])
    >>> def per_example_grad(i):
    ...     with tf.GradientTape() as tape:
    ...         tape.watch(w)
    ...         loss = tf.reduce_sum(tf.nn.relu(tf.gather(xs, i) @ w))
    ...     return tape.gradient(loss, w)
    >>> tfx_vec.pfor(per_example_grad, 5, fallback_to_while_loop=False).shape.as_list()
    [5, 4, 3]
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfx_vec.pfor.converters._helpers import (create_op_like, fold_batch, loop_len_static,
                                             same_shape, stacked, unfold_batch)
from tfx_vec.pfor.converters.nn_ops import (ChannelsLast, batch_norm_channel_folded, converter,
                                           conv_taps, fold_emit, fold_into_channels,
                                           grouped_gradient_kernels, scale_dim, static_dim,
                                           unfold_from_channels)
from tfx_vec.pfor.converters.segment_ops import check_rows_equal, guarded
from tfx_vec.pfor.registry import ConversionInput, WrappedTensor

#: Registration modules: their converters are reached through the registry.
__all__: list[str] = []

same_shape("ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "LeakyReluGrad", "SoftplusGrad",
           "SoftsignGrad", "TanhGrad", "SigmoidGrad", "SqrtGrad", "RsqrtGrad",
           "ReciprocalGrad", "InvGrad", "CholeskyGrad")


# {{{ pooling and LRN

@converter("MaxPoolGradV2", "MaxPoolGradGrad", "MaxPoolGradGradV2", "MaxPool3DGradGrad",
           "LRNGrad")
def _pool_grad(x: ConversionInput):
    return fold_emit(x, [0, 1, 2])


@converter("MaxPoolGrad", "MaxPool3DGrad")
def _max_pool_grad(x: ConversionInput):
    if x.vectorizer.xla:
        out = _max_pool_grad_by_windows(x)
        if out is not None:
            return out
    return fold_emit(x, [0, 1, 2])


def _max_pool_grad_by_windows(x: ConversionInput) -> list[WrappedTensor] | None:
    """The gradient of a max pool whose windows do not overlap (``ksize == strides``), without
    XLA's ``select_and_scatter`` (on XLA:CPU 5-10x slower than TensorFlow's kernel).

    The images are cut into their windows (a reshape), each compared with its pooled maximum;
    the first maximal entry of a window in row-major order (XLA's choice among ties, found as
    the least matching position) takes the window's gradient.  ``SAME`` padding is zero
    padding that never matches; ``VALID`` crops the rows and columns no window covers (their
    gradient is 0).  None for channels-first ops, overlapping windows or unknown image sizes.
    """
    spatial = 2 if x.op_type == "MaxPoolGrad" else 3
    ksize, strides = list(x.attr("ksize")), list(x.attr("strides"))
    if x.attr("data_format") not in (b"NHWC", b"NDHWC") or ksize != strides or ksize[0] != 1 \
            or ksize[-1] != 1:
        return None
    dims = x.op.inputs[0].shape[1:1 + spatial]
    if not dims.is_fully_defined():
        return None
    ks, same = ksize[1:-1], x.attr("padding") == b"SAME"
    outs = [-(-d // k) if same else d // k for d, k in zip(dims.as_list(), ks)]
    pads = [[(o * k - d) // 2, (o * k - d) - (o * k - d) // 2] if same else [0, o * k - d]
            for o, k, d in zip(outs, ks, dims.as_list())]                # after < 0: a crop
    images, lead = fold_batch(x.stacked_input(0))                       # [N, *dims, c]
    pooled = fold_batch(x.stacked_input(1))[0]                          # [N, *outs, c]
    dy = fold_batch(x.stacked_input(2))[0]
    # Windows in place, [N, o1, k1, o2, k2, ..., c] (no transposes), window axes 2, 4, ...
    split = [v for o, k in zip(outs, ks) for v in (o, k)]
    window_axes = [2 + 2 * a for a in range(spatial)]
    images = tf.reshape(_crop_or_pad(images, pads),
                        tf.concat([tf.shape(images)[:1], split, tf.shape(images)[-1:]], 0))
    valid = _crop_or_pad(np.ones([1] + dims.as_list() + [1], bool), pads).reshape(
        [1] + split + [1])
    position = np.arange(np.prod(ks), dtype=np.int32).reshape(
        [1] + [v for k in ks for v in (1, k)] + [1])          # row-major order in a window
    at_window = lambda t: tf.reshape(t, tf.concat(                       # noqa: E731
        [tf.shape(t)[:1], [v for o in outs for v in (o, 1)], tf.shape(t)[-1:]], 0))
    hit = tf.logical_and(tf.equal(images, at_window(pooled)), valid)
    first = tf.reduce_min(tf.where(hit, position, np.int32(np.prod(ks))), window_axes,
                          keepdims=True)
    grad = tf.where(tf.equal(position, first), at_window(dy), tf.zeros([], dy.dtype))
    grad = tf.reshape(grad, tf.concat([tf.shape(grad)[:1], [o * k for o, k in zip(outs, ks)],
                                       tf.shape(grad)[-1:]], 0))
    grad = _crop_or_pad(grad, [[-a, -b] for a, b in pads])
    return [WrappedTensor(unfold_batch(grad, lead), True)]


def _crop_or_pad(t, pads: list[list[int]]):
    """Pad (positive entries, with zeros) or crop (negative) the spatial axes ``1..`` of a
    ``[N, *spatial, c]`` tensor (a NumPy array or a tensor)."""
    grow = [[0, 0]] + [[max(a, 0), max(b, 0)] for a, b in pads] + [[0, 0]]
    if isinstance(t, np.ndarray):
        t = np.pad(t, grow)
        return t[(slice(None),) + tuple(slice(max(-a, 0), t.shape[i + 1] - max(-b, 0))
                                        for i, (a, b) in enumerate(pads))]
    if any(v != [0, 0] for v in grow):
        t = tf.pad(t, grow)
    if any(a < 0 or b < 0 for a, b in pads):
        begin = [0] + [max(-a, 0) for a, _ in pads] + [0]
        end = [0] + [min(b, 0) for _, b in pads] + [0]
        t = tf.strided_slice(t, begin, end, end_mask=sum(1 << i for i, e in enumerate(end)
                                                          if e == 0))
    return t


@converter("MaxPoolGradWithArgmax")
def _max_pool_grad_with_argmax(x: ConversionInput):
    if x.attr("include_batch_in_index"):
        return None
    return fold_emit(x, [0, 1, 2])


@converter("ResizeBilinearGrad", "ResizeBicubicGrad")
def _resize_grad(x: ConversionInput):
    # (grads, original_image): the image only gives the output shape.
    return fold_emit(x, [0, 1])


@converter("ResizeNearestNeighborGrad")
def _resize_nearest_grad(x: ConversionInput):
    return fold_emit(x, [0])


@converter("MirrorPadGrad")
def _mirror_pad_grad(x: ConversionInput):
    # (input, paddings): the leading iteration axis is not padded.
    if x.is_stacked(1):
        return None
    p = x.input(1).t
    return stacked(*create_op_like(x.op, [x.input(0).t, tf.concat([tf.zeros([1, 2], p.dtype), p],
                                                                   0)]))


@converter("Dilation2DBackpropInput", "Dilation2DBackpropFilter")
def _dilation2d_backprop(x: ConversionInput):
    # (input [b,h,w,c], filter [fh,fw,c], out_backprop): channels are independent, so every
    # operand takes the iterations as channel blocks.
    n = x.loop_len
    images = fold_into_channels(x.stacked_input(0), 3)
    filt = fold_into_channels(x.stacked_input(1), 2)
    dy = fold_into_channels(x.stacked_input(2), 3)
    out = create_op_like(x.op, [images, filt, dy])[0]
    axis = 3 if x.op_type == "Dilation2DBackpropInput" else 2
    channels = x.op.inputs[1].shape[2]
    if channels is None:
        channels = tf.shape(x.stacked_input(1))[3]
    return [WrappedTensor(unfold_from_channels(out, axis, n, channels), True)]


@converter("AvgPoolGrad", "AvgPool3DGrad")
def _avg_pool_grad(x: ConversionInput):
    # (orig_input_shape, grad): the shape's batch entry grows by n.
    if x.is_stacked(0):
        return None
    return fold_emit(x, [1], replace={0: scale_dim(x.input(0).t, 0, x.loop_len)})

# }}}


# {{{ convolutions

def _one_group(in_channels: int | None, filter_in_channels: int | None) -> bool:
    return in_channels is not None and in_channels == filter_in_channels


def _conv_backprop_input(x: ConversionInput, spatial: int, grouped_ok: bool):
    """(input_sizes, filter, out_backprop) -> input gradient."""
    if x.is_stacked(0):
        return None
    sizes, n = x.input(0).t, x.loop_len
    if not x.is_stacked(1):
        return fold_emit(x, [2], replace={0: scale_dim(sizes, 0, n)})
    lay = ChannelsLast(x, spatial)
    c, filt = lay.channel, x.input(1).t                 # filter [n, k..., ci_f, co]
    sizes = lay.sizes(sizes)
    new_sizes = scale_dim(sizes, c, n)
    # The shape vectors are often ShapeN outputs (not constant-foldable); the original op's
    # inferred output shape has the channel counts.
    if not x.is_stacked(2) and _one_group(lay.channels(x.op.outputs[0]), static_dim(filt, -2)):
        # dx[..., (i, ci)] = sum_co dy[..., co] * F_i[..., ci, co]: n*ci input channels.
        out = lay.emit([new_sizes, fold_into_channels(filt, spatial),
                        lay.images(x.input(2).t, False)])
    elif grouped_ok and not (x.vectorizer.xla or grouped_gradient_kernels()):
        if not _one_group(lay.channels(x.op.outputs[0]), static_dim(filt, -2)):
            return None
        filters = _block_diagonal(x, filt, spatial)
        if filters is None:
            return None
        out = lay.emit([new_sizes, filters,
                        fold_into_channels(lay.images(x.stacked_input(2), True), c)])
    elif grouped_ok:
        pairs = lay.take_explicit_padding()
        if pairs is not None:  # transposed VALID convolution, then crop the padding
            new_sizes += tf.constant([a + b for a, b in pairs], new_sizes.dtype)
        out = lay.emit([new_sizes, fold_into_channels(filt, spatial + 1),
                        fold_into_channels(lay.images(x.stacked_input(2), True), c)])
        if pairs is not None:
            out = tf.slice(out, [a for a, _ in pairs], tf.shape(out) - [a + b for a, b in pairs])
    else:
        return None
    return [WrappedTensor(lay.result(unfold_from_channels(out, c, n, sizes[c])), True)]


#: Largest block-diagonal filter (elements) built where grouped kernels do not run.
_BLOCK_DIAGONAL_LIMIT = 1 << 24


def _block_diagonal(x: ConversionInput, filt: tf.Tensor, spatial: int) -> tf.Tensor | None:
    """``[n, k..., ci, co]`` per-iteration filters -> ``[k..., n*ci, n*co]`` with filter i in
    block ``(i, i)``: ``n`` groups as one ungrouped convolution, which every CPU build runs, at
    ``n`` times a grouped kernel's work (None: too large, or of unknown size)."""
    n_static, dims = loop_len_static(x), filt.shape.as_list()[1:]
    if None in dims or (n_static or 1) ** 2 * int(np.prod(dims)) > _BLOCK_DIAGONAL_LIMIT:
        return None
    eye = tf.eye(x.loop_len, dtype=filt.dtype)
    blocks = tf.einsum("ij,i...cd->...icjd", eye, filt)                 # [k..., n, ci, n, co]
    shape = tf.shape(blocks)
    out = tf.reshape(blocks, tf.concat([shape[:spatial], [shape[spatial] * shape[spatial + 1],
                                        shape[spatial + 2] * shape[spatial + 3]]], 0))
    out.set_shape(dims[:-2] + [None if n_static is None else n_static * d for d in dims[-2:]])
    return out


def _conv_backprop_filter(x: ConversionInput, spatial: int, grouped_ok: bool):
    """(input, filter_sizes, out_backprop) -> filter gradient (a sum over the batch)."""
    if x.is_stacked(1):
        return None
    lay = ChannelsLast(x, spatial)
    c, images, sizes, dy = lay.channel, x.input(0), x.input(1).t, x.input(2)
    n = x.loop_len
    one_group = _one_group(lay.channels(x.op.inputs[0]), static_dim(x.op.outputs[0], -2))
    if one_group and not images.is_stacked:
        # Same images, per-iteration out_backprop: the iterations are n*co output channels.
        out = lay.emit([lay.images(images.t, False), scale_dim(sizes, spatial + 1, n),
                        fold_into_channels(lay.images(dy.t, True), c)])
        return [WrappedTensor(unfold_from_channels(out, spatial + 1, n, sizes[-1]), True)]
    if one_group and not dy.is_stacked:
        # Per-iteration images, same out_backprop: n*ci input channels.
        out = lay.emit([fold_into_channels(lay.images(images.t, True), c),
                        scale_dim(sizes, spatial, n), lay.images(dy.t, False)])
        return [WrappedTensor(unfold_from_channels(out, spatial, n, sizes[-2]), True)]
    if one_group and (not grouped_ok or x.vectorizer.xla or not grouped_gradient_kernels()):
        # XLA's CPU grouped filter gradients are hundreds of times slower than one matmul,
        # and TensorFlow's CPU kernels take groups only with oneDNN.
        return _conv_backprop_filter_by_patches(x, lay)
    if not grouped_ok or not (x.vectorizer.xla or grouped_gradient_kernels()):
        return None     # a grouped convolution's own gradient, which this build cannot run
    images = lay.padded_images(lay.images(x.stacked_input(0), True))
    out = lay.emit([fold_into_channels(images, c), scale_dim(sizes, spatial + 1, n),
                    fold_into_channels(lay.images(x.stacked_input(2), True), c)])
    return [WrappedTensor(unfold_from_channels(out, spatial + 1, n, sizes[-1]), True)]


def _conv_backprop_filter_by_patches(x: ConversionInput, lay: ChannelsLast):
    """Per-iteration images and out_backprop: one batched matmul per filter tap.

    ``dF_i[tap] = taps_i[tap]^T @ dy_i`` with ``taps_i[tap]`` the ``[b*P, ci]`` images that
    filter tap multiplies on the output grid (:func:`~.nn_ops.conv_taps`).  Stacking the taps
    into patches for one matmul instead materializes ``prod(k)`` copies of the images, which
    costs more than the matmuls (2-4x slower under XLA, up to 1.8x without it).
    """
    kernel = x.op.outputs[0].shape                                    # [k..., ci, co]
    n = x.loop_len
    images = fold_batch(lay.images(x.stacked_input(0), True))[0]       # [n*b, ..., ci]
    taps = conv_taps(x, lay, images, kernel)
    if not taps:
        return None
    dy = lay.images(x.stacked_input(2), True)                          # [n, b, ..., co]
    dy = tf.reshape(dy, tf.stack([n, -1, tf.shape(dy)[-1]]))            # [n, b*P, co]
    if kernel[-2] == 1:
        # One channel: the taps stacked as rows, [n, b, T, P] -> [n, T, b*P], one matmul (2x
        # faster than T matmuls with a contraction of one channel).
        rows = tf.stack([tf.reshape(t, tf.stack([tf.shape(t)[0], -1])) for t in taps], 1)
        rows = tf.reshape(rows, tf.stack([n, -1, len(taps), tf.shape(rows)[-1]]))
        rows = tf.reshape(tf.transpose(rows, [0, 2, 1, 3]), tf.stack([n, len(taps), -1]))
        grad = tf.matmul(rows, dy)                                      # [n, T, co]
    else:
        grad = tf.concat([tf.matmul(tf.reshape(t, tf.stack([n, -1, tf.shape(t)[-1]])), dy,
                                    transpose_a=True) for t in taps], 1)  # [n, T*ci, co]
    return [WrappedTensor(tf.reshape(grad, tf.concat([[n], kernel.as_list()], 0)), True)]


@converter("Conv2DBackpropInput")
def _conv2d_backprop_input(x: ConversionInput):
    return _conv_backprop_input(x, 2, grouped_ok=True)


@converter("Conv3DBackpropInputV2")
def _conv3d_backprop_input(x: ConversionInput):
    return _conv_backprop_input(x, 3, grouped_ok=False)


@converter("Conv2DBackpropFilter")
def _conv2d_backprop_filter(x: ConversionInput):
    return _conv_backprop_filter(x, 2, grouped_ok=True)


@converter("Conv3DBackpropFilterV2")
def _conv3d_backprop_filter(x: ConversionInput):
    return _conv_backprop_filter(x, 3, grouped_ok=False)


@converter("DepthwiseConv2dNativeBackpropInput")
def _depthwise_backprop_input(x: ConversionInput):
    if x.is_stacked(0):
        return None
    sizes, n = x.input(0).t, x.loop_len
    if not x.is_stacked(1):
        return fold_emit(x, [2], replace={0: scale_dim(sizes, 0, n)})
    lay = ChannelsLast(x, 2)
    c, sizes = lay.channel, lay.sizes(sizes)
    out = lay.emit([scale_dim(sizes, c, n), fold_into_channels(x.input(1).t, 2),
                    fold_into_channels(lay.images(x.stacked_input(2), True), c)])
    return [WrappedTensor(lay.result(unfold_from_channels(out, c, n, sizes[c])), True)]


@converter("DepthwiseConv2dNativeBackpropFilter")
def _depthwise_backprop_filter(x: ConversionInput):
    if x.is_stacked(1):
        return None
    lay = ChannelsLast(x, 2)
    sizes, n, c = x.input(1).t, x.loop_len, lay.channel
    out = lay.emit([fold_into_channels(lay.images(x.stacked_input(0), True), c),
                    scale_dim(sizes, 2, n),
                    fold_into_channels(lay.images(x.stacked_input(2), True), c)])
    return [WrappedTensor(unfold_from_channels(out, 2, n, sizes[2]), True)]

# }}}


# {{{ normalization, bias, broadcasting

@converter("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3")
def _fused_batch_norm_grad(x: ConversionInput):
    return batch_norm_channel_folded(x, 2)


@converter("BiasAddGrad")
def _bias_add_grad(x: ConversionInput):
    grad = x.input(0).t
    rank = grad.shape.rank
    if rank is None:
        return None
    channels_first = x.attr("data_format") in (b"NCHW", b"NCDHW")
    c = 2 if channels_first else rank - 1               # in the stacked value
    axes = [a for a in range(1, rank) if a != c]
    return [WrappedTensor(tf.reduce_sum(grad, axes), True)]


@converter("StridedSliceGrad")
def _strided_slice_grad(x: ConversionInput):
    # (shape, begin, end, strides, dy): one more leading dimension, taken whole.
    if any(x.is_stacked(i) for i in range(4)):
        return None
    shape, begin, end, strides = (x.input(i).t for i in range(4))
    n = tf.reshape(tf.cast(x.loop_len, shape.dtype), [1])
    zero = tf.zeros([1], begin.dtype)
    masks = {name: x.attr(name) << 1 for name in ("begin_mask", "end_mask", "ellipsis_mask",
                                                   "new_axis_mask", "shrink_axis_mask")}
    masks["begin_mask"] |= 1
    masks["end_mask"] |= 1
    out = create_op_like(x.op, [tf.concat([n, shape], 0), tf.concat([zero, begin], 0),
                                tf.concat([zero, end], 0),
                                tf.concat([tf.ones([1], strides.dtype), strides], 0),
                                x.stacked_input(4)], attrs=masks)
    return [WrappedTensor(out[0], True)]


@converter("BroadcastGradientArgs")
def _broadcast_gradient_args(x: ConversionInput):
    # Shape vectors that depend on the loop index only nominally (equal in every iteration):
    # checked at run time, then computed once.
    checks, shapes = [], []
    for w in x.inputs:
        if w.is_stacked:
            checks.append(check_rows_equal(x, w.t, "a broadcast shape"))
            shapes.append(tf.reduce_max(w.t, axis=0))
        else:
            shapes.append(w.t)
    shapes = guarded(shapes, checks)
    return [WrappedTensor(t, False) for t in create_op_like(x.op, shapes)]

# }}}
