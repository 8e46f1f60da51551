"""Fuzzing under hypothesis, each campaign in its own process so that a crash (a signal, an
abort) fails the test instead of ending the run: arbitrary attributes of the TcKernel op give
TensorFlow errors only, and arbitrary TC sources through ``tc.define`` (eagerly and as the op)
give ``TcError`` only, the two paths agreeing where both run (see fuzz_security.py).

``TFX_VEC_FUZZ_EXAMPLES`` raises the number of examples for a long run outside CI."""
import os
import subprocess
import sys

import pytest

EXAMPLES = int(os.environ.get("TFX_VEC_FUZZ_EXAMPLES", "60"))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("campaign", ["attributes", "sources"])
def test_fuzz_campaign_in_a_subprocess(campaign):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "tests.tc_ops.fuzz_security", campaign,
                           str(EXAMPLES)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0 and f"fuzz-ok {campaign}" in proc.stdout, (
        f"exit status {proc.returncode} (negative: killed by a signal)\n"
        f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    assert "ran" in proc.stdout       # the campaign reached kernels, not only early errors
