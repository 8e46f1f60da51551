"""Structure of the GPU mapping: kernels, grid/block sizes, tiling, promotion decisions."""
import islpy as isl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfx_vec.tc_ops.lang import parse
from tfx_vec.tc_ops.lang.ranges import infer_ranges
from tfx_vec.tc_ops.lang.sema import check
from tfx_vec.tc_ops.options import MappingOptions
from tfx_vec.tc_ops.poly.kernel import build_kernel
from tfx_vec.tc_ops.poly.mapping import map_to_gpu
from tests.tc_ops.test_opencl import options_strategy

TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"


def _kernel(source, shapes, values=None):
    d = check(parse(source).defs[0])
    return build_kernel(d, infer_ranges(d, shapes, None, values))


def test_tmm_one_kernel_blocks_and_threads_follow_the_options():
    k = _kernel(TMM, {"A": (40, 30), "B": (50, 30)})
    m = map_to_gpu(k, MappingOptions(tile=(16, 8), map_to_threads=(8, 4), map_to_blocks=(5, 2)))
    assert len(m.kernels) == 1
    gk = m.kernels[0]
    # x is the innermost mapped member (n: 50/8 -> 7 tiles, capped at 5 blocks), y is m (3 tiles)
    assert gk.grid == (5, 2) and gk.block == (8, 4)
    assert "_b0" in gk.context and "_t1" in gk.context


def test_threads_are_capped_by_the_tile_and_blocks_by_the_tile_count():
    k = _kernel(TMM, {"A": (10, 3), "B": (6, 3)})
    gk = map_to_gpu(k, MappingOptions(tile=(4, 2), map_to_threads=(32, 32),
                                      map_to_blocks=(100, 100))).kernels[0]
    assert gk.block == (2, 4)           # tiles are 4 (m) x 2 (n)
    assert gk.grid == (3, 3)            # ceil(6/2) tiles of n, ceil(10/4) tiles of m


def test_naive_options_run_everything_in_one_thread():
    k = _kernel(TMM, {"A": (4, 3), "B": (5, 3)})
    gk, = map_to_gpu(k, MappingOptions.naive()).kernels
    assert gk.grid == (1,) and gk.block == (1,)


def test_unfusable_statements_become_kernels_launched_in_order():
    src = "def two(float(N) A) -> (B, C) { B(i) = A(i) + 1 \n C(i) +=! B(j) * A(i) }"
    k = _kernel(src, {"A": (12,)})
    m = map_to_gpu(k, MappingOptions(tile=(4,), map_to_threads=(4,), fusion_strategy="min"))
    assert len(m.kernels) >= 2
    assert [g.name for g in m.kernels] == [f"tc_two_k{i}" for i in range(len(m.kernels))]


def test_shared_promotion_of_reused_inputs_only():
    k = _kernel(TMM, {"A": (40, 30), "B": (50, 30)})
    m = map_to_gpu(k, MappingOptions(tile=(16, 16, 8), map_to_threads=(16, 16),
                                     use_shared_memory=True))
    gk = m.kernels[0]
    assert [(p.tensor, p.sizes) for p in gk.promotions] == [("A", (16, 8)), ("B", (16, 8))]
    assert [t.param for t in gk.tile_loops] == ["_T0", "_T1", "_T2"]
    # offsets are affine in the tile coordinates
    ctx = isl.Set.read_from_str(k.ctx, "[_T0, _T1, _T2] -> { : _T0 = 2 and _T1 = 1 and _T2 = 3 }")
    a0 = gk.promotions[0].offsets[0].intersect_params(ctx)
    assert a0.max_val().to_python() == 32


def test_promotion_respects_the_shared_memory_budget():
    k = _kernel(TMM, {"A": (40, 30), "B": (50, 30)})
    opts = MappingOptions(tile=(16, 16, 8), map_to_threads=(16, 16), use_shared_memory=True)
    one = map_to_gpu(k, opts, shared_budget=16 * 8 * 4).kernels[0]
    assert [p.tensor for p in one.promotions] == ["A"]
    none = map_to_gpu(k, opts, shared_budget=100).kernels[0]
    assert none.promotions == [] and none.tile_loops == []


