"""Kernels as the TC op builds them touch nothing but their tensors: every corpus TC and random
TC programs, at random sizes and under random mapping options, with ids out of range in every
data-dependent subscript (the op clamps them), run under AddressSanitizer in a subprocess."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import random_array
from tfx_vec import tc_ops as tc
from tfx_vec.tc_ops import op_builder
from tfx_vec.tc_ops.backends.cpu import kernel_source
from tfx_vec.tc_ops.lang.types import np_dtype

from .corpus import CASES
from .test_cpu import _run_under_asan
from .test_cpu_random import _OPTIONS, programs


def _out_of_range_ids(cdef, args, rng):
    """The arguments with every index tensor's values spread beyond its targets' extents."""
    index = set(op_builder.index_inputs(cdef))
    out = []
    for p, a in zip(cdef.inputs, args):
        if p.name in index:
            a = rng.integers(-7, 2 * max(a.size, 4) + 7, size=np.shape(a)).astype(a.dtype)
        out.append(a)
    return out


def _asan_check(tmp_path, cdef, args, options):
    shapes = {p.name: np.shape(a) for p, a in zip(cdef.inputs, args) if not p.is_scalar}
    scalars = {p.name: int(a) for p, a in zip(cdef.inputs, args)
               if p.name in cdef.structural_scalars}
    spec = op_builder.kernel_spec(cdef, shapes, scalars,
                                  options or tc.MappingOptions.default_for(cdef.ast))
    outs = [np.zeros(spec.ranges.shapes[n], np_dtype(cdef.tensors[n].dtype)) for n in cdef.outputs]
    proc = _run_under_asan(tmp_path, kernel_source(spec), f"tc_{cdef.name}",
                           [np.asarray(a) for a in args] + outs)
    assert proc.returncode == 0 and "asan-ok" in proc.stdout, proc.stderr[-3000:]


@settings(max_examples=12)
@given(st.sampled_from(CASES), _OPTIONS, st.integers(0, 2 ** 16))
def test_corpus_kernels_stay_in_their_tensors(tmp_path_factory, case, options, seed):
    rng = np.random.default_rng(seed)
    cdef = tc.define(case.source)[case.entry].cdef
    args = _out_of_range_ids(cdef, case.inputs(rng), rng)
    _asan_check(tmp_path_factory.mktemp("asan"), cdef, args, options)


@settings(max_examples=8)
@given(programs(), _OPTIONS, st.integers(0, 2 ** 16))
def test_random_programs_stay_in_their_tensors(tmp_path_factory, prog, options, seed):
    src, dims, sizes = prog
    rng = np.random.default_rng(seed)
    args = [random_array(rng, tuple(sizes[d] for d in ds)) for ds in dims]
    _asan_check(tmp_path_factory.mktemp("asan"), tc.define(src).rnd.cdef, args, options)
