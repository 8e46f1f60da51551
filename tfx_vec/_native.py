"""Build and load a C++ Python extension against the installed TensorFlow, cached on disk.

Some stages need TensorFlow's C API from native code (``tfx_vec.lazy``'s custom device).  This
helper compiles one C++ source into a Python extension module with ``g++`` and the flags of the
installed TensorFlow (``tf.sysconfig``) and Python, caches the shared object under
``$TFX_VEC_CACHE_DIR/native`` (default ``~/.cache/tfx_vec/native``; the file name hashes the
source, TensorFlow's version, Python's ABI and every flag, so any change builds anew) and loads
it.  The cache directory must belong to the user and be writable by nobody else: a shared
object there is code that runs in the process, so a foreign one is refused, never loaded.

Example:
    >>> sorted(set(extension_flags()) & {"-shared", "-fPIC"})
    ['-fPIC', '-shared']
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
from types import ModuleType

__all__ = ["NativeBuildError", "extension_flags", "load_extension", "native_cache_dir"]

_lock = threading.Lock()
_loaded: dict[str, ModuleType] = {}


class NativeBuildError(RuntimeError):
    """A native extension could not be built or loaded (the message says why and how to fix)."""


def native_cache_dir() -> str:
    """``$TFX_VEC_CACHE_DIR/native`` (or ``~/.cache/tfx_vec/native``), created private (0700).

    Raises :class:`NativeBuildError` when the directory belongs to another user or others may
    write to it.
    """
    root = os.environ.get("TFX_VEC_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "tfx_vec")
    path = os.path.join(root, "native")
    os.makedirs(path, mode=0o700, exist_ok=True)
    _check_private(path)
    return path


def _check_private(path: str) -> None:
    st = os.stat(path)
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise NativeBuildError(f"{path} belongs to another user: native code cached there is not "
                               "loaded (set TFX_VEC_CACHE_DIR to a directory of your own)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise NativeBuildError(f"{path} is writable by other users: native code cached there is "
                               f"not loaded (chmod go-w {path}, or set TFX_VEC_CACHE_DIR)")


def _tensorflow_dirs() -> tuple[str, str, str]:
    import tensorflow as tf
    include = tf.sysconfig.get_include()
    lib = tf.sysconfig.get_lib()
    return include, lib, os.path.join(lib, "python")


def extension_flags() -> list[str]:
    """The ``g++`` flags of a Python extension linked to TensorFlow's C API and Python layer."""
    import tensorflow as tf
    include, lib, pylib = _tensorflow_dirs()
    flags = ["-O2", "-fPIC", "-shared", "-fvisibility=hidden",
             f"-I{sysconfig.get_paths()['include']}",
             *[f for f in tf.sysconfig.get_compile_flags() if not f.startswith("-I")],
             f"-I{include}"]
    libs = [f"-L{lib}", f"-L{pylib}", "-l:libtensorflow_cc.so.2",
            "-l:libtensorflow_framework.so.2", "-l:lib_pywrap_tensorflow_common.so",
            f"-Wl,-rpath,{lib}", f"-Wl,-rpath,{pylib}"]
    return flags + libs


def load_extension(name: str, source: str) -> ModuleType:
    """Build (once, cached) and import the extension module ``name`` from the C++ ``source`` file.

    The module's init function must be ``PyInit_<name>``.  Raises :class:`NativeBuildError`
    naming the compiler's message when the build fails or no ``g++`` is found.
    """
    with _lock:
        module = _loaded.get(name)
        if module is None:
            module = _loaded[name] = _load(name, source)
        return module


def _load(name: str, source: str) -> ModuleType:
    import tensorflow as tf
    with open(source, "rb") as f:
        text = f.read()
    flags = extension_flags()
    digest = hashlib.sha256(b"\0".join([
        text, tf.__version__.encode(), sys.implementation.cache_tag.encode(),
        " ".join(flags).encode()])).hexdigest()[:20]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    out = os.path.join(native_cache_dir(), f"{name}-{digest}{suffix}")
    if not os.path.exists(out):
        _build(source, out, flags)
    _check_private(out)
    spec = importlib.util.spec_from_file_location(name, out)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as e:
        os.unlink(out)
        raise NativeBuildError(f"loading {out} failed ({e}); removed it, it is rebuilt next "
                               "time") from e
    return module


def _build(source: str, out: str, flags: list[str]) -> None:
    compiler = os.environ.get("CXX") or "g++"
    if shutil.which(compiler) is None:
        raise NativeBuildError(f"no C++ compiler {compiler!r} on PATH: install g++ (or point "
                               "CXX at one) to build tfx_vec's native extension")
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(out))
    os.close(fd)
    cmd = [compiler, "-std=c++17", source, "-o", tmp, *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise NativeBuildError(f"building {os.path.basename(source)} failed:\n{' '.join(cmd)}\n"
                               f"{proc.stderr[-4000:]}")
    os.chmod(tmp, 0o700)
    os.replace(tmp, out)  # atomic: a concurrent builder's result is equivalent
