"""Keras calls recorded as one node (``units.py``): exact against eager, never stale.

A layer's or model's call, a loss and a metric update become one node once a probe shows the
replay is exact; a change of the Python state of any layer inside makes the next call a probe
again; what cannot be replayed runs op by op, counted with the reason; a gradient through a
unit that has to run op by op is the unit's own vector-Jacobian product, or a clear error.
"""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tfx_vec import lazy
from tfx_vec.lazy.errors import LazyGradientError
from tests.support import eager_then_lazy

RNG = np.random.default_rng(3)
X = RNG.normal(size=(6, 4)).astype(np.float32)
Y = RNG.normal(size=(6, 3)).astype(np.float32)


def _weights(model, seed=1):
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(0, 0.5, v.shape).astype(np.float32))


def test_python_state_changes_make_a_new_probe_never_a_stale_replay():
    """An activation swapped, a BatchNormalization frozen (``trainable``), a layer counting its
    calls in an attribute: each call computes what eager computes."""
    class Counting(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def call(self, x):
            self.calls += 1
            return x * float(self.calls)

    def run(in_lazy):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"),
                                  keras.layers.BatchNormalization()])
        counting = keras.Sequential([keras.Input((4,)), Counting()])
        _weights(model)
        out = []
        for step in range(7):
            if step == 3:
                model.layers[0].activation = keras.activations.tanh
            if step == 5:
                model.layers[1].trainable = False
            y, z = model(X, training=True), counting(X)
            if in_lazy:
                lazy.mark_step()
            out += [y.numpy(), z.numpy()]
        return out + [v.numpy() for v in model.weights]

    eager, lazy_out, m = eager_then_lazy(run)
    for a, b in zip(eager, lazy_out):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert m["unit_eager::python state changed"] >= 2, m
    assert m["unit_eager::the call changes the Python state of a layer"] >= 6, m
    assert m["units_recorded"] >= 2, m    # the first model between its changes, never the other


def test_loss_metric_and_model_units_match_eager_and_stop_probing():
    def run(in_lazy):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="relu"),
                                  keras.layers.Dense(3)])
        _weights(model)
        loss_fn, mae = keras.losses.MeanSquaredError(), keras.metrics.MeanAbsoluteError()
        opt = keras.optimizers.Adam(0.05)
        losses = []
        for _ in range(5):
            with tf.GradientTape() as tape:
                pred = model(X, training=True)
                loss = loss_fn(Y, pred)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            mae.update_state(Y, pred)
            mae.update_state(Y, 2.0 * pred)   # a second update in the step: reads the first
            if in_lazy:
                lazy.mark_step()
            losses.append(float(loss))
        return losses + [float(mae.result())] + [v.numpy() for v in model.weights]

    eager, lazy_out, m = eager_then_lazy(run)
    for a, b in zip(eager, lazy_out):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert m["units_recorded"] >= 4 * 3, m            # model, loss, two metric updates
    assert m["unit_probes"] <= 4, m                   # one per signature
    assert not [k for k in m if k.startswith(("tape_eager", "fallback"))], m


def test_what_cannot_be_replayed_runs_op_by_op_with_a_reason():
    """A layer adding losses (activity regularizer), a Python float argument, an output with a
    Keras mask: op by op, counted, equal to eager; code outside the scope stays eager."""
    def run(in_lazy):
        reg = keras.Sequential([keras.Input((4,)),
                                keras.layers.Dense(2, activity_regularizer="l2")])
        masking = keras.layers.Masking(mask_value=0.0)
        loss_fn = keras.losses.MeanSquaredError()
        _weights(reg)
        out = []
        for _ in range(3):
            out.append(reg(X).numpy())
            out.append(float(reg.losses[-1]))
            out.append(float(loss_fn(Y, X[:, :3], sample_weight=0.5)))
            out.append(masking(X).numpy())
        return out

    eager, lazy_out, m = eager_then_lazy(run)
    for a, b in zip(eager, lazy_out):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert m.get("unit_eager::a layer adds losses", 0) + m.get(
        "unit_eager::the call changes the Python state of a layer", 0) >= 1, m
    assert m["unit_eager::a Python float argument (it would be baked)"] >= 1, m
    assert m["unit_eager::an output carries a Keras mask"] >= 1, m
    mean = keras.metrics.Mean()      # the device is registered, but this is eager code
    for v in (1.0, 2.0, 3.0):
        mean.update_state(v)
    assert float(mean.result()) == 2.0 and int(mean.count.numpy()) == 3


