"""LSTM auto-batching (paper Figure 1c): tokens/s vs batch size, no padding.

Each example is a sequence of random length 1 to 100; the single-example model runs an LSTM
``tf.while_loop`` to its OWN length.  pfor vectorizes the loop-variant while loop by tracking
the still-active examples (§3.7), so the batch shrinks as sequences finish.  Implementations,
each inside one ``tf.function``:

- ``tfx_vec``: ``tfx_vec.pfor`` over the examples;
- ``while_loop``: a ``tf.map_fn`` (while_loop) over the examples;
- ``tf.vectorized_map``: TensorFlow's own pfor on the same function.

Run: ``.venv/bin/python -m benchmarks [--quick] lstm_autobatch``.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from benchmarks import _pfor_models as M
from benchmarks.harness import Report
from tfx_vec.pfor import api


def run(quick: bool) -> Report:
    report = Report("lstm_autobatch", unit="tokens/s", ours="tfx_vec", higher_is_better=True,
                    notes="CPU; LSTM inference, each example iterates to its own length "
                          "(uniform 1..100), no padding; tokens = sum of lengths.")
    d_in, d_h = (16, 32) if quick else (64, 128)
    batches = [1, 16, 64] if quick else [1, 8, 32, 128, 512]
    repeats, warmup = (3, 1) if quick else (5, 2)
    params = M.lstm_params(d_in, d_h)
    rng = np.random.default_rng(0)

    def one(xs, length):
        return M.lstm_while(params, xs, length)

    for b in batches:
        lengths = tf.constant(rng.integers(1, 101, size=[b]).astype(np.int32))
        seqs = tf.constant(rng.normal(size=[b, 100, d_in]).astype(np.float32))
        tokens = float(tf.reduce_sum(lengths))
        impls = {
            "tfx_vec": M.compiled(lambda s, n: api.pfor(
                lambda i: one(tf.gather(s, i), tf.gather(n, i)), tf.shape(n)[0])),
            "while_loop": M.compiled(lambda s, n: tf.map_fn(
                lambda a: one(a[0], a[1]), (s, n), fn_output_signature=tf.float32)),
            "tf.vectorized_map": M.compiled(lambda s, n: tf.vectorized_map(
                lambda a: one(a[0], a[1]), (s, n))),
        }
        M.measure_interleaved(report, f"b={b}", {k: (lambda fn=fn: fn(seqs, lengths))
                                                for k, fn in impls.items()},
                              items=tokens, rounds=repeats, warmup=warmup)
    return report
