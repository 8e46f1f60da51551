"""C identifiers for TC names (shared by the printers and the micro-kernel emitter).

Example:
    >>> c_name("2LUT"), c_name("int"), c_name("tc_x"), c_name("A")
    ('_2LUT', 'int_', 'tc_x_', 'A')
"""
from __future__ import annotations

import re

__all__ = ["c_name"]

_C_RESERVED = set("""auto break case char const continue default do double else enum extern
float for goto if inline int long register restrict return short signed sizeof static struct
switch typedef union unsigned void volatile while bool args true false main NULL""".split())
_ISL_ITER = re.compile(r"_c\d+$")


def c_name(name: str) -> str:
    """A C identifier for a TC name (TC allows leading digits and C keywords); names the
    generated code uses itself (``tc_...``, isl's ``_c0``) are suffixed.

    Example:
        >>> c_name("2LUT"), c_name("while")
        ('_2LUT', 'while_')
    """
    if name in _C_RESERVED or _ISL_ITER.match(name) or name.startswith("tc_"):
        return name + "_"
    if name[0].isdigit():
        return "_" + name
    return name
