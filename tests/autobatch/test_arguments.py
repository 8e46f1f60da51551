"""Calling a batched function: arguments bound like Python, batched alike on every runtime,
a batch size unknown at trace time, and a clear error for each plausible mistake."""
import re

import numpy as np
import pytest
import tensorflow as tf

from tests.autobatch.programs import (EVERY_RUNTIME, CASES, collatz, fib, on_every_runtime,
                                      reference)
from tfx_vec import autobatch as ab


@ab.function
def weighted(a, b, c, d, e, f, g):
    return a + b + c + d + e + f + g


def test_size_one_and_scalar_arguments_broadcast_alike_on_every_runtime():
    a = np.array([12, 13, 14], np.int32)
    ones = [np.array([k], np.int32) for k in (2, 3, 4)]
    for name, got in on_every_runtime(weighted, a, *ones, 5, 6, 7).items():
        np.testing.assert_array_equal(got, [39, 40, 41], err_msg=name)


@ab.function
def scaled(x, w):
    return x * w


def test_a_shared_vector_argument_with_leading_dimension_one():
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    w = np.array([[10.0, 100.0]], np.float32)
    for name, got in on_every_runtime(scaled, x, w).items():
        np.testing.assert_array_equal(got, x * w, err_msg=name)


def test_a_list_is_a_batch():
    want = reference(fib, np.array([3, 4, 5], np.int32))
    for name, got in on_every_runtime(fib, [3, 4, 5]).items():
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_keyword_arguments_bind_to_parameters():
    @ab.function
    def minus(a, b):
        return a - b
    np.testing.assert_array_equal(minus(b=[1, 2], a=[10, 20]), [9, 18])
    np.testing.assert_array_equal(minus([10, 20], b=[1, 2], runtime="local_static"), [9, 18])


@pytest.mark.parametrize("call,message", [
    (lambda: fib(5), r"fib\(5\): no argument has a batch dimension.*fib\(\[5\]\)"),
    (lambda: fib(tf.constant(5)), r"no argument has a batch dimension"),
    (lambda: fib([3, 4], [1, 2]), r"fib\(n\) takes 1 argument\(s\), got 2"),
    (lambda: weighted([1, 2]), r"weighted\(a, b, c, d, e, f, g\) is missing argument\(s\) "
                               r"\['b', 'c', 'd', 'e', 'f', 'g'\]"),
    (lambda: fib([3], m=[1]), r"unexpected keyword argument 'm'; its parameters are \['n'\]"),
    (lambda: fib([3], n=[4]), r"got multiple values for argument 'n'"),
    (lambda: scaled([1.0, 2.0], [1.0, 2.0, 3.0]), r"leading \(batch\) dimensions disagree: "
                                                   r"\[2, 3\]"),
    (lambda: fib([[1, 2], [3]]), r"argument 0 of fib is a list that is not one array"),
], ids=["scalar", "rank0", "extra", "missing", "keyword", "twice", "disagree", "ragged"])
def test_plausible_mistakes_are_clear_errors(call, message):
    with pytest.raises(ab.AutobatchError, match=message):
        call()


def test_a_parameter_named_like_an_option_is_passed_positionally():
    @ab.function
    def f(runtime):
        return runtime + 1
    np.testing.assert_array_equal(f([1, 2]), [2, 3])
    with pytest.raises(ab.AutobatchError, match="both a parameter and an option"):
        f(runtime=[1, 2])


def test_a_function_without_source_says_it_needs_a_file():
    namespace = {"ab": ab}
    exec(compile("@ab.function\ndef twice(x):\n    return 2 * x\n", "<stdin>", "exec"),
         namespace)
    with pytest.raises(ab.UnsupportedSyntaxError,
                       match=r"cannot be read.*interactive interpreter.*\.py file"):
        namespace["twice"]([1, 2])


# {{{ a batch size unknown at trace time

UNKNOWN = [c for c in CASES if c[0] in ("fib", "collatz", "nested_loops", "oscillate",
                                         "affine_sum")]


def _unknown_batch(fn, args, jit):
    flat = tf.nest.flatten(args)
    specs = [tf.TensorSpec([None] + list(np.shape(a)[1:]), tf.convert_to_tensor(a).dtype)
             for a in flat]

    @tf.function(input_signature=specs, jit_compile=jit)
    def run(*xs):
        out = fn(*tf.nest.pack_sequence_as(args, list(xs)))
        assert all(t.shape[0] is None for t in tf.nest.flatten(out))  # unknown when traced
        return out
    return run(*flat)


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
@pytest.mark.parametrize("name,fn,make", UNKNOWN, ids=[c[0] for c in UNKNOWN])
def test_a_batch_size_unknown_at_trace_time(name, fn, make, jit):
    args = make(np.random.default_rng(len(name)), 6)
    for g, w in zip(tf.nest.flatten(_unknown_batch(fn, args, jit)),
                    tf.nest.flatten(reference(fn, *args))):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_unknown_batch_with_broadcast_and_literal_arguments():
    a = np.array([12, 13, 14], np.int32)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
    def run(x):
        return weighted(x, tf.constant([2]), [3], np.array([4], np.int32), 5, 6, 7)
    np.testing.assert_array_equal(run(a), [39, 40, 41])


def test_unknown_batch_in_a_tf1_graph():
    x = np.array([3, 7, 4, 5], np.int32)
    with tf.Graph().as_default():
        n = tf.compat.v1.placeholder(tf.int32, [None])
        steps = collatz(n)
        assert steps.shape.as_list() == [None]
        with tf.compat.v1.Session() as sess:
            np.testing.assert_array_equal(sess.run(steps, {n: x}), [7, 16, 2, 5])


def test_a_value_with_another_leading_dimension_under_an_unknown_batch_is_an_error():
    @ab.function
    def bad(n):
        return n + tf.constant([1, 2, 3])
    with pytest.raises(ab.TypeInferenceError, match=re.escape("batch size is unknown")):
        tf.function(bad, input_signature=[tf.TensorSpec([None], tf.int32)]).get_concrete_function()

# }}}
