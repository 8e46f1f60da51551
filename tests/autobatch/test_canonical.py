"""The front end's canonical form, through AutoGraph's machinery (converters, A-normal form,
activity analysis), and the syntax it keeps accepting."""
import ast
import re

import gast
import numpy as np
import pytest
import tensorflow as tf

from tests.autobatch.programs import fib, nested_loops, on_every_runtime, reference
from tfx_vec import autobatch as ab
from tfx_vec.autobatch.canonical import canonicalize

THIS = re.escape(__file__)


def _text(fn):
    return ast.unparse(gast.gast_to_ast(canonicalize(fn.__wrapped__).fdef))


def test_autographs_converters_lower_break_continue_and_return():
    text = _text(nested_loops)
    assert "break_ = True" in text and "continue_ = True" in text
    assert "break" not in text.replace("break_", "") and "continue\n" not in text
    assert text.count("return") == 1 and text.rstrip().endswith("return retval_")


def test_a_normal_form_names_batched_calls_and_their_arguments():
    fdef = canonicalize(fib.__wrapped__).fdef
    calls = [n for n in gast.walk(fdef) if isinstance(n, gast.Call)
             and isinstance(n.func, gast.Name) and n.func.id == "fib"]
    assert len(calls) == 2 and all(isinstance(a, gast.Name) for c in calls for a in c.args)


@ab.function
def loop_on_a_call(n):
    k = tf.zeros_like(n)
    while fib(k) < n:  # a batched call in a loop test: evaluated at every test
        k += 1
    return k


def test_a_batched_call_in_a_while_test():
    n = np.array([1, 5, 9, 30], np.int32)
    want = reference(loop_on_a_call, n)
    for name, got in on_every_runtime(loop_on_a_call, n).items():
        np.testing.assert_array_equal(got, want, err_msg=name)


@ab.function
def shrinking_range(n):
    total = tf.zeros_like(n)
    for i in range(n):  # range() reads n once, as in Python
        n = n - 1
        total += i
    return total


def test_a_range_reads_its_bounds_once():
    n = np.array([4, 0, 7], np.int32)
    np.testing.assert_array_equal(shrinking_range(n), [6, 0, 21])
    np.testing.assert_array_equal(reference(shrinking_range, n), [6, 0, 21])


SCALE = 0.0


@ab.function
def python_logic(x):
    tmp_1 = SCALE or 2.0  # Python values keep Python's `or` (and a name like ANF's own)
    ys = [x * k for k in range(3)]  # comprehensions and lambdas stay whole
    f = lambda v: v + 1  # noqa: E731
    return f(tmp_1 * ys[2])


def test_python_values_keep_python_semantics():
    x = np.array([1.0, 2.0], np.float32)
    for name, got in on_every_runtime(python_logic, x).items():
        np.testing.assert_array_equal(got, [5.0, 9.0], err_msg=name)


def _bad_ifexp(x):
    y = fib(x) if x.shape[0] else x
    return y


def _bad_comprehension(x):
    return tf.stack([fib(x) for _ in range(2)])


@pytest.mark.parametrize("fn,what", [(_bad_ifexp, "inside a conditional expression"),
                                     (_bad_comprehension, "inside a comprehension")])
def test_batched_calls_where_they_cannot_be_lifted(fn, what):
    with pytest.raises(ab.UnsupportedSyntaxError, match=rf"{THIS}:\d+: .*{what}"):
        ab.function(fn)([1, 2])


def _specialized(flag, limit):
    @ab.function
    def f(n):
        if flag:  # a closure's Python bool: decided when f is compiled
            n = n * 2
        else:
            n = n + 1
        while not flag or n < limit:  # `not flag` true: a loop that only its break leaves
            n = n + 3
            if n > limit:
                break
        if flag and limit > 5:
            return n - 1  # what follows is dropped where this always returns
        return n + 100
    return f


@pytest.mark.parametrize("flag,limit", [(True, 9), (False, 9), (True, 2), (False, 2)])
def test_tests_on_python_values_are_decided_when_compiled(flag, limit):
    f = _specialized(flag, limit)
    text = _text(f)
    assert "flag" not in text and "limit > 5" not in text
    assert ("n * 2" in text) == flag and bool(re.search(r"n \+ 1\b", text)) != flag
    assert ("n + 100" in text) == (not (flag and limit > 5))
    n = np.array([-4, 0, 3, 11], np.int32)
    want = reference(f, n)
    for name, got in on_every_runtime(f, n).items():
        np.testing.assert_array_equal(got, want, err_msg=name)


@ab.function
def branches_on_values(n):
    flag = n > 2  # a local: a batched branch, even with a global of the same name
    if flag or SHARED_LIMIT > 100:
        n = n - 1
    if LIMIT_TENSOR > 0:  # a tensor: stays a test of the program
        n = n * 3
    return n


SHARED_LIMIT = 10
LIMIT_TENSOR = tf.constant(1)
flag = True


def test_tests_on_locals_and_tensors_stay_batched():
    text = _text(branches_on_values)
    assert "SHARED_LIMIT" not in text  # the static operand that cannot decide is dropped
    assert "LIMIT_TENSOR" in text and "flag" in text
    n = np.array([0, 3, 5], np.int32)
    want = reference(branches_on_values, n)
    np.testing.assert_array_equal(want, [0, 6, 12])
    for name, got in on_every_runtime(branches_on_values, n).items():
        np.testing.assert_array_equal(got, want, err_msg=name)
