"""The polyhedral core: TC statements -> isl domains, accesses, dependences, schedules, AST.

``build_kernel(cdef, ranges)`` lowers a checked TC with concrete sizes (JIT per shape, so sizes are
constants, §5 footnote 5) to a :class:`PolyKernel`:

- one isl statement per TC statement (``S<k>``), plus ``S<k>_init`` for the initialising ``!``
  reductions (the neutral element is written before the reduction runs);
- iteration domains: the inferred rectangular ranges;
- access relations: affine subscripts exactly, data-dependent ones over-approximated by the
  whole tensor dimension;
- memory-based dependences (flow, anti, output) under the original statement order;
- the *identity* schedule (statements in source order, loops in index order, §4's "naive" reference)
  and isl's scheduler (validity = proximity = coincidence = all dependences) with the fusion
  strategy of :class:`~..options.MappingOptions`.

``annotate_cpu(schedule, options)`` tiles outermost bands, splits bands into single loops and
wraps each in a mark (``omp``: the OpenMP loop, ``simd``: a parallel loop, ``seq``: a loop
carrying a dependence) that printers read; ``build_ast`` runs isl's AST generator.

Example:
    >>> from tfx_vec.tc_ops.lang import parse
    >>> from tfx_vec.tc_ops.lang.sema import check
    >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
    >>> d = check(parse("def tmm(float(M,K) A, float(N,K) B) -> (C) "
    ...                 "{ C(m,n) +=! A(m,kk) * B(n,kk) }").defs[0])
    >>> k = build_kernel(d, infer_ranges(d, {"A": (4, 3), "B": (5, 3)}))
    >>> [s.name for s in k.stmts]
    ['S0_init', 'S0']
    >>> print(build_ast(k, k.identity_schedule()).to_C_str().splitlines()[1])
      for (int _c1 = 0; _c1 <= 3; _c1 += 1)
"""
from __future__ import annotations

import dataclasses
import re

import islpy as isl

from ..lang import ast as A
from ..lang.ranges import Ranges
from ..lang.sema import CheckedDef, CheckedStmt
from ..options import MappingOptions
from .contraction import has_contraction

__all__ = ["PolyStmt", "PolyKernel", "build_kernel", "affine_to_isl", "isl_name", "annotate_cpu",
           "build_ast", "MARK_OMP", "MARK_SIMD", "MARK_SEQ"]

MARK_OMP, MARK_SIMD, MARK_SEQ = "omp", "simd", "seq"


@dataclasses.dataclass(frozen=True)
class PolyStmt:
    """One isl statement: ``kind`` is "init" (write the neutral element), "assign" (``=``)
    or "update" (a reduction step ``lhs = lhs op rhs``).

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> d = check_program("def rs(float(N,K) A) -> (B) { B(n) +=! A(n,k) }")["rs"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (4, 3)}))
        >>> [(s.name, s.kind, s.vars) for s in k.stmts]
        [('S0_init', 'init', ('n',)), ('S0', 'update', ('n', 'k'))]
    """

    name: str
    kind: str
    tc: CheckedStmt
    vars: tuple[str, ...]
    ranges: tuple[tuple[int, int], ...]


@dataclasses.dataclass
class PolyKernel:
    """A TC definition lowered to isl at concrete sizes: statement domains, read and write access
    relations, the original (source-order) schedule and the dependences between instances.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> d = check_program("def rs(float(N,K) A) -> (B) { B(n) +=! A(n,k) }")["rs"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (4, 3)}))
        >>> print(k.domain)
        { S0_init[n] : 0 <= n <= 3; S0[n, k] : 0 <= n <= 3 and 0 <= k <= 2 }
    """
    cdef: CheckedDef
    ranges: Ranges
    ctx: isl.Context
    stmts: list
    domain: isl.UnionSet
    reads: isl.UnionMap
    writes: isl.UnionMap
    original: isl.UnionMap         # source order, as a schedule map
    deps: isl.UnionMap

    def stmt(self, name: str) -> PolyStmt:
        return next(s for s in self.stmts if s.name == name)

    def identity_schedule(self) -> isl.Schedule:
        """The naive schedule: statements in source order, loops in index order."""
        return isl.Schedule.from_domain(self.domain).insert_partial_schedule(
            isl.MultiUnionPwAff.from_union_map(self.original))

    def isl_schedule(self, options: MappingOptions | None = None) -> isl.Schedule:
        """isl's scheduler under the fusion strategy of ``options``."""
        options = options or MappingOptions()
        ctx = self.ctx
        ctx.set_schedule_serialize_sccs(1 if options.fusion_strategy == "min" else 0)
        ctx.set_schedule_maximize_coincidence(1 if options.fusion_strategy ==
                                              "preserve3coincident" else 0)
        ctx.set_schedule_outer_coincidence(1)
        ctx.set_schedule_treat_coalescing(1)
        sc = (isl.ScheduleConstraints.on_domain(self.domain).set_validity(self.deps)
              .set_proximity(self.deps).set_coincidence(self.deps))
        return sc.compute_schedule()


