"""Program-counter runtime (Algorithm 2): eager (cached tf.function), in tf.function, under XLA."""
import numpy as np
import pytest
import tensorflow as tf

from tests.autobatch.programs import collatz, fib, reference
from tfx_vec import autobatch as ab
from tfx_vec.autobatch.program_counter import _Traced


@pytest.mark.parametrize("jit", [False, True])
def test_fib(jit):
    x = tf.constant([3, 7, 4, 5, 0, 1])
    np.testing.assert_array_equal(fib(x, jit_compile=jit).numpy(), reference(fib, x))


def test_fib_inside_user_tf_function_and_xla():
    x = tf.constant([6, 2, 1, 8])
    want = reference(fib, x)
    np.testing.assert_array_equal(tf.function(lambda a: fib(a))(x).numpy(), want)
    np.testing.assert_array_equal(tf.function(lambda a: fib(a), jit_compile=True)(x).numpy(),
                                  want)


XLA_VARIANTS = [{}, {"jit_compile": True}, {"jit_compile": True, "scheduler": "sweep_guarded"}]


@pytest.mark.parametrize("opts", XLA_VARIANTS, ids=["graph", "xla", "xla_sweep_guarded"])
def test_stack_overflow_is_an_error_naming_members(opts):
    with pytest.raises(ab.StackOverflowError, match=r"members \[1\]"):
        fib(tf.constant([3, 40]), max_stack_depth=5, **opts)


@pytest.mark.parametrize("opts", XLA_VARIANTS + [{"scheduler": "sweep"}],
                         ids=["graph", "xla", "xla_sweep_guarded", "sweep"])
def test_stack_depth_boundary_matches_the_numpy_reference(opts):
    # The runtime checks overflow on the program-counter push only (a caller-saved variable's
    # stack never holds more frames): the deepest member must fit at exactly the depth the
    # NumPy machine (which checks every push) needs, and overflow one below it, alone.
    x = tf.constant([9, 3, 6, 1])
    depth = next(d for d in range(1, 20) if _fits(lambda: fib(x, runtime="numpy",
                                                             max_stack_depth=d)))
    np.testing.assert_array_equal(fib(x, max_stack_depth=depth, **opts), reference(fib, x))
    with pytest.raises(ab.StackOverflowError, match=r"members \[0\]"):
        fib(x, max_stack_depth=depth - 1, **opts)
    with pytest.raises(ab.StackOverflowError, match=r"members \[0\]"):
        fib(x, runtime="numpy", max_stack_depth=depth - 1)


def _fits(run):
    try:
        run()
        return True
    except ab.StackOverflowError:
        return False


def test_stack_overflow_in_graph_is_an_assertion():
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_stack_depth"):
        tf.function(lambda a: fib(a, max_stack_depth=4))(tf.constant([2, 30]))


def test_asserts_are_built_only_where_they_run():
    """A graph checks overflow with asserts; XLA would drop them, so under XLA none are built
    (the eager ``jit_compile=True`` call checks the returned flags instead, above)."""
    x = tf.constant([2, 5])
    for jit in (False, True):
        graph = tf.function(lambda a: fib(a), jit_compile=jit).get_concrete_function(x).graph
        asserts = [op for op in graph.get_operations() if "Assert" in op.name]
        assert bool(asserts) != jit, (jit, [op.name for op in asserts])


@pytest.mark.parametrize("opts", XLA_VARIANTS, ids=["graph", "xla", "xla_sweep_guarded"])
def test_max_steps_is_an_error_naming_members(opts):
    with pytest.raises(ab.MaxStepsExceededError, match=r"members \[1\]"):
        fib(tf.constant([3, 20]), max_steps=50, **opts)


@pytest.mark.parametrize("scheduler", ["earliest", "sweep"])
def test_utilization_counters(scheduler):
    x = tf.constant([3, 7, 4, 5, 0, 1])
    fib(x, scheduler=scheduler, utilization=True)
    st = fib.last_status
    runs, members = st.block_runs.numpy(), st.block_members.numpy()
    # Block 1 is the base case: it runs once per leaf of every member's call tree.
    leaves = reference(fib, x).sum()
    assert members[1] == leaves
    assert (runs <= st.steps.numpy()).all() and (members >= runs).all() and runs[0] > 0


