"""Differential tests: lazy results equal TF eager results, element by element.

Random op sequences (hypothesis) mix recorded ops, Python control flow on observed values,
fallback ops and variable updates; table tests run every covered op family once.
"""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import random_array
from tfx_vec import lazy
from tfx_vec.lazy.ops import OPS

RTOL, ATOL = 2e-5, 1e-5


def _assert_same(lazy_out, eager_out, rtol=RTOL, atol=ATOL):
    lz, eg = tf.nest.flatten(lazy_out), tf.nest.flatten(eager_out)
    assert len(lz) == len(eg)
    for a, b in zip(lz, eg):
        assert isinstance(a, lazy.LazyTensor), type(a)
        np.testing.assert_allclose(a.numpy(), np.asarray(b), rtol=rtol, atol=atol)


def _both(fn, *arrays, mark=True):
    """``fn`` on eager tf constants and on lazy tensors of the same arrays."""
    eager = fn(*[tf.constant(a) for a in arrays])
    lz = fn(*[lazy.tensor(a) for a in arrays])
    if mark:
        lazy.mark_step()
    return lz, eager


# {{{ table coverage: every elementwise op, many structural ops, one program per family

_UNARY_SPECIAL = {
    "math.acosh": lambda f, x: f(x + 1.5),
    "math.invert_permutation": lambda f, x: f(tf.constant([2, 0, 3, 1])),
    "bitwise.invert": lambda f, x: f(tf.cast(x * 10, tf.int32)),
    "math.logical_not": lambda f, x: f(x > 0.5),
    "cast": lambda f, x: f(x, tf.float64),
    "saturate_cast": lambda f, x: f(x * 300, tf.uint8),
}


def test_every_unary_elementwise_op_matches_eager():
    from tfx_vec.lazy.ops import _ELEMENTWISE_UNARY
    names = _ELEMENTWISE_UNARY.split()
    rng = np.random.default_rng(0)
    x = rng.uniform(0.1, 0.9, (3, 4)).astype(np.float32)

    def apply_all(t):
        outs = {}
        for name in names:
            f = OPS[name].api
            special = _UNARY_SPECIAL.get(name)
            if special is None:
                outs[name] = f(t)
            elif name != "math.invert_permutation":
                outs[name] = special(f, t)
        return outs
    lz, eager = _both(apply_all, x)
    assert len(lz) == len(names) - 1
    for name in lz:
        _assert_same(lz[name], eager[name], rtol=1e-4, atol=1e-5)
    assert lazy.metrics()["compiles"] == 1 and "fallback" not in lazy.metrics_report().split(
        "fallbacks")[1].split("timers")[0].replace("none", "")


_BINARY_SPECIAL = {
    "math.zeta": lambda f, x, y: f(x + 1.5, y),
    "math.polygamma": lambda f, x, y: f(tf.round(x * 2), y),
    "math.logical_and": lambda f, x, y: f(x > 1, y > 1),
    "math.logical_or": lambda f, x, y: f(x > 1, y > 1),
    "math.logical_xor": lambda f, x, y: f(x > 1, y > 1),
}


def test_every_binary_elementwise_op_matches_eager():
    from tfx_vec.lazy.ops import _ELEMENTWISE_BINARY
    names = _ELEMENTWISE_BINARY.split()
    rng = np.random.default_rng(1)
    x = rng.uniform(0.5, 1.5, (3, 4)).astype(np.float32)
    y = rng.uniform(0.5, 1.5, (4,)).astype(np.float32)   # broadcasts

    def apply_all(a, b):
        outs = {}
        for name in names:
            f = OPS[name].api
            if name.startswith("bitwise."):
                ia, ib = tf.cast(a * 7, tf.int32), tf.cast(b * 3, tf.int32)
                outs[name] = f(ia, ib)
            elif name in _BINARY_SPECIAL:
                outs[name] = _BINARY_SPECIAL[name](f, a, b)
            else:
                outs[name] = f(a, b)
                if name not in ("math.xlogy", "math.xlog1py", "math.igamma", "math.igammac"):
                    outs[name + " scalar"] = f(a, 1.25)
        return outs
    lz, eager = _both(apply_all, x, y)
    for name in lz:
        _assert_same(lz[name], eager[name], rtol=1e-4, atol=1e-5)
    assert lazy.metrics()["compiles"] == 1


