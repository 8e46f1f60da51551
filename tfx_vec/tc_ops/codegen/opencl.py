"""GPU printers: the mapped isl AST as OpenCL C (this module) and CUDA (``codegen/cuda.py``).

Both are dialects of the CPU's :class:`~.c.CPrinter`: they override class attributes
(address-space qualifiers, barrier, block/thread id spellings, unroll pragma, prelude) and a few
``emit_*`` methods.  :class:`GpuPrinter` holds what the GPU dialects share:

- one kernel function per :class:`~..poly.mapping.GpuKernel` (launched in order), each taking every
  buffer (inputs, scalars as one-element buffers, outputs, temporaries) so launches share them;
- the block/thread ids bound to the parameters the mapping's filters use (``_b0``, ``_t0``, ...);
- for a kernel with promoted arrays, explicit tile loops (block-strided where mapped) around a
  cooperative copy of each array tile into shared memory by all threads of the block, a barrier,
  the tile's instances reading the copy, and a barrier before the next tile's copy;
- with ``use_private_memory``, a loop that only accumulates a reduction into one element keeps
  the accumulator in a register (read before, written after the loop);
- with ``unroll_copy_shared``, the shared-memory copy loops carry the unroll pragma too;
- the isl AST is generated with the ids' ranges as context, so loops over blocks/threads come out
  strided and guards disappear where the launch sizes make them redundant.

Example:
    >>> from tfx_vec.tc_ops.lang import parse
    >>> from tfx_vec.tc_ops.lang.sema import check
    >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
    >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
    >>> from tfx_vec.tc_ops.poly.mapping import map_to_gpu
    >>> from tfx_vec.tc_ops.options import MappingOptions
    >>> d = check(parse("def scale(float(N) A) -> (B) { B(i) = 2 * A(i) }").defs[0])
    >>> k = build_kernel(d, infer_ranges(d, {"A": (64,)}))
    >>> m = map_to_gpu(k, MappingOptions(tile=(16,), map_to_threads=(16,)))
    >>> src = OpenCLPrinter(m).source()
    >>> "__kernel void tc_scale_k0(" in src and "get_local_id(0)" in src
    True
"""
from __future__ import annotations

import re

import islpy as isl

from ..lang import ast as A
from ..poly.contraction import classify
from ..poly.mapping import BLOCK_IDS, THREAD_IDS, GpuKernel, GpuMapping
from ..poly.promote import Promotion
from .c import CPrinter
from .cnames import c_name

__all__ = ["GpuPrinter", "OpenCLPrinter"]


