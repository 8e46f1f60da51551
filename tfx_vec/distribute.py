"""Past one machine: tfx_vec workloads on ``tf.distribute`` strategies.

tfx_vec's transformations (``pfor``, ``vectorized_map``, ``jacobian``, ``per_example_gradients``,
DP-SGD, the autobatched NUTS kernel, TC ops and layers) emit ordinary TF ops, so they run per
replica inside ``strategy.run`` like any TF code.  This module adds what a multi-machine run
needs around them, built on TensorFlow's own engine:

1. :func:`multi_worker_strategy` -- a ``MultiWorkerMirroredStrategy`` whose start-up and peer
   failures are bounded in time: a worker that never starts gives :class:`ClusterError` after
   ``join_timeout`` seconds, a worker that dies makes the others' next collective fail within
   ``heartbeat_timeout`` seconds (TF's coordination service), never a hang.
2. :func:`sample_chains` -- MCMC chains sharded over the replicas (a ``tfp.mcmc`` kernel or
   ``tfx_vec.autobatch.NoUTurnSampler``; one seed per replica, :func:`replica_seed`), the draws
   gathered on every worker, split R-hat and ESS over all chains.
3. :func:`run_local_cluster` -- N worker processes on 127.0.0.1 (``TF_CONFIG`` with free ports
   picked at run time), each bounded by a deadline, all of them killed and reaped on the way
   out; how the tests and benchmarks start multi-worker runs on one machine.

Example:
    >>> import tensorflow as tf, tensorflow_probability as tfp
    >>> kernel = tfp.mcmc.HamiltonianMonteCarlo(
    ...     lambda x: -0.5 * tf.reduce_sum(x * x, -1), step_size=0.5, num_leapfrog_steps=3)
    >>> out = sample_chains(50, tf.zeros([4, 2]), kernel, seed=(1, 2))
    >>> out.draws.shape.as_list(), out.r_hat.shape.as_list()
    ([50, 4, 2], [2])
"""
from __future__ import annotations

import collections
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from typing import Any, Callable, Sequence

import tensorflow as tf

__all__ = ["ClusterError", "WorkerFailedError", "multi_worker_strategy", "ShardedChains",
           "sample_chains", "replica_seed", "WorkerResult", "free_ports", "run_local_cluster"]


class ClusterError(RuntimeError):
    """The cluster did not form: a worker never started, or TF_CONFIG is missing or wrong.

    Example::

        try:
            strategy = multi_worker_strategy(join_timeout=30)
        except ClusterError as e:   # "... worker 1 did not join ..."
            sys.exit(f"no cluster: {e}")
    """


class WorkerFailedError(RuntimeError):
    """A worker process of :func:`run_local_cluster` failed or ran past its deadline.

    ``results`` holds every worker's :class:`WorkerResult`; the message has each one's exit
    code and the last lines of its log.

    Example:
        >>> import sys
        >>> try:
        ...     run_local_cluster([sys.executable, "-c", "raise SystemExit(3)"], 1, timeout=30)
        ... except WorkerFailedError as e:
        ...     print(e.results[0].returncode)
        3
    """

    def __init__(self, message: str, results: Sequence["WorkerResult"]):
        super().__init__(message)
        self.results = list(results)


# {{{ a multi-worker strategy with bounded start-up and failure detection