def test_single_use_arrays_are_not_promoted():
    src = "def add(float(N,M) A, float(N,M) B) -> (C) { C(i,j) = A(i,j) + B(i,j) }"
    k = _kernel(src, {"A": (8, 8), "B": (8, 8)})
    gk = map_to_gpu(k, MappingOptions(tile=(4, 4), map_to_threads=(4, 4),
                                      use_shared_memory=True)).kernels[0]
    assert gk.promotions == []


def test_indirectly_accessed_array_is_promoted_whole():
    src = "def gather(float(N) X, int32(A,B) I) -> (Z) { Z(i,j) = X(I(i,j)) }"
    k = _kernel(src, {"X": (10,), "I": (4, 6)}, values={"I": (0, 9)})
    gk = map_to_gpu(k, MappingOptions(tile=(2, 3), map_to_threads=(3, 2),
                                      use_shared_memory=True)).kernels[0]
    assert [(p.tensor, p.sizes) for p in gk.promotions] == [("X", (10,))]


@pytest.mark.parametrize("tile", [(3,), (3, 5), (3, 5, 2, 7)])
def test_fewer_or_more_tile_sizes_than_band_members(tile):
    k = _kernel(TMM, {"A": (9, 4), "B": (11, 4)})
    gk = map_to_gpu(k, MappingOptions(tile=tile, map_to_threads=(4, 4),
                                      map_to_blocks=(8, 8))).kernels[0]
    # only the coincident members (m, n) of the outer band can be mapped, and only tiled ones
    assert len(gk.grid) == len(gk.block) == min(2, len(tile))


def test_coalescing_test_of_the_promotion_heuristic():
    from tfx_vec.tc_ops.poly.promote import coalesced

    ctx = isl.Context()

    def acc(text):
        return isl.UnionMap.read_from_str(ctx, text)

    row = acc("{ S[i, j] -> A[i, j] : 0 <= i < 4 and 0 <= j < 4 }")
    assert coalesced(row, {"S": 1}) and not coalesced(row, {"S": 0})
    assert not coalesced(acc("{ S[i, j] -> A[j, i] : 0 <= i < 4 and 0 <= j < 4 }"), {"S": 1})
    assert not coalesced(acc("{ S[i] -> A[2i] : 0 <= i < 4 }"), {"S": 0})
    assert coalesced(row, {})  # x follows no single variable: decided on reuse alone


def test_uncoalesced_single_use_input_is_promoted_only_when_uncoalesced():
    from tfx_vec.tc_ops.poly.mapping import _x_vars, schedule_for

    src = "def tr(float(N,M) A) -> (B) { B(j,i) = A(i,j) }"
    k = _kernel(src, {"A": (8, 12)})
    opts = MappingOptions(tile=(4, 4), map_to_threads=(4, 4), use_shared_memory=True)
    gk = map_to_gpu(k, opts).kernels[0]
    band = schedule_for(k, opts).get_root().child(0)
    x = k.stmt("S0").vars[_x_vars(band.band_get_partial_schedule(), 1)["S0"]]
    # A(i, j) is read once: promoted exactly when thread x does not follow j
    assert [p.tensor for p in gk.promotions] == ([] if x == "j" else ["A"])


def test_one_thread_dimension_follows_the_innermost_coincident_member():
    k = _kernel(TMM, {"A": (16, 3), "B": (16, 3)})
    gk = map_to_gpu(k, MappingOptions(tile=(4, 8), map_to_threads=(32,),
                                      map_to_blocks=(4,))).kernels[0]
    # threads on n (tile 8, coalesced C[m][n] writes), blocks on m (16 / 4 = 4 tiles)
    assert gk.block == (8,) and gk.grid == (4,)


# -- every instance runs exactly once ---------------------------------------------------------
def _executed(gk) -> isl.UnionSet:
    """Instances the kernel runs, with the ids (and tile parameters) that run them as params:
    the domains reaching the schedule's leaves, restricted to the launch and the tile loops."""
    leaves: list = []

    def walk(node):
        if node.get_type() == isl.schedule_node_type.leaf:
            leaves.append(node.get_domain())
        for i in range(node.n_children()):
            walk(node.child(i))

    walk(gk.schedule.get_root())
    out = leaves[0]
    for d in leaves[1:]:
        out = out.union(d)
    launch = isl.Set.read_from_str(gk.schedule.get_ctx(), gk.context)
    for t in gk.tile_loops:   # for (T = start; T < extent; T += step), start 0 or a block id
        params = ", ".join([t.param] + ([t.start] if t.start != "0" else []))
        launch = launch.intersect(isl.Set.read_from_str(
            gk.schedule.get_ctx(),
            f"[{params}] -> {{ : exists (e : {t.param} = {t.start} + {t.step} * e and e >= 0) }}"))
    return out.intersect_params(launch)


