"""``tf.Module`` methods recorded as one node (``module_units.py``): exact against eager,
never stale, refused with a reason where a replay could differ; the cached attribute walk
equals TensorFlow's after every kind of change.
"""
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.lazy_programs import Adam
from tests.support import eager_then_lazy
from tfx_vec import lazy
from tfx_vec.lazy import module_units

RNG = np.random.default_rng(11)
SCALE = 0.5   # a global the modules below read (rebound by a test)
LOG: list = []


class Dense(tf.Module):
    def __init__(self, n_in, n_out, rng, activation=None):
        super().__init__()
        self.w = tf.Variable(rng.normal(0, 0.4, (n_in, n_out)).astype(np.float32))
        self.b = tf.Variable(rng.normal(0, 0.1, (n_out,)).astype(np.float32))
        self.activation = activation

    def __call__(self, x):
        z = tf.matmul(x, self.w) + self.b
        return self.activation(z) if self.activation else z


class MLP(tf.Module):
    def __init__(self, widths, rng):
        super().__init__()
        self.layers = [Dense(a, b, rng, tf.nn.tanh if i < len(widths) - 2 else None)
                       for i, (a, b) in enumerate(zip(widths[:-1], widths[1:]))]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x * SCALE


def _train(in_lazy, widths, steps, x, y, seed, change=None):
    """Train an MLP with its own Adam; returns every loss and the final weights and slots."""
    model, opt = MLP(widths, np.random.default_rng(seed)), Adam(lr=0.05)
    losses = []
    for step in range(steps):
        if change is not None:
            change(step, model, opt)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        opt.apply_gradients(tape.gradient(loss, model.trainable_variables),
                            model.trainable_variables)
        if in_lazy:
            lazy.mark_step()
        losses.append(float(loss))
    return losses + [v.numpy() for v in [*model.trainable_variables, *opt.m, *opt.v]]


def _calls(in_lazy, mod, x, steps, before=lambda step: None):
    """``mod(x)`` once per step, after ``before(step)``; a barrier after each in lazy mode."""
    out = []
    for step in range(steps):
        before(step)
        out.append(mod(tf.constant(x)).numpy())
        if in_lazy:
            lazy.mark_step()
    return out


def _close(eager, lazy_out, rtol=1e-4, atol=1e-5):
    assert len(eager) == len(lazy_out)
    for a, b in zip(eager, lazy_out):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_module_mlp_with_its_own_adam_trains_as_eager_as_two_units(seed):
    """Random widths and data: the model call and the optimizer's update are each one node
    after their probes (the update's first call creates the slots and is probed again)."""
    rng = np.random.default_rng(seed)
    widths = [int(w) for w in rng.integers(2, 9, size=int(rng.integers(3, 6)))]
    x = rng.normal(size=(int(rng.integers(3, 9)), widths[0])).astype(np.float32)
    y = rng.normal(size=(x.shape[0], widths[-1])).astype(np.float32)
    eager, lazy_out, m = eager_then_lazy(lambda in_lazy: _train(in_lazy, widths, 6, x, y, seed))
    _close(eager, lazy_out)
    assert m["unit_probes"] == 3, m           # the model once, the update twice
    assert m["units_recorded"] == 2 * 6 - 3, m
    assert not [k for k in m if k.startswith(("fallback", "tape_eager"))], m
    assert m["compiles"] <= 4, m


