"""Raw TensorFlow ops, as the custom device sees them: what each one is, its output spec, its replay.

The custom device (``custom_device.py``) receives every op by its TensorFlow op type
(``MatMul``, ``AddV2``...), its attributes as canonical ``NameAttrList`` bytes and its inputs.
This module answers, once per (op type, attributes, input count):

- :func:`describe`: the op's **kind**: ``record`` (it has an XLA kernel and computes on
  tensors), ``host`` (it takes or makes strings, variants or resources, or calls a function:
  datasets, iterators, summaries, checkpoints run on the host as in eager) or ``fallback`` (a
  tensor op without an XLA kernel: run eagerly, counted); the flat input positions XLA needs as
  compile-time constants; whether it may be folded (pure, integer/bool outputs);
- :func:`infer`: the output shapes and dtypes for inputs of given signatures, from TensorFlow's
  own shape functions (the op is built once on placeholders in a private graph; constant inputs
  are real constants there), cached per signature;
- :func:`call`: the op rebuilt inside the graph being traced for the compiled program.

Example:
    >>> import tensorflow as tf
    >>> op = describe("MatMul", attrs_bytes({"T": tf.float32, "transpose_a": False,
    ...                                      "transpose_b": False}), 2)
    >>> op.kind, op.constant
    ('record', ())
    >>> describe("Reshape", attrs_bytes({"T": tf.float32, "Tshape": tf.int32}), 2).constant
    (1,)
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, types_pb2
from tensorflow.python.eager import execute
from tensorflow.python.framework import op_def_registry

from .ops import Spec, Unrecordable, placeholder, scratch_graph

__all__ = ["RawOp", "describe", "infer", "call", "attrs_bytes", "attr_map", "FOLD_LIMIT"]

FOLD_LIMIT = 16   # elements: integer ops on known values this small are evaluated at once
_HOST_TYPES = frozenset({types_pb2.DT_STRING, types_pb2.DT_VARIANT, types_pb2.DT_RESOURCE})
_FOLD_TYPES = frozenset({types_pb2.DT_INT32, types_pb2.DT_INT64, types_pb2.DT_BOOL})


class RawOp(NamedTuple):
    """What the recorder needs to know about one (op type, attributes, input count)."""

    type: str
    attrs: bytes          # canonical NameAttrList bytes (the cache key; lowering parses them)
    kind: str             # "record", "host" or "fallback"
    reason: str           # why "host" or "fallback"
    constant: tuple       # flat input positions XLA needs as compile-time constants
    foldable: bool        # pure op with integer/bool outputs only
    stateful: bool


@functools.lru_cache(maxsize=None)
def _xla_ops() -> frozenset:
    from .custom_device import native
    return frozenset(native().xla_ops())


@functools.lru_cache(maxsize=None)
def _constant_args(op_type: str) -> frozenset:
    from .custom_device import native
    return frozenset(native().constant_args(op_type))


@functools.lru_cache(maxsize=4096)
def attr_map(attrs: bytes) -> dict:
    """The attributes of canonical ``attrs`` bytes as ``{name: AttrValue}``."""
    return dict(attr_value_pb2.NameAttrList.FromString(attrs).attr)


def attrs_bytes(values: dict) -> bytes:
    """Canonical attribute bytes for ``{name: value}`` (DTypes, bools, ints, floats, shapes).

    The same form the custom device gives for an op's own attributes: map entries sorted.
    """
    entries = []
    for name, v in sorted(values.items()):
        av = attr_value_pb2.AttrValue()
        if isinstance(v, tf.DType):
            av.type = v.as_datatype_enum
        elif isinstance(v, bool):
            av.b = v
        elif isinstance(v, int):
            av.i = v
        elif isinstance(v, float):
            av.f = v
        elif isinstance(v, attr_value_pb2.AttrValue):
            av.CopyFrom(v)
        else:
            raise TypeError(f"attrs_bytes: unsupported attribute {name}={v!r}")
        one = attr_value_pb2.NameAttrList()
        one.attr[name].CopyFrom(av)
        entries.append(one.SerializeToString())
    return b"".join(sorted(entries))


def _arg_types(arg: Any, attrs: dict) -> list:
    if arg.type_list_attr:
        return list(attrs[arg.type_list_attr].list.type) if arg.type_list_attr in attrs else []
    dtype = arg.type or (attrs[arg.type_attr].type if arg.type_attr in attrs else 0)
    return [dtype]


def _arg_count(arg: Any, attrs: dict) -> int:
    if arg.number_attr:
        return attrs[arg.number_attr].i if arg.number_attr in attrs else 0
    if arg.type_list_attr:
        return len(attrs[arg.type_list_attr].list.type) if arg.type_list_attr in attrs else 0
    return 1


@functools.lru_cache(maxsize=8192)
def describe(op_type: str, attrs: bytes, n_inputs: int) -> RawOp:
    """What kind of op this is for the recorder (see the module docstring)."""
    op_def = op_def_registry.get(op_type)
    if op_def is None:   # a tf.function (or other library function) called eagerly
        return RawOp(op_type, attrs, "host", "a function call", (), False, True)
    amap = attr_map(attrs)
    types, positions, pos = [], [], 0
    constant_names = _constant_args(op_type)
    for arg in op_def.input_arg:
        count = _arg_count(arg, amap)
        if arg.name in constant_names:
            positions.extend(range(pos, pos + count))
        pos += count
        types += _arg_types(arg, amap)
    out_types = [t for arg in op_def.output_arg for t in _arg_types(arg, amap)]
    stateful = op_def.is_stateful
    if _HOST_TYPES & set(types + out_types):
        return RawOp(op_type, attrs, "host", "it takes or makes strings, variants or resources",
                     (), False, stateful)
    if op_type not in _xla_ops():
        return RawOp(op_type, attrs, "fallback", "no XLA kernel", (), False, stateful)
    foldable = not stateful and bool(out_types) and set(out_types) <= _FOLD_TYPES
    return RawOp(op_type, attrs, "record", "", tuple(positions), foldable, stateful)


# {{{ shape inference: the op on placeholders (constants where the value is known) in a graph

_specs: dict = {}
SPECS_MAX = 50000   # signatures whose output specs are kept (then the cache starts over)


def infer(op: RawOp, inputs: Sequence[Any], sig: tuple) -> Spec:
    """Output spec of ``op`` on ``inputs`` (IR nodes; ``const`` nodes are values), cached on
    ``sig``.  Raises :class:`Unrecordable` when an output shape is not static."""
    spec = _specs.get(sig)
    if spec is not None:
        return spec
    with scratch_graph() as g:
        values = [placeholder(n) for n in inputs]
        outs = g._create_op_internal(op.type, values, attrs=attr_map(op.attrs),
                                     name="lazy_infer").outputs
    flat = []
    for t in outs:
        if not t.shape.is_fully_defined():
            raise Unrecordable(f"{op.type} has a value-dependent output shape {t.shape}")
        flat.append((tuple(t.shape.as_list()), t.dtype))
    spec = Spec(tuple(flat), None if len(flat) == 1 else list(range(len(flat))))
    if len(_specs) >= SPECS_MAX:
        _specs.clear()
    _specs[sig] = spec
    return spec


# }}}


def call(op_type: str, attrs: bytes, values: list) -> Any:
    """Rebuild the op in the graph being traced; one tensor, or a list for several outputs.

    Like TensorFlow's generated op wrappers, the op is recorded on the active gradient tapes
    (a recorded gradient replays the window under a ``tf.GradientTape``).
    """
    g = tf.compat.v1.get_default_graph()
    amap = attr_map(attrs)
    op = g._create_op_internal(op_type, list(values), attrs=amap, name="lazy")
    outs = op.outputs
    if execute.must_record_gradient():
        flat: list = []
        for name in sorted(amap):
            flat += [name, op.get_attr(name)]
        execute.record_gradient(op_type, op.inputs, tuple(flat), outs)
    return outs[0] if len(outs) == 1 else list(outs)
