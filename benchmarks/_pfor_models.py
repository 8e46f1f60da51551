"""Single-example models shared by the pfor application benchmarks (paper §6).

Every model is written for ONE example (no batch axis), as a user of pfor writes it: an LSTM
(statically unrolled, or a ``tf.while_loop`` to a run-time length), the paper's MNIST convnet
(two conv-relu-maxpool blocks, dense-relu, dense) and a small VGG-style convnet.
Parameters are plain ``tf.Variable`` lists built from a fixed seed.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf


def _var(rng: np.random.Generator, shape, scale=None) -> tf.Variable:
    scale = scale if scale is not None else 1.0 / np.sqrt(max(1, np.prod(shape[:-1])))
    return tf.Variable(rng.normal(0.0, scale, size=shape).astype(np.float32))


# {{{ LSTM

def lstm_params(d_in: int, d_h: int, d_out: int = 0, seed: int = 0) -> list[tf.Variable]:
    rng = np.random.default_rng(seed)
    params = [_var(rng, [d_in + d_h, 4 * d_h]), tf.Variable(tf.zeros([4 * d_h]))]
    if d_out:
        params.append(_var(rng, [d_h, d_out]))
    return params


def lstm_cell(params, x, h, c):
    w, b = params[0], params[1]
    z = tf.linalg.matvec(w, tf.concat([x, h], 0), transpose_a=True) + b
    i, f, g, o = tf.split(z, 4)
    c = tf.sigmoid(f + 1.0) * c + tf.sigmoid(i) * tf.tanh(g)
    return tf.sigmoid(o) * tf.tanh(c), c


def _state(params):
    d_h = params[1].shape[0] // 4
    return tf.zeros([d_h]), tf.zeros([d_h])


def lstm_unrolled(params, xs: tf.Tensor, steps: int) -> tf.Tensor:
    """``xs: [steps, d_in]`` -> final hidden state ``[d_h]`` (Python-unrolled)."""
    h, c = _state(params)
    for t in range(steps):
        h, c = lstm_cell(params, xs[t], h, c)
    return h


def lstm_while(params, xs: tf.Tensor, length: tf.Tensor, bounded: bool = False) -> tf.Tensor:
    """``xs: [T, d_in]`` -> hidden state after ``length`` steps (a ``tf.while_loop``).

    ``bounded``: ``maximum_iterations=T``, which XLA needs to compile the loop's gradient
    (its accumulators get a fixed size); the other implementations run the plain loop.
    """
    h, c = _state(params)

    def body(t, h, c):
        h, c = lstm_cell(params, tf.gather(xs, t), h, c)
        return t + 1, h, c
    bound = {"maximum_iterations": tf.shape(xs)[0]} if bounded else {}
    _, h, _ = tf.while_loop(lambda t, h, c: t < length, body, (tf.constant(0), h, c), **bound)
    return h

# }}}


# {{{ convnets

def mnist_params(channels=(32, 64), hidden=1024, seed=0) -> list[tf.Variable]:
    rng = np.random.default_rng(seed)
    c1, c2 = channels
    return [_var(rng, [5, 5, 1, c1]), tf.Variable(tf.zeros([c1])),
            _var(rng, [5, 5, c1, c2]), tf.Variable(tf.zeros([c2])),
            _var(rng, [7 * 7 * c2, hidden]), tf.Variable(tf.zeros([hidden])),
            _var(rng, [hidden, 10]), tf.Variable(tf.zeros([10]))]


def mnist_logits(params, image: tf.Tensor) -> tf.Tensor:
    """``image: [28, 28, 1]`` -> ``[10]``."""
    k1, b1, k2, b2, w3, b3, w4, b4 = params
    h = image[None]
    for k, b in ((k1, b1), (k2, b2)):
        h = tf.nn.relu(tf.nn.conv2d(h, k, 1, "SAME") + b)
        h = tf.nn.max_pool2d(h, 2, 2, "SAME")
    h = tf.nn.relu(tf.matmul(tf.reshape(h, [1, -1]), w3) + b3)
    return (tf.matmul(h, w4) + b4)[0]


def vgg_params(out_size: int, channels=(8, 16, 32), seed=0) -> list[tf.Variable]:
    """Three VGG blocks (two 3x3 convs + maxpool each) on 48x48x3, then dense to out_size."""
    rng = np.random.default_rng(seed)
    params, c_in = [], 3
    for c in channels:
        params += [_var(rng, [3, 3, c_in, c]), _var(rng, [3, 3, c, c])]
        c_in = c
    params.append(_var(rng, [6 * 6 * c_in, out_size]))
    return params


def vgg(params, image: tf.Tensor) -> tf.Tensor:
    """``image: [48, 48, 3]`` -> ``[out_size]``."""
    h = image[None]
    for k in range(0, len(params) - 1, 2):
        h = tf.nn.relu(tf.nn.conv2d(h, params[k], 1, "SAME"))
        h = tf.nn.relu(tf.nn.conv2d(h, params[k + 1], 1, "SAME"))
        h = tf.nn.max_pool2d(h, 2, 2, "VALID")
    return tf.matmul(tf.reshape(h, [1, -1]), params[-1])[0]

# }}}


def compiled(f, jit_compile: bool = False):
    """One ``tf.function`` per implementation under test (the models need no AutoGraph);
    ``jit_compile=True`` compiles it with XLA."""
    return tf.function(f, autograph=False, jit_compile=jit_compile)


# {{{ JAX peer (optional: benchmarks only)

def jax_available() -> bool:
    """Whether JAX is installed (an optional peer of the benchmarks, never a dependency)."""
    try:
        import jax  # noqa: F401
    except ImportError:
        return False
    return True


JAX_MISSING = "JAX is not installed (`pip install jax`): its column is skipped"


def jax_mnist_per_example_grads(params: list[tf.Variable], images: tf.Tensor,
                                labels: tf.Tensor):
    """``jax.jit(jax.vmap(jax.grad(loss)))`` of the same MNIST convnet and parameters as
    :func:`mnist_logits`, on the same batch (copied to JAX once): a function of no arguments
    returning the per-example gradients."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    p = [jnp.asarray(v.numpy()) for v in params]

    def logits(p, image):
        k1, b1, k2, b2, w3, b3, w4, b4 = p
        h = image[None]
        for k, b in ((k1, b1), (k2, b2)):
            h = lax.conv_general_dilated(h, k, (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
            h = jax.nn.relu(h + b)
            h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "SAME")
        h = jax.nn.relu(h.reshape(1, -1) @ w3 + b3)
        return (h @ w4 + b4)[0]

    def loss(p, image, label):
        return -jax.nn.log_softmax(logits(p, image))[label]

    grads = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))
    xs, ys = jnp.asarray(images.numpy()), jnp.asarray(labels.numpy())
    return lambda: jax.block_until_ready(grads(p, xs, ys))

# }}}


def measure_interleaved(report, case: str, impls: dict, *, items: float, rounds: int,
                        warmup: int = 1) -> None:
    """Round-robin timing of ``impls`` (see ``Report.measure_interleaved``)."""
    report.measure_interleaved(case, impls, items=items, rounds=rounds, warmup=warmup)
