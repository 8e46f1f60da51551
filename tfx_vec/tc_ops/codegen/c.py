"""The base C printer: isl AST + TC statements -> C source.  Dialects (CUDA, OpenCL) subclass it.

The dialect lives in class attributes (``restrict``, pragmas, ``type_map``, ``prelude``) and in
small ``emit_*`` methods; :meth:`CPrinter.kernel_source` is the only driver.  The CPU dialect
prints the kernel ABI of ``backends/cpu.py``::

    void tc_<entry>(void* const* args)   // inputs (scalars by pointer), then outputs

with every size a compile-time constant and tensors as pointers to C arrays with constant
extents (``const float (*restrict A)[64]``), so subscripts read like the TC (``A[m][kk]``).

Example:
    >>> from tfx_vec.tc_ops.lang import parse
    >>> from tfx_vec.tc_ops.lang.sema import check
    >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
    >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
    >>> d = check(parse("def scale(float(N) A, float s) -> (B) { B(i) = s * A(i) }").defs[0])
    >>> k = build_kernel(d, infer_ranges(d, {"A": (8,)}))
    >>> "B[i] = (float)((s * A[i]));" in CPrinter(k).kernel_source(k.identity_schedule())
    True
"""
from __future__ import annotations

import re

import islpy as isl

from ..errors import TcCompileError
from ..lang import ast as A
from ..lang.types import c_type, canonical, is_float
from ..options import MappingOptions
from ..poly.kernel import MARK_OMP, MARK_SEQ, MARK_SIMD, PolyKernel, PolyStmt, build_ast
from . import contraction
from .cnames import c_name

__all__ = ["CPrinter", "c_name"]

# float-typed C spellings of the TC builtins: name -> (float32 name, float64 name)
_FLOAT_FUNCS = {f: (f + "f", f) for f in (
    "exp", "log", "tanh", "sqrt", "sin", "cos", "tan", "erf", "log1p", "expm1", "floor", "ceil",
    "round", "log2", "exp2", "asin", "acos", "atan", "sinh", "cosh", "cbrt", "fabs", "fmax",
    "fmin", "pow", "atan2", "fmod", "nextafter", "hypot", "copysign")}
_FLOAT_FUNCS.update({f + "f": (f + "f", f + "f") for f in (
    "exp", "log", "tanh", "sqrt", "sin", "cos", "tan", "erf", "log1p", "expm1", "floor", "ceil",
    "fabs", "fmax", "fmin", "pow", "nextafter")})


