"""Converters for linear-algebra ops.

Every TF linalg kernel already takes leading batch dimensions ``[..., M, N]``, so:

- **One matrix operand** (Cholesky, MatrixInverse, MatrixDeterminant, LogMatrixDeterminant,
  Qr, Svd, SelfAdjointEigV2, Eig, Lu, MatrixSquareRoot, MatrixLogarithm): the iteration axis
  simply becomes one more batch dimension; the op runs once on ``[n, ..., M, N]``.  Outputs
  the op leaves empty (``u``/``v`` of Svd without ``compute_uv``, ``v`` of an eigen
  decomposition without ``compute_v``) are loop-invariant.
- **Solves** (MatrixSolve, MatrixTriangularSolve, MatrixSolveLs, TridiagonalSolve) with a
  loop-invariant matrix and per-iteration right-hand sides: the ``n`` right-hand sides are one
  ``[..., M, n*K]`` right-hand side (:func:`fold_into_columns`), so the matrix is factorized
  once instead of ``n`` times and nothing is tiled.  A per-iteration matrix: the iteration
  axis is a batch axis; MatrixTriangularSolve broadcasts a loop-invariant right-hand side,
  the other kernels do not broadcast, so it is tiled.

The ``BatchMatrix*``/``BatchCholesky``/``BatchSvd`` op types are deprecated aliases whose
kernels TF 2.21 no longer registers (a graph containing one fails to run), and
``MatrixExponential``/``SelfAdjointEig`` (v1) likewise have no kernel (``tf.linalg.expm`` is
built from ordinary ops), so they have no converters.

Example:
    >>> import numpy as np, tensorflow as tf, tfx_vec
    >>> a = tf.constant(np.eye(3, dtype=np.float32) * 2)
    >>> b = tf.random.normal([5, 3, 2])
    >>> x = tfx_vec.pfor(lambda i: tf.linalg.solve(a, tf.gather(b, i)), 5)
    >>> np.allclose(x.numpy(), b.numpy() / 2)
    True
"""
from __future__ import annotations

import tensorflow as tf

from tfx_vec.pfor.converters._helpers import (align_ranks, create_op_like, move_axis,
                                             reemit_stacked)
from tfx_vec.pfor.converters.nn_ops import converter
from tfx_vec.pfor.registry import ConversionInput, WrappedTensor

#: Registration modules: their converters are reached through the registry.
__all__: list[str] = []

#: For each decomposition, the output that is empty unless the named bool attr is set.
_OPTIONAL_OUTPUTS = {"Svd": ("compute_uv", (1, 2)), "SelfAdjointEigV2": ("compute_v", (1,)),
                     "Eig": ("compute_v", (1,))}


@converter("Cholesky", "MatrixInverse", "MatrixDeterminant", "LogMatrixDeterminant",
                    "Qr", "Svd", "SelfAdjointEigV2", "Eig", "Lu", "MatrixSquareRoot",
                    "MatrixLogarithm")
def _batch_matrix_op(x: ConversionInput):
    outs = reemit_stacked(x, [x.input(0).t])
    flag, optional = _OPTIONAL_OUTPUTS.get(x.op_type, (None, ()))
    if flag is not None and not x.attr(flag):
        # The kernel returns an empty placeholder, whatever the batch shape.
        outs = [WrappedTensor(w.t, False) if k in optional else w for k, w in enumerate(outs)]
    return outs


def fold_into_columns(rhs: tf.Tensor) -> tf.Tensor:
    """``[n, ..., M, K] -> [..., M, n*K]``: n right-hand sides side by side."""
    rank = rhs.shape.rank
    moved = move_axis(rhs, 0, rank - 2)                 # [..., M, n, K]
    shape = tf.shape(moved)
    return tf.reshape(moved, tf.concat([shape[:-2], [shape[-2] * shape[-1]]], 0))


def unfold_from_columns(t: tf.Tensor, n: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
    """Inverse of :func:`fold_into_columns`: ``[..., M, n*K] -> [n, ..., M, K]``."""
    shape = tf.shape(t)
    n = tf.reshape(tf.cast(n, tf.int32), [1])
    split = tf.reshape(t, tf.concat([shape[:-1], n, tf.reshape(k, [1])], 0))
    return move_axis(split, split.shape.rank - 2, 0)


def _solve(x: ConversionInput, *, broadcasts: bool) -> list[WrappedTensor] | None:
    """Inputs: matrix (0), right-hand side (1), loop-invariant extras (2, ...)."""
    if any(w.is_stacked for w in x.inputs[2:]):
        return None
    extras = [w.t for w in x.inputs[2:]]
    matrix, rhs = x.input(0), x.input(1)
    if rhs.t.shape.rank is None:
        return None
    if not matrix.is_stacked:
        cols = tf.shape(rhs.t)[-1]
        out = create_op_like(x.op, [matrix.t, fold_into_columns(rhs.t)] + extras)[0]
        return [WrappedTensor(unfold_from_columns(out, x.loop_len, cols), True)]
    if broadcasts:
        aligned = align_ranks(x, [0, 1])
        if aligned is None:
            return None
        return reemit_stacked(x, aligned + extras)
    return reemit_stacked(x, [matrix.t, x.stacked_input(1)] + extras)


@converter("MatrixTriangularSolve")
def _triangular_solve(x: ConversionInput):
    return _solve(x, broadcasts=True)


@converter("MatrixSolve", "MatrixSolveLs", "TridiagonalSolve")
def _matrix_solve(x: ConversionInput):
    return _solve(x, broadcasts=False)
