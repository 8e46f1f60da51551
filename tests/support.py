"""Shared test helpers.

``require(ok, what)`` skips a test whose optional component (nvcc, PoCL, a C compiler) is
missing, except under ``TFX_VEC_REQUIRE_ALL=1`` (set by CI), where the test fails instead, so a
run cannot go green by skipping.
"""
import os
import shutil

import numpy as np
import pytest

REQUIRE_ALL = os.environ.get("TFX_VEC_REQUIRE_ALL", "") not in ("", "0")


def require(ok: bool, what: str) -> None:
    """Skip (or under TFX_VEC_REQUIRE_ALL=1 fail) when ``ok`` is false."""
    if ok:
        return
    if REQUIRE_ALL:
        pytest.fail(f"required component missing: {what} (TFX_VEC_REQUIRE_ALL=1)")
    pytest.skip(f"optional component missing: {what}")


def require_tool(name: str) -> str:
    """Return the path of an executable on PATH, or skip/fail as ``require`` does."""
    path = shutil.which(name)
    require(path is not None, f"`{name}` on PATH")
    return path


def random_array(rng: np.random.Generator, shape, dtype=np.float32, low=-2.0, high=2.0):
    """Random values with no zeros (so a kernel that writes zeros cannot pass by accident)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else int(low) - 1
        a = rng.integers(lo, int(high) + 2, size=shape).astype(dtype)
        a[a == 0] = 1
        return a
    a = rng.uniform(low, high, size=shape).astype(dtype)
    a[np.abs(a) < 1e-3] = 0.5
    return a


def square_loss_and_grad(call):
    """A tf.function of (A, B) -> (C, d(sum C^2)/dA) with C = call(A, B): the graph the TC
    gradient tests trace (forward op and backward op in one function)."""
    import tensorflow as tf

    @tf.function(autograph=False)
    def loss_and_grad(A, B):
        with tf.GradientTape() as tape:
            tape.watch(A)
            C = call(A, B)
            loss = tf.reduce_sum(C * C)
        return C, tape.gradient(loss, A)
    return loss_and_grad


def eager_then_lazy(run):
    """``run(False)`` eagerly, then ``run(True)`` inside ``lazy.device()`` with fresh metrics:
    (eager result, lazy result, ``lazy.metrics()``)."""
    from tfx_vec import lazy
    eager = run(False)
    lazy.reset_metrics()
    with lazy.device():
        lazy_result = run(True)
    return eager, lazy_result, lazy.metrics()
