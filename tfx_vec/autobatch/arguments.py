"""The arguments of a call to a batched function: bound to its parameters, batched.

:func:`bind` matches positional and keyword arguments to the parameters (and keyword options
to the runtime's options) as Python would, with errors that say what the function takes.
:func:`batch` makes every argument a (nested tuple/namedtuple/dict of) tensor(s) with one
leading batch dimension: lists and NumPy arrays become tensors, a value with no batch dimension
(a Python number, a rank-0 tensor) or a leading dimension of 1 is shared by every member
(broadcast), and the batch size is the one leading dimension the others agree on -- static, or
unknown at trace time in a graph.  Every runtime gets the same batched arguments.

Example:
    >>> import tensorflow as tf
    >>> args, weak = batch("f", ("n", "k"), [[3, 4, 5], 2])
    >>> [a.numpy().tolist() for a in args], weak
    ([[3, 4, 5], [2, 2, 2]], [(False,), (True,)])
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf

from .errors import AutobatchError
from .types import leading, weak_of

__all__ = ["bind", "batch"]

_MISSING = object()


def bind(name: str, params: Sequence[str], args: Sequence[Any], kwargs: Mapping[str, Any],
         options: Sequence[str]) -> tuple[list, dict]:
    """``(values, options)``: one value per parameter, and the keyword options given."""
    if not kwargs and len(args) == len(params):
        return list(args), {}
    signature = f"{name}({', '.join(params)})"
    if len(args) > len(params):
        raise AutobatchError(f"{signature} takes {len(params)} argument(s), got {len(args)}; "
                             "each argument is a batch (one value per member along its leading "
                             "dimension)")
    values = list(args) + [_MISSING] * (len(params) - len(args))
    chosen = {}
    for key, value in kwargs.items():
        if key in params:
            if key in options:
                raise AutobatchError(
                    f"{signature}: {key!r} is both a parameter and an option of ab.function; "
                    f"pass the argument positionally and the option with "
                    f"ab.function({key}=...)")
            if values[params.index(key)] is not _MISSING:
                raise AutobatchError(f"{signature} got multiple values for argument {key!r}")
            values[params.index(key)] = value
        elif key in options:
            chosen[key] = value
        else:
            raise AutobatchError(
                f"{signature} got an unexpected keyword argument {key!r}; its parameters are "
                f"{list(params)} and the options {sorted(options)}")
    missing = [p for p, v in zip(params, values) if v is _MISSING]
    if missing:
        raise AutobatchError(f"{signature} is missing argument(s) {missing}")
    return values, chosen


def _tensors(name: str, k: int, value: Any) -> Any:
    """A structure of tensors; a list is one array (a tuple is a structure)."""
    if isinstance(value, list):
        try:
            return tf.convert_to_tensor(value)
        except (ValueError, TypeError) as e:
            raise AutobatchError(
                f"argument {k} of {name} is a list that is not one array ({e}); pass an "
                "array or tensor with the batch first, or a tuple for a structure of batched "
                "values") from None
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_tensors(name, k, v) for v in value))
    if isinstance(value, tuple):
        return tuple(_tensors(name, k, v) for v in value)
    if isinstance(value, dict):
        return {key: _tensors(name, k, v) for key, v in value.items()}
    try:
        return tf.convert_to_tensor(value)
    except (ValueError, TypeError) as e:
        raise AutobatchError(f"argument {k} of {name} ({type(value).__name__}) is not a tensor "
                             f"or a structure of tensors: {e}") from None


def batch(name: str, params: Sequence[str], values: Sequence[Any]) -> tuple[tuple, list | None]:
    """``(args, weak)``: the arguments batched (see the module docstring) and, per argument,
    which leaves were Python literals (weakly typed; None: there are none)."""
    if values and all(isinstance(v, tf.Tensor) for v in values):  # the common case, fast
        leads = {leading(v.shape) if v.shape.rank else 0 for v in values}
        if len(leads) == 1 and None not in leads and 0 not in leads:
            return tuple(values), None
    args = [_tensors(name, k, v) for k, v in enumerate(values)]
    weak = [(False,) if isinstance(v, list) else weak_of(v) for v in values]
    leaves = [x for a in args for x in tf.nest.flatten(a)]
    batched = [x for x in leaves if x.shape.rank]
    if not batched:
        given = ", ".join(repr(v) for v in values)
        example = (", ".join(f"[{v!r}]" for v in values)
                   if all(np.ndim(v) == 0 for v in values) else "...")
        raise AutobatchError(
            f"{name}({given}): no argument has a batch dimension.  A batched function runs once "
            "per member along the leading dimension of its arguments: call "
            f"{name}({example}) for one member, or pass arrays or tensors whose first "
            "dimension is the batch (a number, or a leading dimension of 1, is then shared by "
            "every member)")
    sizes = {leading(x.shape) for x in batched} - {1}
    static = sizes - {None}
    if len(static) > 1:
        raise AutobatchError(
            f"{name}: the arguments' leading (batch) dimensions disagree: "
            f"{[leading(x.shape) for x in batched]} (a leading dimension of 1, or none, "
            "is shared by every member)")
    if static:
        size = next(iter(static))
    elif None in sizes:
        size = tf.shape(next(x for x in batched if leading(x.shape) is None))[0]
    else:
        size = 1

    def fitted(x: tf.Tensor) -> tf.Tensor:
        if x.shape.rank and leading(x.shape) is None and isinstance(size, int):
            return tf.ensure_shape(x, [size] + x.shape.as_list()[1:])
        if x.shape.rank == 0 or (leading(x.shape) == 1 and not (isinstance(size, int)
                                                                 and size == 1)):
            rest = x.shape.as_list()[1:] if x.shape.rank else []
            return tf.broadcast_to(x, tf.concat([tf.reshape(size, [1]),
                                                 tf.constant(rest, tf.int32)], 0))
        return x
    return tuple(tf.nest.map_structure(fitted, a) for a in args), weak
