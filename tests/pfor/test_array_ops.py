"""Array converters against the per-iteration oracle: one record table per family."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

import tfx_vec
from tests.pfor.oracle import check_op, check_pfor
from tests.support import random_array

R = np.random.default_rng(11)
F32 = np.float32


def a(*shape, dtype=F32, low=-2.0, high=2.0):
    return random_array(R, shape, dtype, low, high)


ONE_INPUT = [
    ("Reshape", lambda x: tf.reshape(x, [3, -1]), a(2, 3, 2)),
    ("ExpandDims", lambda x: tf.expand_dims(x, 1) + tf.expand_dims(x, -1), a(2, 3)),
    ("Squeeze", lambda x: tf.squeeze(x, [0, -1]), a(1, 3, 1)),
    ("Squeeze-all", tf.squeeze, a(1, 3, 1)),
    ("Transpose", lambda x: tf.transpose(x, [2, 0, 1]), a(2, 3, 4)),
    ("Transpose-default", tf.transpose, a(2, 3)),
    ("ConjugateTranspose", lambda x: tf.math.real(tf.transpose(tf.complex(x, x), conjugate=True)),
     a(2, 3)),
    ("Unpack", lambda x: tf.unstack(x, axis=1), a(2, 3)),
    ("Unpack-neg", lambda x: tf.unstack(x, axis=-1), a(2, 3)),
    ("Split", lambda x: tf.split(x, 2, axis=1), a(3, 4)),
    ("SplitV", lambda x: tf.split(x, [1, 3], axis=-1), a(3, 4)),
    ("Slice", lambda x: tf.slice(x, [1, 0], [2, -1]), a(3, 4)),
    ("StridedSlice", lambda x: x[1:, ::-2], a(3, 4)),
    ("StridedSlice-shrink-newaxis", lambda x: x[1, tf.newaxis, 1:3], a(3, 4)),
    ("StridedSlice-ellipsis", lambda x: x[..., 0, ::2], a(2, 3, 4)),
    ("StridedSlice-neg", lambda x: x[-1, :-1], a(3, 4)),
    ("Tile", lambda x: tf.tile(x, [2, 3]), a(2, 2)),
    ("Pad", lambda x: tf.pad(x, [[1, 0], [0, 2]]), a(2, 3)),
    ("PadV2", lambda x: tf.pad(x, [[1, 0], [0, 2]], constant_values=3.0), a(2, 3)),
    ("MirrorPad", lambda x: tf.pad(x, [[1, 1], [0, 2]], mode="REFLECT"), a(3, 3)),
    ("Shape/Size/Rank", lambda x: tf.cast(x, tf.int32)[0, 0] + tf.shape(x)[1] + tf.size(x)
     + tf.rank(x), a(2, 3)),
    ("ShapeN", lambda x: tf.shape_n([x, x[0]])[1], a(2, 3)),
    ("BroadcastTo", lambda x: tf.broadcast_to(x, [2, 4, 3]), a(4, 1)),
    ("ReverseV2", lambda x: tf.reverse(x, [0, -1]), a(2, 3)),
    ("Reverse-v1", lambda x: tf.raw_ops.Reverse(tensor=x, dims=[True, False]), a(2, 3)),
    ("Roll", lambda x: tf.roll(x, [1, -1], [0, 1]), a(3, 4)),
    ("OneHot", lambda x: tf.one_hot(x, 4, axis=0), a(3, dtype=np.int32, low=0, high=2)),
    ("OneHot-last", lambda x: tf.one_hot(x, 4, 2.0, -1.0), a(3, dtype=np.int32, low=0, high=2)),
    ("MatrixBandPart", lambda x: tf.linalg.band_part(x, 1, 0), a(2, 3, 3)),
    ("MatrixDiag", lambda x: tf.raw_ops.MatrixDiag(diagonal=x), a(2, 3)),
    ("MatrixDiagV3", lambda x: tf.linalg.diag(x, k=(-1, 0), num_rows=4, num_cols=3), a(2, 3)),
    ("MatrixDiagPart", lambda x: tf.raw_ops.MatrixDiagPart(input=x) + tf.linalg.diag_part(x),
     a(3, 3)),
    ("MatrixDiagPartV3", lambda x: tf.linalg.diag_part(x, k=(-1, 1)), a(3, 4)),
    ("IdentityN", lambda x: tf.identity_n([x, 2 * x]), a(3)),
    ("EnsureShape", lambda x: tf.ensure_shape(x, [2, None]), a(2, 3)),
    ("PlaceholderWithDefault", lambda x: tf.raw_ops.PlaceholderWithDefault(input=x, shape=[2, 3]),
     a(2, 3)),
    ("InvertPermutation", lambda x: tf.math.invert_permutation(tf.argsort(x)), a(5)),
    ("Where-equal-counts", lambda x: tf.where(tf.argsort(x) < 2), a(4)),
    ("Unique-equal-counts", lambda x: tf.unique(tf.gather(tf.argsort(x), [0, 1, 0, 2, 1]))[0:2],
     a(4)),
    ("Fill", lambda x: tf.fill([2, 3], x[0]), a(2)),
    ("Range", lambda x: tf.range(x[0], x[0] + 4), a(2, dtype=np.int32)),
    ("Range-float", lambda x: tf.range(x[0], x[0] + 2.0, 0.5), a(2)),
    ("LinSpace", lambda x: tf.linspace(x[0], x[1], 5), a(2)),
    ("Bucketize", lambda x: tf.raw_ops.Bucketize(input=x, boundaries=[-1.0, 0.0, 0.5]), a(2, 3)),
    ("RGBToHSV/HSVToRGB", lambda x: tf.image.hsv_to_rgb(tf.image.rgb_to_hsv(tf.abs(x))),
     a(2, 3, low=0.1, high=1.0)),
    ("AdjustContrast/Hue/Saturation", lambda x: tf.image.adjust_contrast(
        tf.image.adjust_saturation(tf.image.adjust_hue(x, 0.2), 0.5), 0.7),
     a(2, 2, 3, low=0.1, high=1.0)),
    ("SpaceToDepth/DepthToSpace", lambda x: tf.nn.depth_to_space(
        tf.nn.space_to_depth(x, 2) * 2.0, 2), a(2, 4, 4, 3)),
    ("ResizeBilinear/Nearest", lambda x: tf.image.resize(x, [3, 5]) + tf.image.resize(
        x, [3, 5], method="nearest"), a(2, 4, 4, 1)),
    ("ExtractImagePatches", lambda x: tf.image.extract_patches(
        x, [1, 2, 2, 1], [1, 1, 1, 1], [1, 1, 1, 1], "VALID"), a(1, 3, 3, 2)),
    ("Assert", lambda x: tf.identity(x) if tf.debugging.assert_less(x, 100.0) is None else x, a(2)),
    ("Diag-rank1", lambda x: tf.raw_ops.Diag(diagonal=x), a(3)),
    ("Diag-rank2", lambda x: tf.raw_ops.Diag(diagonal=x), a(2, 3)),
    ("DiagPart", lambda x: tf.raw_ops.DiagPart(input=tf.reshape(x, [2, 3, 2, 3])), a(6, 6)),
]


@pytest.mark.parametrize("name,fn,x", ONE_INPUT, ids=[r[0] for r in ONE_INPUT])
def test_one_input(name, fn, x):
    check_op(fn, [x], rtol=1e-5, atol=1e-6)


IDX = np.array([2, 0, 1, 2], np.int32)
TWO_INPUTS = [
    ("ConcatV2", lambda x, y: tf.concat([x, y, x], axis=1), a(2, 3), a(2, 1)),
    ("ConcatV2-neg", lambda x, y: tf.concat([x, y], axis=-2), a(2, 3), a(1, 3)),
    ("Pack", lambda x, y: tf.stack([x, y], axis=1), a(2, 3), a(2, 3)),
    ("Pack-neg", lambda x, y: tf.stack([x, y, x], axis=-1), a(3), a(3)),
    ("GatherV2", lambda p, i: tf.gather(p, i), a(3, 2), IDX),
    ("GatherV2-axis", lambda p, i: tf.gather(p, i, axis=1), a(2, 3, 2), IDX),
    ("GatherV2-neg-axis", lambda p, i: tf.gather(p, i, axis=-1), a(2, 3), IDX),
    ("GatherV2-batch-dims", lambda p, i: tf.gather(p, i, axis=1, batch_dims=1), a(2, 3, 2),
     np.array([[0, 2], [1, 1]], np.int32)),
    ("Gather-v1", lambda p, i: tf.raw_ops.Gather(params=p, indices=i), a(3, 2), IDX),
    ("GatherNd", lambda p, i: tf.gather_nd(p, i), a(2, 2, 2),
     np.array([[0, 1], [1, 0], [1, 1]], np.int32)),
    ("Cross", tf.linalg.cross, a(2, 3), a(2, 3)),
    ("MatrixSetDiag", lambda x, d: tf.linalg.set_diag(x, d), a(3, 3), a(3)),
    ("MatrixSetDiagV3-k", lambda x, d: tf.linalg.set_diag(x, d, k=1), a(3, 3), a(2)),
    ("Roll-per-iteration-shift", lambda x, s: tf.roll(x, s, [0, 1, 1]), a(3, 4),
     np.array([1, -2, 3], np.int32)),
    ("Roll-scalar-shift", lambda x, s: tf.roll(x, s[0], 0), a(5, 2), np.array([2], np.int32)),
    ("LowerBound", lambda s, v: tf.searchsorted(tf.sort(s), v), a(2, 6), a(2, 4)),
    ("UpperBound", lambda s, v: tf.searchsorted(tf.sort(s), v, side="right", out_type=tf.int64),
     a(2, 6), np.round(a(2, 4))),
    ("BroadcastArgs", lambda x, y: tf.raw_ops.BroadcastArgs(s0=tf.shape(x) * 0 + tf.abs(y[:2]) + 1,
                                                            s1=tf.constant([1, 1])),
     a(2), a(3, dtype=np.int32)),
]


@pytest.mark.parametrize("name,fn,x,y", TWO_INPUTS, ids=[r[0] for r in TWO_INPUTS])
def test_two_inputs(name, fn, x, y):
    check_op(fn, [x, y], rtol=1e-5, atol=1e-6)


def test_matrix_set_diag_band_of_diagonals():
    check_op(lambda x, d: tf.linalg.set_diag(x, d, k=(0, 1)), [a(3, 3), a(2, 3)],
             modes=("eager", "function", "one"))


INDEX_SLICES = [
    ("x[i]", lambda x, i: x[i]),
    ("x[i, 1:]", lambda x, i: x[i, 1:]),
    ("x[i:i+2]", lambda x, i: x[i:i + 2]),
    ("x[-i-1]", lambda x, i: x[-i - 1]),
    ("x[:, i]", lambda x, i: x[:, i]),
    ("x[1:, j:j+3:2]", lambda x, i: x[1:, i % 2:i % 2 + 3:2]),
    ("x[i:]-equal", lambda x, i: x[i % 1:][:4]),
    ("Slice", lambda x, i: tf.slice(x, [i, 1], [2, -1])),
    ("Slice-rest", lambda x, i: tf.slice(x, tf.stack([i % 1, i]), [-1, 2])),
]


@pytest.mark.parametrize("name,fn", INDEX_SLICES, ids=[r[0] for r in INDEX_SLICES])
def test_slices_with_loop_variant_bounds(name, fn):
    x = tf.constant(a(6, 5))
    stacked_x = tf.constant(a(4, 6, 5))
    check_pfor(lambda i: fn(x, i), 4, modes="rotate")
    check_pfor(lambda i: fn(tf.gather(stacked_x, i), i), 4, modes=("eager",))


def test_slice_with_ragged_bounds_is_a_clear_error():
    x = tf.constant(a(6, 5))
    with pytest.raises(tfx_vec.VectorizationError, match="StridedSlice.*slice lengths differ"):
        tfx_vec.pfor(lambda i: x[i:], 3, fallback_to_while_loop=False)


def test_where_ragged_is_a_clear_error():
    x = tf.constant(np.array([[1, 0, 1], [1, 1, 1]], np.float32))
    with pytest.raises(tfx_vec.VectorizationError, match=r"Where.*test_array_ops.py:\d+.*ragged"):
        tfx_vec.pfor(lambda i: tf.where(tf.gather(x, i) > 0), 2, fallback_to_while_loop=False)


def test_boolean_mask_ragged_is_a_clear_error():
    x = tf.constant(np.array([[1, -1, 1], [1, 1, 1]], np.float32))
    with pytest.raises(tfx_vec.VectorizationError, match="ragged"):
        tfx_vec.pfor(lambda i: tf.boolean_mask(tf.gather(x, i), tf.gather(x, i) > 0), 2)


def test_unique_ragged_is_a_clear_error():
    x = tf.constant(np.array([[1, 1, 2], [1, 2, 3]], np.int32))
    with pytest.raises(tfx_vec.VectorizationError, match="Unique.*differs across"):
        tfx_vec.pfor(lambda i: tf.unique(tf.gather(x, i))[0], 2, fallback_to_while_loop=False)


def test_range_ragged_is_a_clear_error():
    with pytest.raises(tfx_vec.VectorizationError, match="Range"):
        tfx_vec.pfor(lambda i: tf.range(i), 3, fallback_to_while_loop=False)


@settings(max_examples=3)
@given(st.lists(st.integers(1, 3), min_size=2, max_size=4), st.randoms(use_true_random=False))
def test_random_shapes_transpose_slice_concat(shape, rnd):
    perm = list(range(len(shape)))
    rnd.shuffle(perm)
    axis = rnd.randrange(-len(shape), len(shape))
    x = random_array(np.random.default_rng(len(shape)), shape, F32)
    y = random_array(np.random.default_rng(7), shape, F32)

    def fn(u, v):
        t = tf.transpose(u, perm)
        return tf.concat([t, tf.transpose(v, perm)], axis)[..., ::-1], tf.reduce_sum(u, axis)
    check_op(fn, [x, y], modes=("eager",))


@pytest.mark.parametrize("size", [1, 7, 16, 17, 300])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_searchsorted_under_xla_is_a_blocked_search(size, dtype):
    """Under XLA, a search down a tree of 16-entry blocks (one to three levels here), against
    XLA's own per-iteration searchsorted: ties, values beyond both ends, infinities and NaNs."""
    rows = np.round(a(2, size) * 4).astype(dtype)               # repeated entries: ties
    values = np.round(a(2, 9) * 5).astype(dtype)                # some beyond both ends
    if dtype == np.float32:
        values[0, :3] = [np.inf, -np.inf, np.nan]
    for side in ("left", "right"):
        check_op(lambda s, v: tf.searchsorted(tf.sort(s), v, side=side), [rows, values],
                 combos=[(True, True), (False, True)], modes=("xla",))


