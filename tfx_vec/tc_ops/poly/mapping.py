"""GPU mapping of a scheduled TC (paper §5.3-5.5): tile, map to blocks and threads, promote.

``map_to_gpu(kernel, options)`` takes the :class:`~.kernel.PolyKernel`, schedules it (isl's
scheduler with the options' fusion strategy, or the identity schedule for ``naive()``) and
returns a :class:`GpuMapping`: one :class:`GpuKernel` per schedule part (a single kernel when
the outermost band covers every statement; the children of top-level sequence/set nodes, nested
ones included, become kernels launched in order, so each kernel is one subtree whose statements
are all mapped).  Inside each kernel, following PPCG/TC:

1. the outermost band is tiled by ``options.tile`` (``poly/tile.py``; members beyond the given
   sizes are split off and run inside the point loops);
2. its leading coincident tile members are mapped to blocks and its innermost coincident point
   members to threads (``map_to_blocks``/``map_to_threads`` sizes, x = innermost), by inserting
   filters ``tile_j = b + nb * e`` above the tile band and ``point_j = t + nt * e`` above the point
   band (Figure 3e), so isl's AST generator writes strided loops over the block/thread ids;
   a kernel whose outer member carries a dependence runs as one thread (every instance is executed
   by exactly one thread, so a reduction never races);
3. with ``use_shared_memory``, ``poly/promote.py`` picks read-only arrays whose tile footprint has
   a fixed-size box and reuse and that fit the shared memory.  Such a kernel's tile loops become
   explicit (``GpuKernel.tile_loops``): the schedule is restricted to one tile whose coordinates
   are parameters ``_T0, _T1, ...``, and per tile the printer copies the array tiles in (all
   threads), places a barrier, runs the tile's instances, and a barrier before the next copy.

The printers (``codegen/opencl.py``, ``codegen/cuda.py``) turn each kernel's schedule into code.

Example:
    >>> from tfx_vec.tc_ops.lang import parse
    >>> from tfx_vec.tc_ops.lang.sema import check
    >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
    >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
    >>> from tfx_vec.tc_ops.options import MappingOptions
    >>> d = check(parse("def tmm(float(M,K) A, float(N,K) B) -> (C) "
    ...                 "{ C(m,n) +=! A(m,kk) * B(n,kk) }").defs[0])
    >>> k = build_kernel(d, infer_ranges(d, {"A": (40, 30), "B": (50, 30)}))
    >>> m = map_to_gpu(k, MappingOptions(tile=(16, 16, 8), map_to_threads=(8, 4),
    ...                                  map_to_blocks=(2, 2)))
    >>> [(g.grid, g.block) for g in m.kernels]
    [((2, 2), (8, 4))]
"""
from __future__ import annotations

import dataclasses

import islpy as isl

from ..options import MappingOptions
from .kernel import PolyKernel
from .promote import Promotion, promote_shared
from .tile import tile_band

__all__ = ["GpuKernel", "GpuMapping", "Launch", "map_to_gpu", "schedule_for", "BLOCK_IDS",
           "THREAD_IDS", "TileLoop"]

BLOCK_IDS = ("_b0", "_b1", "_b2")      # x, y, z: blockIdx / get_group_id
THREAD_IDS = ("_t0", "_t1", "_t2")     # x, y, z: threadIdx / get_local_id


@dataclasses.dataclass(frozen=True)
class TileLoop:
    """An explicit tile loop: ``param`` over [0, extent), from ``start`` by ``step``.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> d = check_program("def mm(float(M,K) A, float(K,N) B) -> (C) "
        ...                   "{ C(m,n) +=! A(m,k) * B(k,n) }")["mm"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (64, 32), "B": (32, 64)}))
        >>> g = map_to_gpu(k, MappingOptions(tile=(16, 16, 8), map_to_threads=(16, 16),
        ...                                  use_shared_memory=True))
        >>> g.kernels[0].tile_loops[0]     # the tiles of m, strided by the blocks
        TileLoop(param='_T0', extent=4, start='_b0', step=4)
    """

    param: str
    extent: int
    start: str        # "0" or a block id
    step: int