def test_a_changed_attribute_global_or_closure_value_makes_a_new_probe():
    """The learning rate attribute set, the global the model reads rebound, a closure's
    value rebound: each step computes what eager computes."""
    global SCALE
    x = RNG.normal(size=(5, 3)).astype(np.float32)
    y = RNG.normal(size=(5, 2)).astype(np.float32)

    def change(step, model, opt):
        global SCALE
        if step == 3:
            opt.lr = 0.01
        if step == 5:
            SCALE = 2.0

    def run(in_lazy):
        global SCALE
        SCALE = 0.5
        try:
            return _train(in_lazy, [3, 4, 2], 8, x, y, 5, change)
        finally:
            SCALE = 0.5

    eager, lazy_out, m = eager_then_lazy(run)
    _close(eager, lazy_out)
    assert m["unit_eager::python state changed"] >= 2, m

    def make():
        k = 2.0

        class Scaled(tf.Module):
            def __init__(self):
                self.w = tf.Variable([1.0, -2.0])

            def __call__(self, v):
                return self.w * v * k

        def set_k(value):
            nonlocal k
            k = value
        return Scaled(), set_k

    def closures(in_lazy):
        mod, set_k = make()
        factors = (2.0, 2.0, 2.0, 3.0, 3.0, 3.0)   # the same float objects: rebound once
        return _calls(in_lazy, mod, [0.5, 1.5], 6, lambda step: set_k(factors[step]))

    eager, lazy_out, m = eager_then_lazy(closures)
    _close(eager, lazy_out)
    assert m["unit_eager::python state changed"] >= 1, m
    assert m["units_recorded"] >= 2, m


class Config:
    def __init__(self):
        self.scale = 1.5


class Configured(tf.Module):
    def __init__(self):
        self.config = Config()
        self.w = tf.Variable([0.5, -1.0])

    def __call__(self, x):
        return self.w * x * self.config.scale


def test_a_changed_configuration_object_makes_a_new_probe():
    """A plain object the module holds is part of its Python state."""
    def run(in_lazy):
        mod = Configured()

        def before(step):
            if step == 3:
                mod.config.scale = 4.0
        return _calls(in_lazy, mod, [1.0, 2.0], 6, before)

    eager, lazy_out, m = eager_then_lazy(run)
    _close(eager, lazy_out)
    assert m["unit_eager::python state changed"] == 1, m
    assert m["units_recorded"] == 4, m   # probes at steps 0 and 3


class Printing(tf.Module):
    def __init__(self):
        self.w = tf.Variable(3.0)

    def __call__(self, x):
        print("called")
        return self.w * x


class Counting(tf.Module):
    def __init__(self):
        self.w = tf.Variable(3.0)

    def __call__(self, x):
        global SCALE
        SCALE = SCALE + 1.0
        return self.w * x * SCALE


class Noisy(tf.Module):
    def __init__(self):
        self.w = tf.Variable(3.0)

    def __call__(self, x):
        return self.w * x + np.random.normal(size=()).astype(np.float32)


class Logging(tf.Module):
    def __init__(self):
        self.w = tf.Variable(3.0)

    def __call__(self, x):
        return self.w * x * len(LOG)


class Helper:
    @staticmethod
    def shift(x):
        print("shifting")
        return x + 1.0


class Helped(tf.Module):
    def __init__(self):
        self.w = tf.Variable(3.0)

    def __call__(self, x):
        return Helper.shift(self.w * x)


class Masked(tf.Module):
    def __init__(self):
        self.w = tf.Variable(3.0)
        self.mask = np.ones(3, np.float32)

    def __call__(self, x):
        return self.w * x * self.mask


@pytest.mark.parametrize("cls, why", [
    (Printing, "it prints"), (Counting, "it assigns the global 'SCALE'"),
    (Noisy, "it draws random numbers"), (Helped, "it prints"),
    (Logging, "it reads the global 'LOG', a list that can change in place"),
    (Masked, "an attribute of Masked is a NumPy array")])
