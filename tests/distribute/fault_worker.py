"""A worker for the fault tests: ``python -m tests.distribute.fault_worker join|die``.

``join``: form the cluster (short timeouts) and do one all-reduce.  ``die``: worker 1 exits
abruptly after the first step; the others keep stepping and must see the failure as an error.
Exit codes: 0 done, 2 peer failure detected (``UnavailableError``), 3 ``ClusterError``.
"""
import json
import os
import sys
import time

JOIN_TIMEOUT, HEARTBEAT_TIMEOUT = 5.0, 3.0


def main(mode: str) -> int:
    from tfx_vec.distribute import ClusterError, multi_worker_strategy
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    try:
        strategy = multi_worker_strategy(join_timeout=JOIN_TIMEOUT,
                                         heartbeat_timeout=HEARTBEAT_TIMEOUT)
    except ClusterError as e:
        print(f"ClusterError: {e}", flush=True)
        return 3
    import tensorflow as tf
    import tfx_vec
    w = tf.constant([[1.0, 2.0], [3.0, 4.0]])

    @tf.function
    def step():
        def replica():
            g, = tfx_vec.per_example_gradients(lambda x: tf.reduce_sum(tf.tanh(tf.linalg.matvec(w, x))),
                                               [w], tf.ones([4, 2]))
            return tf.distribute.get_replica_context().all_reduce("SUM", g)
        return strategy.run(replica)
    step()
    print("JOINED", flush=True)
    if mode == "die" and index == 1:
        os._exit(7)
    start = time.monotonic()
    try:
        for _ in range(300):
            step()
            time.sleep(0.1)
    except tf.errors.UnavailableError as e:
        print(f"PEER_FAILURE_DETECTED after {time.monotonic() - start:.1f} s: "
              f"{' '.join(str(e).split())}", flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