class GpuPrinter(CPrinter):
    """Shared machinery of the GPU dialects (abstract: subclasses fill the attributes).

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
        >>> from tfx_vec.tc_ops.poly.mapping import map_to_gpu
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> d = check_program("def neg(float(N) A) -> (B) { B(i) = -A(i) }")["neg"]
        >>> m = map_to_gpu(build_kernel(d, infer_ranges(d, {"A": (64,)})),
        ...                MappingOptions(tile=(16,), map_to_threads=(16,)))
        >>> issubclass(OpenCLPrinter, GpuPrinter), OpenCLPrinter(m).buffers()[0]
        (True, ('A', 'float', True))
    """

    kernel_prefix = ""
    global_space = ""            # address-space qualifier of kernel buffers
    shared_space = ""            # ... of promoted copies
    barrier = ""
    block_id = ""                # format with d = 0, 1, 2
    thread_id = ""
    pragma_parallel = ""
    pragma_simd = ""
    dialect_prelude = ""         # dialect lines; the C printer's macros (minus #include) follow

    @property
    def prelude(self) -> str:  # type: ignore[override]
        # OpenCL and CUDA have min/max builtins for ints and floats (PoCL even as macros)
        shared = [ln for ln in CPrinter.prelude.splitlines()
                  if ln.strip() and not ln.startswith(("#include", "#define min(",
                                                        "#define max("))]
        return self.dialect_prelude + "\n".join(shared) + "\n"

    def __init__(self, mapping: GpuMapping):
        super().__init__(mapping.kernel, mapping.options)
        self.mapping = mapping
        self._gk: GpuKernel | None = None
        self._active: dict[str, tuple[Promotion, str]] = {}
        self._shared_decls: list[str] = []

    # -- whole program -------------------------------------------------------------------
    def uses_half(self) -> bool:
        return any(t.dtype == "half" for t in self.cdef.tensors.values())

    def source(self) -> str:
        parts = [self.emit_header(), getattr(self, "fp16_pragma", "") if self.uses_half() else "",
                 self.prelude]
        for gk in self.mapping.kernels:
            parts.append(self.kernel_function(gk))
        return "\n".join(parts)

    def buffers(self) -> list[tuple[str, str, bool]]:
        """(name, dtype, read-only) of every kernel argument, in ABI order + temporaries."""
        out = [(p.name, p.dtype, True) for p in self.cdef.inputs]
        out += [(n, self.cdef.tensors[n].dtype, False) for n in self.cdef.outputs]
        out += [(n, self.cdef.tensors[n].dtype, False) for n in self.cdef.temps]
        return out

    def kernel_function(self, gk: GpuKernel) -> str:
        self._gk, self._shared_decls = gk, []
        body = self.emit_body(gk)
        params = ", ".join(
            f"{self.global_space}{'const ' if ro else ''}{self.ctype(t)} *{self.restrict} _arg{i}"
            for i, (_, t, ro) in enumerate(self.buffers()))
        lines = [f"{self.kernel_prefix} void {gk.name}({params}) {{"]
        lines += self.emit_ids(gk)
        lines += self.emit_unpack()
        lines += [f"  {d}" for d in self._shared_decls]
        lines += body
        lines.append("}")
        return "\n".join(lines) + "\n"

    def emit_ids(self, gk: GpuKernel) -> list[str]:
        out = [f"  const int {BLOCK_IDS[d]} = {self.block_id.format(d=d, axis='xyz'[d])};"
               for d in range(len(gk.grid))]
        out += [f"  const int {THREAD_IDS[d]} = {self.thread_id.format(d=d, axis='xyz'[d])};"
                for d in range(len(gk.block))]
        lin, stride = "0", 1
        for d in range(len(gk.block)):
            lin = f"{lin} + {stride} * {THREAD_IDS[d]}"
            stride *= gk.block[d]
        out.append(f"  const int _tlin = {lin}; (void)_tlin;")
        return out

    def new_build(self, gk: GpuKernel) -> isl.AstBuild:
        ctx = self.k.ctx
        build = isl.AstBuild.from_context(isl.Set.read_from_str(ctx, gk.context))
        its = isl.IdList.alloc(ctx, 0)
        for i in range(64):
            its = its.add(isl.Id(f"_c{i}", context=ctx))
        return build.set_iterators(its)

    def emit_body(self, gk: GpuKernel) -> list[str]:
        ast = self.new_build(gk).node_from_schedule(gk.schedule)
        if not gk.tile_loops:
            return self.emit_node(ast, 1)
        # explicit tile loops around: copy in, barrier, the tile's instances, barrier
        out, ind = [], 1
        for t in gk.tile_loops:
            pad = "  " * ind
            out.append(f"{pad}for (int {t.param} = {t.start}; {t.param} < {t.extent}; "
                       f"{t.param} += {t.step}) {{")
            ind += 1
        out += self.emit_promoted(gk, ast, ind)
        for _ in gk.tile_loops:
            ind -= 1
            out.append("  " * ind + "}")
        return out

    # -- buffers -------------------------------------------------------------------------
    def array_decl(self, name: str, dtype: str, shape: tuple, const: bool) -> str:
        return self.global_space + super().array_decl(name, dtype, shape, const)

    def array_cast(self, dtype: str, shape: tuple, const: bool) -> str:
        c = super().array_cast(dtype, shape, const)
        return "(" + self.global_space + c[1:]

    def emit_unpack(self) -> list[str]:
        out = []
        for i, (name, t, ro) in enumerate(self.buffers()):
            if _is_scalar_param(self.cdef, name):
                out.append(f"  const {self.ctype(t)} {c_name(name)} = _arg{i}[0];")
                continue
            sh = self.shapes[name]
            out.append(f"  {self.array_decl(name, t, sh, ro)} = "
                       f"{self.array_cast(t, sh, ro)}_arg{i};")
        return out

    def emit_temps_alloc(self) -> list[str]:
        return []

    def emit_temps_free(self) -> list[str]:
        return []

    # -- shared-memory promotion ------------------------------------------------------
    def emit_promoted(self, gk: GpuKernel, body: isl.AstNode, ind: int) -> list[str]:
        pad = "  " * ind
        nthreads = 1
        for b in gk.block:
            nthreads *= b
        build = self.new_build(gk)
        out = []
        for p in gk.promotions:
            sh = f"_sh_{c_name(p.tensor)}"
            dims = "".join(f"[{s}]" for s in p.sizes)
            self._shared_decls.append(f"{self.shared_space}{self.ctype(p.dtype)} {sh}{dims};")
            offs = []
            for d, off in enumerate(p.offsets):
                o = f"_o_{c_name(p.tensor)}_{d}"
                out.append(f"{pad}const int {o} = {build.expr_from_pw_aff(off).to_C_str()};")
                offs.append(o)
            total = 1
            for s in p.sizes:
                total *= s
            shape = self.shapes[p.tensor]
            e = [f"_e{d}" for d in range(len(p.sizes))]
            unravel, rest = [], "_i"
            for d in range(len(p.sizes) - 1, -1, -1):
                unravel.insert(0, f"const int {e[d]} = ({rest}) % {p.sizes[d]};")
                rest = f"({rest}) / {p.sizes[d]}"
            glob = [f"{offs[d]} + {e[d]}" for d in range(len(p.sizes))]
            inside = " && ".join(f"({g}) >= 0 && ({g}) < {shape[d]}" for d, g in enumerate(glob))
            src = c_name(p.tensor) + "".join(f"[{g}]" for g in glob)
            dst = sh + "".join(f"[{x}]" for x in e)
            if self.options.unroll_copy_shared and self.options.unroll > 1:
                out.append(pad + self.pragma_unroll.format(n=self.options.unroll))
            out.append(f"{pad}for (int _i = _tlin; _i < {total}; _i += {nthreads}) {{")
            out.append(f"{pad}  {' '.join(unravel)}")
            out.append(f"{pad}  if ({inside or '1'}) {dst} = {src};")
            out.append(f"{pad}}}")
            self._active[p.tensor] = (p, sh)
        out.append(f"{pad}{self.barrier}")
        out += self.emit_node(body, ind)
        out.append(f"{pad}{self.barrier}")
        self._active = {}
        return out

    def access(self, name: str, subs, call: A.Call | None) -> str:
        if name not in self._active or call is None:
            return super().access(name, subs, call)
        p, sh = self._active[name]
        plain = super().access(name, subs, call)      # "A[x][y]" with clamps applied
        idx = _split_subscripts(plain[len(c_name(name)):])
        return sh + "".join(f"[({x}) - _o_{c_name(name)}_{d}]" for d, x in enumerate(idx))

    # -- private (register) promotion of reduction accumulators -------------------------
    def emit_for(self, node: isl.AstNode, ind: int, mark: str | None) -> list[str]:
        if self.options.use_private_memory:
            tiled = self.emit_register_tile(node, ind)
            if tiled is not None:
                return tiled
            hoisted = self.emit_private_reduction(node, ind)
            if hoisted is not None:
                return hoisted
        return super().emit_for(node, ind, mark)

    # a thread's register tile holds at most this many sums
    register_tile_max = 64

    def emit_register_tile(self, node: isl.AstNode, ind: int) -> list[str] | None:
        """A thread's points of a contraction as a register tile (the GPU form of the CPU
        micro-kernel): the two per-thread loops ``i1 { i2 { pre; r { S += row * col }; post } }``
        (strided by the thread counts, the same trip count in every thread) become ``U x V``
        sums in registers; per reduction step ``U`` row values and ``V`` column values are
        read once and combined in ``U x V`` multiply-adds (instead of ``2 U V`` reads).  Legal
        because a thread's points are independent (the loops are mapped coincident members).
        None when the nest is not of that form."""
        l1 = node
        l2 = _only_loop(l1.for_get_body())
        if l2 is None:
            return None
        t1, t2 = _thread_loop(l1), _thread_loop(l2)
        if t1 is None or t2 is None or t1[2] * t2[2] > self.register_tile_max or \
                t1[2] * t2[2] < 2:
            return None
        leaves = _flatten_ast(l2.for_get_body())
        loops = [k for k, n in enumerate(leaves) if n.get_type() == isl.ast_node_type.for_]
        if len(loops) != 1 or any(n.get_type() != isl.ast_node_type.user
                                  for k, n in enumerate(leaves) if k != loops[0]):
            return None
        reds, cur = [], leaves[loops[0]]
        while cur.get_type() == isl.ast_node_type.for_:
            reds.append(cur)
            cur = _strip_marks(cur.for_get_body())
        if cur.get_type() != isl.ast_node_type.user:
            return None
        upd = cur
        st, args = self._user(upd)
        it1, it2 = (n.for_get_iterator().to_C_str() for n in (l1, l2))
        red_its = [n.for_get_iterator().to_C_str() for n in reds]
        if st.kind != "update" or st.tc.dtype not in ("float", "double") or any(
                _uses_word(n.for_get_init().to_C_str() + " " + n.for_get_cond().to_C_str(), i)
                for n in reds for i in (it1, it2)):
            return None
        bind = dict(zip(st.vars, args))
        moves = {v: {i for i in (it1, it2, *red_its) if _uses_word(b, i)} for v, b in bind.items()}
        var1 = [v for v in st.tc.lhs_vars if moves[v] == {it1}]
        var2 = [v for v in st.tc.lhs_vars if moves[v] == {it2}]
        # the loops inside the tile must be reduction loops: an output index bound to one of
        # them (fusion 'min' can put a parallel loop there) would leave the tile's points apart
        if len(var1) != 1 or len(var2) != 1 or any(
                moves[v] & {it1, it2} for v in st.tc.red_vars) or any(
                moves[v] & set(red_its) for v in st.tc.lhs_vars):
            return None
        split = classify(self.cdef, st.tc, var1[0], var2[0], vectors=False)
        pre, post = leaves[:loops[0]], leaves[loops[0] + 1:]
        lhs_bind = {v: bind[v] for v in st.tc.lhs_vars}
        if split is None or any(not self._same_point(n, st, lhs_bind) for n in pre + post):
            return None
        return self._register_tile(ind, st, bind, (l1, t1), (l2, t2), reds, pre, post, split)

    def _user(self, node: isl.AstNode):
        expr = node.user_get_expr()
        st = self.k.stmt(expr.op_get_arg(0).get_id().get_name())
        return st, [expr.op_get_arg(i + 1).to_C_str() for i in range(expr.op_get_n_arg() - 1)]

    def _same_point(self, node: isl.AstNode, st, lhs_bind: dict) -> bool:
        other, args = self._user(node)
        return other.tc.stmt.lhs == st.tc.stmt.lhs and \
            all(lhs_bind.get(v) == a for v, a in zip(other.vars, args))

    def _register_tile(self, ind, st, bind, first, second, reds, pre, post, split
                       ) -> list[str]:
        (l1, (init1, step1, nu, bound1)), (l2, (init2, step2, nv, bound2)) = first, second
        it1, it2 = (n.for_get_iterator().to_C_str() for n in (l1, l2))
        pad, ct, s = "  " * ind, self.ctype(st.tc.dtype), st.tc.stmt
        lhs = self.access(s.lhs, [A.Ident(v, s.span) for v in s.lhs_indices], None)
        # points past a partial tile, or past a thread's share, are guarded
        ok1 = [f"({init1} + {u * step1} <= {bound1})" if bound1 else "" for u in range(nu)]
        ok2 = [f"({init2} + {v * step2} <= {bound2})" if bound2 else "" for v in range(nv)]

        def guard(*conds) -> str:
            c = " && ".join(x for x in conds if x)
            return f"if ({c}) " if c else ""

        def binds(skip) -> str:
            return " ".join(f"const int {c_name(v)} = {b};" for v, b in bind.items()
                            if v not in skip)

        def at(u, v) -> str:
            return (f"const int {it1} = {init1} + {u * step1}; "
                    f"const int {it2} = {init2} + {v * step2};")

        def product(fs) -> str:
            return " * ".join(f"({self.expr(f)})" for f in fs) or "1"

        lhs_only = set(st.tc.red_vars)
        out = [f"{pad}{{ /* {st.name}: {nu}x{nv} register tile per thread */",
               f"{pad}  {ct} " + ", ".join(f"tc_r{u}_{v} = 0" for u in range(nu)
                                           for v in range(nv)) + ";",
               f"{pad}  {ct} " + ", ".join([f"tc_x{u}" for u in range(nu)] +
                                           [f"tc_y{v}" for v in range(nv)]) + ";"]
        for u in range(nu):
            for v in range(nv):
                out.append(f"{pad}  {guard(ok1[u], ok2[v])}{{ {at(u, v)}")
                for leaf in pre:
                    out += self.emit_node(leaf, ind + 2)
                out.append(f"{pad}    {{ {binds(lhs_only)} tc_r{u}_{v} = {lhs}; }}")
                out.append(f"{pad}  }}")
        q = pad + "  "
        for n in reds:
            it = n.for_get_iterator().to_C_str()
            out.append(f"{q}for (int {it} = {n.for_get_init().to_C_str()}; "
                       f"{n.for_get_cond().to_C_str()}; {it} += {n.for_get_inc().to_C_str()}) {{")
            q += "  "
        var2 = next(v for v in st.tc.lhs_vars if _uses_word(bind[v], it2))
        var1 = next(v for v in st.tc.lhs_vars if _uses_word(bind[v], it1))
        out += [f"{q}tc_x{u} = 0; {guard(ok1[u])}{{ const int {it1} = {init1} + {u * step1}; "
                f"{binds({var2})} tc_x{u} = ({ct})({product(split.row)}); }}" for u in range(nu)]
        out += [f"{q}tc_y{v} = 0; {guard(ok2[v])}{{ const int {it2} = {init2} + {v * step2}; "
                f"{binds({var1})} tc_y{v} = ({ct})({product(split.col)}); }}" for v in range(nv)]
        out += [f"{q}tc_r{u}_{v} += tc_x{u} * tc_y{v};" for u in range(nu) for v in range(nv)]
        for _ in reds:
            q = q[:-2]
            out.append(q + "}")
        for u in range(nu):
            for v in range(nv):
                out.append(f"{pad}  {guard(ok1[u], ok2[v])}{{ {at(u, v)}")
                out.append(f"{pad}    {{ {binds(lhs_only)} {lhs} = tc_r{u}_{v}; }}")
                for leaf in post:
                    out += self.emit_node(leaf, ind + 2)
                out.append(f"{pad}  }}")
        return out + [f"{pad}}}"]

    def emit_private_reduction(self, node: isl.AstNode, ind: int) -> list[str] | None:
        """A loop whose body is one reduction step into an element that does not depend on the
        loop iterator: accumulate in a register, read before and written after the loop (the
        PPCG-style private promotion of §5.6).  None when the loop is not of that form."""
        body = node.for_get_body()
        if body.get_type() != isl.ast_node_type.user:
            return None
        expr = body.user_get_expr()
        st = self.k.stmt(expr.op_get_arg(0).get_id().get_name())
        s = st.tc.stmt
        if st.kind != "update" or any(isinstance(x, A.Call) and x.name == s.lhs
                                      for x in A.walk(s.rhs)):
            return None
        args = [expr.op_get_arg(i + 1).to_C_str() for i in range(expr.op_get_n_arg() - 1)]
        it = node.for_get_iterator().to_C_str()
        binds = dict(zip(st.vars, args))
        if any(re.search(rf"\b{it}\b", binds[v]) for v in s.lhs_indices):
            return None
        pad = "  " * ind
        t = st.tc.dtype
        ct = self.ctype(t)
        lhs = self.access(s.lhs, [A.Ident(v, s.span) for v in s.lhs_indices], None)
        outer = " ".join(f"const int {c_name(v)} = {binds[v]};" for v in s.lhs_indices)
        inner = " ".join(f"const int {c_name(v)} = {binds[v]};" for v in st.vars
                         if v not in s.lhs_indices)
        step = self.combine(s.op, "_acc", f"({self.expr(s.rhs)})", t)
        out = [f"{pad}{{ {outer}", f"{pad}  {ct} _acc = {lhs};"]
        out += [f"{pad}  {p}" for p in self.loop_pragmas(None, True)]
        out.append(f"{pad}  for (int {it} = {node.for_get_init().to_C_str()}; "
                   f"{node.for_get_cond().to_C_str()}; {it} += {node.for_get_inc().to_C_str()}) {{")
        out.append(f"{pad}    {{ {inner} _acc = ({ct})({step}); }}")
        out.append(f"{pad}  }}")
        out.append(f"{pad}  {lhs} = _acc;")
        out.append(f"{pad}}}")
        return out

    def loop_pragmas(self, mark: str | None, innermost: bool) -> list[str]:
        o = self.options
        if innermost and o.unroll > 1:
            return [self.pragma_unroll.format(n=o.unroll)]
        return []


