"""Typing, alike on every runtime: Python literals take the dtype (and shape) of the values they
meet; variables of different shapes are an error, or their broadcast with shapes="broadcast"."""
import numpy as np
import pytest
import tensorflow as tf

from tests.autobatch.programs import EVERY_RUNTIME, on_every_runtime, reference
from tfx_vec import autobatch as ab


def _same_everywhere(fn, *args, dtype=None, **options):
    want = reference(fn, *args)
    for name, got in on_every_runtime(fn, *args, **options).items():
        np.testing.assert_allclose(got, want, rtol=0, atol=0, err_msg=name)
        assert dtype is None or got.dtype == dtype, (name, got.dtype)
    return want


@ab.function
def count_to(n):
    count = 0
    while count < n:
        count = count + 1
    return count


def test_a_literal_counter_takes_the_dtype_of_what_it_meets():
    n = np.array([3, 0, 5, 2], np.int64)
    _same_everywhere(count_to, n, dtype=np.int64)


@ab.function
def reassigned(n):
    y = n * 2
    if n > 2:
        y = 7
    return y


def test_a_literal_assigned_to_a_variable_takes_its_dtype():
    _same_everywhere(reassigned, np.array([1, 4, 3, 0], np.int64), dtype=np.int64)


@ab.function
def accumulate(x, k):
    acc = 0.1
    i = 0
    while i < k:
        acc = acc + x
        i += 1
    return acc


def test_a_float_literal_is_exact_in_float64():
    x = np.array([0.3, -1.7, 2.25], np.float64)
    _same_everywhere(accumulate, x, np.array([2, 0, 1], np.int32), dtype=np.float64)


@ab.function
def vector_sum(v, k):
    acc = 0.0
    for _ in range(k):
        acc = acc + v
    return acc


def test_a_scalar_literal_takes_the_shape_of_the_vector_it_becomes():
    v = np.random.default_rng(3).normal(size=(4, 3)).astype(np.float32)
    k = np.array([2, 0, 3, 1], np.int32)
    for name, got in on_every_runtime(vector_sum, v, k).items():
        np.testing.assert_allclose(got, v * k[:, None], rtol=1e-6, err_msg=name)


@ab.function
def only_literals(n):
    if n > 0:
        return 1
    return 0


def test_a_variable_of_literals_alone_is_int32():
    _same_everywhere(only_literals, np.array([2, -1, 0], np.int64), dtype=np.int32)


@ab.function
def float_into_int(n):
    y = n + 1
    if n > 3:
        y = 0.5
    return y


@pytest.mark.parametrize("runtime", list(EVERY_RUNTIME))
def test_a_float_literal_into_an_int_variable_is_an_error(runtime):
    with pytest.raises(ab.TypeInferenceError, match="variable 'y' of float_into_int is "
                                                    r"int64\[3\] in one place.*different dtype"):
        float_into_int(np.array([1, 5, 2], np.int64), **EVERY_RUNTIME[runtime])


@ab.function
def grows(x, n):
    v = tf.stack([x, x], -1)
    if n > 1:
        v = tf.stack([x, x, x], -1)[:, :1]
    return v


@pytest.mark.parametrize("runtime", list(EVERY_RUNTIME))
def test_variables_of_different_shapes_are_one_clear_error_on_every_runtime(runtime):
    with pytest.raises(ab.TypeInferenceError,
                       match=r"variable 'v' of grows is float32\[3, 2\] in one place and "
                             r"float32\[3, 1\] here \(different shape\).*shapes=\"broadcast\""):
        grows(np.ones(3, np.float32), np.array([0, 2, 1]), **EVERY_RUNTIME[runtime])


def test_shapes_broadcast_types_a_variable_as_the_broadcast_of_its_values():
    x = np.array([1.0, 2.0, 3.0], np.float32)
    n = np.array([0, 2, 1], np.int32)
    want = np.stack([x, x], -1)
    want[1] = x[1]  # the [1]-shaped value broadcast to the variable's [2]
    for name, got in on_every_runtime(grows, x, n, shapes="broadcast").items():
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_unknown_shapes_rule_is_an_error():
    with pytest.raises(ab.AutobatchError, match="unknown shapes rule"):
        ab.function(grows, shapes="loose")
