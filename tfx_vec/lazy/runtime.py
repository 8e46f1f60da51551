"""The runtime: live-tensor registry, the barrier, the LRU compile cache, execution, fallback.

``barrier(cause)`` (``lazy.mark_step()``, and every forcing point) computes every live lazy tensor
with pending computation and every pending variable update in **one** program:

1. collect the live pending tensors (weak references registered at creation) and the variables
   whose value was substituted by ``assign*``;
2. :func:`ir.canonicalize` the graph under them into a key (ops, attrs, shapes, dtypes, wiring,
   no data) and its parameters (tensors, Python scalars, variables);
3. look the key up in the LRU cache; on a miss :func:`lowering.build` a
   ``tf.function(jit_compile=True)`` (guarded by ``max_graphs``);
4. run it (optionally on a background thread): variable updates happen inside the compiled
   program as XLA resource updates; every output becomes a ``data`` node that its tensors now
   point at.

Because the barrier always takes *all* live tensors and *all* pending updates together, and every
computed value is substituted into its tensors, the paper's aliasing hazards cannot occur: a read
of a variable in a program always sees the value from before that program's updates.

Example:
    >>> configure(max_graph_size=10000)["max_graph_size"]
    10000
"""
from __future__ import annotations

import collections
import contextlib
import math
import os
import sys
import time
import weakref
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf
from tensorflow.python import pywrap_tfe
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.eager import context
from tensorflow.python.framework import ops

from . import ir, lowering, metrics
from .errors import LazyCompileError, LazyError, LazyFallbackError, LazyRecompilationError

__all__ = ["barrier", "wait", "resolve", "configure", "clear_cache", "fallback", "user_frame",
           "register", "mark_variable", "mark_variables", "forget_variable", "on_host",
           "check_no_strategy"]


class _Config:
    fallback_error = os.environ.get("TFX_VEC_LAZY_FALLBACK_ERROR", "") not in ("", "0")
    max_graphs: int | None = None        # total compilations allowed before an error
    cache_size = 128                     # compiled programs kept (LRU)
    max_graph_size = 10000               # nodes recorded before an automatic barrier
    trace_cache = True                   # reuse canonical programs of repeated recordings
    record_calls = True                  # tf.GradientTape gradients, Keras optimizer updates:
    #                                      one node each inside lazy.device()


CONFIG = _Config()
_live: list = []                              # weakrefs to LazyTensors created since the barrier
_pending_vars: dict[int, Any] = {}            # id -> Variable with a substituted value
_cache: "collections.OrderedDict[tuple, Any]" = collections.OrderedDict()
_traces: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()  # see _program
_last_trace: list = [None, None]              # (fingerprint, entry) of the last trace hit
_compiled_total = [0]
_recorded = [0]                               # nodes recorded since the last barrier
_tapes: "weakref.WeakSet" = weakref.WeakSet()  # lazy.GradientTapes that may still differentiate
BARRIER_HOOKS: list = []      # called by every barrier that computes something
BARRIER_CHECKS: list = []     # called first by every barrier (may raise: nothing changed yet)


_KEEP: Any = object()   # "leave this setting as it is" (None is a value for max_graphs)


def _checked(name: str, value: Any, kind: str) -> Any:
    """``value`` if it is a valid setting of kind "bool", "count" (an int >= 1) or
    "count or None"; a TypeError/ValueError naming the argument otherwise."""
    if kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"lazy.configure({name}={value!r}): expected True or False, got "
                            f"{type(value).__name__}")
        return bool(value)
    if value is None and kind == "count or None":
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        expected = "an int >= 1" + (" or None" if kind == "count or None" else "")
        raise TypeError(f"lazy.configure({name}={value!r}): expected {expected}, got "
                        f"{type(value).__name__}")
    if value < 1:
        raise ValueError(f"lazy.configure({name}={value!r}): must be >= 1")
    return int(value)


def check_no_strategy(where: str) -> None:
    """A :class:`LazyError` when a ``tf.distribute`` strategy (other than the default) is in
    scope: the lazy runtime records one device's ops in one thread and does not replicate."""
    if distribute_lib.has_strategy():
        strategy = type(distribute_lib.get_strategy()).__name__
        raise LazyError(
            f"{where} under a tf.distribute strategy ({strategy}): tfx_vec.lazy records one "
            "device's ops in one thread and does not replicate them.  Run the strategy's own "
            "compiled step (strategy.run inside tf.function(jit_compile=True)) instead, or use "
            "tfx_vec.lazy outside strategy.scope()")


