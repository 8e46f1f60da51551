"""TC kernels on the CPU backend vs the equivalent TF ops (eager, tf.function) and NumPy.

The paper's kernels at its sizes where they fit this machine (§7, appendix A.4): tmm
(M,K,N) = (128,32,256) and (128,1024,1024), tbmm (B,N,M,K) = (500,26,72,26), grouped convolution,
2LUT, MLP3 and fcrelu.  Each TC runs through the public API (``mod.entry(*tf_tensors)``, tf.Tensor
in and out) with its default MappingOptions; we report median milliseconds, the ratio to each peer,
("tc_cpu_1thread": the same kernel without OpenMP, to separate the kernel's quality from thread
start-up on a shared machine), and in the notes the TC kernel's GFLOP/s and its fraction of
the machine's measured matmul peak (a 2048^3 ``tf.matmul`` in ``tf.function``).

Run: ``.venv/bin/python -m benchmarks tc_cpu`` (``--quick``: small sizes, a subset).
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


def _gconv_tf(I_nhwgc, W_hwcgf, B):
    """Grouped conv with TF ops: NHWC input (N,H,W,G*C), filters (KH,KW,C,G*F)."""
    return tf.nn.conv2d(I_nhwgc, W_hwcgf, strides=1, padding="VALID") + tf.reshape(B, [-1])


def _cases(quick: bool, rng):
    """(case name, entry, TC args, TF fn, TF args, NumPy fn, flops)."""
    out = []
    tmm_sizes = [(128, 32, 256)] if quick else [(128, 32, 256), (128, 1024, 1024)]
    for M, K, N in tmm_sizes:
        A, B = _f(rng, M, K), _f(rng, N, K)
        out.append((f"tmm {M},{K},{N}", "tmm", [A, B],
                    lambda a, b: tf.matmul(a, b, transpose_b=True), [A, B],
                    lambda a, b: a @ b.T, 2.0 * M * N * K))
    Bt, Nt, Mt, Kt = (50, 26, 72, 26) if quick else (500, 26, 72, 26)
    X, Y = _f(rng, Bt, Nt, Mt), _f(rng, Bt, Kt, Mt)
    out.append((f"tbmm {Bt},{Nt},{Mt},{Kt}", "tbmm", [X, Y],
                lambda x, y: tf.matmul(x, y, transpose_b=True), [X, Y],
                lambda x, y: np.matmul(x, y.transpose(0, 2, 1)), 2.0 * Bt * Nt * Mt * Kt))
    if not quick:
        n, g, c, f, h, w, k = 32, 32, 4, 4, 56, 56, 3
        I, W1, Bg = _f(rng, n, g, c, h, w), _f(rng, g, f, c, k, k), _f(rng, g, f)
        I_tf = np.ascontiguousarray(I.transpose(0, 3, 4, 1, 2).reshape(n, h, w, g * c))
        W_tf = np.ascontiguousarray(W1.transpose(3, 4, 2, 0, 1).reshape(k, k, c, g * f))
        out.append((f"gconv N{n} G{g} C{c} F{f} {h}x{w}", "group_convolution", [I, W1, Bg],
                    _gconv_tf, [I_tf, W_tf, Bg], None,
                    2.0 * n * g * f * c * k * k * (h - k + 1) * (w - k + 1)))
    b, l1, l2, e, d = (32, 20, 20, 10_000, 32) if quick else (128, 50, 50, 100_000, 64)
    L1, L2 = _f(rng, e, d), _f(rng, e, d)
    I1 = rng.integers(0, e, size=(b, l1)).astype(np.int32)
    I2 = rng.integers(0, e, size=(b, l2)).astype(np.int32)
    out.append((f"2LUT B{b} L{l1} E{e} D{d}", "2LUT", [L1, I1, L2, I2],
                lambda a, i, c, j: (tf.reduce_sum(tf.gather(a, i), 1),
                                    tf.reduce_sum(tf.gather(c, j), 1)), [L1, I1, L2, I2],
                lambda a, i, c, j: (a[i].sum(1), c[j].sum(1)), 1.0 * b * (l1 + l2) * d))
    bm, nm, om, pm, qm = 128, 128, 64, 32, 2
    mlp = [_f(rng, bm, nm), _f(rng, om, nm), _f(rng, om), _f(rng, pm, om), _f(rng, pm),
           _f(rng, qm, pm), _f(rng, qm)]

    def mlp_tf(i, w2, b2, w3, b3, w4, b4):
        o2 = _relu_dense(i, w2, b2)
        o3 = _relu_dense(o2, w3, b3)
        return o2, o3, _relu_dense(o3, w4, b4)

    def mlp_np(i, w2, b2, w3, b3, w4, b4):
        o2 = np.maximum(i @ w2.T + b2, 0)
        o3 = np.maximum(o2 @ w3.T + b3, 0)
        return o2, o3, np.maximum(o3 @ w4.T + b4, 0)

    out.append((f"MLP3 B{bm} {nm}-{om}-{pm}-{qm}", "MLP3", mlp, mlp_tf, mlp, mlp_np,
                2.0 * bm * (nm * om + om * pm + pm * qm)))
    bf, mf, nf = (128, 256, 128) if quick else (128, 2000, 128)
    fc = [_f(rng, bf, mf), _f(rng, nf, mf), _f(rng, nf)]
    out.append((f"fcrelu B{bf} M{mf} N{nf}", "fcrelu", fc, _relu_dense, fc,
                lambda i, w, b: np.maximum(i @ w.T + b, 0), 2.0 * bf * mf * nf))
    return out


def _matmul_peak(quick: bool) -> float:
    n = 512 if quick else 2048
    a = tf.constant(np.ones((n, n), np.float32))
    f = tf.function(lambda x: tf.matmul(x, x))
    t = time_fn(lambda: f(a), repeats=3 if quick else 5, warmup=1)
    return 2.0 * n ** 3 / t.min / 1e9


def run(quick: bool = False) -> Report:
    rng = np.random.default_rng(0)
    mod = tc.define(TCS)
    peak = _matmul_peak(quick)
    rep = Report("tc_cpu", unit="ms", ours="tc_cpu")
    notes = [f"machine matmul peak (tf.matmul {512 if quick else 2048}^3, tf.function): "
             f"{peak:.1f} GFLOP/s", "", "| case | tc_cpu GFLOP/s | fraction of peak |",
             "|---|---|---|"]
    kw = dict(repeats=3 if quick else 7, warmup=1 if quick else 2)
    for name, entry, tc_args, tf_fn, tf_args, np_fn, flops in _cases(quick, rng):
        e = mod[entry]
        tc_in = [tf.constant(x) for x in tc_args]
        # correctness first: the TC result must match the peer before it is timed
        ours = e(*tc_in)
        ref = tf_fn(*[tf.constant(x) for x in tf_args])
        ours, ref = tf.nest.flatten(ours), tf.nest.flatten(ref)
        if entry == "group_convolution":
            ref = [tf.transpose(tf.reshape(ref[0], ours[0].shape.as_list()[:1] +
                                           ref[0].shape.as_list()[1:3] +
                                           ours[0].shape.as_list()[1:3]), [0, 3, 4, 1, 2])]
        for o, r in zip(ours, ref):
            np.testing.assert_allclose(o.numpy(), r.numpy(), rtol=2e-3, atol=2e-3)
        t = rep.measure(name, "tc_cpu", lambda: e(*tc_in), **kw)
        one = e.options.replace(parallel=0)
        rep.measure(name, "tc_cpu_1thread", lambda: e(*tc_in, options=one), **kw)
        tf_in = [tf.constant(x) for x in tf_args]
        rep.measure(name, "tf_eager", lambda: tf_fn(*tf_in), **kw)
        fn = tf.function(tf_fn)
        rep.measure(name, "tf_function", lambda: fn(*tf_in), **kw)
        if np_fn is not None:
            rep.measure(name, "numpy", lambda: np_fn(*tc_args), **kw)
        gflops = flops / t.median / 1e9
        notes.append(f"| {name} | {gflops:.2f} | {gflops / peak:.1%} |")
    rep.notes = "\n".join(notes)
    return rep
