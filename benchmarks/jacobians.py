"""Jacobians (paper Figure 3): jacobian rows per second vs output size.

Jacobian of the model output with respect to its input for: an LSTM statically unrolled 10
steps, the same LSTM as a dynamic ``tf.while_loop`` RNN, and a small VGG-style convnet on a
48x48x3 image; output sizes 8 to 128.  Implementations, each inside one ``tf.function``:

- ``tfx_vec``: ``tfx_vec.jacobian(f, x)`` (pfor over the output rows);
- ``while_loop``: ``tape.jacobian(..., experimental_use_pfor=False)``;
- ``tf_pfor``: ``tape.jacobian(..., experimental_use_pfor=True)`` (TensorFlow's own pfor);
- ``tfx_vec (jit_compile)``: ``tfx_vec.jacobian(f, x)`` inside ``tf.function(jit_compile=True)``.

Run: ``.venv/bin/python -m benchmarks [--quick] jacobians``.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from benchmarks import _pfor_models as M
from benchmarks.harness import Report
from tfx_vec.pfor.gradients import jacobian


def _models(out_size: int, quick: bool):
    rng = np.random.default_rng(out_size)
    d_in, d_h = (16, 32) if quick else (64, 128)
    lstm = M.lstm_params(d_in, d_h, d_out=out_size, seed=out_size)
    seq = tf.constant(rng.normal(size=[10, d_in]).astype(np.float32))

    def lstm_static(xs):
        return tf.linalg.matvec(lstm[2], M.lstm_unrolled(lstm, xs, 10), transpose_a=True)

    def lstm_dynamic(xs, bounded=False):
        h = M.lstm_while(lstm, xs, tf.shape(xs)[0], bounded)
        return tf.linalg.matvec(lstm[2], h, transpose_a=True)

    channels = (4, 8, 8) if quick else (8, 16, 32)
    conv = M.vgg_params(out_size, channels=channels, seed=out_size)
    image = tf.constant(rng.normal(size=[48, 48, 3]).astype(np.float32))
    yield "lstm unrolled10", lstm_static, lstm_static, seq
    yield "lstm while_loop", lstm_dynamic, lambda xs: lstm_dynamic(xs, bounded=True), seq
    vgg = lambda im: M.vgg(conv, im)  # noqa: E731
    yield "vgg 48x48", vgg, vgg, image


def _tape_jacobian(f, x, use_pfor):
    with tf.GradientTape(persistent=not use_pfor) as tape:
        tape.watch(x)
        y = f(x)
    return tape.jacobian(y, x, experimental_use_pfor=use_pfor)


def run(quick: bool) -> Report:
    report = Report("jacobians", unit="rows/s", ours="tfx_vec", higher_is_better=True,
                    notes="CPU; jacobian of the output w.r.t. the input; rows = output size; "
                          "each implementation is one tf.function, timed after warm-up.")
    sizes = [8, 32] if quick else [8, 32, 128]
    repeats, warmup = (3, 1) if quick else (5, 2)
    for size in sizes:
        for model, f, f_xla, x in _models(size, quick):
            case = f"{model} out={size}"
            impls = {
                "tfx_vec": M.compiled(lambda x, f=f: jacobian(f, x)),
                "while_loop": M.compiled(lambda x, f=f: _tape_jacobian(f, x, False)),
                "tf_pfor": M.compiled(lambda x, f=f: _tape_jacobian(f, x, True)),
                # (XLA needs the while loop bounded to compile its gradient)
                "tfx_vec (jit_compile)": M.compiled(lambda x, f=f_xla: jacobian(f, x),
                                                    jit_compile=True),
            }
            M.measure_interleaved(report, case, {k: (lambda fn=fn, x=x: fn(x))
                                                 for k, fn in impls.items()},
                                  items=size, rounds=repeats, warmup=warmup)
    return report
