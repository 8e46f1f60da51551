"""The cpu backend against NumPy on every corpus TC (isl schedule + tiling/OpenMP/simd, and the
naive identity schedule), under random valid MappingOptions, through tf.Tensor in/out; the
compiled-object cache; call-time shape/dtype/value errors; AddressSanitizer on a subset."""
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import random_array, require
from tfx_vec import tc_ops as tc
from tfx_vec.tc_ops import native
from tfx_vec.tc_ops.backends import cpu

from .corpus import BY_NAME, CASES

_MODULES: dict = {}


def _module(case):
    if case.name not in _MODULES:
        _MODULES[case.name] = tc.define(case.source)
    return _MODULES[case.name]


def check_case(case, seed, options=None):
    rng = np.random.default_rng(seed)
    args = case.inputs(rng)
    outs = _module(case)[case.entry].run_numpy(*args, options=options)
    refs = case.reference(*args)
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        r = np.asarray(r)
        assert o.shape == r.shape and o.dtype == r.dtype or o.shape == r.shape
        np.testing.assert_allclose(o, r.astype(o.dtype), rtol=case.rtol, atol=case.atol)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_corpus_default_options(case):
    check_case(case, seed=1)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_corpus_naive_schedule(case):
    check_case(case, seed=2, options=tc.MappingOptions.naive())


_OPTIONS = st.builds(
    tc.MappingOptions,
    tile=st.lists(st.integers(1, 40), max_size=3).map(tuple),
    fusion_strategy=st.sampled_from(["max", "preserve3coincident", "min"]),
    parallel=st.integers(0, 1), vectorize=st.booleans(), unroll=st.integers(1, 4))


@settings(max_examples=6)
@given(case=st.sampled_from([BY_NAME[n] for n in ("tmm", "fcrelu", "MLP3", "layernorm",
                                                   "group_convolution", "softmax", "sconv2d",
                                                   "maxpool2x2", "2LUT")]),
       options=_OPTIONS, seed=st.integers(0, 2**16))
def test_random_valid_options(case, options, seed):
    check_case(case, seed, options)


def test_tf_tensors_in_and_out_and_source():
    mod = tc.define(BY_NAME["tmm"].source + BY_NAME["fcrelu"].source)
    rng = np.random.default_rng(3)
    A, B = tf.constant(random_array(rng, (5, 7))), tf.constant(random_array(rng, (6, 7)))
    C = mod.tmm(A, B)
    assert isinstance(C, tf.Tensor) and C.dtype == tf.float32
    np.testing.assert_allclose(C.numpy(), A.numpy() @ B.numpy().T, rtol=1e-5, atol=1e-5)
    src = mod.tmm.source()
    assert "void tc_tmm(void* const* args)" in src and "(M=5, K=7, N=6)" in src
    assert "#pragma omp parallel" not in src      # too little work to start threads
    with pytest.raises(tc.TcError, match="not been compiled"):
        mod.fcrelu.source()
    O = mod.fcrelu(A, B, tf.ones([6]))
    assert isinstance(O, tf.Tensor) and O.shape == (5, 6)
    mod.tmm(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32))
    assert "(M=2, K=3, N=4)" in mod.tmm.source()      # the last compiled sizes


