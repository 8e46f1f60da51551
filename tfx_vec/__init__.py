"""tfx_vec: make TensorFlow code written for one example run batched, compiled and fast.

The functions below vectorize a loop body written for one iteration (``tfx_vec.pfor``).
The subpackages, each one a pipeline of small stages (docs/architecture.md):

- ``tfx_vec.pfor``: static vectorization of parallel-for loops; jacobians, hessians and
  per-example gradients as vectorized loops; a vectorized ``Dataset.map``.
- ``tfx_vec.autobatch``: batch Python functions with ``if``/``while``/recursion; a recursive
  No-U-Turn sampler usable as a TensorFlow Probability kernel.
- ``tfx_vec.lazy``: a lazy tensor mode, eager code recorded and compiled with XLA at barriers.
- ``tfx_vec.tc_ops``: Tensor Comprehensions compiled to C/OpenMP, CUDA and OpenCL, as TF ops
  and Keras layers.
- ``tfx_vec.distribute``: the above on ``tf.distribute`` strategies, over several machines.

``tfx_vec.autobatch``, ``tfx_vec.lazy``, ``tfx_vec.tc_ops`` and ``tfx_vec.distribute`` are
imported on first use.

Example:
    >>> import tensorflow as tf
    >>> import tfx_vec
    >>> x = tf.reshape(tf.range(6.0), [3, 2])
    >>> tfx_vec.pfor(lambda i: tf.reduce_sum(tf.gather(x, i)), 3).numpy()  # one row per i
    array([1., 5., 9.], dtype=float32)
    >>> tfx_vec.jacobian(lambda v: v * v, tf.constant([1.0, 2.0])).numpy()
    array([[2., 0.],
           [0., 4.]], dtype=float32)
"""
import importlib
from types import ModuleType

__version__ = "0.1.0"

from tfx_vec import pfor  # noqa: E402  (a callable module: tfx_vec.pfor(loop_fn, iters))
from tfx_vec.pfor import (VectorizationError, fallback_report, register_converter,  # noqa: E402
                          reset_fallbacks, vectorized_map)
from tfx_vec.pfor.gradients import (batch_jacobian, hessian, jacobian,  # noqa: E402
                                    per_example_gradients)

__all__ = ["pfor", "vectorized_map", "jacobian", "batch_jacobian", "hessian",
           "per_example_gradients", "register_converter", "fallback_report", "reset_fallbacks",
           "VectorizationError", "autobatch", "lazy", "tc_ops", "distribute"]

_ON_FIRST_USE = ("autobatch", "lazy", "tc_ops", "distribute")


def __getattr__(name: str) -> ModuleType:
    # Importing tfx_vec must not load TensorFlow Probability, install the lazy dispatchers or
    # load islpy for a user who only wants pfor.
    if name in _ON_FIRST_USE:
        return importlib.import_module(f"tfx_vec.{name}")
    raise AttributeError(f"module 'tfx_vec' has no attribute {name!r}")
