"""``lazy.GradientTape``: gradients recorded as IR nodes, built at lowering time.

``tape.gradient(target, sources)`` records one ``grad`` node whose inputs are the target and
the connected sources; ``lowering.build`` replays the program under a ``tf.GradientTape`` and
calls TensorFlow's own ``gradient`` there, so forward and backward compile into one program.
Sources follow eager rules: trainable ``lazy.Variable``s are watched automatically, other lazy
tensors only after ``tape.watch``; an unconnected source gets ``None`` (or zeros with
``unconnected_gradients=ZERO``).  A value forced while the tape can still differentiate
(printing the loss, branching on it) keeps its recorded computation for the gradient: the tape
remembers it until its gradient (or, when persistent, until the tape is garbage).

As in eager, only ops recorded inside the ``with`` block are differentiated: each node carries a
creation stamp, the grad node the tape's window, and lowering pauses the replay's tape outside it.

Limits: a variable whose update was written back by a barrier between the forward pass and
``gradient`` is differentiated at its new value: take gradients before ``mark_step``, as with
PyTorch/XLA.

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec.lazy.tensor import Variable
    >>> w = Variable([3.0])
    >>> with GradientTape() as tape:
    ...     loss = tf.reduce_sum(w * w)
    >>> tape.gradient(loss, w).numpy().tolist()
    [6.0]
"""
from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf
from tensorflow.python.framework import dtypes, ops

from . import runtime
from .errors import LazyGradientError
from . import ir
from .ir import Node, _post_order
from .tensor import LazyTensor, Variable, tensor

__all__ = ["GradientTape"]


class GradientTape:
    """``tf.GradientTape`` for the explicit lazy tensors: a gradient is recorded as one node.

    Args:
        persistent: allow several ``gradient`` calls (as ``tf.GradientTape``).
        watch_accessed_variables: watch every trainable ``lazy.Variable`` read inside the
            ``with`` block (as ``tf.GradientTape``); other lazy tensors need ``watch``.

    ``gradient(target, sources, output_gradients=None, unconnected_gradients=NONE)`` returns
    lazy tensors in the structure of ``sources``: ``None`` for an unconnected or unwatched
    source (zeros with ``unconnected_gradients=tf.UnconnectedGradients.ZERO``).  Only ops
    recorded inside the ``with`` block are differentiated; a value forced inside it (printing
    the loss) keeps its recorded computation.  Forward and backward compile into one program:
    the backward is TensorFlow's own ``gradient`` on the replayed forward.

    Inside ``lazy.device()`` use ``tf.GradientTape`` itself (its gradients are recorded the
    same way); this class is for ``lazy.tensor`` / ``lazy.Variable`` code.

    >>> import tensorflow as tf
    >>> from tfx_vec import lazy
    >>> w, x = lazy.Variable([1.0, -2.0]), lazy.tensor([3.0, 4.0])
    >>> with lazy.GradientTape() as tape:
    ...     tape.watch(x)
    ...     loss = tf.reduce_sum(w * w * x)
    >>> gw, gx = tape.gradient(loss, [w, x])
    >>> gw.numpy().tolist(), gx.numpy().tolist()
    ([6.0, -16.0], [1.0, 4.0])
    """

    def __init__(self, persistent: bool = False, watch_accessed_variables: bool = True):
        self._persistent = persistent
        self._auto_watch = watch_accessed_variables
        self._watched: dict[int, Node] = {}
        self._history: dict[int, tuple[Node, Node]] = {}
        self._used = False
        self._window: list = [None, None]   # creation stamps of the ops it records

    def __enter__(self) -> "GradientTape":
        runtime._tapes.add(self)  # until its (last) gradient: barriers report to it
        self._window = [next(ir.serials), None]
        return self

    def __exit__(self, *exc: Any) -> None:
        self._window[1] = next(ir.serials)

    def watch(self, tensors: Any) -> None:
        """Watch lazy tensors (and variables) so gradients with respect to them exist."""
        for t in tf.nest.flatten(tensors):
            if not isinstance(t, LazyTensor):
                raise LazyGradientError(
                    f"lazy.GradientTape.watch needs lazy tensors, got {type(t).__name__}")
            self._watched[id(t._node)] = t._node

    def _remember(self, outputs: list, fresh: dict) -> None:
        """Called by the barrier: keep the recorded computation behind each forced value."""
        for n in outputs:
            data = fresh[id(n)]
            self._history[id(data)] = (data, n)

    def _symbolic(self, node: Node, memo: dict) -> Node:
        """``node`` with every value forced since the tape began replaced by its computation
        (``memo`` is shared by one gradient call, so equal nodes stay identical)."""
        if not self._history:
            return node
        for n in _post_order([node]):
            if id(n) in memo:
                continue
            hit = self._history.get(id(n))
            if hit is not None:
                memo[id(n)] = self._symbolic(hit[1], memo)
                continue
            inputs = tuple(memo[id(x)] for x in n.inputs)
            if any(a is not b for a, b in zip(inputs, n.inputs)):
                memo[id(n)] = Node(n.op, inputs, n.attrs, n.shape, n.dtype, n.value, n.serial)
            else:
                memo[id(n)] = n
        return memo[id(node)]

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: tf.UnconnectedGradients =
                 tf.UnconnectedGradients.NONE) -> Any:
        """Lazy gradients of ``target`` with respect to ``sources`` (a nest)."""
        if self._used and not self._persistent:
            raise LazyGradientError("a non-persistent lazy.GradientTape can only compute one "
                                    "gradient (use persistent=True)")
        self._used = True
        if not self._persistent:
            runtime._tapes.discard(self)
        if not isinstance(target, LazyTensor):
            raise LazyGradientError(f"target must be a lazy tensor, got {type(target).__name__}")
        start, end = self._window
        if start is None:
            raise LazyGradientError("use the lazy.GradientTape in a `with` block first")
        end = next(ir.serials) if end is None else end
        memo: dict[int, Node] = {}
        t_node = self._symbolic(target._node, memo)
        ancestors = _ancestors(t_node, start, end)
        flat = _flatten(sources)
        if not flat and any(n.op == "var" for n in ancestors):
            raise LazyGradientError(
                f"lazy.GradientTape.gradient with no sources, but the target depends on "
                f"lazy.Variables (at {runtime.user_frame()}): tf.Module.variables and "
                "trainable_variables list tf.Variables only, not lazy.Variables.  Pass the "
                "lazy.Variables explicitly, or write the model with tf.Variable inside "
                "`with lazy.device():` (then tf.Module, Keras and tf.GradientTape see them)")
        picked, nodes = [], []
        for k, s in enumerate(flat):
            if not isinstance(s, LazyTensor):
                raise LazyGradientError(
                    f"source {k} must be a lazy tensor or lazy.Variable, got {type(s).__name__}")
            n = self._symbolic(s._node, memo)
            watched = id(n) in self._watched or id(s._node) in self._watched or (
                isinstance(s, Variable) and s._trainable and self._auto_watch)
            if watched and n in ancestors:
                picked.append(k)
                nodes.append(n)
        og = []
        if output_gradients is not None:
            og = [x._node if isinstance(x, LazyTensor) else tensor(x)._node
                  for x in tf.nest.flatten(output_gradients)]
        results: list = [None] * len(flat)
        if picked:
            g = Node("grad", (t_node, *nodes, *og), (len(nodes), len(og), start, end), None,
                     None)
            for j, (k, n) in enumerate(zip(picked, nodes)):
                results[k] = LazyTensor(Node("out", (g,), (j,), n.shape, n.dtype))
        if unconnected_gradients == tf.UnconnectedGradients.ZERO:
            results = [r if r is not None else tf.zeros_like(s) for r, s in zip(results, flat)]
        return _pack(sources, results)