def test_cpu_strategy_in_the_generated_code():
    """Large kernels get OpenMP on the outer tile loop, reductions a vector accumulator."""
    f32 = np.float32
    src, outs = cpu.generate(BY_NAME["tmm"].source, "tmm", [((512, 512), f32), ((256, 512), f32)])
    assert outs == [("C", (512, 256), np.dtype(f32))]
    # the micro-kernel's column blocks are the OpenMP loop (test_cpu_blocking tests the kernel)
    assert "register-blocked contraction micro-kernel, packed column operand" in src
    assert src.index("#pragma omp parallel for") < src.index("for (int tc_jc = 0;")
    src, _ = cpu.generate(BY_NAME["tmm"].source, "tmm", [((256, 512), f32), ((128, 512), f32)],
                          tc.MappingOptions.default_for().replace(block=False))
    assert src.index("#pragma omp parallel for") < src.index("_c0 += 32")
    src, _ = cpu.generate(BY_NAME["tmm"].source, "tmm", [((256, 512), f32), ((128, 512), f32)],
                          tc.MappingOptions.default_for().replace(tile=(32, 32, 32), block=False))
    assert "#pragma omp simd reduction(+:tc_acc)" in src                  # remainder loop
    assert "reduction(+:tc_acc0, tc_acc1, tc_acc2, tc_acc3)" in src       # 4 columns jammed
    naive, _ = cpu.generate(BY_NAME["tmm"].source, "tmm", [((256, 512), f32), ((128, 512), f32)],
                            tc.MappingOptions.naive())
    assert "#pragma" not in naive and "+= 32" not in naive
    src, _ = cpu.generate(BY_NAME["fcrelu"].source, "fcrelu",
                          [((256, 512), f32), ((64, 512), f32), ((64,), f32)],
                          tc.MappingOptions.default_for().replace(block=False))
    # fused: bias, reduction and relu of one (b, n) tile are in one loop nest
    assert src.count("#pragma omp parallel for") == 1
    # the reduction loop isl peels between init and relu still accumulates in a vector register
    src, _ = cpu.generate(BY_NAME["fcrelu"].source, "fcrelu",
                          [((256, 512), f32), ((64, 512), f32), ((64,), f32)],
                          tc.MappingOptions(tile=(32, 32), block=False))
    assert "reduction(+:tc_acc)" in src


def test_short_reductions_run_around_a_vector_loop():
    """conv: c, kh, kw (short) go outside, the output's w loop becomes the simd loop."""
    f32 = np.float32
    src, _ = cpu.generate(BY_NAME["conv2d"].source, "conv2d",
                          [((2, 3, 20, 40), f32), ((4, 3, 3, 3), f32)],
                          tc.MappingOptions.default_for().replace(block=False))
    lines = [x.strip() for x in src.splitlines()]
    k = next(i for i, x in enumerate(lines) if "out[b][op][h][w] = (float)(out[b][op][h][w] +" in x)
    assert lines[k - 1].startswith("for (int") and "<= 37;" in lines[k - 1]  # w: 40 - 3 + 1
    assert lines[k - 2] == "#pragma omp simd"
    # a long reduction keeps the dot-product form; so does a short one whose parallel index is
    # not the last subscript everywhere (tmm's n in B(n, kk): a vector loop over n would gather)
    # (by default both become the contraction micro-kernel over a packed B instead)
    for k in (512, 32):
        shapes = [((64, k), f32), ((64, k), f32)]
        src, _ = cpu.generate(BY_NAME["tmm"].source, "tmm", shapes,
                              tc.MappingOptions.default_for().replace(tile=(32,) * 3, block=False))
        assert "reduction(+:tc_acc" in src
        assert "register-blocked contraction" in cpu.generate(BY_NAME["tmm"].source, "tmm",
                                                              shapes)[0]


def test_several_outputs_return_a_tuple_and_shapes_are_inferred():
    case = BY_NAME["softmax"]
    mod = tc.define(case.source)
    outs = mod.softmax(random_array(np.random.default_rng(0), (3, 4)))
    assert isinstance(outs, tuple) and [o.shape for o in outs] == [(3, 4), (3,), (3,)]
    assert mod.softmax.output_shapes((3, 4)) == ((3, 4), (3,), (3,))
    assert tc.define(BY_NAME["conv1d"].source).conv1d.output_shapes((10,), (3,)) == ((8,),)


def test_compiled_object_cache_hits_without_the_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("TFX_VEC_CACHE_DIR", str(tmp_path))
    src = "def axpy(float(N) X, float(N) Y, float a) -> (Z) { Z(i) = a * X(i) + Y(i) }"
    x = np.arange(1, 6, dtype=np.float32)
    tc.define(src).axpy(x, x, 2.0)
    assert len(list((tmp_path / "kernels").glob("*.so"))) == 1

    def no_compiler(*a, **k):
        raise AssertionError("compiler called on a cache hit")
    monkeypatch.setattr(native, "run_tool", no_compiler)
    out = tc.define(src).axpy(x, x, 2.0)    # a new module: only the .so cache can hit
    np.testing.assert_allclose(out.numpy(), 3 * x)
    with pytest.raises(AssertionError, match="compiler called"):
        tc.define(src).axpy(np.ones(7, np.float32), np.ones(7, np.float32), 2.0)