def _strip_marks(node: isl.AstNode) -> isl.AstNode:
    while node.get_type() == isl.ast_node_type.mark:
        node = node.mark_get_node()
    return node


def _flatten_ast(node: isl.AstNode) -> list:
    node = _strip_marks(node)
    if node.get_type() == isl.ast_node_type.block:
        lst = node.block_get_children()
        return [x for i in range(lst.n_ast_node()) for x in _flatten_ast(lst.get_at(i))]
    return [node]


def _only_loop(node: isl.AstNode) -> isl.AstNode | None:
    """``node`` (marks removed) if it is a single for-loop, else None."""
    node = _strip_marks(node)
    return node if node.get_type() == isl.ast_node_type.for_ else None


def _thread_loop(node: isl.AstNode) -> tuple[str, int, int, str | None] | None:
    """(first value, step, most trips, bound) of a thread's loop ``for (c = t; c <= B; c +=
    step)`` (``t`` a thread id or a constant; ``B`` a constant or ``min(C, ...)`` at a partial
    tile); ``bound`` is the text of ``B`` when some thread makes fewer trips (each point is
    then guarded by ``c <= B``), else None."""
    init, inc = node.for_get_init().to_C_str(), node.for_get_inc().to_C_str()
    cond = node.for_get_cond()
    if not inc.isdigit() or cond.get_type() != isl.ast_expr_type.op or \
            cond.op_get_type() != isl.ast_expr_op_type.le:
        return None
    bound = cond.op_get_arg(1)
    consts = [bound] if bound.get_type() == isl.ast_expr_type.int else (
        [bound.op_get_arg(i) for i in range(bound.op_get_n_arg())]
        if bound.get_type() == isl.ast_expr_type.op and
        bound.op_get_type() == isl.ast_expr_op_type.min else [])
    consts = [int(a.int_get_val().to_python()) for a in consts
              if a.get_type() == isl.ast_expr_type.int]
    if not consts:
        return None
    step, last = int(inc), min(consts)
    exact = bound.get_type() == isl.ast_expr_type.int
    if init.lstrip("-").isdigit():
        count = (last - int(init)) // step + 1
    elif init in THREAD_IDS:
        count = -(-(last + 1) // step)       # thread 0's trips: t in [0, step)
        exact = exact and (last + 1) % step == 0
    else:
        return None
    if count < 1:
        return None
    return init, step, count, None if exact else bound.to_C_str()


def _uses_word(text: str, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", text) is not None


def _is_scalar_param(cdef, name: str) -> bool:
    return any(p.name == name and p.is_scalar for p in cdef.inputs)


def _split_subscripts(text: str) -> list[str]:
    """``[a][b[c]]`` -> ``['a', 'b[c]']``."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            if depth > 0:
                cur += ch
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                out.append(cur)
                cur = ""
            else:
                cur += ch
        else:
            cur += ch
    return out


class OpenCLPrinter(GpuPrinter):
    """OpenCL C 1.2 (run on PoCL in tests).

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
        >>> from tfx_vec.tc_ops.poly.mapping import map_to_gpu
        >>> from tfx_vec.tc_ops.options import MappingOptions
        >>> d = check_program("def mm(float(M,K) A, float(K,N) B) -> (C) "
        ...                   "{ C(m,n) +=! A(m,k) * B(k,n) }")["mm"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (64, 32), "B": (32, 64)}))
        >>> m = map_to_gpu(k, MappingOptions(tile=(16, 16), map_to_threads=(4, 4),
        ...                                  use_private_memory=True))
        >>> "4x4 register tile per thread" in OpenCLPrinter(m).source()
        True
    """

    kernel_prefix = "__kernel"
    global_space = "__global "
    shared_space = "__local "
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    block_id = "get_group_id({d})"
    thread_id = "get_local_id({d})"
    pragma_unroll = "__attribute__((opencl_unroll_hint({n})))"
    half_type = "half"

    def ctype(self, t: str) -> str:
        # OpenCL C forbids bool in kernel arguments (its size is implementation-defined);
        # NumPy bools are one byte.
        return "uchar" if t == "bool" else super().ctype(t)
    # OpenCL's math builtins are overloaded on float/double: the C99 float names map onto them.
    dialect_prelude = """#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define expf exp