def test_what_a_replay_could_miss_runs_op_by_op_with_the_reason(cls, why, capsys):
    """A print (in the method or in a static method of another class it calls), a global
    assigned, NumPy random numbers, a global list and a NumPy array attribute changed in
    place: each call runs op by op, as eager (same prints, counts and values), and the
    refusal names the cause."""
    global SCALE

    def run(in_lazy):
        global SCALE
        SCALE, LOG[:] = 0.5, []
        np.random.seed(0)
        mod = cls()

        def before(step):
            LOG.append(step)
            if cls is Masked:
                mod.mask[step % 3] += 1.0
        return _calls(in_lazy, mod, [1.0, 2.0, 3.0], 4, before) + [SCALE]

    try:
        eager, lazy_out, m = eager_then_lazy(run)
    finally:
        SCALE = 0.5
    _close(eager, lazy_out)
    reasons = [k for k in m if k.startswith("unit_eager::")]
    assert any(why in k for k in reasons), m
    assert "units_recorded" not in m, m
    if cls in (Printing, Helped):
        assert capsys.readouterr().out.count("call" if cls is Printing else "shifting") == 8


class Collecting(tf.Module):
    def __init__(self):
        self.w = tf.Variable(2.0)

    def __call__(self, x, collected):
        y = self.w * x
        collected.append(y)
        return y


def test_a_method_that_changes_a_list_it_is_passed_runs_op_by_op():
    def run(in_lazy):
        mod, collected, out = Collecting(), [], []
        for _ in range(4):
            out.append(mod(tf.constant([1.0, 3.0]), collected).numpy())
            if in_lazy:
                lazy.mark_step()
        return out + [len(collected)]

    eager, lazy_out, m = eager_then_lazy(run)
    _close(eager, lazy_out)
    assert lazy_out[-1] == 4
    assert m["unit_eager::the call changes a list or dict it was passed"] >= 2, m
    assert "units_recorded" not in m, m


def test_methods_hooked_are_the_programs_public_ones():
    class Mixed(tf.Module):
        def __call__(self, x):
            return x

        def update(self, x):
            return x

        def _private(self, x):
            return x

        def steps(self):
            yield 1

        @property
        def size(self):
            return 1

        @tf.function
        def traced(self, x):
            return x

    assert sorted(module_units.methods(Mixed)) == ["__call__", "update"]
    assert module_units.is_user_class(Mixed)
    assert not module_units.is_user_class(tf.Module)

    import tensorflow_probability as tfp

    class MyNormal(tfp.distributions.Normal):   # a library's tf.Module subclass, subclassed
        def shifted(self, x):
            return self.log_prob(x - 1.0)

    assert not module_units.is_user_class(MyNormal)
    assert not module_units.is_user_class(tfp.distributions.Normal)


def test_a_module_method_traced_by_tf_function_keeps_its_python_control_flow():
    """A hooked method inside ``tf.function`` runs as written (AutoGraph converts its ``if``)."""
    class Branchy(tf.Module):
        def __init__(self):
            self.w = tf.Variable(2.0)

        def __call__(self, x):
            if tf.reduce_sum(x) > 0:
                return x * self.w
            return x - self.w

    mod = Branchy()
    with lazy.device():
        pass                                  # hooks installed
    f = tf.function(lambda x: mod(x))
    assert f(tf.constant([1.0, 2.0])).numpy().tolist() == [2.0, 4.0]
    assert f(tf.constant([-1.0, -2.0])).numpy().tolist() == [-3.0, -4.0]


# {{{ the cached attribute walk

def _walk(mod, predicate, expand=True):
    return tuple(tf.Module._flatten.__wrapped__(mod, predicate=predicate,
                                                expand_composites=expand))


def _same_walks(mod):
    from tensorflow.python.module import module as tf_module
    for name, predicate in (("variables", tf_module._is_variable),
                            ("trainable_variables", tf_module._is_trainable_variable),
                            ("non_trainable_variables", tf_module._is_non_trainable_variable)):
        got = getattr(mod, name)
        want = _walk(mod, predicate)
        assert [id(v) for v in got] == [id(v) for v in want], name
    assert [id(m) for m in mod.submodules] == [id(m) for m in _walk(mod, tf_module._is_module,
                                                                       False)]