CALL_ERRORS = [
    ("tmm", lambda: [np.ones((2, 3), np.float32), np.ones((4, 5), np.float32)], tc.TcShapeError,
     r"size K is 3 from A \(2, 3\) but 5 from dimension 1 of B \(4, 5\)"),
    ("tmm", lambda: [np.ones((2, 3), np.float32)], tc.TcShapeError, r"takes 2 input\(s\)"),
    ("tmm", lambda: [np.ones((2, 3)), np.ones((4, 3))], tc.TcShapeError,
     r"input A is declared float \(float32\) but got dtype float64"),
    ("tmm", lambda: [np.ones((2, 3, 1), np.float32), np.ones((4, 3), np.float32)],
     tc.TcShapeError, r"rank 2\) but got shape \(2, 3, 1\)"),
    ("conv1d", lambda: [np.ones(3, np.float32), np.ones(5, np.float32)], tc.TcRangeError,
     r"index 'i' gets an empty range"),
    ("gather", lambda: [np.ones(4, np.float32), np.array([[0, 4]], np.int32)], tc.TcRangeError,
     r"subscript I\(i, j\) of X ranges over \[0, 4\] but dimension 0 of X has size 4"),
]


CALL_ERRORS += [
    ("tmm", lambda: [np.zeros((0, 3), np.float32), np.ones((2, 3), np.float32)],
     tc.TcRangeError, r"index 'm' gets an empty range \[0, 0\) for sizes M=0"),
    ("leaky_mask", lambda: [np.ones(3, np.float32), "x"], tc.TcShapeError,
     r"scalar argument alpha is declared float, got 'x'"),
    ("leaky_mask", lambda: [np.ones(3, np.float32), np.ones(2)], tc.TcShapeError,
     r"scalar argument alpha got an array of shape \(2,\)"),
]


@pytest.mark.parametrize("name,args,cls,pattern", CALL_ERRORS)
def test_call_time_errors(name, args, cls, pattern):
    with pytest.raises(cls, match=pattern):
        _module(BY_NAME[name])[name](*args())


def test_inference_intersects_and_unchecked_accesses_are_bounds_checked():
    # B(i + 1) shrinks i to [0, M - 1) in the second statement (ranges are intersected)
    mod = tc.define("def f(float(N) A, float(M) B) -> (C) {\n  C(i) = A(i)\n"
                    "  C(i) = C(i) + B(i + 1)\n}")
    out = mod.f(np.ones(4, np.float32), np.full(3, 2, np.float32)).numpy()
    np.testing.assert_allclose(out, [3, 3, 1, 1])
    # i + j is not used for inference (two unresolved indices): it is checked instead
    src = "def g(float(N,M) A, float(K) B) -> (C) {\n  C(i) +=! A(i,j) * B(i + j)\n}"
    mod = tc.define(src)
    A, B = np.ones((3, 4), np.float32), np.arange(1, 7, dtype=np.float32)
    np.testing.assert_allclose(mod.g(A, B).numpy(), [B[i:i + 4].sum() for i in range(3)])
    with pytest.raises(tc.TcRangeError, match=r"subscript i \+ j of B ranges over \[0, 5\] but"
                                             r" dimension 0 of B has size 5") as ei:
        mod.g(A, B[:5])
    assert (ei.value.line, ei.value.column) == (2, 23)


def test_options_validation():
    with pytest.raises(tc.TcOptionsError, match="options must be a tc.MappingOptions"):
        _module(BY_NAME["tmm"]).tmm(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32),
                                    options="fast")
    with pytest.raises(tc.TcOptionsError, match="fusion_strategy"):
        tc.MappingOptions(fusion_strategy="some")
    with pytest.raises(tc.TcOptionsError, match="map_to_threads"):
        tc.MappingOptions(map_to_threads=(64, 64))
    with pytest.raises(tc.TcOptionsError, match="unknown option"):
        tc.MappingOptions.from_json('{"tiles": [1]}')
    o = tc.MappingOptions(tile=(4, 8), unroll=2, parallel=0)
    assert tc.MappingOptions.from_json(o.to_json()) == o
    with pytest.raises(tc.TcBackendError, match="unknown tc_ops backend 'nope'"):
        tc.define("def f(float(N) A) -> (B) { B(i) = A(i) }", backend="nope")


