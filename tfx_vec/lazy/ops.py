"""The op table: which tf APIs record lazily, how their arguments split into inputs and attrs.

One generic path records every covered API (:func:`record`): the call's arguments are bound to
the API's parameter names; *tensor parameters* (declared per op in :data:`_TABLE`) become IR
inputs, every other argument becomes a hashable attr.  The output shape and dtype come from a
per-(op, attrs, input signature) cache, filled on a miss by calling the API once on placeholders
in a private graph (TensorFlow's own C++ shape functions, so every covered op gets its exact
static shape).  An op whose output shape depends on values (``tf.unique``, one-argument
``tf.where``, ...) cannot be recorded and falls back to eager.

Lowering replays a node by calling the same API with the replayed tensors (:func:`call`).

Example:
    >>> OPS["math.add"].tensors
    ('x', 'y')
    >>> len(OPS) >= 150
    True
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple

import numpy as np
import tensorflow as tf

__all__ = ["OpDef", "OPS", "BY_API", "call", "infer", "freeze", "Unrecordable", "Spec",
           "scratch_graph", "placeholder"]


class Unrecordable(Exception):
    """Internal: this call cannot be recorded (dynamic shape, unhashable attr); fall back."""


class OpDef(NamedTuple):
    name: str                 # "nn.relu": the public path under ``tf.``
    api: Callable             # the tf function called at replay and shape inference
    params: tuple             # parameter names in order (``name`` included, never recorded)
    tensors: tuple            # parameters holding one tensor
    lists: tuple              # parameters holding a list of tensors
    scalars: bool             # Python scalars in tensor params become program parameters
    varargs: str | None       # name of a *args parameter of tensors (einsum)


# {{{ the table: "path: tensor params" per line; "*p" marks a list parameter.  A group flag says
# whether Python scalars are parameters (elementwise math) or baked constants (everything else).

_ELEMENTWISE_UNARY = """
math.abs math.acos math.acosh math.asin math.asinh math.atan math.atanh math.ceil math.cos
math.cosh math.digamma math.erf math.erfc math.erfinv math.exp math.expm1 math.floor
math.is_finite math.is_inf math.is_nan math.lgamma math.log math.log1p math.log_sigmoid
math.logical_not math.negative math.reciprocal math.reciprocal_no_nan math.rint math.round
math.rsqrt math.sigmoid math.sign math.sin math.sinh math.softplus math.sqrt math.square
math.tan math.tanh math.ndtri math.softsign math.bessel_i0e math.bessel_i1e math.conj
math.real math.imag math.invert_permutation bitwise.invert
nn.relu nn.relu6 nn.elu nn.selu nn.gelu nn.leaky_relu nn.silu nn.softmax nn.log_softmax
nn.l2_normalize nn.l2_loss nn.crelu
cast saturate_cast zeros_like ones_like identity stop_gradient
"""

_ELEMENTWISE_BINARY = """
math.add math.subtract math.multiply math.divide math.truediv math.floordiv math.floormod
math.pow math.maximum math.minimum math.squared_difference math.atan2 math.equal
math.not_equal math.less math.less_equal math.greater math.greater_equal math.logical_and
math.logical_or math.logical_xor math.divide_no_nan math.multiply_no_nan math.xlogy math.xdivy
math.xlog1py truncatediv truncatemod math.zeta math.igamma math.igammac
math.polygamma math.nextafter bitwise.bitwise_and bitwise.bitwise_or bitwise.bitwise_xor
bitwise.left_shift bitwise.right_shift
"""

_SCALAR_PARAM_OPS = """
clip_by_value: t clip_value_min clip_value_max
math.add_n: *inputs
math.accumulate_n: *inputs
where: condition x y
math.scalar_mul: scalar x
"""

_STRUCTURAL_OPS = """
reduce_sum: input_tensor
reduce_mean: input_tensor
reduce_max: input_tensor
reduce_min: input_tensor
reduce_prod: input_tensor
reduce_any: input_tensor
reduce_all: input_tensor
reduce_logsumexp: input_tensor
math.reduce_std: input_tensor
math.reduce_variance: input_tensor
math.count_nonzero: input
argmax: input
argmin: input
math.cumsum: x
math.cumprod: x
math.cumulative_logsumexp: x
math.top_k: input
math.in_top_k: targets predictions
math.unsorted_segment_sum: data segment_ids
math.unsorted_segment_max: data segment_ids
math.unsorted_segment_mean: data segment_ids
nn.moments: x
sort: values
argsort: values
searchsorted: sorted_sequence values
reshape: tensor shape
transpose: a
concat: *values
stack: *values
unstack: value
split: value
squeeze: input
expand_dims: input
tile: input multiples
pad: tensor paddings
slice: input_ begin size
strided_slice: input_ begin end strides
gather: params indices
gather_nd: params indices
scatter_nd: indices updates shape
tensor_scatter_nd_update: tensor indices updates
tensor_scatter_nd_add: tensor indices updates
tensor_scatter_nd_sub: tensor indices updates
tensor_scatter_nd_max: tensor indices updates
tensor_scatter_nd_min: tensor indices updates
one_hot: indices
reverse: tensor
roll: input shift axis
broadcast_to: input shape
repeat: input repeats
fill: dims value
sequence_mask: lengths
math.confusion_matrix: labels predictions
matmul: a b
linalg.matvec: a b
tensordot: a b
linalg.trace: x
linalg.diag: diagonal
linalg.diag_part: input
linalg.set_diag: input diagonal
linalg.band_part: input num_lower num_upper
linalg.matrix_transpose: a
linalg.norm: tensor
linalg.cholesky: input
linalg.triangular_solve: matrix rhs
linalg.inv: input
linalg.logdet: matrix
linalg.solve: matrix rhs
linalg.cholesky_solve: chol rhs
linalg.qr: input
linalg.eigh: tensor
linalg.cross: a b
linalg.normalize: tensor
linalg.global_norm: *t_list
linalg.adjoint: matrix
nn.conv1d: input filters
nn.conv2d: input filters
nn.conv3d: input filters
nn.convolution: input filters
nn.conv2d_transpose: input filters output_shape
nn.depthwise_conv2d: input filter
nn.max_pool1d: input
nn.max_pool2d: input
nn.avg_pool1d: input
nn.avg_pool2d: input
nn.max_pool: input
nn.avg_pool: input
nn.pool: input
nn.bias_add: value bias
nn.batch_normalization: x mean variance offset scale
nn.softmax_cross_entropy_with_logits: labels logits
nn.sparse_softmax_cross_entropy_with_logits: labels logits
nn.sigmoid_cross_entropy_with_logits: labels logits
nn.weighted_cross_entropy_with_logits: labels logits
nn.log_poisson_loss: targets log_input
nn.embedding_lookup: params ids
nn.local_response_normalization: input
nn.normalize_moments: counts mean_ss variance_ss shift
nn.space_to_depth: input
nn.depth_to_space: input
nn.dropout: x
nn.experimental.stateless_dropout: x seed
random.shuffle: value
random.stateless_normal: shape seed
random.stateless_uniform: shape seed
image.resize: images
image.flip_left_right: image
image.flip_up_down: image
image.per_image_standardization: image
signal.frame: signal
einsum: *inputs
"""
# }}}

OPS: dict[str, OpDef] = {}
BY_API: dict[int, OpDef] = {}     # id(tf function) -> OpDef


def _resolve(path: str) -> Callable:
    obj: Any = tf
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _define(path: str, tensors: list[str], scalars: bool) -> None:
    api = _resolve(path)
    sig = inspect.signature(api)
    params, varargs = [], None
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            varargs = p.name
        elif p.kind is not inspect.Parameter.VAR_KEYWORD:
            params.append(p.name)  # "name" too: gen ops pass it positionally; record drops it
    singles = tuple(t for t in tensors if not t.startswith("*"))
    lists = tuple(t[1:] for t in tensors if t.startswith("*") and t[1:] != varargs)
    unknown = [t for t in singles + lists if t not in params]
    if unknown:
        raise AssertionError(f"op table: {path} has no parameter(s) {unknown}")
    op = OpDef(path, api, tuple(params), singles, lists, scalars, varargs)
    OPS[path] = op
    BY_API[id(api)] = op


def _load() -> None:
    for group, scalars in ((_ELEMENTWISE_UNARY, True), (_ELEMENTWISE_BINARY, True)):
        for path in group.split():
            api = _resolve(path)
            names = [p for p in inspect.signature(api).parameters if p != "name"]
            n = 1 if group is _ELEMENTWISE_UNARY else 2
            _define(path, names[:n], scalars)
    for group, scalars in ((_SCALAR_PARAM_OPS, True), (_STRUCTURAL_OPS, False)):
        for line in group.strip().splitlines():
            path, _, rest = line.partition(":")
            _define(path.strip(), rest.split(), scalars)


_load()


# {{{ getitem: Python indexing recorded as one op whose attr is the frozen slice spec

def _thaw_index(spec: Any) -> Any:
    if isinstance(spec, tuple) and spec and spec[0] == "slice":
        return slice(spec[1], spec[2], spec[3])
    if isinstance(spec, tuple) and spec and spec[0] == "tuple":
        return tuple(_thaw_index(s) for s in spec[1:])
    if spec == "...":
        return Ellipsis
    return spec


def freeze_index(spec: Any) -> Any:
    """A hashable form of a ``__getitem__`` key made of ints, slices, ``...`` and ``None``."""
    if isinstance(spec, tuple):
        return ("tuple",) + tuple(freeze_index(s) for s in spec)
    if isinstance(spec, slice):
        parts = (spec.start, spec.stop, spec.step)
        if not all(p is None or isinstance(p, (int, np.integer)) for p in parts):
            raise Unrecordable("slice bounds must be Python ints")
        return ("slice",) + tuple(None if p is None else int(p) for p in parts)
    if spec is Ellipsis:
        return "..."
    if spec is None or (isinstance(spec, (int, np.integer)) and not isinstance(spec, bool)):
        return None if spec is None else int(spec)
    raise Unrecordable(f"index {type(spec).__name__}")


def getitem(tensor: tf.Tensor, index: Any) -> tf.Tensor:
    """Replay of ``tensor[index]`` from its frozen index."""
    return tensor[_thaw_index(index)]


OPS["getitem"] = GETITEM = OpDef("getitem", getitem, ("tensor", "index"), ("tensor",), (),
                                 False, None)
# }}}


_ATOMS = frozenset({type(None), bool, int, float, str, complex, tf.DType})


def freeze(value: Any) -> Any:
    """A hashable, replayable form of a non-tensor argument, or :class:`Unrecordable`."""
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind is list or kind is tuple:
        return tuple([v if type(v) in _ATOMS else freeze(v) for v in value])
    if value is None or isinstance(value, (bool, int, float, str, complex, tf.DType)):
        return value
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, tf.TensorShape):
        if value.rank is None:
            raise Unrecordable("unknown-rank TensorShape")
        return tuple(value.as_list())
    if isinstance(value, np.ndarray) and value.size <= 64:
        return tuple(freeze(v) for v in value.tolist()) if value.ndim else value.item()
    if isinstance(value, np.dtype):
        return tf.as_dtype(value)
    if isinstance(value, type) and issubclass(value, np.generic):
        return tf.as_dtype(value)
    if isinstance(value, tf.Tensor) and not isinstance(value, tf.__internal__.SymbolicTensor) \
            and value.shape.num_elements() is not None and value.shape.num_elements() <= 64 \
            and (value.dtype.is_integer or value.dtype == tf.bool):
        return freeze(value.numpy())
    raise Unrecordable(f"argument of type {type(value).__name__}")


def call(op: OpDef, values: list, layout: tuple, attrs: tuple) -> Any:
    """Call ``op``'s API with replayed ``values`` laid out by ``layout`` and keyword ``attrs``."""
    kwargs = dict(attrs)
    pos: list = []
    i = 0
    for param, count in layout:
        if count < 0:
            kwargs[param] = values[i]
            i += 1
        elif param == op.varargs:
            pos = values[i:i + count]
            i += count
        else:
            kwargs[param] = list(values[i:i + count])
            i += count
    kwargs.pop("name", None)
    if op.varargs:
        equation = kwargs.pop(op.params[0])
        return op.api(equation, *pos, **kwargs)
    return op.api(**kwargs)


