"""The paper's Tensor Comprehensions (§7 and the original project's examples), as TC source.

One copy of each kernel for the benchmarks, the test corpus and users who want a starting point;
each constant holds one ``def`` whose name is the constant's key in :data:`PAPER`.

Example:
    >>> import numpy as np
    >>> from tfx_vec import tc_ops as tc
    >>> from tfx_vec.tc_ops import library
    >>> mod = tc.define(library.TMM)
    >>> a, b = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)
    >>> mod.tmm(a, b).numpy().tolist()[0]
    [3.0, 3.0, 3.0, 3.0]
"""

__all__ = ["TMM", "TBMM", "FCRELU", "MLP3", "LUT1", "LUT2", "GROUP_CONVOLUTION", "PAPER"]

TMM = """def tmm(float(M,K) A, float(N,K) B) -> (C) {
    C(m,n) +=! A(m,kk) * B(n,kk)
}"""

TBMM = """def tbmm(float(B,N,M) X, float(B,K,M) Y) -> (Z) {
    Z(b,n,k) +=! X(b,n,m) * Y(b,k,m)
}"""

FCRELU = """def fcrelu(float(B,M) I, float(N,M) W, float(N) bias) -> (O) {
    O(b,n) = bias(n)
    O(b,n) += I(b,m) * W(n,m)
    O(b,n) = fmaxf(O(b,n), 0)
}"""

MLP3 = """def MLP3(float(B,N) I, float(O,N) W2, float(O) B2, float(P,O) W3, float(P) B3,
         float(Q,P) W4, float(Q) B4) -> (O2, O3, O4) {
    O2(b,o) = B2(o)
    O2(b,o) += I(b,n) * W2(o,n)
    O2(b,o) = fmaxf(O2(b,o), 0)
    O3(b,p) = B3(p)
    O3(b,p) += O2(b,o) * W3(p,o)
    O3(b,p) = fmaxf(O3(b,p), 0)
    O4(b,q) = B4(q)
    O4(b,q) += O3(b,p) * W4(q,p)
    O4(b,q) = fmaxf(O4(b,q), 0)
}"""

LUT1 = """def 1LUT(float(E1,D) LUT1, int32(B,L1) I1) -> (O1) {
    O1(i,j) +=! LUT1(I1(i,k), j)
}"""

LUT2 = """def 2LUT(float(E1,D) LUT1, int32(B,L1) I1, float(E2,D) LUT2, int32(B,L2) I2) -> (O1, O2) {
    O1(i,j) +=! LUT1(I1(i,k), j)
    O2(i,j) +=! LUT2(I2(i,k), j)
}"""

GROUP_CONVOLUTION = """def group_convolution(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1, float(G,F) B) -> (O) {
    O(n,g,f,h,w) +=! I(n,g,c, h + kh, w + kw) * W1(g,f,c,kh,kw)
    O(n,g,f,h,w) = O(n,g,f,h,w) + B(g,f)
}"""

PAPER = {"tmm": TMM, "tbmm": TBMM, "fcrelu": FCRELU, "MLP3": MLP3, "1LUT": LUT1, "2LUT": LUT2,
         "group_convolution": GROUP_CONVOLUTION}
