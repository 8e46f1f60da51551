"""Public entry points: ``ab.function`` (the decorator) and ``ab.describe``.

The pipeline is written once: :meth:`AutobatchFunction.program` (front end on AutoGraph, then
the Function-IR passes every runtime runs) and :meth:`AutobatchFunction.lowered` (the passes to
the program-counter stack machine).  Types (dtypes and shapes) come from abstract evaluation per
input signature (:meth:`AutobatchFunction.types_for`).

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
import inspect
import io
import threading
from typing import Any, Callable, Mapping

import tensorflow as tf

from . import arguments, frontend, ir, local_static
from .errors import AutobatchError

__all__ = ["function", "describe", "AutobatchFunction", "RUNTIMES"]

RUNTIMES = ("program_counter", "local_static", "numpy")
_UNBATCHED = threading.local()


class AutobatchFunction:
    """A Python function written for one example, batched over the leading dimension of its
    arguments.  Made by :func:`function` (``@ab.function``); see there for what it accepts.

    Calling it runs the batch.  Keyword options at call time override the decorator's (see
    :func:`function`).  Besides the call:

    * :meth:`unbatched` runs the plain Python function (the reference the batch must match);
    * :meth:`program` / :meth:`lowered` are the compiled programs, :func:`describe` prints them;
    * ``last_status`` holds the program-counter runtime's :class:`~.program_counter.Status`
      of the last eager call (with ``utilization=True``: block runs and active members).

    Example:
        >>> import tensorflow as tf
        >>> from tfx_vec import autobatch as ab
        >>> @ab.function
        ... def double_until(x, limit):
        ...     while x < limit:
        ...         x = 2 * x
        ...     return x
        >>> double_until([1, 3, 10], 12).numpy().tolist()
        [16, 12, 20]
        >>> int(double_until.unbatched(tf.constant(5), tf.constant(12)))
        20
    """

    def __init__(self, fn: Callable, *, max_stack_depth: int = 32, max_steps: int = 100_000,
                 runtime: str = "program_counter", jit_compile: bool = False,
                 scheduler: str = "earliest", block_layout: str = "source",
                 shapes: str = "exact"):
        from .passes import LAYOUTS
        from .types import SHAPE_RULES
        name = getattr(fn, "__name__", fn)
        if not callable(fn) or isinstance(fn, type):
            raise AutobatchError(f"ab.function decorates a Python function, got {fn!r}")
        if block_layout not in LAYOUTS:
            raise AutobatchError(f"unknown block_layout {block_layout!r} for {name}; choose "
                                 f"one of {LAYOUTS}")
        if shapes not in SHAPE_RULES:
            raise AutobatchError(f"unknown shapes rule {shapes!r} for {name}; choose one of "
                                 f"{SHAPE_RULES}")
        functools.update_wrapper(self, fn)
        self.block_layout = block_layout
        self._autobatch_python_fn = fn
        self.options = dict(max_stack_depth=max_stack_depth, max_steps=max_steps,
                            runtime=runtime, jit_compile=jit_compile, scheduler=scheduler,
                            gather=False, xla_blocks=False, utilization=False, shapes=shapes)
        self._params = tuple(inspect.signature(fn).parameters)
        self._program: ir.Program | None = None
        self._lowered: dict[frozenset | None, ir.Program] = {}
        self._types: dict[Any, dict] = {}
        self._compiled: dict[Any, Any] = {}
        # program_counter.Status of the last eager program-counter call (utilization counters).
        self.last_status: Any = None

    def program(self) -> ir.Program:
        """The Function-IR program every runtime runs (compiled from source on first use)."""
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

    def types_for(self, args: tuple, weak: Any = None, shapes: str | None = None) -> dict:
        """``{function: {variable: spec}}`` for batched ``args`` (cached per signature);
        ``weak``: per argument, which leaves were Python literals."""
        from .types import infer_types, spec_of
        shapes = shapes or self.options["shapes"]
        specs = tuple(spec_of(a) for a in args)
        weak = tuple(weak) if weak is not None else None
        key = (repr(specs), weak, shapes)
        if key not in self._types:
            self._types[key] = infer_types(self.program(), specs, weak, shapes)
        return self._types[key]

    def unbatched(self, *args: Any, **kwargs: Any) -> Any:
        """The definitional reference: the plain Python function, eagerly, batched calls
        inside included.  Call it on one member's values (or on a batch of 1: ``if`` then
        reads a one-element tensor)."""
        depth = getattr(_UNBATCHED, "depth", 0)
        _UNBATCHED.depth = depth + 1
        try:
            return self._autobatch_python_fn(*args, **kwargs)
        finally:
            _UNBATCHED.depth = depth

    @tf.autograph.experimental.do_not_convert
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if getattr(_UNBATCHED, "depth", 0):
            return self._autobatch_python_fn(*args, **kwargs)
        program = self.program()  # syntax errors first
        values, options = arguments.bind(self.__name__, self._params, args, kwargs,
                                         tuple(self.options))
        opts = {**self.options, **options} if options else self.options
        args, weak = arguments.batch(self.__name__, self._params, values)
        runtime = opts["runtime"]
        if runtime == "local_static":
            return local_static.run(program, args, self.types_for(args, weak, opts["shapes"]),
                                    gather=opts["gather"], xla_blocks=opts["xla_blocks"],
                                    max_stack_depth=opts["max_stack_depth"],
                                    max_steps=opts["max_steps"],
                                    jit_cache=self._compiled.setdefault("local_static_xla", {}))
        if runtime == "numpy":
            from . import numpy_backend
            return numpy_backend.run(self, args, weak, max_stack_depth=opts["max_stack_depth"],
                                     max_steps=opts["max_steps"], shapes=opts["shapes"])
        if runtime == "program_counter":
            from . import program_counter
            return program_counter.call(self, args, opts, weak)
        raise AutobatchError(f"unknown runtime {runtime!r}; choose one of {RUNTIMES}")


def function(fn: Callable | None = None, **options: Any) -> Any:
    """Batch a Python function written for one example: ``@ab.function`` or
    ``@ab.function(max_stack_depth=64, ...)``.

    The decorated function is called with *batches*: every argument (a tensor, array, list or
    number, or a tuple/namedtuple/dict of them) has a leading batch dimension, and the function
    runs once per member -- with data-dependent ``if``/``elif``/``else``, ``while``,
    ``for i in range(...)``, ``break``, ``continue``, early ``return`` and (mutual) recursion,
    each member taking its own path.  Results have the same leading dimension.  An argument
    without a batch dimension (a number), or with a leading dimension of 1, is shared by every
    member.

    How: the source is put in canonical form through AutoGraph (``break``/``continue``/
    ``return`` lowered, A-normal form), compiled into basic blocks of straight-line TF code and
    run by a runtime that steps the members through them (see ``docs/autobatch.md``).  Types
    are inferred per input signature; no annotations.

    Options (at decoration, or as keywords of a call):

    * ``runtime``: ``"program_counter"`` (default: one ``tf.while_loop`` with explicit stacks;
      eager, inside ``tf.function``, under XLA, in TF1 graphs), ``"local_static"`` (eager,
      recursion in Python; ``gather=True`` computes only active members, ``xla_blocks=True``
      compiles each straight-line run with XLA) or ``"numpy"`` (the stack machine stepped in
      Python; a reference);
    * ``jit_compile``: compile the whole program-counter loop with XLA (eager calls);
    * ``max_stack_depth`` (32): deepest recursion (self tail calls do not count); deeper
      members raise :class:`StackOverflowError` naming them;
    * ``max_steps`` (100000): runtime loop steps before :class:`MaxStepsExceededError`;
    * ``scheduler``: ``"earliest"``, ``"most_active"``, ``"sweep"``, ``"sweep_guarded"``
      (which block the program-counter runtime runs next);
    * ``utilization``: count block runs and active members into ``fn.last_status``;
    * ``shapes``: ``"exact"`` (a variable keeps one shape; a clear error otherwise) or
      ``"broadcast"`` (TFP's rule: the broadcast of the shapes assigned to it);
    * ``block_layout`` (decoration only): ``"source"`` or ``"continuations_first"``.

    Not batched (:class:`UnsupportedSyntaxError` names the file and line): ``try``, ``with``,
    ``yield``, ``raise``, ``global``, nested ``def``/``class``, assignments to attributes or
    subscripts, ``for`` over anything but ``range``, loops with ``else``, batched functions
    used as values or called inside lambdas, comprehensions or conditional expressions,
    parameters with defaults or ``*args``.  ``and``/``or`` evaluate both sides (element-wise on
    tensors); ``==``/``!=`` are element-wise on tensors even in TF1 graphs.  The function's
    source must be in a file (not typed into an interactive interpreter).

    Example:
        >>> import tensorflow as tf
        >>> from tfx_vec import autobatch as ab
        >>> @ab.function
        ... def collatz_steps(n):
        ...     steps = 0
        ...     while n > 1:
        ...         if n % 2 == 0:
        ...             n = n // 2
        ...         else:
        ...             n = 3 * n + 1
        ...         steps += 1
        ...     return steps
        >>> collatz_steps([3, 7, 4, 5]).numpy().tolist()
        [7, 16, 2, 5]
        >>> collatz_steps(tf.constant([27]), jit_compile=True).numpy().tolist()
        [111]
    """
    if fn is None:
        return lambda f: function(f, **options)
    if isinstance(fn, AutobatchFunction):  # re-decorating: new options, same Python function
        fn = fn._autobatch_python_fn
    return AutobatchFunction(fn, **options)


def describe(fn: AutobatchFunction, *example_args: Any, file: Any = None) -> str:
    """Print (and return) the stack-machine program of ``fn``: blocks, variables with their
    allocation classes (temporary / register / stack), and the passes applied.

    With example arguments, the program for their input signature (blocks of per-member
    scalar code merged, see :mod:`.passes.merge_blocks`), as the program-counter runtime
    runs it.

    Example:
        >>> from tfx_vec import autobatch as ab
        >>> @ab.function
        ... def halve(n):
        ...     while n > 1:
        ...         n = n // 2
        ...     return n
        >>> print(ab.describe(halve, [9], file=io.StringIO()).splitlines()[0])
        program halve(halve.n) -> halve.n
    """
    if not isinstance(fn, AutobatchFunction):
        raise AutobatchError(f"describe expects an ab.function, got {type(fn).__name__}")
    types = None
    if example_args:
        from .types import qualified_types
        values, _ = arguments.bind(fn.__name__, fn._params, example_args, {}, ())
        args, weak = arguments.batch(fn.__name__, fn._params, values)
        types = qualified_types(fn.types_for(args, weak))
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
