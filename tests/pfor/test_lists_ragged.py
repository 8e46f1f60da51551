"""TensorLists in while loops whose trip count depends on the loop index (per-row element
counts, ``lists.RowCountedList``), against per-iteration references; every case runs with
``fallback_to_while_loop=False``, so nothing falls back to a per-iteration loop."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import tensorflow as tf
from tensorflow.python.ops import list_ops

import tfx_vec
import tfx_vec.pfor.gradients as G
from tests.pfor.oracle import assert_all_close, check_pfor, reference
from tests.support import random_array
from tfx_vec.pfor import vectorizer

RNG = np.random.default_rng(17)
N, T, D, H = 5, 6, 3, 4
SEQS = tf.constant(random_array(RNG, [N, T, D], np.float32, -1, 1))
LENS = tf.constant([3, 0, 6, 1, 4], tf.int32)       # per-example trip counts, one of them 0
LENS_POS = tf.constant([3, 1, 6, 2, 4], tf.int32)   # >= 1: "the last element" exists
W = tf.Variable(random_array(RNG, [D, H], np.float32, -1, 1))
U = tf.Variable(random_array(RNG, [H, H], np.float32, -0.5, 0.5))
FAST = ("eager", "dynamic")


def _step(x, h):
    return tf.tanh(tf.linalg.matvec(W, x, transpose_a=True) + tf.linalg.matvec(U, h))


def _rnn(xs, length):
    """An RNN over the first ``length`` rows of ``xs`` (its own trip count)."""
    _, h = tf.while_loop(lambda t, h: t < length,
                         lambda t, h: (t + 1, _step(tf.gather(xs, t), h)),
                         (tf.constant(0), tf.zeros([H])))
    return h


@pytest.fixture(autouse=True)
def _no_fallbacks():
    vectorizer.reset_fallbacks()
    yield
    assert not vectorizer.fallback_report(), str(vectorizer.fallback_report())


def _reference_fn(fn, iters):
    """Per-iteration reference run inside tf.function (graph TensorArrays, as in pfor)."""
    compiled = tf.function(fn)
    outs = [compiled(tf.constant(i)) for i in range(iters)]
    return tf.nest.map_structure(lambda *xs: np.stack([np.asarray(x) for x in xs]), *outs)


def test_tensor_array_of_per_example_length_sum_and_last_element():
    def f(i):
        xs, length = tf.gather(SEQS, i), tf.gather(LENS, i)
        ta = tf.TensorArray(tf.float32, size=T, element_shape=[H],  # unwritten: zeros
                            clear_after_read=False)

        def body(t, h, ta):
            h = _step(tf.gather(xs, t), h)
            return t + 1, h, ta.write(t, h)
        _, h, ta = tf.while_loop(lambda t, h, ta: t < length, body, (0, tf.zeros([H]), ta))
        return tf.reduce_sum(ta.stack(), 0), ta.read(tf.maximum(length - 1, 0)), h
    check_pfor(f, N, modes=FAST)


def test_dynamic_tensor_array_grows_to_each_examples_length():
    def f(i):
        xs, length = tf.gather(SEQS, i), tf.gather(LENS_POS, i)
        ta = tf.TensorArray(tf.float32, size=0, dynamic_size=True, element_shape=[D],
                            clear_after_read=False)
        _, ta = tf.while_loop(lambda t, ta: t < length,
                              lambda t, ta: (t + 1, ta.write(t, tf.gather(xs, t) * 2.0)),
                              (0, ta))
        return ta.size(), ta.read(ta.size() - 1), ta.read(0), ta.gather([0, 0])
    check_pfor(f, N, modes=FAST)


def test_push_then_pop_each_example_pops_its_own_last_element_first():
    """Two loops of the example's own length: the second pops what the first pushed, in
    reverse (the buffer is realigned on the first pop: the examples' ends differ)."""
    def f(i):
        xs, length = tf.gather(SEQS, i), tf.gather(LENS, i)
        acc = list_ops.empty_tensor_list(tf.constant([D]), tf.float32)
        _, acc = tf.while_loop(lambda t, l: t < length,
                               lambda t, l: (t + 1, list_ops.tensor_list_push_back(
                                   l, tf.gather(xs, t))), (0, acc))

        def pop(t, l, s):
            l, e = list_ops.tensor_list_pop_back(l, tf.float32)
            return t + 1, l, s + e * tf.cast(t + 1, tf.float32)  # weights reveal the order
        _, acc, s = tf.while_loop(lambda t, l, s: t < length, pop, (0, acc, tf.zeros([D])))
        return s, list_ops.tensor_list_length(acc), list_ops.tensor_list_element_shape(acc,
                                                                                     tf.int32)
    check_pfor(f, N, modes=FAST)


def test_list_through_an_inner_loop_of_fixed_trip_count():
    """An inner loop with the same trip count everywhere pushes to the outer loop's list:
    the inner loop carries the per-row counts and the outer loop's active rows."""
    def f(i):
        xs, length = tf.gather(SEQS, i), tf.gather(LENS_POS, i)
        acc = list_ops.empty_tensor_list(tf.constant([D]), tf.float32)

        def outer(t, l):
            _, l = tf.while_loop(lambda k, l: k < 2, lambda k, l: (k + 1, list_ops.tensor_list_push_back(
                l, tf.gather(xs, t) * tf.cast(k + 1, tf.float32))), (0, l))
            return t + 1, l
        _, acc = tf.while_loop(lambda t, l: t < length, outer, (0, acc))
        n = list_ops.tensor_list_length(acc)
        return n, list_ops.tensor_list_get_item(acc, tf.maximum(n - 3, 0), tf.float32,
                                                element_shape=[D])
    check_pfor(f, N, modes=FAST)


def test_loop_invariant_pushes_share_elements_until_a_per_iteration_push():
    """Only loop-invariant values pushed: the rows share the elements (nothing tiled), and
    their reads are per row; a later per-iteration push gives each row its own elements."""
    table = SEQS[0]

    def f(i):
        length = tf.gather(LENS_POS, i)
        acc = list_ops.empty_tensor_list(tf.constant([D]), tf.float32)
        _, acc = tf.while_loop(lambda t, l: t < length, lambda t, l: (
            t + 1, list_ops.tensor_list_push_back(l, tf.gather(table, t))), (0, acc))
        shared_last = list_ops.tensor_list_get_item(acc, length - 1, tf.float32)
        shape = list_ops.tensor_list_element_shape(acc, tf.int32)
        prefix = list_ops.tensor_list_gather(acc, [0], tf.float32)     # the same in every row
        _, acc = tf.while_loop(lambda k, l: k < 2, lambda k, l: (
            k + 1, list_ops.tensor_list_push_back(l, tf.gather(SEQS[1], i) * 3.0)), (0, acc))
        n = list_ops.tensor_list_length(acc)
        return (shared_last, prefix, shape, n, list_ops.tensor_list_get_item(acc, n - 1, tf.float32),
                list_ops.tensor_list_get_item(acc, length - 1, tf.float32))
    check_pfor(f, N, modes=FAST)


def test_nested_loops_of_per_example_trip_counts_push_to_the_outer_list():
    """The inner loop's trip count depends on the outer step and the example: the list keeps
    all rows while both loops compact their active rows (composed row indices)."""
    def f(i):
        xs, length = tf.gather(SEQS, i), tf.gather(LENS, i)
        acc = list_ops.empty_tensor_list(tf.constant([D]), tf.float32)

        def outer(t, l):
            _, l = tf.while_loop(lambda k, l: k < (t + i) % 3, lambda k, l: (
                k + 1, list_ops.tensor_list_push_back(
                    l, tf.gather(xs, t) * tf.cast(k + 1, tf.float32))), (0, l))
            return t + 1, l
        _, acc = tf.while_loop(lambda t, l: t < length, outer, (0, acc))

        def pop(k, l, s):
            l, e = list_ops.tensor_list_pop_back(l, tf.float32)
            return k + 1, l, s * 0.5 + e
        n = list_ops.tensor_list_length(acc)
        _, _, s = tf.while_loop(lambda k, l, s: k < n, pop, (0, acc, tf.zeros([D])))
        return n, s
    check_pfor(f, N, modes=FAST)


def test_tensor_array_of_loop_variant_size():
    def f(i):
        length = tf.gather(LENS_POS, i)
        ta = tf.TensorArray(tf.float32, size=length, element_shape=[D], clear_after_read=False)
        ta = ta.write(0, tf.gather(tf.gather(SEQS, i), 0))
        return ta.size(), ta.read(0), ta.read(length - 1)
    check_pfor(f, N, modes=FAST)


def _filled_per_example(lengths, i):
    """A TensorArray that iteration ``i``'s while loop fills with ``lengths[i]`` rows."""
    ta = tf.TensorArray(tf.float32, size=0, dynamic_size=True, element_shape=[D])
    _, ta = tf.while_loop(lambda t, ta: t < tf.gather(lengths, i),
                          lambda t, ta: (t + 1, ta.write(t, tf.gather(SEQS[0], t))), (0, ta))
    return ta


# {{{ gradients of a per-example-length RNN

def _loss(example):
    xs, length = example
    h = _rnn(xs, length)
    return tf.reduce_sum(h * h) + tf.reduce_sum(h)


def _per_example_tapes(loss_fn, seqs, lens, variables):
    grads = []
    for i in range(seqs.shape[0]):
        with tf.GradientTape() as tape:
            loss = loss_fn((seqs[i], lens[i]))
        grads.append([g if g is not None else tf.zeros_like(v)
                      for g, v in zip(tape.gradient(loss, variables), variables)])
    return [np.stack([g[k].numpy() for g in grads]) for k in range(len(variables))]


def test_per_example_gradients_of_an_rnn_with_per_example_lengths():
    got = G.per_example_gradients(_loss, [W, U], (SEQS, LENS), fallback_to_while_loop=False)
    for a, e in zip(got, _per_example_tapes(_loss, SEQS, LENS, [W, U])):
        np.testing.assert_allclose(a.numpy(), e, rtol=1e-4, atol=1e-5)


def test_tape_inside_the_pfor_body_autograph_for_loop_in_a_tf_function():
    @tf.function
    def rnn_autograph(xs, length):
        h = tf.zeros([H])
        for t in tf.range(length):
            h = _step(tf.gather(xs, t), h)
        return h

    def f(i):
        xs, length = tf.gather(SEQS, i), tf.gather(LENS, i)
        with tf.GradientTape() as tape:
            tape.watch(xs)
            h = rnn_autograph(xs, length)
            loss = tf.reduce_sum(tf.sin(h))
        dw, dxs = tape.gradient(loss, [W, xs])
        return dw, dxs, h
    expected = _reference_fn(f, N)
    got = tf.function(lambda: tfx_vec.pfor(f, N, fallback_to_while_loop=False))()
    assert_all_close(tuple(g.numpy() for g in got), tuple(expected), 1e-4, 1e-5, "tape")


def test_jacobian_of_each_examples_rnn_state():
    def f(i):
        xs, length = tf.gather(SEQS, i), tf.gather(LENS, i)
        return G.jacobian(lambda x: _rnn(x, length), xs, fallback_to_while_loop=False)
    got = tfx_vec.pfor(f, N, fallback_to_while_loop=False).numpy()
    for i in range(N):
        xs = SEQS[i]
        with tf.GradientTape() as tape:
            tape.watch(xs)
            h = _rnn(xs, LENS[i])
        expected = tape.jacobian(h, xs, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        np.testing.assert_allclose(got[i], expected.numpy(), rtol=1e-4, atol=1e-5)


@settings(max_examples=3)
@given(n=st.integers(1, 5), t=st.integers(1, 5), d=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_random_shapes_and_lengths_per_example_gradients(n, t, d, seed):
    rng = np.random.default_rng(seed)
    seqs = tf.constant(random_array(rng, [n, t, d], np.float32, -1, 1))
    lens = tf.constant(rng.integers(0, t + 1, size=[n]).astype(np.int32))
    v = tf.Variable(random_array(rng, [d, 2], np.float32, -1, 1))

    def loss_fn(example):
        xs, length = example
        _, h = tf.while_loop(
            lambda k, h: k < length,
            lambda k, h: (k + 1, tf.tanh(tf.linalg.matvec(v, tf.gather(xs, k), transpose_a=True)
                                         + 0.5 * h)),
            (tf.constant(0), tf.ones([2])))
        return tf.reduce_sum(h * h)
    got, = G.per_example_gradients(loss_fn, [v], (seqs, lens), fallback_to_while_loop=False)
    expected, = _per_example_tapes(loss_fn, seqs, lens, [v])
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-5)

# }}}


@pytest.mark.parametrize("lens, use, match", [
    # stacking lists of different lengths
    (LENS, lambda ta: ta.stack(),
     r"TensorListStack \(created at .*test_lists_ragged.py:\d+\).*ragged"),
    # reading past an example's own length (the examples of length 1 and 2 have no element 2)
    (LENS_POS, lambda ta: ta.read(2), r"TensorListGetItem.*out of range"),
    # a list op without per-row-count support
    (LENS_POS, lambda ta: ta.concat(), r"TensorListConcatV2.*different numbers of elements"),
], ids=["ragged_stack", "read_past_own_length", "concat_without_row_counts"])
def test_list_misuse_is_a_clear_error(lens, use, match):
    with pytest.raises(tfx_vec.VectorizationError, match=match):
        tfx_vec.pfor(lambda i: use(_filled_per_example(lens, i)), N,
                     fallback_to_while_loop=False)


@settings(max_examples=4)
@given(n=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_random_push_pop_push_programs_per_example(n, seed):
    """Each example pushes, pops and pushes again its own numbers of times, then every
    element and the length are read back: per-row ends, realignment and lockstep pops."""
    rng = np.random.default_rng(seed)
    vals = tf.constant(random_array(rng, [n, 8, 2], np.float32))
    counts = tf.constant(rng.integers(0, 4, size=[n, 3]).astype(np.int32))

    def f(i):
        v, (a, b, c) = tf.gather(vals, i), tf.unstack(tf.gather(counts, i))
        acc = list_ops.empty_tensor_list(tf.constant([2]), tf.float32)
        push = lambda k, l: (k + 1, list_ops.tensor_list_push_back(l, tf.gather(v, k)))  # noqa: E731
        _, acc = tf.while_loop(lambda k, l: k < a, push, (0, acc))

        def pop(k, l, s):
            l, e = list_ops.tensor_list_pop_back(l, tf.float32)
            return k + 1, l, s * 0.5 + e
        _, acc, s = tf.while_loop(lambda k, l, s: k < tf.minimum(b, a), pop,
                                  (0, acc, tf.zeros([2])))
        _, acc = tf.while_loop(lambda k, l: k < c + 4, push, (4, acc))   # values 4, 5, ...
        size = list_ops.tensor_list_length(acc)
        ta = tf.TensorArray(tf.float32, size=8, element_shape=[2])
        _, ta = tf.while_loop(lambda k, ta: k < size, lambda k, ta: (
            k + 1, ta.write(k, list_ops.tensor_list_get_item(acc, k, tf.float32))), (0, ta))
        return size, s, ta.stack()
    check_pfor(f, n, modes=("eager",))


@settings(max_examples=3)
@given(n=st.integers(1, 5), seed=st.integers(0, 2**16), stride=st.integers(1, 2),
       dynamic=st.booleans())
def test_random_tensor_array_writes_with_gaps_and_rewrites(n, seed, stride, dynamic):
    """Per-example numbers of writes at per-step positions (gaps when ``stride`` is 2, which
    a dynamic array fills with zeros), then read-modify-writes in a loop of another length."""
    rng = np.random.default_rng(seed)
    vals = tf.constant(random_array(rng, [n, 8, 2], np.float32))
    counts = tf.constant(rng.integers(0, 4, size=[n, 2]).astype(np.int32))

    def f(i):
        v, (a, b) = tf.gather(vals, i), tf.unstack(tf.gather(counts, i))
        ta = tf.TensorArray(tf.float32, size=0 if dynamic else 8, dynamic_size=dynamic,
                            element_shape=[2], clear_after_read=False)
        _, ta = tf.while_loop(lambda t, ta: t < a, lambda t, ta: (
            t + 1, ta.write(stride * t, tf.gather(v, t))), (0, ta))
        _, ta = tf.while_loop(lambda t, ta: t < tf.minimum(b, ta.size()), lambda t, ta: (
            t + 1, ta.write(t, tf.gather(v, t + 4) + ta.read(t))), (0, ta))
        size = ta.size()
        out = tf.TensorArray(tf.float32, size=8, element_shape=[2])
        _, out = tf.while_loop(lambda k, o: k < size, lambda k, o: (k + 1, o.write(k, ta.read(k))),
                               (0, out))
        return size, out.stack()
    check_pfor(f, n, modes=("eager",))
