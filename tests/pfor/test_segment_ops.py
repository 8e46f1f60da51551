"""Segment, scatter, stitch, partition and bincount converters against the oracle.

Index arrays are drawn per iteration (``stacked_arrays``) so that every iteration is valid on
its own (sorted ids, unique scatter targets, equal partition sizes); the cases where
iterations would produce different shapes must raise a clear error instead.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import tfx_vec
from tests.pfor.oracle import check_op
from tests.pfor.test_nn_ops import RNG, gathered, rand, together

N = 3


def check(op, pairs, **kw):
    """``pairs``: (invariant value, ``[N, ...]`` stack) per input."""
    check_op(op, [p[0] for p in pairs], stacked_arrays=[p[1] for p in pairs], iters=N,
             rtol=kw.pop("rtol", 1e-5), atol=kw.pop("atol", 1e-5), **kw)


def stack_of(make) -> tuple[np.ndarray, np.ndarray]:
    return make(), np.stack([make() for _ in range(N)])


def sorted_ids(m: int, num: int) -> np.ndarray:
    """Sorted segment ids in [0, num) that use id num-1 (so every iteration has num rows)."""
    ids = np.sort(RNG.integers(0, num, size=m))
    ids[-1] = num - 1
    return ids.astype(np.int32)


# {{{ segment reductions

def test_sorted_segments():
    check(together(sum=tf.math.segment_sum, mean=tf.math.segment_mean,
                   max=tf.math.segment_max, min=tf.math.segment_min,
                   prod=tf.math.segment_prod),
          [stack_of(lambda: rand(7, 2)), stack_of(lambda: sorted_ids(7, 4))])


def test_sorted_segments_with_different_counts_is_an_error():
    data = tf.constant(rand(5, 2))
    ids = gathered(np.array([[0, 0, 1, 1, 2], [0, 1, 1, 1, 1]], np.int32))
    with pytest.raises(tfx_vec.VectorizationError, match="SegmentSum.*differs across"):
        tfx_vec.pfor(lambda i: tf.math.segment_sum(data, ids(i)), 2,
                     fallback_to_while_loop=False)


def test_unsorted_segments():
    def ids():  # 2-D ids with a dropped (negative) entry
        a = RNG.integers(0, 5, size=(3, 2)).astype(np.int64)
        a[1, 0] = -1
        return a
    check(together(sum=lambda d, s: tf.math.unsorted_segment_sum(d, s, 5),
                   max=lambda d, s: tf.math.unsorted_segment_max(d, s, 5),
                   min=lambda d, s: tf.math.unsorted_segment_min(d, s, 5),
                   prod=lambda d, s: tf.math.unsorted_segment_prod(d, s, 5)),
          [stack_of(lambda: rand(3, 2, 4)), stack_of(ids)])


@settings(max_examples=5)
@given(data=st.data())
def test_unsorted_segment_sum_random_shapes(data):
    m, k, num = (data.draw(st.integers(1, 5)) for _ in range(3))
    rows = (m,) if data.draw(st.booleans()) else (m, 2)
    combo = data.draw(st.sampled_from([(True, False), (False, True), (True, True)]))
    ids = lambda: RNG.integers(-1, num, size=rows).astype(np.int32)  # noqa: E731
    check(lambda d, s: tf.math.unsorted_segment_sum(d, s, num),
          [stack_of(lambda: rand(*rows, k)), stack_of(ids)], combos=[combo], modes=("eager",))


def test_sparse_segments():
    ids = lambda: sorted_ids(6, 3)  # noqa: E731
    idx = lambda: RNG.integers(0, 5, size=6).astype(np.int32)  # noqa: E731
    check(together(sum=tf.sparse.segment_sum, mean=tf.sparse.segment_mean,
                   sqrt_n=tf.sparse.segment_sqrt_n,
                   sum_n=lambda d, i, s: tf.sparse.segment_sum(d, i, s, num_segments=4),
                   mean_n=lambda d, i, s: tf.sparse.segment_mean(d, i, s, num_segments=4),
                   sqrt_n_n=lambda d, i, s: tf.sparse.segment_sqrt_n(d, i, s, num_segments=4)),
          [stack_of(lambda: rand(5, 3)), stack_of(idx), stack_of(ids)])


def test_sparse_segment_grads():
    ids = lambda: sorted_ids(6, 3)  # noqa: E731
    idx = lambda: RNG.integers(0, 5, size=6).astype(np.int32)  # noqa: E731
    ops = {name: (lambda g, i, s, op=op: op(grad=g, indices=i, segment_ids=s, output_dim0=5))
           for name, op in [("sum", tf.raw_ops.SparseSegmentSumGrad),
                            ("mean", tf.raw_ops.SparseSegmentMeanGrad),
                            ("sqrt_n", tf.raw_ops.SparseSegmentSqrtNGrad)]}
    check(together(**ops), [stack_of(lambda: rand(3, 2)), stack_of(idx), stack_of(ids)])

# }}}


# {{{ scatters

def unique_indices(k: int, shape: tuple) -> np.ndarray:
    flat = RNG.choice(int(np.prod(shape)), size=k, replace=False)
    return np.stack(np.unravel_index(flat, shape), -1).astype(np.int32)


def test_tensor_scatter_family():
    check(together(update=tf.tensor_scatter_nd_update, add=tf.tensor_scatter_nd_add,
                   sub=tf.tensor_scatter_nd_sub, max=tf.tensor_scatter_nd_max,
                   min=tf.tensor_scatter_nd_min),
          [stack_of(lambda: rand(4, 3, 2)), stack_of(lambda: unique_indices(5, (4, 3))),
           stack_of(lambda: rand(5, 2))])


def test_scatter_nd():
    def idx():  # a duplicate target: ScatterNd sums duplicates
        a = unique_indices(4, (5,))
        a[3] = a[0]
        return a
    check(lambda i, u: tf.scatter_nd(i, u, [5, 2]), [stack_of(idx),
                                                   stack_of(lambda: rand(4, 2))])

# }}}


# {{{ stitch, partition, bincount

def test_dynamic_stitch():
    def perm():
        return RNG.permutation(6).astype(np.int32)
    op = lambda p, a, b: tf.dynamic_stitch([p[:2], tf.reshape(p[2:], [2, 2])],  # noqa: E731
                                           [a, b])
    check(together(stitch=op,
                   parallel=lambda p, a, b: tf.raw_ops.ParallelDynamicStitch(
                       indices=[p[:2], tf.reshape(p[2:], [2, 2])], data=[a, b])),
          [stack_of(perm), stack_of(lambda: rand(2, 3)), stack_of(lambda: rand(2, 2, 3))])


def test_dynamic_partition():
    def parts():  # the same partition sizes in every iteration, in a different order
        return RNG.permutation(np.array([[0, 1, 1], [2, 1, 0]]).ravel()).reshape(2, 3)
    check(lambda d, p: tf.dynamic_partition(d, p, 3),
          [stack_of(lambda: rand(2, 3, 2)), stack_of(lambda: parts().astype(np.int32))])


def test_dynamic_partition_with_different_sizes_is_an_error():
    data = tf.constant(rand(4))
    parts = gathered(np.array([[0, 0, 1, 1], [0, 1, 1, 1]], np.int32))
    with pytest.raises(tfx_vec.VectorizationError, match="DynamicPartition"):
        tfx_vec.pfor(lambda i: tf.dynamic_partition(data, parts(i), 2), 2,
                     fallback_to_while_loop=False)


def test_bincount():
    arr = lambda: RNG.integers(0, 7, size=(2, 5)).astype(np.int32)  # noqa: E731
    check(together(
        dense=lambda a, w: tf.math.bincount(a, w, minlength=6, maxlength=6),
        binary=lambda a, w: tf.math.bincount(a, minlength=6, maxlength=6, binary_output=True,
                                             axis=-1),
        counts=lambda a, w: tf.math.bincount(a, minlength=8, maxlength=8),
        raw=lambda a, w: tf.raw_ops.Bincount(arr=a, size=6, weights=w)),
        [stack_of(arr), stack_of(lambda: rand(2, 5))])

# }}}


def test_run_time_loop_length():
    """Id offsets and row splits with ``iters`` a run-time tensor, one iteration, and chunks."""
    ids = lambda: sorted_ids(6, 3)  # noqa: E731
    ops = together(segment=lambda d, s: tf.math.segment_max(d, s),
                   unsorted=lambda d, s: tf.math.unsorted_segment_sum(d, s, 4),
                   sparse=lambda d, s: tf.sparse.segment_mean(d, s[::-1] % 6, s),
                   scatter=lambda d, s: tf.tensor_scatter_nd_add(d, s[:, None], d),
                   stitch=lambda d, s: tf.dynamic_stitch([tf.range(6) - s + s], [d]),
                   partition=lambda d, s: tf.dynamic_partition(d, s * 0 + tf.range(6) % 2, 2),
                   bincount=lambda d, s: tf.math.bincount(s, minlength=5, maxlength=5))
    check(ops, [stack_of(lambda: rand(6, 2)), stack_of(ids)], combos=[(True, True)],
          modes=("dynamic", "one", "chunked"))