def multi_worker_strategy(*, join_timeout: float = 60.0, heartbeat_timeout: float = 10.0,
                          collective_timeout: float | None = None,
                          cluster_resolver: Any = None) -> tf.distribute.Strategy:
    """``tf.distribute.MultiWorkerMirroredStrategy`` with time bounds on start-up and failures.

    Call it first thing in each worker process, before TensorFlow runs any op (as for
    ``MultiWorkerMirroredStrategy`` itself); the cluster comes from ``TF_CONFIG`` unless a
    ``cluster_resolver`` is given.

    Args:
      join_timeout: seconds to wait for every worker to register with the cluster's
        coordination service; past it, :class:`ClusterError` names the missing workers.
      heartbeat_timeout: seconds without a heartbeat after which a peer counts as dead: the
        collectives of the surviving workers then fail with ``tf.errors.UnavailableError``
        ("The following tasks are unhealthy ...") instead of waiting for it forever.
      collective_timeout: optional bound on any single collective (``CommunicationOptions``);
        None leaves collectives unbounded (a slow but alive peer is not an error).

    Raises:
      ClusterError: no cluster in ``TF_CONFIG``, TF's runtime already started in this process,
        or a worker that did not join within ``join_timeout``.

    Example::

        # in every worker, TF_CONFIG set: {"cluster": {"worker": [...]}, "task": {...}}
        strategy = multi_worker_strategy(join_timeout=60, heartbeat_timeout=10)
        with strategy.scope():
            model = make_model()
    """
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    resolver = cluster_resolver or tf.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    if not spec.jobs:
        raise ClusterError("multi_worker_strategy: no cluster; set TF_CONFIG to "
                           '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": '
                           '"worker", "index": i}} in every worker (see docs/distributed.md)')
    ctx = context.context()
    if getattr(ctx, "_context_handle", None) is not None:
        raise ClusterError("multi_worker_strategy: TensorFlow's runtime already started in this "
                           "process; create the strategy before running any TF op")
    jobs = [coordination_config_pb2.CoordinatedJob(name=j, num_tasks=spec.num_tasks(j))
            for j in ("chief", "worker") if j in spec.jobs]
    ctx.configure_coordination_service(
        service_type="standalone", service_leader=multi_worker_util.coordination_leader(spec),
        cluster_register_timeout_in_ms=int(join_timeout * 1000),
        heartbeat_timeout_in_ms=int(heartbeat_timeout * 1000),
        shutdown_barrier_timeout_in_ms=int(heartbeat_timeout * 1000), coordinated_jobs=jobs)
    # Registration as a barrier: without it, a worker whose peer never starts waits forever.
    ctx.coordination_service.cluster_register_with_barrier = True
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=collective_timeout)
    try:
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver,
                                                         communication_options=options)
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as e:
        missing = sorted(set(re.findall(r"/job:(\w+)/replica:0/task:(\d+)\n", str(e))))
        who = ", ".join(f"{job} {task}" for job, task in missing) or "some worker"
        raise ClusterError(
            f"multi_worker_strategy: the cluster did not form within {join_timeout:g} s: "
            f"{who} did not join ({resolver.task_type} {resolver.task_id} waited). Check that "
            "every worker was started with the same TF_CONFIG cluster and its own task index, "
            "and that the addresses are reachable") from e

# }}}


# {{{ MCMC chains sharded over replicas

ShardedChains = collections.namedtuple("ShardedChains", ["draws", "trace", "r_hat", "ess"])
ShardedChains.__doc__ = """What :func:`sample_chains` returns, the same on every worker.

``draws``: the states ``[num_results, num_chains, ...]`` (a list for a list state), chains in
replica order (replica ``r`` ran chains ``r*k .. r*k+k-1``, ``k = num_chains / replicas``).
``trace``: ``trace_fn``'s outputs gathered along their chain axis 1 (None without trace_fn).
``r_hat``: split potential scale reduction over all chains, per coordinate.
``ess``: effective sample size over all chains (cross-chain), per coordinate.

Example::

    out = sample_chains(500, x0, kernel, seed=(1, 2), strategy=strategy)
    assert float(tf.reduce_max(out.r_hat)) < 1.01
"""


def replica_seed(seed: Any, replica_id: int | tf.Tensor) -> tf.Tensor:
    """The stateless seed replica ``replica_id`` of :func:`sample_chains` samples with.

    Example:
        >>> replica_seed((1, 2), 0).shape.as_list()
        [2]
    """
    from tensorflow_probability.python.internal import samplers
    return tf.random.experimental.stateless_fold_in(
        tf.cast(samplers.sanitize_seed(seed), tf.int32), tf.cast(replica_id, tf.int32))


