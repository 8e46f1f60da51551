"""The polyhedral core: isl domains, access relations, dependences, schedules (isl's and the
identity), CPU annotation marks and the printed C (golden text)."""
import islpy as isl
import numpy as np
import pytest

from tfx_vec import tc_ops as tc
from tfx_vec.tc_ops.codegen.c import CPrinter
from tfx_vec.tc_ops.lang.parser import parse
from tfx_vec.tc_ops.lang.ranges import infer_ranges
from tfx_vec.tc_ops.lang.sema import check
from tfx_vec.tc_ops.poly.kernel import annotate_cpu, build_ast, build_kernel

from .corpus import BY_NAME


def _kernel(name, shapes, scalars=None):
    src = BY_NAME[name].source
    d = check(parse(src).get(BY_NAME[name].entry), src)
    vr = {"I1": (0, 0), "I2": (0, 0), "I": (0, 0)}
    return build_kernel(d, infer_ranges(d, shapes, scalars, vr))


def _same(ctx, obj, text):
    return obj.is_equal(type(obj).read_from_str(ctx, text))


def test_tmm_domain_accesses_and_dependences():
    k = _kernel("tmm", {"A": (4, 3), "B": (5, 3)})
    assert _same(k.ctx, k.domain, "{ S0_init[m, n] : 0 <= m < 4 and 0 <= n < 5; "
                                  "S0[m, n, kk] : 0 <= m < 4 and 0 <= n < 5 and 0 <= kk < 3 }")
    assert _same(k.ctx, k.writes, "{ S0_init[m, n] -> C[m, n] : 0 <= m < 4 and 0 <= n < 5; "
                                  "S0[m, n, kk] -> C[m, n] : 0 <= m < 4 and 0 <= n < 5 "
                                  "and 0 <= kk < 3 }")
    assert _same(k.ctx, k.reads.intersect_range(isl.UnionSet.read_from_str(k.ctx, "{ A[i,j] }")),
                 "{ S0[m, n, kk] -> A[m, kk] : 0 <= m < 4 and 0 <= n < 5 and 0 <= kk < 3 }")
    # the reduction carries a dependence along kk only; init precedes every update
    self_dep = isl.UnionMap.read_from_str(
        k.ctx, "{ S0[m, n, kk] -> S0[m, n, kk2] : 0 <= m < 4 and 0 <= n < 5 and "
               "0 <= kk < kk2 < 3 }")
    assert self_dep.is_subset(k.deps)
    assert k.deps.intersect(isl.UnionMap.read_from_str(
        k.ctx, "{ S0[m, n, kk] -> S0[m2, n2, kk2] : m2 != m }")).is_empty()


def test_data_dependent_reads_are_over_approximated():
    k = _kernel("1LUT", {"LUT1": (6, 2), "I1": (3, 4)})
    lut_reads = k.reads.intersect_range(isl.UnionSet.read_from_str(k.ctx, "{ LUT1[a, b] }"))
    assert _same(k.ctx, lut_reads, "{ S0[i, j, k] -> LUT1[o0, o1] : 0 <= i < 3 and 0 <= j < 2 "
                                   "and 0 <= k < 4 and 0 <= o0 < 6 and 0 <= o1 < 2 }")


def test_isl_schedule_finds_parallel_outer_loops_and_a_sequential_reduction():
    k = _kernel("tmm", {"A": (4, 3), "B": (5, 3)})
    band = k.isl_schedule(tc.MappingOptions()).get_root().child(0)
    assert band.get_type() == isl.schedule_node_type.band
    coinc = [band.band_member_get_coincident(i) for i in range(band.band_n_member())]
    assert coinc[:2] == [True, True] and (len(coinc) == 2 or not coinc[2])


def test_fusion_strategies():
    shapes = {"I": (4, 3), "W2": (5, 3), "B2": (5,), "W3": (6, 5), "B3": (6,), "W4": (2, 6),
              "B4": (2,)}
    k = _kernel("MLP3", shapes)
    top_min = k.isl_schedule(tc.MappingOptions(fusion_strategy="min")).get_root().child(0)
    top_max = k.isl_schedule(tc.MappingOptions(fusion_strategy="max")).get_root().child(0)
    assert top_min.get_type() == isl.schedule_node_type.sequence
    assert top_min.n_children() == 9      # one loop nest per statement (the 3 inits included)
    # max fusion fuses each layer's init/update/relu into one nest
    assert top_max.get_type() != isl.schedule_node_type.sequence or top_max.n_children() < 9
    k = _kernel("fcrelu", {"I": (2, 3), "W": (4, 3), "bias": (4,)})
    top = k.isl_schedule(tc.MappingOptions(fusion_strategy="max")).get_root().child(0)
    assert top.get_type() == isl.schedule_node_type.band


def test_identity_schedule_is_source_order():
    k = _kernel("fcrelu", {"I": (2, 3), "W": (4, 3), "bias": (4,)})
    text = build_ast(k, k.identity_schedule()).to_C_str()
    assert text.index("S0(") < text.index("S1(") < text.index("S2(")
    assert text.count("for (") == 2 + 3 + 2


def test_annotate_cpu_marks_and_tiles():
    k = _kernel("tmm", {"A": (64, 40), "B": (48, 40)})
    o = tc.MappingOptions(tile=(16, 16))
    text = build_ast(k, annotate_cpu(k.isl_schedule(o), o)).to_C_str()
    assert text.lstrip().startswith("// omp")
    assert "+= 16" in text and "// seq" in text


GOLDEN_NAIVE = """\
void tc_scale(void* const* args) {
  const float *restrict A = (const float *)args[0];
  const float s = *(const float *)args[1];
  float *restrict B = (float *)args[2];
  for (int _c1 = 0; _c1 <= 3; _c1 += 1) {
    { const int i = _c1; B[i] = (float)((s * A[i])); }
  }
}
"""


def test_printed_c_is_stable():
    mod = tc.define("def scale(float(N) A, float s) -> (B) { B(i) = s * A(i) }")
    out = mod.scale(np.ones(4, np.float32), 2.0, options=tc.MappingOptions.naive())
    np.testing.assert_allclose(out.numpy(), 2.0)
    src = mod.scale.source()
    assert src.split("\n\n", 1)[1] == GOLDEN_NAIVE


def test_printer_dialect_attributes_are_overridable():
    class NoPragmas(CPrinter):
        pragma_parallel = "/* parallel */"
        parallel_min_work = 0
        restrict = "__restrict__"

    k = _kernel("tmm", {"A": (64, 40), "B": (48, 40)})
    o = tc.MappingOptions.default_for(k.cdef.ast)
    src = NoPragmas(k, o).kernel_source(annotate_cpu(k.isl_schedule(o), o))
    assert "/* parallel */" in src and "__restrict__" in src and "#pragma omp parallel" not in src


@pytest.mark.parametrize("name", ["C", "int", "_c0", "2LUT"])
def test_awkward_names_compile(name):
    mod = tc.define(f"def f(float(N) A) -> ({name}) {{ {name}(i) = A(i) + 1 }}")
    np.testing.assert_allclose(mod.f(np.ones(3, np.float32)).numpy(), 2.0)


def test_isl_keywords_as_tc_names():
    mod = tc.define("def f(float(N) mod) -> (min) { min(and) = mod(and) * 2 }")
    np.testing.assert_allclose(mod.f(np.ones(3, np.float32)).numpy(), 2.0)
