"""The CPU micro-kernel: a contraction's loop nest printed as register-blocked vector code.

:func:`match` recognises, in the isl AST, two coincident loops ``i1 { [middle loops] { i2 {
pre; r... { S += row * col }; post } } }`` around an innermost nest of reduction loops whose
statement splits into row and column factors (``poly/contraction.py``); :func:`emit` prints it
the way BLIS blocks a matrix product:

- the sums of ``MR`` rows x ``NV`` vectors of columns stay in vector registers for the whole
  reduction: per reduction step, ``NV`` vector loads of the column operand, ``MR`` broadcasts of
  the row operand and ``MR x NV`` fused multiply-adds;
- *packed* (one reduction index): the column operand's values over a block of ``NC`` columns
  and ``KC`` reduction steps are copied once into a buffer laid out in ``NR``-wide panels
  (``NR = NV`` vectors, zero-padded), read contiguously by every row block (tmm's ``B(n,kk)`` is
  transposed on the way); the block loop over columns is the OpenMP loop;
- *direct* (several reduction indices, conv's ``c, kh, kw``): the column operand is already
  contiguous along the columns (``I(..., w + kw)``) and loaded in place; a last partial column
  tile overlaps the one before it when every statement of the tile rewrites its elements from
  scratch (same values written twice), else runs as scalar code;
- the statements before and after the reduction (bias initialisation, ``fmaxf`` ReLU, ``+ B``)
  run over each ``MR x NR`` tile while it is in L1: the epilogue is fused into the kernel.

Legal because ``i1``, the middle loops and ``i2`` are coincident (independent iterations,
reorderable and tileable at will) and each sum still adds its terms in reduction order within a
block (``-fassociative-math`` lets the compiler and us reassociate across blocks, which TC's
reduction semantics permits).  The shape comes from ``MappingOptions`` (``register_tile``,
``cache_tile``, ``vector_width``), chosen here when left empty.

Example:
    >>> from tfx_vec.tc_ops.backends.cpu import generate
    >>> import numpy as np
    >>> src, _ = generate("def tmm(float(M,K) A, float(N,K) B) -> (C) "
    ...                   "{ C(m,n) +=! A(m,kk) * B(n,kk) }",
    ...                   "tmm", [((64, 32), np.float32), ((48, 32), np.float32)])
    >>> "register-blocked contraction micro-kernel" in src
    True
"""
from __future__ import annotations

import dataclasses
import functools
import re

import islpy as isl

from ..lang import ast as A
from ..poly.contraction import Split, classify, contiguous
from ..poly.kernel import MARK_OMP, MARK_SIMD, PolyStmt
from .cnames import c_name as _c

__all__ = ["Match", "match", "emit", "work", "machine_vector_bytes", "PARALLEL_MIN_WORK"]

#: Multiply-adds below which a contraction runs on one thread: a parallel region's start and end
#: cost more than they save there (a 128 x 512 -> 128 layer, 8M, runs in about 0.1 ms).
PARALLEL_MIN_WORK = 1 << 25


@functools.lru_cache(maxsize=1)
def machine_vector_bytes() -> int:
    """The widest SIMD registers of this CPU (what ``-march=native`` compiles for): 64 with
    AVX-512, 32 with AVX, else 16.

    Example:
        >>> machine_vector_bytes() in (16, 32, 64)
        True
    """
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        flags = []
    if "avx512f" in flags:
        return 64
    return 32 if "avx" in flags else 16


@dataclasses.dataclass
class Match:
    """A contraction nest of the AST, with everything :func:`emit` needs.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel, annotate_cpu, build_ast
        >>> from tfx_vec.tc_ops.poly.mapping import schedule_for
        >>> from tfx_vec.tc_ops.codegen.c import CPrinter
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> d = check_program("def tmm(float(M,K) A, float(N,K) B) -> (C) "
        ...                   "{ C(m,n) +=! A(m,kk) * B(n,kk) }")["tmm"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (64, 32), "B": (48, 32)}))
        >>> ast = build_ast(k, annotate_cpu(schedule_for(k, MappingOptions()), MappingOptions(), k))
        >>> loop, mark = ast.mark_get_node(), ast.mark_get_id().get_name()
        >>> m = match(CPrinter(k, MappingOptions()), loop, mark)
        >>> m.var1, m.var2, m.packed, [str(f.name) for f in m.split.col]
        ('m', 'n', True, ['B'])
    """

    chain: list           # i1, middle loops..., i2 (isl for-nodes)
    reds: list            # reduction loops, outermost first
    pre: list             # user nodes before / after the reduction nest in i2's body
    post: list
    st: PolyStmt
    bind: dict            # TC variable -> C expression (of the AST iterators)
    var1: str
    var2: str
    split: Split
    packed: bool
    overlap: bool         # a partial last column tile may overlap the previous one

    @property
    def its(self) -> list[str]:
        return [_it(n) for n in self.chain + self.reds]