def configure(*, fallback_error: bool = _KEEP, max_graphs: int | None = _KEEP,
              cache_size: int = _KEEP, max_graph_size: int = _KEEP,
              trace_cache: bool = _KEEP, record_calls: bool = _KEEP) -> dict:
    """Set runtime options (each argument checked at once; omitted ones are kept); returns the
    current settings.

    Args:
        fallback_error: make every eager fallback a :class:`LazyFallbackError`
            (also ``TFX_VEC_LAZY_FALLBACK_ERROR=1``).
        max_graphs: raise :class:`LazyRecompilationError` when more than this many programs
            have been compiled (``None`` disables the guard); counts from this call.
        cache_size: how many compiled programs the LRU cache keeps.
        max_graph_size: recorded nodes (and variable updates) after which a barrier cuts the
            trace automatically.
        trace_cache: reuse the canonical program of a step that recorded the same ops as an
            earlier one, skipping the graph walk at the barrier (on by default).
        record_calls: inside ``lazy.device()``, record a ``tf.GradientTape`` gradient and a
            Keras optimizer update as one node each, replayed by TensorFlow's and Keras' own
            code in the compiled program (on by default); ``False`` records them op by op.

    >>> configure(max_graph_size=5000)["max_graph_size"]
    5000
    >>> configure(max_graphs="3")
    Traceback (most recent call last):
    TypeError: lazy.configure(max_graphs='3'): expected an int >= 1 or None, got str
    >>> _ = configure(max_graph_size=10000)
    """
    settings = {name: _checked(name, value, kind) for name, value, kind in (
        ("fallback_error", fallback_error, "bool"), ("max_graphs", max_graphs, "count or None"),
        ("cache_size", cache_size, "count"), ("max_graph_size", max_graph_size, "count"),
        ("trace_cache", trace_cache, "bool"), ("record_calls", record_calls, "bool"))
        if value is not _KEEP}
    for name, value in settings.items():
        setattr(CONFIG, name, value)
    if "max_graphs" in settings:
        _compiled_total[0] = 0
    while len(_cache) > CONFIG.cache_size:
        _cache.popitem(last=False)
    while len(_traces) > CONFIG.cache_size:
        _traces.popitem(last=False)
    return {"fallback_error": CONFIG.fallback_error, "max_graphs": CONFIG.max_graphs,
            "cache_size": CONFIG.cache_size, "max_graph_size": CONFIG.max_graph_size,
            "trace_cache": CONFIG.trace_cache, "record_calls": CONFIG.record_calls}


def clear_cache() -> None:
    """Drop every compiled program (the next barrier of each shape compiles again) and every
    remembered trace.

    >>> clear_cache(); len(_cache)
    0
    """
    _cache.clear()
    _traces.clear()
    _last_trace[:] = [None, None]


def register(tensor: Any) -> None:
    """Track a new lazy tensor with pending computation (weakly) for the next barrier."""
    _live.append(weakref.ref(tensor))
    _recorded[0] += 1
    if _recorded[0] > CONFIG.max_graph_size:
        metrics.bump("graph_size_cuts")
        barrier("graph size limit")


def mark_variable(var: Any) -> None:
    """Note that ``var``'s value was substituted and must be written back at the barrier.

    Updates count toward ``max_graph_size`` like recorded tensors: a loop of ``assign_*``
    without a barrier is cut too.
    """
    _pending_vars[id(var)] = var
    _recorded[0] += 1
    if _recorded[0] > CONFIG.max_graph_size:
        metrics.bump("graph_size_cuts")
        barrier("graph size limit")


def mark_variables(variables: list) -> None:
    """:func:`mark_variable` for several variables at once."""
    for var in variables:
        _pending_vars[id(var)] = var
    _recorded[0] += len(variables)
    if _recorded[0] > CONFIG.max_graph_size:
        metrics.bump("graph_size_cuts")
        barrier("graph size limit")


def forget_variable(var: Any) -> None:
    """Drop ``var``'s pending update (the variable is being destroyed)."""
    _pending_vars.pop(id(var), None)
    var._node = var._read


def user_frame() -> str:
    """``file:line in function`` of the innermost frame outside tfx_vec.lazy and TensorFlow."""
    here = os.path.dirname(os.path.abspath(__file__))
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(here) and "/tensorflow/" not in name and "/keras/" not in name \
                and "contextlib" not in name and "/hypothesis/" not in name:
            return f"{name}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return "<unknown>"


