"""Every corpus program, every runtime, against the per-member Python reference."""
import numpy as np
import pytest
import tensorflow as tf

from tests.autobatch.programs import CASES, clamp_abs, reference
from tfx_vec.autobatch import ir

RUNTIMES = [
    ("local_static", {"runtime": "local_static"}),
    ("local_static_gather", {"runtime": "local_static", "gather": True}),
    ("numpy", {"runtime": "numpy"}),
    ("program_counter_xla", {"runtime": "program_counter", "jit_compile": True}),
]
SCHEDULERS = [
    ("earliest_graph", {"scheduler": "earliest"}),
    ("sweep_xla", {"jit_compile": True, "scheduler": "sweep"}),
    ("sweep_guarded", {"scheduler": "sweep_guarded"}),
    ("sweep_guarded_xla", {"jit_compile": True, "scheduler": "sweep_guarded"}),
    ("most_active", {"scheduler": "most_active"}),
]
# Graph-mode (non-XLA) program counter and the other schedulers on a representative subset.
SCHEDULER_CASES = [c for c in CASES if c[0] in ("ackermann", "nested_loops", "oscillate",
                                                 "sum_and_depth")]


def _assert_same(got, want):
    tf.nest.assert_same_structure(got, want)
    for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("runtime,opts", RUNTIMES, ids=[r for r, _ in RUNTIMES])
@pytest.mark.parametrize("name,fn,make", CASES, ids=[c[0] for c in CASES])
def test_matches_per_member_reference(name, fn, make, runtime, opts):
    args = make(np.random.default_rng(len(name)), 7)
    _assert_same(fn(*args, **opts), reference(fn, *args))


@pytest.mark.parametrize("scheduler,opts", SCHEDULERS, ids=[r for r, _ in SCHEDULERS])
@pytest.mark.parametrize("name,fn,make", SCHEDULER_CASES, ids=[c[0] for c in SCHEDULER_CASES])
def test_block_schedulers_match_reference(name, fn, make, scheduler, opts):
    args = make(np.random.default_rng(len(name)), 7)
    _assert_same(fn(*args, **opts), reference(fn, *args))


def test_non_recursive_program_has_no_stacks():
    low = clamp_abs.lowered()
    assert ir.STACK not in low.allocation.values()
    assert not any(isinstance(op, (ir.Push, ir.Pop)) for b in low.blocks for op in b.ops)