def test_a_gradient_through_a_unit_run_op_by_op_is_the_units_own():
    """A value read inside the tape stops the gradient from being recorded as one node:
    TensorFlow's backward then runs, and the model call recorded as one node contributes its
    vector-Jacobian product (itself one node).  A call that updates variables cannot be
    differentiated afterwards: a clear error."""
    def run(in_lazy):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh"),
                                  keras.layers.Dense(3)])
        _weights(model)
        seen = []
        for _ in range(4):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(X) - Y) ** 2)
                seen.append(float(loss))          # a value read inside the tape
            grads = tape.gradient(loss, model.trainable_variables)
            for g, v in zip(grads, model.trainable_variables):
                v.assign_sub(0.1 * g)
            if in_lazy:
                lazy.mark_step()
        return seen + [v.numpy() for v in model.weights]

    eager, lazy_out, m = eager_then_lazy(run)
    for a, b in zip(eager, lazy_out):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert m["unit_vjps"] >= 1 and m["tape_eager::a value was read"] >= 1, m

    with lazy.device():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                                  keras.layers.BatchNormalization()])
        for _ in range(3):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(model(X, training=True))
                float(loss)
            lazy.mark_step()
        with pytest.raises(LazyGradientError, match="record_calls=False"):
            tape.gradient(loss, model.trainable_variables)


