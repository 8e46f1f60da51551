"""Jacobians, hessians and per-example gradients computed with pfor (paper §5.1, §5.3).

A jacobian is a parallel-for over the output elements: iteration ``i`` back-propagates the
``i``-th one-hot cotangent (reverse mode) or pushes the ``i``-th one-hot tangent forward
(forward mode, :class:`tf.autodiff.ForwardAccumulator`).  pfor turns that loop into one
vectorized backward (or forward) pass; ``use_pfor=False`` runs the same loop as a
``tf.while_loop`` (the reference, and what TensorFlow does without pfor).

Entry points (all work eagerly and inside ``tf.function``):

- :func:`jacobian` ``(f, x)`` with a function ``f`` -- or ``(target, sources, tape=tape)`` like
  ``tf.GradientTape.jacobian`` -- or ``(target, sources)`` on graph tensors like
  ``tf.gradients``; ``mode="forward"`` for few inputs and many outputs.
- :func:`batch_jacobian` ``(f, x)`` / ``(target, source, tape=tape)``: ``[b, *y, *x]`` for
  functions whose ``b`` rows are independent.
- :func:`hessian` ``(f, x)``: the jacobian of the jacobian, for outputs of any shape.
- :func:`per_example_gradients` ``(loss_fn, variables, batch)``: one gradient per example.

Example:
    >>> import tensorflow as tf, tfx_vec
    >>> x = tf.constant([1.0, 2.0])
    >>> tfx_vec.jacobian(lambda x: x * x, x).numpy().tolist()
    [[2.0, 0.0], [0.0, 4.0]]
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import tensorflow as tf

__all__ = ["jacobian", "batch_jacobian", "hessian", "per_example_gradients"]

_MODES = ("reverse", "forward")

#: Library entry points are not AutoGraph-converted when called from a user's tf.function
#: (AutoGraph would otherwise rewrite the vectorizer's own Python control flow).
_library_code = tf.autograph.experimental.do_not_convert


# {{{ the parallel loop: pfor or a while_loop

def _parallel_map(loop_fn: Callable[[tf.Tensor], Any], n, spec: Any, *, use_pfor: bool,
                  parallel_iterations: int | None, fallback_to_while_loop: bool) -> Any:
    """Stack ``loop_fn(i)`` for ``i < n``, vectorized or as a ``tf.while_loop``.

    ``spec`` (``tf.TensorSpec`` structure of one iteration's output) is needed by the
    while_loop, which traces ``loop_fn`` once inside its body.
    """
    if use_pfor:
        from tfx_vec.pfor import api
        kw = {"fallback_to_while_loop": fallback_to_while_loop}
        if parallel_iterations is not None:
            kw["parallel_iterations"] = parallel_iterations
        return api.pfor(loop_fn, n, **kw)
    return _graph_mode(lambda: tf.map_fn(loop_fn, tf.range(n), fn_output_signature=spec,
                                         parallel_iterations=parallel_iterations or 10))


def _spec(t) -> tf.TensorSpec:
    return tf.TensorSpec(t.shape, t.dtype)

# }}}


def _tf_sources(sources: Any) -> list:
    """``sources`` flattened, a Keras 3 variable replaced by the ``tf.Variable`` it holds
    (``GradientTape.watch`` and ``gradient`` take only TensorFlow's own)."""
    def unwrap(v):
        if isinstance(v, (tf.Variable, tf.Tensor)):
            return v
        inner = getattr(v, "value", None)
        return inner if isinstance(inner, tf.Variable) else v
    return [unwrap(v) for v in tf.nest.flatten(sources)]


def _zeros_for_none(grads: Sequence[Any], sources: Sequence[Any]) -> list[tf.Tensor]:
    return [tf.zeros_like(s) if g is None else tf.convert_to_tensor(g)
            for g, s in zip(grads, sources)]


_UNCONNECTED = ("none", "zero")


def _check_traced(connected: list, rows: Sequence) -> None:
    """The loop body records which sources are connected while it is traced; a result
    without that record would silently drop gradients."""
    if len(connected) != len(rows):
        raise RuntimeError("tfx_vec.pfor.gradients: the loop body was not traced for this "
                           "call, so which sources the target depends on is unknown")


def _check_unconnected(unconnected_gradients) -> str:
    value = getattr(unconnected_gradients, "value", unconnected_gradients)
    if value not in _UNCONNECTED:
        raise ValueError(f"unconnected_gradients must be one of {_UNCONNECTED} (or a "
                         f"tf.UnconnectedGradients), got {unconnected_gradients!r}")
    return value


def _differentiable(source, what: str) -> bool:
    """Whether ``source`` has a gradient dtype; warns (as TensorFlow does) when not."""
    dtype = tf.as_dtype(source.dtype)
    if dtype.is_floating or dtype.is_complex:
        return True
    warnings.warn(f"{what}: the source {getattr(source, 'name', '')} has dtype {dtype.name}; "
                  "gradients exist only for floating and complex sources, so its result is "
                  "None", stacklevel=4)
    return False


def _graph_mode(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` inside one ``tf.function`` trace when eager, so nested tapes stay symbolic."""
    if tf.executing_eagerly():
        return tf.function(fn, autograph=False)()
    return fn()


def _check_mode(mode: str) -> None:
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")


# {{{ jacobian

@_library_code
def jacobian(f_or_target: Callable[..., Any] | tf.Tensor, sources: Any, *,
             tape: tf.GradientTape | None = None, mode: str = "reverse",
             use_pfor: bool = True, parallel_iterations: int | None = None,
             fallback_to_while_loop: bool = True,
             unconnected_gradients: str | tf.UnconnectedGradients = "none") -> Any:
    """The jacobian of ``f(sources)`` (or of ``target``) with respect to ``sources``.

    Args:
      f_or_target: a function of ``sources`` returning one tensor ``y`` (called once), or the
        tensor ``y`` itself, recorded on ``tape`` (eager or graph) or, inside a graph without a
        tape, reachable by ``tf.gradients``.
      sources: a tensor or variable, or a nested structure of them.  When ``f`` is given, a
        list/tuple of sources is passed to ``f`` as positional arguments.
      tape: the tape that recorded ``target`` (ignored when a function is given).
      mode: ``"reverse"`` (one vectorized backward pass over the ``y.size`` rows) or
        ``"forward"`` (one vectorized forward pass over the ``x.size`` columns; needs ``f``).
      use_pfor: vectorize with pfor; False runs the per-row loop as a ``tf.while_loop``.
      parallel_iterations: as in pfor: at most this many rows vectorized at a time.
      fallback_to_while_loop: allow pfor's counted per-op fallback (False: raise instead).
      unconnected_gradients: ``"none"`` (as ``tape.jacobian`` and TensorFlow's
        ``jacobian``): a source ``y`` does not depend on gives ``None``; ``"zero"``: zeros.

    Returns:
      For each source ``x``, a tensor of shape ``y.shape + x.shape`` (same structure as
      ``sources``); ``None`` for a source ``y`` does not depend on (see above) and, with a
      warning, for an integer source (no gradient exists).

    Example:
      >>> import tensorflow as tf
      >>> x = tf.constant([1.0, 2.0, 3.0])
      >>> jacobian(lambda x: tf.reduce_sum(x) * x, x, mode="forward").shape.as_list()
      [3, 3]
      >>> print(jacobian(lambda x: tf.ones([2]), x))
      None
    """
    _check_mode(mode)
    opts = dict(use_pfor=use_pfor, parallel_iterations=parallel_iterations,
                fallback_to_while_loop=fallback_to_while_loop,
                unconnected=_check_unconnected(unconnected_gradients))
    if callable(f_or_target) and not isinstance(f_or_target, (tf.Tensor, tf.Variable)):
        f = f_or_target
        if mode == "forward":
            return _graph_mode(lambda: _forward_jacobian(f, sources, **opts))
        return _graph_mode(lambda: _function_jacobian(f, sources, **opts))
    if mode == "forward":
        raise ValueError("mode='forward' needs a function f, not a computed target")
    return _reverse_jacobian(f_or_target, sources, tape, **opts)


def _call(f, sources):
    return f(*sources) if isinstance(sources, (list, tuple)) else f(sources)


def _function_jacobian(f, sources, **opts):
    sources = tf.nest.map_structure(_as_source, sources)
    with tf.GradientTape(persistent=not opts["use_pfor"]) as tape:
        for s in tf.nest.flatten(sources):
            tape.watch(s)
        y = _call(f, sources)
    return _reverse_jacobian(y, sources, tape, **opts)


def _as_source(s):
    return s if isinstance(s, tf.Variable) else tf.convert_to_tensor(s)


def _gradient_fn(target, tape):
    """``g(cotangent, sources) -> grads`` (None where unconnected) via the tape, or
    ``tf.gradients`` in a graph."""
    if tape is not None:
        return lambda ct, flat: tape.gradient(target, flat, output_gradients=ct)
    if tf.executing_eagerly():
        raise ValueError("jacobian of a computed tensor in eager mode needs tape=...; or pass "
                         "a function: tfx_vec.jacobian(f, x)")
    return lambda ct, flat: tf.gradients(target, flat, grad_ys=ct)


def _reverse_jacobian(target, sources, tape, *, use_pfor, parallel_iterations,
                      fallback_to_while_loop, unconnected):
    target = tf.convert_to_tensor(target)
    flat = _tf_sources(sources)
    wanted = [k for k, s in enumerate(flat) if _differentiable(s, "jacobian")]
    grad = _gradient_fn(target, tape)
    y_shape = tf.shape(target)
    m = tf.size(target)
    sources_in = [flat[k] for k in wanted]
    connected: list[bool] = []

    def loop_fn(i):
        ct = tf.reshape(tf.one_hot(i, m, dtype=target.dtype), y_shape)
        grads = grad(ct, sources_in) if sources_in else []
        connected[:] = [g is not None for g in grads]
        return _zeros_for_none(grads, sources_in)

    rows = _parallel_map(loop_fn, m, [_spec(s) for s in sources_in], use_pfor=use_pfor,
                         parallel_iterations=parallel_iterations,
                         fallback_to_while_loop=fallback_to_while_loop) if sources_in else []
    _check_traced(connected, rows)
    out = [None] * len(flat)
    for k, r, c in zip(wanted, rows, connected):
        if c or unconnected == "zero":
            out[k] = _unflatten_rows(r, target, flat[k])
    return tf.nest.pack_sequence_as(sources, out)


def _unflatten_rows(rows: tf.Tensor, target: tf.Tensor, source) -> tf.Tensor:
    """``[y.size, *x.shape] -> [*y.shape, *x.shape]`` keeping static shapes."""
    out = tf.reshape(rows, tf.concat([tf.shape(target), tf.shape(source)], 0))
    out.set_shape(target.shape.concatenate(source.shape))
    return out


def _forward_jacobian(f, sources, *, use_pfor, parallel_iterations, fallback_to_while_loop,
                      unconnected):
    sources = tf.nest.map_structure(_as_source, sources)
    primals = tf.nest.flatten(sources)
    wanted = [k for k, s in enumerate(primals) if _differentiable(s, "jacobian")]
    with tf.GradientTape() as tape:  # one plain forward pass: y's shape, what y depends on
        tape.watch([primals[k] for k in wanted])
        y0 = _call(f, sources)
    connected = [g is not None for g in tape.gradient(y0, [primals[k] for k in wanted])]
    keep = [k for k, c in zip(wanted, connected) if c or unconnected == "zero"]
    out = [None] * len(primals)
    if keep:
        for k, block in zip(keep, _forward_columns(f, sources, primals, keep, _spec(y0),
                                                   use_pfor, parallel_iterations,
                                                   fallback_to_while_loop)):
            out[k] = block
    return tf.nest.pack_sequence_as(sources, out)


def _forward_columns(f, sources, primals, keep, y_spec, use_pfor, parallel_iterations,
                     fallback_to_while_loop) -> list[tf.Tensor]:
    """``[*y, *x.shape]`` for each source ``primals[k]``, ``k`` in ``keep``: one vectorized
    forward pass over the columns of all of them."""
    flat = [tf.convert_to_tensor(primals[k]) for k in keep]
    sizes = [tf.size(s) for s in flat]
    total = tf.add_n(sizes) if len(sizes) > 1 else sizes[0]
    offsets = tf.cumsum(tf.stack(sizes), exclusive=True)

    def loop_fn(j):
        tangents = []
        for k, s in zip(keep, flat):
            pos = keep.index(k)
            hot = tf.one_hot(j - offsets[pos], sizes[pos], dtype=s.dtype)
            tangents.append(tf.reshape(hot, tf.shape(s)))
        with tf.autodiff.ForwardAccumulator([primals[k] for k in keep], tangents) as acc:
            y = _call(f, sources)
        return acc.jvp(y, unconnected_gradients=tf.UnconnectedGradients.ZERO)

    cols = _parallel_map(loop_fn, total, y_spec, use_pfor=use_pfor,
                         parallel_iterations=parallel_iterations,
                         fallback_to_while_loop=fallback_to_while_loop)  # [x.size, *y]
    y_shape = tf.shape(cols)[1:]
    y_rank = tf.size(y_shape)
    out, start = [], 0
    for pos, s in enumerate(flat):
        block = cols[start:start + sizes[pos]] if len(flat) > 1 else cols  # [x.size, *y]
        start += sizes[pos]
        perm = tf.concat([tf.range(1, y_rank + 1), [0]], 0)
        moved = tf.transpose(block, perm)  # [*y, x.size]
        res = tf.reshape(moved, tf.concat([y_shape, tf.shape(s)], 0))
        res.set_shape(y_spec.shape.concatenate(s.shape))
        out.append(res)
    return out

# }}}


# {{{ batch_jacobian, hessian

@_library_code
def batch_jacobian(f_or_target: Callable[[tf.Tensor], tf.Tensor] | tf.Tensor, source, *,
                   tape: tf.GradientTape | None = None, use_pfor: bool = True,
                   parallel_iterations: int | None = None,
                   fallback_to_while_loop: bool = True,
                   unconnected_gradients: str | tf.UnconnectedGradients = "none"
                   ) -> tf.Tensor | None:
    """Per-row jacobians ``[b, *y.shape[1:], *x.shape[1:]]`` of ``y = f(x)`` (``x: [b, ...]``).

    Row ``k`` of ``y`` must depend on row ``k`` of ``x`` only (as in
    ``tf.GradientTape.batch_jacobian``); the loop runs over the ``prod(y.shape[1:])``
    per-example output elements, each iteration back-propagating a one-hot cotangent in every
    batch row at once.  ``y`` and ``x`` must have the same first dimension: a ``ValueError``
    when their static shapes disagree, a run-time assertion otherwise.  ``None`` (with
    ``unconnected_gradients="none"``, as TensorFlow) when ``y`` does not depend on ``x``, or,
    with a warning, when ``x`` is an integer tensor.

    Example:
      >>> import tensorflow as tf
      >>> x = tf.ones([4, 3])
      >>> batch_jacobian(lambda x: x * 2.0, x).shape.as_list()
      [4, 3, 3]
    """
    opts = dict(use_pfor=use_pfor, parallel_iterations=parallel_iterations,
                fallback_to_while_loop=fallback_to_while_loop,
                unconnected=_check_unconnected(unconnected_gradients))
    if callable(f_or_target) and not isinstance(f_or_target, (tf.Tensor, tf.Variable)):
        f = f_or_target

        def run():
            x = _as_source(source)
            with tf.GradientTape(persistent=not use_pfor) as t:
                t.watch(x)
                y = f(x)
            return _batch_jacobian(y, x, t, **opts)
        return _graph_mode(run)
    return _batch_jacobian(f_or_target, source, tape, **opts)


def _batch_jacobian(target, source, tape, *, unconnected, **opts):
    target = tf.convert_to_tensor(target)
    x = tf.convert_to_tensor(source)
    if not target.shape[:1].is_compatible_with(x.shape[:1]):
        raise ValueError(f"batch_jacobian: Need first dimension of `output` shape "
                         f"({target.shape}) and `inp` shape ({x.shape}) to match (row k of "
                         "the output must depend on row k of the input only)")
    if not _differentiable(source, "batch_jacobian"):
        return None
    grad = _gradient_fn(target, tape)
    y_shape = tf.shape(target)
    b = y_shape[0]
    check = tf.debugging.assert_equal(
        b, tf.shape(x)[0], message="batch_jacobian: the output and the input must have the "
                                   "same first dimension")
    with tf.control_dependencies([check]):
        m = tf.size(target) // tf.maximum(b, 1)
    connected: list[bool] = []

    def loop_fn(j):
        ct = tf.tile(tf.one_hot(j, m, dtype=target.dtype)[None, :], tf.stack([b, 1]))
        g = grad(tf.reshape(ct, y_shape), [source])
        connected[:] = [g[0] is not None]
        return _zeros_for_none(g, [source])[0]

    cols = _parallel_map(loop_fn, m, _spec(x), **opts)  # [m, b, *x[1:]]
    if not connected[0] and unconnected == "none":
        return None
    rank = tf.rank(cols)
    moved = tf.transpose(cols, tf.concat([[1, 0], tf.range(2, rank)], 0))
    out = tf.reshape(moved, tf.concat([y_shape, tf.shape(x)[1:]], 0))
    out.set_shape(target.shape.concatenate(x.shape[1:]))
    return out


@_library_code
def hessian(f: Callable[..., tf.Tensor], x, *, use_pfor: bool = True,
            parallel_iterations: int | None = None,
            fallback_to_while_loop: bool = True) -> tf.Tensor:
    """The hessian ``[*y.shape, *x.shape, *x.shape]`` of ``y = f(x)``, for ``y`` of any shape.

    Computed as the jacobian of the jacobian; the inner jacobian's vectorized backward pass
    (with its loops, if ``f`` has any) is itself differentiated and vectorized again.

    Example:
      >>> import tensorflow as tf
      >>> h = hessian(lambda x: x ** 3, tf.constant([1.0, 2.0]))
      >>> h.shape.as_list(), float(h[1, 1, 1])
      ([2, 2, 2], 12.0)
    """
    opts = dict(use_pfor=use_pfor, parallel_iterations=parallel_iterations,
                fallback_to_while_loop=fallback_to_while_loop)

    opts["unconnected"] = "zero"   # d/dx of a zero inner jacobian is a zero hessian

    def run():
        inner = lambda v: _function_jacobian(f, v, **opts)  # noqa: E731
        return _function_jacobian(inner, _as_source(x), **opts)
    return _graph_mode(run)

# }}}


# {{{ per-example gradients

@_library_code
def per_example_gradients(loss_fn: Callable[[Any], tf.Tensor], variables: Any,
                          batch: Any, *, use_pfor: bool = True,
                          parallel_iterations: int | None = None,
                          fallback_to_while_loop: bool = True,
                          unconnected_gradients: str | tf.UnconnectedGradients = "zero"
                          ) -> Any:
    """Gradients of ``loss_fn(example)`` for each example of ``batch``, kept separate.

    Args:
      loss_fn: maps one example (``batch`` with its leading axis indexed away; a tuple/dict
        structure is kept) to a scalar loss.
      variables: the variables (or tensors) to differentiate with respect to: one, or any
        nested structure of them (as ``tape.gradient`` takes them).
      batch: a tensor or nested structure of tensors with a common leading batch size ``b``.
      unconnected_gradients: ``"zero"`` (default): zeros for a variable the loss does not
        depend on; ``"none"``: ``None`` there, as ``tape.gradient`` gives.

    Returns:
      The structure of ``variables`` with one tensor ``[b, *v.shape]`` per variable ``v``.

    Example:
      >>> import tensorflow as tf
      >>> w = tf.Variable([1.0, 2.0])
      >>> g = per_example_gradients(lambda x: tf.reduce_sum(w * x), [w], tf.ones([5, 2]))
      >>> g[0].shape.as_list()
      [5, 2]
      >>> per_example_gradients(lambda x: tf.reduce_sum(w * x), w, tf.ones([5, 2])).shape
      TensorShape([5, 2])
    """
    unconnected = _check_unconnected(unconnected_gradients)
    flat_vars = _tf_sources(variables)
    if not flat_vars:
        raise ValueError("per_example_gradients needs at least one variable")
    leaves = tf.nest.flatten(batch)
    if not leaves:
        raise ValueError("per_example_gradients needs a non-empty batch")
    wanted = [k for k, v in enumerate(flat_vars) if _differentiable(v, "per_example_gradients")]

    def run():
        n = tf.shape(leaves[0])[0]
        chosen = [flat_vars[k] for k in wanted]
        connected: list[bool] = []

        def loop_fn(i):
            example = tf.nest.map_structure(lambda t: tf.gather(t, i), batch)
            with tf.GradientTape() as tape:
                for v in chosen:
                    tape.watch(v)
                loss = loss_fn(example)
            grads = tape.gradient(loss, chosen)
            connected[:] = [g is not None for g in grads]
            return _zeros_for_none(grads, chosen)

        spec = [_spec(tf.convert_to_tensor(v)) for v in chosen]
        rows = _parallel_map(loop_fn, n, spec, use_pfor=use_pfor,
                             parallel_iterations=parallel_iterations,
                             fallback_to_while_loop=fallback_to_while_loop) if chosen else []
        _check_traced(connected, rows)
        out = [None] * len(flat_vars)
        for k, r, c in zip(wanted, rows, connected):
            out[k] = r if c or unconnected == "zero" else None
        return tf.nest.pack_sequence_as(variables, out)
    return _graph_mode(run)

# }}}