@dataclasses.dataclass
class GpuKernel:
    """One kernel launch: its mapped schedule, grid and block sizes (x first), promotions.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> d = check_program("def mm(float(M,K) A, float(K,N) B) -> (C) "
        ...                   "{ C(m,n) +=! A(m,k) * B(k,n) }")["mm"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (64, 32), "B": (32, 64)}))
        >>> g = map_to_gpu(k, MappingOptions(tile=(16, 16, 8), map_to_threads=(16, 16),
        ...                                  use_shared_memory=True))
        >>> gk = g.kernels[0]
        >>> gk.name, gk.block, [(p.tensor, p.sizes) for p in gk.promotions]
        ('tc_mm_k0', (16, 16), [('A', (16, 8)), ('B', (8, 16))])
    """

    name: str
    schedule: isl.Schedule
    grid: tuple[int, ...]
    block: tuple[int, ...]
    promotions: list[Promotion] = dataclasses.field(default_factory=list)
    tile_loops: list[TileLoop] = dataclasses.field(default_factory=list)

    @property
    def context(self) -> str:
        """isl text of the parameter context (0 <= id < size for every mapped id)."""
        ids = [f"0 <= {n} < {s}" for n, s in zip(BLOCK_IDS, self.grid)]
        ids += [f"0 <= {n} < {s}" for n, s in zip(THREAD_IDS, self.block)]
        ids += [f"0 <= {t.param} < {t.extent}" for t in self.tile_loops]
        names = list(BLOCK_IDS[:len(self.grid)]) + list(THREAD_IDS[:len(self.block)])
        names += [t.param for t in self.tile_loops]
        return f"[{', '.join(names)}] -> {{ : {' and '.join(ids) or 'true'} }}"


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch: global and local work sizes (x fastest), as OpenCL takes them; CUDA's
    grid is ``global // local`` per dimension.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> d = check_program("def mm(float(M,K) A, float(K,N) B) -> (C) "
        ...                   "{ C(m,n) +=! A(m,k) * B(k,n) }")["mm"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (4, 3), "B": (3, 5)}))
        >>> map_to_gpu(k, MappingOptions(tile=(2, 2), map_to_threads=(2, 2),
        ...                              map_to_blocks=(2, 2))).launches()
        [Launch(kernel='tc_mm_k0', global_size=(4, 4), local_size=(2, 2))]
    """

    kernel: str
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]


@dataclasses.dataclass
class GpuMapping:
    """A TC mapped to the GPU: its kernels, launched in order, under ``options``.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> d = check_program("def rs(float(N,K) A) -> (B) { B(n) +=! A(n,k) }")["rs"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (64, 8)}))
        >>> g = map_to_gpu(k, MappingOptions(tile=(16,), map_to_threads=(16,)))
        >>> [gk.name for gk in g.kernels]
        ['tc_rs_k0']
    """
    kernel: PolyKernel
    options: MappingOptions
    kernels: list[GpuKernel]

    def launches(self) -> list[Launch]:
        """The kernels' launches in order, grid and block padded to one rank."""
        out = []
        for gk in self.kernels:
            n = max(len(gk.grid), len(gk.block))
            grid = tuple(gk.grid) + (1,) * (n - len(gk.grid))
            block = tuple(gk.block) + (1,) * (n - len(gk.block))
            out.append(Launch(gk.name, tuple(g * b for g, b in zip(grid, block)), block))
        return out


def schedule_for(kernel: PolyKernel, options: MappingOptions) -> isl.Schedule:
    """The schedule the mapping starts from: identity for the naive options, else isl's.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> d = check_program("def neg(float(N) A) -> (B) { B(i) = -A(i) }")["neg"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (3,)}))
        >>> schedule_for(k, MappingOptions.naive()).get_root().child(0).get_type()
        schedule_node_type.band
    """
    if options == MappingOptions.naive():
        return kernel.identity_schedule()
    return kernel.isl_schedule(options)


def _is_split(node: isl.ScheduleNode) -> bool:
    return node.get_type() in (isl.schedule_node_type.sequence, isl.schedule_node_type.set)


