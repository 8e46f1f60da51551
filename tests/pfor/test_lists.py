"""TensorList converters (``converters/lists.py``) on lists of equal lengths per iteration."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.ops import gen_list_ops, list_ops

import tfx_vec
from tests.pfor.oracle import check_pfor


def test_concat_of_per_iteration_lists():
    outside = list_ops.tensor_list_reserve([2], 2, tf.int32)

    def loop_fn(i):
        for h in (list_ops.tensor_list_reserve([2], 2, tf.int32), outside):
            h = list_ops.tensor_list_scatter([[i, 2]], [0], input_handle=h)
            h = list_ops.tensor_list_scatter([[1, i * 3]], [1], input_handle=h)
        values, lengths = gen_list_ops.tensor_list_concat_v2(
            h, element_dtype=tf.int32, element_shape=[2], leading_dims=[])
        return values, lengths
    check_pfor(loop_fn, 3, modes=("eager", "function", "dynamic"))


@pytest.mark.parametrize("duplicates", [False, True])
def test_scatter_at_per_iteration_positions(duplicates):
    def loop_fn(i):
        h = list_ops.tensor_list_reserve([2], 10, tf.int32)
        positions = [i, i, i + 2] if duplicates else [i, i + 5, 9]
        h = list_ops.tensor_list_scatter([[1, i], [i + 1, 2], [7, i]], positions,
                                         input_handle=h)
        return list_ops.tensor_list_stack(h, tf.int32)
    check_pfor(loop_fn, 4)


def test_add_n_of_an_invariant_and_a_per_iteration_list():
    outside = list_ops.tensor_list_set_item(list_ops.tensor_list_reserve([], 2, tf.int32), 1, 5)

    def loop_fn(i):
        mine = list_ops.tensor_list_set_item(list_ops.tensor_list_reserve([], 2, tf.int32), 1, i)
        return list_ops.tensor_list_stack(tf.math.add_n([outside, mine]), tf.int32)
    check_pfor(loop_fn, 3, modes=("eager", "function"))


def test_an_op_on_a_stacked_list_without_a_converter_cannot_fall_back():
    """A stacked list holds every iteration's elements in one list: a per-iteration loop
    cannot split it, so even with fallbacks on this is an error naming the op."""
    def loop_fn(i):
        h = list_ops.tensor_list_set_item(list_ops.tensor_list_reserve([], 2, tf.int32), 0, i)
        both = tf.raw_ops.TensorListConcatLists(input_a=h, input_b=h, element_dtype=tf.int32)
        return list_ops.tensor_list_stack(both, tf.int32)
    for fallback in (True, False):
        with pytest.raises(tfx_vec.VectorizationError,
                           match="TensorListConcatLists.*per-iteration loop cannot split"):
            tfx_vec.pfor(loop_fn, 2, fallback_to_while_loop=fallback)


@pytest.mark.parametrize("per_iteration_list", [False, True])
def test_items_set_in_a_while_loop_of_per_iteration_trip_count_survive_grappler(
        grappler_on, per_iteration_list):
    """The active rows shrink as iterations finish: Grappler's constant folding must not
    pin their number (or the list's row map) to the loop's entry value."""
    def loop_fn(i):
        last = i * 3 if per_iteration_list else 24
        h = list_ops.tensor_list_from_tensor([20, 21, 22, 23, last], [])
        _, h = tf.while_loop(lambda j, _: j < i,
                             lambda j, h: (j + 1, list_ops.tensor_list_set_item(h, j, i + j)),
                             (0, h))
        return list_ops.tensor_list_stack(h, tf.int32)
    check_pfor(loop_fn, 5, modes=("function", "dynamic"))


def test_list_of_unknown_element_shape_from_an_invariant_loop_into_a_per_iteration_loop():
    """The invariant loop is copied out of the body; its list output keeps its element dtype."""
    def loop_fn(i):
        h = list_ops.tensor_list_reserve(None, 4, tf.int32)
        _, h = tf.while_loop(lambda j, _: j < 4,
                             lambda j, h: (j + 1, list_ops.tensor_list_set_item(h, j, j + 7)),
                             (0, h))
        _, h = tf.while_loop(lambda j, _: j < i,
                             lambda j, h: (j + 1, list_ops.tensor_list_set_item(h, j, i * j)),
                             (0, h))
        return list_ops.tensor_list_stack(h, tf.int32)
    check_pfor(loop_fn, 4, modes=("eager", "function"))
