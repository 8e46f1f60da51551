"""Autotuner: the paper's genetic search over MappingOptions (§6.2), feeding the cache (§6.1).

Each generation's candidates are *compiled in parallel threads* (the paper's "compilation jobs"),
then *profiled one at a time* on the device ("profiling jobs"); a candidate counts only if its
outputs match the naive kernel's (else its fitness is 0 and it is reported as rejected).  Fitness is
1/runtime; parents are drawn with probability proportional to fitness; a child takes each gene
from one of three parents (uniform three-parent crossover, with probability ``crossover_rate``,
otherwise it copies one parent); then every gene is re-drawn with probability ``mutation_rate``;
the ``elites`` best survive unchanged.  The result is the fastest measured candidate *including
the starting options*, so it is never slower than the start (as measured).  Every valid candidate
is recorded in the cache, which keeps the best k per key.

The search itself (:func:`genetic_search`) only talks to a :class:`TuningTarget`; ``autotune``
builds the target for a TC entry point on its backend.

Example::

    from tfx_vec import tc_ops as tc
    mod = tc.define(TMM_SOURCE, backend="opencl")
    best = tc.autotune(mod.tmm, A, B, generations=3, population=8, cache="tc_cache.json")
    C = mod.tmm(A, B, options=best.options)
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import platform
import random
import statistics
import time
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from .backends import cuda as cuda_backend
from .backends import opencl as opencl_backend
from .cache import CompilationCache
from .errors import TcError
from .lang.printer import def_to_tc
from .lang.types import np_dtype
from .options import FUSION_STRATEGIES, MappingOptions
from .pipeline import compile_def, host_arrays, infer, output_specs

__all__ = ["TuningTarget", "TuneResult", "genetic_search", "search_space", "genes_to_options",
           "options_to_genes", "autotune", "cached_options", "cache_key_for", "EntryTarget",
           "def_source"]


class TuningTarget(Protocol):
    """What the search needs from a kernel on a backend.

    Example:
        A target whose "kernel" is its options and whose run time falls with the first tile
        size (what :func:`genetic_search` sees of a real backend):

        >>> import numpy as np
        >>> class Toy:
        ...     def compile(self, options):
        ...         return options
        ...     def run(self, compiled):
        ...         return [np.zeros(1)], 1.0 / (compiled.tile[0] if compiled.tile else 1)
        >>> isinstance(Toy().run(Toy().compile(MappingOptions(tile=(4,))))[1], float)
        True
    """

    def compile(self, options: MappingOptions) -> Any:
        """Compile for ``options`` (called from several threads at once)."""

    def run(self, compiled: Any) -> tuple[list[np.ndarray], float]:
        """Run once on the tuning inputs: (outputs, seconds)."""


@dataclasses.dataclass
class TuneResult:
    """The outcome of a search; ``options`` is the best found (or the start).

    Example:
        >>> import numpy as np
        >>> class Toy:
        ...     def compile(self, options):
        ...         return options
        ...     def run(self, compiled):
        ...         return [np.zeros(1)], 1.0 / compiled.tile[0]
        >>> r = genetic_search(Toy(), {"tile0": [1, 2, 4, 8]}, MappingOptions(tile=(1,)),
        ...                    [np.zeros(1)], generations=2, population=4, progress=False)
        >>> r.runtime <= r.start_runtime, r.rejected
        (True, 0)
    """

    options: MappingOptions
    runtime: float
    start_runtime: float
    evaluated: int
    rejected: int
    seconds: float
    history: list[tuple[int, float]] = dataclasses.field(default_factory=list)

    @property
    def candidates_per_second(self) -> float:
        return self.evaluated / self.seconds if self.seconds > 0 else float("nan")


# -- the search space -------------------------------------------------------------------------
def _sizes(extent: int, cap: int = 512) -> list[int]:
    """Powers of two and ceil divisors of ``extent`` (the paper's tail-effect-avoiding choices)."""
    out = {min(extent, 2 ** k) for k in range(int(math.log2(max(extent, 1))) + 2)}
    out |= {-(-extent // k) for k in range(1, 9)}
    return sorted(v for v in out if 1 <= v <= cap)


def search_space(backend: str, extents: Sequence[int]) -> dict[str, list]:
    """Genes and their admissible values for loops of the given ``extents`` (outermost first).

    Example:
        >>> space = search_space("cpu", [128, 1024])
        >>> space["tile0"][:4], space["register_rows"], space["vector_width"]
        ([1, 2, 4, 8], [0, 4, 6, 8, 10, 12], [0, 16, 32, 64])
        >>> "use_shared_memory" in search_space("opencl", [64])
        True
    """
    genes: dict[str, list] = {}
    for k, e in enumerate(extents[:3]):
        genes[f"tile{k}"] = _sizes(e)
    genes["fusion_strategy"] = list(FUSION_STRATEGIES)
    genes["unroll"] = [1, 2, 4, 8]
    if backend == "cpu":
        genes["parallel"] = [0, 1, 2]
        genes["vectorize"] = [False, True]
        genes["block"] = [False, True]
        # the contraction micro-kernel's shape (0: chosen by the code generator)
        genes["register_rows"] = [0, 4, 6, 8, 10, 12]
        genes["register_vectors"] = [0, 1, 2, 3, 4]
        genes["cache_columns"] = [0, 64, 128, 256, 512]
        genes["cache_reduction"] = [0, 64, 128, 256, 512]
        genes["vector_width"] = [0, 16, 32, 64]
        return genes
    for k in range(min(len(extents), 2)):
        genes[f"threads{k}"] = [1, 2, 4, 8, 16, 32, 64]
        genes[f"blocks{k}"] = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    genes["use_shared_memory"] = [False, True]
    genes["use_private_memory"] = [False, True]
    genes["unroll_copy_shared"] = [False, True]
    return genes


def genes_to_options(genes: dict) -> MappingOptions:
    """Assemble MappingOptions from genes (raises TcOptionsError when they are invalid).

    Example:
        >>> o = genes_to_options({"tile0": 32, "tile1": 64, "register_rows": 6,
        ...                       "register_vectors": 2, "vector_width": 32})
        >>> o.tile, o.register_tile, o.vector_width
        ((32, 64), (6, 2), 32)
    """
    def seq(prefix: str) -> tuple[int, ...]:
        return tuple(genes[k] for k in sorted(g for g in genes if g.startswith(prefix)))
    kw = {k: v for k, v in genes.items()
          if not k.startswith(("tile", "threads", "blocks")) and k not in _PAIRS_OF}
    if seq("threads"):
        kw["map_to_threads"] = seq("threads")
        kw["map_to_blocks"] = seq("blocks")
    for field, (a, b) in _PAIRS.items():
        if a in genes:
            kw[field] = (genes[a], genes[b]) if genes[a] and genes[b] else ()
    return MappingOptions(tile=seq("tile"), **kw)


# option fields holding a pair, and the two genes that make them (0 in either: ())
_PAIRS = {"register_tile": ("register_rows", "register_vectors"),
          "cache_tile": ("cache_columns", "cache_reduction")}
_PAIRS_OF = {g: (f, k) for f, gs in _PAIRS.items() for k, g in enumerate(gs)}


def options_to_genes(opts: MappingOptions, space: dict[str, list]) -> dict:
    """The genes of ``opts`` (values outside the space are kept: the start must be reachable).

    Example:
        >>> space = search_space("cpu", [64, 64])
        >>> genes = options_to_genes(MappingOptions(tile=(16, 32), register_tile=(8, 2)), space)
        >>> genes["tile0"], genes["tile1"], genes["register_rows"], genes["register_vectors"]
        (16, 32, 8, 2)
        >>> genes_to_options(genes).register_tile
        (8, 2)
    """
    genes = {}
    for g in space:
        for prefix, field in (("tile", "tile"), ("threads", "map_to_threads"),
                              ("blocks", "map_to_blocks")):
            if g.startswith(prefix) and g[len(prefix):].isdigit():
                k, t = int(g[len(prefix):]), getattr(opts, field)
                genes[g] = t[k] if k < len(t) else (t[-1] if field == "tile" and t else 1)
                if field == "tile" and not t:
                    genes[g] = max(space[g])
                break
        else:
            if g in _PAIRS_OF:
                field, k = _PAIRS_OF[g]
                pair = getattr(opts, field)
                genes[g] = pair[k] if pair else 0
            else:
                genes[g] = getattr(opts, g)
    return genes


# -- the genetic search ------------------------------------------------------------------------
def _close(outs: list[np.ndarray], ref: list[np.ndarray]) -> bool:
    if len(outs) != len(ref):
        return False
    for o, r in zip(outs, ref):
        o, r = np.asarray(o), np.asarray(r)
        if o.shape != r.shape:
            return False
        tol = 1e-3 if r.dtype in (np.float32, np.float16) else 1e-9
        if r.dtype.kind in "fc":
            scale = max(1.0, float(np.abs(r).max(initial=0)))
            if not np.allclose(o, r, rtol=tol, atol=tol * scale):
                return False
        elif not np.array_equal(o, r):
            return False
    return True


def genetic_search(target: TuningTarget, space: dict[str, list], start: MappingOptions,
                   reference: list[np.ndarray], *, generations: int = 4, population: int = 8,
                   crossover_rate: float = 0.8, mutation_rate: float = 0.1, elites: int = 1,
                   threads: int = 2, time_budget: float | None = None, repeats: int = 3,
                   seed: int | None = 0, record: Callable[[MappingOptions, float], None] | None
                   = None, progress: bool = True, seeds: Sequence[MappingOptions] = ()
                   ) -> TuneResult:
    """Tune ``start`` on ``target``; see the module docstring for the algorithm.

    ``seeds`` (e.g. the cache's best entries) join the first generation after ``start``.

    Example:
        >>> import numpy as np
        >>> class Toy:                       # run time 1/tile: the largest tile is best
        ...     def compile(self, options):
        ...         return options
        ...     def run(self, compiled):
        ...         return [np.zeros(1)], 1.0 / compiled.tile[0]
        >>> r = genetic_search(Toy(), {"tile0": [1, 2, 4, 8]}, MappingOptions(tile=(1,)),
        ...                    [np.zeros(1)], generations=3, population=6, progress=False)
        >>> r.options.tile
        (8,)
    """
    for name, v, lo in (("generations", generations, 1), ("population", population, 2),
                        ("threads", threads, 1), ("repeats", repeats, 1)):
        if not isinstance(v, int) or v < lo:
            raise TcError(f"autotune: {name} must be an int >= {lo}, got {v!r}")
    for name, v in (("crossover_rate", crossover_rate), ("mutation_rate", mutation_rate)):
        if not 0.0 <= v <= 1.0:
            raise TcError(f"autotune: {name} must be in [0, 1], got {v!r}")
    if not 0 <= elites < population:
        raise TcError(f"autotune: elites must be in [0, population), got {elites!r}")
    rng = random.Random(seed)
    t0 = time.perf_counter()
    measured: dict[str, float] = {}        # options JSON -> seconds (inf = invalid/wrong)
    by_key: dict[str, MappingOptions] = {}
    rejected = 0
    history: list[tuple[int, float]] = []
    bar = _progress_bar(generations * population + 1, progress)

    def evaluate(batch: list[MappingOptions]) -> None:
        nonlocal rejected
        todo = [o for o in dict.fromkeys(batch) if o.to_json() not in measured]
        with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
            futures = [(o, pool.submit(target.compile, o)) for o in todo]
            for o, fut in futures:  # profile one at a time, in order, as compilations finish
                key = o.to_json()
                by_key[key] = o
                try:
                    compiled = fut.result()
                    outs, _ = target.run(compiled)  # warm-up, and the correctness check
                    if not _close(outs, reference):
                        raise _Wrong()
                    secs = statistics.median(target.run(compiled)[1] for _ in range(repeats))
                except (_Wrong, TcError):
                    secs = math.inf
                    rejected += 1
                measured[key] = secs
                if secs < math.inf and record is not None:
                    record(o, secs)
                bar.update(1)

    def fitness(o: MappingOptions) -> float:
        s = measured.get(o.to_json(), math.inf)
        return 0.0 if s == math.inf else 1.0 / max(s, 1e-12)

    def breed(parents: list[MappingOptions], weights: list[float]) -> MappingOptions | None:
        if rng.random() < crossover_rate:
            trio = [options_to_genes(p, space) for p in rng.choices(parents, weights, k=3)]
            genes = {g: rng.choice(trio)[g] for g in space}
        else:
            genes = options_to_genes(rng.choices(parents, weights, k=1)[0], space)
        for g, values in space.items():
            if rng.random() < mutation_rate:
                genes[g] = rng.choice(values)
        try:
            return genes_to_options(genes)
        except TcError:
            return None  # an invalid combination (e.g. too many threads): drawn again

    def random_options() -> MappingOptions | None:
        try:
            return genes_to_options({g: rng.choice(v) for g, v in space.items()})
        except TcError:
            return None

    evaluate([start])
    start_runtime = measured[start.to_json()]
    if start_runtime == math.inf:
        raise TcError("autotune: the starting options do not give the reference result")
    pop = list(dict.fromkeys([start, *seeds]))[:population]
    pop += [o for o in (random_options() for _ in range(4 * population)) if o][
        : population - len(pop)]
    for gen in range(generations):
        if time_budget is not None and time.perf_counter() - t0 > time_budget:
            break
        evaluate(pop)
        ranked = sorted(pop, key=fitness, reverse=True)
        best_now = min(measured.values())
        history.append((gen, best_now))
        weights = [fitness(o) for o in ranked]
        if not any(weights):
            weights = [1.0] * len(ranked)
        nxt = ranked[:elites]
        tries = 0
        while len(nxt) < population and tries < 20 * population:
            tries += 1
            child = breed(ranked, weights)
            if child is not None:
                nxt.append(child)
        pop = nxt
    bar.close()
    best_key = min(measured, key=measured.get)
    if measured[best_key] >= start_runtime:
        best_key = start.to_json()
    return TuneResult(by_key[best_key], measured[best_key], start_runtime, len(measured),
                      rejected, time.perf_counter() - t0, history)


class _Wrong(Exception):
    pass


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is in the [bench] extra; tuning works without a bar
        return _NoBar()
    return tqdm(total=total, desc="tc autotune", unit="cand", leave=False)


# -- TC entry points ---------------------------------------------------------------------------
def def_source(cdef: Any) -> str:
    """TC text of a checked def (for cache keys: names are templated by ``canonical_tc``).

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> print(def_source(check_program("def f(float(N) A)->(B){B(i)=A(i)}")["f"]))
        def f(float(N) A) -> (B) {
          B(i) = A(i)
        }
    """
    return def_to_tc(cdef.ast)


def device_name(backend: str) -> str:
    """The device a backend runs on (part of cache keys)."""
    if backend == "opencl":
        return opencl_backend.device_name()
    if backend == "cuda":
        return cuda_backend.cuda_runtime().name
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class EntryTarget:
    """:class:`TuningTarget` for a TC entry on its backend, at fixed inputs.

    Example:
        >>> import numpy as np
        >>> from tfx_vec import tc_ops as tc
        >>> mod = tc.define("def rs(float(N,K) A) -> (S) { S(n) +=! A(n,k) }")
        >>> t = EntryTarget(mod.rs, [np.ones((4, 3), np.float32)])
        >>> t.extents()
        [4, 3]
        >>> outs, seconds = t.run(t.compile(MappingOptions()))
        >>> outs[0].tolist()
        [3.0, 3.0, 3.0, 3.0]
    """

    def __init__(self, entry: Any, arrays: list[np.ndarray]):
        self.entry, self.arrays = entry, arrays
        cdef = entry.cdef
        params = cdef.inputs
        self.shapes = {p.name: a.shape for p, a in zip(params, arrays) if not p.is_scalar}
        self.scalars = {p.name: int(a) for p, a in zip(params, arrays)
                        if p.name in cdef.structural_scalars}
        self.values = {p.name: (int(a.min()), int(a.max())) if a.size else (0, 0)
                       for p, a in zip(params, arrays) if p.name in cdef.index_inputs} or None
        self.ranges = infer(cdef, self.shapes, self.scalars, self.values)
        self.sources: dict[str, str] = {}

    def extents(self) -> list[int]:
        """Loop extents of the deepest statement, outermost first (for the search space)."""
        best: list[int] = []
        for cs, sr in zip(self.entry.cdef.stmts, self.ranges.stmt_ranges):
            ext = [hi - lo for lo, hi in (sr[v] for v in cs.all_vars)]
            if len(ext) > len(best):
                best = ext
        return best or [1]

    def compile(self, options: MappingOptions) -> Any:
        kernel, _ = compile_def(self.entry.cdef, self.shapes, self.scalars, self.entry.backend,
                                options, self.values)
        self.sources[options.to_json()] = kernel.source
        return kernel

    def outputs(self) -> list[np.ndarray]:
        return [np.zeros(shape, dtype) for _, shape, dtype in
                output_specs(self.entry.cdef, self.ranges)]

    def run(self, kernel: Any) -> tuple[list[np.ndarray], float]:
        outs = self.outputs()
        if hasattr(kernel, "run_timed"):  # device time (OpenCL profiling events)
            secs = kernel.run_timed(self.arrays + outs)
        else:
            t0 = time.perf_counter()
            kernel.run(self.arrays + outs)
            secs = time.perf_counter() - t0
        return outs, secs


def _as_cache(cache: Any):
    if cache is None or isinstance(cache, CompilationCache):
        return cache
    return CompilationCache(cache)


def cache_key_for(entry: Any, inputs: Sequence[Any], cache: Any):
    """The cache key of ``entry`` on ``inputs`` (arrays or tensors: their shapes and dtypes),
    with the canonical TC, the backend and the device.

    Example:
        >>> import numpy as np
        >>> from tfx_vec import tc_ops as tc
        >>> mod = tc.define("def neg(float(N) A) -> (B) { B(i) = -A(i) }")
        >>> key = cache_key_for(mod.neg, [np.ones(8, np.float32)], tc.CompilationCache("c.json"))
        >>> key.backend, key.inputs
        ('cpu', (((8,), 'float32'),))
    """
    specs = _input_specs(entry, inputs)
    if specs is None:
        raise TcError(f"{entry.name}: the cache is keyed by fully known input shapes")
    return cache.key(def_source(entry.cdef), entry.name, specs, entry.backend,
                     device_name(entry.backend))


def _input_specs(entry: Any, inputs: Sequence[Any]) -> list[tuple] | None:
    """(shape, dtype) per input without reading values (symbolic tensors included); None when
    a shape is not fully known."""
    specs = []
    for p, x in zip(entry.cdef.inputs, inputs):
        shape = getattr(x, "shape", None)
        if shape is None:
            specs.append(((), np_dtype(p.dtype)))
            continue
        if hasattr(shape, "is_fully_defined"):
            if not shape.is_fully_defined():
                return None
            shape = tuple(int(d) for d in shape)
        dtype = getattr(x, "dtype", np_dtype(p.dtype))
        specs.append((tuple(shape), np.dtype(getattr(dtype, "as_numpy_dtype", dtype))))
    return specs


def cached_options(entry: Any, *inputs: Any, cache: Any) -> MappingOptions | None:
    """The best cached options for ``entry`` on inputs like ``inputs``, or None on a miss.

    Example:
        >>> import numpy as np
        >>> from tfx_vec import tc_ops as tc
        >>> mod = tc.define("def neg(float(N) A) -> (B) { B(i) = -A(i) }")
        >>> x = np.ones(8, np.float32)
        >>> cached_options(mod.neg, x, cache="empty.json") is None      # a miss
        True
        >>> cache = tc.CompilationCache("opts.json")
        >>> key = cache_key_for(mod.neg, [x], cache)
        >>> cache.record(key, MappingOptions(unroll=4).to_dict(), 1e-6)
        >>> cached_options(mod.neg, x, cache=cache).unroll
        4
    """
    cache = _as_cache(cache)
    if _input_specs(entry, inputs) is None:
        return None
    best = cache.best(cache_key_for(entry, inputs, cache))
    if best is None:
        return None
    try:
        return MappingOptions.from_dict(best.options)
    except TcError:
        return None  # written by another version of the options: ignore


def autotune(entry: Any, *inputs: Any, generations: int = 4, population: int = 8,
             crossover_rate: float = 0.8, mutation_rate: float = 0.1, elites: int = 1,
             threads: int = 2, time_budget: float | None = None, cache: Any = None,
             start: MappingOptions | None = None, repeats: int = 3, seed: int | None = 0,
             progress: bool = True) -> TuneResult:
    """Tune the mapping of ``entry`` (a ``tc.define`` entry point) on ``inputs``.

    Cuda/OpenCL tune the GPU mapping; cpu tunes tile sizes, the parallel loop, unrolling,
    vectorisation and the contraction micro-kernel's register tile, cache blocks and vector
    width.  Candidates are checked against the naive kernel's outputs.  ``cache`` (a path
    or :class:`~.cache.CompilationCache`) receives every valid candidate (best k kept per key),
    and its best entries for this key join the first generation.  Returns a :class:`TuneResult`
    whose ``options`` are never slower (as measured) than ``start`` (default: the entry's).

    Example:
        >>> import numpy as np
        >>> from tfx_vec import tc_ops as tc
        >>> mod = tc.define("def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }")
        >>> x = np.ones(64, np.float32)
        >>> best = tc.autotune(mod.add, x, x, generations=1, population=2, progress=False,
        ...                    cache="tuned.json")
        >>> best.runtime <= best.start_runtime
        True
        >>> tuned = tc.define("def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }",
        ...                   cache="tuned.json")          # calls use the cached best
        >>> tuned.add(x, x).numpy()[:3]
        array([2., 2., 2.], dtype=float32)
    """
    arrays = host_arrays(entry.cdef, inputs)
    target = EntryTarget(entry, arrays)
    reference = list(entry.run_numpy(*arrays, options=MappingOptions.naive()))
    space = search_space(entry.backend, target.extents())
    cache = _as_cache(cache)
    record: Callable[[MappingOptions, float], None] | None = None
    if cache is not None:
        key = cache_key_for(entry, arrays, cache)
        record = lambda o, secs: cache.record(  # noqa: E731
            key, o.to_dict(), secs, source=target.sources.get(o.to_json()))
    return genetic_search(target, space, start or entry.options, reference,
                          generations=generations, population=population,
                          crossover_rate=crossover_rate, mutation_rate=mutation_rate,
                          elites=elites, threads=threads, time_budget=time_budget,
                          repeats=repeats, seed=seed, record=record, progress=progress,
                          seeds=[MappingOptions.from_dict(e.options) for e in
                                 (cache.lookup(key) if cache is not None else [])
                                 if _valid_dict(e.options)])


def _valid_dict(d: dict) -> bool:
    try:
        MappingOptions.from_dict(d)
        return True
    except (TcError, TypeError):
        return False