# -- AddressSanitizer --------------------------------------------------------------------
_ASAN_RUNNER = textwrap.dedent("""
    import ctypes, sys
    import numpy as np
    data = np.load(sys.argv[2], allow_pickle=False)
    arrays = [np.ascontiguousarray(data[f"a{i}"]) for i in range(len(data.files))]
    fn = getattr(ctypes.CDLL(sys.argv[1]), sys.argv[3])
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    fn((ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays]))
    print("asan-ok")
""")


def _asan_runtime():
    cc = native.tool("CC")[0]
    path = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True,
                          text=True).stdout.strip()
    require(os.path.isabs(path) and os.path.exists(path), "libasan.so (AddressSanitizer)")
    return path


def _run_under_asan(tmp_path, source, entry, arrays):
    so = cpu.compile_shared(source, ("-fsanitize=address", "-fno-omit-frame-pointer"),
                            tag="asan")
    np.savez(tmp_path / "args.npz", **{f"a{i}": a for i, a in enumerate(arrays)})
    runner = tmp_path / "runner.py"
    runner.write_text(_ASAN_RUNNER)
    env = dict(os.environ, LD_PRELOAD=_asan_runtime(), ASAN_OPTIONS="detect_leaks=0",
               OMP_NUM_THREADS="2")
    return subprocess.run([sys.executable, str(runner), str(so.path),
                           str(tmp_path / "args.npz"), entry],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("name", ["tmm", "sconv2d", "maxpool2x2", "2LUT", "layernorm",
                                  "kronecker"])
def test_kernels_under_address_sanitizer(tmp_path, name):
    case = BY_NAME[name]
    rng = np.random.default_rng(5)
    args = case.inputs(rng)
    entry = _module(case)[case.entry]
    outs = entry.run_numpy(*args)
    arrays = entry._convert(args) + [np.zeros_like(o) for o in outs]
    proc = _run_under_asan(tmp_path, entry.source(), "tc_" + case.entry, arrays)
    assert proc.returncode == 0 and "asan-ok" in proc.stdout, proc.stderr[-3000:]


def test_address_sanitizer_catches_an_out_of_bounds_kernel(tmp_path):
    """The control: the harness above really detects a one-past-the-end read."""
    bad = ("void tc_bad(void* const* args) { const float *A = args[0]; float *B = args[1];\n"
           "  for (int i = 0; i <= 16; i++) B[0] += A[i]; }\n")
    proc = _run_under_asan(tmp_path, bad, "tc_bad",
                           [np.ones(16, np.float32), np.zeros(1, np.float32)])
    assert proc.returncode != 0 and "heap-buffer-overflow" in proc.stderr


def test_compile_error_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("TFX_VEC_CACHE_DIR", str(tmp_path))
    with pytest.raises(tc.TcCompileError, match="C compiler failed"):
        cpu.compile_shared("this is not C")
    require(shutil.which("cc") is not None, "cc")


def test_tf_inputs_are_not_copied():
    entry = _module(BY_NAME["tmm"]).tmm
    t = tf.constant(np.ones((64, 32), np.float32))
    a1, a2 = entry._convert([t, t])
    assert a1.ctypes.data == a2.ctypes.data      # both views of the tensor's own buffer


def test_integer_division_by_zero_does_not_trap():
    mod = tc.define("def d(int32(N) A, int32(N) B) -> (Q, R) {\n  Q(i) = A(i) / B(i)\n"
                    "  R(i) = A(i) % B(i)\n}")
    a = np.array([7, -7, 5, np.iinfo(np.int32).min], np.int32)
    b = np.array([2, 2, 0, -1], np.int32)
    q, r = mod.d(a, b)
    np.testing.assert_array_equal(q.numpy(), [3, -3, 0, np.iinfo(np.int32).min])  # C truncation
    np.testing.assert_array_equal(r.numpy(), [1, -1, 0, 0])