class Pending:
    """Output ``index`` of a program still running on the executor thread (``data`` node value)."""

    __slots__ = ("future", "index")

    def __init__(self, future: Any, index: int):
        self.future, self.index = future, index

    def get(self) -> tf.Tensor:
        return self.future.result()[self.index]


_inflight: list = [None]     # the future of the program running in the background, if any
_executor: list = [None]


def wait() -> None:
    """Block until the program launched by an asynchronous barrier has finished (re-raising its
    error, if any).  Forcing points and the next barrier call this themselves."""
    future = _inflight[0]
    if future is not None:
        _inflight[0] = None
        future.result()


def resolve(value: Any) -> Any:
    """A ``data`` node's tensor, waiting for its program when it is still running."""
    if type(value) is Pending:
        wait()
        return value.get()
    return value


HOST = "/job:localhost/replica:0/task:0/device:CPU:0"


@contextlib.contextmanager
def on_host() -> Iterator[None]:
    """Run TensorFlow ops eagerly on the host device: the barrier's program, fallbacks and
    constants are never recorded (not even inside ``lazy.device()`` or a ``tf.function``
    being traced)."""
    # Not ops.init_scope(): it stops gradient recording, and the program's replay traces
    # tf.GradientTapes of its own.
    ctx = context.context()
    if ctx.executing_eagerly():   # (every barrier of an eager program: the scope alone)
        with ctx.device(HOST):
            yield
        return
    with context.eager_mode(), ops.device(HOST):
        yield


def barrier(cause: str | Callable[[], str] = "mark_step", wait_for_results: bool = True) -> None:
    """Compute all live pending tensors and pending variable updates in one compiled program.
    ``cause`` names the barrier in messages; a callable is called only when one is shown (a
    forcing point's names its user's line: a stack walk).

    With ``wait_for_results=False`` a cached program runs on a background thread (the XLA run
    releases the GIL), so Python records the next step meanwhile; its results are waited for
    by the first use of one of them, a forcing point or the next barrier.
    """
    with on_host():
        _barrier(cause, wait_for_results)


def _barrier(cause: str | Callable[[], str], wait_for_results: bool) -> None:
    for check in BARRIER_CHECKS:
        check()
    wait()  # the running program's outputs and variable updates are this one's inputs
    live = []
    for ref in _live:
        t = ref()
        if t is not None and t._node.pending:
            live.append(t)
    _live.clear()
    _recorded[0] = 0
    variables = list(_pending_vars.values())
    _pending_vars.clear()
    variables = [v for v in variables if v._node is not v._read]
    if not live and not variables:
        ir.RECORDING.reset()
        return
    for hook in BARRIER_HOOKS:
        hook()
    metrics.bump("barriers")
    outputs = list({id(t._node): t._node for t in live}.values())
    assigns = [(v._read, v._node) for v in variables]
    t0 = time.perf_counter()
    prog = _program(outputs, assigns)
    prog.data[:] = [d.get() if type(d) is Pending else d for d in prog.data]
    metrics.add_time("canonicalize", t0)
    fn = _cache.get(prog.key)
    if not wait_for_results and fn is not None and fn.traced:
        _cache.move_to_end(prog.key)
        metrics.bump("cache_hits")
        metrics.bump("executions")
        if _executor[0] is None:
            from concurrent.futures import ThreadPoolExecutor
            _executor[0] = ThreadPoolExecutor(1, thread_name_prefix="tfx_vec.lazy")
        future = _executor[0].submit(_run_async, fn, prog, _scalar_vector(prog.scalars),
                                     user_frame())
        _inflight[0] = future
        results: list = [Pending(future, k) for k in range(len(outputs))]
    else:
        results = _execute(prog, cause)
    fresh = {id(n): ir.Node("data", (), (), n.shape, n.dtype, r) for n, r in zip(outputs, results)}
    for tape in _tapes:
        tape._remember(outputs, fresh)
    for t in live:
        t._node = fresh[id(t._node)]
    for v in variables:
        v._node = v._read


