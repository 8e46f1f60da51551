"""The two intermediate representations of autobatch (the paper's Figures 2 and 4).

*Function IR* (what the front end produces, what the local-static runtime runs):
a :class:`Program` of :class:`Function` s, each a list of :class:`Block` s of operations
(:class:`Primitive`, :class:`Call`) ended by a terminator (:class:`Jump`, :class:`Branch`,
:class:`Return`).  Variable names are local to their function.

*Stack-machine IR* (what lowering produces, what the program-counter and NumPy runtimes run):
one flat list of blocks for the whole program, variable names qualified as ``function.var``,
calls replaced by :class:`Push` / :class:`Pop` (per-variable caller-saves stacks), arguments moved
by :class:`Primitive` s, and the terminators :class:`PushJump` / :class:`Return`.  Stack
optimization adds :class:`Update` (``Pop ... Push`` fused: store the top in place) and
:class:`Peek` (``Pop ... Push`` fused: reload the top in place).

All nodes are frozen; passes build new programs with :func:`dataclasses.replace`.
Variables hold a (nested tuple/namedtuple) structure of tensors with a leading batch dimension.

Example:
    >>> b = Block("entry", (), Return("ret"))
    >>> f = Function("f", ("x",), (b,), "x", "f.py:1")
    >>> print(format_function(f).splitlines()[0])
    def f(x):  # f.py:1
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

__all__ = ["Primitive", "Call", "Push", "Pop", "Update", "Peek", "Jump", "Branch", "Return",
           "PushJump", "Block", "Function", "Program", "TEMPORARY", "REGISTER", "STACK",
           "format_function", "format_program", "reads", "writes", "successors", "when_mask",
           "move", "is_move", "constant", "constant_value", "transfers"]

TEMPORARY, REGISTER, STACK = "temporary", "register", "stack"


# {{{ operations

@dataclasses.dataclass(frozen=True)
class Primitive:
    """``outputs = fn(*inputs)``: straight-line, member-independent TF code.

    ``fn`` takes one value per input (a structure of batched tensors) and returns a tuple with
    one value per output.  It is run on the whole batch (or on the gathered active members);
    the runtime masks or scatters its results.  ``text`` is the source it came from, ``loc``
    its ``file:line``.  ``when`` (stack-machine IR, from :mod:`.passes.merge_blocks`):
    ``(condition variable, polarity)`` pairs; the outputs are written only for members where
    every condition has its polarity (an if-converted branch arm).
    """
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    fn: Callable[..., tuple] = dataclasses.field(compare=False)
    text: str = ""
    loc: str = ""
    when: tuple[tuple[str, bool], ...] = ()


@dataclasses.dataclass(frozen=True)
class Call:
    """``output = callee(*args)`` where ``callee`` is a batched function of the program."""
    callee: str
    args: tuple[str, ...]
    output: str
    loc: str = ""


@dataclasses.dataclass(frozen=True)
class Push:
    """Save the current value of ``var`` on its stack (stack-machine IR)."""
    var: str


@dataclasses.dataclass(frozen=True)
class Pop:
    """Restore ``var`` from its stack (stack-machine IR)."""
    var: str


@dataclasses.dataclass(frozen=True)
class Update:
    """Fused ``Pop var ... Push var`` where ``var`` was written in between: store the current
    value into the top stack slot in place, without moving the stack pointer."""
    var: str


@dataclasses.dataclass(frozen=True)
class Peek:
    """Fused ``Pop var ... Push var`` where ``var`` was read in between: reload the current
    value from the top stack slot without moving the stack pointer."""
    var: str


def _move(*values):
    return values


def move(outputs: tuple, inputs: tuple, loc: str = "") -> Primitive:
    """A primitive assigning ``inputs`` to ``outputs`` all at once (a parallel move)."""
    text = f"{', '.join(outputs)} = {', '.join(inputs)}"
    return Primitive(tuple(inputs), tuple(outputs), _move, text, loc)


def is_move(op: Any) -> bool:
    """Is ``op`` a move made by :func:`move` (its outputs equal its inputs)?"""
    return isinstance(op, Primitive) and op.fn is _move


@dataclasses.dataclass(frozen=True)
class _Constant:
    value: Any

    def __call__(self):
        return (self.value,)


def constant(output: str, value: Any, loc: str = "") -> Primitive:
    """A primitive assigning a Python constant (a flag's ``True``/``False``) to ``output``."""
    return Primitive((), (output,), _Constant(value), f"{output} = {value!r}", loc)


def constant_value(op: Any) -> tuple[bool, Any]:
    """``(True, value)`` if ``op`` was made by :func:`constant`, else ``(False, None)``."""
    if isinstance(op, Primitive) and isinstance(op.fn, _Constant):
        return True, op.fn.value
    return False, None


Op = Any  # Primitive | Call | Push | Pop | Update | Peek

# }}}

# {{{ terminators

@dataclasses.dataclass(frozen=True)
class Jump:
    target: int


@dataclasses.dataclass(frozen=True)
class Branch:
    """Go to ``true`` for members whose ``cond`` is true, ``false`` for the others.

    ``logic`` (Function IR, from the front end): what ``cond`` is, as a formula over the
    variables the block's op reads -- ``("var", name)``, ``("const", bool)``, ``("not", f)``,
    ``("and", f, g)``, ``("or", f, g)``, or ``("?",)`` for anything else; jump threading
    (:mod:`.passes.thread_jumps`) evaluates it where some variables are known constants.
    """
    cond: str
    true: int
    false: int
    loc: str = ""
    logic: tuple = dataclasses.field(default=("?",), compare=False)


@dataclasses.dataclass(frozen=True)
class Return:
    """Function IR: return ``value``.  Stack-machine IR: pop the program counter, or, when
    ``target`` is set (the function has a single return address), go there directly."""
    value: str | None = None
    target: int | None = None


@dataclasses.dataclass(frozen=True)
class PushJump:
    """Stack-machine IR: push ``return_to`` on the program-counter stack, go to ``target``.

    ``push=False``: the callee returns to ``return_to`` statically (see
    :mod:`.passes.static_returns`), so nothing is pushed."""
    target: int
    return_to: int
    push: bool = True

# }}}


@dataclasses.dataclass(frozen=True)
class Block:
    name: str
    ops: tuple
    terminator: Any


@dataclasses.dataclass(frozen=True)
class Function:
    """A batched function: parameters, blocks (entry is block 0), its result variable."""
    name: str
    params: tuple[str, ...]
    blocks: tuple[Block, ...]
    result: str
    loc: str = ""


@dataclasses.dataclass(frozen=True)
class Program:
    """A whole program.

    Function IR: ``functions`` (name -> Function) with ``main``; ``blocks`` is empty.
    Stack-machine IR (``lowered``): ``blocks`` is the flat block list (entry 0), ``params`` the
    qualified parameters of main, ``result`` main's qualified result, ``entries`` the entry block
    of each function and ``owners`` the function of each block.  ``allocation`` maps each
    variable to TEMPORARY / REGISTER / STACK once the allocation pass ran; ``notes`` lists the
    passes and optimizations applied; ``liveness`` holds the analysis a liveness pass attached.
    """
    functions: Mapping[str, Function]
    main: str
    lowered: bool = False
    blocks: tuple[Block, ...] = ()
    params: tuple[str, ...] = ()
    result: str = ""
    entries: Mapping[str, int] = dataclasses.field(default_factory=dict)
    owners: tuple[str, ...] = ()
    allocation: Mapping[str, str] = dataclasses.field(default_factory=dict)
    liveness: Mapping[Any, Any] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def variables(self) -> list[str]:
        """Every variable of a lowered program, in order of first appearance."""
        seen: dict[str, None] = dict.fromkeys(self.params)
        for block in self.blocks:
            for op in block.ops:
                for v in reads(op) + writes(op):
                    seen.setdefault(v)
            for v in _terminator_reads(block.terminator):
                seen.setdefault(v)
        if self.result:
            seen.setdefault(self.result)
        return list(seen)


# {{{ def-use helpers shared by the passes and runtimes

def reads(op: Op) -> tuple[str, ...]:
    """Variables whose current value ``op`` reads (stack traffic counts as a read for Push)."""
    if isinstance(op, Primitive):
        # a predicated write keeps the old value where its condition fails: it reads it too
        kept = op.outputs if op.when else ()
        return op.inputs + tuple(dict.fromkeys([c for c, _ in op.when] + list(kept)))
    if isinstance(op, Call):
        return op.args
    if isinstance(op, (Push, Update)):
        return (op.var,)
    return ()


def writes(op: Op) -> tuple[str, ...]:
    """Variables whose current value ``op`` overwrites."""
    if isinstance(op, Primitive):
        return op.outputs
    if isinstance(op, Call):
        return (op.output,)
    if isinstance(op, (Pop, Peek)):
        return (op.var,)
    return ()


def when_mask(op: Primitive, read: Callable[[str], Any], both: Callable[[Any, Any], Any]) -> Any:
    """Where an if-converted primitive writes (see ``Primitive.when``), or None: everywhere.

    ``read`` gives a condition variable as booleans, ``both`` is elementwise *and* (the
    runtimes pass TF's or NumPy's)."""
    mask = None
    for c, polarity in op.when:
        m = read(c) if polarity else ~read(c)
        mask = m if mask is None else both(mask, m)
    return mask


def _terminator_reads(t: Any) -> tuple[str, ...]:
    if isinstance(t, Branch):
        return (t.cond,)
    if isinstance(t, Return) and t.value is not None:
        return (t.value,)
    return ()


def terminator_reads(t: Any) -> tuple[str, ...]:
    return _terminator_reads(t)


def successors(t: Any) -> tuple[int, ...]:
    """Intraprocedural successors of a terminator (PushJump: only the callee's entry)."""
    if isinstance(t, Jump):
        return (t.target,)
    if isinstance(t, Branch):
        return (t.true, t.false)
    if isinstance(t, PushJump):
        return (t.target,)
    return ()


def transfers(t: Any) -> tuple[int, ...]:
    """Every block terminator ``t`` can pass control to, calls and static returns included
    (a ``pushjump``'s continuation is reached later, through the callee's return)."""
    if isinstance(t, PushJump):
        return (t.target, t.return_to)
    if isinstance(t, Return):
        return () if t.target is None else (t.target,)
    return successors(t)

# }}}

# {{{ printing

def format_op(op: Op) -> str:
    if isinstance(op, Primitive):
        outs = ", ".join(op.outputs) or "_"
        when = " and ".join(c if polarity else f"not {c}" for c, polarity in op.when)
        return f"{outs} = prim({', '.join(op.inputs)}){' when ' + when if when else ''}" \
            f"  # {op.text}"
    if isinstance(op, Call):
        return f"{op.output} = call {op.callee}({', '.join(op.args)})"
    return f"{type(op).__name__.lower()} {op.var}"


def format_terminator(t: Any, names: list[str]) -> str:
    if isinstance(t, Jump):
        return f"jump {names[t.target]}"
    if isinstance(t, Branch):
        return f"branch {t.cond} ? {names[t.true]} : {names[t.false]}"
    if isinstance(t, PushJump):
        kind = "pushjump" if t.push else "jump (return address static)"
        return f"{kind} {names[t.target]} then {names[t.return_to]}"
    if isinstance(t, Return):
        to = "" if t.target is None else (
            f" to {names[t.target]}" if t.target < len(names) else " to halt")
        return "return" + (f" {t.value}" if t.value else "") + to
    return repr(t)


def _format_blocks(blocks: tuple[Block, ...], indent: str) -> list[str]:
    names = [b.name for b in blocks]
    lines = []
    for i, b in enumerate(blocks):
        lines.append(f"{indent}{i}: {b.name}:")
        lines += [f"{indent}    {format_op(op)}" for op in b.ops]
        lines.append(f"{indent}    {format_terminator(b.terminator, names)}")
    return lines


def format_function(f: Function) -> str:
    head = f"def {f.name}({', '.join(f.params)}):" + (f"  # {f.loc}" if f.loc else "")
    return "\n".join([head] + _format_blocks(f.blocks, "  ") + [f"  result: {f.result}"])


def format_program(p: Program) -> str:
    """Stable text of a program (golden tests compare it)."""
    if not p.lowered:
        return "\n\n".join(format_function(f) for f in p.functions.values())
    lines = [f"program {p.main}({', '.join(p.params)}) -> {p.result}"]
    lines += [f"  entry {name}: block {i}" for name, i in p.entries.items()]
    lines += _format_blocks(p.blocks, "  ")
    return "\n".join(lines)

# }}}
