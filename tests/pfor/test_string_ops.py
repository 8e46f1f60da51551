"""Printing, string formatting and CSV parsing inside a loop body (TensorFlow's semantics:
printing shows the stacked values once)."""
import numpy as np
import tensorflow as tf

import tfx_vec
from tests.pfor.oracle import check_pfor


def test_string_format_formats_the_stacked_value_once():
    x = tf.constant([[1, 2], [3, 4], [5, 6]])
    out = tfx_vec.pfor(lambda i: tf.strings.format("v={}", tf.gather(x, i)), 3,
                       fallback_to_while_loop=False)
    assert [s.decode() for s in out.numpy()] == ["v=[[1 2]\n [3 4]\n [5 6]]"] * 3


def test_v1_print_passes_its_input_through():
    x = tf.constant(np.arange(6, dtype=np.float32).reshape(3, 2))
    check_pfor(lambda i: tf.compat.v1.Print(tf.gather(x, i), [tf.gather(x, i), "row"]) * 2.0,
               3, modes=("eager", "function"))


def test_decode_csv_of_stacked_records():
    lines = tf.constant([["1:2:3", "4::6"], ["::", "7:8:9"], ["5:5:5", "0:0:0"]])
    check_pfor(lambda i: tf.io.decode_csv(tf.gather(lines, i), [[10], [20], [30]],
                                          field_delim=":"), 3)