def _parts(schedule: isl.Schedule) -> list[isl.UnionSet]:
    """Statement sets of the kernels, in launch order: one per leaf of the tree of sequence/set
    nodes at the top of the schedule (a sequence's children in order; a set's children are
    independent), else the whole domain.  Nested ones are split too: a part must be a single
    subtree, or the statements outside its first band would be dropped by the tile restriction
    of promotion, or run unmapped by every thread."""
    out: list[isl.UnionSet] = []

    def visit(node: isl.ScheduleNode) -> None:
        if not _is_split(node):
            out.append(node.get_domain())
            return
        for i in range(node.n_children()):
            below = node.child(i).child(0)   # a filter's own domain excludes its filter
            if not below.get_domain().is_empty():
                visit(below)

    visit(schedule.get_root().child(0))
    return out


def _part_root(schedule: isl.Schedule) -> isl.ScheduleNode:
    """The node under which a restricted schedule's single part lives (below every
    sequence/set whose other children the restriction emptied)."""
    node = schedule.get_root().child(0)
    while _is_split(node):
        live = [node.child(i).child(0) for i in range(node.n_children())
                if not node.child(i).child(0).get_domain().is_empty()]
        if len(live) != 1:
            raise AssertionError(f"schedule part spans {len(live)} subtrees")
        node = live[0]
    return node


def _coincident_prefix(node: isl.ScheduleNode) -> int:
    n = 0
    while n < node.band_n_member() and node.band_member_get_coincident(n):
        n += 1
    return n


def _residue_filter(node: isl.ScheduleNode, members: list[int], ids: list[str],
                    sizes: list[int]) -> isl.UnionSet:
    """Instances whose band member ``members[j]`` is ``ids[j]`` modulo ``sizes[j]`` (equal to it
    when the size is 0)."""
    mupa = node.band_get_partial_schedule()
    umap = isl.UnionMap.from_multi_union_pw_aff(mupa)
    n = node.band_n_member()
    outs = [f"s{i}" for i in range(n)]
    cons = [f"exists (e{j} : s{m} = {ids[j]} + {sizes[j]} * e{j})" if sizes[j]
            else f"s{m} = {ids[j]}" for j, m in enumerate(members)]
    params = ", ".join(ids)
    text = f"[{params}] -> {{ [{', '.join(outs)}] : {' and '.join(cons) or 'true'} }}"
    rng = isl.Set.read_from_str(node.get_ctx(), text)
    return umap.intersect_range(isl.UnionSet.from_set(rng)).domain()


def _x_vars(band_schedule: isl.MultiUnionPwAff, member: int) -> dict[str, int]:
    """Per statement, the position of the one variable that band ``member`` (the one mapped to
    thread x) follows, when it follows exactly one (for the coalescing test of promotion)."""
    out: dict[str, int] = {}
    pas = band_schedule.get_at(member).get_pw_aff_list()
    for i in range(pas.n_pw_aff()):
        pa = pas.get_at(i)
        if pa.n_piece() != 1:
            continue
        affs: list = []
        pa.foreach_piece(lambda _set, aff: affs.append(aff))
        aff = affs[0]
        n = aff.dim(isl.dim_type.in_)
        used = [k for k in range(n)
                if not aff.get_coefficient_val(isl.dim_type.in_, k).is_zero()]
        if len(used) == 1:
            out[pa.get_domain_space().get_tuple_name(isl.dim_type.set)] = used[0]
    return out


def _extent(node: isl.ScheduleNode, member: int, domain: isl.UnionSet) -> int:
    """Number of values band member ``member`` takes over ``domain`` (max + 1; they start at 0)."""
    upa = node.band_get_partial_schedule().get_at(member)
    vals = isl.UnionMap.from_union_pw_aff(upa).intersect_domain(domain).range()
    s = isl.Set.from_union_set(vals)
    return int(s.dim_max_val(0).to_python()) + 1


