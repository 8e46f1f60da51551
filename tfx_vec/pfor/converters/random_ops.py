"""Converters for random ops, stateful and stateless (paper §3.8).

Every stateful random op (``RandomStandardNormal``, ``RandomUniform``, ``RandomUniformInt``,
``TruncatedNormal``, ``RandomGamma``, ``RandomPoissonV2``, ``Multinomial`` and the
``tf.random.Generator`` op ``RngReadAndSkip``) follows the vectorizer's ``randomness`` option:

- ``'different'`` (default): every iteration gets its own independent draw.  The op is emitted
  once with the batch dimension prepended to its shape (``[n, *shape]``), so the whole loop
  costs one kernel launch.  For a ``tf.random.Generator`` the state is advanced ``n`` times as
  far as one iteration would advance it, and the samples of all iterations are taken from that
  reserved counter range.
- ``'same'``: the op is emitted once with its own shape; every iteration sees that one draw (a
  loop-variant distribution parameter, e.g. a stacked ``alpha`` of ``RandomGamma``, still gives
  one draw per iteration since the distributions differ).
- ``'error'``: a :class:`~tfx_vec.VectorizationError` naming the op and its source line.

Stateless ops (``StatelessRandom*`` V1 and V2, ``StatelessMultinomial``,
``StatelessRandomGetKeyCounter``, ...) are pure functions of their seed: with a loop-invariant
seed and parameters they are loop-invariant (the vectorizer re-emits them unchanged, in every
mode, exactly as the per-iteration loop computes them).  With a loop-variant seed or parameter
no TF kernel reproduces each iteration's draw at once, so they run once per iteration, exactly
-- even with ``fallback_to_while_loop=False``, as in TensorFlow's pfor -- counted in
``fallback_report()``; except for the key/counter produced by our own ``RngReadAndSkip``
conversion, whose samples are drawn in one op.

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> x = tfx_vec.pfor(lambda i: tf.random.normal([3]), 4)
    >>> x.shape.as_list()
    [4, 3]
"""
from __future__ import annotations

import tensorflow as tf

from tfx_vec.pfor.converters._helpers import create_op_like, move_axis, fold_batch, unfold_batch
from tfx_vec.pfor.registry import ConversionInput, WrappedTensor, register_converter

#: Registration modules: their converters are reached through the registry.
__all__: list[str] = []

MODES = ("different", "same", "error")


def randomness_mode(x: ConversionInput) -> str:
    """The vectorizer's ``randomness`` option (``'different'`` when it carries none)."""
    v = x.vectorizer
    mode = getattr(v, "randomness", None)
    if mode is None:
        mode = getattr(getattr(v, "options", None), "randomness", None)
    mode = mode or "different"
    if mode not in MODES:
        raise x.error(f"randomness={mode!r} is not one of {MODES}")
    return mode


def _check_mode(x: ConversionInput) -> str:
    mode = randomness_mode(x)
    if mode == "error":
        raise x.error("random op inside pfor with randomness='error'; pass "
                      "randomness='different' (independent draws per iteration) or 'same' "
                      "(one draw shared by all iterations)")
    return mode


def _batched_shape(shape: tf.Tensor, n: tf.Tensor) -> tf.Tensor:
    return tf.concat([tf.reshape(tf.cast(n, shape.dtype), [1]), shape], 0)


def _unchanged(x: ConversionInput) -> list[WrappedTensor]:
    return [WrappedTensor(t, False) for t in create_op_like(x.op, [w.t for w in x.inputs])]


# {{{ stateful ops whose only tensor input is the shape

@register_converter("RandomStandardNormal", "RandomUniform", "TruncatedNormal")
def _convert_shape_only(x: ConversionInput):
    if x.is_stacked(0):
        return None  # a loop-variant shape: ragged, let the fallback report it
    if _check_mode(x) == "same":
        return _unchanged(x)
    shape = _batched_shape(x.unstacked_input(0), x.loop_len)
    return [WrappedTensor(create_op_like(x.op, [shape])[0], True)]


@register_converter("RandomUniformInt")
def _convert_uniform_int(x: ConversionInput):
    if x.is_stacked(0):
        return None
    mode = _check_mode(x)
    if x.is_stacked(1) or x.is_stacked(2):
        # Loop-variant bounds: draw in [0, 1) once and scale per iteration.
        minval, maxval = x.stacked_input(1), x.stacked_input(2)
        shape = _batched_shape(x.unstacked_input(0), x.loop_len)
        u = tf.random.uniform(shape, dtype=tf.float64)
        rank = tf.size(x.unstacked_input(0))
        bshape = tf.concat([tf.shape(minval), tf.ones([rank], tf.int32)], 0)
        lo = tf.reshape(tf.cast(minval, tf.float64), bshape)
        hi = tf.reshape(tf.cast(maxval, tf.float64), bshape)
        out = tf.cast(tf.floor(lo + u * (hi - lo)), x.op.outputs[0].dtype)
        return [WrappedTensor(tf.minimum(out, tf.cast(hi, out.dtype) - 1), True)]
    if mode == "same":
        return _unchanged(x)
    shape = _batched_shape(x.unstacked_input(0), x.loop_len)
    return [WrappedTensor(create_op_like(x.op, [shape, x.inputs[1].t, x.inputs[2].t])[0], True)]