_ISL_KEYWORDS = {"and", "or", "not", "mod", "min", "max", "floor", "ceil", "exists", "true",
                 "false", "infty", "NaN", "domain", "range", "implies", "xor", "rat", "cond",
                 "select"}


def isl_name(name: str) -> str:
    """The isl identifier of a TC tensor or index name (TC allows "2LUT", "mod", ...).

    Example:
        >>> isl_name("A"), isl_name("2LUT"), isl_name("mod")
        ('A', '__tc_2LUT', '__tc_mod')
    """
    if name[0].isdigit() or name in _ISL_KEYWORDS or name.startswith("__tc_"):
        return "__tc_" + name
    return name


def affine_to_isl(e: A.Expr, consts: dict) -> str | None:
    """isl text of an affine subscript (sizes and scalars replaced by ``consts``), or None.

    Example:
        >>> from tfx_vec.tc_ops.lang.parser import parse_expr
        >>> affine_to_isl(parse_expr("i + N - 1"), {"N": 4}), affine_to_isl(parse_expr("I(i)"), {})
        ('((i + 4) - 1)', None)
    """
    if isinstance(e, A.IntLit):
        return str(e.value)
    if isinstance(e, A.Ident):
        return str(consts[e.name]) if e.name in consts else isl_name(e.name)
    if isinstance(e, A.Unary) and e.op in "+-":
        x = affine_to_isl(e.operand, consts)
        return None if x is None else f"({e.op}{x})"
    if isinstance(e, A.Binary) and e.op in ("+", "-", "*", "/", "%"):
        a, b = affine_to_isl(e.lhs, consts), affine_to_isl(e.rhs, consts)
        if a is None or b is None:
            return None
        if e.op in ("/", "%"):
            if not b.lstrip("-").isdigit() or int(b) <= 0:
                return None
            return f"floor(({a})/{b})" if e.op == "/" else f"(({a}) mod {b})"
        if e.op == "*" and not (a.lstrip("-").isdigit() or b.lstrip("-").isdigit()):
            return None
        return f"({a} {e.op} {b})"
    return None


def _box(names, ranges) -> str:
    return " and ".join(f"{lo} <= {v} < {hi}" for v, (lo, hi) in zip(names, ranges)) or "true"


def build_kernel(cdef: CheckedDef, ranges: Ranges) -> PolyKernel:
    """Lower ``cdef`` at the sizes of ``ranges`` to isl objects (see module docstring).

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> d = check_program("def sh(float(N) A) -> (B) "
        ...                   "{ B(i) = A(i + 1) where i in 0:N-1 }")["sh"]
        >>> print(build_kernel(d, infer_ranges(d, {"A": (5,)})).reads)
        { S0[i] -> A[1 + i] : 0 <= i <= 3 }
    """
    ctx = isl.Context()
    consts = dict(ranges.sizes)
    stmts: list[PolyStmt] = []
    dom, rd, wr, orig = [], [], [], []
    depth = max(len(cs.all_vars) for cs in cdef.stmts)
    shapes = ranges.shapes

    def whole(tup, tensor) -> str:
        outs = [f"__o{i}" for i in range(len(shapes[tensor]))]
        bounds = " and ".join(f"0 <= __o{i} < {n}" for i, n in enumerate(shapes[tensor]))
        return f"{tup} -> {isl_name(tensor)}[{', '.join(outs)}]" + \
            (f" : {bounds}" if bounds else "")

    def acc(tup, tensor, subs) -> str:
        # arrays are indexed from 0: a tensor whose range starts at o is shifted by -o
        subs = [x if not o else f"({x}) - {o}" for x, o in zip(subs, ranges.origin(tensor))]
        return f"{tup} -> {isl_name(tensor)}[{', '.join(subs)}]"

    for cs, sr in zip(cdef.stmts, ranges.stmt_ranges):
        s = cs.stmt
        parts = []
        if s.init:
            parts.append(("init", cs.lhs_vars))
        parts.append(("update" if cs.is_reduction else "assign", cs.all_vars))
        for kind, vars_ in parts:
            name = f"S{cs.index}" + ("_init" if kind == "init" else "")
            rr = tuple(sr[v] for v in vars_)
            stmts.append(PolyStmt(name, kind, cs, vars_, rr))
            ivars = [isl_name(v) for v in vars_]
            lhs_idx = [isl_name(v) for v in s.lhs_indices]
            tup = f"{name}[{', '.join(ivars)}]"
            dom.append(f"{tup} : {_box(ivars, rr)}")
            wr.append(acc(tup, s.lhs, lhs_idx))
            pos = 2 * cs.index + (0 if kind == "init" else 1)
            sched = [str(pos)] + ivars + ["0"] * (depth - len(vars_))
            orig.append(f"{tup} -> [{', '.join(sched)}]")
            if kind == "init":
                continue
            if kind == "update":
                rd.append(acc(tup, s.lhs, lhs_idx))
            for r in cs.reads:
                subs = [affine_to_isl(a, consts) for a in r.args]
                rd.append(whole(tup, r.name) if any(x is None for x in subs) else
                          acc(tup, r.name, subs))

    def umap(items):
        return isl.UnionMap.read_from_str(ctx, "{ " + "; ".join(items) + " }")

    domain = isl.UnionSet.read_from_str(ctx, "{ " + "; ".join(dom) + " }")
    reads, writes, original = umap(rd) if rd else isl.UnionMap.empty_ctx(ctx), umap(wr), umap(orig)
    reads, writes = reads.intersect_domain(domain), writes.intersect_domain(domain)
    original = original.intersect_domain(domain)
    before = original.lex_lt_union_map(original)
    deps = (writes.apply_range(reads.reverse())
            .union(reads.apply_range(writes.reverse()))
            .union(writes.apply_range(writes.reverse()))).intersect(before)
    return PolyKernel(cdef, ranges, ctx, stmts, domain, reads, writes, original, deps.coalesce())


