"""The pfor test oracle: run ``loop_fn`` once per iteration, stack, compare with pfor.

``check_pfor(loop_fn, iters)`` compares every output element of
``tfx_vec.pfor(loop_fn, iters, fallback_to_while_loop=False)`` with the per-iteration
reference, in the modes listed in ``modes`` (default: all of them):

- ``"eager"``: called eagerly;
- ``"function"``: inside a ``tf.function`` with ``iters`` a Python int;
- ``"dynamic"``: inside a ``tf.function`` with ``iters`` a run-time int32 tensor;
- ``"one"``: with ``iters == 1``;
- ``"chunked"``: through ``vectorized_map(loop_fn, tf.range(iters), chunk_size=2)``;
- ``"xla"``: inside a ``tf.function(jit_compile=True)`` (not in ``ALL_MODES``: compiling is
  slow; tests of XLA-specific formulations ask for it).

``check_op(op, arrays)`` enumerates every stacked/invariant combination of an op's inputs
(never all invariant): a stacked input is ``tf.gather(per_iteration_stack, i)``, an invariant
one a closed-over constant.  ``modes="rotate"`` picks the eager mode plus, every second
time, one other mode chosen by a running counter, for the first combination (the others run
eagerly), so that a long table covers every mode cheaply.

Example:
    >>> import tensorflow as tf
    >>> check_pfor(lambda i: tf.cast(i, tf.float32) * 2.0, 3)
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

import numpy as np
import pytest
import tensorflow as tf

import tfx_vec

ALL_MODES = ("eager", "function", "dynamic", "one", "chunked")
_ROTATION = ("function", None, "dynamic", None, "one", None, "chunked", None)
_rotation = itertools.count()


def reference(loop_fn: Callable, iters: int) -> Any:
    """Run ``loop_fn(i)`` eagerly for each ``i`` and stack each output (NumPy)."""
    outs = [loop_fn(tf.constant(i, tf.int32)) for i in range(iters)]
    return tf.nest.map_structure(lambda *xs: np.stack([np.asarray(x) for x in xs]), *outs)


def _run(mode: str, loop_fn: Callable, iters: int, **kw) -> Any:
    kw = dict(kw)
    fallback = kw.pop("fallback_to_while_loop", False)
    kw["fallback_to_while_loop"] = fallback
    if mode == "eager":
        return tfx_vec.pfor(loop_fn, iters, **kw)
    if mode == "function":
        return tf.function(lambda: tfx_vec.pfor(loop_fn, iters, **kw))()
    if mode == "dynamic":
        fn = tf.function(lambda n: tfx_vec.pfor(loop_fn, n, **kw))
        return fn(tf.constant(iters, tf.int32))
    if mode == "one":
        return tfx_vec.pfor(loop_fn, 1, **kw)
    if mode == "xla":
        return tf.function(lambda: tfx_vec.pfor(loop_fn, iters, **kw), jit_compile=True)()
    if mode == "chunked":
        return tfx_vec.vectorized_map(loop_fn, tf.range(iters), chunk_size=2,
                                      **kw)
    raise ValueError(f"unknown mode {mode!r}")


def assert_all_close(actual: Any, expected: Any, rtol: float, atol: float, what: str) -> None:
    """Same structure, shapes, dtypes and every element close."""
    tf.nest.assert_same_structure(expected, actual)
    for a, e in zip(tf.nest.flatten(actual), tf.nest.flatten(expected)):
        a = np.asarray(a)
        assert a.shape == e.shape, f"{what}: shape {a.shape} != expected {e.shape}"
        assert a.dtype == e.dtype, f"{what}: dtype {a.dtype} != expected {e.dtype}"
        if e.dtype.kind in "fc":
            np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=what)
        else:
            np.testing.assert_array_equal(a, e, err_msg=what)


def check_pfor(loop_fn: Callable, iters: int, *, rtol: float = 1e-5, atol: float = 1e-5,
               modes: Sequence[str] | str = ALL_MODES, **pfor_kwargs) -> None:
    """Assert that pfor agrees with the per-iteration reference in every mode of ``modes``."""
    if modes == "rotate":  # every other mode in turn, with eager-only turns between them
        extra = _ROTATION[next(_rotation) % len(_ROTATION)]
        modes = ("eager",) + ((extra,) if extra else ())
    expected = reference(loop_fn, iters)
    for mode in modes:
        actual = _run(mode, loop_fn, iters, **pfor_kwargs)
        exp = expected
        if mode == "one":
            exp = tf.nest.map_structure(lambda e: e[:1], expected)
        assert_all_close(actual, exp, rtol, atol, f"pfor mode={mode}")


def stacking_combinations(k: int, *, always: Sequence[int] = ()) -> list[tuple[bool, ...]]:
    """Every stacked/invariant assignment of ``k`` inputs with at least one stacked."""
    combos = [c for c in itertools.product([True, False], repeat=k) if any(c)]
    return [c for c in combos if all(c[i] for i in always)]


def check_op(op: Callable[..., Any], arrays: Sequence[np.ndarray], *, iters: int = 3,
             rng: np.random.Generator | None = None, rtol: float = 1e-5, atol: float = 1e-5,
             modes: Sequence[str] | str = "rotate",
             combos: Sequence[Sequence[bool]] | None = None,
             stacked_arrays: Sequence[np.ndarray] | None = None) -> None:
    """Check ``op(*inputs)`` under every stacked/invariant combination of its inputs.

    ``arrays[j]`` is the (per-iteration) value of input j when invariant; when stacked, the
    input is ``stacked_arrays[j][i]`` (default: ``arrays[j]`` plus ``iters-1`` random
    perturbations, so that iterations really differ).
    """
    rng = rng or np.random.default_rng(0)
    if stacked_arrays is None:
        stacked_arrays = [_perturbed_stack(a, iters, rng) for a in arrays]
    consts = [tf.constant(a) for a in arrays]
    stacks = [tf.constant(s) for s in stacked_arrays]
    for k, combo in enumerate(combos or stacking_combinations(len(arrays))):
        combo_modes = modes
        if modes == "rotate":  # every mode once per table row, the other combos eagerly
            combo_modes = "rotate" if k == 0 else ("eager",)

        def loop_fn(i, combo=combo):
            args = [tf.gather(s, i) if st else c for st, s, c in zip(combo, stacks, consts)]
            return op(*args)
        try:
            check_pfor(loop_fn, iters, rtol=rtol, atol=atol, modes=combo_modes)
        except AssertionError as e:
            raise AssertionError(f"stacked={combo}: {e}") from e


def _perturbed_stack(a: np.ndarray, iters: int, rng: np.random.Generator) -> np.ndarray:
    a = np.asarray(a)
    rows = [a]
    for _ in range(iters - 1):
        if a.dtype.kind == "b":
            rows.append(rng.random(a.shape) < 0.5)
        elif a.dtype.kind in "iu":
            rows.append(rng.permutation(a.reshape(-1)).reshape(a.shape) if a.size else a)
        else:
            rows.append((a * rng.uniform(0.5, 1.5, size=a.shape)).astype(a.dtype))
    return np.stack(rows)


def skip_unless_kernel_runs(fn, *args):
    """Skip where TensorFlow's own kernel for the per-iteration reference does not run on
    this device (CPU builds without oneDNN lack dilated and grouped convolution gradients)."""
    try:
        fn(*[tf.constant(a) for a in args])
    except tf.errors.InvalidArgumentError as e:
        if "support" not in e.message:
            raise
        pytest.skip(f"the reference kernel does not run here: {e.message[:120]}")