_STRUCTURAL = [
    lambda x, m, i: tf.reduce_sum(x, 1), lambda x, m, i: tf.reduce_mean(x, 0, keepdims=True),
    lambda x, m, i: tf.reduce_max(x), lambda x, m, i: tf.reduce_min(x, [0, 1]),
    lambda x, m, i: tf.reduce_prod(x, -1), lambda x, m, i: tf.reduce_any(x > 0, 0),
    lambda x, m, i: tf.reduce_all(x > -1), lambda x, m, i: tf.reduce_logsumexp(x, 1),
    lambda x, m, i: tf.math.reduce_std(x, 0), lambda x, m, i: tf.math.reduce_variance(x),
    lambda x, m, i: tf.math.count_nonzero(x > 0, 1),
    lambda x, m, i: tf.argmax(x, 1), lambda x, m, i: tf.argmin(x, 0),
    lambda x, m, i: tf.math.cumsum(x, 1), lambda x, m, i: tf.math.cumprod(x, 0, reverse=True),
    lambda x, m, i: tf.math.cumulative_logsumexp(x, 1), lambda x, m, i: tf.math.top_k(x, 2),
    lambda x, m, i: tf.nn.moments(x, [0]), lambda x, m, i: tf.sort(x, 1),
    lambda x, m, i: tf.argsort(x, 1), lambda x, m, i: tf.reshape(x, [-1]),
    lambda x, m, i: tf.transpose(x), lambda x, m, i: tf.concat([x, m[:3]], 1),
    lambda x, m, i: tf.stack([x, x * 2.0], 0), lambda x, m, i: tf.unstack(x, axis=1),
    lambda x, m, i: tf.split(x, 2, axis=1), lambda x, m, i: tf.squeeze(x[:1]),
    lambda x, m, i: tf.expand_dims(x, 1), lambda x, m, i: tf.tile(x, [2, 1]),
    lambda x, m, i: tf.pad(x, [[1, 0], [0, 2]]), lambda x, m, i: tf.slice(x, [1, 0], [2, 3]),
    lambda x, m, i: tf.strided_slice(x, [0, 0], [3, 4], [2, 1]),
    lambda x, m, i: tf.gather(x, [2, 0], axis=0), lambda x, m, i: tf.gather(x, i, axis=1),
    lambda x, m, i: tf.gather_nd(x, [[0, 1], [2, 3]]),
    lambda x, m, i: tf.scatter_nd([[1], [0]], x[:2], [3, 4]),
    lambda x, m, i: tf.tensor_scatter_nd_update(x, [[1]], x[:1] * 3.0),
    lambda x, m, i: tf.tensor_scatter_nd_add(x, [[0, 0]], [5.0]),
    lambda x, m, i: tf.where(x > 0, x, m[:3, :4]), lambda x, m, i: tf.one_hot(i, 5),
    lambda x, m, i: tf.reverse(x, [1]), lambda x, m, i: tf.roll(x, 1, 0),
    lambda x, m, i: tf.broadcast_to(x[:1], [3, 4]), lambda x, m, i: tf.repeat(x, 2, axis=0),
    lambda x, m, i: tf.fill([2, 2], x[0, 0]), lambda x, m, i: tf.sequence_mask(i, 4),
    lambda x, m, i: tf.matmul(x, m), lambda x, m, i: tf.matmul(m, x, transpose_a=True,
                                                             transpose_b=True),
    lambda x, m, i: x @ m, lambda x, m, i: tf.linalg.matvec(m, x[0]),
    lambda x, m, i: tf.tensordot(x, m, 1), lambda x, m, i: tf.einsum("ij,jk->ik", x, m),
    lambda x, m, i: tf.einsum("ij->j", x), lambda x, m, i: tf.linalg.trace(m),
    lambda x, m, i: tf.linalg.diag(x[0]), lambda x, m, i: tf.linalg.diag_part(m),
    lambda x, m, i: tf.linalg.band_part(m, 1, 0), lambda x, m, i: tf.linalg.matrix_transpose(x),
    lambda x, m, i: tf.linalg.norm(x), lambda x, m, i: tf.linalg.global_norm([x, m]),
    lambda x, m, i: tf.linalg.cholesky(m @ tf.transpose(m) + 4.0 * tf.eye(4)),
    lambda x, m, i: tf.linalg.inv(m + 4.0 * tf.eye(4)),
    lambda x, m, i: tf.linalg.logdet(m @ tf.transpose(m) + 4.0 * tf.eye(4)),
    lambda x, m, i: tf.linalg.solve(m + 4.0 * tf.eye(4), tf.transpose(x)),
    lambda x, m, i: tf.linalg.triangular_solve(tf.linalg.band_part(m, -1, 0) + 4.0 * tf.eye(4),
                                               tf.transpose(x)),
    lambda x, m, i: tf.linalg.cross(x[:, :3], m[:3, :3]),
    lambda x, m, i: tf.nn.softmax(x, 1), lambda x, m, i: tf.nn.log_softmax(x, 0),
    lambda x, m, i: tf.nn.bias_add(x, m[0]), lambda x, m, i: tf.clip_by_value(x, -0.5, 0.5),
    lambda x, m, i: tf.math.add_n([x, x, m[:3]]),
    lambda x, m, i: tf.nn.softmax_cross_entropy_with_logits(tf.nn.softmax(m[:3]), x),
    lambda x, m, i: tf.nn.sparse_softmax_cross_entropy_with_logits(i, x[:, :4]),
    lambda x, m, i: tf.nn.sigmoid_cross_entropy_with_logits(tf.sigmoid(m[:3]), x),
    lambda x, m, i: tf.nn.embedding_lookup(m, i), lambda x, m, i: tf.nn.l2_normalize(x, 1),
    lambda x, m, i: tf.nn.batch_normalization(x, 0.1, 2.0, 0.5, 1.5, 1e-3),
    lambda x, m, i: tf.math.unsorted_segment_sum(x, [0, 1, 0], 2),
    lambda x, m, i: tf.math.unsorted_segment_max(x, i % 2, 2),
    lambda x, m, i: x[1:, ::2], lambda x, m, i: x[..., None, 1],
    lambda x, m, i: tf.image.flip_left_right(x[None, :, :, None]),
    lambda x, m, i: tf.signal.frame(x, 2, 1),
]


