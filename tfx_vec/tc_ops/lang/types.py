"""TC scalar types: names accepted in signatures, their NumPy dtypes and C spellings.

Example:
    >>> canonical("int"), c_type("float32"), promote("int32", "float")
    ('int32', 'float', 'float')
"""
from __future__ import annotations

import numpy as np

__all__ = ["TYPE_ALIASES", "canonical", "np_dtype", "c_type", "promote", "is_float", "is_int",
           "from_np_dtype", "rank"]

# canonical name -> (numpy dtype, C type)
_TYPES = {
    "bool": (np.bool_, "bool"),
    "int8": (np.int8, "int8_t"), "int16": (np.int16, "int16_t"),
    "int32": (np.int32, "int32_t"), "int64": (np.int64, "int64_t"),
    "uint8": (np.uint8, "uint8_t"), "uint16": (np.uint16, "uint16_t"),
    "uint32": (np.uint32, "uint32_t"), "uint64": (np.uint64, "uint64_t"),
    "half": (np.float16, "_Float16"), "float": (np.float32, "float"),
    "double": (np.float64, "double"),
}
TYPE_ALIASES = {**{k: k for k in _TYPES}, "int": "int32", "long": "int64", "byte": "uint8",
                "char": "int8", "float16": "half", "float32": "float", "float64": "double"}
# rank for C-like promotion: the larger wins; any float beats any int
_RANK = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
         "half", "float", "double"]


def canonical(name: str) -> str | None:
    """The canonical type name for ``name``, or None when it is not a TC scalar type.

    Example:
        >>> canonical("long"), canonical("float16"), canonical("string")
        ('int64', 'half', None)
    """
    return TYPE_ALIASES.get(name)


def np_dtype(t: str) -> np.dtype:
    """The NumPy dtype of the canonical TC type ``t``.

    Example:
        >>> np_dtype("half"), np_dtype("int64")
        (dtype('float16'), dtype('int64'))
    """
    return np.dtype(_TYPES[t][0])


def c_type(t: str) -> str:
    """The C spelling of TC type ``t`` (aliases accepted).

    Example:
        >>> c_type("int"), c_type("double")
        ('int32_t', 'double')
    """
    return _TYPES[canonical(t)][1]


def from_np_dtype(dtype) -> str | None:
    """The canonical TC type of NumPy ``dtype``, or None when TC has no such type.

    Example:
        >>> from_np_dtype("float32"), from_np_dtype("complex64")
        ('float', None)
    """
    dtype = np.dtype(dtype)
    for name, (d, _) in _TYPES.items():
        if np.dtype(d) == dtype:
            return name
    return None


def is_float(t: str) -> bool:
    """Whether canonical type ``t`` is a floating-point type.

    Example:
        >>> is_float("half"), is_float("int32")
        (True, False)
    """
    return t in ("half", "float", "double")


def is_int(t: str) -> bool:
    """Whether canonical type ``t`` is an integer type (``bool`` is not).

    Example:
        >>> is_int("uint8"), is_int("bool")
        (True, False)
    """
    return t not in ("half", "float", "double", "bool")


def rank(t: str) -> int:
    """Position of ``t`` in the promotion order (a wider type has a larger rank).

    Example:
        >>> rank("int64") > rank("int32"), rank("half") > rank("uint64")
        (True, True)
    """
    return _RANK.index(t)


def promote(a: str, b: str) -> str:
    """C-like arithmetic promotion (ints below int32 promote to int32, as in C).

    Example:
        >>> promote("int8", "int16"), promote("int64", "half")
        ('int32', 'half')
    """
    r = max(_RANK.index(a), _RANK.index(b))
    t = _RANK[r]
    if t in ("bool", "int8", "uint8", "int16", "uint16"):
        return "int32"
    return t