def test_gather_from_params_of_unknown_rank():
    x = tf.constant(a(3, 4, 2))
    unknown = tf.function(lambda p: tfx_vec.pfor(lambda i: (
        tf.gather(p, i, axis=1), tf.gather(p, [i, 1], axis=-1), tf.gather(tf.gather(p, i), 1)),
        2, fallback_to_while_loop=False), input_signature=[tf.TensorSpec(None, tf.float32)])
    got = unknown(x)
    xv = x.numpy()
    np.testing.assert_array_equal(got[0].numpy(), np.stack([xv[:, i] for i in range(2)]))
    np.testing.assert_array_equal(got[1].numpy(), np.stack([xv[..., [i, 1]] for i in range(2)]))
    np.testing.assert_array_equal(got[2].numpy(), xv[:2, 1])


def test_gather_of_the_loop_index_is_a_slice_that_checks_its_bound():
    x = tf.constant(a(3, 4, 2))
    body = lambda i: tf.gather(x, i)  # noqa: E731
    for fn in (tf.function(lambda n: tfx_vec.pfor(body, n, fallback_to_while_loop=False)),
               lambda n: tf.function(lambda: tfx_vec.pfor(body, int(n)), jit_compile=True)()):
        np.testing.assert_array_equal(fn(tf.constant(2)).numpy(), x.numpy()[:2])
    ops = tf.function(lambda: tfx_vec.pfor(body, 3)).get_concrete_function().graph.get_operations()
    assert "GatherV2" not in {op.type for op in ops}
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.function(lambda: tfx_vec.pfor(body, 4, fallback_to_while_loop=False))()


def test_shape_arguments_that_depend_on_the_loop_index_are_named():
    x = tf.constant(a(3, 2, 3))
    with pytest.raises(tfx_vec.VectorizationError, match="expected to be loop invariant"):
        tfx_vec.pfor(lambda i: tf.tile(tf.gather(x, i), [i, 1]), 2, fallback_to_while_loop=False)


def test_select_with_scalar_and_row_conditions():
    check_op(lambda c, t, e: tf.raw_ops.Select(condition=c > 0, x=t, y=e),
             [a(2), a(2, 3, 4), a(2, 3, 4)])
    check_op(lambda c, t, e: tf.raw_ops.Select(condition=c > 0, x=t, y=e),
             [a(), a(3, 4), a(3, 4)])
