"""The polyhedral core of tc_ops: TC statements as isl sets and maps, CPU schedules, the GPU
mapping (tiles, blocks, threads, shared-memory promotion) and the contraction classifier the
CPU micro-kernel uses.

Modules: ``kernel`` (lowering, dependences, CPU annotation, isl AST), ``mapping`` (GPU),
``promote`` (shared memory), ``tile`` (band tiling), ``contraction`` (row/column splits).

Example:
    >>> from tfx_vec.tc_ops.lang.sema import check_program
    >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
    >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
    >>> d = check_program("def neg(float(N) A) -> (B) { B(i) = -A(i) }")["neg"]
    >>> print(build_kernel(d, infer_ranges(d, {"A": (3,)})).domain)
    { S0[i] : 0 <= i <= 2 }
"""

__all__ = ["kernel", "mapping", "promote", "tile", "contraction"]
