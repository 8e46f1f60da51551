"""The lazy IR: frozen nodes (op, inputs, attrs, shape, dtype) and the canonical program key.

A :class:`Node` is never mutated after construction; a lazy tensor changes value by pointing at a
new node (substitution).  Leaves are parameters of the program that computes them:

- ``data``: a materialized ``tf.Tensor`` (``value``), an input by shape and dtype, never by value;
- ``var``: the current buffer of a ``tf.Variable`` (``value``), passed as a resource;
- ``scalar``: a Python number other than 0 and +-1 (``value``), so a new learning rate does not
  recompile;
- ``const``: a baked constant (0, +-1, bools, small int lists such as shapes and axes) in ``attrs``.

Every other node is an op from ``ops.OPS`` (``attrs`` hold its non-tensor arguments), ``out``
(element ``attrs[0]`` of a multi-output op) or ``grad`` (gradients of ``inputs[0]`` with respect to
``inputs[1:]``, built at lowering time; ``attrs`` hold the tape's window of creation stamps, which
the key turns into the indices of the entries the tape recorded).

:func:`canonicalize` numbers the nodes reachable from a program's outputs in post-order and
returns a hashable key that names ops, attrs, shapes, dtypes and the wiring but no data: two
steps of a training loop get the same key, so the second one hits the compile cache.

Example:
    >>> import tensorflow as tf
    >>> a = Node.leaf("data", tf.ones([2, 4]))
    >>> b = Node("math.multiply", (a, a), (), (2, 4), tf.float32)
    >>> print(text([b]))
    IR {
      %0 = f32[2,4] data()
      %1 = f32[2,4] math.multiply(%0, %0), ROOT=0
    }
"""
from __future__ import annotations

import hashlib
import itertools
from typing import Any, NamedTuple, Sequence

import tensorflow as tf

__all__ = ["Node", "Program", "Key", "canonicalize", "text", "short_dtype", "key_hash",
           "Recording", "RECORDING", "describe_change"]

PARAM_OPS = frozenset({"data", "var", "scalar"})
LEAF_OPS = frozenset({"data", "var", "scalar", "const"})
serials = itertools.count()   # creation stamps: a lazy.GradientTape records a window of them


class Node:
    """One IR node.  Treat as frozen: construct a new node instead of changing one."""

    __slots__ = ("op", "inputs", "attrs", "shape", "dtype", "value", "sig", "serial", "pos",
                 "__weakref__")

    def __init__(self, op: str, inputs: tuple, attrs: tuple, shape: tuple | None,
                 dtype: tf.DType | None, value: Any = None, serial: int | None = None,
                 sig: tuple | None = None):
        self.op = op
        self.inputs = inputs
        self.attrs = attrs
        self.shape = shape
        self.dtype = dtype
        self.value = value
        # (shape, dtype enum): what keys compare on (tf.DType.__eq__ is slow Python code); a
        # caller that knows it (the recorder, per op) passes it
        self.sig = sig if sig is not None or dtype is None else (shape, dtype.as_datatype_enum)
        self.serial = next(serials) if serial is None else serial
        if op in LEAF_OPS:
            self.pos = -1
            return
        # Append this op to the recording's structural log (see ``Recording``), inline: it
        # runs once per recorded op.
        rec = RECORDING
        base = rec.base
        refs = []
        log = rec.log
        for x in inputs:
            p = x.pos
            if p < base:
                if x.op in LEAF_OPS:   # Recording.first_sight, inline: a leaf's first use
                    p = x.pos = base + len(log)
                    log.append(("leaf", x.op, x.attrs, x.sig))
                    rec.nodes.append(x)
                else:
                    p = rec.first_sight(x)
            refs.append(p - base)
        refs = tuple(refs)
        if serial is not None or op == "grad":  # a rewritten node (old stamp), or a window
            attrs = rec.window(self, attrs, serial)
        self.pos = base + len(log)
        log.append((op, attrs, self.sig, refs))
        rec.nodes.append(self)

    @staticmethod
    def outputs(base: "Node", sigs: Sequence[tuple], first: int = 0,
                memo: list | None = None) -> list:
        """``out`` nodes ``first``, ``first + 1``... of ``base`` (a node just recorded), one
        per ``(shape, dtype, sig)``: what ``Node("out", (base,), (i,), shape, dtype)`` makes,
        without its general path (a library call has one output per variable it updates).

        ``memo``, a list the caller keeps per call site, keeps the log entries of the last call:
        they are reused when ``sigs`` is the same object (the caller never changes it) and
        ``base`` sits at the same log position, so a repeated step logs the same tuples (equal
        fingerprints then compare by identity) without building them again."""
        rec = RECORDING
        log, nodes = rec.log, rec.nodes
        start = rec.base
        at = base.pos - start
        if memo is not None and memo and memo[0] == at and memo[1] is sigs:
            entries = memo[2]
        else:
            ref = (at,)
            entries = [("out", (i,), sig, ref) for i, (_, _, sig) in enumerate(sigs, first)]
            if memo is not None:
                memo[:] = [at, sigs, entries]
        inputs = (base,)
        new = Node.__new__
        out = []
        pos = start + len(log)
        for (shape, dtype, sig), entry in zip(sigs, entries):
            n = new(Node)
            n.op, n.inputs, n.attrs, n.shape, n.dtype, n.value = \
                "out", inputs, entry[1], shape, dtype, None
            n.sig, n.serial, n.pos = sig, next(serials), pos
            pos += 1
            out.append(n)
        log.extend(entries)
        nodes.extend(out)
        return out

    @classmethod
    def leaf(cls, op: str, value: Any, attrs: tuple = ()) -> "Node":
        """A parameter node (``data`` or ``var``) holding ``value``'s shape and dtype."""
        return cls(op, (), attrs, tuple(value.shape.as_list()), value.dtype, value)

    @property
    def pending(self) -> bool:
        """True when computing this node needs a program run (it is not a materialized leaf)."""
        return self.op not in ("data", "const", "scalar")

    def key(self) -> str:
        """Content hash (sha256) over op, attrs, shape, dtype and the input keys.

        Parameters hash by kind, shape and dtype only: their values are inputs, not structure.
        """
        parts = [self.op, repr(self.attrs), repr(self.shape), short_dtype(self.dtype)]
        parts += [i.key() for i in self.inputs]
        return hashlib.sha256("|".join(parts).encode()).hexdigest()

    def __repr__(self) -> str:
        return f"<Node {id(self):#x} {short_dtype(self.dtype)}{list(self.shape or ())} {self.op}>"