_STRUCTURAL_2 = [
    lambda x, m, i: tf.image.flip_up_down(x[None, :, :, None]),
    lambda x, m, i: tf.image.per_image_standardization(x[:, :, None]),
    lambda x, m, i: tf.image.resize(m[None, :, :, None], [2, 3]),
    lambda x, m, i: tf.linalg.adjoint(x),
    lambda x, m, i: tf.linalg.cholesky_solve(tf.linalg.cholesky(m @ tf.transpose(m) +
                                                                4.0 * tf.eye(4)), tf.transpose(x)),
    lambda x, m, i: tf.linalg.eigh(m + tf.transpose(m) + 8.0 * tf.eye(4))[0],
    lambda x, m, i: tf.linalg.normalize(x, axis=1),
    lambda x, m, i: tf.abs(tf.linalg.qr(m + 4.0 * tf.eye(4))[1]),
    lambda x, m, i: tf.linalg.set_diag(m, x[0]),
    lambda x, m, i: tf.math.accumulate_n([x, x * 3.0]),
    lambda x, m, i: tf.math.confusion_matrix(i, i[::-1], num_classes=4),
    lambda x, m, i: tf.math.in_top_k(i, x, 2),
    lambda x, m, i: tf.math.invert_permutation(i * 0 + [1, 2, 0]),
    lambda x, m, i: tf.math.scalar_mul(2.5, x),
    lambda x, m, i: tf.math.unsorted_segment_mean(x, [0, 1, 0], 2),
    lambda x, m, i: tf.nn.avg_pool(x[None, :, :, None], 2, 1, "VALID"),
    lambda x, m, i: tf.nn.avg_pool1d(x[None], 2, 1, "SAME"),
    lambda x, m, i: tf.nn.max_pool(x[None, :, :, None], 2, 1, "SAME"),
    lambda x, m, i: tf.nn.max_pool1d(x[None], 2, 2, "VALID"),
    lambda x, m, i: tf.nn.pool(x[None, :, :, None], [2, 2], "AVG", strides=[1, 1],
                               padding="VALID"),
    lambda x, m, i: tf.nn.conv3d(m[None, :, :, None, None] * tf.ones([1, 1, 1, 2, 1]),
                                 tf.ones([2, 2, 2, 1, 3]), [1] * 5, "SAME"),
    lambda x, m, i: tf.nn.convolution(x[None, :, :, None], m[:2, :2, None, None], padding="SAME"),
    lambda x, m, i: tf.nn.depth_to_space(tf.tile(m[None, :2, :2, None], [1, 1, 1, 4]), 2),
    lambda x, m, i: tf.nn.space_to_depth(m[None, :, :, None], 2),
    lambda x, m, i: tf.nn.local_response_normalization(m[None, :, :, None] * tf.ones([4])),
    lambda x, m, i: tf.nn.log_poisson_loss(tf.abs(x), x),
    lambda x, m, i: tf.nn.weighted_cross_entropy_with_logits(tf.sigmoid(x), x, 1.5),
    lambda x, m, i: tf.nn.normalize_moments(3.0, tf.reduce_sum(x, 0), tf.reduce_sum(x * x, 0),
                                            None),
    lambda x, m, i: tf.searchsorted(tf.sort(m[:3], 1), x),
    lambda x, m, i: tf.tensor_scatter_nd_max(x, [[0, 0]], [5.0]),
    lambda x, m, i: tf.tensor_scatter_nd_min(x, [[1, 1]], [-5.0]),
    lambda x, m, i: tf.tensor_scatter_nd_sub(x, [[2]], m[:1]),
]


