"""Run benchmarks: ``python -m benchmarks [--quick] [NAME...]``.

Each NAME is a module in this folder with a ``run(quick: bool) -> harness.Report`` function
(``pfor_autobatch``, ``tc_cpu``, ...); with no NAME every such module runs.  Tables go to
stdout; JSON and PNG go to ``benchmarks/results/`` (``benchmarks/results/quick/`` with ``--quick``,
so small-size runs never replace the full-size results that the documentation cites).

``--intra-op-threads N`` sets TensorFlow's (and so XLA:CPU's) intra-op thread pool for the
whole process, ours and the peers alike, and saves results as ``NAME_intraN``: on a small
shared machine XLA:CPU splits even 1024-element loops over the pool, which costs more than it
gains for programs made of many small kernels.
"""
import argparse
import importlib
import os
import pkgutil
import sys
import traceback
from pathlib import Path

from benchmarks import harness

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_HERE = Path(__file__).resolve().parent
_NOT_BENCHMARKS = {"harness", "__main__"}


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules([str(_HERE)])
                  if m.name not in _NOT_BENCHMARKS and not m.name.startswith("_"))


def _shown(path: Path) -> str:
    return str(path.relative_to(_HERE.parent)) if path.is_relative_to(_HERE.parent) else str(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes and few repeats")
    ap.add_argument("--intra-op-threads", type=int, default=0, metavar="N",
                    help="TensorFlow intra-op threads for the whole process (default: TF's)")
    ap.add_argument("names", nargs="*", help=f"benchmarks to run (default all): {available()}")
    args = ap.parse_args(argv)
    names = args.names or available()
    unknown = sorted(set(names) - set(available()))
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; available: {available()}")
    if args.intra_op_threads:
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    failed = []
    for name in names:
        print(f"\n## {name}{' (quick)' if args.quick else ''}\n", flush=True)
        try:
            report = importlib.import_module(f"benchmarks.{name}").run(quick=args.quick)
        except Exception:  # one broken benchmark must not hide the others' numbers
            traceback.print_exc()
            failed.append(name)
            continue
        if args.intra_op_threads:
            report.name += f"_intra{args.intra_op_threads}"
        print(report.table())
        if report.notes:
            print("\n" + report.notes)
        jpath, ppath = report.save(harness.results_dir(args.quick))
        print(f"\nwrote {_shown(jpath)}" + (f" and {_shown(ppath)}" if ppath else ""), flush=True)
    if failed:
        print(f"\nFAILED: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
