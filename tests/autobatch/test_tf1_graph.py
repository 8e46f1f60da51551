"""TF1 graph mode (``tf.compat.v1`` Graph + Session): the same answers as eager, or a clear error.

In a TF1 graph ``Tensor.__eq__`` is object identity (``n % 2 == 0`` is the Python constant
``False``), so batched functions get ``==``/``!=`` with TF2's element-wise meaning from the
front end; and with ``disable_v2_behavior()`` TF1's own control flow (which cannot carry ``None``)
builds the runtime loop.
"""
import json

import numpy as np
import pytest
import tensorflow as tf

from tests.autobatch.isolated import run_python
from tests.autobatch.programs import CASES, collatz, reference
from tfx_vec import autobatch as ab


def _session_run(build):
    with tf.Graph().as_default():
        fetches = build()
        with tf.compat.v1.Session() as sess:
            return sess.run(fetches)


@pytest.mark.parametrize("scheduler", ["earliest", "sweep", "sweep_guarded", "most_active"])
def test_collatz_in_a_tf1_graph(scheduler):
    got = _session_run(lambda: collatz(tf.constant([3, 7, 4, 5]), scheduler=scheduler))
    np.testing.assert_array_equal(got, [7, 16, 2, 5])


@ab.function
def equalities(n, m):
    same = tf.cast(n == m, tf.int32) + 10 * tf.cast(n != 2, tf.int32)
    if n == 3 or m != n:
        same += 100
    return same


def test_equality_operators_are_element_wise_in_a_tf1_graph():
    n, m = np.array([3, 2, 5, 4], np.int32), np.array([3, 2, 1, 4], np.int32)
    want = reference(equalities, n, m)
    np.testing.assert_array_equal(want, [111, 1, 110, 11])
    np.testing.assert_array_equal(_session_run(lambda: equalities(n, m)), want)


def test_every_corpus_program_in_a_tf1_graph():
    cases = [(name, fn, make(np.random.default_rng(len(name)), 7)) for name, fn, make in CASES]
    got = _session_run(lambda: {name: fn(*args) for name, fn, args in cases})
    for name, fn, args in cases:
        for g, w in zip(tf.nest.flatten(got[name]), tf.nest.flatten(reference(fn, *args))):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("runtime", ["local_static", "numpy"])
def test_eager_only_runtimes_refuse_a_graph_clearly(runtime):
    with pytest.raises(ab.AutobatchError, match="runs eagerly"):
        _session_run(lambda: collatz(tf.constant([3, 7]), runtime=runtime))


_V1_SCRIPT = """
import json
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_v2_behavior()
from tests.autobatch.programs import CASES
with tf.Graph().as_default():
    fetches = {}
    for name, fn, make in CASES:
        args = make(np.random.default_rng(len(name)), 5)
        for scheduler in ("earliest", "sweep_guarded"):
            fetches[name + "/" + scheduler] = tf.nest.flatten(fn(*args, scheduler=scheduler))
    with tf.compat.v1.Session() as sess:
        out = sess.run(fetches)
print(json.dumps({k: [np.asarray(x).tolist() for x in v] for k, v in out.items()}))
"""


def test_every_corpus_program_with_tf1_behavior_and_control_flow():
    got = json.loads(run_python(_V1_SCRIPT).strip().splitlines()[-1])
    assert len(got) == 2 * len(CASES)
    for name, fn, make in CASES:
        want = tf.nest.flatten(reference(fn, *make(np.random.default_rng(len(name)), 5)))
        for scheduler in ("earliest", "sweep_guarded"):
            for g, w in zip(got[f"{name}/{scheduler}"], want):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=name)