def sample_chains(num_results: int, current_state: Any, kernel: Any, *, seed: Any,
                  strategy: tf.distribute.Strategy | None = None, num_burnin_steps: int = 0,
                  num_steps_between_results: int = 0,
                  trace_fn: Callable[[Any, Any], Any] | None = None,
                  jit_compile: bool = False) -> ShardedChains:
    """``tfp.mcmc.sample_chain`` with the chains sharded over the replicas of ``strategy``.

    Args:
      num_results, num_burnin_steps, num_steps_between_results: as in ``sample_chain``.
      current_state: the initial state of ALL chains, a tensor or list of tensors with leading
        size ``num_chains`` (a multiple of the number of replicas).
      kernel: a ``tfp.mcmc.TransitionKernel`` (for example ``tfx_vec.autobatch.
        NoUTurnSampler`` or ``tfp.mcmc.NoUTurnSampler``) whose target takes a batch of chains;
        every replica runs it on its own chains.
      seed: the run's stateless seed; replica ``r`` samples with ``replica_seed(seed, r)``.
      strategy: default: the current one (``tf.distribute.get_strategy()``: one device).
      trace_fn: as in ``sample_chain``; its outputs must keep the chain axis (axis 1 of the
        traced result, e.g. ``lambda _, kr: kr.is_accepted``).
      jit_compile: compile each replica's sampling loop with XLA.

    Returns:
      :class:`ShardedChains` on every worker (the draws travel once, at the end: sampling
      itself needs no communication).

    Raises:
      ValueError: ``num_chains`` not divisible by the number of replicas.

    Example:
        >>> import tensorflow_probability as tfp
        >>> kernel = tfp.mcmc.RandomWalkMetropolis(lambda x: -0.5 * tf.reduce_sum(x * x, -1))
        >>> sample_chains(20, tf.zeros([6, 3]), kernel, seed=(5, 6)).draws.shape.as_list()
        [20, 6, 3]
    """
    import tensorflow_probability as tfp

    strategy = strategy or tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    state = tf.nest.map_structure(tf.convert_to_tensor, current_state)
    num_chains = int(tf.nest.flatten(state)[0].shape[0])
    if num_chains % replicas:
        raise ValueError(f"sample_chains: {num_chains} chains do not split evenly over "
                         f"{replicas} replicas; use a multiple of {replicas}")
    per_replica = num_chains // replicas
    local_state = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.nest.map_structure(
            lambda t: t[ctx.replica_id_in_sync_group * per_replica:
                        (ctx.replica_id_in_sync_group + 1) * per_replica], state))
    sample = _replica_sampler(kernel, (num_results, num_burnin_steps, num_steps_between_results,
                                       trace_fn, jit_compile))
    from tensorflow_probability.python.internal import samplers
    seed = tf.convert_to_tensor(samplers.sanitize_seed(seed), tf.int32)
    draws, trace = strategy.run(sample, args=(local_state, seed))
    draws = tf.nest.map_structure(lambda t: strategy.gather(t, axis=1), draws)
    trace = None if trace_fn is None else tf.nest.map_structure(
        lambda t: _gather_chain_axis(strategy, t), trace)
    r_hat = tfp.mcmc.potential_scale_reduction(draws, split_chains=True)
    ess = tfp.mcmc.effective_sample_size(draws, cross_chain_dims=1)
    return ShardedChains(draws, trace, r_hat, ess)


_samplers: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def _replica_sampler(kernel: Any, options: tuple) -> Callable:
    """One replica's ``sample_chain`` as a ``tf.function``, kept per kernel and options so that
    a second call with the same shapes runs without tracing again."""
    import tensorflow_probability as tfp

    per_kernel = _samplers.setdefault(kernel, {})
    if options not in per_kernel:
        num_results, burnin, between, trace_fn, jit_compile = options

        def sample(local, seed):
            rid = tf.distribute.get_replica_context().replica_id_in_sync_group
            return tfp.mcmc.sample_chain(
                num_results, local, kernel=kernel, num_burnin_steps=burnin,
                num_steps_between_results=between, trace_fn=trace_fn or (lambda *_: ()),
                seed=replica_seed(seed, rid))
        per_kernel[options] = tf.function(sample, jit_compile=jit_compile, autograph=False)
    return per_kernel[options]


def _gather_chain_axis(strategy: tf.distribute.Strategy, t: Any) -> tf.Tensor:
    local = strategy.experimental_local_results(t)[0]
    rank = local.shape.rank
    if rank is None or rank < 2:
        raise ValueError("sample_chains: trace_fn outputs need a chain axis (axis 1 of the "
                         f"traced result); got a result of rank {rank}")
    if local.dtype == tf.bool:   # collectives carry numbers only
        t = strategy.run(lambda v: tf.cast(v, tf.int32), args=(t,))
        return tf.cast(strategy.gather(t, axis=1), tf.bool)
    return strategy.gather(t, axis=1)

# }}}


# {{{ N worker processes on this machine

