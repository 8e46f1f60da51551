"""Converters for neural-network ops: convolutions, pooling, normalization, softmax, top-k.

Three formulations, cheapest first (paper §3.4):

1. **Fold the iterations into the op's batch dimension.**  An op that treats its batch rows
   independently (a convolution with a loop-invariant filter, pooling, LRN, softmax
   cross-entropy, batch norm in inference mode) runs *once* on ``[n*b, ...]``; the output is
   reshaped back to ``[n, b, ...]`` (:func:`fold_emit`).
2. **Fold the iterations into the channel dimension.**  A per-iteration filter or per-iteration
   batch statistics cannot share the batch dimension, but channels are independent, so ``n``
   is merged into the channel axis (:func:`fold_into_channels`):

   - stacked filter, invariant input: one convolution with ``n*c_out`` output channels;
   - stacked filter and input: one *grouped* convolution (``n`` groups; TF runs grouped
     ``Conv2D`` on CPU and GPU);
   - depthwise convolution: ``n*c`` depthwise channels;
   - ``FusedBatchNorm*`` in training mode: per-(iteration, channel) statistics.
3. **Re-emit on the stacked value** when the op already acts on the last axis only (softmax,
   top-k, nth_element) or broadcasts (``BiasAdd`` with a stacked bias becomes ``Add``).

Dilated convolutions arrive as ``SpaceToBatchND -> conv -> BatchToSpaceND``: the iterations
fold into the batch and the block-major row order is regrouped by iteration.  With a static
``iters == 0`` every converter registered through :func:`converter` returns empty outputs
without emitting a kernel (zero groups or channels are invalid).  All of these formulations also
compile under ``tf.function(jit_compile=True)`` (XLA has grouped convolutions).  Under XLA, where
XLA:CPU's kernels are slow, two differ: per-iteration filters on per-iteration images with
short patches (:func:`short_patches`) are one batched matmul of patches, and a top-k of a large
part of the row (sorts, argsorts) is one sort of packed ``int64`` keys.

Channel folding needs channels last: a channels-first (``NCHW``) op with a per-iteration filter
is emitted as its ``NHWC`` form between transposes (:class:`ChannelsLast`), which also runs
on CPU, where TF has no ``NCHW`` convolution kernels.

Cases with no single-op formulation return ``None`` (the vectorizer's counted per-iteration
fallback, or an error when fallbacks are disabled): a stacked filter in ``Conv3D`` together with
a stacked input (TF has no grouped 3-D convolution), a stacked ``k`` in top-k, a stacked
``ksize`` of ``MaxPoolV2``.

Example:
    >>> import numpy as np, tensorflow as tf, tfx_vec
    >>> images = tf.random.normal([4, 2, 8, 8, 3])
    >>> filters = tf.random.normal([4, 3, 3, 3, 5])      # one filter bank per iteration
    >>> y = tfx_vec.pfor(lambda i: tf.nn.conv2d(tf.gather(images, i), tf.gather(filters, i),
    ...                                         1, "SAME"), 4, fallback_to_while_loop=False)
    >>> y.shape.as_list()
    [4, 2, 8, 8, 5]
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from tfx_vec.pfor.converters._helpers import (create_op_like, fold_batch, loop_len_static,
                                             map_folded, move_axis, reemit_stacked, stacked,
                                             unfold_batch)
from tfx_vec.pfor.registry import ConversionInput, WrappedTensor, register_converter

#: Registration modules: their converters are reached through the registry.
__all__: list[str] = []


# {{{ registration and folding utilities (shared with the other converter modules)

def empty_outputs(x: ConversionInput) -> list[WrappedTensor] | None:
    """With a static loop length of 0: an empty ``[0, ...]`` value per output, else None."""
    if loop_len_static(x) != 0 or not all(o.shape.is_fully_defined() for o in x.op.outputs):
        return None
    return stacked(*[tf.zeros([0] + o.shape.as_list(), o.dtype) for o in x.op.outputs])


def with_static_shapes(x: ConversionInput, result):
    """Give stacked outputs the original op's static per-iteration shape.

    Reshapes through run-time shape vectors lose static dims (always so with a run-time loop
    length); later converters that need a static rank would otherwise fall back to a loop.
    """
    if result is None:
        return None
    outs = [result] if isinstance(result, WrappedTensor) else list(result)
    n = loop_len_static(x)
    for w, o in zip(outs, x.op.outputs):
        if w.is_stacked and w.t.dtype != tf.variant and o.shape.rank is not None:
            w.t.set_shape(tf.TensorShape([n]).concatenate(o.shape))
    return outs


def converter(*op_types: str) -> Callable[[Callable], Callable]:
    """``register_converter`` for this family, plus static shapes and the empty loop.

    Folding zero iterations (``iters == 0``) into channels or groups would ask kernels for
    zero groups, so an empty loop short-circuits to empty outputs of the right per-iteration
    shape.  Outputs get the static shapes of :func:`with_static_shapes`.
    """
    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def guarded_fn(x: ConversionInput):
            empty = empty_outputs(x)
            return with_static_shapes(x, fn(x)) if empty is None else empty
        register_converter(*op_types)(guarded_fn)
        return fn
    return decorate


def invariant_except(x: ConversionInput, indices: Sequence[int]) -> bool:
    """True when every input outside ``indices`` is loop-invariant."""
    return not any(x.is_stacked(j) for j in range(len(x.inputs)) if j not in indices)


def fold_emit(x: ConversionInput, fold: Sequence[int], *,
              replace: dict[int, tf.Tensor] | None = None) -> list[WrappedTensor] | None:
    """Run ``x.op`` once with inputs ``fold`` reshaped ``[n, b, ...] -> [n*b, ...]``.

    Loop-invariant inputs among ``fold`` are tiled first (the op needs equal batch sizes);
    inputs outside ``fold`` must be loop-invariant (else ``None``).  ``replace`` substitutes
    inputs (e.g. a shape vector scaled by ``n``).  Every output is unfolded to ``[n, b, ...]``.
    """
    if not invariant_except(x, fold):
        return None
    inputs = [w.t for w in x.inputs]
    lead = None
    for i in fold:
        inputs[i], lead_i = fold_batch(x.stacked_input(i))
        lead = lead_i if lead is None else lead
    for i, t in (replace or {}).items():
        inputs[i] = t
    return stacked(*[unfold_batch(o, lead) for o in create_op_like(x.op, inputs)])


def scale_dim(sizes: tf.Tensor, axis: int, factor: tf.Tensor) -> tf.Tensor:
    """A shape vector with entry ``axis`` multiplied by ``factor`` (``input_sizes`` inputs)."""
    sizes = tf.convert_to_tensor(sizes)
    factor = tf.reshape(tf.cast(factor, sizes.dtype), [1])
    rank = sizes.shape[0]
    if rank is None:
        raise ValueError("a shape vector of unknown length")
    ones = [tf.ones([axis], sizes.dtype), factor, tf.ones([rank - axis - 1], sizes.dtype)]
    return sizes * tf.concat(ones, 0)


def fold_into_channels(t: tf.Tensor, c_axis: int) -> tf.Tensor:
    """``[n, ..., C, ...] -> [..., n*C, ...]``: the iterations become channel groups.

    ``c_axis`` is the per-iteration channel axis (non-negative; the rank must be known).
    Channel ``i*C + c`` of the result is channel ``c`` of iteration ``i``.
    """
    moved = move_axis(t, 0, c_axis)            # [..., n, C, ...]
    shape = tf.shape(moved)
    merged = tf.concat([shape[:c_axis], [shape[c_axis] * shape[c_axis + 1]],
                        shape[c_axis + 2:]], 0)
    out = tf.reshape(moved, merged)
    dims = moved.shape.as_list()
    n, c = dims[c_axis], dims[c_axis + 1]
    out.set_shape(dims[:c_axis] + [n * c if n is not None and c is not None else None]
                  + dims[c_axis + 2:])
    return out


def unfold_from_channels(t: tf.Tensor, c_axis: int, n: tf.Tensor,
                         inner: tf.Tensor | int | None = None) -> tf.Tensor:
    """Inverse of :func:`fold_into_channels`: ``[..., n*C, ...] -> [n, ..., C, ...]``.

    ``inner`` is ``C`` when known (needed when ``n`` may be 0).
    """
    shape = tf.shape(t)
    n = tf.reshape(tf.cast(n, tf.int32), [1])
    if inner is None:
        inner = shape[c_axis] // tf.maximum(n[0], 1)
    inner = tf.reshape(tf.cast(inner, tf.int32), [1])
    split = tf.concat([shape[:c_axis], n, inner, shape[c_axis + 1:]], 0)
    return move_axis(tf.reshape(t, split), c_axis, 0)


def split_leading(t: tf.Tensor, n: tf.Tensor, like: tf.Tensor | None = None) -> tf.Tensor:
    """``[n*k, ...] -> [n, k, ...]`` for outputs of an op run on iteration-folded inputs.

    ``like`` is the original op's output: its static per-iteration shape, when known, is
    used (it stays right when ``n`` is 0).
    """
    n = tf.reshape(tf.cast(n, tf.int32), [1])
    if like is not None and like.shape.is_fully_defined():
        return tf.reshape(t, tf.concat([n, like.shape.as_list()], 0))
    shape = tf.shape(t)
    return tf.reshape(t, tf.concat([n, [shape[0] // tf.maximum(n[0], 1)], shape[1:]], 0))


class ChannelsLast:
    """A convolution-family op seen in channels-last layout.

    Channel folding needs the channel axis last; a channels-first (``NCHW``/``NCDHW``) op is
    re-emitted as its channels-last form between transposes (``strides``, ``dilations`` and
    ``explicit_paddings`` permuted alike), which is also the layout TF runs on CPU.
    """

    def __init__(self, x: ConversionInput, spatial: int):
        fmt = x.attr("data_format")
        fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
        self.op = x.op
        self.spatial = spatial
        self.channel = spatial + 1                     # per-iteration channel axis
        self.first = not fmt.endswith("C")
        self.attrs: dict = {}
        if self.first:
            perm = [0] + list(range(2, spatial + 2)) + [1]
            self.attrs["data_format"] = "NHWC" if spatial == 2 else "NDHWC"
            names = {a.name for a in x.op.op_def.attr}
            for name in ("strides", "dilations"):
                if name in names:
                    value = x.attr(name)
                    self.attrs[name] = [value[p] for p in perm]
            pads = list(x.attr("explicit_paddings")) if "explicit_paddings" in names else []
            if pads:
                self.attrs["explicit_paddings"] = [v for p in perm for v in pads[2 * p:2 * p + 2]]
            self._perm = perm

    def take_explicit_padding(self) -> list[list[int]] | None:
        """Switch an ``EXPLICIT``-padding op to ``VALID`` and return its per-axis pads.

        TF's CPU kernels for grouped convolution gradients reject explicit padding (only the
        oneDNN SAME/VALID kernels take groups), so the converters apply the pads themselves.
        """
        if self.op.get_attr("padding") != b"EXPLICIT":
            return None
        pads = self.attrs.get("explicit_paddings", list(self.op.get_attr("explicit_paddings")))
        self.attrs.update(padding="VALID", explicit_paddings=[])
        return [pads[2 * k:2 * k + 2] for k in range(self.spatial + 2)]

    def padded_images(self, t: tf.Tensor) -> tf.Tensor:
        """Stacked channels-last images with explicit padding applied (see above)."""
        pairs = self.take_explicit_padding()
        return t if pairs is None else tf.pad(t, [[0, 0]] + pairs)

    def padded_images_folded(self, t: tf.Tensor) -> tf.Tensor:
        """Like :meth:`padded_images` for images whose iterations are folded into the batch."""
        pairs = self.take_explicit_padding()
        return t if pairs is None else tf.pad(t, pairs)

    def images(self, t: tf.Tensor, is_stacked: bool) -> tf.Tensor:
        """An image operand (``[n?, b, ...]``) in channels-last layout."""
        if not self.first:
            return t
        lead = 1 if is_stacked else 0
        return tf.transpose(t, list(range(lead)) + [lead + p for p in self._perm])

    def sizes(self, v: tf.Tensor) -> tf.Tensor:
        """An ``input_sizes`` shape vector in channels-last order."""
        return tf.gather(v, self._perm) if self.first else v

    def channels(self, t: tf.Tensor) -> int | None:
        """The static channel count of an image tensor of the original op."""
        return static_dim(t, 1 if self.first else -1)

    def result(self, t: tf.Tensor) -> tf.Tensor:
        """A stacked channels-last image result back in the op's layout."""
        if not self.first:
            return t
        inverse = [self._perm.index(i) for i in range(self.spatial + 2)]
        return tf.transpose(t, [0] + [1 + p for p in inverse])

    def emit(self, inputs: Sequence[tf.Tensor]) -> tf.Tensor:
        """The op, channels-last, on ``inputs``; its first output."""
        return create_op_like(self.op, inputs, attrs=self.attrs)[0]