def test_the_steady_steps_short_paths_give_what_eager_gives():
    """Keras variables as gradient sources (also with an autocast scope open, where Keras'
    own ``handle`` is asked), the variables a model call recorded as one node tells the tape
    it read (before and after a layer is frozen), and a value read after the barrier (no new
    program) or before it (forced): each as eager."""
    from keras.src.backend.common.variables import AutocastScope

    def run(in_lazy):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh"),
                                  keras.layers.Dense(3)])
        _weights(model)
        out, forced, watched = [], [], []
        for step in range(6):
            if step == 3:
                model.layers[0].trainable = False
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(X) - Y) ** 2)
            watched.append(sorted(v.shape.as_list() for v in tape.watched_variables()))
            with AutocastScope("float32") if step % 2 else tf.init_scope():
                grads = tape.gradient(loss, model.trainable_variables)
            for g, v in zip(grads, model.trainable_variables):
                v.assign_sub(0.1 * g)
            before = lazy.metrics().get("forced", 0) if in_lazy else 0
            if in_lazy and step < 4:
                lazy.mark_step()
            out.append(float(loss))
            forced.append(lazy.metrics().get("forced", 0) - before if in_lazy else int(step >= 4))
        return forced, watched, out + [v.numpy() for v in model.weights]

    eager, lazy_out, m = eager_then_lazy(run)
    assert lazy_out[0] == eager[0] == [0, 0, 0, 0, 1, 1]   # forced only without a barrier
    assert lazy_out[1] == eager[1]
    for a, b in zip(eager[2], lazy_out[2]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert m["units_recorded"] >= 3 and m["tape_recorded"] >= 5, m
    assert not [k for k in m if k.startswith(("tape_eager", "fallback"))], m


def _mutations():
    """(name, change) pairs: each ``change(layer)`` alters the Python state of a layer whose
    ``scales`` list, ``table`` dict and ``tag`` set are attributes (one level in)."""
    def set_attr(name, value):
        return lambda layer: setattr(layer, name, value)

    def swap_class(layer):
        layer.__class__ = type("Other", (type(layer),), {})

    def move_item(layer):        # same total of items: only the sizes tell the lists apart
        layer.tags.append(layer.scales.pop())

    def policy(layer):
        keras.config.set_dtype_policy("float64")

    return [
        ("a float replaced by an equal float",
         lambda layer: setattr(layer, "rate", float(str(layer.rate)))),
        ("a new attribute", set_attr("extra", 1)),
        ("an attribute removed", lambda layer: delattr(layer, "rate")),
        ("an attribute renamed", lambda layer: setattr(layer, "rates", vars(layer).pop("rate"))),
        ("a flag", set_attr("flag", True)),
        ("an attribute of the inner layer", lambda layer: setattr(layer.inner, "units", 7)),
        ("a list item", lambda layer: layer.scales.__setitem__(0, RNG.uniform())),
        ("a list appended to", lambda layer: layer.scales.append(RNG.uniform())),
        ("an item moved between lists", move_item),
        ("a dict value", lambda layer: layer.table.__setitem__("a", RNG.uniform())),
        ("a dict key", lambda layer: layer.table.__setitem__("b", 1.0)),
        ("a tracked dict value", lambda layer: layer.tracked.__setitem__("k", RNG.uniform())),
        ("a set item", lambda layer: layer.tag.add("new")),
        ("an attribute set past Keras' __setattr__",
         lambda layer: object.__setattr__(layer, "rate", RNG.uniform())),
        ("an attribute set in __dict__", lambda layer: vars(layer).__setitem__("flag", 0)),
        ("what a container's own __iter__ yields", lambda layer: layer.shown.view.append(1.0)),
        ("what a mapping's own values() returns", lambda layer: layer.doubled.extra.append(2)),
        ("a tracked list item", lambda layer: layer.scales.__setitem__(1, RNG.uniform())),
        ("the class", swap_class),
        ("Keras' dtype policy", policy),
    ]


class _Shown(list):
    """A list that iterates another list (a container with its own ``__iter__``)."""

    def __init__(self):
        super().__init__([0.5])
        self.view = [float(RNG.uniform())]

    def __iter__(self):
        return iter(self.view)


class _Doubled(dict):
    """A dict whose ``values()`` are its own (a mapping with its own ``values``)."""

    def __init__(self):
        super().__init__(a=1)
        self.extra = [float(RNG.uniform())]

    def values(self):
        return list(super().values()) + self.extra


class _Scaled(keras.layers.Layer):
    """A layer with one attribute of each kind the state check reads."""

    def __init__(self):
        super().__init__()
        self.inner = keras.layers.Dense(3)
        self.rate, self.flag = float(RNG.uniform()), False
        self.scales, self.tags = [float(RNG.uniform()), float(RNG.uniform())], []
        self.table, self.tag = {"a": float(RNG.uniform())}, {"x"}
        self.tracked = {"k": 1.0}   # Keras tracks it: a mapping that is not a plain dict
        self.pair = (float(RNG.uniform()), "s")
        object.__setattr__(self, "shown", _Shown())      # past Keras' tracking: kept as is
        object.__setattr__(self, "doubled", _Doubled())

    def call(self, x):
        return self.inner(x) * self.rate


@pytest.mark.parametrize("name,change", _mutations(), ids=[n for n, _ in _mutations()])
def test_a_snapshot_sees_every_change_of_python_state(name, change):
    """The cached state check (flat identity comparisons) sees each kind of change the
    per-call check guards against, and nothing else."""
    from tfx_vec.lazy.units import Snapshot, _layers

    layer = _Scaled()
    layer(X)
    snapshot = Snapshot(_layers(layer))
    assert snapshot.same()
    layer(X)
    assert snapshot.same()                     # a call that changes nothing
    policy = keras.config.dtype_policy()
    try:
        change(layer)
        assert not snapshot.same(), name
    finally:
        keras.config.set_dtype_policy(policy)


def _same_in_python(snapshot) -> bool:
    """The state check written as Python loops: the reference for the native one."""
    import keras as k
    if k.config.dtype_policy() is not snapshot.policy:
        return False
    if any(type(o) is not t for o, t in zip(snapshot.objects, snapshot.types)):
        return False
    dicts = [vars(o) for o in snapshot.objects]
    keys = [key for d in dicts for key in d]
    values = [v for d in dicts for v in d.values()]
    if [len(d) for d in dicts] != snapshot.sizes or keys != snapshot.keys or \
            len(values) != len(snapshot.values) or \
            any(a is not b for a, b in zip(values, snapshot.values)):
        return False
    if [len(c) for c in snapshot.containers] != snapshot.container_sizes:
        return False
    contents = [x for c in snapshot.containers for x in c]
    mapped = [v for m in snapshot.mappings for v in m.values()]
    return len(contents) == len(snapshot.contents) and \
        all(a is b for a, b in zip(contents, snapshot.contents)) and \
        len(mapped) == len(snapshot.mapping_values) and \
        all(a is b for a, b in zip(mapped, snapshot.mapping_values))


def test_the_native_state_check_agrees_with_python_loops_on_random_changes():
    """Random sequences of changes (each kind above, some undone, some repeated with the same
    object) on a layer and a model: the native check answers as the Python reference does,
    after every change."""
    from tfx_vec.lazy.units import Snapshot, _layers
    rng = np.random.default_rng(11)
    mutations = [change for name, change in _mutations() if "policy" not in name]

    def undo(layer):   # puts back an identical object: the state is the snapshot's again
        vars(layer)["flag"] = layer.__dict__["flag"]
    answers = set()
    for trial in range(12):
        layer = _Scaled()
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), layer])
        model(X)
        for owner in (layer, model):
            snapshot = Snapshot(_layers(owner))
            for _ in range(int(rng.integers(1, 4))):
                pick = int(rng.integers(0, len(mutations) + 1))
                (mutations[pick] if pick < len(mutations) else undo)(layer)
                assert snapshot.same() == _same_in_python(snapshot)
                answers.add(snapshot.same())
    assert answers == {True, False}
