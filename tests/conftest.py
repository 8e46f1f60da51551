import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from hypothesis import HealthCheck, settings  # noqa: E402

# TF ops are slow to first-run; hypothesis' deadline would flag tracing, not bugs.
settings.register_profile(
    "tfx_vec", deadline=None, max_examples=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("tfx_vec")
