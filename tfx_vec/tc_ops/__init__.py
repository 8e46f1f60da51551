"""tfx_vec.tc_ops: Tensor Comprehensions compiled through isl to C/OpenMP (and, via T2's
backends, CUDA/OpenCL).  See README.md, section tc_ops.
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
