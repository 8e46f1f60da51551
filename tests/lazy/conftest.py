import pytest

from tfx_vec import lazy


@pytest.fixture(autouse=True)
def _fresh_lazy_state():
    """Each test starts with no pending work, default settings and zeroed metrics."""
    lazy.mark_step()
    lazy.configure(fallback_error=False, max_graphs=None, cache_size=128, max_graph_size=10000,
                   record_calls=True)
    lazy.reset_metrics()
    lazy.clear_cache()   # counts of compiles and hits are per test
    yield
    lazy.mark_step()
    lazy.configure(fallback_error=False, max_graphs=None, cache_size=128, max_graph_size=10000,
                   record_calls=True)
