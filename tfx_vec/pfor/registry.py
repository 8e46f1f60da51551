"""The converter registry: op type -> function that vectorizes one op.

A converter receives a :class:`ConversionInput` (the original op and its already-converted
inputs) and returns one :class:`WrappedTensor` per op output, or ``None`` to say "this case is
not supported" (the vectorizer then runs the op in a per-iteration loop, or raises when
fallbacks are disabled).  Converters are only called when some input is stacked, or when the
op is stateful.

Example (a user-defined converter for an op whose batch semantics are element-wise):
    >>> import tensorflow as tf
    >>> from tfx_vec.pfor.registry import register_converter, WrappedTensor
    >>> @register_converter("MyUnaryOp", override=True)
    ... def _my_unary(x):
    ...     return WrappedTensor(tf.math.abs(x.stacked_input(0)), True)
    >>> lookup("MyUnaryOp") is _my_unary
    True
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple, Sequence, Union

import tensorflow as tf

from tfx_vec.pfor.errors import VectorizationError, op_error

__all__ = ["WrappedTensor", "ConversionInput", "register_converter", "lookup",
           "registered_op_types", "defined_in", "tile_to_stacked"]


class WrappedTensor(NamedTuple):
    """A value of the vectorized program.

    ``t`` has shape ``[n, *per_iteration_shape]`` when ``is_stacked`` (one row per iteration),
    otherwise the per-iteration shape (the value is the same in every iteration).

    Example:
        >>> import tensorflow as tf
        >>> WrappedTensor(tf.zeros([4, 3]), True).is_stacked
        True
    """

    t: tf.Tensor
    is_stacked: bool


ConverterResult = Union[WrappedTensor, Sequence[WrappedTensor], None]
Converter = Callable[["ConversionInput"], ConverterResult]


def tile_to_stacked(t: tf.Tensor, loop_len: tf.Tensor) -> tf.Tensor:
    """Tile a loop-invariant value to ``[n, *t.shape]`` (only when an op really needs it).

    Example:
        >>> import tensorflow as tf
        >>> tile_to_stacked(tf.constant([1, 2]), 3).numpy().tolist()
        [[1, 2], [1, 2], [1, 2]]
    """
    t = tf.convert_to_tensor(t)
    expanded = tf.expand_dims(t, 0)
    multiples = tf.concat([tf.reshape(tf.cast(loop_len, tf.int32), [1]),
                           tf.ones_like(tf.shape(t, out_type=tf.int32))], 0)
    return tf.tile(expanded, multiples)


class ConversionInput:
    """What a converter receives for one op of the loop body: the op, its converted inputs
    (``input(i)``, ``stacked_input(i)``, ``unstacked_input(i)``), the loop length, and ways
    to decline (``require_invariant``, ``decline``) or to run the op per iteration.

    Example (a converter for a hypothetical element-wise op):
        >>> import tensorflow as tf
        >>> def convert(x: ConversionInput):
        ...     if not x.require_invariant(1):          # e.g. a shape argument
        ...         return None
        ...     return WrappedTensor(tf.abs(x.stacked_input(0)), True)
        >>> callable(convert)
        True
    """

    def __init__(self, op: tf.Operation, inputs: list[WrappedTensor], loop_len: tf.Tensor,
                 vectorizer: Any):
        self.op = op
        self.op_type = op.type
        self.inputs = list(inputs)
        self.loop_len = loop_len
        self.vectorizer = vectorizer
        #: Why the converter declined (returned None), for the error when fallbacks are off.
        self.decline_reason: str | None = None

    def input(self, i: int) -> WrappedTensor:
        return self.inputs[i]

    def stacked_input(self, i: int) -> tf.Tensor:
        """Input ``i`` as ``[n, ...]``, tiling it if it is loop-invariant."""
        w = self.inputs[i]
        return w.t if w.is_stacked else tile_to_stacked(w.t, self.loop_len)

    def unstacked_input(self, i: int) -> tf.Tensor:
        """Input ``i``, which must be loop-invariant (e.g. an ``axis`` or a ``shape``)."""
        w = self.inputs[i]
        if w.is_stacked:
            raise op_error(self.op, f"input {i} ({self.op.inputs[i].name}) is expected to be "
                                    "loop invariant (the same in every iteration), but it "
                                    "depends on the loop index")
        return w.t

    def require_invariant(self, *indices: int) -> bool:
        """True when inputs ``indices`` are loop-invariant; otherwise False, recording why
        (a converter then returns None: the op runs per iteration, or the error when
        fallbacks are off names these inputs)."""
        stacked = [i for i in indices if self.inputs[i].is_stacked]
        if stacked:
            names = ", ".join(f"input {i} ({self.op.inputs[i].name})" for i in stacked)
            self.decline_reason = (f"{names} expected to be loop invariant, but depends on "
                                   "the loop index")
        return not stacked

    def per_iteration(self) -> list[WrappedTensor]:
        """Run this op once per iteration (counted in ``fallback_report()``) even when
        fallbacks are off: for ops whose exact result no batched kernel can give (stateless
        random ops with a loop-variant seed), as TensorFlow's pfor does."""
        return self.vectorizer.run_per_iteration(self.op, self.inputs, self.loop_len)

    def decline(self, reason: str) -> None:
        """Return ``x.decline(why)`` from a converter: no vectorized form for this case."""
        self.decline_reason = reason
        return None

    def is_stacked(self, i: int) -> bool:
        return self.inputs[i].is_stacked

    def attr(self, name: str) -> Any:
        return self.op.get_attr(name)

    @property
    def any_stacked(self) -> bool:
        return any(w.is_stacked for w in self.inputs)

    @property
    def stacked_flags(self) -> list[bool]:
        return [w.is_stacked for w in self.inputs]

    def error(self, message: str) -> VectorizationError:
        """A :class:`VectorizationError` naming this op and its user source line."""
        return op_error(self.op, message)

    def __repr__(self) -> str:
        return f"ConversionInput({self.op_type} {self.op.name}, stacked={self.stacked_flags})"


