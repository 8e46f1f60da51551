"""Backend registry: a backend turns a checked TC at concrete sizes into a runnable kernel.

A backend is any object with ``name`` and ``compile(spec: KernelSpec) -> CompiledKernel``, where a
:class:`CompiledKernel` has ``source`` (the generated code) and ``run(args)`` taking the NumPy
buffers in ABI order (inputs, scalars as 0-d arrays, then preallocated outputs) and writing the
outputs in place.  ``register_backend(name, factory)`` makes ``tc.define(..., backend=name)`` work;
the factory is called once, lazily (so a CUDA backend imports pycuda only when asked for).

Example:
    >>> from tfx_vec.tc_ops.backends import get_backend, available_backends
    >>> "cpu" in available_backends() and get_backend("cpu").name == "cpu"
    True
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Protocol

from ..errors import TcBackendError
from ..lang.ranges import Ranges
from ..lang.sema import CheckedDef
from ..options import MappingOptions

__all__ = ["KernelSpec", "CompiledKernel", "Backend", "register_backend", "get_backend",
           "available_backends"]


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """What a backend compiles: one checked TC, its concrete sizes, and the options."""

    cdef: CheckedDef
    ranges: Ranges
    options: MappingOptions


class CompiledKernel(Protocol):
    source: str

    def run(self, args: list) -> None: ...


class Backend(Protocol):
    name: str

    def compile(self, spec: KernelSpec) -> CompiledKernel: ...


_FACTORIES: dict[str, Callable[[], Any]] = {}
_INSTANCES: dict[str, Any] = {}


def register_backend(name: str, factory: Callable[[], Any]) -> None:
    """Register ``factory`` (called once, on first use) under ``name``; replaces an older one.

    Example:
        A backend that runs the CPU kernels under another name:

        >>> import numpy as np
        >>> from tfx_vec import tc_ops as tc
        >>> class Mine:
        ...     name = "mine"
        ...     def compile(self, spec):
        ...         return get_backend("cpu").compile(spec)
        >>> register_backend("mine", Mine)
        >>> tc.define("def neg(float(N) A) -> (B) { B(i) = -A(i) }", backend="mine").neg(
        ...     np.ones(2, np.float32)).numpy()
        array([-1., -1.], dtype=float32)
        >>> _ = _FACTORIES.pop("mine"), _INSTANCES.pop("mine", None)     # unregister
    """
    _FACTORIES[name] = factory
    _INSTANCES.pop(name, None)


def available_backends() -> tuple[str, ...]:
    return tuple(sorted(_FACTORIES))


def get_backend(name: str) -> Backend:
    """The backend instance for ``name``; TcBackendError if unknown or unusable here."""
    if name not in _INSTANCES:
        if name not in _FACTORIES:
            raise TcBackendError(f"unknown tc_ops backend {name!r}; available: "
                                 f"{', '.join(available_backends())}")
        _INSTANCES[name] = _FACTORIES[name]()
    return _INSTANCES[name]


def _lazy(module: str, cls: str) -> Callable[[], Any]:
    """A factory importing ``backends.<module>`` only when the backend is first used."""
    def factory():
        return getattr(importlib.import_module(f".{module}", __package__), cls)()
    return factory


register_backend("cpu", _lazy("cpu", "CpuBackend"))
register_backend("opencl", _lazy("opencl", "OpenCLBackend"))
register_backend("cuda", _lazy("cuda", "CudaBackend"))
