"""The shared benchmark harness.

Every benchmark times *our* implementation and its *peers* on the same input in the same
process, so the ratios are meaningful on a shared, noisy machine even when absolute times drift.

A benchmark module defines ``run(quick: bool) -> Report``.  It builds a :class:`Report`,
adds rows with :meth:`Report.measure` (or :meth:`Report.add` for a value it computed itself)
and returns it; ``python -m benchmarks`` prints the table and writes
``benchmarks/results/<name>.json`` and ``<name>.png``, or, for a ``--quick`` run, the same
files under ``benchmarks/results/quick/``: a quick run never overwrites a full run's results.

Example:
    >>> r = Report("demo", unit="ms", ours="ours")
    >>> _ = r.measure("sum", "ours", lambda: sum(range(100)), repeats=3, warmup=1)
    >>> _ = r.measure("sum", "peer", lambda: sum(list(range(100))), repeats=3, warmup=1)
    >>> "ours/peer" in r.table()
    True
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any, Callable

RESULTS = Path(__file__).resolve().parent / "results"
QUICK = "quick"      # the subfolder of the results folder that --quick runs write


def results_dir(quick: bool, root: Path | None = None) -> Path:
    """Where a run's JSON and PNG go: full runs in ``root``, quick runs in ``root/quick``.

    Example:
        >>> results_dir(True, Path("results")).as_posix()
        'results/quick'
    """
    root = RESULTS if root is None else root
    return root / QUICK if quick else root
_SETTLE_S = 0.01  # pause before each interleaved sample (see Report.measure_interleaved)


@dataclasses.dataclass
class Timing:
    """Seconds per call over ``repeats`` timed calls after ``warmup`` untimed ones."""

    median: float
    min: float
    max: float
    repeats: int
    samples: list[float] = dataclasses.field(default_factory=list)


def time_fn(fn: Callable[[], Any], *, repeats: int = 7, warmup: int = 2,
            inner: int = 1, sync: Callable[[Any], Any] | None = None) -> Timing:
    """Time ``fn``: ``warmup`` untimed calls, then ``repeats`` samples of ``inner`` calls each.

    ``sync`` is applied to the last result of each sample (e.g. ``.numpy()``) so that
    asynchronous work is finished before the clock stops.
    """
    sync = sync or _materialize
    for _ in range(warmup):
        sync(fn())
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            out = fn()
        sync(out)
        samples.append((time.perf_counter() - t0) / inner)
    return Timing(statistics.median(samples), min(samples), max(samples), repeats, samples)


def _materialize(x: Any) -> Any:
    """Force TF values (nested) to host memory; anything else passes through."""
    try:
        import tensorflow as tf
    except ImportError:  # pragma: no cover
        return x
    for leaf in tf.nest.flatten(x):
        if hasattr(leaf, "numpy"):
            leaf.numpy()
    return x


@dataclasses.dataclass
class Row:
    case: str          # e.g. "linear b=256"
    impl: str          # e.g. "tfx_vec.pfor"
    value: float       # in the report's unit (time per call, or a throughput)
    lo: float | None = None
    hi: float | None = None
    extra: dict = dataclasses.field(default_factory=dict)


class Report:
    """Rows of (case, implementation, value) with our-vs-peer ratios computed per case.

    ``higher_is_better`` says whether ``value`` is a throughput (True) or a time (False); the
    ratio column is always "how many times better ours is than the peer" (>1 = ours wins).
    """

    def __init__(self, name: str, *, unit: str = "ms", ours: str = "tfx_vec",
                 higher_is_better: bool = False, notes: str = ""):
        self.name, self.unit, self.ours = name, unit, ours
        self.higher_is_better = higher_is_better
        self.notes = notes
        self.rows: list[Row] = []

    _SCALE = {"s": 1.0, "ms": 1e3, "us": 1e6}

    def measure(self, case: str, impl: str, fn: Callable[[], Any], *, items: float = 1.0,
                **time_kwargs) -> Timing:
        """Time ``fn`` and add a row.  With a throughput unit, ``items`` per call are counted."""
        t = time_fn(fn, **time_kwargs)
        self._add_timing(case, impl, t, items)
        return t

    def measure_interleaved(self, case: str, impls: dict[str, Callable[[], Any]], *,
                            items: float = 1.0, rounds: int = 7, warmup: int = 1,
                            inner: int = 1, statistic: str = "median") -> dict[str, Timing]:
        """Time every implementation of ``case`` round-robin and add one row each.

        Each round times every implementation once (``inner`` calls), so load from other jobs
        on a shared machine hits all of them alike and the ratios stay fair; each round runs in a
        new random order (seeded), so no implementation always follows the same one.  An
        implementation that raises during warm-up gets no row; its error goes into ``notes``.
        ``statistic`` ("median" or "min") picks the sample a row reports; min/max always bound
        it.
        """
        alive, samples = {}, {}
        shuffle = random.Random(0).shuffle
        for name, fn in impls.items():
            try:
                for _ in range(max(1, warmup)):
                    _materialize(fn())
                alive[name], samples[name] = fn, []
            except Exception as e:  # a peer that cannot run this case
                first = (str(e).strip().splitlines() or [""])[0]
                self.notes += f"\n{case} {name}: failed ({type(e).__name__}: {first[:160]})"
        order = list(alive.items())
        for r in range(rounds):
            # A new order each round.  The call after another program's pays for what that one
            # left behind: TensorFlow's thread pools spin for a while after a graph-mode
            # program and take a core from the next one (on a 2-core box an XLA program timed
            # right after TFP's graph ran 1.3-1.6x slower).  Rotating the order kept every
            # implementation behind the same predecessor; shuffling does not, and a short
            # pause before each sample lets the pools go idle.
            if r:
                shuffle(order)
            for name, fn in order:
                time.sleep(_SETTLE_S)
                samples[name].append(time_fn(fn, repeats=1, warmup=0, inner=inner).median)
        timings = {name: Timing(statistics.median(s), min(s), max(s), len(s), s)
                   for name, s in samples.items()}
        for name, t in timings.items():
            self._add_timing(case, name, t, items, statistic)
        return timings

    def _add_timing(self, case: str, impl: str, t: Timing, items: float,
                    statistic: str = "median") -> None:
        seconds = {"median": t.median, "min": t.min}[statistic]
        if self.higher_is_better:
            self.add(case, impl, items / seconds, lo=items / t.max, hi=items / t.min)
        else:
            s = self._SCALE.get(self.unit, 1.0)
            self.add(case, impl, seconds * s, lo=t.min * s, hi=t.max * s)

    def add(self, case: str, impl: str, value: float, *, lo: float | None = None,
            hi: float | None = None, **extra) -> None:
        self.rows.append(Row(case, impl, float(value), lo, hi, extra))

    # -- derived views -------------------------------------------------------------------
    def cases(self) -> list[str]:
        return list(dict.fromkeys(r.case for r in self.rows))

    def impls(self) -> list[str]:
        return list(dict.fromkeys(r.impl for r in self.rows))

    def value(self, case: str, impl: str) -> float | None:
        for r in self.rows:
            if r.case == case and r.impl == impl:
                return r.value
        return None

    def ratio(self, case: str, peer: str) -> float | None:
        """How many times better ours is than ``peer`` on ``case`` (>1: ours wins)."""
        a, b = self.value(case, self.ours), self.value(case, peer)
        if a is None or b is None or a == 0 or b == 0:
            return None
        return a / b if self.higher_is_better else b / a

    def table(self) -> str:
        """A Markdown table: one row per case, one column per implementation, then ratios."""
        impls = self.impls()
        peers = [i for i in impls if i != self.ours]
        head = ["case"] + [f"{i} ({self.unit})" for i in impls]
        head += [f"{self.ours}/{p}" for p in peers] if self.ours in impls else []
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for c in self.cases():
            cells = [c] + [_fmt(self.value(c, i)) for i in impls]
            if self.ours in impls:
                cells += [_fmt_ratio(self.ratio(c, p)) for p in peers]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"name": self.name, "unit": self.unit, "ours": self.ours,
                "higher_is_better": self.higher_is_better, "notes": self.notes,
                "rows": [dataclasses.asdict(r) for r in self.rows],
                "ratios": {c: {p: self.ratio(c, p) for p in self.impls() if p != self.ours}
                           for c in self.cases()}}

    def save(self, directory: Path = RESULTS) -> tuple[Path, Path | None]:
        """Write ``<name>.json`` and, when matplotlib is installed, ``<name>.png``."""
        directory.mkdir(parents=True, exist_ok=True)
        jpath = directory / f"{self.name}.json"
        jpath.write_text(json.dumps(self.to_json(), indent=1))
        return jpath, self.plot(directory / f"{self.name}.png")

    def plot(self, path: Path) -> Path | None:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        cases, impls = self.cases(), self.impls()
        fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(cases) + 3), 4))
        width = 0.8 / max(1, len(impls))
        for k, impl in enumerate(impls):
            vals = [self.value(c, impl) or 0.0 for c in cases]
            ax.bar([i + k * width for i in range(len(cases))], vals, width, label=impl)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))])
        ax.set_xticklabels(cases, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(self.unit)
        if any((r.value or 0) > 0 for r in self.rows):
            ax.set_yscale("log")
        ax.set_title(self.name)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        return path


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if v == 0 or not math.isfinite(v):
        return str(v)
    return f"{v:.4g}"


def _fmt_ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"
