"""Hypothesis: random small programs (if/elif, range and while loops with break/continue, early
returns, recursion, and/or/not, per-member scalars next to a [B, 2] vector, so that block merging
moves some primitives and not others) agree with the per-member reference on every runtime;
with tests on the module's Python values too (``FLAG``, ``LIMIT``: decided when the function is
compiled, alone or inside and/or/not with batched tests)."""
import importlib.util
import itertools
import os
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.autobatch.programs import reference

VARS = ("a", "b", "c", "x")
_DIR = Path(tempfile.mkdtemp(prefix="tfx_vec_ab_"))
_COUNTER = itertools.count()


@st.composite
def _expr(draw):
    v, w = draw(st.sampled_from(VARS)), draw(st.sampled_from(VARS))
    k = draw(st.integers(1, 5))
    return draw(st.sampled_from([f"{v} + {w}", f"{v} - {w}", f"{v} + {k}", f"{v} % {k + 1}",
                                 f"{v} // 2", f"tf.minimum({v}, {w})", f"{v} * {k} - {w}"]))


@st.composite
def _static(draw):
    """A test on the module's Python values only."""
    k = draw(st.integers(0, 4))
    return draw(st.sampled_from(["FLAG", "not FLAG", f"LIMIT > {k}", f"LIMIT == {k}",
                                 f"not LIMIT < {k}", f"FLAG and LIMIT != {k}"]))


@st.composite
def _cond(draw, static=False):
    if static and draw(st.integers(0, 2)) == 0:
        s, c = draw(_static()), draw(_cond())
        return draw(st.sampled_from([s, f"{s} and {c}", f"{s} or {c}", f"{c} and {s}",
                                     f"{c} or {s}", f"not ({s}) or {c}"]))
    v, w = draw(st.sampled_from(VARS)), draw(st.sampled_from(VARS))
    cmp = draw(st.sampled_from(["<", "<=", ">", "==", "!="]))
    c = f"{v} {cmp} {w if draw(st.booleans()) else draw(st.integers(-3, 6))}"
    if draw(st.integers(0, 5)) == 0:  # a condition on the [B, 2] vector: not a scalar block
        c = f"tf.reduce_sum(v, -1) {cmp} {draw(st.integers(-3, 12))}"
    extra = draw(st.sampled_from(["", "and", "or", "not"]))
    if extra == "not":
        return f"not {c}"
    if extra:
        return f"{c} {extra} {draw(st.sampled_from(VARS))} > {draw(st.integers(-2, 4))}"
    return c


@st.composite
def _block(draw, depth, in_loop, counter, static=False):
    lines = []
    for _ in range(draw(st.integers(1, 3))):
        kinds = ["assign", "assign", "if"] + (["for", "while"] if depth < 2 else [])
        kinds += ["call", "return", "vector"] + (["break", "continue"] if in_loop else [])
        kind = draw(st.sampled_from(kinds))
        target = draw(st.sampled_from(("a", "b", "c")))
        if kind == "assign":
            lines.append(f"{target} = {draw(_expr())}")
        elif kind == "vector":  # small whole numbers in float32: every runtime computes them
            # exactly (ints grow and wrap around; cast to float unbounded they would round, and
            # XLA and TF cast an out-of-range float back to int differently)
            v, w = draw(st.sampled_from(VARS)), draw(st.sampled_from(VARS))
            lines.append(f"v = tf.floor(v * 0.5) + tf.cast(tf.stack([{v} % 64, {w} % 64], -1), "
                         "tf.float32)")
        elif kind == "call":
            lines.append(f"{target} = f(x - {draw(st.integers(1, 2))}, {draw(_expr())})")
        elif kind == "return":
            lines += [f"if {draw(_cond(static))}:", f"    return {draw(_expr())}"]
        elif kind in ("break", "continue"):
            lines += [f"if {draw(_cond(static))}:", f"    {kind}"]
        elif kind == "if":
            lines.append(f"if {draw(_cond(static))}:")
            lines += ["    " + l for l in draw(_block(depth + 1, in_loop, counter, static))]
            if draw(st.booleans()):
                lines.append(f"elif {draw(_cond(static))}:")
                lines += ["    " + l for l in draw(_block(depth + 1, in_loop, counter, static))]
            if draw(st.booleans()):
                lines.append("else:")
                lines += ["    " + l for l in draw(_block(depth + 1, in_loop, counter, static))]
        else:
            n = next(counter)
            if kind == "for":
                lines.append(f"for i{n} in range({draw(st.sampled_from(VARS))} % 4):")
            else:
                test = f"w{n} > 0"
                if static and draw(st.booleans()):  # never a static test alone: it may not end
                    test = draw(st.sampled_from([f"{draw(_static())} and {test}",
                                                 f"{test} and {draw(_static())}"]))
                lines += [f"w{n} = {draw(st.sampled_from(VARS))} % 4", f"while {test}:",
                          f"    w{n} -= 1"]
            lines += ["    " + l for l in draw(_block(depth + 1, True, counter, static))]
    return lines


@st.composite
def programs(draw, static=False):
    body = draw(_block(0, False, itertools.count(), static))
    values = [f"FLAG = {draw(st.booleans())}", f"LIMIT = {draw(st.integers(0, 4))}", ""]
    return "\n".join(
        ["import tensorflow as tf", "from tfx_vec import autobatch as ab", ""]
        + (values if static else []) + [
         "@ab.function(max_stack_depth=16)", "def f(x, y):", "    a = x + 1", "    b = y - 2",
         "    c = tf.ones_like(x) * 3", "    v = tf.cast(tf.stack([x, y], -1), tf.float32)",
         "    if x <= 0:", "        return a + b"]
        + ["    " + l for l in body]
        + ["    return a + b + c + tf.cast(tf.reduce_sum(v, -1), tf.int32)", ""])


def _load(source: str):
    path = _DIR / f"prog_{next(_COUNTER)}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.f


def _check_on_all_runtimes(source: str, seed: int) -> None:
    f = _load(source)
    rng = np.random.default_rng(seed)
    x = rng.integers(-1, 5, size=5).astype(np.int32)
    y = rng.integers(-4, 9, size=5).astype(np.int32)
    x[0], y[y == 0] = 4, 1
    want = reference(f, x, y)
    for opts in ({"runtime": "local_static"}, {"runtime": "numpy"},
                 {"runtime": "program_counter", "scheduler": "sweep"},
                 {"jit_compile": True, "scheduler": "sweep_guarded"}):
        np.testing.assert_array_equal(np.asarray(f(x, y, **opts)), want, err_msg=source)


_EXAMPLES = int(os.environ.get("AB_EXAMPLES", 3))


@settings(max_examples=_EXAMPLES)
@given(programs(), st.integers(0, 2**31 - 1))
def test_random_program_matches_reference_on_all_runtimes(source, seed):
    _check_on_all_runtimes(source, seed)


@settings(max_examples=2 * _EXAMPLES)
@given(programs(static=True), st.integers(0, 2**31 - 1))
def test_random_program_with_tests_on_module_values_matches_reference(source, seed):
    _check_on_all_runtimes(source, seed)
