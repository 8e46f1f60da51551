"""Converters for math ops: element-wise, broadcasting, matmul/einsum, reductions, scans.

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> w = tf.ones([3, 2])
    >>> x = tf.ones([4, 5, 3])
    >>> tfx_vec.pfor(lambda i: tf.matmul(tf.gather(x, i), w), 4).shape  # one [20,3]@[3,2]
    TensorShape([4, 5, 2])
"""
from __future__ import annotations

import string

import tensorflow as tf

from tfx_vec.pfor.converters._helpers import (align_ranks, broadcasting, elementwise,
                                              fold_batch, per_iteration_rank, reduction,
                                              reemit_stacked, same_shape, stacked, unfold_batch)
from tfx_vec.pfor.registry import ConversionInput, register_converter

#: Registration modules: their converters are reached through the registry.
__all__: list[str] = []

# {{{ element-wise unary ops (one op per element, any shape)

UNARY_OPS = (
    "Abs", "Neg", "Exp", "Log", "Log1p", "Expm1", "Sqrt", "Rsqrt", "Square", "Sin", "Cos",
    "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Tanh", "Asinh", "Acosh", "Atanh",
    "Sigmoid", "Erf", "Erfc", "Erfinv", "Ndtri", "Lgamma", "Digamma", "Sign", "Floor", "Ceil",
    "Round", "Rint", "Reciprocal", "Inv", "IsNan", "IsInf", "IsFinite", "LogicalNot",
    "Softplus", "Softsign", "Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Real", "Imag", "Conj",
    "Angle", "ComplexAbs", "Invert", "PopulationCount", "BesselI0e", "BesselI1e", "Dawsn",
    "Expint", "FresnelCos", "FresnelSin", "Spence", "BesselI0", "BesselI1", "BesselJ0",
    "BesselJ1", "BesselK0", "BesselK0e", "BesselK1", "BesselK1e", "BesselY0", "BesselY1",
    "Cast", "CheckNumerics", "Identity", "StopGradient", "PreventGradient", "Snapshot",
    "ZerosLike", "OnesLike", "Bitcast",
)
elementwise(*UNARY_OPS)

# }}}

# {{{ broadcasting n-ary ops

BINARY_OPS = (
    "AddV2", "Add", "Sub", "Mul", "Div", "RealDiv", "DivNoNan", "MulNoNan", "FloorDiv",
    "FloorMod", "TruncateDiv", "TruncateMod", "Mod", "Pow", "Maximum", "Minimum",
    "SquaredDifference", "Atan2", "Xdivy", "Xlogy", "Xlog1py", "BitwiseAnd", "BitwiseOr",
    "BitwiseXor", "LeftShift", "RightShift", "Less", "LessEqual", "Greater", "GreaterEqual",
    "Equal", "NotEqual", "LogicalAnd", "LogicalOr", "Igamma", "Igammac", "Zeta", "Polygamma",
    "NextAfter", "Complex", "SelectV2", "IgammaGradA", "RandomGammaGrad",
)
broadcasting(*BINARY_OPS)
same_shape("ApproximateEqual", "Betainc")


@register_converter("AddN")
def _add_n(x: ConversionInput):
    """AddN does not broadcast: invariant terms are tiled (lists: every element tiled)."""
    if x.op.outputs[0].dtype == tf.variant:
        from tfx_vec.pfor.converters.lists import stack_like
        terms = [stack_like(w, x.loop_len, o) for w, o in zip(x.inputs, x.op.inputs)]
        return stacked(tf.raw_ops.AddN(inputs=terms))
    ranks = {per_iteration_rank(w) for w in x.inputs}
    if len(ranks) != 1 or None in ranks:
        return x.decline("AddN terms of different or unknown ranks")
    return stacked(tf.raw_ops.AddN(inputs=[x.stacked_input(i) for i in range(len(x.inputs))]))


@register_converter("Select")
def _select(x: ConversionInput):
    """``Select``: a scalar or rank-1 condition picks whole values / rows of higher-rank
    branches (no broadcasting), so it gets singleton axes after its own."""
    cond_rank, t_rank = per_iteration_rank(x.input(0)), per_iteration_rank(x.input(1))
    if cond_rank is None or t_rank is None:
        return x.decline("Select with operands of unknown rank")
    cond, t, e = (x.stacked_input(i) for i in range(3))
    if cond_rank < t_rank:
        cond = tf.reshape(cond, tf.concat([tf.shape(cond), tf.ones([t_rank - cond_rank],
                                                                   tf.int32)], 0))
    return stacked(tf.raw_ops.SelectV2(condition=cond, t=t, e=e))