def _map_part(kernel: PolyKernel, schedule: isl.Schedule, options: MappingOptions, index: int,
              shared_budget: int) -> GpuKernel:
    name = f"tc_{kernel.cdef.name}_k{index}"
    node = _part_root(schedule)
    domain = schedule.get_domain()
    if node.get_type() != isl.schedule_node_type.band or _coincident_prefix(node) == 0:
        return GpuKernel(name, node.get_schedule(), (1,), (1,))  # sequential: one thread
    nc = _coincident_prefix(node)
    band_schedule = node.band_get_partial_schedule()  # before tiling: affine in the variables
    sizes = list(options.tile) or list(options.map_to_threads[:nc])
    tile_node, k = tile_band(node, sizes)
    n_blocks = min(nc, k, len(options.map_to_blocks), 3)
    n_threads = min(nc, k, len(options.map_to_threads), 3)
    point = tile_node.child(0)
    # member j of the band -> id dimension (n-1-j): the innermost mapped member is x
    grid = [0] * n_blocks
    for j in range(n_blocks):
        grid[n_blocks - 1 - j] = min(options.map_to_blocks[n_blocks - 1 - j],
                                     _extent(tile_node, j, domain))
    # threads take the innermost coincident tiled members (x the innermost: coalescing)
    first = min(nc, k) - n_threads
    t_members = [first + i for i in range(n_threads)]
    block = [0] * n_threads
    for i, j in enumerate(t_members):
        block[n_threads - 1 - i] = min(options.map_to_threads[n_threads - 1 - i], sizes[j])
    t_ids = [THREAD_IDS[n_threads - 1 - i] for i in range(n_threads)]
    t_filter = _residue_filter(point, t_members, t_ids,
                               [block[n_threads - 1 - i] for i in range(n_threads)])
    b_ids = [BLOCK_IDS[n_blocks - 1 - j] for j in range(n_blocks)]
    b_filter = _residue_filter(tile_node, list(range(n_blocks)), b_ids,
                               [grid[n_blocks - 1 - j] for j in range(n_blocks)])
    extents = [_extent(tile_node, j, domain) for j in range(k)]
    t_params = [f"_T{j}" for j in range(k)]
    tile_domain = _residue_filter(tile_node, list(range(k)), t_params, [0] * k)
    # insert bottom-up so the positions above stay valid
    point = point.insert_filter(t_filter)
    tile_node = point.parent().insert_filter(b_filter)
    gk = GpuKernel(name, tile_node.get_schedule(), tuple(grid), tuple(block))
    if options.use_shared_memory:
        ctx_set = isl.Set.read_from_str(kernel.ctx, f"[{', '.join(t_params)}] -> {{ : " + (
            " and ".join(f"0 <= {p} < {e}" for p, e in zip(t_params, extents))) + " }")
        x_vars = _x_vars(band_schedule, t_members[-1]) if n_threads else {}
        chosen = promote_shared(kernel, tile_domain, ctx_set, shared_budget, x_vars)
        if chosen:
            gk.promotions = chosen
            gk.schedule = gk.schedule.intersect_domain(tile_domain)
            member_block = {j: (BLOCK_IDS[n_blocks - 1 - j], grid[n_blocks - 1 - j])
                            for j in range(n_blocks)}
            gk.tile_loops = [TileLoop(t_params[j], extents[j], *member_block.get(j, ("0", 1)))
                             for j in range(k)]
    return gk


def map_to_gpu(kernel: PolyKernel, options: MappingOptions,
               shared_budget: int = 48 * 1024) -> GpuMapping:
    """Schedule, split into kernels, tile, map and promote ``kernel`` (see module docstring).

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> d = check_program("def add(float(N) A, float(N) B) -> (C) "
        ...                   "{ C(i) = A(i) + B(i) }")["add"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (100,), "B": (100,)}))
        >>> gk = map_to_gpu(k, MappingOptions(tile=(32,), map_to_threads=(32,))).kernels[0]
        >>> gk.grid, gk.block
        ((4,), (32,))
    """
    kernel.ctx.set_tile_scale_tile_loops(0)
    kernel.ctx.set_tile_shift_point_loops(1)
    schedule = schedule_for(kernel, options)
    kernels = []
    for i, part in enumerate(_parts(schedule)):
        kernels.append(_map_part(kernel, schedule.intersect_domain(part), options, i,
                                 shared_budget))
    return GpuMapping(kernel, options, kernels)