# -- CPU schedule-tree annotation ----------------------------------------------------------
def _mark_chain(node: isl.ScheduleNode, omp_first: bool) -> tuple[isl.ScheduleNode, int]:
    """Split the chain of bands at ``node`` into one-member bands, each under a mark.

    Returns the node back at the original position and how many parallel (omp) marks were set.
    """
    ctx = node.get_ctx()
    levels, omp = 0, 0
    while node.get_type() == isl.schedule_node_type.band:
        if node.band_n_member() > 1:
            node = node.band_split(1)
        coincident = bool(node.band_member_get_coincident(0))
        if coincident and omp_first and omp == 0:
            kind = MARK_OMP
            omp = 1
        else:
            kind = MARK_SIMD if coincident else MARK_SEQ
            omp_first = False if not coincident and omp == 0 else omp_first
        node = node.insert_mark(isl.Id(kind, context=ctx)).child(0).child(0)
        levels += 2
    for _ in range(levels):
        node = node.parent()
    return node, omp


# reductions this short are cheaper run around a vector loop than as the vector loop itself
SHORT_REDUCTION = 64
_MIN_VECTOR_EXTENT = 8


def _extent(upa: isl.UnionPwAff, domain: isl.UnionSet) -> int | None:
    try:
        upa = upa.intersect_domain(domain)
        return int(upa.max_val().to_python()) - int(upa.min_val().to_python()) + 1
    except Exception:  # noqa: BLE001 - not a bounded constant range: no opinion
        return None


def _unit_stride(member: isl.UnionPwAff, reds: list) -> bool:
    """Does the band member run, in every reduction statement, over an index that only ever
    appears in the *last* subscript of that statement's accesses (so a vector loop over it reads
    and writes contiguous elements: conv's w, not tmm's n in ``B(n, kk)``)?"""
    text = member.to_str()
    for st in reds:
        m = re.search(rf"\b{st.name}\[[^\]]*\] -> \[\((\w+)\)\]", text)
        if m is None:
            return False
        var = next((v for v in st.vars if isl_name(v) == m.group(1)), None)
        if var is None:
            return False
        s = st.tc.stmt
        accesses = [tuple(A.Ident(v, s.span) for v in s.lhs_indices)] + \
            [r.args for r in st.tc.reads]
        for subs in accesses:
            for k, e in enumerate(subs):
                uses = any(isinstance(x, A.Ident) and x.name == var for x in A.walk(e))
                if uses and k != len(subs) - 1:
                    return False
    return True


