"""A corpus of batched programs shared by the autobatch tests, and the per-member reference."""
import numpy as np
import tensorflow as tf

from tfx_vec import autobatch as ab


def reference(fn, *args):
    """The definitional reference: the undecorated Python function on each member's slice."""
    batch = tf.nest.flatten(args)[0].shape[0]
    outs = [fn.unbatched(*tf.nest.map_structure(lambda a: a[b:b + 1], args)) for b in range(batch)]
    return tf.nest.map_structure(lambda *xs: np.concatenate([np.asarray(x) for x in xs]), *outs)


@ab.function(max_stack_depth=32)
def fib(n):
    if n <= 1:
        return tf.ones_like(n)
    return fib(n - 2) + fib(n - 1)
