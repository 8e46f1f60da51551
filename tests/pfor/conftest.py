import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _fast_function_instantiation():
    """Grappler's graph rewrites dominate the cost of the many one-off tf.functions these
    tests build; they do not change results, so they are off for the pfor tests only."""
    import tensorflow as tf
    old = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    yield
    tf.config.optimizer.set_experimental_options(old)


@pytest.fixture
def grappler_on():
    """Grappler's rewrites back on (constant folding, loop optimizer) for a test that checks
    the vectorized graph survives them; the autouse fixture above restores the options."""
    import tensorflow as tf
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": False})


@pytest.fixture
def tf1_control_flow():
    """TF1 control flow: in a graph, ``tf.compat.v1.while_loop`` builds Enter/Merge/Switch/Exit
    ops and ``tf.TensorArray`` is a resource TensorArray."""
    import tensorflow as tf
    was_v2 = tf.compat.v1.control_flow_v2_enabled()
    tf.compat.v1.disable_control_flow_v2()
    yield
    if was_v2:
        tf.compat.v1.enable_control_flow_v2()
