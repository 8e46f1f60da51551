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


def _zeros_for_none(grads: Sequence[Any], sources: Sequence[Any]) -> list[tf.Tensor]:
    return [tf.zeros_like(s) if g is None else tf.convert_to_tensor(g)
            for g, s in zip(grads, sources)]


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
             fallback_to_while_loop: bool = True) -> Any:
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
      parallel_iterations: passed to pfor's fallback loops / the while_loop.
      fallback_to_while_loop: allow pfor's counted per-op fallback (False: raise instead).

    Returns:
      For each source ``x``, a tensor of shape ``y.shape + x.shape`` (same structure as
      ``sources``); sources ``y`` does not depend on give zeros.

    Example:
      >>> import tensorflow as tf
      >>> x = tf.constant([1.0, 2.0, 3.0])
      >>> jacobian(lambda x: tf.reduce_sum(x) * x, x, mode="forward").shape.as_list()
      [3, 3]
    """
    _check_mode(mode)
    opts = dict(use_pfor=use_pfor, parallel_iterations=parallel_iterations,
                fallback_to_while_loop=fallback_to_while_loop)
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
    """``g(cotangent, sources) -> grads`` via the tape, or ``tf.gradients`` in a graph."""
    if tape is not None:
        return lambda ct, flat: tape.gradient(
            target, flat, output_gradients=ct,
            unconnected_gradients=tf.UnconnectedGradients.ZERO)
    if tf.executing_eagerly():
        raise ValueError("jacobian of a computed tensor in eager mode needs tape=...; or pass "
                         "a function: tfx_vec.jacobian(f, x)")
    return lambda ct, flat: tf.gradients(target, flat, grad_ys=ct,
                                         unconnected_gradients="zero")


def _reverse_jacobian(target, sources, tape, *, use_pfor, parallel_iterations,
                      fallback_to_while_loop):
    target = tf.convert_to_tensor(target)
    flat = tf.nest.flatten(sources)
    grad = _gradient_fn(target, tape)
    y_shape = tf.shape(target)
    m = tf.size(target)

    def loop_fn(i):
        ct = tf.reshape(tf.one_hot(i, m, dtype=target.dtype), y_shape)
        return _zeros_for_none(grad(ct, flat), flat)

    rows = _parallel_map(loop_fn, m, [_spec(s) for s in flat], use_pfor=use_pfor,
                         parallel_iterations=parallel_iterations,
                         fallback_to_while_loop=fallback_to_while_loop)
    out = [_unflatten_rows(r, target, s) for r, s in zip(rows, flat)]
    return tf.nest.pack_sequence_as(sources, out)


def _unflatten_rows(rows: tf.Tensor, target: tf.Tensor, source) -> tf.Tensor:
    """``[y.size, *x.shape] -> [*y.shape, *x.shape]`` keeping static shapes."""
    out = tf.reshape(rows, tf.concat([tf.shape(target), tf.shape(source)], 0))
    out.set_shape(target.shape.concatenate(source.shape))
    return out


def _forward_jacobian(f, sources, *, use_pfor, parallel_iterations, fallback_to_while_loop):
    sources = tf.nest.map_structure(_as_source, sources)
    primals = tf.nest.flatten(sources)
    flat = [tf.convert_to_tensor(s) for s in primals]
    sizes = [tf.size(s) for s in flat]
    total = tf.add_n(sizes) if len(sizes) > 1 else sizes[0]
    offsets = tf.cumsum(tf.stack(sizes), exclusive=True)

    def loop_fn(j):
        tangents = []
        for k, s in enumerate(flat):
            hot = tf.one_hot(j - offsets[k], sizes[k], dtype=s.dtype)
            tangents.append(tf.reshape(hot, tf.shape(s)))
        with tf.autodiff.ForwardAccumulator(primals, tangents) as acc:
            y = _call(f, sources)
        return acc.jvp(y, unconnected_gradients=tf.UnconnectedGradients.ZERO)

    y_spec = _spec(_call(f, sources))  # one plain forward pass, for the output's shape
    cols = _parallel_map(loop_fn, total, y_spec, use_pfor=use_pfor,
                         parallel_iterations=parallel_iterations,
                         fallback_to_while_loop=fallback_to_while_loop)  # [x.size, *y]
    y_shape = tf.shape(cols)[1:]
    y_rank = tf.size(y_shape)
    out, start = [], 0
    for k, s in enumerate(flat):
        block = cols[start:start + sizes[k]] if len(flat) > 1 else cols  # [x.size, *y]
        start += sizes[k]
        perm = tf.concat([tf.range(1, y_rank + 1), [0]], 0)
        moved = tf.transpose(block, perm)  # [*y, x.size]
        res = tf.reshape(moved, tf.concat([y_shape, tf.shape(s)], 0))
        res.set_shape(y_spec.shape.concatenate(s.shape))
        out.append(res)
    return tf.nest.pack_sequence_as(sources, out)

# }}}


# {{{ batch_jacobian, hessian

@_library_code
def batch_jacobian(f_or_target: Callable[[tf.Tensor], tf.Tensor] | tf.Tensor, source, *,
                   tape: tf.GradientTape | None = None, use_pfor: bool = True,
                   parallel_iterations: int | None = None,
                   fallback_to_while_loop: bool = True) -> tf.Tensor:
    """Per-row jacobians ``[b, *y.shape[1:], *x.shape[1:]]`` of ``y = f(x)`` (``x: [b, ...]``).

    Row ``k`` of ``y`` must depend on row ``k`` of ``x`` only (as in
    ``tf.GradientTape.batch_jacobian``); the loop runs over the ``prod(y.shape[1:])``
    per-example output elements, each iteration back-propagating a one-hot cotangent in every
    batch row at once.

    Example:
      >>> import tensorflow as tf
      >>> x = tf.ones([4, 3])
      >>> batch_jacobian(lambda x: x * 2.0, x).shape.as_list()
      [4, 3, 3]
    """
    opts = dict(use_pfor=use_pfor, parallel_iterations=parallel_iterations,
                fallback_to_while_loop=fallback_to_while_loop)
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


def _batch_jacobian(target, source, tape, **opts):
    target = tf.convert_to_tensor(target)
    grad = _gradient_fn(target, tape)
    y_shape = tf.shape(target)
    b = y_shape[0]
    m = tf.size(target) // tf.maximum(b, 1)

    def loop_fn(j):
        ct = tf.tile(tf.one_hot(j, m, dtype=target.dtype)[None, :], tf.stack([b, 1]))
        return _zeros_for_none(grad(tf.reshape(ct, y_shape), [source]), [source])[0]

    x = tf.convert_to_tensor(source)
    cols = _parallel_map(loop_fn, m, _spec(x), **opts)  # [m, b, *x[1:]]
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

    def run():
        inner = lambda v: _function_jacobian(f, v, **opts)  # noqa: E731
        return _function_jacobian(inner, _as_source(x), **opts)
    return _graph_mode(run)

# }}}


# {{{ per-example gradients

@_library_code
def per_example_gradients(loss_fn: Callable[[Any], tf.Tensor], variables: Sequence[tf.Variable],
                          batch: Any, *, use_pfor: bool = True,
                          parallel_iterations: int | None = None,
                          fallback_to_while_loop: bool = True) -> list[tf.Tensor]:
    """Gradients of ``loss_fn(example)`` for each example of ``batch``, kept separate.

    Args:
      loss_fn: maps one example (``batch`` with its leading axis indexed away; a tuple/dict
        structure is kept) to a scalar loss.
      variables: the variables (or tensors) to differentiate with respect to.
      batch: a tensor or nested structure of tensors with a common leading batch size ``b``.

    Returns:
      One tensor ``[b, *v.shape]`` per variable ``v`` (zeros where the loss does not depend
      on it).

    Example:
      >>> import tensorflow as tf
      >>> w = tf.Variable([1.0, 2.0])
      >>> g = per_example_gradients(lambda x: tf.reduce_sum(w * x), [w], tf.ones([5, 2]))
      >>> g[0].shape.as_list()
      [5, 2]
    """
    variables = list(variables)
    leaves = tf.nest.flatten(batch)
    if not leaves:
        raise ValueError("per_example_gradients needs a non-empty batch")

    def run():
        n = tf.shape(leaves[0])[0]

        def loop_fn(i):
            example = tf.nest.map_structure(lambda t: tf.gather(t, i), batch)
            with tf.GradientTape() as tape:
                for v in variables:
                    tape.watch(v)
                loss = loss_fn(example)
            return _zeros_for_none(tape.gradient(loss, variables), variables)

        spec = [_spec(tf.convert_to_tensor(v)) for v in variables]
        return _parallel_map(loop_fn, n, spec, use_pfor=use_pfor,
                             parallel_iterations=parallel_iterations,
                             fallback_to_while_loop=fallback_to_while_loop)
    return _graph_mode(run)

# }}}