class Recording:
    """The structural log of the ops recorded since the last barrier: the trace cache's key.

    Every non-leaf :class:`Node` appends ``(op, attrs, (shape, dtype), input positions)`` when
    it is constructed, and every leaf gets a ``("leaf", op, attrs, (shape, dtype))`` entry the
    first time a logged node (or the barrier, for outputs and assigns) uses it; a node's
    ``pos`` is its global position (``base`` + index), so inputs are numbered in O(1) without
    walking the graph.  Two steps whose logs, outputs and assigns are equal record isomorphic
    graphs, hence the same canonical program with parameters at the same log positions: the
    barrier can reuse the last :func:`canonicalize` result instead of walking the graph again.
    ``ok`` turns false when the log cannot prove that (an input recorded before the last
    barrier, a rewritten node with an old creation stamp); the barrier then canonicalizes.

    Example (two recordings of ``x * x`` on different data):
        >>> prints = []
        >>> for _ in range(2):
        ...     RECORDING.reset()
        ...     a = Node.leaf("data", tf.ones([2]))
        ...     b = Node("math.multiply", (a, a), (), (2,), tf.float32)
        ...     prints.append(RECORDING.fingerprint([b], []))
        >>> prints[0] == prints[1], prints[0][0][1][3]
        (True, (0, 0))
    """

    __slots__ = ("base", "log", "nodes", "ok")

    def __init__(self) -> None:
        self.base = 0
        self.log: list = []
        self.nodes: list = []
        self.ok = True

    def first_sight(self, node: "Node") -> int:
        """The position of ``node`` in this log, logging a leaf on its first use."""
        if node.pos >= self.base:
            return node.pos
        if node.op not in LEAF_OPS:  # pending work recorded before the last barrier
            self.ok = False
            return self.base - 1
        node.pos = self.base + len(self.log)
        self.log.append(("leaf", node.op, node.attrs, node.sig))
        self.nodes.append(node)
        return node.pos

    def window(self, node: "Node", attrs: tuple, serial: int | None) -> tuple:
        """A ``grad`` node's attrs with its window of creation stamps as log positions."""
        if serial is not None or node.op != "grad":
            self.ok = False
            return attrs
        n_src, n_og, start, end = attrs
        bounds = []
        for stamp in (start, end):
            bounds.append(next((i for i, n in enumerate(self.nodes)
                                if n.op not in LEAF_OPS and n.serial >= stamp),
                               len(self.nodes)))
        return (n_src, n_og, *bounds)

    def fingerprint(self, outputs: Sequence["Node"],
                    assigns: Sequence[tuple["Node", "Node"]]) -> tuple | None:
        """The key of this recording's program in the trace cache (``None``: not provable)."""
        base = self.base
        seen = self.first_sight   # called only for a node not logged yet (first_sight's test)
        outs = tuple([(n.pos if n.pos >= base else seen(n)) - base for n in outputs])
        sets = tuple([((v.pos if v.pos >= base else seen(v)) - base,
                       (n.pos if n.pos >= base else seen(n)) - base) for v, n in assigns])
        if not self.ok:
            return None
        return (tuple(self.log), outs, sets)

    def params(self, prog: "Program") -> tuple | None:
        """Log positions of ``prog``'s parameters (data, scalars, variables), in its order."""
        base = self.base
        found: tuple = ([], [], [])
        for node, i in sorted(prog.index.items(), key=lambda item: item[1]):
            if node.op in PARAM_OPS:
                if node.pos < base:
                    return None
                found[("data", "scalar", "var").index(node.op)].append(node.pos - base)
        return tuple(tuple(f) for f in found)

    def reset(self) -> None:
        """Start a new log (called by every barrier)."""
        self.base += len(self.log) + 1
        self.log = []
        self.nodes = []
        self.ok = True