def _it(node: isl.AstNode) -> str:
    return node.for_get_iterator().to_C_str()


def _const_bounds(node: isl.AstNode) -> tuple[int, int] | None:
    """(first, last) of a unit-step loop ``it = a; it <= b`` / ``it < b`` with integer
    constants, else None."""
    it, cond = _it(node), node.for_get_cond()
    if node.for_get_inc().to_C_str() != "1" or cond.get_type() != isl.ast_expr_type.op or \
            cond.op_get_arg(0).to_C_str() != it:
        return None
    op, bound = cond.op_get_type(), cond.op_get_arg(1).to_C_str()
    init = node.for_get_init().to_C_str()
    if op not in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt) or \
            not init.lstrip("-").isdigit() or not bound.lstrip("-").isdigit():
        return None
    return int(init), int(bound) - (op == isl.ast_expr_op_type.lt)


def _unmark(node: isl.AstNode):
    name = None
    while node.get_type() == isl.ast_node_type.mark:
        name = node.mark_get_id().get_name()
        node = node.mark_get_node()
    return name, node


def _leaves(node: isl.AstNode) -> list:
    t = node.get_type()
    if t == isl.ast_node_type.mark:
        return _leaves(node.mark_get_node())
    if t == isl.ast_node_type.block:
        lst = node.block_get_children()
        return [x for i in range(lst.n_ast_node()) for x in _leaves(lst.get_at(i))]
    return [node]


def _user_stmt(printer, node: isl.AstNode) -> tuple[PolyStmt, list[str]]:
    expr = node.user_get_expr()
    st = printer.k.stmt(expr.op_get_arg(0).get_id().get_name())
    return st, [expr.op_get_arg(i + 1).to_C_str() for i in range(expr.op_get_n_arg() - 1)]


def match(printer, node: isl.AstNode, mark: str | None) -> Match | None:
    """The contraction whose row loop is ``node``, or None (see module docstring).

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel, annotate_cpu, build_ast
        >>> from tfx_vec.tc_ops.poly.mapping import schedule_for
        >>> from tfx_vec.tc_ops.codegen.c import CPrinter
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> d = check_program("def add(float(M,N) A, float(M,N) B) -> (C) "
        ...                   "{ C(m,n) = A(m,n) + B(m,n) }")["add"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (8, 8), "B": (8, 8)}))
        >>> ast = build_ast(k, annotate_cpu(schedule_for(k, MappingOptions()), MappingOptions(), k))
        >>> match(CPrinter(k), ast.mark_get_node(), ast.mark_get_id().get_name()) is None
        True
    """
    o = printer.options
    if mark not in (MARK_OMP, MARK_SIMD) or not (o.vectorize and o.block):
        return None
    chain = [node]
    while True:
        m, child = _unmark(chain[-1].for_get_body())
        if m != MARK_SIMD or child.get_type() != isl.ast_node_type.for_:
            break
        chain.append(child)
    if len(chain) < 2:
        return None
    leaves = _leaves(chain[-1].for_get_body())
    loops = [n for n in leaves if n.get_type() == isl.ast_node_type.for_]
    if len(loops) != 1 or any(n.get_type() != isl.ast_node_type.user
                              for n in leaves if n is not loops[0]):
        return None
    reds, cur = [], loops[0]
    while True:
        reds.append(cur)
        _, body = _unmark(cur.for_get_body())
        if body.get_type() == isl.ast_node_type.for_:
            cur = body
            continue
        if body.get_type() != isl.ast_node_type.user:
            return None
        break
    if any(_const_bounds(n) is None for n in chain + reds):
        return None
    st, args = _user_stmt(printer, body)
    if st.kind != "update":
        return None
    bind = dict(zip(st.vars, args))
    its = [_it(n) for n in chain + reds]
    owner = {}
    for v, b in bind.items():
        if b in its:
            owner[v] = b
        elif any(_word(b, i) for i in its):
            return None               # a skewed or shifted binding: not a plain nest
    it1, it2 = _it(chain[0]), _it(chain[-1])
    var1 = next((v for v in st.tc.lhs_vars if owner.get(v) == it1), None)
    var2 = next((v for v in st.tc.lhs_vars if owner.get(v) == it2), None)
    red_its = {_it(n) for n in reds}
    if var1 is None or var2 is None or any(owner.get(v) not in red_its
                                           for v in st.tc.red_vars):
        return None
    if any(owner.get(v) in red_its for v in st.tc.lhs_vars):
        return None
    split = classify(printer.cdef, st.tc, var1, var2)
    if split is None:
        return None
    at = next(k for k, n in enumerate(leaves) if n.get_type() == isl.ast_node_type.for_)
    pre, post = leaves[:at], leaves[at + 1:]
    if any(_user_stmt(printer, n)[0].tc.stmt.lhs != st.tc.stmt.lhs for n in pre + post):
        return None
    overlap = bool(pre) and _rewrites(printer, pre[0], st)
    packed = split.packable and len(reds) == 1
    if not packed and not split.direct:
        return None
    return Match(chain, reds, pre, post, st, bind, var1, var2, split, packed, overlap)


