"""Differentially private SGD (Abadi et al. 2016) on vectorized per-example gradients.

Each step: compute every example's gradient (one vectorized pfor loop, as
:func:`~tfx_vec.pfor.gradients.per_example_gradients` does), clip each to an l2 norm of at most
``l2_norm_clip`` (the norm over all variables together), sum, add Gaussian noise of standard
deviation ``noise_multiplier * l2_norm_clip`` once per global batch, and divide by the global
number of examples.  The optimizer then applies that gradient unchanged: any Keras 3 optimizer.

Under a ``tf.distribute`` strategy each replica clips its own examples; the optimizer's
all-reduce (a SUM, in Keras 3) adds the replicas' shares, and only the replica with id 0 in the
sync group adds the noise, so the global batch gets exactly one noise draw.  The noise is a
stateless function of ``(seed, step, variable)``: the same run on one device and on N replicas
draws the same noise and makes the same update.

Stages, top to bottom:

1. :func:`_as_microbatches` reshapes each leaf ``[n, ...]`` to ``[m, n/m, ...]``.
2. :func:`_vectorized_gradients`: one ``tfx_vec.pfor`` over the ``m`` microbatches, each
   iteration a ``GradientTape`` over ``loss_fn(microbatch)`` (plus its auxiliary outputs).
3. :func:`clip_and_sum`: per-microbatch global norms, clip factors, one weighted sum per variable.
4. :func:`_noise`: one stateless normal draw per variable, on replica 0 only.
5. :func:`dp_gradients` divides by the global microbatch count (an all-reduce of the local counts).

Keras: :func:`make_dp_model_class` adds a DP ``train_step`` to a model class (``DPSequential``
and ``DPModel`` are ready), so ``model.fit`` trains privately; custom loops call
:func:`dp_gradients` and hand the result to ``optimizer.apply_gradients``.
Accounting: :func:`compute_epsilon` and :func:`compute_noise_multiplier` (the ``dp-accounting``
package's RDP or PLD accountant for the Poisson-sampled Gaussian mechanism).

Example:
    >>> import tensorflow as tf
    >>> w = tf.Variable([1.0, -2.0])
    >>> batch = tf.constant([[1.0, 0.0], [0.0, 3.0], [2.0, 2.0]])
    >>> out = dp_gradients(lambda x: tf.reduce_sum(w * x), [w], batch, l2_norm_clip=1.0,
    ...                    noise_multiplier=0.0, seed=0, step=0)
    >>> [round(float(g), 4) for g in out.grads[0]]
    [0.569, 0.569]
    >>> [round(float(v), 4) for v in out.norms]
    [1.0, 3.0, 2.8284]
"""
from __future__ import annotations

import collections
from typing import Any, Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

__all__ = ["DPGradients", "dp_gradients", "clip_and_sum", "make_dp_model_class", "DPSequential",
           "DPModel", "compute_epsilon", "compute_noise_multiplier", "ACCOUNTANTS"]

ACCOUNTANTS = ("rdp", "pld")

DPGradients = collections.namedtuple("DPGradients", ["grads", "losses", "norms", "aux"])
DPGradients.__doc__ = """What :func:`dp_gradients` returns on this replica.

``grads``: one tensor per variable, this replica's share of the noised mean clipped gradient
(the shares of all replicas sum to it; with one replica it is the gradient itself).
``losses``: ``[m]`` loss of each microbatch (each example, by default).
``norms``: ``[m]`` l2 norm of each microbatch's gradient before clipping.
``aux``: the auxiliary outputs of ``loss_fn``, stacked ``[m, ...]`` (None when it has none).

Example::

    out = dp_gradients(loss_fn, model.trainable_variables, batch, l2_norm_clip=1.0,
                       noise_multiplier=1.1, seed=0, step=optimizer.iterations)
    optimizer.apply_gradients(zip(out.grads, model.trainable_variables))
"""


# {{{ argument checks

def _check_dp_options(l2_norm_clip: float, noise_multiplier: float,
                      num_microbatches: int | None) -> None:
    if not l2_norm_clip > 0:
        raise ValueError(f"DP-SGD: l2_norm_clip must be > 0, got {l2_norm_clip!r}")
    if not noise_multiplier >= 0:
        raise ValueError(f"DP-SGD: noise_multiplier must be >= 0, got {noise_multiplier!r}")
    if num_microbatches is not None and (int(num_microbatches) != num_microbatches
                                         or num_microbatches < 1):
        raise ValueError("DP-SGD: num_microbatches must be a positive int or None (one "
                         f"microbatch per example), got {num_microbatches!r}")

