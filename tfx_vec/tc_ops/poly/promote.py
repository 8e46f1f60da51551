"""Shared-memory promotion of array tiles (paper §5.5).

With the tile coordinates as parameters ``_T0, _T1, ...`` (the instances of one tile, built by
``poly/mapping.py``), the *footprint* of a tensor is the set of its elements those instances read.
Its *array tile* is a constant-size box: per tensor dimension, an offset that is a (piecewise)
affine function of the tile coordinates (the footprint's minimum) and a size (the largest extent
over all tiles).

A tensor is promoted when
- it is only read (a TC input), so copies never need to be written back or merged;
- its array tile exists with finite sizes, and the sizes fit the remaining shared memory budget
  (greedy, in signature order: the paper's heuristic);
- its elements are reused (the access relation is not injective) or some access is not
  coalesced: stepping the variable that thread x follows by one does not step the innermost
  subscript by exactly one with the others fixed (:func:`coalesced`).
Data-dependent subscripts are over-approximated by the whole dimension (``poly/kernel.py``), so an
indirectly accessed array is promoted whole along those dimensions when it fits; the index
expression is then evaluated against the copy (offset 0), which is exact.

Example:
    >>> from tfx_vec.tc_ops.lang import parse
    >>> from tfx_vec.tc_ops.lang.sema import check
    >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
    >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
    >>> from tfx_vec.tc_ops.poly.mapping import map_to_gpu
    >>> from tfx_vec.tc_ops.options import MappingOptions
    >>> d = check(parse("def tmm(float(M,K) A, float(N,K) B) -> (C) "
    ...                 "{ C(m,n) +=! A(m,kk) * B(n,kk) }").defs[0])
    >>> k = build_kernel(d, infer_ranges(d, {"A": (40, 30), "B": (50, 30)}))
    >>> m = map_to_gpu(k, MappingOptions(tile=(16, 16, 8), map_to_threads=(16, 16),
    ...                                  use_shared_memory=True))
    >>> [(p.tensor, p.sizes) for p in m.kernels[0].promotions]
    [('A', (16, 8)), ('B', (16, 8))]
"""
from __future__ import annotations

import dataclasses

import islpy as isl

from ..lang.types import np_dtype
from .kernel import PolyKernel

__all__ = ["Promotion", "promote_shared", "footprint_box", "coalesced"]


@dataclasses.dataclass(frozen=True)
class Promotion:
    """A tensor copied to shared memory per tile: ``offsets`` are functions of the tile params.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
        >>> from tfx_vec.tc_ops.poly.mapping import map_to_gpu
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> d = check_program("def mm(float(M,K) A, float(K,N) B) -> (C) "
        ...                   "{ C(m,n) +=! A(m,k) * B(k,n) }")["mm"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (64, 32), "B": (32, 64)}))
        >>> p = map_to_gpu(k, MappingOptions(tile=(16, 16, 8), map_to_threads=(16, 16),
        ...                                  use_shared_memory=True)).kernels[0].promotions[0]
        >>> p.tensor, p.dtype, p.sizes
        ('A', 'float', (16, 8))
    """

    tensor: str
    dtype: str
    offsets: tuple[isl.PwAff, ...]
    sizes: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = np_dtype(self.dtype).itemsize
        for s in self.sizes:
            n *= s
        return n


def footprint_box(footprint: isl.Set, context: isl.Set
                  ) -> tuple[tuple[isl.PwAff, ...], tuple[int, ...]] | None:
    """(offsets, sizes) of the constant-size box covering the parametric ``footprint``.

    Example:
        >>> import islpy as isl
        >>> offsets, sizes = footprint_box(isl.Set("[t] -> { A[i] : t <= i < t + 4 }"),
        ...                                isl.Set("[t] -> { : 0 <= t < 100 }"))
        >>> str(offsets[0]), sizes
        ('[t] -> { [(t)] }', (4,))
    """
    offsets, sizes = [], []
    for d in range(footprint.dim(isl.dim_type.set)):
        lo, hi = footprint.dim_min(d), footprint.dim_max(d)
        width = hi.sub(lo).intersect_params(context).max_val()
        if not width.is_int():
            return None
        offsets.append(lo)
        sizes.append(int(width.to_python()) + 1)
    return tuple(offsets), tuple(sizes)