@register_converter("RandomGamma", "RandomPoissonV2")
def _convert_parameterized(x: ConversionInput):
    """``out = op(shape, param)`` has shape ``shape + param.shape``."""
    if x.is_stacked(0):
        return None
    mode = _check_mode(x)
    shape = x.unstacked_input(0)
    param = x.inputs[1]
    if param.is_stacked:
        k = shape.shape.num_elements()
        if k is None:
            return None
        out = create_op_like(x.op, [shape, param.t])[0]  # [*shape, n, *param]
        return [WrappedTensor(move_axis(out, k, 0), True)]
    if mode == "same":
        return _unchanged(x)
    out = create_op_like(x.op, [_batched_shape(shape, x.loop_len), param.t])[0]
    return [WrappedTensor(out, True)]


@register_converter("Multinomial")
def _convert_multinomial(x: ConversionInput):
    if x.is_stacked(1):
        return None
    mode = _check_mode(x)
    logits = x.inputs[0]
    if not logits.is_stacked and mode == "same":
        return _unchanged(x)
    flat, lead = fold_batch(x.stacked_input(0))  # [n*b, classes]
    out = create_op_like(x.op, [flat, x.inputs[1].t])[0]
    return [WrappedTensor(unfold_batch(out, lead), True)]

# }}}


# {{{ tf.random.Generator

_STATE_OPS = ("RngReadAndSkip",)
#: Ops that only move bits of the generator state around, between RngReadAndSkip and a sampler.
_STATE_PASSTHROUGH = ("StridedSlice", "Bitcast", "Identity", "Reshape", "Slice", "Cast")


@register_converter("RngReadAndSkip")
def _convert_rng_read_and_skip(x: ConversionInput):
    """``state = read(resource); resource.counter += delta; return state``.

    'different': skip ``n * delta`` once; iteration ``i`` sees the state advanced by
    ``i * delta`` (stacked), so each iteration owns ``delta`` counters, as in the loop.
    """
    if x.is_stacked(0) or x.is_stacked(1) or x.is_stacked(2):
        return None
    if _check_mode(x) == "same":
        return _unchanged(x)
    resource, alg, delta = (w.t for w in x.inputs)
    n64 = tf.cast(x.loop_len, tf.uint64)
    state = create_op_like(x.op, [resource, alg, delta * n64])[0]  # int64 [3] (philox)
    offsets = tf.cast(tf.range(x.loop_len), tf.int64) * tf.cast(delta, tf.int64)
    pad = tf.zeros(tf.stack([x.loop_len, tf.size(state) - 1]), tf.int64)
    return [WrappedTensor(state[None, :] + tf.concat([offsets[:, None], pad], 1), True)]


def _from_generator(t: tf.Tensor, depth: int = 6) -> bool:
    """Whether ``t`` (in the loop-body graph) is a slice of our converted generator state."""
    for _ in range(depth):
        if t.op.type in _STATE_OPS:
            return True
        if t.op.type not in _STATE_PASSTHROUGH or not t.op.inputs:
            return False
        t = t.op.inputs[0]
    return False


# Stateless V2 samplers: inputs (shape, key, counter, alg, *params).
_V2_SAMPLERS = ("StatelessRandomNormalV2", "StatelessRandomUniformV2",
                "StatelessTruncatedNormalV2", "StatelessRandomUniformIntV2",
                "StatelessRandomUniformFullIntV2")


@register_converter(*_V2_SAMPLERS)
def _convert_stateless_v2(x: ConversionInput):
    """Samples keyed by our generator conversion: one draw of ``[n, *shape]``.

    The draw uses iteration 0's key and counter; the state was advanced by ``n * delta``, so the
    ``n`` samples come from counters no other draw uses.  Any other loop-variant key, counter
    or parameter: exactly, once per iteration (:func:`_convert_stateless`).
    """
    key, counter = x.op.inputs[1], x.op.inputs[2]
    if x.is_stacked(0) or x.is_stacked(3) or any(w.is_stacked for w in x.inputs[4:]):
        return _convert_stateless(x)
    if not (_from_generator(key) and _from_generator(counter)):
        return _convert_stateless(x)
    first = [w.t[0] if w.is_stacked else w.t for w in x.inputs[1:3]]
    shape = _batched_shape(x.unstacked_input(0), x.loop_len)
    out = create_op_like(x.op, [shape, *first, *(w.t for w in x.inputs[3:])])[0]
    return [WrappedTensor(out, True)]


#: Stateless samplers and seed ops other than the V2 samplers above.
_STATELESS = ("StatelessRandomNormal", "StatelessRandomUniform", "StatelessRandomUniformInt",
              "StatelessRandomUniformFullInt", "StatelessTruncatedNormal",
              "StatelessMultinomial", "StatelessRandomBinomial", "StatelessRandomGammaV2",
              "StatelessRandomGammaV3", "StatelessRandomPoisson",
              "StatelessParameterizedTruncatedNormal", "StatelessRandomGetKeyCounter",
              "StatelessRandomGetKeyCounterAlg", "StatelessShuffle")


@register_converter(*_STATELESS)
def _convert_stateless(x: ConversionInput):
    """A stateless op with a loop-variant seed or parameter: each iteration's draw is a
    function of its own seed, which no batched kernel reproduces, so the op runs once per
    iteration -- exactly, and (as in TensorFlow's pfor) even when fallbacks are off; it is
    counted in ``fallback_report()``."""
    return x.per_iteration()

# }}}
