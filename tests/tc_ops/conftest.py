"""tc_ops tests: the corpus holds TCs that reduce into their outputs without ``!`` on purpose;
their define-time TcWarning is checked in test_lang.py, silenced elsewhere."""
import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/tc_ops/" in str(item.fspath):
            item.add_marker(pytest.mark.filterwarnings(
                "ignore::tfx_vec.tc_ops.errors.TcWarning"))
