"""TC kernels on the CPU backend vs the equivalent TF ops, interleaved in one process.

The paper's kernels (§7, appendix A.4) at toy sizes (the paper's small cases) and production
sizes side by side: tmm (128,32,256) and (128,1024,1024), tbmm (500,26,72,26), MLP3 at
128 x 128-64-32-2 and at 128 x 512-128-64-32 (ReLU), fcrelu, grouped convolution (small and
N32 G32 C4 F4 56x56) and 2LUT.  Each TC runs through its ``tc.define`` entry on ``tf.Tensor``
inputs (``tc_cpu``: the ``TcKernel`` op, eagerly; ``tc_cpu_tf_function``: the same entry inside
``tf.function``); the peers are TF's own ops eagerly and in ``tf.function`` (MLP3: three dense
layers), timed round-robin in one process (``Report.measure_interleaved``) so the load of a
shared machine hits every implementation alike.  Results are checked against the peer first.
The notes give every case's GFLOP/s (``tc_cpu``) and its fraction of the machine's matmul peak
(a 2048^3 ``tf.matmul`` in ``tf.function``, the best of several runs).

Run: ``.venv/bin/python -m benchmarks tc_cpu`` (``--quick``: fewer rounds, no production gconv).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from benchmarks.harness import Report, time_fn
from tfx_vec import tc_ops as tc
from tfx_vec.tc_ops import library

TCS = "\n".join(library.PAPER[name] for name in
                ("tmm", "tbmm", "group_convolution", "2LUT", "MLP3", "fcrelu"))


def _f(rng, *shape):
    return rng.uniform(-1, 1, size=shape).astype(np.float32)


def _relu_dense(x, w, b):
    return tf.nn.relu(tf.matmul(x, w, transpose_b=True) + b)


def _mlp3_tf(i, w2, b2, w3, b3, w4, b4):
    o2 = _relu_dense(i, w2, b2)
    o3 = _relu_dense(o2, w3, b3)
    return o2, o3, _relu_dense(o3, w4, b4)


def _gconv_tf(i_nhwgc, w_hwcgf, b):
    """Grouped conv with TF ops: NHWC input (N,H,W,G*C), filters (KH,KW,C,G*F)."""
    return tf.nn.conv2d(i_nhwgc, w_hwcgf, strides=1, padding="VALID") + tf.reshape(b, [-1])


def _gconv_case(rng, n, g, c, f, h, w, k):
    I, W1, B = _f(rng, n, g, c, h, w), _f(rng, g, f, c, k, k), _f(rng, g, f)
    i_tf = np.ascontiguousarray(I.transpose(0, 3, 4, 1, 2).reshape(n, h, w, g * c))
    w_tf = np.ascontiguousarray(W1.transpose(3, 4, 2, 0, 1).reshape(k, k, c, g * f))

    def same_layout(ours, ref):     # TF's NHW(G*F) output -> the TC's (N,G,F,H,W)
        ho, wo = h - k + 1, w - k + 1
        return np.transpose(ref.reshape(n, ho, wo, g, f), [0, 3, 4, 1, 2])
    return (f"gconv N{n} G{g} C{c} F{f} {h}x{w}", "group_convolution", [I, W1, B], _gconv_tf,
            [i_tf, w_tf, B], 2.0 * n * g * f * c * k * k * (h - k + 1) * (w - k + 1),
            same_layout)


def _cases(quick: bool, rng):
    """(case name, entry, TC args, TF fn, TF args, flops, TF-result -> TC layout)."""
    out = []
    for M, K, N in [(128, 32, 256), (128, 1024, 1024)]:
        A, B = _f(rng, M, K), _f(rng, N, K)
        out.append((f"tmm {M},{K},{N}", "tmm", [A, B],
                    lambda a, b: tf.matmul(a, b, transpose_b=True), [A, B], 2.0 * M * N * K,
                    None))
    Bt, Nt, Mt, Kt = 500, 26, 72, 26
    X, Y = _f(rng, Bt, Nt, Mt), _f(rng, Bt, Kt, Mt)
    out.append((f"tbmm {Bt},{Nt},{Mt},{Kt}", "tbmm", [X, Y],
                lambda x, y: tf.matmul(x, y, transpose_b=True), [X, Y],
                2.0 * Bt * Nt * Mt * Kt, None))
    for b, n, o, p, q in [(128, 128, 64, 32, 2), (128, 512, 128, 64, 32)]:
        mlp = [_f(rng, b, n), _f(rng, o, n), _f(rng, o), _f(rng, p, o), _f(rng, p),
               _f(rng, q, p), _f(rng, q)]
        out.append((f"MLP3 B{b} {n}-{o}-{p}-{q}", "MLP3", mlp, _mlp3_tf, mlp,
                    2.0 * b * (n * o + o * p + p * q), None))
    fc = [_f(rng, 128, 2000), _f(rng, 128, 2000), _f(rng, 128)]
    out.append(("fcrelu B128 M2000 N128", "fcrelu", fc, _relu_dense, fc,
                2.0 * 128 * 2000 * 128, None))
    out.append(_gconv_case(rng, 8, 8, 4, 4, 14, 14, 3))
    if not quick:
        out.append(_gconv_case(rng, 32, 32, 4, 4, 56, 56, 3))
    b, l1, l2, e, d = 128, 50, 50, 100_000, 64
    L1, L2 = _f(rng, e, d), _f(rng, e, d)
    I1 = rng.integers(0, e, size=(b, l1)).astype(np.int32)
    I2 = rng.integers(0, e, size=(b, l2)).astype(np.int32)
    out.append((f"2LUT B{b} L{l1} E{e} D{d}", "2LUT", [L1, I1, L2, I2],
                lambda a, i, c, j: (tf.reduce_sum(tf.gather(a, i), 1),
                                    tf.reduce_sum(tf.gather(c, j), 1)), [L1, I1, L2, I2],
                1.0 * b * (l1 + l2) * d, None))
    return out


def matmul_peak(quick: bool) -> float:
    """GFLOP/s of a square ``tf.matmul`` in ``tf.function`` (best sample)."""
    n = 512 if quick else 2048
    a = tf.constant(np.ones((n, n), np.float32))
    f = tf.function(lambda x: tf.matmul(x, x))
    t = time_fn(lambda: f(a), repeats=3 if quick else 11, warmup=1)
    return 2.0 * n ** 3 / t.min / 1e9


def run(quick: bool = False) -> Report:
    rng = np.random.default_rng(0)
    mod = tc.define(TCS)
    peak = matmul_peak(quick)
    rep = Report("tc_cpu", unit="ms", ours="tc_cpu")
    rows = []
    rounds = 5 if quick else 25      # a shared 2-core machine: medians need many rounds
    for name, entry, tc_args, tf_fn, tf_args, flops, layout in _cases(quick, rng):
        e = mod[entry]
        tc_in = [tf.constant(x) for x in tc_args]
        tf_in = [tf.constant(x) for x in tf_args]
        # correctness first: the TC result must match the peer before it is timed
        ours, ref = tf.nest.flatten(e(*tc_in)), tf.nest.flatten(tf_fn(*tf_in))
        for o, r in zip(ours, ref):
            r = r.numpy() if layout is None else layout(o, r.numpy())
            np.testing.assert_allclose(o.numpy(), r, rtol=2e-3, atol=2e-3)
        tc_graph = tf.function(lambda *xs, e=e: e(*xs))
        tf_graph = tf.function(tf_fn)
        t = rep.measure_interleaved(name, {
            "tc_cpu": lambda: e(*tc_in), "tc_cpu_tf_function": lambda: tc_graph(*tc_in),
            "tf_eager": lambda: tf_fn(*tf_in), "tf_function": lambda: tf_graph(*tf_in)},
            rounds=rounds, warmup=2)
        gflops = flops / t["tc_cpu"].median / 1e9
        tf_gflops = flops / t["tf_function"].median / 1e9
        rows.append((name, gflops, tf_gflops))
    # the peak again after the cases: other jobs on a shared machine move it; the best counts
    peak = max(peak, matmul_peak(quick))
    notes = [f"machine matmul peak (tf.matmul {512 if quick else 2048}^3, tf.function, best "
             f"sample before and after the cases): {peak:.1f} GFLOP/s", "",
             "| case | tc_cpu GFLOP/s | fraction of peak | tf_function GFLOP/s |",
             "|---|---|---|---|"]
    notes += [f"| {name} | {g:.1f} | {g / peak:.1%} | {tg:.1f} |" for name, g, tg in rows]
    rep.notes = "\n".join(notes)
    return rep