RECORDING = Recording()


class Key(tuple):
    """A program key that computes its (deep) hash once: the compile cache and the trace cache
    look the same key up several times per step."""

    def __new__(cls, items: tuple) -> "Key":
        self = super().__new__(cls, items)
        self._hash = tuple.__hash__(self)
        return self

    def __hash__(self) -> int:
        return self._hash


class Program(NamedTuple):
    """A canonical program: what the compile cache keys on, plus its parameters' values."""

    key: tuple            # (entries, output indices, (var entry, value entry) assigns); an
    #                       entry is (op, attrs, (shape, dtype enum), input entries) or
    #                       (param kind, (shape, dtype enum))
    data: list            # tf.Tensors, in parameter order
    scalars: list         # Python numbers, in parameter order
    variables: list       # tf.Variables, in parameter order
    index: dict           # node -> entry index


def short_dtype(dtype: tf.DType | None) -> str:
    """``f32``, ``i64``, ``b``... as in the paper's Figure 1."""
    if dtype is None:
        return "tuple"
    name = dtype.name
    for long, short in (("float", "f"), ("bfloat", "bf"), ("uint", "u"), ("int", "i"),
                        ("complex", "c"), ("bool", "pred")):
        if name.startswith(long):
            return short + name[len(long):]
    return name