_CONVERTERS: dict[str, Converter] = {}
_DEFINED_IN: dict[str, str] = {}
#: (op type, first module, second module) for every converter registered twice.
DUPLICATES: list[tuple[str, str, str]] = []


def register_converter(*op_types: str, override: bool = False) -> Callable[[Converter], Converter]:
    """Decorator registering ``fn`` as the converter for each of ``op_types``.

    Registering an op type that already has a converter replaces it; without
    ``override=True`` this also warns and is recorded in :data:`DUPLICATES`.

    Example:
        >>> import tensorflow as tf
        >>> @register_converter("MySquareOp", override=True)
        ... def _square(x):
        ...     return WrappedTensor(tf.square(x.stacked_input(0)), True)
        >>> lookup("MySquareOp") is _square
        True
    """
    if not op_types or not all(isinstance(t, str) and t for t in op_types):
        raise TypeError("register_converter needs one or more op type names, e.g. "
                        "@register_converter('MatMul')")

    def decorate(fn: Converter) -> Converter:
        where = getattr(fn, "__module__", "?")
        for t in op_types:
            if t in _CONVERTERS and not override:
                DUPLICATES.append((t, _DEFINED_IN[t], where))
                warnings.warn(f"tfx_vec.pfor: converter for {t} from {_DEFINED_IN[t]} replaced "
                              f"by one from {where}", stacklevel=2)
            _CONVERTERS[t] = fn
            _DEFINED_IN[t] = where
        return fn

    return decorate


def lookup(op_type: str) -> Converter | None:
    """The converter for ``op_type``, or None.

    Example:
        >>> lookup("MatMul") is not None, lookup("NoSuchOp")
        (True, None)
    """
    return _CONVERTERS.get(op_type)


def registered_op_types() -> list[str]:
    """Sorted names of every op type with a converter.

    Example:
        >>> "Conv2D" in registered_op_types() and "FFT" in registered_op_types()
        True
    """
    return sorted(_CONVERTERS)


def defined_in(op_type: str) -> str | None:
    """The module that registered the converter for ``op_type``.

    Example:
        >>> defined_in("FFT")
        'tfx_vec.pfor.converters.spectral_ops'
    """
    return _DEFINED_IN.get(op_type)