# }}}


# {{{ stages

def _as_microbatches(batch: Any, num_microbatches: int | None) -> tuple[Any, Any]:
    """``[n, ...]`` leaves as ``[m, n/m, ...]``; returns (microbatches, m as a scalar tensor).

    Static shapes are kept (Keras layers need their feature sizes); ``None`` leaves (a missing
    sample weight) stay ``None``.
    """
    leaves = [t for t in tf.nest.flatten(batch) if t is not None]
    if not leaves:
        raise ValueError("DP-SGD: the batch has no tensors")
    first = tf.convert_to_tensor(leaves[0])
    n, static_n = tf.shape(first)[0], first.shape[0]
    if num_microbatches is None:
        return _map_present(lambda t: tf.expand_dims(t, 1), batch), n
    m = int(num_microbatches)
    if static_n is not None and static_n % m:
        raise ValueError(f"DP-SGD: a batch of {static_n} examples does not split into {m} "
                         "microbatches of equal size (per replica)")
    check = tf.debugging.assert_equal(
        n % m, 0, message="DP-SGD: the batch does not split into num_microbatches microbatches "
                          "of equal size (per replica)")

    def split(t):
        with tf.control_dependencies([check]):
            out = tf.reshape(t, tf.concat([[m, n // m], tf.shape(t)[1:]], 0))
        out.set_shape([m, None if static_n is None else static_n // m] + t.shape[1:].as_list())
        return out
    return _map_present(split, batch), tf.constant(m, tf.int32)


def _map_present(fn: Callable[[tf.Tensor], tf.Tensor], structure: Any) -> Any:
    return tf.nest.map_structure(
        lambda t: None if t is None else fn(tf.convert_to_tensor(t)), structure)


def _vectorized_gradients(loss_fn: Callable[[Any], Any], variables: Sequence[Any],
                          microbatches: Any, m: tf.Tensor) -> tuple[list, tf.Tensor, Any]:
    """Per-microbatch gradients ``[m, *v.shape]``, losses ``[m]`` and stacked aux: one pfor."""
    from tfx_vec.pfor import api

    def loop_fn(i):
        mb = _map_present(lambda t: tf.gather(t, i), microbatches)
        with tf.GradientTape() as tape:
            for v in variables:
                tape.watch(v)
            out = loss_fn(mb)
            loss, aux = out if isinstance(out, tuple) else (out, None)
            loss = tf.convert_to_tensor(loss)
            if loss.shape.rank != 0:
                raise ValueError("DP-SGD: loss_fn must return a scalar loss for one microbatch "
                                 f"(or (loss, aux)), got shape {loss.shape}")
        grads = tape.gradient(loss, variables, unconnected_gradients="zero")
        return (grads, loss) if aux is None else (grads, loss, aux)
    out = api.pfor(loop_fn, m)
    return list(out[0]), out[1], (out[2] if len(out) > 2 else None)


def clip_and_sum(per_example: Sequence[tf.Tensor], l2_norm_clip: float
                 ) -> tuple[list[tf.Tensor], tf.Tensor]:
    """Clip each example's gradient (its rows across all tensors) to ``l2_norm_clip``; sum.

    Returns the clipped sums (one per variable) and the ``[m]`` norms before clipping.

    Example:
        >>> import tensorflow as tf
        >>> sums, norms = clip_and_sum([tf.constant([[3.0, 4.0], [0.3, 0.4]])], 1.0)
        >>> [round(float(v), 4) for v in sums[0]], [round(float(v), 4) for v in norms]
        ([0.9, 1.2], [5.0, 0.5])
    """
    squares = [tf.reduce_sum(tf.reshape(tf.square(g), [tf.shape(g)[0], -1]), 1)
               for g in per_example]
    norms = tf.sqrt(tf.add_n(squares))
    dtype = norms.dtype
    factors = tf.minimum(tf.ones([], dtype),
                         tf.cast(l2_norm_clip, dtype) / tf.maximum(norms, np.finfo(
                             dtype.as_numpy_dtype).tiny))
    sums = [tf.tensordot(tf.cast(factors, g.dtype), g, axes=1) for g in per_example]
    return sums, norms


def _noise(variables: Sequence[Any], seed: tf.Tensor, step: tf.Tensor, stddev: float,
           on_this_replica: tf.Tensor) -> list[tf.Tensor]:
    """One N(0, stddev^2) draw per variable, a function of (seed, step, variable index) only."""
    step_seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(step, tf.int64))
    out = []
    for k, v in enumerate(variables):
        dtype = tf.as_dtype(v.dtype)
        z = tf.random.stateless_normal(tf.shape(v), tf.random.experimental.stateless_fold_in(
            step_seed, tf.constant(k, tf.int64)), stddev=stddev, dtype=dtype)
        out.append(z * tf.cast(on_this_replica, dtype))
    return out


def _replica_facts() -> tuple[Any, int, tf.Tensor]:
    """(replica context or None, replicas in sync, whether this replica adds the noise)."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None:
        raise RuntimeError("DP-SGD: dp_gradients runs per replica: call it inside "
                           "strategy.run (or outside any strategy), not in a cross-replica "
                           "context such as strategy.scope() code outside strategy.run")
    r = ctx.num_replicas_in_sync
    first = tf.equal(ctx.replica_id_in_sync_group, 0) if r > 1 else tf.constant(True)
    return ctx, r, first


def _seed_tensor(seed: int | Sequence[int] | tf.Tensor) -> tf.Tensor:
    if isinstance(seed, (int, np.integer)):
        return tf.constant([0, int(seed)], tf.int64)
    return tf.cast(tf.convert_to_tensor(seed), tf.int64)

# }}}


def dp_gradients(loss_fn: Callable[[Any], Any], variables: Sequence[Any], batch: Any, *,
                 l2_norm_clip: float, noise_multiplier: float,
                 seed: int | Sequence[int] | tf.Tensor, step: int | tf.Tensor,
                 num_microbatches: int | None = None, all_reduce: bool = False) -> DPGradients:
    """The DP-SGD gradient of ``loss_fn`` over ``batch``, clipped per microbatch and noised.

    Args:
      loss_fn: maps one microbatch (``batch``'s structure, each leaf ``[n/m, ...]``: a batch
        of one example by default) to a scalar loss, or to ``(loss, aux)``; its gradient with
        respect to ``variables`` is clipped.  Write it for a batch, as for a Keras model.
      variables: the trainable variables (Keras or TF variables).
      batch: a tensor or nested structure of tensors with leading size ``n`` (this replica's
        part of the global batch under a strategy).
      l2_norm_clip: the clipping norm ``C``, taken over all variables together.
      noise_multiplier: ``sigma``; the noise added to the sum has standard deviation ``sigma*C``.
      seed: an int or an int pair; the noise of a step is a function of ``(seed, step)``.
      step: the step number (``optimizer.iterations`` in a Keras loop).
      num_microbatches: clip per group of ``n/m`` examples instead of per example.
      all_reduce: also sum the replicas' shares here (for loops that do not hand the gradient
        to a Keras optimizer, whose ``apply_gradients`` does that sum itself).

    Returns:
      :class:`DPGradients`; ``grads`` are ``(sum of clipped gradients + noise) / M`` where ``M``
      is the number of microbatches in the global batch (this replica's share of it, unless
      ``all_reduce``).

    Raises:
      ValueError: bad options, a non-scalar loss, a batch that does not split evenly.
      tfx_vec.VectorizationError: ``loss_fn`` writes to a variable per example (for example
        batch normalization's moving statistics in training mode).

    Example:
        >>> w = tf.Variable([0.5, 0.5])
        >>> out = dp_gradients(lambda mb: tf.reduce_sum(w * mb), [w], tf.ones([4, 2]),
        ...                    l2_norm_clip=0.1, noise_multiplier=0.0, seed=0, step=0)
        >>> [round(float(g), 4) for g in out.grads[0]], out.norms.shape.as_list()
        ([0.0707, 0.0707], [4])
    """
    _check_dp_options(l2_norm_clip, noise_multiplier, num_microbatches)
    variables = [v.value if isinstance(v, keras.Variable) else v for v in variables]
    if not variables:
        raise ValueError("DP-SGD: no variables to differentiate")

    def run():
        ctx, replicas, first = _replica_facts()
        microbatches, m = _as_microbatches(batch, num_microbatches)
        per_mb, losses, aux = _vectorized_gradients(loss_fn, variables, microbatches, m)
        sums, norms = clip_and_sum(per_mb, l2_norm_clip)
        noise = _noise(variables, _seed_tensor(seed), tf.convert_to_tensor(step),
                       noise_multiplier * l2_norm_clip, first)
        total = tf.cast(m, tf.float32)
        if replicas > 1:
            total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, total)
        grads = [(s + z) / tf.cast(total, s.dtype) for s, z in zip(sums, noise)]
        if all_reduce and replicas > 1:
            grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        return DPGradients(grads, losses, norms, aux)

    if tf.executing_eagerly():   # the tape inside the vectorized loop must stay symbolic
        return tf.function(run, autograph=False)()
    return run()


# {{{ Keras: a model class whose train_step is DP-SGD

def make_dp_model_class(cls: type) -> type:
    """A subclass of the Keras model class ``cls`` whose ``train_step`` is DP-SGD.

    The subclass takes the keyword arguments ``l2_norm_clip``, ``noise_multiplier``,
    ``num_microbatches=None`` and ``seed=None`` (None: a random seed per model) besides
    ``cls``'s own, and serializes them in ``get_config``.  ``fit`` then clips each example's
    gradient of the compiled loss (plus ``model.losses``, computed per example), adds the
    noise once per global batch, and lets the compiled optimizer apply the result; metrics
    and the reported loss come from the same per-example forward pass (training mode).
    Works under ``tf.distribute`` strategies (build and compile the model in
    ``strategy.scope()``); the TensorFlow backend only.

    Example:
        >>> import keras, numpy as np
        >>> DPSeq = make_dp_model_class(keras.Sequential)
        >>> model = DPSeq([keras.Input((4,)), keras.layers.Dense(2)], l2_norm_clip=1.0,
        ...               noise_multiplier=1.1, seed=0)
        >>> model.compile(keras.optimizers.SGD(0.1), "mse")
        >>> h = model.fit(np.ones((8, 4)), np.zeros((8, 2)), batch_size=4, verbose=0)
        >>> type(model).__name__, len(h.history["loss"])
        ('DPSequential', 1)
    """
    if not (isinstance(cls, type) and issubclass(cls, keras.Model)):
        raise TypeError(f"make_dp_model_class needs a keras.Model subclass, got {cls!r}")

    class _DP(cls):
        def __init__(self, *args: Any, l2_norm_clip: float, noise_multiplier: float,
                     num_microbatches: int | None = None, seed: int | None = None,
                     **kwargs: Any):
            super().__init__(*args, **kwargs)
            _check_dp_options(l2_norm_clip, noise_multiplier, num_microbatches)
            self.l2_norm_clip = float(l2_norm_clip)
            self.noise_multiplier = float(noise_multiplier)
            self.num_microbatches = num_microbatches
            self.dp_seed = int(np.random.SeedSequence().generate_state(1)[0]) \
                if seed is None else int(seed)

        def train_step(self, data):
            logs = _keras_dp_train_step(self, data)
            if _is_multi_worker(self.distribute_strategy):
                # Keras 3 reduces logs across workers with a MEAN over axis 0, which a scalar
                # does not have: give each value that axis.
                logs = tf.nest.map_structure(lambda v: tf.reshape(v, [1]), logs)
            return logs

        def _maybe_symbolic_build(self, iterator=None, data_batch=None):
            # Keras 3 reduces the whole first batch structure with one strategy.reduce call,
            # which MultiWorkerMirroredStrategy rejects: build from one replica's batch.
            if iterator is not None and _is_multi_worker(self.distribute_strategy):
                for _, _, it in iterator:
                    data_batch = tf.nest.map_structure(
                        lambda v: self.distribute_strategy.experimental_local_results(v)[0],
                        next(it))
                    break
                with self.distribute_strategy.scope():
                    return self._symbolic_build(data_batch=data_batch)
            return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

        def get_config(self):
            config = super().get_config()
            config.update(l2_norm_clip=self.l2_norm_clip, noise_multiplier=self.noise_multiplier,
                          num_microbatches=self.num_microbatches, seed=self.dp_seed)
            return config

    _DP.__name__ = _DP.__qualname__ = "DP" + cls.__name__
    _DP.__doc__ = (f"``{cls.__name__}`` trained with DP-SGD (see ``make_dp_model_class``).\n\n"
                   "Example::\n\n"
                   f"    model = DP{cls.__name__}(..., l2_norm_clip=1.0, noise_multiplier=1.1)\n"
                   "    model.compile(keras.optimizers.SGD(0.1), loss)\n"
                   "    model.fit(x, y, batch_size=256)\n")
    return keras.saving.register_keras_serializable(package="tfx_vec")(_DP)


def _keras_dp_train_step(model: keras.Model, data: Any) -> dict:
    if keras.backend.backend() != "tensorflow":
        raise ValueError(f"DP-SGD's train_step runs on Keras' TensorFlow backend, but Keras uses "
                         f"{keras.backend.backend()!r}: set KERAS_BACKEND=tensorflow before "
                         "keras is imported")
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    variables = model.trainable_variables
    # Keras scales the compiled loss by 1/replicas for its own all-reduce: undo it, the
    # per-example loss is what gets clipped.
    replicas = tf.distribute.get_strategy().num_replicas_in_sync

    def loss_fn(mb):
        xb, yb, swb = mb
        y_pred = model(xb, training=True)
        loss = model.compute_loss(x=xb, y=yb, y_pred=y_pred, sample_weight=swb, training=True)
        return loss * replicas, y_pred

    out = dp_gradients(loss_fn, variables, (x, y, sample_weight),
                       l2_norm_clip=model.l2_norm_clip, noise_multiplier=model.noise_multiplier,
                       seed=model.dp_seed, step=model.optimizer.iterations,
                       num_microbatches=model.num_microbatches)
    model.optimizer.apply_gradients(zip(out.grads, variables))
    y_pred = tf.nest.map_structure(_merge_microbatches, out.aux)
    tracker = getattr(model, "_loss_tracker", None)
    if tracker is not None:
        tracker.update_state(tf.reduce_mean(out.losses), sample_weight=tf.size(out.losses))
    return model.compute_metrics(x, y, y_pred, sample_weight)


def _is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and \
        strategy.extended._num_workers > 1


def _merge_microbatches(t: tf.Tensor) -> tf.Tensor:
    return tf.reshape(t, tf.concat([[-1], tf.shape(t)[2:]], 0))


DPSequential = make_dp_model_class(keras.Sequential)
DPModel = make_dp_model_class(keras.Model)

# }}}


# {{{ privacy accounting (dp-accounting)

def _accountant(name: str):
    import dp_accounting
    if name == "rdp":
        return dp_accounting.rdp.RdpAccountant()
    if name == "pld":
        return dp_accounting.pld.PLDAccountant()
    raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {name!r}")


def _dp_sgd_event(noise_multiplier: float, sampling_rate: float, steps: int):
    import dp_accounting
    return dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier)), steps)


def _check_accounting(sampling_rate: float, steps: int, delta: float) -> None:
    if not 0 < sampling_rate <= 1:
        raise ValueError(f"sampling_rate must be in (0, 1] (batch size / dataset size), "
                         f"got {sampling_rate!r}")
    if int(steps) != steps or steps < 0:
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def compute_epsilon(noise_multiplier: float, sampling_rate: float, steps: int, delta: float,
                    *, accountant: str = "rdp") -> float:
    """Epsilon of DP-SGD after ``steps`` Poisson-sampled Gaussian steps, at ``delta``.

    ``sampling_rate`` is the expected batch size over the dataset size (per microbatch
    clipping does not change it: one example still lands in one microbatch).  ``accountant``:
    ``"rdp"`` (Renyi DP, as TF Privacy reports) or ``"pld"`` (privacy loss distributions:
    tighter).

    Example:
        >>> round(compute_epsilon(1.1, 256 / 60000, 60000 // 256 * 60, 1e-5), 2)
        2.59
    """
    if not noise_multiplier >= 0:
        raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier!r}")
    _check_accounting(sampling_rate, steps, delta)
    acc = _accountant(accountant)
    acc.compose(_dp_sgd_event(noise_multiplier, sampling_rate, int(steps)))
    return float(acc.get_epsilon(delta))


def compute_noise_multiplier(target_epsilon: float, sampling_rate: float, steps: int,
                             delta: float, *, accountant: str = "rdp") -> float:
    """The smallest noise multiplier whose :func:`compute_epsilon` is at most ``target_epsilon``.

    Example:
        >>> sigma = compute_noise_multiplier(3.0, 256 / 60000, 14040, 1e-5)
        >>> compute_epsilon(sigma, 256 / 60000, 14040, 1e-5) <= 3.0
        True
    """
    import dp_accounting
    if not target_epsilon > 0:
        raise ValueError(f"target_epsilon must be > 0, got {target_epsilon!r}")
    _check_accounting(sampling_rate, steps, delta)
    _accountant(accountant)   # check the name before searching
    return float(dp_accounting.calibrate_dp_mechanism(
        lambda: _accountant(accountant),
        lambda sigma: _dp_sgd_event(sigma, sampling_rate, int(steps)),
        target_epsilon, delta, dp_accounting.LowerEndpointAndGuess(1e-2, 1.0), tol=1e-4))

# }}}
