"""Importing tfx_vec.autobatch pulls in neither TensorFlow Probability nor tf_keras: only
NoUTurnSampler needs them, and it is imported on first use."""
import json

from tests.autobatch.isolated import run_python

_SCRIPT = """
import json, sys
def loaded():
    return sorted({m.split(".")[0] for m in sys.modules} & {"tensorflow_probability", "tf_keras"})
import tfx_vec.autobatch as ab
before = loaded()
ab.function  # the public face works without them
sampler = ab.NoUTurnSampler
print(json.dumps([before, loaded(), sampler.__name__]))
"""


def test_autobatch_imports_no_tfp_until_nuts_is_used():
    before, after, name = json.loads(run_python(_SCRIPT).strip().splitlines()[-1])
    assert before == []
    assert "tensorflow_probability" in after and name == "NoUTurnSampler"
