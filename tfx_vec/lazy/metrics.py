"""Counters and timers of the lazy runtime, and the human-readable ``metrics_report()``.

Counters (ints): ``ops_recorded``, ``compiles``, ``cache_hits``, ``executions``, ``barriers``,
``forced`` (barriers caused by observing a value), ``graph_size_cuts`` and ``fallback::<op>`` per
op that ran eagerly (``fallback::no_xla`` per program XLA could not compile).
Timers (seconds, summed, with a count): ``compile`` (first run of a program: trace, XLA
compile, run), ``execute`` (cached runs), ``canonicalize`` (building the cache key).

Example:
    >>> reset_metrics(); bump("compiles")
    >>> metrics()["compiles"]
    1
"""
from __future__ import annotations

import collections
import time
from contextlib import contextmanager
from typing import Iterator

__all__ = ["bump", "timer", "metrics", "metrics_report", "reset_metrics"]

_counters: collections.Counter = collections.Counter()
_timers: dict[str, list[float]] = {}  # name -> [total seconds, count]


def bump(name: str, n: int = 1) -> None:
    """Add ``n`` to counter ``name``."""
    _counters[name] += n


@contextmanager
def timer(name: str) -> Iterator[None]:
    """Time the ``with`` body into timer ``name``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        slot = _timers.setdefault(name, [0.0, 0])
        slot[0] += time.perf_counter() - t0
        slot[1] += 1


def metrics() -> dict:
    """All counters, plus ``<timer>_s`` (total seconds) and ``<timer>_n`` (count) per timer."""
    out: dict = dict(_counters)
    for name, (total, count) in _timers.items():
        out[f"{name}_s"] = total
        out[f"{name}_n"] = count
    return out


def reset_metrics() -> None:
    """Zero every counter and timer (the compile cache is kept; see ``lazy.clear_cache``)."""
    _counters.clear()
    _timers.clear()


def metrics_report() -> str:
    """A multi-line report like PyTorch/XLA's ``metrics_report()``."""
    lines = ["lazy metrics report", "  counters:"]
    for name in sorted(k for k in _counters if not k.startswith("fallback::")):
        lines.append(f"    {name:<20} {_counters[name]}")
    fallbacks = sorted((k[len("fallback::"):], v) for k, v in _counters.items()
                       if k.startswith("fallback::"))
    lines.append("  fallbacks (op: count):" + ("" if fallbacks else " none"))
    lines += [f"    {op:<20} {count}" for op, count in fallbacks]
    lines.append("  timers (total s / count / mean ms):")
    for name, (total, count) in sorted(_timers.items()):
        lines.append(f"    {name:<20} {total:.4f} / {count} / {1e3 * total / max(count, 1):.3f}")
    return "\n".join(lines)
