"""tfx_vec under MirroredStrategy (3 logical CPUs) and MultiWorkerMirroredStrategy (2 and 3
worker processes on 127.0.0.1): every workload equals the same workload on one device.

Each strategy runs all its cases in one launch (``workloads.py``; starting TensorFlow costs
about 10 s per process on this machine); the one-device reference runs in this process.
"""
import functools
import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from tests.distribute import workloads
from tfx_vec.distribute import WorkerFailedError, replica_seed, run_local_cluster

CASES = ["pfor", "pfor_eager", "dp_fit", "dp_loop", "nuts", "tc_fit", "tc_loop"]
# Keras 3's model.fit does not run under MultiWorkerMirroredStrategy (it reduces scalar logs
# over axis 0); the DP model classes carry a fix, other models train with a custom loop.
MULTIWORKER_CASES = ["pfor", "dp_fit", "dp_loop", "nuts", "tc_loop"]
LAUNCH_TIMEOUT = 240


def _launch(tmp_path_factory, kind, workers, cases, export=False):
    out = tmp_path_factory.mktemp(kind.replace(":", ""))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if export:
        env[workloads.TC_EXPORT] = str(out / "saved")
    run_local_cluster([sys.executable, "-m", "tests.distribute.workloads", kind,
                       str(out / "r"), *cases], workers, timeout=LAUNCH_TIMEOUT,
                      tf_config=kind == "multiworker", env=env)
    results = []
    for i in range(workers):
        with open(out / f"r.{i}.json") as f:
            status = json.load(f)
        results.append((status, dict(np.load(out / f"r.{i}.npz"))))
    return out, results


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    return _launch(tmp_path_factory, "mirrored:2", 1, CASES)


@pytest.fixture(scope="module")
def multiworker(tmp_path_factory):
    return _launch(tmp_path_factory, "multiworker", 2, MULTIWORKER_CASES, export=True)


@pytest.fixture(scope="module")
def multiworker3(tmp_path_factory):
    return _launch(tmp_path_factory, "multiworker", 3, ["pfor", "dp_fit"])


@functools.lru_cache(maxsize=None)
def _reference(case):
    arrays, status = workloads.run_cases(tf.distribute.get_strategy(), [case])
    assert status[case] == "ok", status[case]
    return arrays


def _check_case(launched, case):
    _, results = launched
    ref = _reference(case)
    for worker, (status, arrays) in enumerate(results):
        assert status[case] == "ok", f"worker {worker}, case {case}:\n{status[case]}"
        names = [k for k in ref if not k.endswith("/seconds")]
        for name in names:
            np.testing.assert_allclose(arrays[name], ref[name], rtol=2e-4, atol=2e-5,
                                       err_msg=f"worker {worker}: {name}")


@pytest.mark.parametrize("case", ["pfor", "pfor_eager", "dp_fit", "dp_loop", "tc_fit", "tc_loop"])
def test_mirrored_equals_one_device(mirrored, case):
    _check_case(mirrored, case)


@pytest.mark.parametrize("case", ["pfor", "dp_fit", "dp_loop", "tc_loop"])
def test_two_workers_equal_one_device(multiworker, case):
    _check_case(multiworker, case)


@pytest.mark.parametrize("case", ["pfor", "dp_fit"])
def test_three_workers_equal_one_device(multiworker3, case):
    _check_case(multiworker3, case)


@functools.lru_cache(maxsize=None)
def _sharded_reference(name, replicas):
    """Each replica's chains sampled on one device with its replica seed, concatenated."""
    kernel = getattr(workloads, f"{name}_kernel")()
    x0 = workloads.initial_chains()
    k = workloads.CHAINS // replicas
    run = tf.function(lambda x, s: tfp.mcmc.sample_chain(
        workloads.RESULTS, x, kernel=kernel, seed=s, trace_fn=None), autograph=False)
    return np.concatenate([run(x0[r * k:(r + 1) * k], replica_seed((4, 2), r)).numpy()
                           for r in range(replicas)], axis=1)


@pytest.mark.parametrize("launch", ["mirrored", "multiworker"])
def test_sharded_chains_equal_per_replica_runs_on_one_device(launch, request):
    _, results = request.getfixturevalue(launch)
    for worker, (status, arrays) in enumerate(results):
        assert status["nuts"] == "ok", f"worker {worker}:\n{status['nuts']}"
        replicas = int(arrays["nuts/replicas"])
        for name in ("hmc", "nuts"):
            draws = arrays[f"nuts/{name}_draws"]
            assert draws.shape == (workloads.RESULTS, workloads.CHAINS, 2)
            np.testing.assert_allclose(draws, _sharded_reference(name, replicas), rtol=1e-4,
                                       atol=1e-5, err_msg=f"{launch} worker {worker}: {name}")
            np.testing.assert_allclose(
                arrays[f"nuts/{name}_r_hat"],
                tfp.mcmc.potential_scale_reduction(draws, split_chains=True), rtol=1e-5)
            np.testing.assert_allclose(arrays[f"nuts/{name}_ess"],
                                       tfp.mcmc.effective_sample_size(draws, cross_chain_dims=1),
                                       rtol=1e-4)
            assert arrays[f"nuts/{name}_accepted"].shape == (workloads.RESULTS, workloads.CHAINS)
            # different replicas really drew different numbers
            assert not np.allclose(draws[:, 0], draws[:, -1])


def test_saved_model_from_two_workers_serves_in_a_fresh_process(multiworker):
    out, results = multiworker
    status, arrays = results[0]
    assert status["tc_loop"] == "ok", status["tc_loop"]
    x = arrays["tc_loop/serve_x"]
    np.save(out / "x.npy", x)
    # The documented load path for a SavedModel holding TC ops (docs/tc_ops_security.md).
    script = ("import numpy as np\n"
              "from tfx_vec.tc_ops import tf_op\n"
              f"m = tf_op.load_saved_model({str(out / 'saved')!r})\n"
              f"np.save({str(out / 'y.npy')!r}, m.serve(np.load({str(out / 'x.npy')!r})).numpy())\n")
    run_local_cluster([sys.executable, "-c", script], 1, timeout=120, tf_config=False)
    served = np.load(out / "y.npy")
    w1, b1, w2, b2 = (arrays[f"tc_loop/w{k}"] for k in range(4))
    want = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2
    np.testing.assert_allclose(served, want, rtol=1e-4, atol=1e-5)


def test_launcher_reports_a_failing_worker_with_its_log():
    with pytest.raises(WorkerFailedError, match=r"worker 1: exit code 3[\s\S]*boom 1"):
        run_local_cluster([sys.executable, "-c",
                           "import json, os, sys; i = json.loads(os.environ['TF_CONFIG'])"
                           "['task']['index']; print('boom', i); sys.exit(3 * i)"],
                          2, timeout=60)


def test_launcher_kills_workers_past_the_deadline():
    with pytest.raises(WorkerFailedError, match="killed by the launcher") as e:
        run_local_cluster([sys.executable, "-c", "import time; time.sleep(600)"], 2, timeout=3)
    assert all(r.killed and r.seconds < 10 for r in e.value.results)
    for r in e.value.results:           # reaped: no such process any more
        with pytest.raises(ProcessLookupError):
            os.kill(r.pid, 0)
