"""Every corpus TC through the GPU mapping, printed as OpenCL and run on PoCL, against NumPy:
under the default options, the naive options, and random valid MappingOptions (hypothesis)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import require
from tests.tc_ops.corpus import CASES
from tfx_vec.tc_ops.api import define
from tfx_vec.tc_ops.backends import opencl
from tfx_vec.tc_ops.errors import TcBackendError
from tfx_vec.tc_ops.options import FUSION_STRATEGIES, MappingOptions


@pytest.fixture(scope="module", autouse=True)
def _pocl():
    require(opencl.available(), "an OpenCL platform (pocl-opencl-icd)")


def _has_fp16() -> bool:
    return "cl_khr_fp16" in opencl.OpenCLRuntime.get().device.extensions


def check_case(case, options, seed=0):
    rng = np.random.default_rng(seed)
    args = case.inputs(rng)
    entry = define(case.source, backend="opencl")[case.entry]
    if case.name == "half_axpy" and not _has_fp16():
        with pytest.raises(TcBackendError, match="cl_khr_fp16"):
            entry.run_numpy(*args, options=options)
        return
    outs = entry.run_numpy(*args, options=options)
    refs = case.reference(*args)
    assert len(outs) == len(refs)
    for name, got, want in zip(entry.cdef.outputs, outs, refs):
        np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol,
                                   err_msg=f"{case.name}: output {name} ({options})")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corpus_default_options(case):
    check_case(case, None)


@pytest.mark.parametrize("case", CASES[::3], ids=[c.name for c in CASES[::3]])
def test_corpus_naive_options(case):
    check_case(case, MappingOptions.naive(), seed=1)


_sizes = st.integers(1, 9)
options_strategy = st.builds(
    MappingOptions,
    tile=st.lists(_sizes, min_size=0, max_size=4).map(tuple),
    map_to_threads=st.lists(st.integers(1, 8), min_size=1, max_size=3).map(tuple),
    map_to_blocks=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
    use_shared_memory=st.booleans(),
    use_private_memory=st.booleans(),
    unroll=st.sampled_from([1, 2, 4]),
    unroll_copy_shared=st.booleans(),
    fusion_strategy=st.sampled_from(FUSION_STRATEGIES),
)


@settings(max_examples=20)
@given(case=st.sampled_from(CASES), options=options_strategy, seed=st.integers(0, 2 ** 16))
def test_corpus_random_valid_options(case, options, seed):
    check_case(case, options, seed)


def test_mlp3_untiled_shared_memory_keeps_every_statement():
    # Regression (hypothesis' find): O4 was off by its bias B4 -- the O4 init sat in a set beside
    # O2's band in the first kernel and was dropped when promotion restricted it to one tile.
    case = next(c for c in CASES if c.name == "MLP3")
    opts = MappingOptions(tile=(), map_to_threads=(1,), map_to_blocks=(1,),
                          use_shared_memory=True, fusion_strategy="max")
    check_case(case, opts, seed=0)
    check_case(case, opts.replace(map_to_threads=(4, 2), map_to_blocks=(3, 2)), seed=1)


def test_register_tile_needs_reduction_loops_inside_it():
    # Regression (hypothesis' find): with fusion 'min' the output index w sat in a loop inside
    # the thread loops of f and h; the register tile treated it as a reduction loop.
    case = next(c for c in CASES if c.name == "group_convolution")
    check_case(case, MappingOptions(tile=(), map_to_threads=(1,), map_to_blocks=(1,),
                                    use_private_memory=True, fusion_strategy="min"))


def test_shared_memory_changes_the_code_not_the_result():
    case = next(c for c in CASES if c.name == "tmm")
    on = MappingOptions(tile=(4, 4, 4), map_to_threads=(4, 4), use_shared_memory=True)
    check_case(case, on)
    args = case.inputs(np.random.default_rng(0))
    entry = define(case.source, backend="opencl")[case.entry]
    entry.compile(*args, options=on)
    assert "__local float _sh_A" in entry.source() and "barrier(" in entry.source()
    entry.compile(*args, options=on.replace(use_shared_memory=False))
    assert "__local" not in entry.source()


def test_private_memory_keeps_the_reduction_in_a_register():
    case = next(c for c in CASES if c.name == "tmm")
    opts = MappingOptions(tile=(4, 4, 4), map_to_threads=(4, 4), use_private_memory=True)
    check_case(case, opts)
    args = case.inputs(np.random.default_rng(0))
    entry = define(case.source, backend="opencl")[case.entry]
    entry.compile(*args, options=opts)
    assert "float _acc = C[m][n];" in entry.source() and "C[m][n] = _acc;" in entry.source()


def test_too_many_threads_for_the_device_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(opencl.OpenCLRuntime, "max_work_group_size", property(lambda self: 64))
    case = next(c for c in CASES if c.name == "tmm")
    with pytest.raises(TcBackendError, match="work-group limit 64"):
        check_case(case, MappingOptions(tile=(16, 16), map_to_threads=(16, 16)))


def test_transpose_with_promotion_for_coalescing_on_pocl():
    rng = np.random.default_rng(5)
    A = rng.uniform(-1, 1, (9, 13)).astype(np.float32)
    entry = define("def tr(float(N,M) A) -> (B) { B(j,i) = A(i,j) }", backend="opencl")["tr"]
    for shared in (False, True):
        (B,) = entry.run_numpy(A, options=MappingOptions(tile=(4, 4), map_to_threads=(4, 4),
                                                         use_shared_memory=shared))
        np.testing.assert_array_equal(B, A.T)


def test_bool_tensors_travel_as_bytes():
    rng = np.random.default_rng(6)
    x = rng.uniform(0.5, 2, 11).astype(np.float32) * rng.choice([-1, 1], 11).astype(np.float32)
    b = rng.random(11) < 0.5
    mod = define("def sel(bool(N) B, float(N) X) -> (Y, P) {\n"
                 "  Y(i) = B(i) ? X(i) : -X(i)\n  P(i) = X(i) > 0\n}", backend="opencl")
    y, p = mod.sel.run_numpy(b, x)
    np.testing.assert_array_equal(y, np.where(b, x, -x))
    np.testing.assert_array_equal(p, x > 0)
    assert "uchar" in mod.sel.source() and "bool *" not in mod.sel.source()


REGISTER_TILED = ["tmm", "fcrelu", "MLP3", "tbmm", "sgemm", "matmul_into"]


@pytest.mark.parametrize("name", REGISTER_TILED)
def test_register_tiles_per_thread_match_numpy(name):
    """With private memory, a thread's points of a contraction keep their sums in a register
    tile (each row and column value read once per reduction step)."""
    case = next(c for c in CASES if c.name == name)
    rng = np.random.default_rng(2)
    args = case.inputs(rng)
    entry = define(case.source, backend="opencl")[case.entry]
    opts = MappingOptions(tile=(2, 2), map_to_threads=(1, 1), map_to_blocks=(4, 4),
                          use_private_memory=True)
    shapes = [a.shape for a in args if np.ndim(a)]
    src = entry.compile(*args, options=opts).source
    assert "register tile per thread" in src, (name, shapes)
    for got, want in zip(entry.run_numpy(*args, options=opts), case.reference(*args)):
        np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol)


def test_register_tiles_guard_partial_tiles_and_uneven_thread_shares():
    tmm = next(c for c in CASES if c.name == "tmm")
    rng = np.random.default_rng(4)
    A, B = rng.random((13, 5), np.float32), rng.random((12, 5), np.float32)
    entry = define(tmm.source, backend="opencl").tmm
    even = MappingOptions(tile=(12, 12), map_to_threads=(4, 3), use_private_memory=True)
    uneven = MappingOptions(tile=(12, 12), map_to_threads=(5, 3), use_private_memory=True)
    src = entry.compile(A, B, options=even).source    # 13 rows: a partial second tile
    assert "4x3 register tile per thread" in src and "if ((" in src
    assert "4x3 register tile per thread" in entry.compile(A, B, options=uneven).source
    for o in (even, uneven):
        np.testing.assert_allclose(entry.run_numpy(A, B, options=o)[0], A @ B.T, rtol=1e-5)