def conv_taps(x: ConversionInput, lay: ChannelsLast, images: tf.Tensor,
              kernel: tf.TensorShape) -> list[tf.Tensor] | None:
    """The images a convolution like ``x.op`` multiplies with each filter tap, channels last:
    one ``[N, *out_spatial, ci]`` strided slice of the (padded) ``images`` ``[N, *spatial, ci]``
    per tap, in the filter's ``[k...]`` order, or None when static sizes are unknown.

    XLA compiles a strided slice to a fast copy, where its ``ExtractImagePatches`` is an order
    of magnitude slower.
    """
    spatial = lay.spatial
    if not kernel[:spatial].is_fully_defined():
        return None
    names = {a.name for a in x.op.op_def.attr}
    attrs = {a: list(x.attr(a)) for a in ("strides", "dilations") if a in names}
    attrs.update(lay.attrs)
    strides = list(attrs.get("strides", [1] * (spatial + 2)))[1:-1]
    dilations = list(attrs.get("dilations", [1] * (spatial + 2)))[1:-1]
    images = lay.padded_images_folded(images)
    padding = lay.attrs.get("padding", x.attr("padding"))
    padding = padding.decode() if isinstance(padding, bytes) else padding
    dims = images.shape[1:1 + spatial]
    if not dims.is_fully_defined():
        return None
    ks, pads, outs = kernel[:spatial].as_list(), [[0, 0]], []
    for size, k, st, d in zip(dims.as_list(), ks, strides, dilations):
        span = (k - 1) * d + 1
        if padding == "SAME":
            out = -(-size // st)
            total = max((out - 1) * st + span - size, 0)
            pads.append([total // 2, total - total // 2])
        else:
            out = max(-(-(size - span + 1) // st), 0)
            pads.append([0, 0])
        outs.append(out)
    if any(p != [0, 0] for p in pads):
        images = tf.pad(images, pads + [[0, 0]])
    taps = []
    for offsets in np.ndindex(*ks):
        begin = [0] + [o * d for o, d in zip(offsets, dilations)] + [0]
        end = [0] + [b + (o - 1) * st + 1 for b, o, st in zip(begin[1:], outs, strides)] + [0]
        taps.append(tf.strided_slice(images, begin, end, [1] + strides + [1],
                                     begin_mask=1 | (1 << (spatial + 1)),
                                     end_mask=1 | (1 << (spatial + 1))))
    return taps


def conv_patches(x: ConversionInput, lay: ChannelsLast, images: tf.Tensor,
                 kernel: tf.TensorShape) -> tf.Tensor | None:
    """The patches a convolution like ``x.op`` multiplies with its filter, channels last:
    ``[N, *out_spatial, prod(k)*ci]`` for ``images`` ``[N, *spatial, ci]`` (patch entries in
    the filter's ``[k..., ci]`` order), or None when static sizes are unknown: the
    :func:`conv_taps`, stacked.
    """
    taps = conv_taps(x, lay, images, kernel)
    if taps is None:
        return None
    patches = tf.stack(taps, -2)                               # [N, *out, K, ci]
    shape = tf.concat([tf.shape(patches)[:1 + lay.spatial], [-1]], 0)
    return tf.reshape(patches, shape)


#: Under XLA, a per-iteration filter (with per-iteration images) is applied as patches times
#: filter (one batched matmul) when a patch has at most this many entries (``prod(k) * ci``),
#: else as a grouped convolution.  Measured on XLA:CPU: building longer patches costs more
#: than XLA's grouped convolution (which is then at par with TensorFlow's kernel), while for
#: short ones (e.g. 5x5 on one channel, 3x3 on three) patches are up to 3x faster.
XLA_PATCH_MAX_LENGTH = 32


def short_patches(kernel: tf.TensorShape, spatial: int) -> bool:
    """True when ``kernel``'s (``[k..., ci, co]``) patches are statically known to have at
    most :data:`XLA_PATCH_MAX_LENGTH` entries."""
    dims = kernel[:spatial + 1]
    return dims.is_fully_defined() and int(np.prod(dims.as_list())) <= XLA_PATCH_MAX_LENGTH


def static_dim(t: tf.Tensor, axis: int) -> int | None:
    """A static dimension of ``t`` (``None`` when unknown)."""
    if t.shape.rank is None:
        return None
    return t.shape[axis]


@functools.lru_cache(maxsize=None)
def grouped_gradient_kernels() -> bool:
    """Do TensorFlow's CPU kernels compute grouped convolution gradients (input channels a
    multiple of the filter's)?

    Only its oneDNN kernels do, and TensorFlow turns those on by itself only on some x86 CPUs
    (or with ``TF_ENABLE_ONEDNN_OPTS=1``); without them a grouped ``Conv2DBackpropInput`` or
    ``Conv2DBackpropFilter`` fails at run time, so the converters emit formulations every
    kernel runs.  Probed once, in a graph of its own (this also works while a function or a
    TF1 graph is being built).

    Example:
        >>> isinstance(grouped_gradient_kernels(), bool)
        True
    """
    with tf.Graph().as_default():
        args = dict(strides=[1, 1, 1, 1], padding="VALID")
        dy = tf.ones([1, 2, 2, 2])
        grads = [tf.raw_ops.Conv2DBackpropFilter(input=tf.ones([1, 2, 2, 2]),
                                                 filter_sizes=[1, 1, 1, 2], out_backprop=dy,
                                                 **args),
                 tf.raw_ops.Conv2DBackpropInput(input_sizes=[1, 2, 2, 2],
                                                filter=tf.ones([1, 1, 1, 2]), out_backprop=dy,
                                                **args)]
        try:
            with tf.compat.v1.Session() as sess:
                return [g.shape for g in sess.run(grads)] == [(1, 1, 1, 2), (1, 2, 2, 2)]
        except tf.errors.OpError:
            return False

# }}}


# {{{ convolutions

def _is_ungrouped(in_channels: int | None, filter_in_channels: int | None) -> bool:
    """True when the original convolution is statically known to have one group."""
    return in_channels is not None and in_channels == filter_in_channels


def _conv_forward(x: ConversionInput, spatial: int, grouped_ok: bool) -> list[WrappedTensor] | None:
    """Conv2D/Conv3D: batch fold, output-channel fold, or one grouped convolution."""
    if not x.is_stacked(1):
        return fold_emit(x, [0])
    lay = ChannelsLast(x, spatial)
    n, inp, filt = x.loop_len, x.input(0), x.input(1).t
    c_out = tf.shape(filt)[-1]
    if not inp.is_stacked and _is_ungrouped(lay.channels(inp.t), static_dim(filt, -2)):
        # Every iteration convolves the same images: one filter bank with n*c_out outputs.
        out = lay.emit([lay.images(inp.t, False), fold_into_channels(filt, spatial + 1)])
    elif (x.vectorizer.xla and _is_ungrouped(lay.channels(x.op.inputs[0]), static_dim(filt, -2))
          and (short_patches(x.op.inputs[1].shape, spatial) or not grouped_ok)):
        # Short patches @ F_i beat XLA:CPU's grouped convolution (Conv3D has no grouped form).
        return _conv_by_patches(x, lay)
    elif grouped_ok:
        # Iteration i's channels form group(s) of their own: one grouped convolution.
        images = fold_into_channels(lay.images(x.stacked_input(0), True), lay.channel)
        out = lay.emit([images, fold_into_channels(filt, spatial + 1)])
    else:
        return None
    return [WrappedTensor(lay.result(unfold_from_channels(out, lay.channel, n, c_out)), True)]


def _conv_by_patches(x: ConversionInput, lay: ChannelsLast) -> list[WrappedTensor] | None:
    """Per-iteration images and filters: ``out_i = patches_i @ F_i``, one batched matmul."""
    kernel = x.op.inputs[1].shape                                       # [k..., ci, co]
    images, lead = fold_batch(lay.images(x.stacked_input(0), True))     # [n*b, ..., ci]
    patches = conv_patches(x, lay, images, kernel)
    if patches is None:
        return None
    n = x.loop_len
    k = tf.shape(patches)[-1]
    filt = tf.reshape(x.input(1).t, tf.stack([n, k, -1]))               # [n, K, co]
    out = tf.matmul(tf.reshape(patches, tf.stack([n, -1, k])), filt)    # [n, b*P, co]
    grid = tf.shape(patches)[1:-1]
    out = tf.reshape(out, tf.concat([tf.reshape(n, [1]), lead[1:], grid, tf.shape(filt)[2:]], 0))
    return [WrappedTensor(lay.result(out), True)]


@converter("Conv2D")
def _conv2d(x: ConversionInput):
    return _conv_forward(x, 2, grouped_ok=True)


@converter("Conv3D")
def _conv3d(x: ConversionInput):
    return _conv_forward(x, 3, grouped_ok=False)


@converter("DepthwiseConv2dNative")
def _depthwise_conv2d(x: ConversionInput):
    if not x.is_stacked(1):
        return fold_emit(x, [0])
    lay = ChannelsLast(x, 2)
    # Depthwise channels are independent: iteration i's channels become n*c channels.
    images = fold_into_channels(lay.images(x.stacked_input(0), True), lay.channel)
    filt = fold_into_channels(x.input(1).t, 2)          # [kh, kw, n*c, m]
    out = lay.emit([images, filt])
    inner = tf.shape(x.input(1).t)[3] * tf.shape(x.input(1).t)[4]
    return [WrappedTensor(lay.result(unfold_from_channels(out, lay.channel, x.loop_len, inner)),
                          True)]


def _swap_batch_blocks(t: tf.Tensor, first: tf.Tensor, second: tf.Tensor) -> tf.Tensor:
    """``[first*second*b, ...] -> [second*first*b, ...]``: swap the two outer batch factors."""
    shape = tf.shape(t)
    rest = shape[1:]
    inner = shape[0] // tf.maximum(first * second, 1)
    split = tf.reshape(t, tf.concat([[first, second, inner], rest], 0))
    perm = [1, 0] + list(range(2, t.shape.rank + 2))
    return tf.reshape(tf.transpose(split, perm), shape)


@converter("SpaceToBatchND")
def _space_to_batch(x: ConversionInput):
    # Dilated convolutions are built from this pair.  Output batch rows are ordered
    # (block offset, image); with the iterations folded into the images they come out as
    # (block, iteration, image) and are regrouped to (iteration, block, image).
    if not invariant_except(x, [0]):
        return None
    n = x.loop_len
    folded, lead = fold_batch(x.input(0).t)
    out = create_op_like(x.op, [folded, x.input(1).t, x.input(2).t])[0]
    blocks = tf.reduce_prod(tf.cast(x.input(1).t, tf.int32))
    out = _swap_batch_blocks(out, blocks, n)
    return [WrappedTensor(unfold_batch(out, tf.stack([n, tf.shape(out)[0] // tf.maximum(n, 1)])),
                          True)]


@converter("BatchToSpaceND")
def _batch_to_space(x: ConversionInput):
    if not invariant_except(x, [0]):
        return None
    n = x.loop_len
    folded, lead = fold_batch(x.input(0).t)          # rows (iteration, block, image)
    blocks = tf.reduce_prod(tf.cast(x.input(1).t, tf.int32))
    out = create_op_like(x.op, [_swap_batch_blocks(folded, n, blocks), x.input(1).t,
                                x.input(2).t])[0]
    return [WrappedTensor(unfold_batch(out, tf.stack([n, tf.shape(out)[0] // tf.maximum(n, 1)])),
                          True)]

# }}}


# {{{ pooling, LRN, top-k, softmax

@converter("MaxPool", "AvgPool", "MaxPool3D", "AvgPool3D", "MaxPoolV2", "LRN")
def _pool(x: ConversionInput):
    return fold_emit(x, [0])


@converter("MaxPoolWithArgmax")
def _max_pool_with_argmax(x: ConversionInput):
    if x.attr("include_batch_in_index"):
        return None  # flat indices would count images of earlier iterations
    return fold_emit(x, [0])


@converter("Softmax", "LogSoftmax")
def _softmax(x: ConversionInput):
    return reemit_stacked(x, [x.input(0).t])


@converter("TopKV2", "NthElement")
def _top_k(x: ConversionInput):
    if x.is_stacked(1):
        return None  # k / n differs per iteration: the output shape would too
    if x.vectorizer.xla and x.op_type == "TopKV2":
        out = _top_k_by_packed_sort(x)
        if out is not None:
            return out
    return reemit_stacked(x, [x.input(0).t, x.input(1).t])


def _top_k_by_packed_sort(x: ConversionInput) -> list[WrappedTensor] | None:
    """Under XLA, a top-k of at least a quarter of the row (``tf.sort``/``tf.argsort`` are
    top-k of the whole row) as one single-operand sort of ``int64`` keys: the value's bits,
    mapped to an integer of the same order and complemented (descending), above the index
    (ascending among ties, as top-k orders them).  XLA:CPU sorts those 3-5x faster than the
    ``(value, index)`` pairs its own top-k sorts.  None for other dtypes, unsorted or small
    ``k``.
    """
    values = x.input(0).t
    k, m = x.op.outputs[0].shape[-1], values.shape[-1]     # k: tf.argsort's is a shape entry
    if (values.dtype not in (tf.float32, tf.int32) or not x.attr("sorted") or k is None
            or m is None or 4 * int(k) < m):
        return None
    from tensorflow.compiler.tf2xla.ops import gen_xla_ops   # XLA-only kernels
    ordered = _order_preserving_int32(values)
    keys = tf.bitwise.left_shift(tf.cast(tf.bitwise.invert(ordered), tf.int64), 32) \
        + tf.range(m, dtype=tf.int64)
    top = gen_xla_ops.xla_sort(keys)[..., :int(k)]
    index = tf.cast(tf.bitwise.bitwise_and(top, 0xFFFFFFFF), x.op.outputs[1].dtype)
    high = tf.bitwise.invert(tf.cast(tf.bitwise.right_shift(top, 32), tf.int32))
    return stacked(_order_preserving_int32(high, values.dtype), index)


def _order_preserving_int32(t: tf.Tensor, dtype: tf.DType | None = None) -> tf.Tensor:
    """``float32``/``int32`` -> ``int32`` with the same order (IEEE total order for floats:
    the sign-magnitude bits of negative floats are flipped); with ``dtype`` the inverse."""
    if (dtype or t.dtype) == tf.int32:
        return t
    bits = t if dtype else tf.bitcast(t, tf.int32)
    flipped = tf.bitwise.bitwise_xor(bits, tf.bitwise.bitwise_and(
        tf.bitwise.right_shift(bits, 31), 0x7FFFFFFF))
    return tf.bitcast(flipped, dtype) if dtype else flipped


@converter("L2Loss")
def _l2_loss(x: ConversionInput):
    t = x.input(0).t
    axes = tf.range(1, tf.rank(t))
    return [WrappedTensor(tf.reduce_sum(tf.square(t), axes) / tf.cast(2, t.dtype), True)]


@converter("SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits")
def _softmax_xent(x: ConversionInput):
    return fold_emit(x, [0, 1])


@converter("InTopKV2", "InTopK")
def _in_top_k(x: ConversionInput):
    return fold_emit(x, [0, 1])

# }}}


# {{{ bias

@converter("BiasAdd", "BiasAddV1")
def _bias_add(x: ConversionInput):
    value, bias = x.input(0), x.input(1)
    fmt = x.attr("data_format") if x.op_type == "BiasAdd" else b"NHWC"
    channels_first = fmt in (b"NCHW", b"NCDHW")
    if not bias.is_stacked:
        if not channels_first:  # the bias applies to the last axis: 4-D stays 4-D if folded
            folded = map_folded(value.t, lambda t: create_op_like(x.op, [t, bias.t])[0])
            return stacked(folded) if folded is not None else reemit_stacked(x, [value.t, bias.t])
        return fold_emit(x, [0])  # channels-first: the channel axis must stay at 1
    rank = x.op.inputs[0].shape.rank
    if rank is None:
        return None
    # A per-iteration bias: [n, c] broadcast against [n?, ..., c, ...] as a plain Add.
    b = tf.cast(bias.t, value.t.dtype)
    c_axis = 1 if channels_first else rank - 1
    b = tf.reshape(b, tf.concat([tf.shape(b)[:1], tf.ones([c_axis], tf.int32), tf.shape(b)[1:],
                                 tf.ones([rank - 1 - c_axis], tf.int32)], 0))
    return [WrappedTensor(tf.add(value.t, b), True)]

# }}}


# {{{ batch normalization

def _bn_channel_axis(x: ConversionInput, rank: int) -> int:
    fmt = x.attr("data_format")
    return rank - 1 if fmt.endswith(b"C") else 1


def batch_norm_channel_folded(x: ConversionInput, n_images: int) -> list[WrappedTensor] | None:
    """Run a ``FusedBatchNorm*``/``FusedBatchNormGrad*`` op with the iterations as channels.

    The first ``n_images`` inputs are images (``[b, h, w, c]``), the rest per-channel vectors.
    Statistics are then computed per (iteration, channel), exactly as each iteration would.
    """
    rank = x.op.inputs[0].shape.rank
    if rank is None:
        return None
    c = _bn_channel_axis(x, rank)
    n = x.loop_len
    workspace = _BN_WORKSPACE.get(x.op.type, (None, None))
    inputs = [fold_into_channels(x.stacked_input(i), c) for i in range(n_images)]
    inputs += [x.input(i).t if i == workspace[0] and not x.is_stacked(i)
               else tf.reshape(x.stacked_input(i), [-1])
               for i in range(n_images, len(x.inputs))]
    outs = create_op_like(x.op, inputs)
    channels = x.op.inputs[0].shape[c]
    if channels is None:
        channels = tf.shape(x.stacked_input(0))[c + 1]
    first = unfold_from_channels(outs[0], c, n, channels)
    return [WrappedTensor(first, True)] + [
        WrappedTensor(o, False) if k == workspace[1] else WrappedTensor(split_leading(o, n, like),
                                                                        True)
        for k, (o, like) in enumerate(zip(outs[1:], x.op.outputs[1:]), 1)]


#: ``op type -> (input index, output index)`` of the V3 ops' opaque workspace
#: (``reserve_space_3``): a scalar on CPU without oneDNN, a oneDNN buffer otherwise.  The folded
#: forward op's workspace belongs to the folded computation as a whole, so it stays one
#: (loop-invariant) value that the folded gradient op takes as it is.
_BN_WORKSPACE = {"FusedBatchNormV3": (None, 5), "FusedBatchNormGradV3": (5, None)}


@converter("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
def _fused_batch_norm(x: ConversionInput):
    if not x.attr("is_training") and invariant_except(x, [0]):
        # Population statistics: rows are independent, fold into the batch.  The other
        # outputs echo the (loop-invariant) mean/variance inputs, so they stay invariant.
        folded, lead = fold_batch(x.input(0).t)
        outs = create_op_like(x.op, [folded] + [w.t for w in x.inputs[1:]])
        return [WrappedTensor(unfold_batch(outs[0], lead), True)] + [
            WrappedTensor(o, False) for o in outs[1:]]
    return batch_norm_channel_folded(x, 1)

# }}}