#define logf log
#define tanhf tanh
#define sqrtf sqrt
#define sinf sin
#define cosf cos
#define tanf tan
#define erff erf
#define log1pf log1p
#define expm1f expm1
#define floorf floor
#define ceilf ceil
#define roundf round
#define log2f log2
#define exp2f exp2
#define asinf asin
#define acosf acos
#define atanf atan
#define sinhf sinh
#define coshf cosh
#define cbrtf cbrt
#define fabsf fabs
#define fmaxf fmax
#define fminf fmin
#define powf pow
#define atan2f atan2
#define fmodf fmod
#define nextafterf nextafter
#define hypotf hypot
#define copysignf copysign
typedef char int8_t; typedef short int16_t; typedef int int32_t; typedef long int64_t;
typedef uchar uint8_t; typedef ushort uint16_t; typedef uint uint32_t; typedef ulong uint64_t;
#define INT8_MIN CHAR_MIN
#define INT8_MAX CHAR_MAX
#define INT16_MIN SHRT_MIN
#define INT16_MAX SHRT_MAX
#define INT32_MIN INT_MIN
#define INT32_MAX INT_MAX
#define INT64_MIN LONG_MIN
#define INT64_MAX LONG_MAX
#define UINT8_MAX UCHAR_MAX
#define UINT16_MAX USHRT_MAX
#define UINT32_MAX UINT_MAX
#define UINT64_MAX ULONG_MAX
"""
