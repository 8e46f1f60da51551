"""tfx_vec.tc_ops: Tensor Comprehensions compiled through isl to C/OpenMP (and, via T2's
backends, CUDA/OpenCL).  See README.md, section tc_ops.
"""
from .errors import (Span, TcBackendError, TcCompileError, TcError, TcNameError,  # noqa: F401
                     TcOptionsError, TcRangeError, TcSemanticError, TcShapeError, TcSyntaxError,
                     TcTypeError)
from .lang import parse  # noqa: F401
from .options import MappingOptions  # noqa: F401
from .api import Entry, Module, define, generate_source  # noqa: F401,E402
from .backends import register_backend  # noqa: F401,E402


def __getattr__(name: str):
    """``autotune`` and ``CompilationCache`` (issue #8) are imported on first use."""
    if name == "autotune":
        from .autotune import autotune
        return autotune
    if name == "CompilationCache":
        from .cache import CompilationCache
        return CompilationCache
    raise AttributeError(f"module 'tfx_vec.tc_ops' has no attribute {name!r}")
