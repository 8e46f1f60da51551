"""What every backend checks before it generates native code: the kernel stays in bounds.

Range inference (``lang/ranges.py``) proves every subscript lies inside its tensor with exact
integer arithmetic.  Generated code computes loops and subscripts in 32-bit ``int``, so the
proof carries over only when no value the code computes can overflow.  :func:`check_native_bounds`
makes sure of that, and of the rest of what the generated loops rely on, for sizes and options
that may come from an untrusted graph:

- every size, tensor extent and tensor element count is at most :data:`MAX_EXTENT` (2**30), and
  every integer option (tile, threads, blocks, unroll) at most :data:`MAX_OPTION` (2**24), so a
  loop counter plus its step never leaves ``int``;
- every left side writes inside its tensor (index ranges within its shape);
- every sub-expression of every static subscript stays within ``int``.

Example:
    >>> from tfx_vec.tc_ops.lang import parse
    >>> from tfx_vec.tc_ops.lang.sema import check
    >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
    >>> from tfx_vec.tc_ops.options import MappingOptions
    >>> from tfx_vec.tc_ops.backends import KernelSpec
    >>> d = check(parse("def f(float(N) A) -> (B) { B(i) = A(i * 65536 * 32768 / 65536 "
    ...                 "/ 32768) where i in 0:4 }").defs[0])
    >>> spec = KernelSpec(d, infer_ranges(d, {"A": (4,)}), MappingOptions())
    >>> try:
    ...     check_native_bounds(spec)
    ... except TcRangeError as e:
    ...     print(e.message)  # doctest: +ELLIPSIS
    in def f: subscript i * 65536 * 32768 of A takes values up to 6442450944, beyond the 32-bit ...
"""
from __future__ import annotations

from ..errors import TcOptionsError, TcRangeError, TcShapeError
from ..lang import ast as A
from ..lang.printer import expr_to_tc
from ..lang.ranges import interval
from . import KernelSpec

__all__ = ["check_native_bounds", "MAX_EXTENT", "MAX_OPTION"]

#: The largest size, tensor extent or element count a generated kernel handles.
MAX_EXTENT = 2 ** 30
#: The largest value of an integer mapping option.
MAX_OPTION = 2 ** 24
_INT_MIN, _INT_MAX = -2 ** 31, 2 ** 31 - 1


def check_native_bounds(spec: KernelSpec) -> None:
    """Raise TcShapeError, TcRangeError or TcOptionsError unless code generated for ``spec``
    computes only in-range ``int`` values and writes only inside its tensors."""
    d, r = spec.cdef, spec.ranges
    _check_extents(d, r)
    _check_options(d.name, spec.options)
    sizes = {k: (v, v) for k, v in r.sizes.items()}
    for cs in d.stmts:
        ranges = r.stmt_ranges[cs.index]
        env = {**sizes, **{v: (lo, hi - 1) for v, (lo, hi) in ranges.items()}}
        shape, origin = r.shapes[cs.stmt.lhs], r.origin(cs.stmt.lhs)
        for k, v in enumerate(cs.stmt.lhs_indices):
            lo, hi = ranges[v]      # element i of a range starting at origin o is i - o
            if lo < origin[k] or hi > origin[k] + shape[k]:
                raise TcRangeError(f"in def {d.name}: {cs.stmt.lhs} is written at {v} in "
                                   f"[{lo}, {hi}) but dimension {k} holds "
                                   f"[{origin[k]}, {origin[k] + shape[k]})",
                                   cs.stmt.lhs_index_spans[k], d.source or None)
        for call in cs.reads:
            for arg in call.args:
                for sub in A.walk(arg):
                    iv = interval(sub, env, r.shapes)
                    if iv is not None and (iv[0] < _INT_MIN or iv[1] > _INT_MAX):
                        bad = iv[1] if iv[1] > _INT_MAX else iv[0]
                        raise TcRangeError(
                            f"in def {d.name}: subscript {expr_to_tc(sub)} of {call.name} takes "
                            f"values up to {bad}, beyond the 32-bit integers generated kernels "
                            "compute in", getattr(call, "span", None), d.source or None)


def _check_extents(d, r) -> None:
    for name, v in r.sizes.items():
        if not 0 <= v <= MAX_EXTENT:
            raise TcShapeError(f"{d.name}: size {name} = {v} is beyond the {MAX_EXTENT} "
                               "generated kernels handle")
    for name, shape in r.shapes.items():
        n = 1
        for x in shape:
            if not 0 <= x <= MAX_EXTENT:
                raise TcShapeError(f"{d.name}: tensor {name} has shape {shape}; generated kernels "
                                   f"handle extents up to {MAX_EXTENT}")
            n *= x
        if n > MAX_EXTENT:
            raise TcShapeError(f"{d.name}: tensor {name} of shape {shape} has {n} elements; "
                               f"generated kernels handle up to {MAX_EXTENT}")


def _check_options(entry: str, options) -> None:
    values = [*options.tile, *options.map_to_threads, *options.map_to_blocks, options.unroll]
    if any(v > MAX_OPTION for v in values):
        raise TcOptionsError(f"{entry}: mapping options {options.to_json()} hold a size above "
                             f"{MAX_OPTION}; tile, thread, block and unroll sizes are at most "
                             f"{MAX_OPTION}")
