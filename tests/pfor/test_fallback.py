"""The per-op while-loop fallback: counted and listed, or an error naming op and line."""
import inspect

import numpy as np
import pytest
import tensorflow as tf

import tfx_vec
from tfx_vec.pfor import registry
from tests.pfor.oracle import check_pfor
from tests.support import random_array

R = np.random.default_rng(5)


def arr(*shape):
    return tf.constant(random_array(R, shape, np.float32))


def hist_fn(x):
    def loop_fn(i):
        return tf.histogram_fixed_width(tf.gather(x, i), [-2.0, 2.0], nbins=4)  # no converter
    return loop_fn


HIST_LINE = inspect.getsourcelines(hist_fn)[1] + 2  # the histogram_fixed_width line


def test_fallback_is_correct_counted_and_listed_with_source_line():
    x = arr(5, 7)
    tfx_vec.reset_fallbacks()
    check_pfor(hist_fn(x), 5, modes=("eager", "function", "dynamic", "chunked"),
               fallback_to_while_loop=True)
    report = tfx_vec.fallback_report()
    assert report["HistogramFixedWidth"] >= 4
    sources = report.sources["HistogramFixedWidth"]
    assert any(s.endswith(f"test_fallback.py:{HIST_LINE}") for s in sources), sources
    assert "HistogramFixedWidth" in str(report)
    tfx_vec.reset_fallbacks()
    assert dict(tfx_vec.fallback_report()) == {}


def test_fallback_disabled_raises_naming_op_and_line():
    x = arr(3, 7)
    with pytest.raises(tfx_vec.VectorizationError,
                       match=rf"HistogramFixedWidth \(created at .*test_fallback.py:{HIST_LINE}\)"):
        tfx_vec.pfor(hist_fn(x), 3, fallback_to_while_loop=False)


def test_print_shows_the_stacked_values_once(tmp_path):
    """As in TensorFlow's pfor, tf.print of a loop-variant value prints it stacked, once."""
    x = tf.constant(np.arange(1, 13, dtype=np.float32).reshape(4, 3))
    log = tmp_path / "printed.txt"

    def loop_fn(i):
        row = tf.gather(x, i)
        tf.debugging.assert_all_finite(row, "finite")   # CheckNumerics / Assert
        tf.print(row, output_stream=f"file://{log}")   # StringFormat + PrintV2 (no outputs)
        return row * 2.0
    tfx_vec.reset_fallbacks()
    np.testing.assert_allclose(tfx_vec.pfor(loop_fn, 4, fallback_to_while_loop=False).numpy(),
                               x.numpy() * 2)
    assert dict(tfx_vec.fallback_report()) == {}
    assert log.read_text() == "[[1 2 3]\n [4 5 6]\n [7 8 9]\n [10 11 12]]\n"


def test_fallback_of_a_side_effect_only_op_runs_once_per_iteration(tmp_path):
    """An output-less stateful op with no converter (WriteFile) runs in the per-iteration loop:
    every iteration writes its own file."""
    names = tf.constant([str(tmp_path / f"row{k}.txt") for k in range(3)])

    def loop_fn(i):
        tf.io.write_file(tf.gather(names, i), tf.strings.as_string(i))
        return i * 2
    tfx_vec.reset_fallbacks()
    assert tfx_vec.pfor(loop_fn, 3).numpy().tolist() == [0, 2, 4]
    assert tf.function(lambda: tfx_vec.pfor(loop_fn, 3))().numpy().tolist() == [0, 2, 4]
    assert tfx_vec.fallback_report().get("WriteFile") == 2
    assert [(tmp_path / f"row{k}.txt").read_text() for k in range(3)] == ["0", "1", "2"]


def test_ragged_fallback_result_is_a_clear_error():
    x = tf.constant(np.array([[1, 2, 3], [2, 2, 2]], np.int32))
    with pytest.raises(tfx_vec.VectorizationError, match="ListDiff.*ragged"):
        tfx_vec.pfor(lambda i: tf.compat.v1.setdiff1d(tf.gather(x, i), [2])[0], 2)


def test_equal_shaped_dynamic_fallback_results_are_fine():
    x = tf.constant(np.array([[1, 2, 3], [3, 1, 2]], np.int32))
    check_pfor(lambda i: tf.compat.v1.setdiff1d(tf.gather(x, i), [2])[0], 2,
               modes=("eager", "function"), fallback_to_while_loop=True)


def test_user_registered_converter_is_used():
    calls = []
    previous = registry.lookup("HistogramFixedWidth")

    @tfx_vec.register_converter("HistogramFixedWidth", override=True)
    def _hist(x):
        calls.append(x.stacked_flags)
        values, value_range, nbins = x.stacked_input(0), x.unstacked_input(1), x.unstacked_input(2)
        n = tf.shape(values)[0]
        lo, hi = value_range[0], value_range[1]
        idx = tf.cast(tf.floor((values - lo) / (hi - lo) * tf.cast(nbins, tf.float32)), tf.int32)
        idx = tf.clip_by_value(idx, 0, nbins - 1)
        rows = tf.broadcast_to(tf.range(n)[:, None], tf.shape(idx))
        flat = rows * nbins + idx
        out = tf.math.bincount(tf.reshape(flat, [-1]), minlength=n * nbins, maxlength=n * nbins)
        return tfx_vec.pfor.WrappedTensor(tf.reshape(out, [n, nbins]), True)
    try:
        check_pfor(hist_fn(arr(4, 9)), 4, modes=("eager", "function"))
        assert calls and calls[0] == [True, False, False]
    finally:
        if previous is None:
            registry._CONVERTERS.pop("HistogramFixedWidth")
        else:
            registry.register_converter("HistogramFixedWidth", override=True)(previous)


def test_failing_converter_falls_back_or_raises_chained():
    previous = registry.lookup("Cross")

    @tfx_vec.register_converter("Cross", override=True)
    def _broken(x):
        raise RuntimeError("boom")
    try:
        x = arr(2, 3)
        with pytest.warns(UserWarning, match="boom"):
            check_pfor(lambda i: tf.linalg.cross(tf.gather(x, i), x[0]), 2, modes=("eager",),
                       fallback_to_while_loop=True)
        with pytest.raises(tfx_vec.VectorizationError, match="Cross.*RuntimeError: boom"):
            tfx_vec.pfor(lambda i: tf.linalg.cross(tf.gather(x, i), x[1]), 2,
                         fallback_to_while_loop=False)
    finally:
        registry.register_converter("Cross", override=True)(previous)


def test_converter_returning_wrong_dtype_is_rejected():
    previous = registry.lookup("Cross")

    @tfx_vec.register_converter("Cross", override=True)
    def _wrong(x):
        return tfx_vec.pfor.WrappedTensor(tf.cast(x.stacked_input(0), tf.float64), True)
    try:
        x = arr(2, 3)
        with pytest.raises(tfx_vec.VectorizationError, match="dtype float64, expected float32"):
            tfx_vec.pfor(lambda i: tf.linalg.cross(tf.gather(x, i), x[0]), 2,
                         fallback_to_while_loop=False)
    finally:
        registry.register_converter("Cross", override=True)(previous)


def test_register_converter_rejects_bad_names():
    with pytest.raises(TypeError):
        tfx_vec.register_converter()
    with pytest.raises(TypeError):
        tfx_vec.register_converter("")
