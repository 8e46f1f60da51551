"""Unchanged eager TensorFlow programs trained inside ``lazy.device()``: the same losses and
weights as eager, no fallback, no compilation after the first steps.

The programs (``benchmarks/lazy_programs.py``) are written from scratch after the kinds of
code TensorFlow's guides teach: ``tf.Module`` models with their own optimizers, Keras
``Sequential``/subclassed/functional models with Keras losses, metrics and optimizers,
BatchNormalization, Dropout and the ``training`` flag, a raw-ops convnet, ``tf.data`` batches,
``float(loss)`` and Python control flow on values.
"""
import numpy as np
import pytest

from benchmarks.lazy_programs import PROGRAMS, KerasSubclassedBN, train
from tfx_vec import lazy

STEPS = 5
WARM_UP = 3   # steps after which no program may compile again


def _trained_lazily(program, steps=STEPS):
    compiles = []
    lazy.reset_metrics()
    losses, run = train(program, steps, "lazy",
                        after_step=lambda i: compiles.append(lazy.metrics().get("compiles", 0)))
    return losses, run, compiles, lazy.metrics()


def _assert_same(a_losses, a_run, b_losses, b_run):
    np.testing.assert_allclose(a_losses, b_losses, rtol=1e-4, atol=1e-5)
    a_weights, b_weights = a_run.weights(), b_run.weights()
    assert len(a_weights) == len(b_weights) > 0
    for a, b in zip(a_weights, b_weights):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_trains_to_eager_losses_and_weights(name):
    program = PROGRAMS[name]("test")
    eager_losses, eager_run = train(program, STEPS, "eager")
    lazy_losses, lazy_run, compiles, m = _trained_lazily(program)
    _assert_same(lazy_losses, lazy_run, eager_losses, eager_run)
    assert not [k for k in m if k.startswith("fallback::")], m
    assert compiles[-1] == compiles[WARM_UP - 1], (compiles, lazy.metrics_report())
    assert m["tape_recorded"] >= STEPS and not [k for k in m if k.startswith("tape_eager")]
    assert m["executions"] >= STEPS
    if name.startswith("keras"):   # the model, the loss and the metric: one node each
        assert m["units_recorded"] >= 2 * STEPS, m
    if name in ("module_mlp_adam", "module_mlp_784"):   # the model and the Adam update
        assert m["units_recorded"] >= 2 * STEPS - 3, m


@pytest.mark.parametrize("name", ["keras_sequential_adam", "module_mlp_adam"])
def test_op_by_op_recording_matches_eager_too(name):
    """``record_calls=False``: gradients and optimizer updates recorded op by op (TensorFlow's
    and Keras' own Python running on the device) give the same answers."""
    program = PROGRAMS[name]("test")
    eager_losses, eager_run = train(program, STEPS, "eager")
    lazy.configure(record_calls=False)
    lazy_losses, lazy_run, compiles, m = _trained_lazily(program)
    _assert_same(lazy_losses, lazy_run, eager_losses, eager_run)
    assert "tape_recorded" not in m and "calls_recorded" not in m
    assert compiles[-1] == compiles[WARM_UP - 1]


def test_dropout_follows_xla_random_streams():
    """With Dropout active the masks come from XLA's random number streams (as under
    ``tf.function(jit_compile=True)``), not from the eager CPU kernels': the lazy run equals the
    jit-compiled one, and BatchNormalization's moving statistics are updated alike."""
    program = KerasSubclassedBN("test", dropout=0.3)
    jit_losses, jit_run = train(program, STEPS, "jit")
    lazy_losses, lazy_run, compiles, m = _trained_lazily(program)
    _assert_same(lazy_losses, lazy_run, jit_losses, jit_run)
    eager_losses, _ = train(program, STEPS, "eager")
    assert not np.allclose(eager_losses[1:], lazy_losses[1:])   # other masks than eager's
