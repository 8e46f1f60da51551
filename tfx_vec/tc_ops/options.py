"""MappingOptions: every knob that changes the code a TC compiles to.

The GPU knobs are the paper's (§6.2: tile sizes, block and thread mapping, shared/private memory
promotion, unrolling, the fusion strategy of the isl scheduler); the CPU backend honours
``tile``, ``fusion_strategy``, ``unroll``, ``parallel`` (run the first coincident loop of the
outermost band with OpenMP threads), ``vectorize`` (``#pragma omp simd`` on innermost parallel
loops, vector accumulators and unroll-and-jam for reductions) and ``block`` (contractions as
register-blocked micro-kernels), whose shape ``register_tile``, ``cache_tile`` and
``vector_width`` set (chosen per TC and machine when left empty).

Options are frozen and validated on construction; ``to_json``/``from_json`` round-trip exactly,
so an options value can key a cache or be stored by the autotuner.

Example:
    >>> from tfx_vec.tc_ops.options import MappingOptions
    >>> o = MappingOptions(tile=(32, 32), fusion_strategy="max")
    >>> MappingOptions.from_json(o.to_json()) == o
    True
    >>> o.replace(unroll=4).unroll
    4
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from .errors import TcOptionsError

__all__ = ["MappingOptions", "FUSION_STRATEGIES"]

FUSION_STRATEGIES = ("max", "preserve3coincident", "min")


def _int_tuple(name: str, value: Any, *, allow_empty: bool, max_len: int | None = None
               ) -> tuple[int, ...]:
    try:
        t = tuple(value)
    except TypeError:
        raise TcOptionsError(f"MappingOptions.{name}: expected a sequence of positive ints, "
                             f"got {value!r}") from None
    if not allow_empty and not t:
        raise TcOptionsError(f"MappingOptions.{name}: expected at least one size, got ()")
    if max_len is not None and len(t) > max_len:
        raise TcOptionsError(f"MappingOptions.{name}: at most {max_len} sizes, got {len(t)}")
    for v in t:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TcOptionsError(f"MappingOptions.{name}: expected positive ints, got {value!r}")
    return t


@dataclasses.dataclass(frozen=True)
class MappingOptions:
    """How a TC is scheduled, tiled and mapped (all backends read the fields they honour).

    Attributes:
        tile: tile sizes of the outermost band, outermost first; ``()`` means no tiling.
            Members beyond the given sizes are not tiled.
        map_to_threads: GPU block sizes (x, y, z), at most 3.
        map_to_blocks: GPU grid sizes (x, y, z), at most 3.
        use_shared_memory: promote array tiles to GPU shared memory.
        use_private_memory: GPU: keep a thread's reduction in a register, and a thread's
            points of a contraction as a register tile (each row and column value read once
            per reduction step).
        unroll: unroll innermost loops by up to this factor (1 = no unrolling).
        unroll_copy_shared: also unroll the shared-memory copy loops.
        fusion_strategy: isl scheduler fusion: "max", "preserve3coincident" or "min".
        fix_parameters_before_scheduling: specialise sizes before scheduling (always done on CPU).
        parallel: CPU: 1 runs the first coincident loop of the outermost band with OpenMP
            threads (kernels with at least 4M statement instances); 0 = one thread.
        vectorize: CPU: ``#pragma omp simd`` on innermost coincident loops, vector
            accumulators and unroll-and-jam for innermost reductions, short reductions moved
            outside a unit-stride vector loop.
        block: CPU, with ``vectorize``: a contraction (two parallel loops around an innermost
            ``+=`` reduction whose factors split between them: tmm, fcrelu, MLP3, tbmm, conv)
            becomes a register-blocked micro-kernel (``codegen/contraction.py``), its band left
            untiled by the schedule (the micro-kernel blocks it for registers and caches).
        register_tile: CPU micro-kernel: (rows, column vectors) of sums kept in registers;
            ``()`` chooses from the vector width (e.g. 8 x 2 with 16-float vectors).
        cache_tile: CPU micro-kernel: (column block, reduction block) of the packed column
            operand (it stays in cache while every row block uses it); ``()``: (256, 256).
        vector_width: CPU micro-kernel vector bytes: 16, 32 or 64; 0 = the widest this
            machine has.

    Example:
        >>> o = MappingOptions(tile=(32, 32), register_tile=(6, 2), vector_width=32)
        >>> o.replace(unroll=4).unroll, MappingOptions.from_json(o.to_json()) == o
        (4, True)
        >>> MappingOptions.naive().vectorize
        False
    """

    tile: tuple[int, ...] = ()
    map_to_threads: tuple[int, ...] = (32,)
    map_to_blocks: tuple[int, ...] = (256,)
    use_shared_memory: bool = False
    use_private_memory: bool = False
    unroll: int = 1
    unroll_copy_shared: bool = False
    fusion_strategy: str = "max"
    fix_parameters_before_scheduling: bool = True
    parallel: int = 1
    vectorize: bool = True
    block: bool = True
    register_tile: tuple[int, ...] = ()
    cache_tile: tuple[int, ...] = ()
    vector_width: int = 0

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        set_("tile", _int_tuple("tile", self.tile, allow_empty=True))
        set_("map_to_threads", _int_tuple("map_to_threads", self.map_to_threads,
                                          allow_empty=False, max_len=3))
        set_("map_to_blocks", _int_tuple("map_to_blocks", self.map_to_blocks,
                                         allow_empty=False, max_len=3))
        for name, n_ in (("register_tile", 2), ("cache_tile", 2)):
            t = _int_tuple(name, getattr(self, name), allow_empty=True, max_len=n_)
            if t and len(t) != n_:
                raise TcOptionsError(f"MappingOptions.{name}: expected () or {n_} sizes, got {t}")
            set_(name, t)
        if self.register_tile and (self.register_tile[0] > 32 or self.register_tile[1] > 8):
            raise TcOptionsError(f"MappingOptions.register_tile: at most 32 rows and 8 vectors, "
                                 f"got {self.register_tile}")
        if self.vector_width not in (0, 16, 32, 64):
            raise TcOptionsError(f"MappingOptions.vector_width: expected 0, 16, 32 or 64 bytes, "
                                 f"got {self.vector_width!r}")
        for name in ("use_shared_memory", "use_private_memory", "unroll_copy_shared",
                     "fix_parameters_before_scheduling", "vectorize", "block"):
            if not isinstance(getattr(self, name), bool):
                raise TcOptionsError(f"MappingOptions.{name}: expected a bool, "
                                     f"got {getattr(self, name)!r}")
        for name, lo in (("unroll", 1), ("parallel", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise TcOptionsError(f"MappingOptions.{name}: expected an int >= {lo}, got {v!r}")
        if self.fusion_strategy not in FUSION_STRATEGIES:
            raise TcOptionsError(f"MappingOptions.fusion_strategy: expected one of "
                                 f"{', '.join(FUSION_STRATEGIES)}, got {self.fusion_strategy!r}")
        threads = 1
        for t in self.map_to_threads:
            threads *= t
        if threads > 1024:
            raise TcOptionsError(f"MappingOptions.map_to_threads: {self.map_to_threads} is "
                                 f"{threads} threads per block, more than 1024")

    # -- constructors --------------------------------------------------------------------
    @classmethod
    def naive(cls) -> "MappingOptions":
        """The "identity" mapping: no tiling, one thread, no fusion, sequential, no simd."""
        return cls(tile=(), map_to_threads=(1,), map_to_blocks=(1,), fusion_strategy="min",
                   parallel=0, vectorize=False)

    @classmethod
    def default_for(cls, tc_def: Any = None) -> "MappingOptions":
        """Sensible defaults for one TC definition (a ``lang.ast.Def`` or None).

        Tiles up to three outer loops by 32 (as deep as the TC's deepest statement), maps
        up to two dimensions to 32x8 threads, fuses maximally.
        """
        depth = 2
        if tc_def is not None:
            depth = max((len(s.index_vars()) for s in tc_def.stmts), default=1)
        depth = max(1, min(depth, 3))
        threads = (32, 8)[:min(depth, 2)]
        return cls(tile=(32,) * depth, map_to_threads=threads,
                   map_to_blocks=(256, 256)[:len(threads)], fusion_strategy="max")

    def replace(self, **changes: Any) -> "MappingOptions":
        """A copy with ``changes`` applied (validated)."""
        return dataclasses.replace(self, **changes)

    # -- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The fields as JSON data (tuples as lists).

        Example:
            >>> MappingOptions(tile=(8, 4)).to_dict()["tile"]
            [8, 4]
        """
        return {f.name: list(v) if isinstance(v, tuple) else v
                for f in dataclasses.fields(self) for v in [getattr(self, f.name)]}

    def to_json(self) -> str:
        """A canonical JSON string (sorted keys): equal options give equal strings.

        Computed once per options object (the TF op passes it on every call).

        Example:
            >>> MappingOptions(tile=(8,)).to_json() == MappingOptions(tile=(8,)).to_json()
            True
        """
        text = self.__dict__.get("_json")
        if text is None:
            text = json.dumps(self.to_dict(), sort_keys=True)
            object.__setattr__(self, "_json", text)     # frozen: a cache, not a field
        return text

    @classmethod
    def from_dict(cls, d: dict) -> "MappingOptions":
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TcOptionsError(f"MappingOptions: unknown option(s) {sorted(unknown)}")
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> "MappingOptions":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise TcOptionsError(f"MappingOptions.from_json: not JSON ({e})") from e
        if not isinstance(d, dict):
            raise TcOptionsError("MappingOptions.from_json: expected a JSON object")
        return cls.from_dict(d)