def promote_shared(kernel: PolyKernel, tile_domain: isl.UnionSet, context: isl.Set,
                   budget: int, x_vars: dict[str, int] | None = None) -> list[Promotion]:
    """The tensors to copy to shared memory for each tile (see module docstring).

    ``x_vars`` maps a statement to the position of its variable that thread x follows.

    Example:
        The GPU mapping calls it for each kernel with a tiled band
        (``poly/mapping.py``); its result is the kernel's ``promotions``:

        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
        >>> from tfx_vec.tc_ops.poly.mapping import map_to_gpu
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> d = check_program("def mm(float(M,K) A, float(K,N) B) -> (C) "
        ...                   "{ C(m,n) +=! A(m,k) * B(k,n) }")["mm"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (64, 32), "B": (32, 64)}))
        >>> g = map_to_gpu(k, MappingOptions(tile=(16, 16, 8), map_to_threads=(16, 16),
        ...                                  use_shared_memory=True), shared_budget=600)
        >>> [p.tensor for p in g.kernels[0].promotions]      # one 512-byte tile fits in 600
        ['A']
    """
    reads = kernel.reads.intersect_domain(kernel.domain)
    tile_reads = reads.intersect_domain(tile_domain)
    chosen, used = [], 0
    for p in kernel.cdef.inputs:
        shape = kernel.ranges.shapes.get(p.name)
        if p.is_scalar or not shape:
            continue
        space = isl.UnionSet(f"{{ {p.name}[{', '.join(f'o{i}' for i in range(len(shape)))}] }}",
                             context=kernel.ctx)
        acc = reads.intersect_range(space)
        if acc.is_empty():
            continue
        if acc.is_injective() and coalesced(acc, x_vars or {}):
            continue  # each element read once, and already coalesced: a copy would only cost
        fp = tile_reads.intersect_range(space).range()
        if fp.is_empty():
            continue
        box = footprint_box(isl.Set.from_union_set(fp), context)
        if box is None:
            continue
        promo = Promotion(p.name, p.dtype, box[0], box[1])
        if used + promo.nbytes > budget:
            continue
        chosen.append(promo)
        used += promo.nbytes
    return chosen


def coalesced(acc: isl.UnionMap, x_vars: dict[str, int]) -> bool:
    """Whether every access in ``acc`` reads consecutive elements along thread x.

    For statement ``S`` whose x-mapped loop follows variable ``v``, the accesses of ``S[..v..]``
    and ``S[..v+1..]`` must differ by exactly 1 in the innermost subscript and 0 elsewhere.
    A statement with no such variable (x follows a combination, or nothing is mapped) counts
    as coalesced: promotion is then decided on reuse alone.

    Example:
        >>> import islpy as isl
        >>> acc = isl.UnionMap("{ S[i, j] -> A[i, j] }")
        >>> coalesced(acc, {"S": 1}), coalesced(acc, {"S": 0})   # thread x follows j, then i
        (True, False)
    """
    maps = acc.get_map_list()
    for i in range(maps.n_map()):
        m = maps.get_at(i)
        name = m.get_tuple_name(isl.dim_type.in_)
        if name not in x_vars:
            continue
        n_in, n_out = m.dim(isl.dim_type.in_), m.dim(isl.dim_type.out)
        if n_out == 0:
            continue
        ins = [f"i{k}" for k in range(n_in)]
        nxt = [f"i{k} + 1" if k == x_vars[name] else f"i{k}" for k in range(n_in)]
        step = isl.Map(f"{{ {name}[{', '.join(ins)}] -> {name}[{', '.join(nxt)}] }}",
                       context=m.get_ctx())
        pairs = m.reverse().apply_range(step.apply_range(m))   # A(i) -> A(i + e_v)
        if pairs.is_empty():
            continue
        unit = isl.Set(f"{{ [{', '.join(['0'] * (n_out - 1) + ['1'])}] }}", context=m.get_ctx())
        deltas = pairs.deltas()
        if not deltas.is_equal(unit.set_tuple_id(deltas.get_tuple_id())
                               if deltas.has_tuple_id() else unit):
            return False
    return True
