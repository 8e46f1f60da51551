"""The printers of tc_ops: an isl AST plus TC statements as C/OpenMP (``c``, with the
register-blocked micro-kernel of ``contraction``), OpenCL C (``opencl``) and CUDA (``cuda``).

Example:
    >>> from tfx_vec.tc_ops.lang.sema import check_program
    >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
    >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
    >>> from tfx_vec.tc_ops.codegen.c import CPrinter
    >>> d = check_program("def neg(float(N) A) -> (B) { B(i) = -A(i) }")["neg"]
    >>> k = build_kernel(d, infer_ranges(d, {"A": (3,)}))
    >>> "B[i] = (float)((-A[i]));" in CPrinter(k).kernel_source(k.identity_schedule())
    True
"""

__all__ = ["c", "cnames", "contraction", "opencl", "cuda"]