@register_converter("ClipByValue")
def _clip_by_value(x: ConversionInput):
    """Bounds are scalars or shaped like ``t`` per iteration: clip by broadcasting max/min
    (the kernel itself does not broadcast a stacked ``[n]`` bound against ``[n, ...]``)."""
    aligned = align_ranks(x)
    if aligned is None:
        return None
    t, lo, hi = aligned
    return stacked(tf.minimum(tf.maximum(t, lo), hi))

# }}}

# {{{ matrix products (paper §3.4: stacked x invariant = one reshaped matmul)


def _swap_last_two(t: tf.Tensor) -> tf.Tensor:
    """Transpose the last two axes of ``[n, a, b]``; a free reshape when a or b is 1."""
    if t.shape.rank == 3 and 1 in t.shape.as_list()[1:]:
        if t.shape.is_fully_defined():
            n, a, b = t.shape.as_list()
            return tf.reshape(t, [n, b, a])
        shape = tf.shape(t)
        out = tf.reshape(t, tf.stack([shape[0], shape[2], shape[1]]))
        out.set_shape([t.shape[0], t.shape[2], t.shape[1]])
        return out
    return tf.transpose(t, [0, 2, 1])


@register_converter("MatMul")
def _matmul(x: ConversionInput):
    a, b = x.input(0), x.input(1)
    ta, tb = x.attr("transpose_a"), x.attr("transpose_b")
    if a.is_stacked and not b.is_stacked:
        at = _swap_last_two(a.t) if ta else a.t                   # [n, m, k]
        flat, lead = fold_batch(at)                                # [n*m, k]
        out = tf.matmul(flat, b.t, transpose_b=tb)
        return stacked(unfold_batch(out, lead, at.shape[:2]))
    if b.is_stacked and not a.is_stacked:
        # (A @ B_i)^T = B_i^T @ A^T: fold the stacked B^T rows into one [n*p, k] @ [k, m].
        bt = b.t if tb else _swap_last_two(b.t)                    # [n, p, k]
        flat, lead = fold_batch(bt)
        out = tf.matmul(flat, a.t, transpose_b=not ta)             # [n*p, m]
        return stacked(_swap_last_two(unfold_batch(out, lead, bt.shape[:2])))
    return stacked(tf.linalg.matmul(a.t, b.t, transpose_a=ta, transpose_b=tb))


@register_converter("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
def _batch_matmul(x: ConversionInput):
    a, b = x.input(0), x.input(1)
    adj_x, adj_y = x.attr("adj_x"), x.attr("adj_y")
    if a.is_stacked and not b.is_stacked and b.t.shape.rank == 2 and not adj_x:
        flat, lead = fold_batch(a.t, a.t.shape.rank - 2)           # [n*...*m, k]
        out = tf.matmul(flat, b.t, adjoint_b=adj_y)
        if out.dtype != x.op.outputs[0].dtype:
            out = tf.cast(out, x.op.outputs[0].dtype)
        return stacked(unfold_batch(out, lead, a.t.shape[:-1]))
    aligned = align_ranks(x)
    if aligned is None:
        return None
    if x.op_type == "BatchMatMul":  # V1 does not broadcast; V2 does and agrees otherwise
        return stacked(tf.raw_ops.BatchMatMulV2(x=aligned[0], y=aligned[1], adj_x=adj_x,
                                                adj_y=adj_y))
    return reemit_stacked(x, aligned)


_LETTERS = string.ascii_letters


@register_converter("Einsum", "XlaEinsum")
def _einsum(x: ConversionInput):
    """Give every stacked operand, and the output, a fresh leading batch label."""
    equation = x.attr("equation").decode().replace(" ", "")
    if "->" not in equation:  # implicit output: labels seen once, sorted, after any "..."
        labels = equation.replace("...", "").replace(",", "")
        once = sorted(c for c in set(labels) if labels.count(c) == 1)
        equation += "->" + ("..." if "..." in equation else "") + "".join(once)
    lhs, rhs = equation.split("->")
    terms = lhs.split(",")
    free = [c for c in _LETTERS if c not in equation]
    if not free:
        return None
    label = free[0]
    new_terms = [label + t if w.is_stacked else t for t, w in zip(terms, x.inputs)]
    new_eq = ",".join(new_terms) + "->" + label + rhs
    return reemit_stacked(x, [w.t for w in x.inputs], attrs={"equation": new_eq})

# }}}

# {{{ reductions and scans: shift the axes past the batch axis

reduction("Sum", "Mean", "Max", "Min", "Prod", "All", "Any", "EuclideanNorm", "ArgMax",
          "ArgMin", "Cumsum", "Cumprod", "CumulativeLogsumexp")

# }}}
