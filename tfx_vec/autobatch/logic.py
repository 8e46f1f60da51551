"""What rewritten predicates call: ``and``/``or``/``not``, ``==``/``!=`` and truthiness on
per-member values.

The front end rewrites ``a and b`` into ``logical_and(a, b)`` (and so on) in every batched
function, because a batch of members cannot short-circuit together: both sides are evaluated,
and on tensors the result is element-wise.  On plain Python values each helper means exactly
what the operator means (``1.5 or 2`` is ``1.5``).  ``==`` and ``!=`` keep TF2's element-wise
meaning in every mode: in a TF1 graph (``tf.compat.v1.Graph``) ``Tensor.__eq__`` is object
identity, which would make ``n % 2 == 0`` the constant ``False`` for every member.

Example:
    >>> import tensorflow as tf
    >>> logical_or(tf.constant([True, False]), tf.constant([False, False])).numpy().tolist()
    [True, False]
    >>> logical_or(1.5, 2), equal(3, 3.0), truth(tf.constant([0, 4])).numpy().tolist()
    (1.5, True, [False, True])
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import tensorflow as tf
from tensorflow.python.framework import override_binary_operator  # TF2's == promotion
from tensorflow.python.ops import gen_math_ops

__all__ = ["logical_and", "logical_or", "logical_not", "equal", "not_equal", "truth",
           "start_like", "HELPERS", "PREFIX"]

PREFIX = "_ab_"  # names the front end generates; user locals may not start with it


def _batched(x: Any) -> bool:
    return tf.is_tensor(x)


def truth(x: Any) -> Any:
    """Python truthiness per member (``if n:`` on an int tensor means ``n != 0``)."""
    if not _batched(x):
        return bool(x)
    x = tf.convert_to_tensor(x)
    return x if x.dtype == tf.bool else tf.not_equal(x, tf.zeros_like(x))


def logical_and(a: Any, b: Any) -> Any:
    """``a and b`` with both sides already evaluated (element-wise on tensors)."""
    if not (_batched(a) or _batched(b)):
        return a and b
    return tf.logical_and(truth(a), truth(b))


def logical_or(a: Any, b: Any) -> Any:
    """``a or b`` with both sides already evaluated (element-wise on tensors)."""
    if not (_batched(a) or _batched(b)):
        return a or b
    return tf.logical_or(truth(a), truth(b))


def logical_not(a: Any) -> Any:
    """``not a`` (element-wise on tensors)."""
    return tf.logical_not(truth(a)) if _batched(a) else not a


def _tf2_equality(a: Any, b: Any, python_op: Callable, tf_op: Callable, with_none: bool) -> Any:
    """``python_op(a, b)``, or on tensors ``tf_op`` as TF2's ``Tensor.__eq__``/``__ne__`` does
    it (promotion, ``with_none`` against ``None``, no error on incompatible shapes)."""
    if not (_batched(a) or _batched(b)):
        return python_op(a, b)
    if a is None or b is None:
        return with_none
    if not _batched(a):
        a, b = b, a
    a, b = override_binary_operator.maybe_promote_tensors(a, b)
    return tf_op(a, b, incompatible_shape_error=False)


def equal(a: Any, b: Any) -> Any:
    """``a == b`` with TF2's meaning in every mode: element-wise on tensors."""
    return _tf2_equality(a, b, operator.eq, gen_math_ops.equal, False)


def not_equal(a: Any, b: Any) -> Any:
    """``a != b`` with TF2's meaning in every mode (see :func:`equal`)."""
    return _tf2_equality(a, b, operator.ne, gen_math_ops.not_equal, True)


def start_like(start: Any, end: Any) -> Any:
    """The first value of a ``range`` loop counter, batched like the loop's end."""
    end = tf.convert_to_tensor(end)
    return tf.cast(start, end.dtype) + tf.zeros_like(end)


# The names rewritten code calls them by (passed into every compiled primitive).
HELPERS = {f"{PREFIX}and": logical_and, f"{PREFIX}or": logical_or, f"{PREFIX}not": logical_not,
           f"{PREFIX}eq": equal, f"{PREFIX}ne": not_equal, f"{PREFIX}truth": truth,
           f"{PREFIX}start": start_like}