def _word(text: str, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", text) is not None


def _rewrites(printer, node: isl.AstNode, st: PolyStmt) -> bool:
    """Does the statement at ``node`` set every element of the tile from scratch (an init, or
    an assignment whose right side does not read the tensor)?"""
    pre, _ = _user_stmt(printer, node)
    s = pre.tc.stmt
    if pre.kind == "init":
        return True
    return pre.kind == "assign" and not any(isinstance(x, A.Call) and x.name == s.lhs
                                            for x in A.walk(s.rhs))


@dataclasses.dataclass(frozen=True)
class Shape:
    """The kernel's blocking: ``mr`` rows x ``nv`` vectors of ``lanes`` columns; packed
    column blocks of ``nc`` columns x ``kc`` reduction steps."""

    mr: int
    nv: int
    lanes: int
    vbytes: int
    nc: int
    kc: int

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


def work(m: Match) -> int:
    """Multiply-adds of the matched nest (its loops' trip counts multiplied).

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel, annotate_cpu, build_ast
        >>> from tfx_vec.tc_ops.poly.mapping import schedule_for
        >>> from tfx_vec.tc_ops.codegen.c import CPrinter
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> d = check_program("def tmm(float(M,K) A, float(N,K) B) -> (C) "
        ...                   "{ C(m,n) +=! A(m,kk) * B(n,kk) }")["tmm"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (64, 32), "B": (48, 32)}))
        >>> ast = build_ast(k, annotate_cpu(schedule_for(k, MappingOptions()), MappingOptions(), k))
        >>> loop, mark = ast.mark_get_node(), ast.mark_get_id().get_name()
        >>> work(match(CPrinter(k, MappingOptions()), loop, mark))
        98304
    """
    n = 1
    for node in m.chain + m.reds:
        lo, last = _const_bounds(node)
        n *= last - lo + 1
    return n


def choose_shape(printer, m: Match) -> Shape | None:
    """The options' register/cache tiles, or ones chosen for this nest and machine."""
    o = printer.options
    tsize = 4 if m.st.tc.dtype == "float" else 8
    (lo1, last1), (lo2, last2) = _const_bounds(m.chain[0]), _const_bounds(m.chain[-1])
    ext1, ext2 = last1 - lo1 + 1, last2 - lo2 + 1
    vbytes = o.vector_width or printer.vector_bytes or machine_vector_bytes()
    if not m.packed:            # direct loads need whole vectors inside the columns
        while vbytes > 16 and vbytes // tsize > ext2:
            vbytes //= 2
        if vbytes // tsize > ext2:
            return None
    lanes = vbytes // tsize
    regs = 32 if vbytes == 64 else 16
    if o.register_tile:
        mr, nv = o.register_tile
    else:
        nv = 2 if vbytes >= 32 or ext2 > lanes else 1
        nv = max(1, min(nv, -(-ext2 // lanes) if m.packed else ext2 // lanes))
        mr_max = min(12, (regs - nv - 2) // nv)
        mr = next((r for r in range(mr_max, max(1, mr_max // 2) - 1, -1) if ext1 % r == 0),
                  mr_max)
    mr = max(1, min(mr, ext1))
    nr = nv * lanes
    nc, kc = o.cache_tile or (256, 256)
    if m.packed and o.parallel and not o.cache_tile and work(m) >= PARALLEL_MIN_WORK:
        nc = min(nc, max(nr, -(-ext2 // 4)))          # at least 4 column blocks to share
    nc = max(nr, -(-nc // nr) * nr)
    return Shape(mr, nv, lanes, vbytes, nc, kc)


def emit(printer, m: Match, ind: int, parallel: bool) -> list[str]:
    """C for the matched nest (see module docstring); ``parallel``: run its outermost block
    loop with OpenMP threads.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel, annotate_cpu, build_ast
        >>> from tfx_vec.tc_ops.poly.mapping import schedule_for
        >>> from tfx_vec.tc_ops.codegen.c import CPrinter
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> d = check_program("def tmm(float(M,K) A, float(N,K) B) -> (C) "
        ...                   "{ C(m,n) +=! A(m,kk) * B(n,kk) }")["tmm"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (64, 32), "B": (48, 32)}))
        >>> opts = MappingOptions(register_tile=(4, 2), vector_width=32)   # 4 rows x 2 vectors of 8
        >>> ast = build_ast(k, annotate_cpu(schedule_for(k, opts), opts, k))
        >>> printer = CPrinter(k, opts)
        >>> m = match(printer, ast.mark_get_node(), ast.mark_get_id().get_name())
        >>> emit(printer, m, 1, parallel=False)[0].strip()[:60]
        '{ /* S0: 4x16 register-blocked contraction micro-kernel, pac'
    """
    shape = choose_shape(printer, m)
    if shape is None:
        return None
    return _Emitter(printer, m, shape, parallel).lines(ind)


class _Emitter:
    def __init__(self, printer, m: Match, shape: Shape, parallel: bool):
        self.p, self.m, self.s, self.parallel = printer, m, shape, parallel
        self.t = m.st.tc.dtype
        self.ct = printer.ctype(self.t)
        self.vt = f"tc_v{shape.lanes}{self.t[0]}"
        printer._vector_types[self.vt] = (self.t, shape.vbytes)
        self.it1, self.it2 = _it(m.chain[0]), _it(m.chain[-1])
        self.red_its = [_it(n) for n in m.reds]
        (self.lo1, self.last1) = _const_bounds(m.chain[0])
        (self.lo2, self.last2) = _const_bounds(m.chain[-1])
        self.ext1, self.ext2 = self.last1 - self.lo1 + 1, self.last2 - self.lo2 + 1
        lhs = m.st.tc.stmt
        # the output is contiguous along the columns: tiles load/store it as vectors
        self.contiguous = lhs.lhs_indices[-1] == m.var2
        self.pre_vec = self.vector_prologue()
        self.post_vec = self.vector_epilogue()

    # -- helpers -----------------------------------------------------------------------------
    def binds(self, skip=frozenset()) -> str:
        """``const int v = <binding>;`` for the update's variables not in ``skip``."""
        return " ".join(f"const int {_c(v)} = {b};" for v, b in self.m.bind.items()
                        if v not in skip)

    def product(self, fs) -> str:
        return " * ".join(f"({self.p.expr(f)})" for f in fs) or "1"

    def lhs(self) -> str:
        s = self.m.st.tc.stmt
        return self.p.access(s.lhs, [A.Ident(v, s.span) for v in s.lhs_indices], None)

    def at(self, u, col: str) -> str:
        """Bindings of row ``tc_i + u`` and column ``col`` (the update's left-hand indices)."""
        return (f"const int {self.it1} = tc_i + {u}; const int {self.it2} = {col}; "
                f"{self.binds(set(self.m.st.tc.red_vars))}")

    def over_tile(self, leaves, rows: str, cols: str, col0: str, pad: str) -> list[str]:
        """The statements ``leaves`` over a tile (rows ``tc_i + u``, columns ``col0 + v``)."""
        if not leaves:
            return []
        out = [f"{pad}for (int tc_u = 0; tc_u < {rows}; tc_u += 1)",
               f"{pad}  for (int tc_v = 0; tc_v < {cols}; tc_v += 1) {{",
               f"{pad}    const int {self.it1} = tc_i + tc_u; const int {self.it2} = "
               f"{col0} + tc_v;"]
        for leaf in leaves:
            out += self.p.emit_node(leaf, len(pad) // 2 + 2)
        return out + [f"{pad}  }}"]

    def middle_open(self, pad: str, first_pragma: bool) -> tuple[list[str], str, bool]:
        out = []
        for n in self.m.chain[1:-1]:
            lo, last = _const_bounds(n)
            if first_pragma:
                out.append(pad + self.p.pragma_parallel)
                first_pragma = False
            out.append(f"{pad}for (int {_it(n)} = {lo}; {_it(n)} <= {last}; {_it(n)} += 1) {{")
            pad += "  "
        return out, pad, first_pragma

    # -- statements before / after the reduction, in vector registers ------------------------
    def vector_prologue(self):
        """``u, col -> C text`` of the initial sums when the only statement before the reduction
        sets them from scratch with a vectorisable right side (``+=!``'s zero, a bias), else
        None."""
        if len(self.m.pre) != 1 or not _rewrites(self.p, self.m.pre[0], self.m.st) or \
                not self.same_point(self.m.pre[0]):
            return None
        st, _ = _user_stmt(self.p, self.m.pre[0])
        if st.kind == "init":
            zero = self.p.neutral(st.tc.stmt.op, self.t)
            return lambda u, v: f"(({self.vt}){{0}} + ({self.ct})({zero}))"
        if list(st.vars) != list(self.m.st.tc.lhs_vars) or \
                _vector(self, st.tc.stmt.rhs, None) is None:
            return None
        return lambda u, v: _vector(self, st.tc.stmt.rhs, None)

    def vector_epilogue(self):
        """The statements after the reduction as vector updates of the sums (``fmaxf`` ReLU,
        ``+ B(g,f)``) when each is an assignment at the same indices, else None."""
        steps = []
        for leaf in self.m.post:
            st, _ = _user_stmt(self.p, leaf)
            if st.kind != "assign" or not self.same_point(leaf) or \
                    st.tc.stmt.lhs_indices != self.m.st.tc.stmt.lhs_indices:
                return None
            if _vector(self, st.tc.stmt.rhs, "tc_acc") is None:
                return None
            steps.append(st.tc.stmt.rhs)
        return steps

    def same_point(self, leaf) -> bool:
        """Does the statement at ``leaf`` use the update's left-hand index names, bound the
        same way (so its expressions read in the tile's bindings)?"""
        st, args = _user_stmt(self.p, leaf)
        return list(st.vars) == list(self.m.st.tc.lhs_vars) and \
            all(self.m.bind.get(v) == a for v, a in zip(st.vars, args))

    def start_sums(self, u_n: int, pad: str, col0: str, valid: str, first: str | None
                   ) -> list[str]:
        """Declare the sums and give them their starting values: the vector prologue on the
        first reduction block (``first``: its condition, None = always) of a full tile, else
        the output's current values (the statements before the reduction running on the tile
        first when it is the first block)."""
        s, vt, m = self.s, self.vt, self.m
        out = [f"{pad}{vt} " + ", ".join(f"tc_a{u}_{v}" for u in range(u_n)
                                          for v in range(s.nv)) + ";"]
        full = None if valid == str(s.nr) else f"{valid} == {s.nr}"
        vec_cond = " && ".join(x for x in (first, full) if x)
        fallback = self.load_tile(u_n, pad + "  ", col0, valid)
        if m.pre:
            pre = self.over_tile(m.pre, str(u_n), valid, col0, pad + "    ")
            fallback = ([f"{pad}  if ({first}) {{"] + pre + [f"{pad}  }}"] if first else
                        [x[2:] for x in pre]) + fallback
        if self.pre_vec is None:
            return out + [f"{pad}{{"] + fallback + [f"{pad}}}"]
        init = [f"{pad}  {{ {self.at(u, f'{col0} + {v * s.lanes}')} tc_a{u}_{v} = "
                f"{self.pre_vec(u, v)}; }}" for u in range(u_n) for v in range(s.nv)]
        if not vec_cond:
            return out + [x[2:] for x in init]
        return out + [f"{pad}if ({vec_cond}) {{"] + init + [f"{pad}}} else {{"] + fallback + \
            [f"{pad}}}"]

    def finish_sums(self, u_n: int, pad: str, col0: str, valid: str, last: str | None
                    ) -> list[str]:
        """After the last reduction block (``last``: its condition) of a full tile, the vector
        epilogue then the store; otherwise the store, then the statements after the reduction
        over the tile."""
        s, m = self.s, self.m
        full = None if valid == str(s.nr) else f"{valid} == {s.nr}"
        fallback = self.store_tile(u_n, pad + "  ", col0, valid)
        if m.post:
            post = self.over_tile(m.post, str(u_n), valid, col0, pad + "    ")
            fallback += ([f"{pad}  if ({last}) {{"] + post + [f"{pad}  }}"]) if last else \
                [x[2:] for x in post]
        if not self.post_vec:
            return [f"{pad}{{"] + fallback + [f"{pad}}}"]
        upd = []
        for rhs in self.post_vec:
            upd += [f"{pad}  {{ {self.at(u, f'{col0} + {v * s.lanes}')} "
                    f"const {self.vt} tc_acc = tc_a{u}_{v}; tc_a{u}_{v} = "
                    f"{_vector(self, rhs, 'tc_acc')}; }}"
                    for u in range(u_n) for v in range(s.nv)]
        vec = upd + self.store_tile(u_n, pad + "  ", col0, str(s.nr))
        vec_cond = " && ".join(x for x in (last, full) if x)
        if not vec_cond:
            return [x[2:] for x in vec]
        return [f"{pad}if ({vec_cond}) {{"] + vec + [f"{pad}}} else {{"] + fallback + \
            [f"{pad}}}"]

    def load_tile(self, u_n: int, pad: str, col0: str, valid: str) -> list[str]:
        """The sums from the output: vector loads of a contiguous full tile, else through a
        small buffer (padding lanes zero)."""
        s, vt = self.s, self.vt
        direct = [f"{pad}{{ {self.at(u, f'{col0} + {v * s.lanes}')} tc_a{u}_{v} = "
                  f"{vt}_ld(&{self.lhs()}); }}" for u in range(u_n) for v in range(s.nv)]
        buffered = [f"{pad}{self.ct} tc_cb[{u_n}][{s.nr}] __attribute__((aligned(64)));",
                    f"{pad}for (int tc_u = 0; tc_u < {u_n}; tc_u += 1)",
                    f"{pad}  for (int tc_v = 0; tc_v < {s.nr}; tc_v += 1) {{",
                    f"{pad}    if (tc_v >= {valid}) {{ tc_cb[tc_u][tc_v] = 0; continue; }}",
                    f"{pad}    {self.at('tc_u', f'{col0} + tc_v')}",
                    f"{pad}    tc_cb[tc_u][tc_v] = {self.lhs()};",
                    f"{pad}  }}"]
        buffered += [f"{pad}tc_a{u}_{v} = {vt}_ld(&tc_cb[{u}][{v * s.lanes}]);"
                     for u in range(u_n) for v in range(s.nv)]
        return self.full_or_buffered(direct, buffered, pad, valid)

    def store_tile(self, u_n: int, pad: str, col0: str, valid: str) -> list[str]:
        s, vt = self.s, self.vt
        direct = [f"{pad}{{ {self.at(u, f'{col0} + {v * s.lanes}')} "
                  f"{vt}_st(&{self.lhs()}, tc_a{u}_{v}); }}"
                  for u in range(u_n) for v in range(s.nv)]
        buffered = [f"{pad}{self.ct} tc_cb[{u_n}][{s.nr}] __attribute__((aligned(64)));"]
        buffered += [f"{pad}{vt}_st(&tc_cb[{u}][{v * s.lanes}], tc_a{u}_{v});"
                     for u in range(u_n) for v in range(s.nv)]
        buffered += [f"{pad}for (int tc_u = 0; tc_u < {u_n}; tc_u += 1)",
                     f"{pad}  for (int tc_v = 0; tc_v < {valid}; tc_v += 1) {{",
                     f"{pad}    {self.at('tc_u', f'{col0} + tc_v')}",
                     f"{pad}    {self.lhs()} = tc_cb[tc_u][tc_v];",
                     f"{pad}  }}"]
        return self.full_or_buffered(direct, buffered, pad, valid)

    def full_or_buffered(self, direct: list, buffered: list, pad: str, valid: str) -> list[str]:
        if not self.contiguous:
            return [f"{pad}{{"] + [f"  {x}" for x in buffered] + [f"{pad}}}"]
        if valid == str(self.s.nr):
            return direct
        return ([f"{pad}if ({valid} == {self.s.nr}) {{"] + [f"  {x}" for x in direct] +
                [f"{pad}}} else {{"] + [f"  {x}" for x in buffered] + [f"{pad}}}"])

    # -- the kernel ----------------------------------------------------------------------------
    def lines(self, ind: int) -> list[str]:
        m, s = self.m, self.s
        pad = "  " * ind
        kind = ("packed column operand, blocks "
                f"{s.nc}x{s.kc}") if m.packed else "direct column loads"
        fused = ", epilogue in registers" if self.post_vec else ""
        out = [f"{pad}{{ /* {m.st.name}: {s.mr}x{s.nr} register-blocked contraction "
               f"micro-kernel, {kind}{fused} */"]
        opened, inner, want = self.middle_open(pad + "  ", self.parallel)
        out += opened
        out += (self.packed if m.packed else self.direct)(inner, want)
        for _ in m.chain[1:-1]:
            inner = inner[:-2]
            out.append(inner + "}")
        return out + [pad + "}"]

    def row_tiles(self, pad: str, tile, pragma: bool) -> list[str]:
        """Full tiles of ``mr`` rows, then one tile of the remaining rows."""
        s, out = self.s, []
        full = self.ext1 // s.mr * s.mr
        if full:
            if pragma:
                out.append(pad + self.p.pragma_parallel)
            out.append(f"{pad}for (int tc_i = {self.lo1}; tc_i < {self.lo1 + full}; "
                       f"tc_i += {s.mr}) {{")
            out += tile(s.mr, pad + "  ")
            out.append(pad + "}")
        if self.ext1 - full:
            out.append(f"{pad}{{ const int tc_i = {self.lo1 + full};")
            out += tile(self.ext1 - full, pad + "  ")
            out.append(pad + "}")
        return out

    def accumulate(self, u_n: int, pad: str, red_bind: str) -> list[str]:
        """One reduction step: a broadcast per row and the multiply-adds with the column
        vectors ``tc_b<v>`` (already loaded)."""
        row = self.product(self.m.split.row)
        out = []
        for u in range(u_n):
            adds = " ".join(f"tc_a{u}_{v} += tc_b{v} * tc_s;" for v in range(self.s.nv))
            out.append(f"{pad}{{ const int {self.it1} = tc_i + {u}; {red_bind} "
                       f"{self.binds({self.m.var2})} const {self.ct} tc_s = ({self.ct})({row}); "
                       f"{adds} }}")
        return out

    # -- packed: column blocks x reduction blocks, the column operand copied into panels ------
    def packed(self, pad: str, pragma: bool) -> list[str]:
        m, s, ct = self.m, self.s, self.ct
        lor, lastr = _const_bounds(m.reds[0])
        rit = self.red_its[0]
        kcap = min(s.kc, lastr - lor + 1)
        pk_bytes = -(-(4 if self.t == "float" else 8) * kcap * s.nc // 64) * 64
        out = []
        if pragma:
            out.append(pad + self.p.pragma_parallel)
        out += [f"{pad}for (int tc_jc = {self.lo2}; tc_jc <= {self.last2}; tc_jc += {s.nc}) {{",
                f"{pad}  const int tc_nc = min({s.nc}, {self.last2} - tc_jc + 1);",
                f"{pad}  {ct} *tc_pk = ({ct} *)aligned_alloc(64, {pk_bytes});",
                f"{pad}  for (int tc_pc = {lor}; tc_pc <= {lastr}; tc_pc += {kcap}) {{",
                f"{pad}    const int tc_kc = min({kcap}, {lastr} - tc_pc + 1);",
                f"{pad}    for (int tc_jj = 0; tc_jj < (tc_nc + {s.nr - 1}) / {s.nr} * {s.nr}; "
                f"tc_jj += 1) {{",
                f"{pad}      {ct} *tc_dst = tc_pk + (tc_jj / {s.nr}) * {kcap * s.nr} "
                f"+ tc_jj % {s.nr};",
                f"{pad}      if (tc_jj >= tc_nc) {{ for (int tc_k = 0; tc_k < tc_kc; tc_k += 1) "
                f"tc_dst[tc_k * {s.nr}] = 0; continue; }}",
                f"{pad}      const int {self.it2} = tc_jc + tc_jj;",
                f"{pad}      for (int tc_k = 0; tc_k < tc_kc; tc_k += 1) {{ const int {rit} = "
                f"tc_pc + tc_k; {self.binds({m.var1})} tc_dst[tc_k * {s.nr}] = "
                f"({ct})({self.product(m.split.col)}); }}",
                f"{pad}    }}"]
        col0 = "tc_jc + tc_jr"

        def tile(u_n: int, p: str) -> list[str]:
            q = p + "  "
            t = [f"{p}for (int tc_jr = 0; tc_jr < tc_nc; tc_jr += {s.nr}) {{",
                 f"{q}const int tc_nv = min({s.nr}, tc_nc - tc_jr);"]
            t += self.start_sums(u_n, q, col0, "tc_nv", f"tc_pc == {lor}")
            t += [f"{q}const {ct} *tc_bp = tc_pk + (tc_jr / {s.nr}) * {kcap * s.nr};",
                  f"{q}for (int tc_k = 0; tc_k < tc_kc; tc_k += 1) {{"]
            t += [f"{q}  const {self.vt} tc_b{v} = {self.vt}_ld(tc_bp + tc_k * {s.nr} + "
                  f"{v * s.lanes});" for v in range(s.nv)]
            t += self.accumulate(u_n, q + "  ", f"const int {rit} = tc_pc + tc_k;")
            t.append(f"{q}}}")
            t += self.finish_sums(u_n, q, col0, "tc_nv", f"tc_pc + tc_kc > {lastr}")
            return t + [f"{p}}}"]

        out += self.row_tiles(pad + "    ", tile, False)
        return out + [f"{pad}  }}", f"{pad}  free(tc_pk);", f"{pad}}}"]

    # -- direct: the column operand loaded in place, all reduction loops inside -----------------
    def direct(self, pad: str, pragma: bool) -> list[str]:
        m, s = self.m, self.s
        full = self.ext2 // s.nr * s.nr
        tail = self.ext2 - full
        starts = f"for (int tc_j = {self.lo2}; tc_j < {self.lo2 + full}; tc_j += {s.nr})"

        def tile(u_n: int, p: str) -> list[str]:
            t = []
            if full:
                t.append(f"{p}{starts} {{")
                t += self.direct_tile(u_n, p + "  ", "tc_j")
                t.append(f"{p}}}")
            if tail and m.overlap and self.ext2 >= s.nr:
                t.append(f"{p}{{ const int tc_j = {self.last2 - s.nr + 1};")
                t += self.direct_tile(u_n, p + "  ", "tc_j")
                t.append(f"{p}}}")
            elif tail:
                t += self.scalar_columns(u_n, p, self.lo2 + full)
            return t

        return self.row_tiles(pad, tile, pragma)

    def direct_tile(self, u_n: int, pad: str, col0: str) -> list[str]:
        m, s, vt = self.m, self.s, self.vt
        out = self.start_sums(u_n, pad, col0, str(s.nr), None)
        q = pad
        for n in m.reds:
            lo, last = _const_bounds(n)
            out.append(f"{q}for (int {_it(n)} = {lo}; {_it(n)} <= {last}; {_it(n)} += 1) {{")
            q += "  "
        for v in range(s.nv):
            loads = " * ".join(f"{vt}_ld(&{self.p.expr(f)})" for f in m.split.col)
            out.append(f"{q}{vt} tc_b{v}; {{ const int {self.it2} = {col0} + {v * s.lanes}; "
                       f"{self.binds({m.var1})} tc_b{v} = {loads}; }}")
        out += self.accumulate(u_n, q, "")
        for _ in m.reds:
            q = q[:-2]
            out.append(q + "}")
        return out + self.finish_sums(u_n, pad, col0, str(s.nr), None)

    def scalar_columns(self, u_n: int, pad: str, first: int) -> list[str]:
        """Columns ``first..last2`` of the rows ``tc_i..``: the nest's own statements."""
        out = [f"{pad}for (int tc_u = 0; tc_u < {u_n}; tc_u += 1)",
               f"{pad}  for (int {self.it2} = {first}; {self.it2} <= {self.last2}; "
               f"{self.it2} += 1) {{",
               f"{pad}    const int {self.it1} = tc_i + tc_u;"]
        depth = len(pad) // 2 + 2
        for leaf in _leaves(self.m.chain[-1].for_get_body()):
            out += self.p.emit_node(leaf, depth)
        return out + [f"{pad}  }}"]


_VMAX = {"fmaxf", "fmax", "max"}
_VMIN = {"fminf", "fmin", "min"}


def _vector(em: _Emitter, e: A.Expr, acc: str | None) -> str | None:
    """C text of ``e`` as a vector over the tile's columns (scalars broadcast), in a scope where
    the row and column bindings hold; ``acc`` names the sums where ``e`` reads the output at
    the statement's own indices.  None when ``e`` is not vectorisable: a read moving with the
    columns but not contiguous, a builtin other than max/min, ``?:``, a cast."""
    text, is_vec = _vec(em, e, acc) or (None, False)
    if text is None:
        return None
    return text if is_vec else f"(({em.vt}){{0}} + ({em.ct})({text}))"


def _vec(em: _Emitter, e: A.Expr, acc: str | None):
    m, vt, ct = em.m, em.vt, em.ct
    uses2 = any(isinstance(x, A.Ident) and x.name == m.var2 for x in A.walk(e))
    s = m.st.tc.stmt
    if isinstance(e, A.Call) and e.name == s.lhs:
        if acc is None or [getattr(a, "name", None) for a in e.args] != list(s.lhs_indices):
            return None
        return acc, True
    if not uses2:                      # a scalar of this row: broadcast
        if any(isinstance(x, A.Call) and x.name == s.lhs for x in A.walk(e)):
            return None
        return f"({ct})({em.p.expr(e)})", False
    if isinstance(e, A.Call) and e.name in em.p.cdef.tensors:
        if not contiguous(em.p.cdef, e, m.var2, em.t):
            return None
        return f"{vt}_ld(&{em.p.expr(e)})", True
    if isinstance(e, A.Binary) and e.op in "+-*/" and (
            e.op != "/" or em.p.cdef.types.get(id(e)) in ("float", "double")):
        a, b = _vec(em, e.lhs, acc), _vec(em, e.rhs, acc)
        if a is None or b is None:
            return None
        return f"({a[0]} {e.op} {b[0]})", a[1] or b[1]
    if isinstance(e, A.Unary) and e.op in "+-":
        a = _vec(em, e.operand, acc)
        return None if a is None else (f"({e.op}{a[0]})", a[1])
    if isinstance(e, A.Call) and (e.name in _VMAX or e.name in _VMIN) and len(e.args) == 2:
        a, b = (_vector(em, x, acc) for x in e.args)
        if a is None or b is None:
            return None
        em.p._vector_selects.add(em.vt)
        return f"{vt}_{'max' if e.name in _VMAX else 'min'}({a}, {b})", True
    return None