def test_structural_ops_match_eager_in_one_program():
    rng = np.random.default_rng(2)
    x = random_array(rng, (3, 4))
    m = random_array(rng, (4, 4))
    i = np.array([2, 0, 3], np.int32)

    def apply_all(x_, m_, i_):
        return [f(x_, m_, i_) for f in _STRUCTURAL + _STRUCTURAL_2]
    lz, eager = _both(apply_all, x, m, i)
    for k, (a, b) in enumerate(zip(lz, eager)):
        _assert_same(a, b, rtol=1e-4, atol=1e-5)
    m_ = lazy.metrics()
    assert m_["compiles"] == 1 and not any(k.startswith("fallback::") for k in m_), m_


def test_stateless_random_ops_match_xla():
    """XLA's stateless random streams differ from the eager CPU kernels' (also for
    ``tf.function(jit_compile=True)``), so the reference here is TF's own jit."""
    rng = np.random.default_rng(5)
    x = random_array(rng, (3, 4))

    def draw(t, seed):
        return [tf.random.stateless_normal([2, 3], seed=seed),
                tf.random.stateless_uniform([4], seed=seed + 1),
                tf.nn.experimental.stateless_dropout(t, 0.5, seed=[1, 2])]
    seed = np.array([3, 5], np.int64)
    jit = tf.function(draw, jit_compile=True)(tf.constant(x), tf.constant(seed))
    lz = draw(lazy.tensor(x), lazy.tensor(seed))
    lazy.mark_step()
    _assert_same(lz, jit, rtol=1e-6, atol=1e-6)
    kept = lz[2].numpy()
    assert np.all((kept == 0) | np.isclose(kept, 2 * x, rtol=1e-6))