class CPrinter:
    """C with OpenMP pragmas (the CPU dialect); subclasses override attributes and ``emit_*``.

    Example:
        >>> from tfx_vec.tc_ops.lang.sema import check_program
        >>> from tfx_vec.tc_ops.lang.ranges import infer_ranges
        >>> from tfx_vec.tc_ops.poly.kernel import build_kernel
        >>> d = check_program("def neg(float(N) A) -> (B) { B(i) = -A(i) }")["neg"]
        >>> k = build_kernel(d, infer_ranges(d, {"A": (3,)}))
        >>> src = CPrinter(k).kernel_source(k.identity_schedule())
        >>> "void tc_neg(void* const* args)" in src
        True
    """

    restrict = "restrict"
    kernel_prefix = ""                       # e.g. 'extern "C" __global__' in CUDA
    # dynamic scheduling: on a busy machine a descheduled thread's tiles go to the others
    # instead of every thread waiting for it at the loop's end
    pragma_parallel = "#pragma omp parallel for schedule(dynamic, 1)"
    pragma_simd = "#pragma omp simd"
    pragma_unroll = "#pragma GCC unroll {n}"
    half_type = "_Float16"
    prelude = """#include <math.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include <omp.h>
#define floord(n, d) (((n) < 0) ? -((-(n) + (d) - 1) / (d)) : (n) / (d))
#define min(x, y) ((x) < (y) ? (x) : (y))
#define max(x, y) ((x) > (y) ? (x) : (y))
#define tc_clamp(x, lo, hi) ((x) < (lo) ? (lo) : (x) > (hi) ? (hi) : (x))
#define tc_idiv(a, b) ((b) == 0 ? 0 : (b) == -1 ? -(a) : (a) / (b))
#define tc_imod(a, b) ((b) == 0 || (b) == -1 ? 0 : (a) % (b))
"""
    # neutral elements of the reductions: (float, signed int, unsigned int / bool)
    _NEUTRAL = {"+=": ("0", "0", "0"), "*=": ("1", "1", "1"),
                "min=": ("INFINITY", "{T}_MAX", "{T}_MAX"), "max=": ("-INFINITY", "{T}_MIN", "0")}

    def __init__(self, kernel: PolyKernel, options: MappingOptions | None = None):
        self.k = kernel
        self.cdef = kernel.cdef
        self.options = options or MappingOptions.naive()
        self.shapes = kernel.ranges.shapes
        self.sizes = kernel.ranges.sizes
        # vector types and select helpers the printed body used (typedefs printed at the top)
        self._vector_types: dict[str, tuple[str, int]] = {}
        self._vector_selects: set[str] = set()

    # -- types and names -----------------------------------------------------------------
    def ctype(self, t: str) -> str:
        return self.half_type if t == "half" else c_type(t)

    def entry_name(self) -> str:
        return "tc_" + self.cdef.name

    # -- driver --------------------------------------------------------------------------
    def kernel_source(self, schedule: isl.Schedule) -> str:
        """The whole translation unit for ``schedule`` (annotated or not)."""
        ast = build_ast(self.k, schedule)
        self._vector_types: dict[str, tuple[str, int]] = {}
        self._vector_selects: set[str] = set()
        body = self.emit_node(ast, 1)
        lines = [self.emit_header(), self.prelude, *self.emit_vector_types(),
                 self.emit_signature() + " {"]
        if self.parallel_setup and self.pragma_parallel and any(
                self.pragma_parallel in x for x in body):
            lines.append("  " + self.parallel_setup)
        lines += self.emit_unpack()
        lines += self.emit_temps_alloc()
        lines += body
        lines += self.emit_temps_free()
        lines.append("}")
        return "\n".join(lines) + "\n"

    def emit_header(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        return (f"/* TC def {self.cdef.name} ({dims}); generated by tfx_vec.tc_ops */")

    def emit_signature(self) -> str:
        pre = self.kernel_prefix + " " if self.kernel_prefix else ""
        return f"{pre}void {self.entry_name()}(void* const* args)"

    def array_decl(self, name: str, dtype: str, shape: tuple, const: bool) -> str:
        """``T (*restrict X)[d1][d2]`` for a tensor of ``shape`` (a plain pointer for rank <= 1)."""
        q = "const " if const else ""
        t = self.ctype(dtype)
        if len(shape) <= 1:
            return f"{q}{t} *{self.restrict} {c_name(name)}"
        ext = "".join(f"[{n}]" for n in shape[1:])
        return f"{q}{t} (*{self.restrict} {c_name(name)}){ext}"

    def array_cast(self, dtype: str, shape: tuple, const: bool) -> str:
        q = "const " if const else ""
        t = self.ctype(dtype)
        if len(shape) <= 1:
            return f"({q}{t} *)"
        return f"({q}{t} (*){''.join(f'[{n}]' for n in shape[1:])})"

    def emit_unpack(self) -> list[str]:
        out, i = [], 0
        for p in self.cdef.inputs:
            if p.is_scalar:
                t = self.ctype(p.dtype)
                out.append(f"  const {t} {c_name(p.name)} = *(const {t} *)args[{i}];")
            else:
                sh = self.shapes[p.name]
                out.append(f"  {self.array_decl(p.name, p.dtype, sh, True)} = "
                           f"{self.array_cast(p.dtype, sh, True)}args[{i}];")
            i += 1
        for name in self.cdef.outputs:
            info, sh = self.cdef.tensors[name], self.shapes[name]
            out.append(f"  {self.array_decl(name, info.dtype, sh, False)} = "
                       f"{self.array_cast(info.dtype, sh, False)}args[{i}];")
            i += 1
        return out

    def emit_temps_alloc(self) -> list[str]:
        out = []
        for name in self.cdef.temps:
            info, sh = self.cdef.tensors[name], self.shapes[name]
            n = 1
            for d in sh:
                n *= d
            out.append(f"  {self.array_decl(name, info.dtype, sh, False)} = "
                       f"{self.array_cast(info.dtype, sh, False)}calloc({max(n, 1)}, "
                       f"sizeof({self.ctype(info.dtype)}));")
        return out

    def emit_temps_free(self) -> list[str]:
        return [f"  free((void *){c_name(n)});" for n in self.cdef.temps]

    # -- isl AST -------------------------------------------------------------------------
    def emit_node(self, node: isl.AstNode, ind: int, mark: str | None = None) -> list[str]:
        t = node.get_type()
        if t == isl.ast_node_type.block:
            # a mark right above a block belongs to the loops isl split that band member into
            # (e.g. an init statement peeled before the reduction loop)
            out = []
            for child in _ast_list(node.block_get_children()):
                out += self.emit_node(child, ind, mark if child.get_type() in (
                    isl.ast_node_type.for_, isl.ast_node_type.mark, isl.ast_node_type.block)
                    else None)
            return out
        if t == isl.ast_node_type.mark:
            inner, name = node.mark_get_node(), node.mark_get_id().get_name()
            if mark == MARK_OMP:
                # the OpenMP mark fell on a degenerate (single-iteration) loop: hand it to the
                # next loop down, which is safe while that loop is coincident or degenerate
                is_loop = inner.get_type() == isl.ast_node_type.for_
                if name == MARK_SIMD or (name == MARK_SEQ and not is_loop):
                    name = MARK_OMP
            return self.emit_node(inner, ind, name)
        if t == isl.ast_node_type.for_:
            return self.emit_for(node, ind, mark)
        if t == isl.ast_node_type.if_:
            return self.emit_if(node, ind)
        if t == isl.ast_node_type.user:
            return self.emit_user(node, ind)
        raise TcCompileError(f"C printer: isl produced an AST node of type {t}, which it cannot "
                             "print (an internal error; please report the TC)")  # pragma: no cover

    def emit_for(self, node: isl.AstNode, ind: int, mark: str | None) -> list[str]:
        pad = "  " * ind
        it = node.for_get_iterator().to_C_str()
        init = node.for_get_init().to_C_str()
        cond = node.for_get_cond().to_C_str()
        inc = node.for_get_inc().to_C_str()
        body = node.for_get_body()
        header = f"for (int {it} = {init}; {cond}; {it} += {inc}) {{"
        if mark == MARK_SEQ and self.options.vectorize:
            acc = self.emit_reduction_loop(body, it, header, ind)
            if acc is not None:
                return acc
        if self.pragma_simd and mark in (MARK_SIMD, MARK_OMP):
            found = contraction.match(self, node, mark)
            if found is not None:
                parallel = mark == MARK_OMP and self.options.parallel > 0 and \
                    contraction.work(found) >= contraction.PARALLEL_MIN_WORK
                lines = contraction.emit(self, found, ind, parallel)
                if lines is not None:
                    return lines
        if mark == MARK_SIMD and self.options.vectorize and self.jam > 1:
            jammed = self.emit_jammed(node, ind)
            if jammed is not None:
                return jammed
        out = [pad + p for p in self.loop_pragmas(mark, _is_innermost(body))]
        out.append(pad + header)
        out += self.emit_node(body, ind + 1)
        out.append(pad + "}")
        return out

    _OMP_REDUCTION = {"+=": "+", "*=": "*", "min=": "min", "max=": "max"}

    def _reduction_parts(self, body: isl.AstNode, it: str):
        """(statement, {var: C expr}) when ``body`` is one reduction update whose target does
        not move with loop iterator ``it``; else None."""
        if body.get_type() != isl.ast_node_type.user or not self.pragma_simd:
            return None
        expr = body.user_get_expr()
        st = self.k.stmt(expr.op_get_arg(0).get_id().get_name())
        if st.kind != "update":
            return None
        args = [expr.op_get_arg(i + 1).to_C_str() for i in range(expr.op_get_n_arg() - 1)]
        bind = dict(zip(st.vars, args))
        if any(_mentions_word(bind[v], it) for v in st.tc.lhs_vars):
            return None
        return st, bind

    def emit_reduction_loop(self, body: isl.AstNode, it: str, header: str, ind: int
                            ) -> list[str] | None:
        """An innermost reduction loop over one update statement whose target does not move
        with the loop: accumulate in a local (``simd reduction``), store once after the loop.

        None when the pattern does not apply (the loop is then printed as it is)."""
        parts = self._reduction_parts(body, it)
        if parts is None:
            return None
        st, bind = parts
        s = st.tc.stmt
        pad, t = "  " * ind, self.ctype(st.tc.dtype)
        lhs = self.access(s.lhs, [A.Ident(v, s.span) for v in s.lhs_indices], None)
        outer = " ".join(f"const int {c_name(v)} = {bind[v]};" for v in st.tc.lhs_vars)
        inner = " ".join(f"const int {c_name(v)} = {bind[v]};" for v in st.vars
                         if v not in st.tc.lhs_vars)
        upd = self.combine(s.op, "tc_acc", f"({self.expr(s.rhs)})", st.tc.dtype)
        return [f"{pad}{{ {outer}",
                f"{pad}  {t} tc_acc = {lhs};",
                f"{pad}  {self.pragma_simd} reduction({self._OMP_REDUCTION[s.op]}:tc_acc)",
                f"{pad}  {header}",
                f"{pad}    {{ {inner} tc_acc = ({t})({upd}); }}",
                f"{pad}  }}",
                f"{pad}  {lhs} = tc_acc;",
                f"{pad}}}"]

    # unroll-and-jam factor of a parallel loop around an innermost reduction: ``jam``
    # accumulators share each load of the reduction's other operand (register blocking)
    jam = 4

    def emit_jammed(self, node: isl.AstNode, ind: int) -> list[str] | None:
        """Unroll-and-jam a *coincident* loop whose body is straight-line statements plus one
        innermost reduction loop: iterations are independent, so running the statements of
        ``jam`` iterations side by side and their reductions in one loop is legal.

        None when the pattern does not apply."""
        it = node.for_get_iterator().to_C_str()
        last = _loop_last(node)
        if last is None:
            return None
        leaves = _flatten(node.for_get_body())
        loops = [n for n in leaves if n.get_type() == isl.ast_node_type.for_]
        if len(loops) != 1 or any(not _is_innermost(n) for n in leaves if n is not loops[0]):
            return None
        red = loops[0]
        rit = red.for_get_iterator().to_C_str()
        rbody = red.for_get_body()
        parts = self._reduction_parts(rbody, rit)
        if parts is None or red.for_get_inc().to_C_str() != "1":
            return None
        st, bind = parts
        rinit, rcond = red.for_get_init().to_C_str(), red.for_get_cond().to_C_str()
        if _mentions_word(rinit + " " + rcond, it) or \
                not any(_mentions_word(bind[v], it) for v in st.tc.lhs_vars):
            return None
        U, pad, s = self.jam, "  " * ind, st.tc.stmt
        t = self.ctype(st.tc.dtype)
        base = f"{it}_j"
        lhs = self.access(s.lhs, [A.Ident(v, s.span) for v in s.lhs_indices], None)
        binds = " ".join(f"const int {c_name(v)} = {bind[v]};" for v in st.vars)
        lhs_binds = " ".join(f"const int {c_name(v)} = {bind[v]};" for v in st.tc.lhs_vars)
        rhs = f"({self.expr(s.rhs)})"
        accs = ", ".join(f"tc_acc{u}" for u in range(U))
        out = [f"{pad}{{", f"{pad}  int {base} = {node.for_get_init().to_C_str()};",
               f"{pad}  for (; {base} + {U - 1} <= {last}; {base} += {U}) {{"]
        for leaf in leaves:
            if leaf is not red:
                for u in range(U):
                    out.append(f"{pad}    {{ const int {it} = {base} + {u};")
                    out += self.emit_node(leaf, ind + 3)
                    out.append(f"{pad}    }}")
                continue
            out.append(f"{pad}    {t} {accs};")
            out.append(f"{pad}    {t} *tc_p0" + "".join(f", *tc_p{u}" for u in range(1, U)) + ";")
            for u in range(U):
                out.append(f"{pad}    {{ const int {it} = {base} + {u}; {lhs_binds} "
                           f"tc_p{u} = &{lhs}; tc_acc{u} = *tc_p{u}; }}")
            out.append(f"{pad}    {self.pragma_simd} "
                       f"reduction({self._OMP_REDUCTION[s.op]}:{accs})")
            out.append(f"{pad}    for (int {rit} = {rinit}; {rcond}; {rit} += 1) {{")
            for u in range(U):
                upd = self.combine(s.op, f"tc_acc{u}", rhs, st.tc.dtype)
                out.append(f"{pad}      {{ const int {it} = {base} + {u}; {binds} "
                           f"tc_acc{u} = ({t})({upd}); }}")
            out.append(f"{pad}    }}")
            out += [f"{pad}    *tc_p{u} = tc_acc{u};" for u in range(U)]
        out.append(f"{pad}  }}")
        out.append(f"{pad}  for (int {it} = {base}; {it} <= {last}; {it} += 1) {{")
        out += self.emit_node(node.for_get_body(), ind + 2)
        out += [f"{pad}  }}", f"{pad}}}"]
        return out

    # -- contraction micro-kernel (codegen/contraction.py) --------------------------------
    # vector bytes of the micro-kernel when the options leave it open (0: this machine's widest)
    vector_bytes = 0

    def emit_vector_types(self) -> list[str]:
        """typedefs and unaligned load/store helpers of the vector types the body used."""
        out = []
        for name, (t, nbytes) in sorted(self._vector_types.items()):
            out += [f"typedef {t} {name} __attribute__((vector_size({nbytes})));",
                    f"static inline {name} {name}_ld(const {t} *p) "
                    f"{{ {name} v; __builtin_memcpy(&v, p, sizeof v); return v; }}",
                    f"static inline void {name}_st({t} *p, {name} v) "
                    f"{{ __builtin_memcpy(p, &v, sizeof v); }}"]
            if name in self._vector_selects:   # fmax/fmin lane by lane, NaN as C's fmaxf
                it = "int" if t == "float" else "long long"
                out.append(f"typedef {it} {name}i __attribute__((vector_size({nbytes})));")
                for fn, cmp in (("max", ">"), ("min", "<")):
                    out.append(f"static inline {name} {name}_{fn}({name} a, {name} b) {{ "
                               f"{name}i m = ({name}i)(a {cmp} b) | ({name}i)(b != b); "
                               f"return ({name})((({name}i)a & m) | (({name}i)b & ~m)); }}")
        return out

    # OpenMP's dynamic mode lets the runtime use fewer threads when the load average says the
    # cores are busy: on an oversubscribed machine a loop's end otherwise waits for a
    # descheduled thread (a 3-layer MLP measured 0.15 ms on one thread, 40-50 ms on two under a
    # load average of 7 on 2 cores)
    parallel_setup = "omp_set_dynamic(1);"

    # statement instances below which a kernel runs on one thread: starting a parallel region
    # costs more than it saves there (and far more on an oversubscribed machine)
    parallel_min_work = 1 << 22

    def total_work(self) -> int:
        total = 0
        for st in self.k.stmts:
            n = 1
            for lo, hi in st.ranges:
                n *= max(0, hi - lo)
            total += n
        return total

    def loop_pragmas(self, mark: str | None, innermost: bool) -> list[str]:
        """Pragmas for a loop: OpenMP threads on the ``omp`` loop, simd/unroll innermost."""
        o = self.options
        out = []
        if mark == MARK_OMP and o.parallel > 0 and self.total_work() >= self.parallel_min_work:
            out.append(self.pragma_parallel)
        if innermost and mark == MARK_SIMD and o.vectorize:
            out.append(self.pragma_simd)
        elif innermost and o.unroll > 1:   # both pragmas must directly precede the loop
            out.append(self.pragma_unroll.format(n=o.unroll))
        return out

    def emit_if(self, node: isl.AstNode, ind: int) -> list[str]:
        pad = "  " * ind
        out = [f"{pad}if ({node.if_get_cond().to_C_str()}) {{"]
        out += self.emit_node(node.if_get_then_node(), ind + 1)
        if node.if_has_else_node():
            out.append(pad + "} else {")
            out += self.emit_node(node.if_get_else_node(), ind + 1)
        out.append(pad + "}")
        return out

    def emit_user(self, node: isl.AstNode, ind: int) -> list[str]:
        expr = node.user_get_expr()
        name = expr.op_get_arg(0).get_id().get_name()
        args = [expr.op_get_arg(i + 1).to_C_str() for i in range(expr.op_get_n_arg() - 1)]
        st = self.k.stmt(name)
        pad = "  " * ind
        binds = " ".join(f"const int {c_name(v)} = {a};" for v, a in zip(st.vars, args))
        return [f"{pad}{{ {binds} {self.emit_stmt(st)} }}" if binds else
                f"{pad}{self.emit_stmt(st)}"]

    # -- TC statements and expressions ---------------------------------------------------
    def emit_stmt(self, st: PolyStmt) -> str:
        s = st.tc.stmt
        lhs = self.access(s.lhs, [A.Ident(v, s.span) for v in s.lhs_indices], None)
        t = st.tc.dtype
        ct = self.ctype(t)
        if st.kind == "init":
            return f"{lhs} = {self.neutral(s.op, t)};"
        rhs = self.expr(s.rhs)
        if st.kind == "assign":
            return f"{lhs} = ({ct})({rhs});"
        return f"{lhs} = ({ct})({self.combine(s.op, lhs, f'({rhs})', t)});"

    def neutral(self, op: str, t: str) -> str:
        f, si, ui = self._NEUTRAL[op]
        if is_float(t):
            return f
        if t == "bool":
            return {"+=": "0", "*=": "1", "min=": "1", "max=": "0"}[op]
        v = si if t.startswith("int") else ui
        return v.format(T=t.upper())

    def combine(self, op: str, acc: str, val: str, t: str) -> str:
        if op == "+=":
            return f"{acc} + {val}"
        if op == "*=":
            return f"{acc} * {val}"
        cmp = "<" if op == "min=" else ">"
        return f"({val} {cmp} {acc} ? {val} : {acc})"

    def access(self, name: str, subs, call: A.Call | None) -> str:
        sh = self.shapes[name]
        if not sh:
            return f"{c_name(name)}[0]"
        idx = []
        for d, (e, o) in enumerate(zip(subs, self.k.ranges.origin(name))):
            x = self.expr(e)
            if o:                        # the tensor's range starts at o: element x - o
                x = f"({x}) - {o}"
            if call is not None and id(call) in self.k.ranges.clamp and \
                    any(isinstance(y, A.Call) for y in A.walk(e)):
                x = f"tc_clamp({x}, 0, {sh[d] - 1})"
            idx.append(f"[{x}]")
        return c_name(name) + "".join(idx)

    def literal_float(self, e: A.FloatLit) -> str:
        t = self.cdef.types.get(id(e), "float")
        text = repr(float(e.value))
        return text if t == "double" else text + "f"

    def expr(self, e: A.Expr) -> str:
        """C text of a TC expression (index variables are C locals of the same name)."""
        if isinstance(e, A.IntLit):
            return str(e.value)
        if isinstance(e, A.FloatLit):
            return self.literal_float(e)
        if isinstance(e, A.Ident):
            if e.name in self.sizes:
                return str(self.sizes[e.name])
            return c_name(e.name)
        if isinstance(e, A.DimRef):
            return str(self.shapes[e.name][e.dim])
        if isinstance(e, A.Unary):
            return f"({e.op}{self.expr(e.operand)})"
        if isinstance(e, A.Binary):
            a, b = self.expr(e.lhs), self.expr(e.rhs)
            if e.op in ("/", "%") and not is_float(self.cdef.types.get(id(e), "float")):
                # integer x / 0 and INT_MIN / -1 trap on x86; NumPy gives 0 (and wraps)
                return f"tc_i{'div' if e.op == '/' else 'mod'}({a}, {b})"
            return f"({a} {e.op} {b})"
        if isinstance(e, A.Ternary):
            return f"({self.expr(e.cond)} ? {self.expr(e.then)} : {self.expr(e.other)})"
        if isinstance(e, A.Call):
            if e.name in self.cdef.tensors:
                return self.access(e.name, e.args, e)
            return self.call(e)
        raise TypeError(e)  # pragma: no cover

    def call(self, e: A.Call) -> str:
        t = self.cdef.types[id(e)]
        args = [self.expr(a) for a in e.args]
        cast = canonical(e.name)
        if cast is not None:
            return f"(({self.ctype(cast)})({args[0]}))"
        return self.emit_builtin(e.name, t, args)

    def emit_builtin(self, name: str, t: str, args: list[str]) -> str:
        """C for a TC builtin with result type ``t``."""
        dbl = t == "double"
        if name in ("max", "min", "abs") and not is_float(t):
            if name == "abs":
                return f"({args[0]} < 0 ? -{args[0]} : {args[0]})"
            return f"{name}({args[0]}, {args[1]})"
        base = {"max": "fmax", "min": "fmin", "abs": "fabs"}.get(name, name)
        if base == "sigmoid":
            return f"(1 / (1 + {'exp' if dbl else 'expf'}(-{args[0]})))"
        if base == "rsqrt":
            return f"(1 / {'sqrt' if dbl else 'sqrtf'}({args[0]}))"
        f32, f64 = _FLOAT_FUNCS[base]
        return f"{f64 if dbl else f32}({', '.join(args)})"


def _mentions_word(text: str, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", text) is not None


def _loop_last(node: isl.AstNode) -> str | None:
    """The last value of a unit-step ``for (it = ...; it <= X / it < X; ...)``, else None."""
    it = node.for_get_iterator().to_C_str()
    cond = node.for_get_cond()
    if node.for_get_inc().to_C_str() != "1" or cond.get_type() != isl.ast_expr_type.op:
        return None
    op = cond.op_get_type()
    if op not in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt) or \
            cond.op_get_arg(0).to_C_str() != it:
        return None
    last = cond.op_get_arg(1).to_C_str()
    if op == isl.ast_expr_op_type.lt:
        last = str(int(last) - 1) if last.lstrip("-").isdigit() else f"({last}) - 1"
    return last


def _const_last(node: isl.AstNode) -> int | None:
    """A constant bound on the last value of a ``for`` whose condition is ``it <= c``,
    ``it < c`` or ``it <= min(c, ...)``; else None."""
    cond = node.for_get_cond()
    if cond.get_type() != isl.ast_expr_type.op:
        return None
    op = cond.op_get_type()
    if op not in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt):
        return None
    bound = cond.op_get_arg(1)
    args = [bound]
    if bound.get_type() == isl.ast_expr_type.op and \
            bound.op_get_type() == isl.ast_expr_op_type.min:
        args = [bound.op_get_arg(i) for i in range(bound.op_get_n_arg())]
    consts = [int(a.int_get_val().to_python()) for a in args
              if a.get_type() == isl.ast_expr_type.int]
    if not consts:
        return None
    return min(consts) - (1 if op == isl.ast_expr_op_type.lt else 0)


