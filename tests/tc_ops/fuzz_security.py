"""Fuzzing tc_ops' untrusted inputs; run as a script (``test_security_fuzz.py`` runs it in a
subprocess, so that a crash is a failure, not the end of the test run).

Two campaigns, under hypothesis:

- ``attributes``: a raw ``TcKernel`` op with arbitrary attributes (TC text: corpus programs,
  mutated ones, random text; entry names; options and scalars JSON; dtypes; declared input and
  output shapes) on arbitrary inputs.  It may succeed or raise TensorFlow's own errors (an
  ``OpError``, or TF's ``TypeError``/``ValueError`` for a malformed attribute); nothing else.
- ``sources``: TC sources (random programs, mutated corpus programs, random text) through
  ``tc.define`` and called on inputs fitting their signatures with random sizes, eagerly and as
  the TF op.  Only ``TcError`` may escape; where both succeed they agree.

Usage: ``python -m tests.tc_ops.fuzz_security [attributes|sources] EXAMPLES``; prints
``fuzz-ok <campaign> <counts>`` and exits 0, or prints the failing example and exits 1.
"""
from __future__ import annotations

import collections
import json
import re
import sys
import traceback

import numpy as np
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.tc_ops.corpus import CASES
from tests.tc_ops.test_cpu_random import programs
from tfx_vec import tc_ops as tc
from tfx_vec.tc_ops import tf_op
from tfx_vec.tc_ops.lang.types import np_dtype

OUTCOMES: collections.Counter = collections.Counter()
_TOKENS = ["(", ")", ",", "i", "A", "+=", "=", "0", "-1", "where", "x", "float", "#", "N", "?",
           ":", "int32", "65536", "*", "/", "2147483647", "-2147483648", "in", "0:3", "k"]
_TEXT = st.sampled_from(list("abcABC019_ (){},:?.+-*/%<>=!#\n\t") +
                        ["def", "where", "in", "float", "int32", "->", "+=!", "max=", "min=!",
                         "exp", " f(", "A(i)", "1.5f", "__attribute__", "system", "\\", '"'])


@st.composite
def mutated(draw, source: str) -> str:
    toks = re.findall(r"\w+|\S|\s+", source)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, max(0, len(toks) - 1)))
        op = draw(st.sampled_from(["del", "dup", "swap", "replace"]))
        if not toks:
            break
        if op == "del":
            toks.pop(i)
        elif op == "dup":
            toks.insert(i, toks[i])
        elif op == "swap" and i + 1 < len(toks):
            toks[i], toks[i + 1] = toks[i + 1], toks[i]
        else:
            toks[i] = draw(st.sampled_from(_TOKENS))
    return "".join(toks)


def _tc_sources():
    corpus = st.sampled_from([c.source for c in CASES])
    return st.one_of(corpus, corpus.flatmap(mutated), programs().map(lambda p: p[0]),
                     st.lists(_TEXT, max_size=30).map("".join))


def _inputs(cdef, rng: np.random.Generator) -> list[np.ndarray]:
    """Inputs fitting the signature of ``cdef``: random sizes (0 included), random values, ids
    partly out of range."""
    sizes: dict = {}
    out = []
    for p in cdef.inputs:
        dtype = np_dtype(p.dtype)
        if p.is_scalar:
            out.append(np.array(rng.integers(0, 4), dtype))
            continue
        shape = tuple(d if isinstance(d, int) else sizes.setdefault(d, int(rng.integers(0, 6)))
                      for d in p.dims)
        if dtype.kind in "iu":
            out.append(rng.integers(-2, 8, size=shape).astype(dtype))
        elif dtype.kind == "b":
            out.append(rng.random(shape) < 0.5)
        else:
            out.append(rng.uniform(-2, 2, size=shape).astype(dtype))
    return out


def _note(kind: str) -> None:
    OUTCOMES[kind] += 1


# -- campaign 1: the op's attributes ----------------------------------------------------------
_DTYPES = [tf.float32, tf.float64, tf.int32, tf.int64, tf.bool, tf.float16]


_ATTRS = ["inputs", "tc", "entry", "options", "scalars", "input_shapes", "output_shapes",
          "Tout"]


