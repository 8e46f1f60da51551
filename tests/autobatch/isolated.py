"""Run a Python snippet in a fresh interpreter that imports this checkout (for TF1 behaviour,
which is process-wide, and for what importing a module pulls in)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, stdin: str = "", timeout: float = 600) -> str:
    """Run ``code`` with ``sys.executable``; return its stdout, or fail with its stderr."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout
