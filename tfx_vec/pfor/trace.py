"""Stage 1: trace a loop body once into a FuncGraph with symbolic per-iteration inputs.

``trace_function(fn, specs)`` traces ``fn(*args)`` with ``tf.function(...)
.get_concrete_function``; the result records the output structure, the captured
(loop-invariant) values and any cross-iteration reductions requested through
:class:`PforConfig`.  ``trace_count()`` says how many traces happened (tests use it to prove
that repeated eager calls do not retrace).

Example:
    >>> import tensorflow as tf
    >>> t = trace_function(lambda i: {"sq": i * i}, [tf.TensorSpec([], tf.int32)])
    >>> [o.dtype.name for o in t.graph.outputs], sorted(t.structure)
    (['int32'], ['sq'])
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import tensorflow as tf
from tensorflow.python.autograph.core import ag_ctx
from tensorflow.python.autograph.impl import api as autograph

from tfx_vec.pfor.errors import VectorizationError
from tfx_vec.pfor.registry import WrappedTensor
from tfx_vec.pfor.vectorizer import Reduction

_count = [0]


def trace_count() -> int:
    """Number of loop bodies traced so far in this process."""
    return _count[0]


class PforConfig:
    """Passed as ``loop_fn(i, config)``: cross-iteration reductions inside a pfor body.

    Each method returns, in every iteration, the reduction of ``x`` over all iterations.

    Example:
        >>> import tensorflow as tf, tfx_vec
        >>> def body(i, config):
        ...     x = tf.cast(i, tf.float32)
        ...     return x - config.reduce_mean(x)
        >>> tfx_vec.pfor(body, 3).numpy().tolist()
        [-1.0, 0.0, 1.0]
    """

    def __init__(self):
        self.reductions: dict[str, Reduction] = {}

    def reduce(self, fn: Callable[[tf.Tensor], tf.Tensor], x: tf.Tensor) -> tf.Tensor:
        """``fn`` applied to ``x`` stacked over all iterations (``[n, ...]``)."""
        x = tf.convert_to_tensor(x)
        return self._placeholder(fn, x, None)

    def reduce_sum(self, x: tf.Tensor) -> tf.Tensor:
        x = tf.convert_to_tensor(x)
        return self._placeholder(lambda s: tf.reduce_sum(s, axis=0), x, x.shape)

    def reduce_mean(self, x: tf.Tensor) -> tf.Tensor:
        x = tf.convert_to_tensor(x)
        return self._placeholder(lambda s: tf.reduce_mean(s, axis=0), x, x.shape)

    def reduce_concat(self, x: tf.Tensor) -> tf.Tensor:
        """All iterations' ``x`` concatenated along axis 0."""
        x = tf.convert_to_tensor(x)
        shape = None if x.shape.rank is None else [None] + x.shape.as_list()[1:]
        if x.shape.rank == 0:
            raise VectorizationError("config.reduce_concat needs a value of rank >= 1")
        return self._placeholder(
            lambda s: tf.reshape(s, tf.concat([[-1], tf.shape(s)[2:]], 0)), x, shape)

    def _placeholder(self, fn, x, shape) -> tf.Tensor:
        ph = tf.compat.v1.placeholder(x.dtype, shape=shape, name="pfor_reduction")
        self.reductions[ph.name] = Reduction(fn, x)
        return ph


@dataclasses.dataclass
class TracedBody:
    """A traced loop body: ``graph.inputs`` = the explicit args then the captured values."""

    graph: Any                       # FuncGraph
    structure: Any                   # nested output structure (leaves: output positions)
    n_args: int
    captured: list                   # external values bound to the captured placeholders
    reductions: dict

    def capture_inputs(self) -> list[WrappedTensor]:
        """The captured (loop-invariant) values, wrapped, in ``graph.inputs`` order."""
        return [WrappedTensor(c, False) for c in self.captured]

    def pack(self, flat: Sequence[Any]) -> Any:
        return tf.nest.pack_sequence_as(self.structure, list(flat))


def trace_function(fn: Callable, specs: Sequence[tf.TensorSpec], *, with_config: bool = False,
                   pack_args: Callable[[list], Sequence[Any]] | None = None) -> TracedBody:
    """Trace ``fn`` once on symbolic inputs described by ``specs``.

    ``pack_args`` turns the flat symbolic inputs into ``fn``'s positional arguments (default:
    one argument per spec).  With ``with_config`` a :class:`PforConfig` is passed last.
    """
    config = PforConfig()
    holder: dict[str, Any] = {}

    def body(*flat):
        args = list(pack_args(list(flat)) if pack_args else flat)
        if with_config:
            args.append(config)
        out = fn(*args)
        leaves = tf.nest.flatten(out, expand_composites=False)
        for leaf in leaves:
            if leaf is None:
                raise VectorizationError("the loop body returned None inside its output "
                                         f"structure {out!r}")
            if isinstance(leaf, (tf.SparseTensor, tf.RaggedTensor)):
                raise VectorizationError("the loop body returned a "
                                         f"{type(leaf).__name__}; only dense tensors are "
                                         "supported")
        holder["structure"] = tf.nest.map_structure(lambda _: 0, out)
        return [tf.identity(tf.convert_to_tensor(leaf)) for leaf in leaves]

    # Like tf.vectorized_map: AutoGraph converts the body only when the caller's context has
    # AutoGraph on (e.g. inside a default tf.function); converting costs ~30 ms per trace.
    fn = autograph.tf_convert(fn, ag_ctx.control_status_ctx())
    body.__name__ = getattr(fn, "__name__", "loop_fn").replace("<", "_").replace(">", "_")
    concrete = tf.function(body, autograph=False).get_concrete_function(*specs)
    _count[0] += 1
    graph = concrete.graph
    n_args = len(graph.inputs) - len(graph.captures)
    captured = [ext for ext, _ in graph.captures]
    structure = holder["structure"]
    flat_struct = tf.nest.flatten(structure)
    structure = tf.nest.pack_sequence_as(structure, list(range(len(flat_struct))))
    return TracedBody(graph, structure, n_args, captured, config.reductions)