class Spec(NamedTuple):
    """Inferred output of one call: flat (shape, dtype) list and the nest structure (or None)."""

    flat: tuple
    structure: Any


_spec_cache: dict = {}
_SPEC_CACHE_MAX = 50000
_graph: list = [None, 0]


def infer(op: OpDef, layout: tuple, attrs: tuple, inputs: tuple, sig: tuple) -> Spec:
    """Output spec of ``op`` on inputs of signature ``sig`` (cached)."""
    spec = _spec_cache.get(sig)
    if spec is not None:
        return spec
    with scratch_graph():
        vals = [placeholder(n) for n in inputs]
        out = call(op, vals, layout, attrs)
    flat = tf.nest.flatten(out)
    shapes = []
    for t in flat:
        if not isinstance(t, tf.Tensor):
            raise Unrecordable(f"{op.name} returns a {type(t).__name__}")
        if not t.shape.is_fully_defined():
            raise Unrecordable(f"{op.name} has a value-dependent output shape {t.shape}")
        shapes.append((tuple(t.shape.as_list()), t.dtype))
    structure = None if isinstance(out, tf.Tensor) else out
    spec = Spec(tuple(shapes), structure)
    if len(_spec_cache) >= _SPEC_CACHE_MAX:  # shapes that never repeat must not grow it forever
        _spec_cache.clear()
    _spec_cache[sig] = spec
    return spec


def scratch_graph() -> Any:
    """A private graph for shape inference (a fresh one now and then bounds its memory)."""
    if _graph[0] is None or _graph[1] > 2000:
        _graph[0], _graph[1] = tf.Graph(), 0
    _graph[1] += 1
    return _graph[0].as_default()


def placeholder(node) -> Any:
    """A stand-in for an IR node while inferring shapes: a constant for a baked ``const``,
    else a placeholder of the node's shape and dtype."""
    if node.op == "const":
        value, dtype = node.attrs
        return value if dtype is None else tf.constant(np.array(value), dtype)
    return tf.compat.v1.placeholder(node.dtype, node.shape)
