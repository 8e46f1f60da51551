"""Shared-memory promotion of array tiles (paper §5.5).

At a schedule position below the tile loops (the mark of ``poly/mapping.py``), the *footprint*
of a tensor is the set of its elements that the instances of one tile access: the prefix schedule
(tile coordinates -> instances) composed with the reads.  Its *array tile* is a constant-size
box: per tensor dimension, an offset that is a (piecewise) affine function of the tile
coordinates (the footprint's lexicographic minimum) and a size (the largest extent over all tiles).

A tensor is promoted when
- it is only read (a TC input), so copies never need to be written back or merged;
- its array tile exists with finite sizes, and the sizes fit the remaining shared memory budget
  (greedy, in signature order: the paper's heuristic);
- its elements are reused (the access relation is not injective).  The paper also promotes
  uncoalesced single-use accesses; that test is not implemented here.
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
    >>> [(p.tensor, p.sizes) for p in m.kernels[0].promotions["shared0"]]
    [('A', (16, 8)), ('B', (16, 8))]
"""
from __future__ import annotations

import dataclasses

import islpy as isl

from ..lang.types import np_dtype
from .kernel import PolyKernel

__all__ = ["Promotion", "promote_shared", "footprint_box"]


@dataclasses.dataclass(frozen=True)
class Promotion:
    """A tensor copied to shared memory at a mark: ``offsets`` live on the prefix schedule."""

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


def _single_map(umap: isl.UnionMap) -> isl.Map | None:
    maps = umap.get_map_list()
    n = maps.n_map()
    if n == 0:
        return None
    m = maps.get_at(0)
    for i in range(1, n):
        other = maps.get_at(i)
        if not other.get_space().is_equal(m.get_space()):
            return None
        m = m.union(other)
    return m


def footprint_box(footprint: isl.Map) -> tuple[tuple[isl.PwAff, ...], tuple[int, ...]] | None:
    """(offsets, sizes) of the constant-size box covering ``footprint`` per domain point."""
    n_out = footprint.dim(isl.dim_type.out)
    offsets, sizes = [], []
    for d in range(n_out):
        fd = footprint.project_out(isl.dim_type.out, d + 1, n_out - d - 1) \
                      .project_out(isl.dim_type.out, 0, d)
        lo = fd.lexmin_pw_multi_aff()
        hi = fd.lexmax_pw_multi_aff()
        if lo.n_piece() == 0:
            return None
        lo_pa, hi_pa = lo.get_pw_aff(0), hi.get_pw_aff(0)
        width = hi_pa.sub(lo_pa).max_val()
        if not width.is_int():
            return None
        offsets.append(lo_pa)
        sizes.append(int(width.to_python()) + 1)
    return tuple(offsets), tuple(sizes)


def promote_shared(kernel: PolyKernel, node: isl.ScheduleNode, threads_x: int,
                   budget: int) -> list[Promotion]:
    """The tensors to copy to shared memory at ``node`` (see module docstring)."""
    domain = node.get_domain()
    prefix = node.get_prefix_schedule_union_map().intersect_domain(domain)
    reads = kernel.reads.intersect_domain(domain)
    chosen, used = [], 0
    for p in kernel.cdef.inputs:
        if p.is_scalar:
            continue
        acc = reads.intersect_range(isl.UnionSet(
            f"{{ {p.name}[{', '.join(f'o{i}' for i in range(len(kernel.ranges.shapes[p.name])))}]"
            f" }}", context=kernel.ctx) if kernel.ranges.shapes[p.name] else
            isl.UnionSet(f"{{ {p.name}[] }}", context=kernel.ctx))
        if acc.is_empty():
            continue
        fp = _single_map(prefix.reverse().apply_range(acc))
        if fp is None:
            continue
        box = footprint_box(fp)
        if box is None:
            continue
        promo = Promotion(p.name, p.dtype, box[0], box[1])
        if used + promo.nbytes > budget:
            continue
        if acc.is_injective():
            continue  # each element read once per tile: a copy would only cost
        chosen.append(promo)
        used += promo.nbytes
    return chosen
