"""Faults in a multi-worker run end in a clear error within a bounded time, never a hang."""
import os
import sys

import pytest

from tfx_vec.distribute import ClusterError, multi_worker_strategy, run_local_cluster

LAUNCH = [sys.executable, "-m", "tests.distribute.fault_worker"]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


@pytest.mark.parametrize("absent", [1, 0], ids=["worker-never-starts", "leader-never-starts"])
def test_a_worker_that_never_starts_is_a_cluster_error(absent):
    results = run_local_cluster(LAUNCH + ["join"], 2, absent=[absent], timeout=90, env=ENV,
                                check=False)
    (r,) = results
    assert not r.killed, f"hung until the launcher's deadline:\n{r.log[-3000:]}"
    assert r.returncode == 3, r.log[-3000:]
    assert "did not form within 5 s" in r.log
    if absent == 1:
        assert "worker 1 did not join" in r.log


def test_a_worker_that_dies_fails_the_others_collectives():
    results = run_local_cluster(LAUNCH + ["die"], 2, timeout=120, grace=60, env=ENV,
                                check=False)
    survivor, dead = results
    assert dead.returncode == 7 and "JOINED" in dead.log, dead.log[-3000:]
    assert not survivor.killed, f"hung until the launcher's deadline:\n{survivor.log[-3000:]}"
    assert survivor.returncode == 2, survivor.log[-3000:]
    assert "PEER_FAILURE_DETECTED" in survivor.log and "unhealthy" in survivor.log


def test_no_cluster_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ClusterError, match="no cluster; set TF_CONFIG"):
        multi_worker_strategy()