def _runners(executed: isl.UnionSet) -> list[isl.Map]:
    """Per statement: instance -> (block ids, thread ids, tile params) that run it."""
    out = []
    sets = executed.get_set_list()
    for i in range(sets.n_set()):
        m = isl.Map.from_domain(sets.get_at(i))
        m = m.move_dims(isl.dim_type.out, 0, isl.dim_type.param, 0, m.dim(isl.dim_type.param))
        out.append(m)
    return out


def assert_each_instance_runs_once(k, m):
    """The kernels partition the domain, and within a kernel each instance is run by exactly
    one (block, thread, tile) -- the invariant a dropped or unmapped statement breaks."""
    seen = isl.UnionSet.empty(k.domain.get_space())
    for gk in m.kernels:
        for r in _runners(_executed(gk)):
            assert r.is_single_valued(), f"{gk.name}: instances run by several threads: {r}"
            dom = isl.UnionSet.from_set(r.domain())
            assert seen.intersect(dom).is_empty(), f"{gk.name} reruns {seen.intersect(dom)}"
            seen = seen.union(dom)
    assert seen.is_equal(k.domain), f"never run: {k.domain.subtract(seen)}"


def _corpus_kernel(case, seed=0):
    import numpy as np

    from tfx_vec.tc_ops.api import define

    args = case.inputs(np.random.default_rng(seed))
    d = define(case.source)[case.entry].cdef
    shapes, scalars, values = {}, {}, {}
    for p, a in zip(d.inputs, args):
        if p.is_scalar:
            scalars[p.name] = int(a) if float(a).is_integer() else a
            continue
        shapes[p.name] = a.shape
        if np.issubdtype(np.asarray(a).dtype, np.integer) and np.size(a):
            values[p.name] = (int(np.min(a)), int(np.max(a)))
    return build_kernel(d, infer_ranges(d, shapes, scalars, values))


MLP3_BUG = MappingOptions(tile=(), map_to_threads=(1,), map_to_blocks=(1,),
                          use_shared_memory=True, fusion_strategy="max")


def test_mlp3_untiled_promotion_keeps_the_o4_bias_init():
    # Regression: the first part of the schedule was a set {O2's band, O4's init band}; only the
    # first band was mapped, and promotion's tile restriction dropped O4(b,q) = B4(q).
    from tests.tc_ops.corpus import CASES

    case = next(c for c in CASES if c.name == "MLP3")
    k = _corpus_kernel(case)
    m = map_to_gpu(k, MLP3_BUG)
    assert_each_instance_runs_once(k, m)
    assert any(gk.promotions for gk in m.kernels)


_INVARIANT_OPTIONS = [
    MLP3_BUG,
    MLP3_BUG.replace(map_to_threads=(4, 2), map_to_blocks=(3, 2)),
    MappingOptions(tile=(3, 2, 4), map_to_threads=(2, 3), map_to_blocks=(2, 2),
                   use_shared_memory=True, fusion_strategy="min"),
    MappingOptions(tile=(5,), map_to_threads=(4,), map_to_blocks=(3,), fusion_strategy="max"),
]


def _case_names():
    from tests.tc_ops.corpus import CASES
    return [c.name for c in CASES]


@pytest.mark.parametrize("name", _case_names())
def test_every_corpus_instance_runs_exactly_once(name):
    from tests.tc_ops.corpus import CASES

    case = next(c for c in CASES if c.name == name)
    for seed in (0, 3):
        k = _corpus_kernel(case, seed)
        for opts in _INVARIANT_OPTIONS:
            assert_each_instance_runs_once(k, map_to_gpu(k, opts))


@settings(max_examples=25)
@given(name=st.sampled_from(_case_names()), options=options_strategy,
       seed=st.integers(0, 2 ** 16))
def test_every_instance_runs_exactly_once_under_random_options(name, options, seed):
    from tests.tc_ops.corpus import CASES

    k = _corpus_kernel(next(c for c in CASES if c.name == name), seed)
    assert_each_instance_runs_once(k, map_to_gpu(k, options))