def _program(outputs: list, assigns: list) -> ir.Program:
    """The canonical program under ``outputs`` and ``assigns``, from the trace cache when this
    step recorded the same op log as an earlier one (then no graph walk, no key building).

    The trace cache maps the recording's fingerprint (``ir.Recording``: every op with its
    attrs, shape, dtype and input positions, every leaf's kind, shape and dtype, the outputs and
    assigns) to the canonical key and the log positions of its parameters.  Equal fingerprints
    are compared in full by the dict, so a hit is never a different graph.
    """
    rec = ir.RECORDING
    try:
        fp = rec.fingerprint(outputs, assigns) if CONFIG.trace_cache else None
        if fp is not None and fp == _last_trace[0]:  # a loop repeats its step: equality
            hit = _last_trace[1]                         # short-cuts on shared objects, a
        else:                                            # dict lookup hashes the whole log
            hit = _traces.get(fp) if fp is not None else None
            if hit is not None:
                _traces.move_to_end(fp)
                _last_trace[:] = [fp, hit]
        if hit is not None:
            metrics.bump("trace_hits")
            key, (data, scalars, variables) = hit
            nodes = rec.nodes
            return ir.Program(key, [nodes[i].value for i in data],
                              [nodes[i].value for i in scalars],
                              [nodes[i].value for i in variables], {})
        prog = ir.canonicalize(outputs, assigns)
        if fp is not None:
            params = rec.params(prog)
            if params is not None:
                _traces[fp] = (prog.key, params)
                while len(_traces) > CONFIG.cache_size:
                    _traces.popitem(last=False)
        return prog
    finally:
        rec.reset()


def _run_async(fn: Any, prog: ir.Program, scalars: tf.Tensor, where: str) -> list:
    try:
        return _timed("execute", fn, prog.data, scalars, prog.variables)
    except Exception as e:  # surfaces at the first use of a result
        ops = sorted({e_[0] for e_ in prog.key[0]} - ir.PARAM_OPS)
        raise LazyCompileError(f"the lazy program {ir.key_hash(prog.key)} (ops {ops}) launched "
                               f"at {where} failed: {str(e).splitlines()[0]}") from e


def _execute(prog: ir.Program, cause: str | Callable[[], str]) -> list:
    fn = _cache.get(prog.key)
    first = fn is None
    if first:
        fn = _compile(prog, cause)
    else:
        _cache.move_to_end(prog.key)
        metrics.bump("cache_hits")
    scalars = _scalar_vector(prog.scalars)
    name = "compile" if first else "execute"
    try:
        out = _timed(name, fn, prog.data, scalars, prog.variables)
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError,
            NotImplementedError) as e:
        _cache.pop(prog.key, None)
        ops = sorted({e_[0] for e_ in prog.key[0]} - ir.PARAM_OPS)
        where = f"the lazy program {ir.key_hash(prog.key)} (ops {ops}) run at {user_frame()}"
        if not (first and "unsupported operations" in str(e)):
            raise LazyCompileError(f"{where} failed: {str(e).splitlines()[0]}") from e
        # An op XLA cannot compile: run this program as a plain tf.function (counted).
        metrics.count_fallback("no_xla", user_frame())
        if CONFIG.fallback_error:
            raise LazyFallbackError(f"{where}: XLA cannot compile it: "
                                    f"{str(e).splitlines()[0]}") from e
        fn = _cache[prog.key] = lowering.build(prog.key, jit=False)
        out = _timed(name, fn, prog.data, scalars, prog.variables)
    metrics.bump("executions")
    return out