def sink_vector_loop(schedule: isl.Schedule, kernel: PolyKernel) -> isl.Schedule:
    """Conv-like TCs: when every reduction is short (c, kh, kw), sink the last coincident member
    of the outermost band (w) below everything else, so the innermost loop is a long parallel
    (vector) loop instead of a 3-iteration reduction.

    Sinking a parallel loop below other loops is always valid (§5.3: it carries no dependence).
    """
    reds = [s for s in kernel.stmts if s.kind == "update"]
    if not reds:
        return schedule
    for s in reds:
        n_red = 1
        for v, (lo, hi) in zip(s.vars, s.ranges):
            if v in s.tc.red_vars:
                n_red *= hi - lo
        if n_red > SHORT_REDUCTION:
            return schedule
    node = schedule.get_root().child(0)
    if node.get_type() != isl.schedule_node_type.band:
        return schedule
    n = node.band_n_member()
    coinc = [bool(node.band_member_get_coincident(i)) for i in range(n)]
    par = [i for i in range(n) if coinc[i]]
    if len(par) < 2 or par != list(range(len(par))):
        return schedule
    last = par[-1]
    member = node.band_get_partial_schedule().get_at(last)
    ext = _extent(member, node.get_domain())
    if ext is None or ext < _MIN_VECTOR_EXTENT or not _unit_stride(member, reds):
        return schedule
    if last < n - 1:
        node = node.band_split(last + 1)
    node = node.band_split(last).child(0)
    return node.band_sink().get_schedule()


def _member_vars(member: isl.UnionPwAff, st: PolyStmt) -> set | None:
    """The TC index variables of ``st`` that a band member's expression uses (None: the member
    does not schedule ``st``)."""
    m = re.search(rf"\b{st.name}\[[^\]]*\] -> \[([^\]]*)\]", member.to_str())
    if m is None:
        return None
    idents = set(re.findall(r"[A-Za-z_]\w*", m.group(1)))
    return {v for v in st.vars if isl_name(v) in idents}


def annotate_cpu(schedule: isl.Schedule, options: MappingOptions,
                 kernel: PolyKernel | None = None) -> isl.Schedule:
    """Tile outermost permutable bands by ``options.tile`` and mark every loop for the printer.

    With ``kernel`` given and ``options.vectorize``, short-reduction TCs first get their vector
    loop sunk innermost (:func:`sink_vector_loop`); a TC with a contraction
    (``poly/contraction.py``) keeps its bands untiled when ``options.block`` is set: the
    printer's micro-kernel blocks the contraction for registers and caches itself.
    The first coincident loop of an outermost band gets the ``omp`` mark when
    ``options.parallel`` is set (only if no sequential loop is outside it), other coincident
    loops ``simd``, dependence-carrying loops ``seq``.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> d = check_program("def add(float(M,N) A, float(M,N) B) -> (C) "
        ...                   "{ C(m,n) = A(m,n) + B(m,n) }")["add"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (4, 8), "B": (4, 8)}))
        >>> from tfx_vec.tc_ops.poly.mapping import schedule_for
        >>> s = annotate_cpu(schedule_for(k, MappingOptions()), MappingOptions(), k)
        >>> code = build_ast(k, s).to_C_str()
        >>> code.split()[:2]          # the outer loop is marked for OpenMP, the inner for simd
        ['//', 'omp']
    """
    micro = kernel is not None and options.vectorize and options.block and \
        has_contraction(kernel.cdef)

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.get_type() != isl.schedule_node_type.band:
            return node
        outer = node.get_schedule_depth() == 0
        n = node.band_n_member()
        tile = () if micro else options.tile
        if outer and tile and (node.band_get_permutable() or n == 1):
            k = min(len(tile), n)
            if n > k:
                node = node.band_split(k)
            space = node.band_get_space()
            mv = isl.MultiVal.zero(space)
            for i in range(k):
                mv = mv.set_val(i, isl.Val.int_from_si(node.get_ctx(), tile[i]))
            node = node.band_tile(mv)
        node, _ = _mark_chain(node, outer and options.parallel > 0)
        return node

    if kernel is not None and options.vectorize and not micro:
        schedule = sink_vector_loop(schedule, kernel)
    return schedule.get_root().map_descendant_bottom_up(visit).get_schedule()


def build_ast(kernel: PolyKernel, schedule: isl.Schedule) -> isl.AstNode:
    """isl's AST for ``schedule``; loop iterators are named ``_c0``, ``_c1``, ...

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> d = check_program("def neg(float(N) A) -> (B) { B(i) = -A(i) }")["neg"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (3,)}))
        >>> print(build_ast(k, k.identity_schedule()).to_C_str().strip())
        for (int _c1 = 0; _c1 <= 2; _c1 += 1)
          S0(_c1);
    """
    ctx = kernel.ctx
    build = isl.AstBuild.from_context(isl.Set.read_from_str(ctx, "{ : }"))
    its = isl.IdList.alloc(ctx, 0)
    for i in range(64):
        its = its.add(isl.Id(f"_c{i}", context=ctx))
    build = build.set_iterators(its)
    return build.node_from_schedule(schedule)