def _post_order(roots: Sequence[Node]) -> list[Node]:
    """Nodes reachable from ``roots``, inputs before users (iterative: traces can be long).

    Nodes compare by identity, so they key sets and dicts directly.
    """
    seen: set = set()
    order: list[Node] = []
    for root in roots:
        if root in seen:
            continue
        stack = [(root, iter(root.inputs))]
        seen.add(root)
        while stack:
            node, it = stack[-1]
            for child in it:
                if child not in seen:
                    seen.add(child)
                    stack.append((child, iter(child.inputs)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def canonicalize(outputs: Sequence[Node], assigns: Sequence[tuple[Node, Node]] = ()) -> Program:
    """Number the graph under ``outputs`` and ``assigns`` ((var node, new value) pairs).

    Returns a :class:`Program` whose ``key`` is a nested tuple of (op, attrs, (shape, dtype),
    input indices) per node: equal keys mean the same computation on different data.
    """
    roots = list(outputs) + [n for pair in assigns for n in pair]
    order = _post_order(roots)
    index: dict = {}
    entries = []
    data, scalars, variables = [], [], []
    for i, node in enumerate(order):
        index[node] = i
        op = node.op
        if op == "data":
            data.append(node.value)
            entries.append(("data", node.sig))
        elif op == "var":
            variables.append(node.value)
            entries.append(("var", node.sig))
        elif op == "scalar":
            scalars.append(node.value)
            entries.append(("scalar", node.sig))
        elif op == "grad":  # (sources, output grads, window) -> the recorded entries, by index
            n_src, n_og, start, end = node.attrs
            inside = tuple([j for j, m in enumerate(order[:i])
                            if m.op not in LEAF_OPS and start <= m.serial < end])
            entries.append((op, (n_src, n_og, inside), None,
                            tuple([index[x] for x in node.inputs])))
        else:
            entries.append((op, node.attrs, node.sig, tuple([index[x] for x in node.inputs])))
    key = Key((tuple(entries), tuple([index[n] for n in outputs]),
               tuple([(index[v], index[n]) for v, n in assigns])))
    return Program(key, data, scalars, variables, index)


def key_hash(key: tuple) -> str:
    """A short stable hex digest of a program key (for debug output and reports)."""
    return hashlib.sha256(repr(key).encode()).hexdigest()[:12]


def _fmt_attr(node: Node) -> str:
    if node.op == "raw":  # (TF op type, attribute bytes): the type is shown as the op
        return ""
    if node.op in ("out", "const"):
        return repr(node.attrs[0])
    if node.op == "grad":
        return f"sources={node.attrs[0]}, window={node.attrs[2:]}"
    if len(node.attrs) == 2 and isinstance(node.attrs[1], tuple):  # (layout, keyword attrs)
        return ", ".join(f"{k}={v!r}" for k, v in node.attrs[1])
    return repr(node.attrs)


def text(outputs: Sequence[Node]) -> str:
    """The pending IR under ``outputs`` in the textual form of the paper's Figure 1."""
    order = _post_order(list(outputs))
    index = {n: i for i, n in enumerate(order)}
    roots = {n: k for k, n in enumerate(outputs)}
    lines = ["IR {"]
    for i, node in enumerate(order):
        shape = ",".join(map(str, node.shape)) if node.shape is not None else ""
        args = ", ".join(f"%{index[x]}" for x in node.inputs)
        extra = []
        if node.op == "scalar":
            extra.append(f"value={node.value!r}")
        elif node.attrs and node.op not in ("data", "var") and _fmt_attr(node):
            extra.append(_fmt_attr(node))
        if node in roots:
            extra.append(f"ROOT={roots[node]}")
        tail = (", " + ", ".join(extra)) if extra else ""
        op = node.attrs[0] if node.op == "raw" else node.op
        lines.append(f"  %{i} = {short_dtype(node.dtype)}[{shape}] {op}({args}){tail}")
    lines.append("}")
    return "\n".join(lines)


def _entry_name(e: tuple) -> str:
    if e[0] == "raw":
        return e[1][0]
    return e[0]


def _sig_text(sig: tuple | None) -> str:
    if sig is None:
        return "tuple"
    shape, enum = sig
    return f"{short_dtype(tf.as_dtype(enum))}[{','.join(map(str, shape))}]"


def describe_change(old: tuple, new: tuple) -> str:
    """What differs between two program keys, in words: the first input whose shape or dtype
    changed, the first baked constant that changed (and the op using it), the first op that
    differs, or the live outputs / updated variables.

    >>> a = canonicalize([Node("math.abs", (Node.leaf("data", tf.ones([2])),), (), (2,),
    ...                        tf.float32)]).key
    >>> b = canonicalize([Node("math.abs", (Node.leaf("data", tf.ones([3])),), (), (3,),
    ...                        tf.float32)]).key
    >>> describe_change(a, b)
    'input %0 (data) changed shape: f32[2] -> f32[3]'
    """
    old_entries, new_entries = old[0], new[0]
    for i, (a, b) in enumerate(zip(old_entries, new_entries)):
        if a == b:
            continue
        if a[0] == b[0] and a[0] in PARAM_OPS:
            what = "shape" if a[1][0] != b[1][0] else "dtype"
            return f"input %{i} ({a[0]}) changed {what}: {_sig_text(a[1])} -> {_sig_text(b[1])}"
        if a[0] == b[0] == "const":
            user = next((_entry_name(e) for e in new_entries[i + 1:]
                         if e[0] not in PARAM_OPS and len(e) > 3 and i in e[3]), "?")
            return (f"constant %{i} (an input of {user}) changed: {a[1][0]!r} -> {b[1][0]!r} "
                    "(a value baked into the program: a shape, an axis, a Python 0 or +-1)")
        if a[0] == b[0] and (a[0] != "raw" or a[1][0] == b[1][0]):
            name = _entry_name(a)
            if a[2] != b[2]:
                return (f"op %{i} {name} changed output: {_sig_text(a[2])} -> "
                        f"{_sig_text(b[2])}")
            if a[1] != b[1]:
                return f"op %{i} {name} changed attributes"
            return f"op %{i} {name} takes other inputs"
        return (f"op %{i} differs: {_entry_name(a)} -> {_entry_name(b)} (the step recorded "
                "other ops: Python control flow on a value, or another code path)")
    if len(old_entries) != len(new_entries):
        k = min(len(old_entries), len(new_entries))
        longer = new_entries if len(new_entries) > k else old_entries
        return (f"{len(new_entries) - len(old_entries):+d} ops recorded (from %{k} "
                f"{_entry_name(longer[k])} on)")
    if old[1] != new[1]:
        return (f"other tensors are live at the barrier ({len(old[1])} -> {len(new[1])} "
                "outputs)")
    if old[2] != new[2]:
        return f"other variables are updated ({len(old[2])} -> {len(new[2])})"
    return "same program"