def _timed(name: str, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, timed into timer ``name`` (a context manager costs more calls)."""
    t0 = time.perf_counter()
    try:
        return fn(*args)
    finally:
        metrics.add_time(name, t0)


_last_scalars: list = [None, None]  # (values, tensor): a training loop repeats its scalars


def _scalar_vector(values: list) -> tf.Tensor:
    """The program's Python scalars as one float64 vector (reused while they repeat)."""
    # keyed with each zero's sign: -0.0 == 0.0, and x / -0.0 is not x / 0.0
    key = tuple([(v, math.copysign(1.0, v)) if v == 0 else v for v in values])
    if key != _last_scalars[0]:
        _last_scalars[0], _last_scalars[1] = key, tf.constant(values, tf.float64, shape=[len(key)])
    return _last_scalars[1]


_site_keys: dict = {}   # barrier site (cause at user line) -> the key it compiled last


def _why(prog: ir.Program, cause: str) -> str:
    """The recompilation cause when this barrier site compiled another program before."""
    site = f"{cause.split(' at ')[0]} at {user_frame()}"
    previous = _site_keys.get(site)
    _site_keys[site] = prog.key
    if len(_site_keys) > 1000:
        _site_keys.clear()
    if previous is None:
        return ""
    text = f"{site}: {ir.describe_change(previous, prog.key)}"
    metrics.note_recompilation(text)
    return text


def _compile(prog: ir.Program, cause: str | Callable[[], str]) -> Any:
    cause = cause if isinstance(cause, str) else cause()
    why = _why(prog, cause)
    if CONFIG.max_graphs is not None and _compiled_total[0] >= CONFIG.max_graphs:
        raise LazyRecompilationError(
            f"recompilation storm: {_compiled_total[0]} programs compiled, max_graphs="
            f"{CONFIG.max_graphs}; this one ({ir.key_hash(prog.key)}, {len(prog.key[0])} nodes, "
            f"cause: {cause}) was triggered at {user_frame()}"
            f"{'; it differs from the last one there: ' + why.split(': ', 1)[1] if why else ''}"
            ".  Check lazy.metrics_report() (recompilations) or TFX_VEC_LAZY_DEBUG=1, or "
            "raise lazy.configure(max_graphs=)")
    _compiled_total[0] += 1
    metrics.bump("compiles")
    if os.environ.get("TFX_VEC_LAZY_DEBUG", "") not in ("", "0"):
        print(f"[tfx_vec.lazy] compile #{_compiled_total[0]}: cause={cause} "
              f"hash={ir.key_hash(prog.key)} nodes={len(prog.key[0])} at {user_frame()}"
              f"{'; recompiled because ' + why if why else ''}",
              file=sys.stderr, flush=True)
    fn = lowering.build(prog.key)
    _cache[prog.key] = fn
    while len(_cache) > CONFIG.cache_size:
        _cache.popitem(last=False)
    return fn


def count_fallback(name: str, reason: str = "") -> None:
    """Count an eager fallback of ``name`` at the user's line (or raise, when fallbacks are
    errors)."""
    metrics.count_fallback(name, user_frame())
    if CONFIG.fallback_error:
        raise LazyFallbackError(
            f"tf.{name} has no lazy recording rule{(' (' + reason + ')') if reason else ''}; "
            f"called at {user_frame()}.  Fallbacks are errors (lazy.configure("
            f"fallback_error=False) or TFX_VEC_LAZY_FALLBACK_ERROR=0 allows them)")


def fallback(name: str, api: Any, args: tuple, kwargs: dict, reason: str = "") -> Any:
    """Run ``api`` eagerly on forced inputs; results start new graphs.  Counted per op."""
    from .tensor import LazyTensor, tensor

    count_fallback(name, reason)
    flat = tf.nest.flatten((args, kwargs))
    if any(isinstance(x, LazyTensor) and x._pending() for x in flat):
        barrier(f"fallback tf.{name}")
    flat = [_eager(x) if isinstance(x, LazyTensor) else x for x in flat]
    args, kwargs = tf.nest.pack_sequence_as((args, kwargs), flat)
    with on_host():
        out = api(*args, **kwargs)
    return tf.nest.map_structure(
        lambda x: tensor(x) if isinstance(x, tf.Tensor) and not isinstance(
            x, tf.__internal__.SymbolicTensor) else x, out)


def read_host(handle: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """The value of the variable whose host resource is ``handle``, read eagerly with one op
    call and no device scope to enter (a value read at every step: ``steps.numpy()``),
    after the update in flight, if any."""
    wait()
    ctx = context.context()
    return pywrap_tfe.TFE_Py_Execute(ctx._handle, HOST, "ReadVariableOp", [handle],
                                     ("dtype", dtype.as_datatype_enum), 1)[0]


def _eager(t: Any) -> tf.Tensor:
    """The materialized value of a lazy tensor that is not pending."""
    return _eager_value(t._node)


def _eager_value(node: Any) -> tf.Tensor:
    """The host value of a leaf node (data, variable, baked constant or scalar)."""
    if node.op == "data":
        return resolve(node.value)
    if node.op == "var" and type(node.value) is ops.EagerTensor and \
            context.executing_eagerly():
        return read_host(node.value, node.dtype)
    with on_host():
        if node.op == "var":
            wait()  # an update may be in flight
            return lowering.read_variable(node.value, node.dtype)
        value, dtype = node.attrs if node.op == "const" else (node.value, node.dtype)
        return tf.constant(value, dtype)
