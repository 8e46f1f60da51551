from tests.autobatch.passes.helpers import check_pure, function_ir
from tests.autobatch.programs import collatz, fib
from tfx_vec.autobatch.passes import liveness, lower


def test_function_ir_live_after_first_recursive_call_of_fib():
    live = check_pure(liveness, function_ir(fib)).liveness
    # Block 2: t2, t3 = n - 2, n - 1; t4 = fib(t2); t5 = fib(t3); ...: t3 (the next call's
    # argument) and t4 (this call's result) are live after the first call.
    assert live[("fib", 2, 1)] == {"_ab_t3", "_ab_t4"}
    assert live[("fib", 0)] == {"n"}


def test_loops_reach_a_fixed_point():
    live = liveness(function_ir(collatz)).liveness
    header = 1
    assert {"n", "steps"} <= live[("collatz", header)]


def test_lowered_liveness_follows_calls_and_returns():
    live = liveness(lower(function_ir(fib))).liveness
    # The callee's result is live into the continuation blocks (Return -> return address).
    assert "fib.retval_" in live[3] and "fib.retval_" in live[4]