def test_stateful_random_ops_are_recorded_with_their_laws():
    """Stateful random ops cannot equal eager's draws; check what they must satisfy."""
    rng = np.random.default_rng(6)
    a = random_array(rng, (50, 4))
    x = lazy.tensor(a)
    shuffled, dropped = tf.random.shuffle(x), tf.nn.dropout(x, 0.5)
    assert isinstance(shuffled, lazy.LazyTensor) and isinstance(dropped, lazy.LazyTensor)
    lazy.mark_step()
    np.testing.assert_allclose(np.sort(shuffled.numpy(), 0), np.sort(a, 0))
    d = dropped.numpy()
    assert np.all((d == 0) | np.isclose(d, 2 * a, rtol=1e-6)) and 0 < np.mean(d == 0) < 1
    assert not any(k.startswith("fallback") for k in lazy.metrics())


def test_coverage_of_at_least_150_tf_apis():
    ops = lazy.covered_ops()
    assert len(ops) >= 150
    for family in ("math.add", "nn.conv2d", "reshape", "reduce_sum", "linalg.cholesky",
                   "random.stateless_normal", "einsum", "gather", "tensor_scatter_nd_update"):
        assert family in ops


def test_convolution_and_pooling_match_eager():
    rng = np.random.default_rng(3)
    img = random_array(rng, (2, 8, 8, 3))
    k = random_array(rng, (3, 3, 3, 4))
    kd = random_array(rng, (3, 3, 3, 2))

    def net(x, w, wd):
        return [tf.nn.conv2d(x, w, 1, "SAME"), tf.nn.conv2d(x, w, [1, 2, 2, 1], "VALID"),
                tf.nn.depthwise_conv2d(x, wd, [1, 1, 1, 1], "SAME"),
                tf.nn.max_pool2d(x, 2, 2, "VALID"), tf.nn.avg_pool2d(x, 3, 1, "SAME"),
                tf.nn.conv1d(x[:, 0], w[0], 1, "SAME"),
                tf.nn.conv2d_transpose(x, tf.transpose(w, [0, 1, 3, 2])[..., :3], [2, 8, 8, 4],
                                       1, "SAME")]
    lz, eager = _both(net, img, k, kd)
    _assert_same(lz, eager, rtol=1e-4, atol=1e-4)
# }}}


# {{{ random op sequences

_UNARY = [tf.math.tanh, tf.math.sin, tf.nn.relu, tf.math.abs, tf.math.sigmoid,
          lambda t: t * 0.5, lambda t: -t, lambda t: 1.0 - t, tf.transpose,
          lambda t: tf.nn.softmax(t, axis=-1), lambda t: tf.reduce_mean(t, 0, keepdims=True) + t]
_BINARY = [tf.add, tf.subtract, tf.multiply, tf.maximum, tf.minimum,
           lambda a, b: tf.matmul(a, b) * 0.25, lambda a, b: a + 2.0 * b]

_step = st.one_of(
    st.tuples(st.just("unary"), st.integers(0, len(_UNARY) - 1), st.integers(0, 99)),
    st.tuples(st.just("binary"), st.integers(0, len(_BINARY) - 1), st.integers(0, 99),
              st.integers(0, 99)),
    st.tuples(st.just("branch"), st.integers(0, 99)),          # Python `if` on a value
    st.tuples(st.just("fallback"), st.integers(0, 99)),        # an op without a lazy rule
    st.tuples(st.just("assign"), st.integers(0, 99)),          # variable update
)