@pytest.mark.parametrize("scheduler", ["earliest", "sweep", "sweep_guarded"])
def test_an_entry_nothing_returns_to_runs_once_before_the_loop(scheduler):
    # collatz's entry (steps = 0, first loop test) is reached only at the start: it runs once,
    # for every member, outside the loop; fib's entry is a call target and stays in the loop.
    n = tf.constant(np.random.default_rng(11).integers(1, 40, size=9), tf.int32)
    np.testing.assert_array_equal(collatz(n, scheduler=scheduler, utilization=True),
                                  reference(collatz, n))
    st = collatz.last_status
    entry = collatz._compiled[next(k for k, v in collatz._compiled.items()
                                   if isinstance(v, tuple))][1].entries["collatz"]
    assert st.block_runs.numpy()[entry] == 1 and st.block_members.numpy()[entry] == 9
    fib(tf.constant([3, 5]), scheduler=scheduler, utilization=True)
    assert fib.last_status.block_runs.numpy()[fib.lowered().entries["fib"]] > 1


def test_eager_calls_reuse_one_trace_per_signature():
    def traces():
        return [f.concrete for f in fib._compiled.values() if isinstance(f, _Traced)]
    fib(tf.constant([3, 4, 1]), jit_compile=True)
    first = traces()
    for values in ([5, 6, 2], [1, 1, 9]):
        fib(tf.constant(values), jit_compile=True)
    assert first and [id(f) for f in traces()] == [id(f) for f in first]
    fib(tf.constant([3, 4]), jit_compile=True)  # a new shape: one more trace
    assert len(traces()) == len(first) + 1


def test_stack_write_strategy_follows_xla_context():
    # Under XLA stack writes are unconditional scatters, in a TF graph tf.cond-guarded: both
    # must agree with the per-member reference, whichever of them decides.
    from tfx_vec.autobatch.program_counter import _in_xla_context
    seen = {}

    def probe(key, a):
        seen[key] = _in_xla_context()
        return fib(a, scheduler="earliest")
    x = tf.constant([9, 2, 6, 1, 7])
    for key, jit in (("graph", False), ("xla", True)):
        got = tf.function(lambda a, key=key: probe(key, a), jit_compile=jit)(x)
        np.testing.assert_array_equal(got.numpy(), reference(fib, x))
    assert seen == {"graph": False, "xla": True} and not _in_xla_context()


def test_sweep_guarded_guards_only_blocks_that_write_stacks_or_touch_wide_values():
    from tfx_vec.autobatch.program_counter import _Machine
    from tfx_vec.autobatch.types import infer_types, qualified_types, spec_of
    x = tf.constant([4, 1, 6])
    types = qualified_types(infer_types(fib.program(), (spec_of(x),)))
    machine = _Machine(fib.lowered(), types, 8)
    pushes = [i for i, b in enumerate(fib.lowered().blocks)
              if any(type(op).__name__ == "Push" for op in b.ops)]
    guarded = [i for i in range(len(fib.lowered().blocks)) if machine.worth_guarding(i)]
    assert pushes and guarded == pushes  # fib's values are all [B] scalars
    np.testing.assert_array_equal(fib(x, scheduler="sweep_guarded", jit_compile=True).numpy(),
                                  reference(fib, x))


_W = tf.constant(np.random.default_rng(5).normal(size=(3, 3)).astype(np.float32))


@ab.function
def damped_matmul(x, n):
    while n > 0:
        x = 0.5 * tf.linalg.matvec(_W, x, transpose_a=True)  # a dot in a guarded block
        n -= 1
    return x


def test_blocks_running_a_dot_under_xla_match_the_reference():
    x = tf.constant(np.random.default_rng(6).normal(size=(5, 3)).astype(np.float32))
    n = tf.constant([0, 1, 2, 3, 1])
    for opts in ({"jit_compile": True}, {"jit_compile": True, "scheduler": "sweep_guarded"}):
        np.testing.assert_allclose(damped_matmul(x, n, **opts).numpy(),
                                   reference(damped_matmul, x, n), rtol=1e-5, atol=1e-6)


