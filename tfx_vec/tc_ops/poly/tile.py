"""Tiling of a schedule band for the GPU mapping (paper §5.3).

``tile_band(node, sizes)`` tiles the first ``len(sizes)`` members of a band (the rest is split
off into an inner band that runs inside the point loops: imperfectly nested tiling, Figure 3d)
and returns the tile band, whose only child is the point band.  Tile loops count tiles
(``floor(i / T)``, not ``T * floor(i / T)``) and point loops run from 0 to T - 1, which is what the
block/thread residue filters of ``poly/mapping.py`` are written against.

Example:
    >>> import islpy as isl
    >>> ctx = isl.Context()
    >>> _ = ctx.set_tile_scale_tile_loops(0), ctx.set_tile_shift_point_loops(1)
    >>> s = isl.Schedule.from_domain(isl.UnionSet("{ S[i, j] : 0 <= i < 10 and 0 <= j < 7 }"))
    >>> s = s.insert_partial_schedule(isl.MultiUnionPwAff("[{ S[i, j] -> [(i)] }, "
    ...                                                   "{ S[i, j] -> [(j)] }]"))
    >>> t, k = tile_band(s.get_root().child(0), [4])
    >>> k, t.band_n_member(), t.child(0).band_n_member(), t.child(0).child(0).band_n_member()
    (1, 1, 1, 1)
"""
from __future__ import annotations

import islpy as isl

__all__ = ["tile_band"]


def tile_band(node: isl.ScheduleNode, sizes) -> tuple[isl.ScheduleNode, int]:
    """Tile the leading ``len(sizes)`` members of the band at ``node``.

    Returns (tile band node, number of members tiled).  The context of ``node`` must have
    ``tile_scale_tile_loops = 0`` and ``tile_shift_point_loops = 1``.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
        >>> d = check_program("def add(float(M,N) A) -> (B) { B(m,n) = A(m,n) + 1 }")["add"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (32, 32)}))
        >>> band = k.identity_schedule().get_root().child(0)
        >>> node, tiled = tile_band(band, (8,))
        >>> tiled, node.band_n_member()
        (1, 1)
    """
    n = node.band_n_member()
    k = min(len(sizes), n)
    if k == 0:
        raise ValueError("tile_band: no tile sizes")
    if k < n:
        node = node.band_split(k)
    mv = isl.MultiVal.zero(node.band_get_space())
    for i in range(k):
        mv = mv.set_val(i, isl.Val.int_from_si(node.get_ctx(), int(sizes[i])))
    return node.band_tile(mv), k
