"""Runtime 1: local static autobatching (the paper's Algorithm 1), eager.

Runs the Function IR directly.  Each function invocation keeps a program counter per member
(on the host) and an active set; it repeatedly runs the earliest block that some active member
waits at, for just those members, until all have returned.  Calls recurse through Python with
the locally active set.

Primitives are either *masked* (run on the whole batch, results selected per member) or, with
``gather=True``, run on the gathered active members and scattered back (calls then recurse on the
smaller batch).  ``xla_blocks=True`` compiles each primitive with XLA (the paper's "hybrid").

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec import autobatch as ab
    >>> @ab.function
    ... def fib(n):
    ...     if n <= 1:
    ...         return tf.ones_like(n)
    ...     return fib(n - 2) + fib(n - 1)
    >>> fib(tf.constant([3, 7, 4, 5]), runtime="local_static").numpy().tolist()
    [3, 21, 5, 8]
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf

from . import ir
from .errors import AutobatchError, MaxStepsExceededError, StackOverflowError
from .types import batch_size_of, fit, run_primitive, select

__all__ = ["run"]


class _Runner:
    def __init__(self, program: ir.Program, types: Mapping[str, Mapping[str, Any]],
                 gather: bool, xla_blocks: bool, max_stack_depth: int, max_steps: int,
                 jit_cache: dict | None):
        self.program, self.types, self.gather, self.xla = program, types, gather, xla_blocks
        self.max_depth, self.max_steps, self.steps = max_stack_depth, max_steps, 0
        self.jitted: dict[int, Any] = {} if jit_cache is None else jit_cache

    def primitive(self, f: ir.Function, prim: ir.Primitive, values: list, batch: Any) -> tuple:
        out_types = [self.types[f.name][v] for v in prim.outputs]
        if not self.xla or not values:
            return run_primitive(prim, values, batch, out_types)
        key = (id(prim), repr(out_types))
        fn = self.jitted.get(key)
        if fn is None:
            fn = tf.function(lambda *a: run_primitive(prim, a, batch_size_of(a), out_types),
                             jit_compile=True, autograph=False)
            self.jitted[key] = fn
        return fn(*values)

    def function(self, f: ir.Function, args: Sequence[Any], depth: int,
                 here: np.ndarray | None = None) -> Any:
        """Run ``f`` for the members in ``here`` (all when None); the others stay finished."""
        if depth > self.max_depth:
            raise StackOverflowError(f"{f.loc}: recursion deeper than max_stack_depth="
                                     f"{self.max_depth} in {f.name}")
        batch = int(batch_size_of(args))
        env: dict[str, Any] = {p: tf.nest.map_structure(lambda x, s: fit(x, s, batch), a,
                                                        self.types[f.name][p])
                               for p, a in zip(f.params, args)}
        n_blocks = len(f.blocks)
        pc = np.zeros([batch], np.int64) if here is None else np.where(here, 0, n_blocks)
        while True:
            waiting = pc[pc < n_blocks]
            if waiting.size == 0:
                return env[f.result]
            self.steps += 1
            if self.steps > self.max_steps:
                raise MaxStepsExceededError(
                    f"{f.loc}: batch members {np.nonzero((pc < n_blocks))[0].tolist()} of this "
                    f"call of {f.name} had not finished after max_steps={self.max_steps} block "
                    "executions; raise max_steps if the program does terminate")
            i = int(waiting.min())
            at_block = pc == i
            block = f.blocks[i]
            if self.gather and not at_block.all():
                self.gathered_block(f, block, env, at_block, depth)
            else:
                self.masked_block(f, block, env, at_block, depth)
            pc = self.next_pc(block.terminator, env, pc, at_block, n_blocks)

    def _read(self, f: ir.Function, env: dict, var: str, loc: str) -> Any:
        if var not in env:
            raise AutobatchError(f"{loc}: variable {var!r} of {f.name} is read before any "
                                 "assignment")
        return env[var]

    def _write(self, env: dict, var: str, new: Any, mask: tf.Tensor, loc: str) -> None:
        env[var] = select(mask, new, env[var], f"{loc}: {var!r}") if var in env else new

    def masked_block(self, f, block: ir.Block, env: dict, here: np.ndarray, depth: int) -> None:
        mask = tf.constant(here)
        batch = here.shape[0]
        for op in block.ops:
            if isinstance(op, ir.Primitive):
                values = [self._read(f, env, v, op.loc) for v in op.inputs]
                outs = self.primitive(f, op, values, batch)
            else:
                values = [self._read(f, env, v, op.loc) for v in op.args]
                outs = (self.call(op, values, here, depth),)
            names = op.outputs if isinstance(op, ir.Primitive) else (op.output,)
            for var, new in zip(names, outs):
                self._write(env, var, new, mask, op.loc)

    def gathered_block(self, f, block: ir.Block, env: dict, here: np.ndarray,
                       depth: int) -> None:
        idx = np.nonzero(here)[0]
        local: dict[str, Any] = {}

        def read(v, loc):
            if v not in local:
                local[v] = tf.nest.map_structure(lambda x: tf.gather(x, idx),
                                                 self._read(f, env, v, loc))
            return local[v]

        for op in block.ops:
            if isinstance(op, ir.Primitive):
                outs = self.primitive(f, op, [read(v, op.loc) for v in op.inputs], len(idx))
                names = op.outputs
            else:
                outs = (self.call(op, [read(v, op.loc) for v in op.args], None, depth),)
                names = (op.output,)
            local.update(zip(names, outs))
            for var, new in zip(names, outs):
                if var in env:
                    env[var] = tf.nest.map_structure(
                        lambda o, n: tf.tensor_scatter_nd_update(o, idx[:, None], n),
                        env[var], new)
                else:
                    env[var] = tf.nest.map_structure(
                        lambda n: tf.scatter_nd(idx[:, None], n,
                                                [here.shape[0]] + n.shape.as_list()[1:]), new)

    def call(self, op: ir.Call, values: list, here: np.ndarray | None, depth: int) -> Any:
        callee = self.program.functions[op.callee]
        if here is not None and here.all():
            here = None
        return self.function(callee, values, depth + 1, here)

    @staticmethod
    def next_pc(t: Any, env: dict, pc: np.ndarray, here: np.ndarray, n_blocks: int):
        pc = pc.copy()
        if isinstance(t, ir.Jump):
            pc[here] = t.target
        elif isinstance(t, ir.Branch):
            cond = np.asarray(env[t.cond]).astype(bool)
            pc[here & cond] = t.true
            pc[here & ~cond] = t.false
        else:
            pc[here] = n_blocks
        return pc


@tf.autograph.experimental.do_not_convert
def run(program: ir.Program, args: Sequence[Any], types: Mapping[str, Mapping[str, Any]], *,
        gather: bool = False,
        xla_blocks: bool = False, max_stack_depth: int = 32, max_steps: int = 100_000,
        jit_cache: dict | None = None) -> Any:
    """Run a Function-IR program eagerly on batched ``args`` (Algorithm 1).

    Args:
      program: from :func:`tfx_vec.autobatch.frontend.compile_program`.
      args: one structure of batched tensors per parameter of main.
      types: ``{function: {variable: spec}}`` (:func:`tfx_vec.autobatch.types.infer_types`).
      gather: gather/scatter the active members instead of masking.
      xla_blocks: compile each primitive with XLA.
      max_stack_depth: deepest Python recursion allowed.
      max_steps: most block executions (all invocations together).
      jit_cache: where the XLA-compiled primitives live between calls (``ab.function`` passes
        one per function, so the hybrid compiles each primitive once per input shape).
    Raises:
      StackOverflowError: recursion deeper than ``max_stack_depth``.
      MaxStepsExceededError: more than ``max_steps`` block executions.
    """
    if not tf.executing_eagerly():
        raise AutobatchError("the local_static runtime runs eagerly (it recurses in Python); "
                             "use runtime='program_counter' inside tf.function")
    runner = _Runner(program, types, gather, xla_blocks, max_stack_depth, max_steps, jit_cache)
    args = tf.nest.map_structure(tf.convert_to_tensor, tuple(args))
    return runner.function(program.functions[program.main], args, 0)
