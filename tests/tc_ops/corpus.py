"""Shared corpus of test TCs: every TC of the paper and of the original project's examples.

Each :class:`Case` is a row: ``name``, TC ``source``, ``entry``, ``inputs(rng)`` (random shapes
and non-zero values; returns the argument list in signature order) and ``reference(*args)`` (NumPy,
returns the outputs in ``-> (...)`` order).  The backends' tests (cpu, OpenCL, CUDA) run
every case and compare every output element.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from tfx_vec.tc_ops import library

from tests.support import random_array


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    source: str
    entry: str
    inputs: Callable[[np.random.Generator], list]
    reference: Callable[..., tuple]
    rtol: float = 1e-4
    atol: float = 1e-4


def _d(rng, lo=2, hi=9):
    return int(rng.integers(lo, hi))


def _f(rng, *shape):
    return random_array(rng, shape, np.float32)


def _idx(rng, n, *shape):
    return rng.integers(0, n, size=shape).astype(np.int32)


def _conv_ref(I, W):
    """Valid cross-correlation: O(n,f,h,w) = sum_{c,kh,kw} I(n,c,h+kh,w+kw) W(f,c,kh,kw)."""
    N, C, H, Wd = I.shape
    F, _, KH, KW = W.shape
    win = np.lib.stride_tricks.sliding_window_view(I, (KH, KW), axis=(2, 3))
    return np.einsum("nchwij,fcij->nfhw", win, W, optimize=True)


def _mlp_layer(x, W, b):
    return np.maximum(x @ W.T + b, 0)


CASES: list[Case] = []


def case(name, source, entry, inputs, reference, **tol):
    CASES.append(Case(name, source, entry, inputs, reference, **tol))


case("mv", """
def mv(float(M,K) A, float(K) x) -> (C) {
    C(i) +=! A(i,k) * x(k)
}""", "mv", lambda r: [_f(r, _d(r), k := _d(r)), _f(r, k)], lambda A, x: (A @ x,))

case("sgemm", """
def sgemm(float a, float b, float(N,M) A, float(M,K) B, float(N,K) C) -> (D) {
    D(i,j) = b * C(i,j)           # initialisation
    D(i,j) += a * A(i,k) * B(k,j) # accumulation
}""", "sgemm",
     lambda r: [np.float32(1.5), np.float32(-0.5), _f(r, n := _d(r), m := _d(r)),
                _f(r, m, k := _d(r)), _f(r, n, k)],
     lambda a, b, A, B, C: (b * C + a * (A @ B),))

case("fcrelu", library.FCRELU, "fcrelu", lambda r: [_f(r, _d(r), m := _d(r)), _f(r, n := _d(r), m), _f(r, n)],
     lambda I, W, b: (_mlp_layer(I, W, b),))

case("conv2d", """
def conv2d(float(B,IP,H,W) in, float(OP,IP,KH,KW) weight) -> (out) {
    out(b,op,h,w) +=! in(b,ip, h + kh, w + kw) * weight(op,ip,kh,kw)
}""", "conv2d",
     lambda r: [_f(r, 2, c := _d(r, 1, 4), _d(r, 5, 9), _d(r, 5, 9)),
                _f(r, _d(r, 1, 4), c, _d(r, 1, 4), _d(r, 1, 4))],
     lambda I, W: (_conv_ref(I, W),))


def _sconv_ref(sh, sw, I, W, B):
    full = _conv_ref(I, W)
    return (full[:, :, ::int(sh), ::int(sw)] + B[None, :, None, None],)


case("sconv2d", """
def sconv2d(int32 sh, int32 sw, float(N,C,H,W) I, float(F,C,KH,KW) W, float(F) B) -> (O) {
    O(n,f,h,w) = B(f)
    O(n,f,h,w) += I(n,c, sh * h + kh, sw * w + kw) * W(f,c,kh,kw)
}""", "sconv2d",
     lambda r: [np.int32(2), np.int32(3), _f(r, 2, c := _d(r, 1, 4), _d(r, 6, 11), _d(r, 6, 11)),
                _f(r, f := _d(r, 1, 4), c, _d(r, 1, 4), _d(r, 1, 4)), _f(r, f)],
     _sconv_ref)


def _maxpool_ref(x):
    B, C, H, W = x.shape
    h, w = (H - 2) // 2 + 1, (W - 2) // 2 + 1
    v = np.stack([x[:, :, a:a + 2 * h:2, b:b + 2 * w:2] for a in (0, 1) for b in (0, 1)])
    return (v.max(axis=0),)


case("maxpool2x2", """
def maxpool2x2(float(B,C,H,W) in) -> (out) {
    out(b,c,i,j) max=! in(b,c, 2 * i + kw, 2 * j + kh)
        where kw in 0:2, kh in 0:2
}""", "maxpool2x2", lambda r: [_f(r, 2, _d(r, 1, 4), _d(r, 2, 10), _d(r, 2, 10))],
     _maxpool_ref)

case("gather", """
def gather(float(N) X, int32(A,B) I) -> (Z) {
    Z(i,j) = X(I(i,j))
}""", "gather", lambda r: [_f(r, n := _d(r)), _idx(r, n, _d(r), _d(r))],
     lambda X, I: (X[I],))

case("tmm", library.TMM, "tmm", lambda r: [_f(r, _d(r, 2, 40), k := _d(r, 2, 40)), _f(r, _d(r, 2, 40), k)],
     lambda A, B: (A @ B.T,))

case("tbmm", library.TBMM, "tbmm", lambda r: [_f(r, b := _d(r), _d(r), m := _d(r)), _f(r, b, _d(r), m)],
     lambda X, Y: (np.einsum("bnm,bkm->bnk", X, Y),))

case("group_convolution", library.GROUP_CONVOLUTION, "group_convolution",
     lambda r: [_f(r, 2, g := _d(r, 1, 4), c := _d(r, 1, 4), _d(r, 4, 8), _d(r, 4, 8)),
                _f(r, g, f := _d(r, 1, 4), c, 3, 3), _f(r, g, f)],
     lambda I, W, B: (np.stack([_conv_ref(I[:, g], W[g]) for g in range(I.shape[1])], 1)
                      + B[None, :, :, None, None],))

case("1LUT", library.LUT1, "1LUT", lambda r: [_f(r, e := _d(r), _d(r)), _idx(r, e, _d(r), _d(r))],
     lambda L, I: (L[I].sum(axis=1),))

case("2LUT", library.LUT2, "2LUT",
     lambda r: [_f(r, e1 := _d(r), d := _d(r)), _idx(r, e1, b := _d(r), _d(r)),
                _f(r, e2 := _d(r), d), _idx(r, e2, b, _d(r))],
     lambda L1, I1, L2, I2: (L1[I1].sum(axis=1), L2[I2].sum(axis=1)))

case("MLP3", library.MLP3, "MLP3",
     lambda r: [_f(r, _d(r), n := _d(r)), _f(r, o := _d(r), n), _f(r, o), _f(r, p := _d(r), o),
                _f(r, p), _f(r, q := _d(r), p), _f(r, q)],
     lambda I, W2, B2, W3, B3, W4, B4: (
         o2 := _mlp_layer(I, W2, B2), o3 := _mlp_layer(o2, W3, B3), _mlp_layer(o3, W4, B4)))

case("outerProductMM", """
def outerProductMM(float(P,Q,R) A, float(S,R,T) B) -> (O) {
    O(p,s,q,t) +=! A(p,q,r) * B(s,r,t)
}""", "outerProductMM",
     lambda r: [_f(r, _d(r, 2, 5), _d(r, 2, 5), k := _d(r, 2, 5)),
                _f(r, _d(r, 2, 5), k, _d(r, 2, 5))],
     lambda A, B: (np.einsum("pqr,srt->psqt", A, B),))

case("softmax", """
def softmax(float(N,D) I) -> (O, maxVal, expSum) {
    maxVal(n) max=! I(n,d)
    expSum(n) +=! exp(I(n,d) - maxVal(n))
    O(n,d) = exp(I(n,d) - maxVal(n)) / expSum(n)
}""", "softmax", lambda r: [_f(r, _d(r), _d(r))],
     lambda I: (np.exp(I - I.max(1, keepdims=True)) / np.exp(I - I.max(1, keepdims=True)).sum(
         1, keepdims=True), I.max(1), np.exp(I - I.max(1, keepdims=True)).sum(1)))


def _layernorm_ref(I):
    mean = I.mean(axis=2)
    var = ((I - mean[..., None]) ** 2).mean(axis=2)
    return ((I - mean[..., None]) / np.sqrt(var[..., None] + 1e-5), mean, var)


case("layernorm", """
def layernorm(float(T,B,C) I) -> (O, mean, var) {
    mean(t,b) +=! I(t,b,c) / C
    centered(t,b,c) = I(t,b,c) - mean(t,b)      # a temporary
    var(t,b) +=! centered(t,b,c) * centered(t,b,c)
    var(t,b) = var(t,b) / C
    O(t,b,c) = centered(t,b,c) / sqrt(var(t,b) + 1e-5)
}""", "layernorm", lambda r: [_f(r, _d(r), _d(r), _d(r))], _layernorm_ref)


def _groupnorm_ref(I, gamma, beta):
    mean = I.mean(axis=(2, 3, 4))
    var = ((I - mean[:, :, None, None, None]) ** 2).mean(axis=(2, 3, 4))
    x = (I - mean[:, :, None, None, None]) / np.sqrt(var[:, :, None, None, None] + 1e-5)
    return (gamma[None, :, :, None, None] * x + beta[None, :, :, None, None], mean, var)


case("group_normalization", """
def group_normalization(float(N,G,D,H,W) I, float(G,D) gamma, float(G,D) beta)
    -> (O, mean, var) {
    mean(n,g) +=! I(n,g,d,h,w)
    mean(n,g) = mean(n,g) / (D * H * W)
    var(n,g) +=! (I(n,g,d,h,w) - mean(n,g)) * (I(n,g,d,h,w) - mean(n,g))
    var(n,g) = var(n,g) / (D * H * W)
    O(n,g,d,h,w) = gamma(g,d) * (I(n,g,d,h,w) - mean(n,g)) * rsqrt(var(n,g) + 1e-5)
                   + beta(g,d)
}""", "group_normalization",
     lambda r: [_f(r, 2, g := _d(r, 1, 4), d := _d(r, 1, 4), _d(r, 2, 5), _d(r, 2, 5)),
                _f(r, g, d), _f(r, g, d)], _groupnorm_ref, rtol=1e-3, atol=1e-3)

case("kronecker", """
def kronecker(float(M,N) A, float(P,Q) B) -> (C) {
    C(i,j) = A(i / P, j / Q) * B(i % P, j % Q) where i in 0:M*P, j in 0:N*Q
}""", "kronecker", lambda r: [_f(r, _d(r, 1, 5), _d(r, 1, 5)), _f(r, _d(r, 1, 5), _d(r, 1, 5))],
     lambda A, B: (np.kron(A, B),))

case("conv1d", """
def conv1d(float(M) I, float(N) K) -> (O) {
    O(i) +=! K(x) * I(i + x)
}""", "conv1d", lambda r: [_f(r, _d(r, 6, 12)), _f(r, _d(r, 1, 5))],
     lambda I, K: (np.correlate(I, K, mode="valid"),))

# language coverage: several defs, 0-d output, ?:, comparisons, casts, ints, double, min/*=,
# builtins
case("dot", """
def dot(float(N) x, float(N) y) -> (s) {
    s +=! x(i) * y(i)
}""", "dot", lambda r: [_f(r, n := _d(r)), _f(r, n)], lambda x, y: (np.array(x @ y),))

case("leaky_mask", """
def leaky_mask(float(N) X, float alpha) -> (Y, M) {
    Y(i) = X(i) > 0 ? X(i) : alpha * X(i)
    M(i) = int32(X(i) > 0) + 2 * int32(X(i) < -1.0)
}""", "leaky_mask", lambda r: [_f(r, _d(r, 4, 20)), np.float32(0.1)],
     lambda X, a: (np.where(X > 0, X, a * X), (X > 0).astype(np.int32)
                   + 2 * (X < -1).astype(np.int32)))

def _row_stats_inputs(r):
    n, m = _d(r), _d(r, 2, 6)
    return [random_array(r, (n, m), np.float64), random_array(r, (n, m), np.int64)]


case("row_stats", """
def row_stats(double(N,M) A, int64(N,M) K) -> (mn, prod, kmax, habs) {
    mn(i) min=! A(i,j)
    prod(i) *=! A(i,j)
    kmax(i) max=! K(i,j) * 3 - 1
    habs(i,j) = fabs(tanh(A(i,j))) + sqrt(exp(A(i,j))) - log(1 + abs(A(i,j)))
}""", "row_stats", _row_stats_inputs,
     lambda A, K: (A.min(1), A.prod(1), (K * 3 - 1).max(1),
                   np.abs(np.tanh(A)) + np.sqrt(np.exp(A)) - np.log(1 + np.abs(A))),
     rtol=1e-10, atol=1e-10)

case("half_axpy", """
def half_axpy(half(N) X, half(N) Y) -> (Z) {
    Z(i) = X(i) * 2 + Y(i)
}""", "half_axpy",
     lambda r: [random_array(r, (n := _d(r),), np.float16), random_array(r, (n,), np.float16)],
     lambda X, Y: ((X * np.float16(2) + Y).astype(np.float16),), rtol=1e-2, atol=1e-2)

# -- constructs of the original language (written here; references independent of it) -------
# A reduction without "!" into an output nothing initialised reduces into the output's initial
# contents: zeros here (tests/tc_ops/test_constructs.py passes them with outputs=).
case("rowmax_into", """
def rowmax_into(float(N,D) X) -> (M) {
    M(n) max= X(n,d)
}""", "rowmax_into", lambda r: [_f(r, _d(r), _d(r))],
     lambda X: (np.maximum(X.max(1), 0),))

case("matmul_into", """
def matmul_into(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) += A(m,k) * B(k,n)
}""", "matmul_into", lambda r: [_f(r, _d(r), k := _d(r)), _f(r, k, _d(r))],
     lambda A, B: (A @ B,))

case("add_into", """
def add_into(float(N,M) X, float(N,M) Y) -> (O) {
    O(n,m) += X(n,m) + Y(n,m)
}""", "add_into", lambda r: [_f(r, n := _d(r), m := _d(r)), _f(r, n, m)],
     lambda X, Y: (X + Y,))

# typed, sized outputs
case("quantize", """
def quantize(float(N,M) X, float s) -> (int32(N,M) Q, float(N) rowsum) {
    Q(n,m) = int32(X(n,m) * s)
    rowsum(n) +=! float(Q(n,m)) / s
}""", "quantize", lambda r: [_f(r, _d(r), _d(r)), np.float32(7.5)],
     lambda X, s: ((q := np.trunc(X * s).astype(np.int32)), (q / s).sum(1)))

# 0-d tensors read without parentheses (an output, and an input declared "float()")
case("center", """
def center(float(N) X, float() c) -> (Y, total) {
    total +=! X(i)
    Y(i) = c * (X(i) - total / N)
}""", "center", lambda r: [_f(r, _d(r, 2, 12)), np.float32(1.5)],
     lambda X, c: (c * (X - X.sum() / X.size), np.array(X.sum(), np.float32)))

# "where exists": accesses that only bound the ranges; "where name = e": a named binding
case("exists_fill", """
def exists_fill(float(N,M) A) -> (B, C) {
    B(i) = 3.5 where exists A(i,0)
    C(i) +=! 1.0 where exists A(i,j)
}""", "exists_fill", lambda r: [_f(r, _d(r), _d(r))],
     lambda A: (np.full(A.shape[0], 3.5, np.float32),
                np.full(A.shape[0], A.shape[1], np.float32)))

case("sqdiff", """
def sqdiff(float(N) A, float(N) B) -> (C) {
    C(i) = d * d + e where d = A(i) - B(i), e = d / 2
}""", "sqdiff", lambda r: [_f(r, n := _d(r)), _f(r, n)],
     lambda A, B: ((A - B) ** 2 + (A - B) / 2,))

# reads guarded by a condition are checked only where the condition holds
case("causal_conv", """
def causal_conv(float(T) X, float(K) W) -> (Y) {
    Y(t) +=! (t - k >= 0) ? X(t - k) * W(k) : 0 where t in 0:T, k in 0:K
}""", "causal_conv", lambda r: [_f(r, _d(r, 4, 12)), _f(r, _d(r, 1, 4))],
     lambda X, W: (np.array([sum(X[t - k] * W[k] for k in range(W.size) if t - k >= 0)
                             for t in range(X.size)], np.float32),))

case("prefix_sum", """
def prefix_sum(float(N) X) -> (P) {
    P(i) +=! (j <= i) ? X(j) : 0 where i in 0:N
}""", "prefix_sum", lambda r: [_f(r, _d(r, 2, 12))], lambda X: (np.cumsum(X),))

case("backward_diff", """
def backward_diff(float(N) X) -> (D) {
    D(i) = (i >= 1 && !(i >= N)) ? X(i) - X(i - 1) : 0.0 where i in 0:N
}""", "backward_diff", lambda r: [_f(r, _d(r, 2, 12))],
     lambda X: (np.concatenate([[0], np.diff(X)]).astype(np.float32),))

# outputs whose range does not start at 0 are sized by the range's extent
case("shift_crop", """
def shift_crop(float(N,M) X) -> (S, C, Z) {
    S(i) = X(i - 1, 0)
    C(i,j) = X(i,j) where i in 1:N-1
    Z(k) +=! S(k) * C(k,j)
}""", "shift_crop", lambda r: [_f(r, _d(r, 3, 9), _d(r))],
     lambda X: (X[:, 0], X[1:-1], X[:-2, 0] * X[1:-1].sum(1)))

BY_NAME = {c.name: c for c in CASES}
