"""Random TC programs (hypothesis) on the cpu backend against the definitional interpreter
(``lang.interp``), under default and random MappingOptions; and the interpreter itself against the
corpus' hand-written NumPy references."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import random_array
from tfx_vec import tc_ops as tc
from tfx_vec.tc_ops.lang.interp import interpret

from .corpus import CASES

_VAR = {"M": "i", "N": "j", "K": "k"}
_ORDER = "ijk"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_interpreter_matches_the_numpy_references(case):
    rng = np.random.default_rng(11)
    args = case.inputs(rng)
    outs = interpret(tc.define(case.source)[case.entry].cdef, args)
    for o, r in zip(outs, case.reference(*args)):
        np.testing.assert_allclose(o, np.asarray(r), rtol=10 * case.rtol, atol=10 * case.atol)


@st.composite
def programs(draw):
    """A random TC: 2-3 inputs over sizes M, N, K; 1-3 statements, each defining a new tensor
    from an expression over inputs and earlier tensors, reducing over the indices it drops."""
    tensors = {}                                   # name -> dims (size names)
    params = []
    for t in range(draw(st.integers(2, 3))):
        dims = draw(st.lists(st.sampled_from("MNK"), min_size=1, max_size=3, unique=True))
        tensors[f"X{t}"] = dims
        params.append(f"float({','.join(dims)}) X{t}")
    stmts, outs = [], []
    for s in range(draw(st.integers(1, 3))):
        names = list(tensors)

        def access(name):
            return f"{name}({','.join(_VAR[d] for d in tensors[name])})" if tensors[name] \
                else f"{name}()"

        def expr(depth):
            kind = draw(st.sampled_from(["access", "access", "lit", "bin", "call"]
                                        if depth < 2 else ["access", "lit"]))
            if kind == "access" or (kind == "lit" and depth == 0):
                return access(draw(st.sampled_from(names)))
            if kind == "lit":
                return draw(st.sampled_from(["2", "0.5", "-1.5f", "3"]))
            if kind == "bin":
                op = draw(st.sampled_from(["+", "-", "*"]))
                return f"({expr(depth + 1)} {op} {expr(depth + 1)})"
            f = draw(st.sampled_from(["fmaxf", "fminf", "tanh"]))
            if f == "tanh":
                return f"tanh({expr(depth + 1)})"
            return f"{f}({expr(depth + 1)}, {expr(depth + 1)})"

        rhs = expr(0)
        used = sorted({_VAR[d] for n in names if f"{n}(" in rhs for d in tensors[n]},
                      key=_ORDER.index)
        keep = [v for v in used if draw(st.booleans())]
        red = [v for v in used if v not in keep]
        op = draw(st.sampled_from(["+=!", "max=!", "min=!"])) if red else \
            draw(st.sampled_from(["=", "=", "+=!"]))
        name = f"T{s}"
        stmts.append(f"    {name}({','.join(keep)}) {op} {rhs}")
        inv = {v: d for d, v in _VAR.items()}
        tensors[name] = [inv[v] for v in keep]
        outs.append(name)
    src = (f"def rnd({', '.join(params)}) -> ({', '.join(outs)}) {{\n" + "\n".join(stmts)
           + "\n}")
    sizes = {d: draw(st.integers(1, 9)) for d in "MNK"}
    return src, [tensors[f"X{t}"] for t in range(len(params))], sizes


_OPTIONS = st.one_of(st.none(), st.builds(
    tc.MappingOptions, tile=st.lists(st.integers(1, 8), max_size=3).map(tuple),
    fusion_strategy=st.sampled_from(["max", "preserve3coincident", "min"]),
    parallel=st.integers(0, 1), vectorize=st.booleans(), unroll=st.integers(1, 3)))


@settings(max_examples=20)
@given(programs(), _OPTIONS, st.integers(0, 2**16))
def test_random_programs_match_the_interpreter(prog, options, seed):
    src, dims, sizes = prog
    rng = np.random.default_rng(seed)
    args = [random_array(rng, tuple(sizes[d] for d in ds), np.float32) for ds in dims]
    entry = tc.define(src).rnd
    ref = interpret(entry.cdef, args)
    got = entry.run_numpy(*args, options=options)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4, err_msg=src)


@pytest.mark.parametrize("src,shapes", [
    ("def f(float(N) A, float() s) -> (B) { B(i) +=! A(i + j) * s() where j in 1:3 }",
     [(6,), ()]),
    ("def g(float(N,M) A) -> (B, C) {\n  B(i) = A(i, 0) + A(i, M - 1)\n"
     "  C(j) max=! B(j) * A(j, 1) where j in 0:N\n}", [(5, 4)]),
    ("def h(float(N,M) A) -> (B) { B(i,j) = A(i,j) where i in 1:N, j in 0:M-1 }", [(5, 4)]),
])
def test_rank0_tensors_and_where_ranges_not_starting_at_zero(src, shapes):
    rng = np.random.default_rng(3)
    args = [random_array(rng, s, np.float32) for s in shapes]
    entry = list(tc.define(src))[0]
    for got, ref in zip(entry.run_numpy(*args), interpret(entry.cdef, args)):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    # a transposed (non-contiguous) input is accepted and read correctly
    if len(shapes[0]) == 2:
        t = random_array(rng, shapes[0][::-1], np.float32).T
        np.testing.assert_allclose(entry.run_numpy(t)[0], interpret(entry.cdef, [t])[0])
