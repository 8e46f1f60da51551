"""A Tensor Comprehension as a real TensorFlow op.

One generic op library (``tf_op/tc_kernel_op.cc``) is compiled once against TensorFlow's own
headers (``tf.sysconfig`` flags), cached under :func:`tfx_vec.tc_ops.cache.cache_root` (rebuilt
when its source, TF version or flags change) and loaded with ``tf.load_op_library``.  Its op,
``TcKernel``, carries the kernel's C source and hash as attributes; at graph construction it
compiles (or finds in the cache) the shared object, dlopens it and later calls
``tc_<entry>(void* const* args)`` on the tensors' buffers, inputs then outputs.  No Python runs
when the op executes, so it works in eager, in ``tf.function``, in Keras models and after a
SavedModel reload (load the library first: :func:`load_op_library`).

Stages: :func:`load_op_library` (build/load the library) → :func:`kernel_op` (one call of a
compiled C kernel, any ABI-conforming source) → :func:`tc_op` (a TC entry point: generated C
from the cpu backend, a gradient from backward TCs via ``tf.custom_gradient``).

Example::

    import numpy as np, tensorflow as tf
    from tfx_vec.tc_ops import tf_op
    src = '''
    void tc_axpy(void* const* a) {
      const float* x = (const float*)a[0]; float* y = (float*)a[1];
      for (int i = 0; i < 4; ++i) y[i] = 2.0f * x[i] + 1.0f;
    }'''
    (y,) = tf_op.kernel_op([tf.ones([4])], source=src, entry="axpy",
                           output_shapes=[(4,)], output_dtypes=[tf.float32])
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import threading
from typing import Callable, Sequence

import tensorflow as tf

from .cache import cache_root

__all__ = ["load_op_library", "kernel_op", "source_hash", "DEFAULT_C_FLAGS", "OpLibraryError"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_OP_SOURCE = os.path.join(_HERE, "tf_op", "tc_kernel_op.cc")
DEFAULT_C_FLAGS = "-O3 -march=native -fopenmp -fPIC -shared -lm"

_lock = threading.Lock()
_library = None


class OpLibraryError(RuntimeError):
    """The generic TC op library could not be built or loaded."""


def _library_path() -> tuple[str, list[str]]:
    with open(_OP_SOURCE, "rb") as f:
        text = f.read()
    cflags, lflags = tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()
    digest = hashlib.sha256(
        b"\0".join([text, tf.__version__.encode(), " ".join(cflags + lflags).encode()])
    ).hexdigest()[:20]
    out = os.path.join(cache_root(), "ops", f"tc_kernel_op-{digest}.so")
    cmd = ["g++", "-O2", "-fPIC", "-shared", *cflags, _OP_SOURCE, "-o", "{OUT}", *lflags, "-ldl"]
    return out, cmd


def load_op_library():
    """Build (once, cached on disk) and load the generic ``TcKernel`` op library.

    Returns the module of ``tf.load_op_library``; its ``tc_kernel`` is the raw op.

    >>> lib = load_op_library(); callable(lib.tc_kernel)
    True
    """
    global _library
    with _lock:
        if _library is not None:
            return _library
        out, cmd = _library_path()
        if not os.path.exists(out):
            os.makedirs(os.path.dirname(out), exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(out))
            os.close(fd)
            cmd = [tmp if c == "{OUT}" else c for c in cmd]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                os.unlink(tmp)
                raise OpLibraryError(
                    f"building the TcKernel op library failed:\n{' '.join(cmd)}\n{proc.stderr}")
            os.replace(tmp, out)  # atomic: a concurrent builder's result is equivalent
        try:
            _library = tf.load_op_library(out)
        except Exception as e:  # a truncated/foreign file: rebuild once
            os.unlink(out)
            raise OpLibraryError(f"loading {out} failed ({e}); removed it, call again") from e
        return _library


def source_hash(source: str, compiler: str, flags: str) -> str:
    """The hash naming a kernel's shared object: it covers the source, compiler and flags."""
    h = hashlib.sha256("\0".join([source, compiler, flags]).encode()).hexdigest()
    return "k" + h[:32]


def kernel_op(inputs: Sequence, *, source: str, entry: str,
              output_shapes: Sequence[Sequence[int]], output_dtypes: Sequence,
              compiler: str = "cc", flags: str = DEFAULT_C_FLAGS) -> list[tf.Tensor]:
    """Run the compiled C kernel ``tc_<entry>`` of ``source`` as one ``TcKernel`` op.

    Args:
      inputs: tensors (or arrays) passed in order; their shapes are fixed in the op, a call with
        other shapes raises ``InvalidArgumentError`` instead of reading out of bounds.
      source: C source defining ``void tc_<entry>(void* const* args)``.
      output_shapes, output_dtypes: what the kernel writes, in order.
    Returns:
      the list of output tensors.
    """
    lib = load_op_library()
    inputs = [tf.convert_to_tensor(x) for x in inputs]
    return lib.tc_kernel(
        inputs=inputs,
        Tout=[tf.as_dtype(d) for d in output_dtypes],
        input_shapes=[tuple(x.shape) for x in inputs],
        output_shapes=[tuple(int(d) for d in s) for s in output_shapes],
        entry=entry, source=source, source_hash=source_hash(source, compiler, flags),
        compiler=compiler, compile_flags=flags)