@st.composite
def op_calls(draw):
    """A legitimate call of a corpus TC with one to three of its attributes (or its inputs)
    replaced by arbitrary values."""
    case = draw(st.sampled_from(CASES))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    inputs = [tf.constant(x) for x in case.inputs(rng)]
    cdef = tc.define(case.source)[case.entry].cdef
    call = dict(inputs=inputs, tc=case.source, entry=case.entry, options="", scalars="{}",
                input_shapes=[x.shape.as_list() for x in inputs],
                output_shapes=[[None] * cdef.tensors[n].rank for n in cdef.outputs],
                Tout=[tf.as_dtype(np_dtype(cdef.tensors[n].dtype)) for n in cdef.outputs])
    if cdef.structural_scalars:
        call["scalars"] = json.dumps({n: int(x) for p, x in zip(cdef.inputs, inputs)
                                      for n in [p.name] if n in cdef.structural_scalars})

    def shape(actual=None):
        """Mostly the actual shape with some dimensions unknown; else anything."""
        partial = st.just(None) if actual is None else st.tuples(
            *[st.sampled_from([d, None]) for d in actual]).map(list)
        return draw(st.one_of(partial, partial, partial, st.none(), st.lists(
            st.one_of(st.none(), st.integers(0, 2 ** 40)), max_size=3)))
    fuzzed = draw(st.lists(st.sampled_from(_ATTRS), min_size=1, max_size=3, unique=True))
    for name in fuzzed:
        if name == "inputs":
            call["inputs"] = [tf.zeros(draw(st.lists(st.integers(0, 4), max_size=3)),
                                       draw(st.sampled_from(_DTYPES)))
                              for _ in range(draw(st.integers(0, 4)))]
            call["input_shapes"] = [x.shape.as_list() for x in call["inputs"]]
        elif name == "tc":
            call["tc"] = draw(st.one_of(mutated(case.source), _tc_sources()))
        elif name == "entry":
            call["entry"] = draw(st.one_of(st.text(max_size=12), st.sampled_from(
                ["../../etc/x", "a; touch x", "", "tc_" * 40, "main", "system"])))
        elif name == "options":
            call["options"] = draw(st.one_of(
                st.dictionaries(st.sampled_from(["tile", "unroll", "block", "map_to_threads",
                                                 "parallel", "bogus"]),
                                st.one_of(st.integers(-2, 2 ** 62), st.text(max_size=4),
                                          st.booleans(),
                                          st.lists(st.integers(-1, 2 ** 40), max_size=4)),
                                max_size=3).map(json.dumps),
                st.text(max_size=10)))
        elif name == "scalars":
            call["scalars"] = draw(st.one_of(st.text(max_size=8), st.dictionaries(
                st.sampled_from(["k", "N", "x"]), st.integers(-2 ** 40, 2 ** 40)).map(json.dumps)))
        elif name == "input_shapes":
            call["input_shapes"] = [shape(x.shape.as_list()) for x in call["inputs"]]
        elif name == "output_shapes":
            call["output_shapes"] = [shape() for _ in call["Tout"]]
        else:
            call["Tout"] = [draw(st.sampled_from(_DTYPES)) for _ in range(draw(st.integers(1, 3)))]
            call["output_shapes"] = [None] * len(call["Tout"])
    return call


def campaign_attributes(examples: int) -> None:
    lib = tf_op.load_op_library()

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(op_calls())
    def run(call):
        try:
            lib.tc_kernel(**call)
            _note("ran")
        except tf.errors.OpError as e:
            _note(type(e).__name__)
        except (TypeError, ValueError) as e:   # TF's own checks of attribute values
            _note(f"TF {type(e).__name__}")
    run()


# -- campaign 2: TC sources -------------------------------------------------------------------
def campaign_sources(examples: int) -> None:
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(_tc_sources(), st.integers(0, 2 ** 16))
    def run(source, seed):
        try:
            module = tc.define(source)
        except tc.TcError:
            _note("define: TcError")
            return
        for entry in module:
            args = _inputs(entry.cdef, np.random.default_rng(seed))
            eager = _outcome(lambda: entry(*args), "eager")
            graph = _outcome(lambda: tf_op.kernel_op(args, tc=source, entry=entry.name),
                             "op")
            if eager is not None and graph is not None:
                eager = eager if isinstance(eager, tuple) else (eager,)
                for a, b in zip(eager, graph):
                    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5,
                                               atol=1e-5, err_msg=source)
    run()


def _outcome(call, where: str):
    try:
        out = call()
        _note(f"{where}: ran")
        return out
    except tc.TcError as e:
        _note(f"{where}: {type(e).__name__}" + (" (internal)" if "internal error" in str(e)
                                                else ""))
    except tf.errors.OpError as e:
        _note(f"{where}: {type(e).__name__}")
    return None


def main(argv: list[str]) -> int:
    campaign, examples = argv[0], int(argv[1])
    try:
        {"attributes": campaign_attributes, "sources": campaign_sources}[campaign](examples)
    except Exception:  # noqa: BLE001 - the failing example is in the traceback
        traceback.print_exc()
        print(f"fuzz-failed {campaign} {dict(OUTCOMES)}")
        return 1
    print(f"fuzz-ok {campaign} {dict(sorted(OUTCOMES.items()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
