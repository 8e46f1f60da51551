"""Jump threading over flags (Function IR): a branch whose outcome a predecessor already knows
is skipped on that edge.

AutoGraph lowers ``break``, ``continue`` and early ``return`` to flags: the block that returns
early sets ``do_return = True`` and ``retval_``, then control reaches the loop test
(``not do_return and ...``) and the guard after the loop (``if not do_return:``) before the
final ``return``.  A member there walks through two more blocks, each a step of the runtimes
and a register the program-counter runtime must carry.  When a block's constants (the
front end emits flag assignments as :func:`ir.constant` ops) decide the formula of the branch
it jumps to (:attr:`ir.Branch.logic`) and that branch's block only computes its condition, the
jump goes straight to the branch's target -- repeatedly, so an early ``return`` in a loop
returns at once.  A flag whose every assignment is the same constant (``do_return`` once
the early return no longer needs it) is that constant wherever it is read: primitives get it
bound in, branches on it are decided.  Then constant assignments nothing reads are dropped, and
blocks nothing reaches any more (empty blocks that only jump are jumped past).

Example:
    >>> from tfx_vec import autobatch as ab
    >>> from tfx_vec.autobatch import ir
    >>> from tfx_vec.autobatch.frontend import compile_program
    >>> @ab.function
    ... def first_divisor(n):
    ...     for d in range(2, n):
    ...         if n % d == 0:
    ...             return d
    ...     return n
    >>> before = compile_program(first_divisor).functions["first_divisor"]
    >>> after = thread_jumps(compile_program(first_divisor)).functions["first_divisor"]
    >>> sum(isinstance(b.terminator, ir.Return) for b in after.blocks), len(before.blocks) - \\
    ...     len(after.blocks)
    (2, 3)
"""
from __future__ import annotations

import dataclasses

from .. import ir
from .liveness import block_liveness

__all__ = ["thread_jumps", "evaluate"]


def evaluate(formula: tuple, known: dict[str, bool]) -> bool | None:
    """``formula``'s value where the variables in ``known`` have those values, or None."""
    kind = formula[0]
    if kind == "const":
        return formula[1]
    if kind == "var":
        return known.get(formula[1])
    if kind == "not":
        v = evaluate(formula[1], known)
        return None if v is None else not v
    if kind in ("and", "or"):
        a, b = evaluate(formula[1], known), evaluate(formula[2], known)
        absorbing = kind == "or"  # True absorbs `or`, False absorbs `and`
        if absorbing in (a, b):
            return absorbing
        return None if a is None or b is None else a if kind == "and" else a or b
    return None


def _global_flags(f: ir.Function) -> dict[str, bool]:
    """Flags every write of which is the same constant: that constant wherever they are read
    (a flag is assigned before it is read: :func:`.canonical.strip_return_guards`)."""
    values: dict[str, set] = {}
    for b in f.blocks:
        for op in b.ops:
            is_const, value = ir.constant_value(op)
            for v in ir.writes(op):
                values.setdefault(v, set()).add(value if is_const and isinstance(value, bool)
                                                else None)
    return {v: next(iter(vals)) for v, vals in values.items()
            if len(vals) == 1 and None not in vals and v not in f.params}


@dataclasses.dataclass(frozen=True)
class _Bound:
    """A primitive's function with some inputs fixed to constants."""
    fn: object
    arity: int
    fixed: tuple  # (position, value) pairs

    def __call__(self, *args):
        args, fixed = list(args), dict(self.fixed)
        full = [fixed[k] if k in fixed else args.pop(0) for k in range(self.arity)]
        return self.fn(*full)


def _substitute(f: ir.Function, flags: dict[str, bool]) -> ir.Function:
    """Primitives read global flags as the constants they are (so nothing carries them)."""
    blocks = []
    for b in f.blocks:
        ops = []
        for op in b.ops:
            fixed = tuple((k, flags[v]) for k, v in enumerate(getattr(op, "inputs", ()))
                          if v in flags)
            if isinstance(op, ir.Primitive) and fixed:
                op = dataclasses.replace(
                    op, inputs=tuple(v for v in op.inputs if v not in flags),
                    fn=_Bound(op.fn, len(op.inputs), fixed))
            ops.append(op)
        blocks.append(dataclasses.replace(b, ops=tuple(ops)))
    return dataclasses.replace(f, blocks=tuple(blocks))