WorkerResult = collections.namedtuple("WorkerResult", ["index", "pid", "returncode", "log",
                                                       "seconds", "killed"])
WorkerResult.__doc__ = """One worker of :func:`run_local_cluster`: its exit code (negative:
killed by that signal), its combined stdout/stderr, its run time, and whether the launcher
killed it (deadline passed, or a peer failed and it did not stop by itself in time).

Example:
    >>> import sys
    >>> (r,) = run_local_cluster([sys.executable, "-c", "print(1)"], 1, timeout=30)
    >>> r.returncode, r.killed
    (0, False)
"""


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (all bound at once, then released).

    Example:
        >>> len(set(free_ports(3)))
        3
    """
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def run_local_cluster(argv: Sequence[str], num_workers: int, *, timeout: float,
                      grace: float = 20.0, env: dict | None = None, cwd: str | None = None,
                      tf_config: bool = True, absent: Sequence[int] = (),
                      check: bool = True) -> list[WorkerResult]:
    """Run ``argv`` as ``num_workers`` processes on 127.0.0.1, one ``TF_CONFIG`` each.

    Every worker gets ``TF_CONFIG`` with the same cluster (free ports picked now) and its own
    task index, in a session of its own.  The launcher returns when all have exited; when one
    fails, the others get ``grace`` seconds to stop by themselves (a multi-worker strategy
    notices a dead peer by its heartbeat) before they are killed; at ``timeout`` every worker
    still running is killed.  Workers are always killed and reaped before returning.

    Args:
      argv: the command (e.g. ``[sys.executable, "-m", "my.worker"]``).
      tf_config: False runs the processes without a cluster (single-process jobs).
      absent: indices that are part of the cluster but never started (fault tests).
      check: raise :class:`WorkerFailedError` when a worker failed or was killed.

    Example:
        >>> import sys
        >>> out = run_local_cluster([sys.executable, "-c", "print('hi')"], 2, timeout=30)
        >>> [(r.index, r.returncode, r.log.strip()) for r in out]
        [(0, 0, 'hi'), (1, 0, 'hi')]
    """
    ports = free_ports(num_workers)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    start = time.monotonic()
    procs: dict[int, tuple[subprocess.Popen, Any]] = {}
    ended: dict[int, float] = {}
    killed: set[int] = set()
    try:
        for i in range(num_workers):
            if i in absent:
                continue
            wenv = dict(os.environ if env is None else env)
            if tf_config:
                wenv["TF_CONFIG"] = json.dumps({"cluster": cluster,
                                                "task": {"type": "worker", "index": i}})
            log = tempfile.TemporaryFile("w+")
            procs[i] = (subprocess.Popen(list(argv), env=wenv, cwd=cwd, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True), log)
        first_failure = None
        while len(ended) < len(procs):
            now = time.monotonic()
            for i, (p, _) in procs.items():
                if i not in ended and p.poll() is not None:
                    ended[i] = now - start
                    if p.returncode != 0 and first_failure is None:
                        first_failure = now
            overdue = now - start > timeout or (
                first_failure is not None and now - first_failure > grace)
            if overdue:
                for i, (p, _) in procs.items():
                    if i not in ended:
                        _kill(p)
                        killed.add(i)
                        ended[i] = now - start
                break
            time.sleep(0.1)
    finally:
        for i, (p, _) in procs.items():
            if p.poll() is None:
                _kill(p)
                killed.add(i)
            p.wait()
    results = []
    for i, (p, log) in sorted(procs.items()):
        log.seek(0)
        results.append(WorkerResult(i, p.pid, p.returncode, log.read(), ended.get(i, 0.0),
                                    i in killed))
        log.close()
    if check and any(r.returncode != 0 or r.killed for r in results):
        raise WorkerFailedError(_failure_report(results, timeout), results)
    return results


def _kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _failure_report(results: Sequence[WorkerResult], timeout: float) -> str:
    lines = ["local cluster failed:"]
    for r in results:
        state = ("killed by the launcher (still running past its deadline or after a peer "
                 "failed)" if r.killed else f"exit code {r.returncode}")
        tail = "\n".join("    " + line for line in r.log.strip().splitlines()[-15:])
        lines.append(f"  worker {r.index}: {state} after {r.seconds:.1f} s "
                     f"(timeout {timeout:g} s); last lines:\n{tail}")
    return "\n".join(lines)

# }}}