@pytest.mark.parametrize("seed", range(4))
def test_the_cached_walk_equals_tensorflows_after_random_changes(seed):
    """Variables and submodules added, replaced and removed, in attributes, lists and dicts,
    nested lists (walked afresh), a non-trainable variable: after every change the module's
    ``variables``, ``trainable_variables``, ``non_trainable_variables`` and ``submodules``
    are TensorFlow's own walk's."""
    rng = np.random.default_rng(seed)

    def var(trainable=True):
        return tf.Variable(rng.normal(size=(2,)).astype(np.float32), trainable=trainable)

    def change(root):
        mods = [root, *root.submodules]
        target = mods[int(rng.integers(len(mods)))]
        kind = int(rng.integers(8))
        name = f"a{int(rng.integers(4))}"
        if kind == 0:
            setattr(target, name, var())
        elif kind == 1:
            setattr(target, name, var(trainable=False))
        elif kind == 2:
            setattr(target, name, [var(), var()])
        elif kind == 3:
            lst = getattr(target, "items", None)
            if lst is None:
                target.items = [var()]
            else:
                lst.append(var() if rng.random() < 0.7 else tf.Module())
        elif kind == 4 and len(mods) < 6:
            setattr(target, name, tf.Module())
        elif kind == 5 and hasattr(target, name):
            delattr(target, name)
        elif kind == 6:
            setattr(target, name, {"x": var(), "y": [var()]})   # nested: not cached
        else:
            lst = getattr(target, "items", None)
            if lst:
                lst[int(rng.integers(len(lst)))] = var()

    with lazy.device():
        root = tf.Module()
        root.first = var()
        for _ in range(30):
            change(root)
            _same_walks(root)
            _same_walks(root)   # the second read comes from the cache where it is kept
    assert module_units._WALKS, "nothing was cached"
# }}}


class Stateful(tf.Module):
    """Reads a float attribute, a list of variables, a submodule and a configuration object."""

    def __init__(self, rng):
        super().__init__()
        self.gain = 1.0
        self.config = Config()
        self.terms = [tf.Variable(rng.normal(size=(3,)).astype(np.float32)) for _ in range(2)]
        self.inner = Dense(3, 3, rng, tf.nn.relu)

    def __call__(self, x):
        y = self.inner(x) * self.gain * self.config.scale
        for t in self.terms:
            y = y + t
        return y

    def nudge(self, delta):
        for t in self.terms:
            t.assign_add(delta * tf.ones_like(t))


@pytest.mark.parametrize("seed", range(3))
def test_random_changes_of_python_state_between_calls_never_replay_stale(seed):
    """Between calls, at random: an attribute set to a new float, a configuration value
    changed, a variable appended to or dropped from a list, a submodule's activation swapped,
    a variable updated through a method: every call equals eager."""
    rng = np.random.default_rng(seed)
    changes = rng.integers(0, 6, size=12)
    x = rng.normal(size=(4, 3)).astype(np.float32)

    def run(in_lazy):
        mod = Stateful(np.random.default_rng(seed))
        local = np.random.default_rng(seed + 100)

        def before(step):
            kind = changes[step]
            if kind == 1:
                mod.gain = float(local.uniform(0.5, 2.0))
            elif kind == 2:
                mod.config.scale = float(local.uniform(0.5, 2.0))
            elif kind == 3:
                mod.terms.append(tf.Variable(local.normal(size=(3,)).astype(np.float32)))
            elif kind == 4 and len(mod.terms) > 1:
                mod.terms.pop()
            elif kind == 5:
                mod.inner.activation = tf.nn.tanh if mod.inner.activation is tf.nn.relu \
                    else tf.nn.relu
            mod.nudge(tf.constant(float(step) * 0.1))
        return _calls(in_lazy, mod, x, len(changes), before)

    eager, lazy_out, m = eager_then_lazy(run)
    _close(eager, lazy_out)
    assert m["units_recorded"] + m["unit_probes"] == 2 * len(changes), m   # call and nudge
    assert m["units_recorded"] >= 4, m