def _known_after(block: ir.Block, flags: dict[str, bool]) -> dict[str, bool]:
    """The flags known at the end of ``block``: the global ones, and those its constant ops
    leave set (a later write forgets them)."""
    known: dict[str, bool] = dict(flags)
    for op in block.ops:
        is_const, value = ir.constant_value(op)
        for v in ir.writes(op):
            known.pop(v, None)
        if is_const and isinstance(value, bool):
            known[op.outputs[0]] = value
    return known


def _decided(f: ir.Function, live_in: list, j: int, known: dict[str, bool]) -> int | None:
    """Where block ``j``'s branch sends members arriving with ``known``, if ``j`` only
    computes that branch's condition (dead afterwards) and ``known`` decides it."""
    b = f.blocks[j]
    t = b.terminator
    if not (isinstance(t, ir.Branch) and len(b.ops) == 1 and isinstance(b.ops[0], ir.Primitive)
            and b.ops[0].outputs == (t.cond,)):
        return None
    value = evaluate(t.logic, known)
    if value is None:
        return None
    target = t.true if value else t.false
    return None if t.cond in live_in[target] else target


def _thread(f: ir.Function, flags: dict[str, bool]) -> tuple[ir.Function, int]:
    live_in, _ = block_liveness(f.blocks, lambda i: ir.successors(f.blocks[i].terminator))
    blocks, count = list(f.blocks), 0

    def follow(j: int, known: dict[str, bool]) -> int:
        nonlocal count
        seen = set()
        while j not in seen:
            seen.add(j)
            b = f.blocks[j]
            if not b.ops and isinstance(b.terminator, ir.Jump):
                j = b.terminator.target  # an empty block: go past it
                continue
            nxt = _decided(f, live_in, j, known)
            if nxt is None:
                return j
            j, count = nxt, count + 1
        return j

    for i, b in enumerate(f.blocks):
        known, t = _known_after(b, flags), b.terminator
        if isinstance(t, ir.Jump):
            t = ir.Jump(follow(t.target, known))
            target = f.blocks[t.target]
            if not target.ops and isinstance(target.terminator, ir.Return):
                t = target.terminator
        elif isinstance(t, ir.Branch):
            t = dataclasses.replace(t, true=follow(t.true, known), false=follow(t.false, known))
        blocks[i] = dataclasses.replace(b, terminator=t)
    return dataclasses.replace(f, blocks=tuple(blocks)), count


def _drop_dead_constants(f: ir.Function) -> ir.Function:
    _, after = block_liveness(f.blocks, lambda i: ir.successors(f.blocks[i].terminator))
    blocks = []
    for i, b in enumerate(f.blocks):
        ops = tuple(op for k, op in enumerate(b.ops)
                    if not (ir.constant_value(op)[0] and op.outputs[0] not in after[(i, k)]))
        blocks.append(dataclasses.replace(b, ops=ops))
    return dataclasses.replace(f, blocks=tuple(blocks))


def _reachable(f: ir.Function) -> ir.Function:
    """Only the blocks the entry reaches, renumbered in their order."""
    seen, todo = set(), [0]
    while todo:
        i = todo.pop()
        if i not in seen:
            seen.add(i)
            todo.extend(ir.successors(f.blocks[i].terminator))
    keep = sorted(seen)
    index = {old: new for new, old in enumerate(keep)}

    def renumber(t):
        if isinstance(t, ir.Jump):
            return ir.Jump(index[t.target])
        if isinstance(t, ir.Branch):
            return dataclasses.replace(t, true=index[t.true], false=index[t.false])
        return t
    return dataclasses.replace(f, blocks=tuple(
        dataclasses.replace(f.blocks[i], name=f"{f.name}.{index[i]}",
                            terminator=renumber(f.blocks[i].terminator)) for i in keep))


def thread_jumps(program: ir.Program) -> ir.Program:
    """Thread jumps over branches that flags decide (see the module docstring)."""
    if program.lowered:
        raise ValueError("thread_jumps: runs on the Function IR, before lowering")
    functions, total = {}, 0
    for name, f in program.functions.items():
        while True:  # threading can make a flag's last other assignment dead: again
            flags = _global_flags(f)
            new, count = _thread(_substitute(f, flags), flags)
            new = _reachable(_drop_dead_constants(new))
            total += count
            if ir.format_function(new) == ir.format_function(f):
                break
            f = new
        functions[name] = f
    return dataclasses.replace(program, functions=functions, notes=program.notes + (
        f"jump threading: {total} branches skipped where flags decide them",))
