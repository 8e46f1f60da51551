"""The workloads the distributed tests run, per strategy, in worker processes or in-process.

``python -m tests.distribute.workloads STRATEGY OUT_PREFIX CASE...`` builds the strategy
(``single``: one device; ``mirrored:N``: MirroredStrategy over N logical CPUs;
``multiworker``: :func:`tfx_vec.distribute.multi_worker_strategy` from ``TF_CONFIG``), runs each
case and writes ``OUT_PREFIX.<worker>.npz`` (arrays named ``case/name``) and
``OUT_PREFIX.<worker>.json`` (per case: "ok" or the traceback), so one failing case does not
hide the others.  The tests run the same functions in their own process with
``tf.distribute.get_strategy()`` as the one-device reference.

All data and initial weights come from fixed NumPy seeds; global batches are 12 examples
(divisible by 2 and 3 replicas).
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

GLOBAL_BATCH = 12
DP = dict(l2_norm_clip=0.7, noise_multiplier=1.1, seed=5)
CHAINS, RESULTS = 12, 20


def make_strategy(kind: str):
    import tensorflow as tf
    if kind == "single":
        return tf.distribute.get_strategy()
    if kind.startswith("mirrored:"):
        n = int(kind.split(":")[1])
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * n)
        return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
    if kind == "multiworker":
        from tfx_vec.distribute import multi_worker_strategy
        return multi_worker_strategy(join_timeout=60, heartbeat_timeout=10)
    raise ValueError(f"unknown strategy {kind!r}")


def _data(n=GLOBAL_BATCH * 2, d=6, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(0, 1.5, (n, d)).astype(np.float32),
            rng.integers(0, classes, n).astype(np.int32))


def _shards(strategy, *arrays):
    """The global arrays split over the replicas (replica r gets rows r*k .. r*k+k-1)."""
    k = arrays[0].shape[0] // strategy.num_replicas_in_sync

    def part(ctx):
        r = ctx.replica_id_in_sync_group
        return tuple(a[r * k:(r + 1) * k] for a in arrays)
    return strategy.experimental_distribute_values_from_function(part)


def _gather0(strategy, per_replica):
    import tensorflow as tf
    return tf.nest.map_structure(lambda t: strategy.gather(t, axis=0).numpy(), per_replica)


# {{{ cases: each returns {name: array}

def case_pfor(strategy, eager=False):
    """pfor (a per-example while loop and cond), vectorized_map, jacobian, per_example_gradients
    on each replica's examples; gathered in replica order."""
    import tensorflow as tf
    import tfx_vec

    x, y = _data(GLOBAL_BATCH)
    lengths = (np.arange(GLOBAL_BATCH) % 4).astype(np.int32)
    w0 = np.random.default_rng(1).normal(0, 0.5, (6, 3)).astype(np.float32)
    with strategy.scope():
        w = tf.Variable(w0)

    def body(xi, li):
        _, h = tf.while_loop(lambda t, h: t < li, lambda t, h: (t + 1, tf.tanh(h) + 0.5),
                             (0, xi))
        return tf.cond(tf.reduce_sum(h) > 0, lambda: h, lambda: -2.0 * h)

    def per_replica(xl, yl, ll):
        n = xl.shape[0]
        a = tfx_vec.pfor(lambda i: body(tf.gather(xl, i), tf.gather(ll, i)), n)
        b = tfx_vec.vectorized_map(lambda e: tf.tanh(tf.linalg.matvec(w, e, transpose_a=True)),
                                   xl)
        c = tfx_vec.jacobian(lambda v: tf.tanh(xl @ v), w)
        loss = lambda e: tf.nn.sparse_softmax_cross_entropy_with_logits(  # noqa: E731
            e[1], tf.linalg.matvec(w, e[0], transpose_a=True))
        d, = tfx_vec.per_example_gradients(loss, [w], (xl, yl))
        return a, b, c, d
    args = _shards(strategy, x, y, lengths)
    run = (lambda a: strategy.run(per_replica, args=a)) if eager else \
        tf.function(lambda a: strategy.run(per_replica, args=a))
    a, b, c, d = _gather0(strategy, run(args))
    return {"pfor": a, "vectorized_map": b, "jacobian": c, "per_example_gradients": d}


def case_pfor_eager(strategy):
    return case_pfor(strategy, eager=True)


def _dense_model(cls, **kw):
    import keras
    keras.utils.set_random_seed(3)
    return cls([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                keras.layers.Dense(3)], **kw)


def case_dp_fit(strategy):
    """DPSequential.fit: 2 epochs of 2 global batches, SGD with momentum."""
    import keras
    from tfx_vec.pfor.dp_sgd import DPSequential

    x, y = _data()
    with strategy.scope():
        model = _dense_model(DPSequential, **DP)
        model.compile(keras.optimizers.SGD(0.3, momentum=0.5),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    h = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    out = {f"w{k}": v.numpy() for k, v in enumerate(model.trainable_variables)}
    out["loss"] = np.array(h.history["loss"])
    return out


def case_dp_loop(strategy):
    """dp_gradients in a custom loop: strategy.run, Adam's apply_gradients per replica."""
    import keras
    import tensorflow as tf
    from tfx_vec.pfor.dp_sgd import dp_gradients

    x, y = _data()
    with strategy.scope():
        model = _dense_model(keras.Sequential)
        opt = keras.optimizers.Adam(0.05)
        opt.build(model.trainable_variables)   # slots made here, not inside strategy.run
    ds = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))

    def loss_fn(mb):
        # The loss of one microbatch, unscaled: a keras.losses.Loss object would divide its
        # mean by the number of replicas under a strategy (for Keras's own all-reduce).
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
            mb[1], model(mb[0], training=True), from_logits=True))

    def replica_step(xb, yb):
        out = dp_gradients(loss_fn, model.trainable_variables, (xb, yb), step=opt.iterations,
                           **DP)
        opt.apply_gradients(zip(out.grads, model.trainable_variables))
        return out.norms

    step = tf.function(lambda b: strategy.run(replica_step, args=b))
    norms = [_gather0(strategy, step(b)) for b in ds]
    out = {f"w{k}": v.numpy() for k, v in enumerate(model.trainable_variables)}
    out["norms"] = np.concatenate(norms)
    return out


