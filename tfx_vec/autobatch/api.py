"""Public entry points: ``ab.function`` (the decorator) and ``ab.describe``.

The pipeline is written once, in :meth:`AutobatchFunction.lowered`:
front end -> liveness -> lowering (caller-saves per-variable stacks) -> stack elision for
calls that cannot recurse -> pop/push fusion -> allocation (temporary / register / stack).
Types (dtypes and shapes) come from abstract evaluation per input signature.

Example:
    >>> import tensorflow as tf
    >>> from tfx_vec import autobatch as ab
    >>> @ab.function(max_stack_depth=32)
    ... def fib(n):
    ...     if n <= 1:
    ...         return tf.ones_like(n)
    ...     return fib(n - 2) + fib(n - 1)
    >>> fib(tf.constant([3, 7, 4, 5])).numpy().tolist()
    [3, 21, 5, 8]
"""
from __future__ import annotations

import functools
import io
import threading
from typing import Any, Callable, Mapping

import tensorflow as tf

from . import frontend, ir, local_static
from .errors import AutobatchError

__all__ = ["function", "describe", "AutobatchFunction", "RUNTIMES"]

RUNTIMES = ("program_counter", "local_static", "numpy")
_UNBATCHED = threading.local()


class AutobatchFunction:
    """A Python function batched over the leading dimension of its arguments.

    Call it with structures of batched tensors.  Keyword options at call time override the
    decorator's: ``runtime`` (``"program_counter"``, ``"local_static"``, ``"numpy"``),
    ``jit_compile``, ``max_stack_depth``, ``max_steps``, ``gather`` and ``xla_blocks``
    (local_static), ``scheduler`` (program_counter: ``"earliest"``, ``"most_active"``,
    ``"sweep"``, ``"sweep_guarded"``), ``utilization`` (program_counter: count block runs and
    active members into ``fn.last_status``).  ``block_layout`` (decoration time only: it
    shapes the compiled program) orders the stack machine's blocks: ``"source"`` or
    ``"continuations_first"`` (see :mod:`.passes.layout`).
    """

    def __init__(self, fn: Callable, *, max_stack_depth: int = 32, max_steps: int = 100_000,
                 runtime: str = "program_counter", jit_compile: bool = False,
                 scheduler: str = "earliest", block_layout: str = "source"):
        from .passes import LAYOUTS
        if block_layout not in LAYOUTS:
            raise AutobatchError(f"unknown block_layout {block_layout!r} for "
                                 f"{getattr(fn, '__name__', fn)}; choose one of {LAYOUTS}")
        functools.update_wrapper(self, fn)
        self.block_layout = block_layout
        self._autobatch_python_fn = fn
        self.options = dict(max_stack_depth=max_stack_depth, max_steps=max_steps,
                            runtime=runtime, jit_compile=jit_compile, scheduler=scheduler,
                            gather=False, xla_blocks=False, utilization=False)
        self._program: ir.Program | None = None
        self._lowered: dict[frozenset | None, ir.Program] = {}
        self._compiled: dict[Any, Any] = {}
        # program_counter.Status of the last eager program-counter call (utilization counters).
        self.last_status: Any = None

    def program(self) -> ir.Program:
        """The Function-IR program (compiled from source on first use)."""
        if self._program is None:
            from .passes import function_pipeline
            self._program = function_pipeline(frontend.compile_program(self))
        return self._program

    def lowered(self, types: Mapping[str, Any] | None = None) -> ir.Program:
        """The optimized stack-machine program (the whole pass pipeline, cached).

        ``types`` (qualified variable -> spec structure, for one input signature) lets the
        block-merging pass merge blocks of per-member scalar code; without them it is skipped.
        """
        scalars = None if types is None else frozenset(
            v for v, spec in types.items()
            if all(s.shape.rank == 1 for s in tf.nest.flatten(spec)))
        if scalars not in self._lowered:
            from .passes import pipeline
            self._lowered[scalars] = pipeline(
                self.program(), block_layout=self.block_layout,
                cheap=None if scalars is None else scalars.__contains__)
        return self._lowered[scalars]

    def unbatched(self, *args: Any) -> Any:
        """The definitional reference: plain Python, eager, batched calls inside included.

        Call it on one member's slice (a batch of 1): ``if`` then reads a one-element tensor.
        """
        depth = getattr(_UNBATCHED, "depth", 0)
        _UNBATCHED.depth = depth + 1
        try:
            return self._autobatch_python_fn(*args)
        finally:
            _UNBATCHED.depth = depth

    @tf.autograph.experimental.do_not_convert
    def __call__(self, *args: Any, **options: Any) -> Any:
        if getattr(_UNBATCHED, "depth", 0):
            return self._autobatch_python_fn(*args, **options)
        unknown = [k for k in options if k not in self.options]
        if unknown:
            raise AutobatchError(f"unknown options {sorted(unknown)} for {self.__name__}; "
                                 f"known: {sorted(self.options)}")
        opts = {**self.options, **options} if options else self.options
        runtime = opts["runtime"]
        if runtime == "local_static":
            return local_static.run(self.program(), args, gather=opts["gather"],
                                    xla_blocks=opts["xla_blocks"],
                                    max_stack_depth=opts["max_stack_depth"],
                                    max_steps=opts["max_steps"],
                                    jit_cache=self._compiled.setdefault("local_static_xla", {}))
        if runtime == "numpy":
            from . import numpy_backend
            return numpy_backend.run(self.program(), self.lowered, args,
                                     max_stack_depth=opts["max_stack_depth"],
                                     max_steps=opts["max_steps"])
        if runtime == "program_counter":
            from . import program_counter
            return program_counter.call(self, args, opts)
        raise AutobatchError(f"unknown runtime {runtime!r}; choose one of {RUNTIMES}")


def function(fn: Callable | None = None, **options: Any) -> Any:
    """Decorator: batch ``fn`` (``@ab.function`` or ``@ab.function(max_stack_depth=64)``).

    See :class:`AutobatchFunction` for the options.
    """
    if fn is None:
        return lambda f: function(f, **options)
    if isinstance(fn, AutobatchFunction):  # re-decorating: new options, same Python function
        fn = fn._autobatch_python_fn
    return AutobatchFunction(fn, **options)


def describe(fn: AutobatchFunction, *example_args: Any, file: Any = None) -> str:
    """Print (and return) blocks, variables and allocation classes and the passes applied.

    With example arguments, the program for their input signature (blocks of per-member
    scalar code merged, see :mod:`.passes.merge_blocks`), as the program-counter runtime
    runs it.
    """
    if not isinstance(fn, AutobatchFunction):
        raise AutobatchError(f"describe expects an ab.function, got {type(fn).__name__}")
    types = None
    if example_args:
        from .types import infer_types, qualified_types, spec_of
        types = qualified_types(infer_types(fn.program(), tuple(
            spec_of(tf.nest.map_structure(tf.convert_to_tensor, a)) for a in example_args)))
    p = fn.lowered(types)
    out = io.StringIO()
    out.write(ir.format_program(p) + "\n")
    out.write("variables:\n")
    for var in p.variables():
        out.write(f"  {var}: {p.allocation.get(var, '?')}\n")
    out.write("passes and optimizations:\n")
    for note in p.notes:
        out.write(f"  - {note}\n")
    text = out.getvalue()
    print(text, end="", file=file)
    return text