def _run_sequence(steps, arrays, T, Var):
    """Apply ``steps`` with tensor factory ``T`` and variable class ``Var``."""
    pool = [T(a) for a in arrays]
    var = Var(arrays[0] * 0.5)
    for step in steps:
        kind = step[0]
        if kind == "unary":
            pool.append(_UNARY[step[1]](pool[step[2] % len(pool)]))
        elif kind == "binary":
            pool.append(_BINARY[step[1]](pool[step[2] % len(pool)], pool[step[3] % len(pool)]))
        elif kind == "branch":
            t = pool[step[1] % len(pool)]
            pool.append(t * 2.0 if tf.reduce_sum(t) > 0 else t - 1.0)
        elif kind == "fallback":
            pool.append(tf.debugging.check_numerics(pool[step[1] % len(pool)], "x"))
        else:
            var.assign_add(tf.tanh(pool[step[1] % len(pool)]))
            pool.append(var * 1.5)
    return pool, var


@settings(max_examples=8)
@given(n=st.integers(2, 4), steps=st.lists(_step, min_size=1, max_size=8),
       seed=st.integers(0, 2 ** 16))
def test_random_op_sequences_match_eager(n, steps, seed):
    rng = np.random.default_rng(seed)
    arrays = [random_array(rng, (n, n)) for _ in range(2)]
    eager, evar = _run_sequence(steps, arrays, tf.constant, tf.Variable)
    lz, lvar = _run_sequence(steps, arrays, lazy.tensor, lazy.Variable)
    lazy.mark_step()
    for a, b in zip(lz, eager):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lvar.numpy(), evar.numpy(), rtol=1e-4, atol=1e-5)
    falls = sum(1 for s in steps if s[0] == "fallback")
    assert lazy.metrics().get("fallback::check_numerics", 0) == falls
    lazy.reset_metrics()
# }}}


# {{{ forcing points, fallback, errors

def test_forcing_points_and_static_shapes():
    rng = np.random.default_rng(4)
    a = random_array(rng, (3, 2))
    x = lazy.tensor(a) * 2.0
    assert x.shape == (3, 2) and len(x) == 3 and x.ndim == 2 and x.dtype == tf.float32
    assert tf.shape(x).numpy().tolist() == [3, 2] and int(tf.size(x)) == 6
    assert int(tf.rank(x)) == 2
    assert lazy.metrics().get("barriers", 0) == 0  # static shape queries never force
    np.testing.assert_allclose(tf.convert_to_tensor(x).numpy(), a * 2)
    s = tf.reduce_sum(x)
    assert float(s) == pytest.approx(float(np.sum(a * 2)), rel=1e-5)
    assert int(tf.cast(s, tf.int32)) == int(np.float32(np.sum(a * 2)))
    assert bool(s > -1e9)
    rows = [r.numpy() for r in x]
    np.testing.assert_allclose(np.stack(rows), a * 2)
    assert "LazyTensor" in repr(x + 1.0) and f"{tf.reduce_max(x):.3f}" == f"{np.max(a * 2):.3f}"
    assert lazy.metrics()["forced"] >= 5
    with pytest.raises(TypeError, match=r"\.numpy\(\)"):
        np.asarray(x)   # implicit NumPy conversion would hide a barrier: explicit only
    np.testing.assert_allclose((np.float32(3.0) * x).numpy(), 3 * a * 2)


def test_small_eager_int_tensors_are_baked_with_their_dtype():
    cond = lazy.tensor([True, False])
    a, b = tf.constant([1, 2], tf.int64), tf.constant([3, 4], tf.int64)
    out = tf.where(cond, a, b)
    assert out.dtype == tf.int64
    np.testing.assert_array_equal(out.numpy(), [1, 4])
    assert "const()" in lazy.ir_text(tf.where(cond, a, b))


