"""Counters and timers of the lazy runtime, and the human-readable ``metrics_report()``.

Counters (ints): ``ops_recorded``, ``compiles``, ``cache_hits``, ``executions``, ``barriers``,
``forced`` (barriers caused by observing a value), ``graph_size_cuts``, ``fallback::<op>`` per
op that ran eagerly (``fallback::no_xla`` per program XLA could not compile), ``host::<op>``
per host op the device ran (datasets, ``tf.print``, ``tf.function`` calls), ``folded::<op>``
per integer op evaluated at once on known values, ``tape_recorded`` and ``tape_eager::<why>``
(``tf.GradientTape`` gradients recorded as one node, or run op by op and why).
Timers (seconds, summed, with a count): ``compile`` (first run of a program: trace, XLA
compile, run), ``execute`` (cached runs), ``canonicalize`` (building the cache key).
Beside them: the source line of every fallback (:func:`fallback_sites`) and the cause of every
recompilation (:func:`recompilations`), both in ``metrics_report()``.

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

__all__ = ["bump", "timer", "add_time", "metrics", "metrics_report", "reset_metrics",
           "count_fallback", "fallback_sites", "note_recompilation", "recompilations"]

_counters: collections.Counter = collections.Counter()
_timers: dict[str, list[float]] = {}  # name -> [total seconds, count]
_sites: collections.Counter = collections.Counter()   # (op, user line) -> eager fallbacks
_recompilations: list[str] = []                       # why each program after the first compiled
_MAX_RECOMPILATIONS = 200


def bump(name: str, n: int = 1) -> None:
    """Add ``n`` to counter ``name``."""
    _counters[name] += n


def count_fallback(op: str, site: str) -> None:
    """Count one eager fallback of ``op`` called from the user's ``site`` (``file:line``)."""
    _counters[f"fallback::{op}"] += 1
    _sites[(op, site)] += 1


def fallback_sites() -> dict:
    """``{op: {site: count}}``: where each eager fallback was called from (``file:line in
    function`` of the user's code).

    >>> reset_metrics(); count_fallback("Unique", "train.py:12 in step")
    >>> fallback_sites()
    {'Unique': {'train.py:12 in step': 1}}
    """
    out: dict = {}
    for (op, site), n in sorted(_sites.items()):
        out.setdefault(op, {})[site] = n
    return out


def note_recompilation(text: str) -> None:
    """Record why a program was compiled although one was compiled before at that barrier."""
    _counters["recompilations"] += 1
    if len(_recompilations) < _MAX_RECOMPILATIONS:
        _recompilations.append(text)


def recompilations() -> list[str]:
    """The cause of each recompilation so far (the first 200), oldest first: the barrier (its
    cause and line) and what differs from the program it compiled before.

    >>> reset_metrics(); note_recompilation("mark_step at train.py:30 in loop: input %0 ...")
    >>> recompilations()
    ['mark_step at train.py:30 in loop: input %0 ...']
    """
    return list(_recompilations)


@contextmanager
def timer(name: str) -> Iterator[None]:
    """Time the ``with`` body into timer ``name``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        add_time(name, t0)


def add_time(name: str, t0: float) -> None:
    """Add the time since ``t0`` (``time.perf_counter()``) to timer ``name``: what
    :func:`timer` does, without a context manager's calls, for code that runs every step.

    >>> add_time("example", time.perf_counter())
    >>> metrics()["example_n"] >= 1
    True
    """
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
    """Zero every counter and timer, forget fallback sites and recompilation causes (the compile
    cache is kept; see ``lazy.clear_cache``).

    >>> bump("compiles"); reset_metrics(); "compiles" in metrics()
    False
    """
    _counters.clear()
    _timers.clear()
    _sites.clear()
    _recompilations.clear()


def metrics_report() -> str:
    """A multi-line report like PyTorch/XLA's ``metrics_report()``."""
    lines = ["lazy metrics report", "  counters:"]
    for name in sorted(k for k in _counters if not k.startswith("fallback::")):
        lines.append(f"    {name:<20} {_counters[name]}")
    fallbacks = sorted((k[len("fallback::"):], v) for k, v in _counters.items()
                       if k.startswith("fallback::"))
    lines.append("  fallbacks (op: count, then where it was called):" +
                 ("" if fallbacks else " none"))
    sites = fallback_sites()
    for op, count in fallbacks:
        lines.append(f"    {op:<20} {count}")
        lines += [f"      {n:>6} at {site}" for site, n in sites.get(op, {}).items()]
    lines.append("  recompilations (why a barrier compiled another program):" +
                 ("" if _recompilations else " none"))
    lines += [f"    {text}" for text in _recompilations]
    lines.append("  timers (total s / count / mean ms):")
    for name, (total, count) in sorted(_timers.items()):
        lines.append(f"    {name:<20} {total:.4f} / {count} / {1e3 * total / max(count, 1):.3f}")
    return "\n".join(lines)
