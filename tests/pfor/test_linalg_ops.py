"""linalg converters (``tfx_vec/pfor/converters/linalg_ops.py``) against the oracle.

Matrices are drawn per iteration with the property each op needs (well conditioned,
symmetric positive definite, triangular), so ``stacked_arrays`` is given explicitly.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tests.pfor.oracle import check_op
from tests.pfor.test_nn_ops import gathered, pfor_op_types, rand, together

N = 3


def well_conditioned(*batch: int, m: int = 4) -> np.ndarray:
    return (rand(*batch, m, m, low=-0.5, high=0.5) + 3 * np.eye(m, dtype=np.float32))


def spd(*batch: int, m: int = 4) -> np.ndarray:
    a = rand(*batch, m, m)
    return (a @ np.swapaxes(a, -1, -2) + m * np.eye(m, dtype=np.float32)).astype(np.float32)


def per_iteration(make, *args, **kw) -> tuple[np.ndarray, np.ndarray]:
    """An invariant value and an ``[N, ...]`` stack of independent draws."""
    return make(*args, **kw), np.stack([make(*args, **kw) for _ in range(N)])


def check(op, pairs, **kw):
    check_op(op, [p[0] for p in pairs], stacked_arrays=[p[1] for p in pairs], iters=N,
             rtol=kw.pop("rtol", 1e-4), atol=kw.pop("atol", 1e-4), **kw)


def test_single_matrix_decompositions():
    check(together(chol=tf.linalg.cholesky,
                   inv=tf.linalg.inv,
                   inv_adj=lambda a: tf.linalg.inv(a, adjoint=True),
                   det=tf.linalg.det,
                   slogdet=tf.linalg.slogdet,
                   eigh=tf.linalg.eigh,
                   eigvalsh=tf.linalg.eigvalsh,
                   sqrtm=tf.linalg.sqrtm,
                   qr=lambda a: tf.linalg.qr(a),
                   qr_full=lambda a: tf.linalg.qr(a[:, :3], full_matrices=True),
                   svd=lambda a: tf.linalg.svd(a, compute_uv=True),
                   svals=lambda a: tf.linalg.svd(a, compute_uv=False),
                   lu=tf.linalg.lu),
          [per_iteration(spd, 2)])


def test_complex_decompositions():
    def eig(a):
        return tf.linalg.eig(a)

    def logm(a):
        return tf.linalg.logm(tf.complex(a, tf.zeros_like(a)))
    check(together(eig=eig, eigvals=tf.linalg.eigvals, logm=logm), [per_iteration(spd)])


def test_solves_every_combination():
    a, b = per_iteration(well_conditioned, 2), per_iteration(rand, 2, 4, 3)
    check(together(solve=tf.linalg.solve,
                   solve_adj=lambda m, r: tf.linalg.solve(m, r, adjoint=True),
                   lstsq=lambda m, r: tf.linalg.lstsq(m, r, l2_regularizer=0.1),
                   solve_ls=lambda m, r: tf.raw_ops.MatrixSolveLs(
                       matrix=m, rhs=r, l2_regularizer=tf.constant(0.1, tf.float64))), [a, b])


def test_triangular_solve_broadcasting():
    lower = lambda *s: np.tril(well_conditioned(*s)).astype(np.float32)  # noqa: E731
    solve = lambda m, r: tf.linalg.triangular_solve(m, r, lower=True)  # noqa: E731
    # Matrix without batch dims, rhs with them; and the other way round.
    check(solve, [per_iteration(lower), per_iteration(rand, 2, 4, 3)])
    check(together(lo=solve, up_adj=lambda m, r: tf.linalg.triangular_solve(
        tf.linalg.adjoint(m), r, lower=False, adjoint=True)),
        [per_iteration(lower, 2), per_iteration(rand, 4, 2)])


def test_tridiagonal_solve():
    diags = lambda: np.stack([rand(5), rand(5, low=4, high=6), rand(5)])  # noqa: E731
    check(lambda d, r: tf.linalg.tridiagonal_solve(d, r), [per_iteration(diags),
                                                          per_iteration(rand, 5, 2)])


def test_run_time_loop_length():
    a, b = per_iteration(well_conditioned, 2), per_iteration(rand, 2, 4, 3)
    ops = together(solve=tf.linalg.solve, chol=lambda m, r: tf.linalg.cholesky(
        m @ tf.linalg.adjoint(m)), tri=lambda m, r: tf.linalg.triangular_solve(m, r))
    for combo in [(False, True), (True, True)]:
        check(ops, [a, b], combos=[combo], modes=("dynamic", "one", "chunked"))


def test_invariant_matrix_is_factorized_once():
    """n right-hand sides against one matrix: one solve on [M, n*K], nothing tiled."""
    a = tf.constant(well_conditioned())
    rhs = gathered(rand(6, 4, 3))
    types = pfor_op_types(lambda i: tf.linalg.solve(a, rhs(i)), 6)
    assert types["MatrixSolve"] == 1 and "Tile" not in types, types
