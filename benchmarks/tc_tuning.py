"""tc_ops autotuning: naive vs default vs autotuned mapping options (paper §6.2, §7).

For the paper's kernels on the cpu backend (and tmm/fcrelu on OpenCL/PoCL for reference): the
median time per call of the kernel under ``MappingOptions.naive()``, the TC's default options and
the options the genetic autotuner found (ours), tuning time and candidates per second (notes);
then the per-call overhead of a TC as a TF op (the ``TcKernel`` op) in eager and inside
``tf.function``, next to a TF op doing the same work (``tf.matmul``).

Run: ``.venv/bin/python -m benchmarks [--quick] tc_tuning``.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from benchmarks.harness import Report
from tfx_vec import tc_ops as tc
from tfx_vec.tc_ops.backends import opencl
from tfx_vec.tc_ops.library import FCRELU, LUT2, MLP3, TBMM, TMM

GCONV = """def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1) -> (O) {
    O(n,g,f,h,w) +=! I(n,g,c,h + kh,w + kw) * W1(g,f,c,kh,kw)
}"""


def _f(rng, *shape):
    return rng.uniform(-1, 1, size=shape).astype(np.float32)


def _cases(quick: bool, rng):
    s = 1 if quick else 2
    return [
        ("tmm", TMM, "tmm", [_f(rng, 64 * s, 32), _f(rng, 128 * s, 32)]),
        ("tbmm", TBMM, "tbmm", [_f(rng, 50 * s, 26, 72), _f(rng, 50 * s, 26, 72)]),
        ("fcrelu", FCRELU, "fcrelu", [_f(rng, 32 * s, 128), _f(rng, 128, 128), _f(rng, 128)]),
        ("MLP3", MLP3, "MLP3", [_f(rng, 32 * s, 128), _f(rng, 64, 128), _f(rng, 64),
                                _f(rng, 32, 64), _f(rng, 32), _f(rng, 16, 32), _f(rng, 16)]),
        ("2LUT", LUT2, "2LUT", [_f(rng, 1000, 32),
                                rng.integers(0, 1000, (64 * s, 20)).astype(np.int32),
                                _f(rng, 1000, 32),
                                rng.integers(0, 1000, (64 * s, 20)).astype(np.int32)]),
        ("grouped conv", GCONV, "gconv", [_f(rng, 4 * s, 4, 8, 14, 14), _f(rng, 4, 8, 8, 3, 3)]),
    ]


def _tune_and_time(report: Report, label: str, backend: str, source: str, entry: str,
                   args: list, quick: bool, notes: list) -> None:
    fn = tc.define(source, backend=backend)[entry]
    repeats = 5 if quick else 9
    gens, pop = (2, 6) if quick else (4, 10)
    res = tc.autotune(fn, *args, generations=gens, population=pop, threads=2, progress=False)
    notes.append(f"{label}: tuned {res.evaluated} candidates in {res.seconds:.1f} s "
                 f"({res.candidates_per_second:.2f}/s, {res.rejected} rejected); "
                 f"best {res.options.to_json()}")
    for impl, opts in (("naive", tc.MappingOptions.naive()), ("default", fn.options),
                       ("autotuned", res.options)):
        fn.compile(*args, options=opts)
        report.measure(label, impl, lambda o=opts: fn.run_numpy(*args, options=o),
                       repeats=repeats, warmup=1)


def _op_overhead(report: Report, quick: bool) -> None:
    rng = np.random.default_rng(1)
    A, B = tf.constant(_f(rng, 8, 8)), tf.constant(_f(rng, 8, 8))
    f = tc.define(TMM).tmm          # on tf tensors: the TcKernel op
    graph_tc = tf.function(lambda a, b: f(a, b))
    graph_tf = tf.function(lambda a, b: tf.matmul(a, b, transpose_b=True))
    n = 200 if quick else 1000
    for label, tc_fn, tf_fn in (("op overhead eager (8x8 tmm)", lambda: f(A, B),
                                 lambda: tf.matmul(A, B, transpose_b=True)),
                                ("op overhead tf.function (8x8 tmm)", lambda: graph_tc(A, B),
                                 lambda: graph_tf(A, B))):
        report.measure(label, "TcKernel op", tc_fn, repeats=7, warmup=3, inner=n)
        report.measure(label, "tf.matmul", tf_fn, repeats=7, warmup=3, inner=n)


def run(quick: bool = False) -> Report:
    report = Report("tc_tuning", unit="ms", ours="autotuned")
    notes: list[str] = []
    rng = np.random.default_rng(0)
    for label, src, entry, args in _cases(quick, rng):
        _tune_and_time(report, f"{label} cpu", "cpu", src, entry, args, quick, notes)
    if opencl.available():
        for label, src, entry, args in _cases(True, rng)[::2][:2]:
            _tune_and_time(report, f"{label} opencl", "opencl", src, entry, args, quick,
                           notes)
    else:
        notes.append("opencl: no OpenCL platform (pyopencl and an ICD), skipped")
    _op_overhead(report, quick)
    report.notes = "\n".join(notes) + (
        "\nOp overhead rows compare a tc.define entry on tf tensors (the TcKernel op: a TC "
        "compiled to C and called by the generic TF op) with tf.matmul on the same 8x8 product; "
        "times per call.")
    return report
