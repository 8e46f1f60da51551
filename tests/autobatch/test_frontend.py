"""Front end: what it accepts (checked on values) and what it rejects (file:line errors)."""
import inspect
import re

import numpy as np
import pytest
import tensorflow as tf

from tests.autobatch.programs import fib, reference
from tfx_vec import autobatch as ab

THIS = re.escape(__file__)


def _line_of(fn, needle):
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, l in enumerate(lines) if needle in l)


def _bad_try(x):
    try:
        y = x + 1
    except ValueError:
        y = x
    return y


def _bad_with(x):
    with tf.name_scope("s"):
        y = x + 1
    return y


def _bad_yield(x):
    yield x


def _bad_attr_assign(x):
    x.foo = 1
    return x


def _bad_for(x):
    for v in [1, 2]:
        x = x + v
    return x


def _bad_nested_def(x):
    def g(y):
        return y
    return g(x)


def _bad_value_use(x):
    f = fib
    return f(x)


def _bad_lambda_call(x):
    g = lambda y: fib(y)  # noqa: E731
    return g(x)


def _bad_no_return(x):
    if x > 0:
        return x


def _bad_defaults(x, y=1):
    return x + y


BAD = [
    (_bad_try, "try:", "try/except"),
    (_bad_with, "with tf", "with"),
    (_bad_yield, "yield x", "yield"),
    (_bad_attr_assign, "x.foo", "attribute or subscript"),
    (_bad_for, "for v in", "range"),
    (_bad_nested_def, "def g", "nested def"),
    (_bad_value_use, "f = fib", "used as a value"),
    (_bad_lambda_call, "lambda y", "inside a lambda"),
    (_bad_no_return, "def _bad_no_return", "without a return"),
    (_bad_defaults, "def _bad_defaults", "positional parameters"),
]


@pytest.mark.parametrize("fn,needle,what", BAD, ids=[b[0].__name__ for b in BAD])
def test_unsupported_syntax_names_file_and_line(fn, needle, what):
    batched = ab.function(fn)
    with pytest.raises(ab.UnsupportedSyntaxError,
                       match=rf"{THIS}:{_line_of(fn, needle)}: .*{re.escape(what)}"):
        batched(tf.constant([1, 2]), runtime="local_static")


def test_failing_primitive_names_its_line():
    @ab.function
    def bad(x):
        y = x + 1
        z = tf.reshape(y, [3, 5])
        return z
    with pytest.raises(ab.PrimitiveError, match=rf"{THIS}:\d+: `z = tf.reshape"):
        bad(tf.constant([1, 2]))


def test_variable_changing_type_is_a_clear_error():
    @ab.function
    def bad(x):
        if x > 0:
            y = tf.cast(x, tf.float32)
        else:
            y = x
        return y
    with pytest.raises(ab.TypeInferenceError, match="variable 'y' of bad"):
        bad(tf.constant([1, -2]))


def test_boolean_operators_chained_comparisons_and_keywords():
    @ab.function
    def helper(a, b):
        return a - b

    @ab.function
    def logic(x, y):
        r = tf.zeros_like(x)
        if 0 < x < 5 and not y > 2 or x == 7:
            r = helper(b=y, a=x)
        elif x > 8:
            r = -helper(x, y)
        return r

    x = tf.constant([1, 7, 9, 3, 6, 2])
    y = tf.constant([1, 5, 2, 4, 1, 2])
    np.testing.assert_array_equal(logic(x, y, runtime="local_static"), reference(logic, x, y))
    np.testing.assert_array_equal(logic(x, y), reference(logic, x, y))


def test_truthiness_of_non_boolean_predicates():
    @ab.function
    def countdown(n, x):
        k = tf.zeros_like(n)
        while n:
            n = n - 1
            k += 1
        if x and not n:
            k = k * 10
        return k

    n = tf.constant([3, 0, 5, 1])
    x = tf.constant([1.5, 2.0, 0.0, -1.0])
    for runtime in ("local_static", "program_counter"):
        np.testing.assert_array_equal(countdown(n, x, runtime=runtime), reference(countdown, n, x))
