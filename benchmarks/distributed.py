"""1 vs 2 worker processes (MultiWorkerMirroredStrategy on 127.0.0.1) for DP-SGD and NUTS.

Each configuration starts its workers with :func:`tfx_vec.distribute.run_local_cluster`; every
worker builds the strategy with :func:`tfx_vec.distribute.multi_worker_strategy` (one CPU
replica per worker), warms up, then times its loop; worker 0 writes the numbers.  The same
global work is split over the workers (strong scaling):

- ``dp_sgd conv``: DP-SGD steps of the conv model of ``benchmarks/dp_sgd.py`` (26k parameters)
  on a global batch of 256 (``--quick``: 64), examples/s; each replica clips its own examples,
  the gradient is all-reduced once per step.
- ``nuts``: ``tfx_vec.autobatch.NoUTurnSampler`` chains (100-d Gaussian with log-spaced scales)
  sharded over the replicas by :func:`tfx_vec.distribute.sample_chains`, gradients the chains
  took per second; no communication until the draws are gathered at the end.

Communication per step is read from the traced step itself: the collective ops in the graph
(and the functions it calls) and the bytes of their inputs.  This machine has 2 cores, so two
worker processes share the cores one process had: the scaling column shows what communication
and per-process overhead cost here, not what N machines would gain (the docs work that out
from the measured volume).

Run: ``.venv/bin/python -m benchmarks [--quick] distributed``.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import Report

WORKERS = (1, 2)
_ROOT = Path(__file__).resolve().parent.parent


def _sizes(quick: bool) -> dict:
    return (dict(batch=64, steps=5, chains=32, results=5, dim=20) if quick else
            dict(batch=256, steps=20, chains=128, results=20, dim=100))


# {{{ worker side

def collective_bytes(concrete) -> tuple[int, int]:
    """(collective ops, bytes of their inputs) in a concrete function and what it calls."""
    seen, ops, nbytes = set(), 0, 0
    graphs = [concrete.graph]
    while graphs:
        g = graphs.pop()
        if id(g) in seen:
            continue
        seen.add(id(g))
        for op in g.get_operations():
            if op.type.startswith("Collective") and op.inputs:
                t = op.inputs[0]
                ops += 1
                nbytes += int(t.shape.num_elements() or 0) * t.dtype.size
        for f in getattr(g, "_functions", {}).values():
            sub = getattr(f, "graph", None)
            if sub is not None:
                graphs.append(sub)
    return ops, nbytes


def _dp_sgd(strategy, sizes) -> dict:
    import keras
    import tensorflow as tf
    from benchmarks import dp_sgd as bench
    from tfx_vec.pfor.dp_sgd import dp_gradients

    batch = bench.synthetic_batch(sizes["batch"])
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = bench.conv_model()
        opt = keras.optimizers.SGD(bench.LR)
        opt.build(model.trainable_variables)
    ds = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(batch).repeat())
    it = iter(ds)

    def replica_step(x, y):
        out = dp_gradients(lambda mb: bench._xent(mb[1], model(mb[0], training=True)),
                           model.trainable_variables, (x, y), l2_norm_clip=bench.CLIP,
                           noise_multiplier=bench.SIGMA, seed=bench.SEED, step=opt.iterations)
        opt.apply_gradients(zip(out.grads, model.trainable_variables))
        return tf.reduce_sum(out.norms)

    step = tf.function(lambda b: strategy.run(replica_step, args=b))
    first = next(it)
    ops, nbytes = collective_bytes(step.get_concrete_function(first))
    for _ in range(2):
        strategy.experimental_local_results(step(next(it)))[0].numpy()
    start = time.perf_counter()
    for _ in range(sizes["steps"]):
        r = step(next(it))
    strategy.experimental_local_results(r)[0].numpy()
    seconds = time.perf_counter() - start
    params = sum(int(v.shape.num_elements()) for v in model.trainable_variables)
    return dict(value=sizes["steps"] * sizes["batch"] / seconds, collective_ops=ops,
                collective_bytes=nbytes, params=params)


def _nuts(strategy, sizes) -> dict:
    import numpy as np
    import tensorflow as tf
    from tfx_vec.autobatch import NoUTurnSampler
    from tfx_vec.distribute import sample_chains

    d = sizes["dim"]
    scales = tf.constant(np.logspace(-1, 0, d).astype(np.float32))
    kernel = NoUTurnSampler(lambda x: -0.5 * tf.reduce_sum((x / scales) ** 2, -1),
                            step_size=0.08, max_tree_depth=10)
    x0 = (np.random.default_rng(0).normal(size=(sizes["chains"], d)) * scales.numpy()
          ).astype(np.float32)
    trace = lambda _, kr: kr.total_leapfrogs_taken  # noqa: E731
    sample_chains(sizes["results"], x0, kernel, seed=(1, 2), strategy=strategy,
                  trace_fn=trace, jit_compile=True)             # trace and compile
    start = time.perf_counter()
    out = sample_chains(sizes["results"], x0, kernel, seed=(3, 4), strategy=strategy,
                        trace_fn=trace, jit_compile=True)
    seconds = time.perf_counter() - start
    leapfrogs = out.trace.numpy()
    gradients = float(np.sum(leapfrogs[-1]))   # cumulative per chain over this call
    draws_bytes = int(np.prod(out.draws.shape)) * 4
    return dict(value=gradients / seconds, collective_ops=0, collective_bytes=0,
                gather_bytes=draws_bytes, min_ess=float(np.min(out.ess)),
                max_r_hat=float(np.max(out.r_hat)))


def worker_main(out: str, quick: bool) -> int:
    from tfx_vec.distribute import multi_worker_strategy
    strategy = multi_worker_strategy(join_timeout=120, heartbeat_timeout=30)
    sizes = _sizes(quick)
    result = {"dp_sgd conv": _dp_sgd(strategy, sizes), "nuts": _nuts(strategy, sizes),
              "sizes": sizes}
    if strategy.cluster_resolver.task_id == 0:
        Path(out).write_text(json.dumps(result))
    return 0

# }}}


def run(quick: bool) -> Report:
    from tfx_vec.distribute import run_local_cluster
    sizes = _sizes(quick)
    report = Report("distributed", unit="items/s", ours="2 workers", higher_is_better=True,
                    notes=f"MultiWorkerMirroredStrategy, worker processes on 127.0.0.1, one "
                          f"CPU replica each, on a 2-core machine; strong scaling ({sizes}). "
                          f"dp_sgd: examples/s; nuts: gradients/s. Ratio = 2 workers / 1 worker.")
    env = dict(os.environ, PYTHONPATH=str(_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in WORKERS:
            out = os.path.join(tmp, f"w{w}.json")
            run_local_cluster([sys.executable, "-m", "benchmarks.distributed", "--worker", out]
                              + (["--quick"] if quick else []), w, timeout=1200, env=env,
                              cwd=str(_ROOT))
            results[w] = json.loads(Path(out).read_text())
    name = {1: "1 worker", 2: "2 workers"}
    for case in ("dp_sgd conv", "nuts"):
        for w in WORKERS:
            r = results[w][case]
            report.add(case, name[w], r["value"],
                       **{k: v for k, v in r.items() if k != "value"})
    comm = results[2]["dp_sgd conv"]
    report.notes += (f"\nDP-SGD per step: {comm['collective_ops']} collective op(s) carrying "
                     f"{comm['collective_bytes']} bytes ({comm['params']} parameters x 4 bytes "
                     f"+ the example count); NUTS: none while sampling, one all-gather of "
                     f"{results[2]['nuts']['gather_bytes']} bytes of draws at the end.")
    return report


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker_main(sys.argv[2], "--quick" in sys.argv[3:]))
    sys.exit("usage: python -m benchmarks distributed (this module's --worker is internal)")