def _for_header(node: isl.AstNode) -> str:
    it = node.for_get_iterator().to_C_str()
    return (f"for (int {it} = {node.for_get_init().to_C_str()}; "
            f"{node.for_get_cond().to_C_str()}; {it} += {node.for_get_inc().to_C_str()})")


def _unmark(node: isl.AstNode) -> tuple[str | None, isl.AstNode]:
    """(name of the innermost mark wrapping ``node``, the node under the marks)."""
    name = None
    while node.get_type() == isl.ast_node_type.mark:
        name = node.mark_get_id().get_name()
        node = node.mark_get_node()
    return name, node


def _flatten(node: isl.AstNode) -> list:
    """The statements of ``node`` with marks and nested blocks removed, in order."""
    t = node.get_type()
    if t == isl.ast_node_type.mark:
        return _flatten(node.mark_get_node())
    if t == isl.ast_node_type.block:
        return [x for c in _ast_list(node.block_get_children()) for x in _flatten(c)]
    return [node]


def _ast_list(lst) -> list:
    return [lst.get_at(i) for i in range(lst.n_ast_node())]


def _is_innermost(node: isl.AstNode) -> bool:
    found = []

    def visit(n):
        if n.get_type() == isl.ast_node_type.for_:
            found.append(n)
        return True

    node.foreach_descendant_top_down(visit)
    return not found