def test_fallback_runs_eagerly_and_is_counted():
    x = lazy.tensor([3.0, 1.0, 3.0, 2.0]) * 1.5
    y, idx = tf.unique(x)              # value-dependent output shape: no lazy rule
    z = y * 2.0                        # the result starts a new graph
    np.testing.assert_allclose(z.numpy(), [9.0, 3.0, 6.0])
    np.testing.assert_array_equal(idx.numpy(), [0, 1, 0, 2])
    assert isinstance(z, lazy.LazyTensor)
    assert lazy.metrics()["fallback::unique"] == 1
    assert "unique" in lazy.metrics_report()
    # a TF API that converts its input itself (no lazy rule, no dispatch failure) is counted too
    counts = tf.math.bincount(lazy.tensor(np.array([0, 2, 2], np.int32)))
    np.testing.assert_array_equal(np.asarray(counts), [1, 0, 2])
    assert lazy.metrics()["fallback::bincount"] == 1
    assert "fallback::convert_to_tensor" not in lazy.metrics()   # the user's own call forces
    np.testing.assert_allclose(tf.convert_to_tensor(x).numpy(), [4.5, 1.5, 4.5, 3.0])
    assert "fallback::convert_to_tensor" not in lazy.metrics()


def test_fallback_error_flag_names_the_op_and_line():
    lazy.set_fallback_error(True)
    x = lazy.tensor([3.0, 1.0])
    with pytest.raises(lazy.LazyFallbackError, match=r"tf\.unique .*test_ops\.py:\d+"):
        tf.unique(x)
    with pytest.raises(lazy.LazyFallbackError, match="boolean_mask|where"):
        tf.boolean_mask(x, [True, False])
    with pytest.raises(lazy.LazyFallbackError, match=r"tf\.bincount .*converts its lazy input"):
        tf.math.bincount(lazy.tensor(np.array([0, 2], np.int32)))


def test_shape_errors_name_the_op_and_user_line():
    x = lazy.tensor(np.ones([2, 3], np.float32))
    with pytest.raises(lazy.LazyShapeError, match=r"tf\.matmul: .*test_ops\.py:\d+"):
        tf.matmul(x, x)
    with pytest.raises(ValueError):  # LazyShapeError is a ValueError, like eager's errors
        x + lazy.tensor(np.ones([4], np.float32))


def test_lazy_tensors_inside_tf_function_are_a_clear_error():
    x = lazy.tensor([1.0, 2.0])
    with pytest.raises(Exception, match="lazy tensors are for eager code"):  # autograph wraps
        tf.function(lambda: tf.nn.relu(x) * 2.0)()
    np.testing.assert_allclose(tf.function(lambda t: t * 2.0)(lazy.to_tensor(x)), [2.0, 4.0])


def test_getitem_with_a_tensor_index_falls_back():
    x = lazy.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_allclose(x[tf.constant(1)].numpy(), [3.0, 4.0, 5.0])
    assert lazy.metrics()["fallback::__getitem__"] == 1
# }}}


def test_every_table_op_is_exercised():
    """The differential tests above record every op of the table at least once (the spec
    cache remembers what was recorded; run alone, this test runs them first)."""
    from tfx_vec.lazy import ops
    if set(ops.OPS) - {key[0] for key in ops._spec_cache}:
        for producer in (test_every_unary_elementwise_op_matches_eager,
                         test_every_binary_elementwise_op_matches_eager,
                         test_structural_ops_match_eager_in_one_program,
                         test_stateful_random_ops_are_recorded_with_their_laws,
                         test_convolution_and_pooling_match_eager,
                         test_stateless_random_ops_match_xla):
            lazy.mark_step()
            lazy.reset_metrics()
            lazy.clear_cache()
            producer()
    assert sorted(set(ops.OPS) - {key[0] for key in ops._spec_cache}) == []