def _gaussian_target(x):
    import tensorflow as tf
    scale = tf.constant([1.0, 0.5])
    return -0.5 * tf.reduce_sum((x / scale) ** 2, -1)


def nuts_kernel():
    from tfx_vec.autobatch import NoUTurnSampler
    return NoUTurnSampler(_gaussian_target, step_size=0.4, max_tree_depth=4)


def hmc_kernel():
    import tensorflow_probability as tfp
    return tfp.mcmc.HamiltonianMonteCarlo(_gaussian_target, step_size=0.4, num_leapfrog_steps=4)


def initial_chains():
    return np.random.default_rng(2).normal(0, 1, (CHAINS, 2)).astype(np.float32)


def case_nuts(strategy):
    """Chains sharded over replicas with tfx_vec's NUTS and with TFP's HMC; draws gathered."""
    from tfx_vec.distribute import sample_chains
    out = {"replicas": np.array(strategy.num_replicas_in_sync)}
    for name, kernel in (("nuts", nuts_kernel()), ("hmc", hmc_kernel())):
        res = sample_chains(RESULTS, initial_chains(), kernel, seed=(4, 2), strategy=strategy,
                            trace_fn=lambda _, kr: kr.is_accepted)
        out.update({f"{name}_draws": res.draws.numpy(), f"{name}_r_hat": res.r_hat.numpy(),
                    f"{name}_ess": res.ess.numpy(), f"{name}_accepted": res.trace.numpy()})
    return out


TC_EXPORT = "TFX_VEC_TEST_EXPORT"


def _tc_model():
    import keras
    from tfx_vec.tc_ops.keras import FusedMLP
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((6,)), FusedMLP([8, 3])])


def _tc_model_and_data(strategy):
    import keras
    x, _ = _data()
    with strategy.scope():
        model = _tc_model()
        opt = keras.optimizers.SGD(0.1)
        opt.build(model.trainable_variables)
    return model, opt, x, np.tanh(x[:, :3])


def _weights(model) -> dict:
    return {f"w{k}": v.numpy() for k, v in enumerate(model.trainable_variables)}


def case_tc_fit(strategy):
    """A FusedMLP (TC op) in model.fit (Keras 3's fit: one worker, any number of replicas)."""
    model, opt, x, target = _tc_model_and_data(strategy)
    with strategy.scope():
        model.compile(opt, "mse")
    # NumPy inputs: the per-replica batch is unknown when Keras traces the step
    h = model.fit(x, target, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    return dict(_weights(model), loss=np.array(h.history["loss"]))


def case_tc_loop(strategy):
    """The same model trained by a custom loop over strategy.run (any strategy, multi-worker
    included); worker 0 exports a SavedModel when TC_EXPORT is set."""
    import tensorflow as tf
    model, opt, x, target = _tc_model_and_data(strategy)
    ds = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(
        (x, target)).batch(GLOBAL_BATCH, drop_remainder=True))

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            err = model(xb, training=True) - yb
            # the optimizer sums the replicas' gradients: scale by the global batch
            loss = tf.reduce_sum(tf.reduce_mean(err * err, -1)) / GLOBAL_BATCH
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
        return loss

    step = tf.function(lambda b: strategy.run(replica_step, args=b))
    losses = [float(strategy.reduce("SUM", step(b), axis=None)) for _ in range(2) for b in ds]
    out = dict(_weights(model), loss=np.array(losses))
    export = os.environ.get(TC_EXPORT)
    if export and _worker_index() == 0:
        # Export the trained weights from a copy built outside the strategy (Keras 3 cannot
        # export mirrored variables of a multi-worker strategy) as a tf.Module.
        serving = _tc_model()
        serving.set_weights(model.get_weights())
        module = tf.Module()
        module.weights = [v.value for v in serving.weights]
        module.serve = tf.function(serving, input_signature=[
            tf.TensorSpec((GLOBAL_BATCH, 6), tf.float32)])
        tf.saved_model.save(module, export)
        out["serve_x"] = x[:GLOBAL_BATCH]
    return out

# }}}


def _worker_index() -> int:
    cfg = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    return int(cfg.get("task", {}).get("index", 0))


def run_cases(strategy, cases) -> tuple[dict, dict]:
    arrays, status = {}, {}
    for case in cases:
        start = time.perf_counter()
        try:
            for name, value in globals()[f"case_{case}"](strategy).items():
                arrays[f"{case}/{name}"] = np.asarray(value)
            status[case] = "ok"
            arrays[f"{case}/seconds"] = np.array(time.perf_counter() - start)
        except Exception:  # noqa: BLE001 -- reported per case to the test
            status[case] = traceback.format_exc()
    return arrays, status


def main(argv: list[str]) -> int:
    kind, prefix, cases = argv[0], argv[1], argv[2:]
    strategy = make_strategy(kind)
    arrays, status = run_cases(strategy, cases)
    i = _worker_index()
    np.savez(f"{prefix}.{i}.npz", **arrays)
    with open(f"{prefix}.{i}.json", "w") as f:
        json.dump(status, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