@ab.function(max_stack_depth=32)
def sum_of_fibs(n, stop):
    """Main is a loop (its counter ``i`` is what a pause looks at) around a recursive call
    whose depth differs per member, so members reach a given ``i`` at different times."""
    i = tf.zeros_like(n)
    total = tf.zeros_like(n)
    while i < n:
        total = total + fib(i + n)
        i = i + 1
    return total


def _sum_of_fibs(n):
    return [sum(int(reference(fib, tf.constant([k + m]))[0]) for k in range(m)) for m in n]


@pytest.mark.parametrize("opts", XLA_VARIANTS, ids=["graph", "xla", "xla_sweep_guarded"])
def test_a_paused_machine_resumes_where_it_stopped(opts):
    """call_resumable stops as soon as every member's ``i`` reaches ``stop`` — the faster
    members then stand somewhere inside fib's recursion, stacks half full — and the next call
    goes on from that machine: the results are those of one uninterrupted run.  Members that
    have returned start over from the next call's arguments."""
    from tfx_vec.autobatch import program_counter as pc
    opts = dict(sum_of_fibs.options, **opts)
    n = tf.constant([7, 3, 9, 5, 8])  # fib up to 17: stacks 16 deep
    want = _sum_of_fibs(n.numpy())
    until = lambda regs: tf.reduce_all(regs["i"] >= regs["stop"])
    machine = pc.idle_machine(sum_of_fibs, (n, n), opts)
    stops = [2, 4, 6, 9]
    paused_inside = 0
    for stop in stops:
        args = (n, tf.fill([5], stop))
        result, regs, machine = pc.call_resumable(sum_of_fibs, args, opts, machine, until,
                                                  refresh=("stop",))
        np.testing.assert_array_equal(regs["i"].numpy() >= np.minimum(stop, n.numpy()), True)
        paused_inside += int(np.sum(machine[0]["pc_sp"].numpy() > 1))
    np.testing.assert_array_equal(result.numpy(), want)
    assert paused_inside > 0  # some pause caught members inside the recursion
    # every member has returned: the next call starts them all over from its arguments
    m = tf.constant([4, 6, 2, 5, 1])
    result, _, _ = pc.call_resumable(sum_of_fibs, (m, m), opts, machine, until)
    np.testing.assert_array_equal(result.numpy(), _sum_of_fibs(m.numpy()))


def test_loops_skip_automatic_control_dependencies_only_for_stateless_programs():
    # Pure primitives: the machine's loops are built without TF's automatic control
    # dependencies (they only order stateful ops).  A primitive reading a variable keeps them,
    # and the variable's current value is what every call reads.
    from tfx_vec.autobatch.types import stateless
    step = tf.Variable(3)

    @ab.function
    def count_up(n):
        i = tf.zeros_like(n)
        while i < n:
            i = i + step
        return i

    x = tf.constant([4, 0, 11, 7])
    for jit in (False, True):
        step.assign(3)
        np.testing.assert_array_equal(count_up(x, jit_compile=jit).numpy(), [6, 0, 12, 9])
        step.assign(5)
        np.testing.assert_array_equal(count_up(x, jit_compile=jit).numpy(), [5, 0, 15, 10])
    fib(x, jit_compile=True)
    assert stateless(fib.program())
    assert not stateless(count_up.program())


@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_most_active_picks_the_block_most_members_wait_at(mode):
    """The ``most_active`` choice against NumPy on random program counters (halted members,
    at ``halt``, never count; ties go to the lowest block; all halted gives ``halt``)."""
    from tfx_vec.autobatch.program_counter import _most_active
    rng = np.random.default_rng(4)
    choose = _most_active if mode == "eager" else tf.function(
        _most_active, jit_compile=mode == "xla", autograph=False)
    for halt, size in [(5, 1), (5, 40), (15, 1000), (3, 7)]:
        for _ in range(5):
            pc = rng.integers(0, halt + 1, size).astype(np.int32)
            counts = np.bincount(pc, minlength=halt + 1)[:halt]
            want = int(np.argmax(counts)) if counts.max() > 0 else halt
            assert int(choose(tf.constant(pc), halt)) == want
    assert int(choose(tf.constant(np.full(6, 4, np.int32)), 4)) == 4
