"""tfx_vec.tc_ops: Tensor Comprehensions, kernels written as index math, scheduled with isl
and compiled to C/OpenMP (a register-blocked micro-kernel for contractions), OpenCL or CUDA.

An entry of ``define(...)`` runs on NumPy arrays, and on ``tf.Tensor``s it is a TensorFlow op
with a gradient (eagerly, in ``tf.function``, under ``tf.GradientTape`` and in Keras).  The
guide is docs/tc_ops.md.

Example:
    >>> import numpy as np, tensorflow as tf
    >>> from tfx_vec import tc_ops as tc
    >>> mod = tc.define("def rowsum(float(N,K) A) -> (S) { S(n) +=! A(n,k) }")
    >>> a = tf.ones([2, 3])
    >>> with tf.GradientTape() as tape:
    ...     tape.watch(a)
    ...     s = mod.rowsum(a)
    ...     loss = tf.reduce_sum(s)
    >>> s.numpy(), tape.gradient(loss, a).numpy()[0]
    (array([3., 3.], dtype=float32), array([1., 1., 1.], dtype=float32))
"""
from .errors import (Span, TcBackendError, TcCompileError, TcError, TcGradientError,  # noqa: F401
                     TcNameError, TcOptionsError, TcRangeError, TcSemanticError, TcShapeError,
                     TcSyntaxError, TcTypeError, TcWarning)
from .lang import parse  # noqa: F401
from .options import MappingOptions  # noqa: F401
from .api import Entry, Module, define, generate_source  # noqa: F401,E402
from .backends import register_backend  # noqa: F401,E402

# Imported eagerly, not through a module __getattr__: the submodule ``tc_ops.autotune`` shares
# the function's name, and importing the submodule anywhere would rebind ``tc.autotune`` to it.
from .autotune import autotune  # noqa: F401,E402
from .cache import CompilationCache  # noqa: F401,E402

__all__ = ["define", "Module", "Entry", "generate_source", "MappingOptions", "autotune",
           "CompilationCache", "parse", "register_backend", "Span", "TcError", "TcSyntaxError",
           "TcNameError", "TcTypeError", "TcSemanticError", "TcRangeError", "TcShapeError",
           "TcOptionsError", "TcCompileError", "TcBackendError", "TcGradientError", "TcWarning"]
