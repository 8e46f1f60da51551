"""Math converters against the per-iteration oracle: one record table per family."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

from tests.pfor.oracle import check_op, stacking_combinations
from tests.support import random_array

R = np.random.default_rng(7)
F32 = np.float32


def a(*shape, dtype=F32, low=-2.0, high=2.0):
    return random_array(R, shape, dtype, low, high)


def pos(*shape):
    return random_array(R, shape, F32, 0.2, 2.0)


def unit(*shape):
    return random_array(R, shape, F32, -0.9, 0.9)


# (op name, function, inputs) -- each input is the invariant value; stacked ones are perturbed.
UNARY = [
    ("Abs", tf.abs, a(2, 3)), ("Neg", tf.negative, a(2, 3)), ("Exp", tf.exp, a(4)),
    ("Log", tf.math.log, pos(2, 3)), ("Log1p", tf.math.log1p, pos(3)),
    ("Expm1", tf.math.expm1, a(3)), ("Sqrt", tf.sqrt, pos(3, 2)), ("Rsqrt", tf.math.rsqrt, pos(3)),
    ("Square", tf.square, a(3)), ("Sin", tf.sin, a(3)), ("Cos", tf.cos, a(2, 2)),
    ("Tan", tf.tan, unit(3)), ("Asin", tf.asin, unit(3)), ("Acos", tf.acos, unit(3)),
    ("Atan", tf.atan, a(3)), ("Sinh", tf.sinh, a(3)), ("Cosh", tf.cosh, a(3)),
    ("Tanh", tf.tanh, a(3)), ("Asinh", tf.asinh, a(3)),
    ("Acosh", tf.acosh, pos(3) + 1.0), ("Atanh", tf.atanh, unit(3)), ("Sigmoid", tf.sigmoid, a(3)),
    ("Erf", tf.math.erf, a(3)), ("Erfc", tf.math.erfc, a(3)), ("Erfinv", tf.math.erfinv, unit(3)),
    ("Ndtri", tf.math.ndtri, pos(3) / 2.5), ("Lgamma", tf.math.lgamma, pos(3)),
    ("Digamma", tf.math.digamma, pos(3)), ("Sign", tf.sign, a(3)), ("Floor", tf.floor, a(3)),
    ("Ceil", tf.math.ceil, a(3)), ("Round", tf.round, a(3)), ("Rint", tf.math.rint, a(3)),
    ("Reciprocal", tf.math.reciprocal, a(3)), ("Inv", lambda x: tf.raw_ops.Inv(x=x), a(3)),
    ("IsNan", lambda x: tf.math.is_nan(tf.math.log(x)), a(3)),
    ("IsInf", lambda x: tf.math.is_inf(1.0 / (x - x[0])), a(3)),
    ("IsFinite", lambda x: tf.math.is_finite(tf.math.log(x)), a(3)),
    ("LogicalNot", tf.logical_not, a(3, dtype=bool)), ("Softplus", tf.nn.softplus, a(3)),
    ("Softsign", tf.nn.softsign, a(3)), ("Relu", tf.nn.relu, a(3)), ("Relu6", tf.nn.relu6, a(3) * 4),
    ("Elu", tf.nn.elu, a(3)), ("Selu", tf.nn.selu, a(3)),
    ("LeakyRelu", lambda x: tf.nn.leaky_relu(x, 0.3), a(3)),
    ("Real/Imag/Conj/Angle/ComplexAbs", lambda x: tf.stack([
        tf.math.real(tf.math.conj(tf.complex(x, 2 * x))), tf.math.imag(tf.complex(x, x)),
        tf.math.angle(tf.complex(x, 1.0 + x)), tf.abs(tf.complex(x, x))]), a(3)),
    ("Invert/PopulationCount", lambda x: tf.cast(tf.bitwise.invert(x), tf.uint8)
     + tf.raw_ops.PopulationCount(x=x), a(3, dtype=np.int32)),
    ("Bessel", lambda x: tf.stack([tf.math.bessel_i0e(x), tf.math.bessel_i1e(x),
                                   tf.math.special.bessel_j0(x), tf.math.special.dawsn(x)]), a(3)),
    ("Cast", lambda x: tf.cast(x * 3, tf.int32), a(2, 3)), ("Cast-bool", lambda x: tf.cast(x, tf.bool),
                                                          a(3, dtype=np.int32)),
    ("Identity/StopGradient/CheckNumerics", lambda x: tf.stop_gradient(
        tf.debugging.check_numerics(tf.identity(x), "bad")), a(3)),
    ("ZerosLike/OnesLike", lambda x: tf.zeros_like(x) + 2 * tf.ones_like(x) + x, a(2)),
    ("Bitcast", lambda x: tf.bitcast(x, tf.int32), a(2, 2)),
]


@pytest.mark.parametrize("name,fn,x", UNARY, ids=[r[0] for r in UNARY])
def test_unary(name, fn, x):
    check_op(fn, [x], rtol=2e-5, atol=1e-5)


BINARY = [
    ("AddV2", tf.add, a(2, 3), a(3)), ("Sub", tf.subtract, a(3), a(2, 3)),
    ("Mul", tf.multiply, a(2, 1, 3), a(4, 1)), ("RealDiv", tf.divide, a(3), a(3)),
    ("Div-int", lambda x, y: tf.raw_ops.Div(x=x, y=y), a(3, dtype=np.int32), a(3, dtype=np.int32)),
    ("DivNoNan", tf.math.divide_no_nan, a(3), a(3)), ("MulNoNan", tf.math.multiply_no_nan, a(3), a(3)),
    ("FloorDiv", tf.math.floordiv, a(3, dtype=np.int32, high=9), a(3, dtype=np.int32)),
    ("FloorMod", tf.math.floormod, a(3), a(3)),
    ("TruncateDiv/Mod", lambda x, y: tf.truncatediv(x, y) + tf.truncatemod(x, y),
     a(3, dtype=np.int32, high=9), a(3, dtype=np.int32)),
    ("Mod", lambda x, y: tf.raw_ops.Mod(x=x, y=y), pos(3), pos(3)),
    ("Pow", tf.pow, pos(2, 3), a(3)), ("Maximum", tf.maximum, a(3), a(2, 3)),
    ("Minimum", tf.minimum, a(2, 3), a(1)), ("SquaredDifference", tf.math.squared_difference, a(3), a(3)),
    ("Atan2", tf.atan2, a(3), a(3)), ("Xdivy", tf.math.xdivy, a(3), a(3)),
    ("Xlogy", tf.math.xlogy, a(3), pos(3)), ("Xlog1py", tf.math.xlog1py, a(3), pos(3)),
    ("Bitwise", lambda x, y: tf.bitwise.bitwise_and(x, y) + tf.bitwise.bitwise_or(x, y)
     - tf.bitwise.bitwise_xor(x, y), a(3, dtype=np.int32), a(3, dtype=np.int32)),
    ("Shifts", lambda x, y: tf.bitwise.left_shift(x, tf.abs(y)) + tf.bitwise.right_shift(x, tf.abs(y)),
     a(3, dtype=np.int32, high=50), a(3, dtype=np.int32, low=0, high=3)),
    ("Compare", lambda x, y: tf.stack([x < y, x <= y, x > y, x >= y, tf.equal(x, y),
                                       tf.not_equal(x, y)]), a(3, dtype=np.int32), a(3, dtype=np.int32)),
    ("Logical", lambda x, y: tf.logical_and(x, y) | tf.logical_or(x, ~y),
     a(2, 3, dtype=bool), a(3, dtype=bool)),
    ("Igamma/Igammac", lambda x, y: tf.math.igamma(x, y) + tf.math.igammac(x, y) * 2, pos(3), pos(3)),
    ("Zeta/Polygamma", lambda x, y: tf.math.zeta(x + 1.5, y) + tf.math.polygamma(tf.round(y), x + 1),
     pos(3), pos(3)),
    ("NextAfter", tf.math.nextafter, a(3), a(3)),
    ("Complex", lambda x, y: tf.abs(tf.complex(x, y)), a(2, 3), a(3)),
    ("ApproximateEqual", lambda x, y: tf.raw_ops.ApproximateEqual(x=x, y=y, tolerance=0.3), a(3), a(3)),
    ("ClipByValue-python", lambda x, lo: tf.clip_by_value(x, lo, lo + 1.0), a(2, 3), a(3)),
    ("ClipByValue", lambda x, lo: tf.raw_ops.ClipByValue(t=x, clip_value_min=lo[0],
                                                         clip_value_max=lo[0] + 1.0), a(2, 3), a(3)),
    ("ClipByValue-same-shape", lambda x, lo: tf.raw_ops.ClipByValue(
        t=x, clip_value_min=lo, clip_value_max=lo + 1.0), a(2, 3), a(2, 3)),
]


@pytest.mark.parametrize("name,fn,x,y", BINARY, ids=[r[0] for r in BINARY])
def test_binary(name, fn, x, y):
    check_op(fn, [x, y], rtol=2e-5, atol=1e-5)


TERNARY = [
    ("SelectV2", lambda c, x, y: tf.where(c, x, y), a(2, 1, dtype=bool), a(3), a(2, 3)),
    ("Select-rows", lambda c, x, y: tf.raw_ops.Select(condition=c, x=x, y=y),
     a(2, dtype=bool), a(2, 3), a(2, 3)),
    ("Select-same", lambda c, x, y: tf.raw_ops.Select(condition=c, x=x, y=y),
     a(2, 3, dtype=bool), a(2, 3), a(2, 3)),
    ("AddN", lambda x, y, z: tf.add_n([x, y, z]), a(2, 3), a(2, 3), a(2, 3)),
    ("Betainc", tf.math.betainc, pos(3), pos(3), unit(3) * 0.5 + 0.5),
    ("Einsum-3", lambda x, y, z: tf.einsum("ij,jk,k->i", x, y, z), a(2, 3), a(3, 4), a(4)),
]


@pytest.mark.parametrize("name,fn,c,x,y", TERNARY, ids=[r[0] for r in TERNARY])
def test_ternary(name, fn, c, x, y):
    check_op(fn, [c, x, y], rtol=2e-5, atol=1e-5)


MATMUL = [
    ("MatMul", lambda x, y: tf.matmul(x, y), a(2, 3), a(3, 4)),
    ("MatMul-ta", lambda x, y: tf.matmul(x, y, transpose_a=True), a(3, 2), a(3, 4)),
    ("MatMul-tb", lambda x, y: tf.matmul(x, y, transpose_b=True), a(2, 3), a(4, 3)),
    ("MatMul-tatb", lambda x, y: tf.matmul(x, y, transpose_a=True, transpose_b=True), a(3, 2), a(4, 3)),
    ("BatchMatMulV2", lambda x, y: tf.matmul(x, y), a(5, 2, 3), a(3, 4)),
    ("BatchMatMulV2-bcast", lambda x, y: tf.matmul(x, y, adjoint_b=True), a(2, 1, 2, 3), a(5, 4, 3)),
    ("BatchMatMulV2-adjx", lambda x, y: tf.matmul(x, y, adjoint_a=True), a(5, 3, 2), a(5, 3, 4)),
    ("BatchMatMul-v1", lambda x, y: tf.raw_ops.BatchMatMul(x=x, y=y), a(2, 2, 3), a(2, 3, 4)),
    ("BatchMatMulV3", lambda x, y: tf.raw_ops.BatchMatMulV3(x=x, y=y, Tout=tf.float32),
     a(2, 2, 3), a(3, 4)),
    ("Einsum", lambda x, y: tf.einsum("ij,jk->ik", x, y), a(2, 3), a(3, 4)),
    ("Einsum-ellipsis", lambda x, y: tf.einsum("...ij,...jk->...ik", x, y), a(5, 2, 3), a(3, 4)),
    ("Einsum-outer", lambda x, y: tf.einsum("i,j->ji", x, y), a(2), a(3)),
    ("Einsum-implicit", lambda x, y: tf.einsum("ij,jk", x, y), a(2, 3), a(3, 4)),
    ("Einsum-trace", lambda x, y: tf.einsum("ii,j->j", x, y), a(3, 3), a(2)),
]


@pytest.mark.parametrize("name,fn,x,y", MATMUL, ids=[r[0] for r in MATMUL])
def test_matmul_family(name, fn, x, y):
    check_op(fn, [x, y], rtol=1e-4, atol=1e-4)


REDUCTIONS = [
    ("Sum", lambda x: tf.reduce_sum(x, axis=1)), ("Sum-neg-keep", lambda x: tf.reduce_sum(
        x, axis=[-1, 0], keepdims=True)), ("Sum-all", tf.reduce_sum),
    ("Mean", lambda x: tf.reduce_mean(x, 0)), ("Max", lambda x: tf.reduce_max(x, -1)),
    ("Min", lambda x: tf.reduce_min(x, [0, 2])), ("Prod", lambda x: tf.reduce_prod(x, 1)),
    ("All/Any", lambda x: tf.stack([tf.reduce_all(x > 0, 1), tf.reduce_any(x > 0, 1)])),
    ("ArgMax", lambda x: tf.argmax(x, 1)), ("ArgMin", lambda x: tf.argmin(x, -1, tf.int32)),
    ("EuclideanNorm", lambda x: tf.raw_ops.EuclideanNorm(input=x, axis=[1, 2])),
    ("Cumsum", lambda x: tf.cumsum(x, 1, exclusive=True)),
    ("Cumprod", lambda x: tf.math.cumprod(x, -1, reverse=True)),
    ("CumulativeLogsumexp", lambda x: tf.math.cumulative_logsumexp(x, 0)),
    ("reduce_logsumexp", lambda x: tf.reduce_logsumexp(x, axis=2)),
]


@pytest.mark.parametrize("name,fn", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
def test_reductions(name, fn):
    check_op(fn, [a(2, 3, 4)], rtol=1e-4, atol=1e-5)


def test_reduction_dynamic_axis_is_vectorized_with_index_axis():
    """An axis computed from the loop index is stacked: the op still gives the right answer."""
    x = tf.constant(a(4, 2, 2))

    def loop_fn(i):
        return tf.reduce_sum(tf.gather(x, i), axis=i % 2)
    import tfx_vec
    got = tfx_vec.pfor(loop_fn, 4)
    want = np.stack([np.sum(x.numpy()[i], axis=i % 2) for i in range(4)])
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5)


@settings(max_examples=3)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.integers(1, 4),
       st.sampled_from(["mul", "matmul"]))
def test_random_shapes_broadcast_and_matmul(shape, k, kind):
    rng = np.random.default_rng(len(shape) * 10 + k)
    x = random_array(rng, shape + [k], F32)
    if kind == "mul":
        y = random_array(rng, [k], F32)
        fn = lambda u, v: u * v + v  # noqa: E731
    else:
        y = random_array(rng, [k, 2], F32)
        fn = tf.matmul
    check_op(fn, [x, y], rtol=1e-4, atol=1e-4, modes=("eager",))


def test_matmul_stacked_invariant_is_one_matmul():
    """Paper §3.4: stacked x invariant MatMul is one [n*m,k]@[k,p] matmul, no tiling."""
    import tfx_vec
    x = tf.constant(a(8, 5, 3))
    w = tf.constant(a(3, 2))
    g = tf.function(lambda: tfx_vec.pfor(lambda i: tf.matmul(tf.gather(x, i), w), 8)
                    ).get_concrete_function().graph
    types = [op.type for op in g.get_operations()]
    assert types.count("MatMul") == 1 and "BatchMatMulV2" not in types and "Tile" not in types
    assert all(combo for combo in stacking_combinations(2))


def test_igamma_gradient_and_xla_einsum():
    from tensorflow.compiler.tf2xla.python import xla
    a = random_array(np.random.default_rng(3), (2, 3), np.float32, 0.5, 3.0)
    x = random_array(np.random.default_rng(4), (2, 3), np.float32, 0.5, 3.0)
    check_op(lambda a, x: tf.raw_ops.IgammaGradA(a=a, x=x), [a, x], rtol=1e-4, atol=1e-5)
    check_op(lambda p, q: xla.einsum(p, q, "ab,bc->ac"), [a, x.T.copy()], rtol=1e-5, atol=1e-5)


def test_add_n_of_stacked_and_invariant_terms():
    check_op(lambda p, q: tf.math.add_n([p, q, p]), [random_array(np.random.default_rng(6),
                                                                  (2, 3), np.float32)] * 2)
