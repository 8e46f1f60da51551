"""The genetic search on a model target (exact, instant "runtimes"), then on real backends."""

import numpy as np
import pytest

from tfx_vec.tc_ops.autotune import genes_to_options, genetic_search, options_to_genes, search_space
from tfx_vec.tc_ops.errors import TcError
from tfx_vec.tc_ops.options import MappingOptions

REF = [np.arange(6, dtype=np.float32)]


class ModelTarget:
    """Runtime is a known function of the options; tile0 == 5 computes a wrong answer."""

    def __init__(self):
        self.compiled = []

    def compile(self, options):
        self.compiled.append(options)
        return options

    def run(self, o):
        secs = 1e-3 * (1 + abs(o.tile[0] - 16) + (o.fusion_strategy != "max") + o.unroll / 8)
        out = REF[0] + (1.0 if o.tile[0] == 5 else 0.0)
        return [out], secs


def test_search_improves_never_regresses_and_rejects_wrong_candidates():
    space = search_space("cpu", [40, 40])
    assert 5 in space["tile0"] and 16 in space["tile0"]  # ceil(40/8) and a power of two
    start = MappingOptions(tile=(2, 2), fusion_strategy="min", unroll=8)
    recorded = []
    target = ModelTarget()
    res = genetic_search(target, space, start, REF, generations=6, population=10, threads=2,
                         record=lambda o, s: recorded.append((o, s)), progress=False, seed=1)
    assert res.runtime <= res.start_runtime
    assert res.runtime < res.start_runtime  # the model's landscape is easy
    assert res.evaluated == len({o.to_json() for o in target.compiled})
    assert all(o.tile[0] != 5 for o, _ in recorded)  # wrong answers never recorded
    assert res.rejected == sum(o.tile[0] == 5 for o in {o.to_json(): o for o in
                                                          target.compiled}.values())
    assert [h[1] for h in res.history] == sorted([h[1] for h in res.history], reverse=True)


def test_result_is_the_start_when_nothing_beats_it():
    class Flat(ModelTarget):
        def run(self, o):
            return [REF[0]], (1e-3 if o.tile == (16, 16) else 2e-3)
    start = MappingOptions(tile=(16, 16))
    res = genetic_search(Flat(), search_space("cpu", [16, 16]), start, REF, generations=2,
                         population=4, progress=False)
    assert res.options == start and res.runtime == res.start_runtime


def test_genes_round_trip_and_bad_arguments():
    space = search_space("opencl", [64, 32, 8])
    o = MappingOptions(tile=(8, 4, 2), map_to_threads=(16, 4), map_to_blocks=(4, 8),
                       use_shared_memory=True, unroll=4)
    assert genes_to_options(options_to_genes(o, space)) == o
    with pytest.raises(TcError, match="population"):
        genetic_search(ModelTarget(), space, o, REF, population=1)
    with pytest.raises(TcError, match="mutation_rate"):
        genetic_search(ModelTarget(), space, o, REF, mutation_rate=2.0)
    bad_start = MappingOptions(tile=(5,))
    with pytest.raises(TcError, match="starting options"):
        genetic_search(ModelTarget(), search_space("cpu", [8]), bad_start, REF, progress=False)


TMM = "def tmm(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,kk) * B(n,kk) }"


@pytest.mark.parametrize("backend", ["cpu", "opencl"])
def test_autotune_a_tc_entry_fills_the_cache_and_never_regresses(backend, tmp_path):
    from tests.support import random_array, require
    from tfx_vec import tc_ops as tc
    from tfx_vec.tc_ops.autotune import autotune, cache_key_for, cached_options
    from tfx_vec.tc_ops.backends import opencl
    from tfx_vec.tc_ops.cache import CompilationCache

    if backend == "opencl":
        require(opencl.available(), "an OpenCL platform (pocl-opencl-icd)")
    rng = np.random.default_rng(0)
    A, B = random_array(rng, (24, 20)), random_array(rng, (28, 20))
    mod = tc.define(TMM, backend=backend)
    path = tmp_path / "tc.json"
    # start from the naive mapping: the result must beat or equal it
    res = autotune(mod.tmm, A, B, generations=2, population=4, cache=path, progress=False,
                   start=MappingOptions.naive())
    assert res.runtime <= res.start_runtime and res.evaluated >= 2 and res.rejected == 0
    cache = CompilationCache(path)
    entries = cache.lookup(cache_key_for(mod.tmm, [A, B], cache))
    assert entries and entries[0].runtime == pytest.approx(res.runtime)
    assert entries[0].source and "tc_tmm" in entries[0].source
    best = cached_options(mod.tmm, A, B, cache=path)
    assert best == res.options or entries[0].runtime <= res.runtime
    out = mod.tmm(A, B, options=best).numpy()
    np.testing.assert_allclose(out, A @ B.T, rtol=1e-4, atol=1e-4)


def test_define_with_cache_uses_the_tuned_options(tmp_path):
    from tests.support import random_array
    from tfx_vec import tc_ops as tc
    from tfx_vec.tc_ops.autotune import autotune, cache_key_for
    from tfx_vec.tc_ops.cache import CompilationCache

    rng = np.random.default_rng(7)
    A, B = random_array(rng, (12, 8)), random_array(rng, (10, 8))
    path = tmp_path / "tc.json"
    tuned = autotune(tc.define(TMM).tmm, A, B, generations=1, population=3, cache=path,
                     progress=False)
    # a module defined with the cache (renamed TC: the key templates names) picks them up
    mod = tc.define(TMM.replace("tmm", "mm2"), cache=str(path))
    out = mod.mm2(A, B).numpy()
    np.testing.assert_allclose(out, A @ B.T, rtol=1e-4, atol=1e-4)
    cache = CompilationCache(path)
    best = cache.best(cache_key_for(mod.mm2, [A, B], cache))
    assert best is not None and best.options == tuned.options.to_dict() or \
        best.runtime <= tuned.runtime
    assert mod.mm2.source().replace("mm2", "tmm") == best.source
