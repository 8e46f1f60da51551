"""tfx_vec: make TensorFlow code written for one example run batched, compiled and fast.

Subpackages (each one a pipeline of small stages, see README.md):

- ``tfx_vec.pfor``: static vectorization of parallel-for loops over TF graphs.
- ``tfx_vec.autobatch``: batch Python functions with if/while/recursion.
- ``tfx_vec.lazy``: a lazy tensor mode compiled with XLA at barriers.
- ``tfx_vec.tc_ops``: Tensor Comprehensions compiled to C/OpenMP, CUDA and OpenCL.

Example:
    >>> import tfx_vec
    >>> tfx_vec.__version__ != ""
    True
"""
__version__ = "0.1.0"

# pfor core (callable module: ``tfx_vec.pfor(loop_fn, iters)``).
from tfx_vec import pfor  # noqa: E402
from tfx_vec.pfor import (VectorizationError, fallback_report, register_converter,  # noqa: E402
                          reset_fallbacks, vectorized_map)

# --- pfor gradients (P3): jacobian, batch_jacobian, hessian, per_example_gradients go here ---
from tfx_vec.pfor.gradients import (batch_jacobian, hessian, jacobian,  # noqa: E402
                                    per_example_gradients)
# --- end pfor gradients ---
