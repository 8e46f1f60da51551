"""A corpus of batched programs shared by the autobatch tests, and the per-member reference.

Each entry of ``CASES`` is (name, ab.function, inputs builder): inputs are drawn from a NumPy
generator, never all zeros, with very different amounts of work per member.
"""
import collections

import numpy as np
import tensorflow as tf

from tfx_vec import autobatch as ab


# One of each runtime (the program-counter one as a graph and under XLA).
EVERY_RUNTIME = {"local_static": {"runtime": "local_static"}, "numpy": {"runtime": "numpy"},
                 "program_counter": {}, "program_counter_xla": {"jit_compile": True}}


def on_every_runtime(fn, *args, **options):
    """``fn(*args)`` on each runtime: ``{runtime: result as NumPy}``."""
    return {name: tf.nest.map_structure(np.asarray, fn(*args, **opts, **options))
            for name, opts in EVERY_RUNTIME.items()}


def reference(fn, *args):
    """The definitional reference: the undecorated Python function on each member, eagerly."""
    batch = tf.nest.flatten(args)[0].shape[0]
    outs = [fn.unbatched(*tf.nest.map_structure(lambda a: tf.convert_to_tensor(a)[b], args))
            for b in range(batch)]
    return tf.nest.map_structure(lambda *xs: np.stack([np.asarray(x) for x in xs]), *outs)


@ab.function(max_stack_depth=32)
def fib(n):
    if n <= 1:
        return tf.ones_like(n)
    return fib(n - 2) + fib(n - 1)


@ab.function
def is_even(n):
    if n == 0:
        return tf.ones_like(n, tf.bool)
    return is_odd(n - 1)


@ab.function
def is_odd(n):
    if n == 0:
        return tf.zeros_like(n, tf.bool)
    return is_even(n - 1)


@ab.function
def collatz(n):
    steps = tf.zeros_like(n)
    while n > 1:
        if n % 2 == 0:
            n = n // 2
        else:
            n = 3 * n + 1
        steps += 1
    return steps


@ab.function
def nested_loops(n, m):
    total = tf.zeros_like(n)
    for i in range(n):
        if i % 3 == 1:
            continue
        j = tf.zeros_like(n)
        while True:
            j += 1
            if j > m or j > i:
                break
            total += i * j
        if total > 60:
            break
    return total


@ab.function
def first_divisor(n):
    for d in range(2, n):
        if n % d == 0:
            return d
    return n


@ab.function(max_stack_depth=64)
def ackermann(m, n):
    if m == 0:
        return n + 1
    if n == 0:
        return ackermann(m - 1, tf.ones_like(n))
    return ackermann(m - 1, ackermann(m, n - 1))


State = collections.namedtuple("State", "x v")


def rotate(state, dt):
    """An ordinary TF function: a primitive called from a batched function."""
    return State(state.x + dt * state.v, state.v - dt * state.x)


@ab.function
def oscillate(state, steps):
    k = tf.zeros_like(steps)
    while k < steps:
        state = rotate(state, 0.25)
        k += 1
    return state, k


@ab.function
def sum_and_depth(n):
    if n <= 0:
        return tf.zeros_like(n), tf.zeros_like(n)
    s, d = sum_and_depth(n - 1)
    return s + n, d + 1


@ab.function
def square(x):
    return x * x


@ab.function
def clamp_abs(x):
    if x < 0.0:
        x = -x
    y = square(x) + tf.sin(x)
    if not (y > 0.5 and y < 4.0) or x > 1.7:
        y = tf.ones_like(y)
    return y


def make_affine(scale, offset):
    """Closures over constants, and recursion through a closure cell."""
    @ab.function
    def affine_sum(n, x):
        if n <= 0:
            return x
        return affine_sum(n - 1, x * scale + offset)
    return affine_sum


affine_sum = make_affine(0.5, 1.25)


def _ints(rng, b, lo, hi):
    a = rng.integers(lo, hi, size=b).astype(np.int32)
    a[0] = hi - 1  # at least one member does the most work
    return (a,)


CASES = [
    ("fib", fib, lambda rng, b: _ints(rng, b, 0, 12)),
    ("is_even", is_even, lambda rng, b: _ints(rng, b, 0, 20)),
    ("collatz", collatz, lambda rng, b: _ints(rng, b, 1, 40)),
    ("nested_loops", nested_loops,
     lambda rng, b: _ints(rng, b, 0, 12) + _ints(rng, b, 1, 5)),
    ("first_divisor", first_divisor, lambda rng, b: _ints(rng, b, 2, 60)),
    ("ackermann", ackermann,
     lambda rng, b: (rng.integers(0, 3, size=b).astype(np.int32),
                     rng.integers(0, 4, size=b).astype(np.int32))),
    ("oscillate", oscillate,
     lambda rng, b: (State(rng.uniform(-1, 1, (b, 3)).astype(np.float32),
                           rng.uniform(-1, 1, (b, 3)).astype(np.float32)),
                     rng.integers(0, 9, size=b).astype(np.int32))),
    ("sum_and_depth", sum_and_depth, lambda rng, b: _ints(rng, b, -2, 9)),
    ("clamp_abs", clamp_abs, lambda rng, b: (rng.uniform(-2, 2, b).astype(np.float32),)),
    ("affine_sum", affine_sum,
     lambda rng, b: _ints(rng, b, 0, 6) + (rng.uniform(-2, 2, (b, 2)).astype(np.float32),)),
]