def _flat_sequence(nest: Any) -> bool:
    """A plain list or tuple of tensors: ``tf.nest`` would cost more than the gradient."""
    return type(nest) in (list, tuple) and all(isinstance(x, LazyTensor) for x in nest)


def _flatten(nest: Any) -> list:
    return list(nest) if _flat_sequence(nest) else tf.nest.flatten(nest)


def _pack(nest: Any, flat: list) -> Any:
    return type(nest)(flat) if _flat_sequence(nest) else tf.nest.pack_sequence_as(nest, flat)


# What a gradient flows through: floating and complex tensors (and a multi-output op, whose
# outputs have their own dtypes); TensorFlow's tape records no op by an integer input.
_DIFFERENTIABLE = frozenset(d for d in dtypes._INTERN_TABLE.values()
                            if d.is_floating or d.is_complex)


def differentiable(n: Node) -> bool:
    """Whether a gradient can flow through node ``n``'s value (TensorFlow's tape rule)."""
    return n.dtype is None or n.dtype in _DIFFERENTIABLE


# Ops whose registered gradient is None for every input (TensorFlow returns no gradient
# through them, rather than zeros)
_NONE_GRADIENTS = frozenset({"Floor", "Ceil", "Round", "Rint", "FloorDiv", "TruncateDiv",
                             "ArgMax", "ArgMin"})


@functools.lru_cache(maxsize=None)
def _no_gradient(op_type: str) -> bool:
    """Whether TensorFlow's gradient never reaches the inputs of an ``op_type`` op: registered
    as not differentiable (``tf.stop_gradient``) or always None (``tf.floor``)."""
    if op_type in _NONE_GRADIENTS:
        return True
    try:
        return ops._gradient_registry.lookup(op_type) is None   # pylint: disable=protected-access
    except LookupError:   # no gradient at all: TensorFlow raises, and so will the replay
        return False


def _ancestors(root: Node, start: int, end: int) -> set:
    """Nodes the tape connects to ``root``: paths only go through ops recorded in its window
    that pass a gradient on, along floating or complex values (a gradient never flows through
    an integer, ``tf.stop_gradient`` or ``tf.floor``)."""
    seen = {root}
    stack = [root]
    while stack:
        node = stack.pop()
        if node.op in ir.LEAF_OPS or not start <= node.serial < end or \
                (node.op == "raw" and _no_gradient(node.attrs[0])):
            continue
        for x in node.inputs:
            if x not in seen and differentiable(x):
                seen.add(x)
                stack.append(x)
    return seen
