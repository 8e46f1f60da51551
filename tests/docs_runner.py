"""Run the ```python blocks of a Markdown file as a reader would, checking what they claim to print.

The blocks of one file run in order in one process and one namespace (a later block sees the
names of earlier ones).  Each block is compiled with the Markdown file as its file name and its
own line numbers there, so a traceback points at the documentation line and
``inspect.getsource`` (which ``tfx_vec.autobatch.function`` needs) reads the code from the
Markdown file itself.  A line ``print(...)  # -> TEXT`` must print exactly ``TEXT`` (without
the final newline) every time it runs, and must run.

Usage, also handy while writing documentation::

    python tests/docs_runner.py docs/lazy.md      # exit status 0 when every block ran as claimed

The test suite calls :func:`run_doc`, which starts that command in a fresh interpreter with a
timeout.
"""
from __future__ import annotations

import ast
import dataclasses
import io
import os
import re
import subprocess
import sys
import tokenize
import traceback
import types
from pathlib import Path

_OPEN = re.compile(r"^( *)```python\s*$")
_CLAIM = re.compile(r"^#\s*->\s?(.*)$")
_PRINT_HOOK = "__docs_print__"
_RUNNING = "docs_runner: running "      # progress lines on stderr name the block being run
_FAILED = "docs_runner: error: "         # the one-line reason, first in run_doc's answer
# TensorFlow's C++ start-up chatter (absl logs before TF_CPP_MIN_LOG_LEVEL applies)
_NATIVE_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s"
                         r"|^WARNING: All log messages before absl")


@dataclasses.dataclass
class Block:
    number: int         # 1-based, in the order of the file
    line: int           # the Markdown line of the block's first line of code
    code: str           # dedented by the fence's indentation


def python_blocks(text: str) -> list[Block]:
    """Every fenced ```python block of a Markdown text, with its position."""
    blocks, lines, k = [], text.splitlines(), 0
    while k < len(lines):
        opened = _OPEN.match(lines[k])
        k += 1
        if not opened:
            continue
        indent, start, body = len(opened.group(1)), k, []
        while k < len(lines) and lines[k].strip() != "```":
            line = lines[k]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))):])
            k += 1
        k += 1
        blocks.append(Block(len(blocks) + 1, start + 1, "\n".join(body) + "\n"))
    return blocks


def claims(code: str) -> dict[int, str]:
    """``{line within the block: claimed output}`` for every ``# -> TEXT`` comment."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        m = _CLAIM.match(tok.string) if tok.type == tokenize.COMMENT else None
        if m:
            found[tok.start[0]] = m.group(1).rstrip()
    return found


class _CheckedPrints(ast.NodeTransformer):
    """Turns ``print(...)`` calls that carry a claim into ``__docs_print__(line, ...)``."""

    def __init__(self, lines: set[int]):
        self.lines, self.hooked = lines, set()

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if not (isinstance(node.func, ast.Name) and node.func.id == "print"):
            return node
        line = next((n for n in (node.end_lineno, node.lineno) if n in self.lines), None)
        if line is None:
            return node
        self.hooked.add(line)
        hook = ast.copy_location(ast.Name(_PRINT_HOOK, ast.Load()), node.func)
        return ast.copy_location(
            ast.Call(hook, [ast.copy_location(ast.Constant(line), node), *node.args],
                     node.keywords), node)


class DocError(Exception):
    """A block failed or printed something other than what its comment claims."""


def _compile(block: Block, filename: str, shown: str):
    tree = ast.parse(block.code, filename)
    wanted = claims(block.code)
    hooks = _CheckedPrints(set(wanted))
    tree = ast.fix_missing_locations(hooks.visit(tree))
    unhooked = sorted(set(wanted) - hooks.hooked)
    if unhooked:
        raise DocError(f"{shown}: block {block.number}, line {block.line + unhooked[0] - 1}: "
                       "a '# ->' claim must end a print(...) call")
    ast.increment_lineno(tree, block.line - 1)
    return compile(tree, filename, "exec"), wanted


def run_blocks(path: Path, shown: str | None = None) -> None:
    """Run the blocks of ``path`` in this process; raise :class:`DocError` at the first problem."""
    path = Path(path).resolve()
    shown = shown or str(path)
    main = types.ModuleType("__main__")          # the blocks' module, as for `python file.py`
    main.__file__ = str(path)
    sys.modules["__main__"] = main
    printed: dict[int, list[str]] = {}

    def docs_print(line, *args, **kwargs):
        out = io.StringIO()
        print(*args, **{**kwargs, "file": out})
        sys.stdout.write(out.getvalue())
        printed.setdefault(line, []).append(out.getvalue())
    main.__dict__[_PRINT_HOOK] = docs_print

    for block in python_blocks(path.read_text()):
        print(f"{_RUNNING}block {block.number} (line {block.line})", file=sys.stderr, flush=True)
        code, wanted = _compile(block, str(path), shown)
        printed.clear()
        try:
            exec(code, main.__dict__)
        except Exception as e:
            traceback.print_exc()
            raise DocError(f"{shown}: block {block.number} (line {block.line}) raised "
                           f"{type(e).__name__}: {e}") from None
        for line, text in sorted(wanted.items()):
            where = f"{shown}: block {block.number}, line {block.line + line - 1}"
            outputs = printed.get(line, [])
            if not outputs:
                raise DocError(f"{where}: the print claiming {text!r} never ran")
            for out in outputs:
                got = out[:-1] if out.endswith("\n") else out
                if got != text:
                    raise DocError(f"{where}: printed {got!r}, the comment claims {text!r}")


def run_doc(path: Path, *, timeout: float, cwd: Path, shown: str | None = None,
            env: dict | None = None) -> str | None:
    """Run ``path``'s blocks in a fresh interpreter; ``None`` when all is well, else the reason."""
    cmd = [sys.executable, str(Path(__file__).resolve()), str(Path(path).resolve())]
    if shown:
        cmd += ["--shown", shown]
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        running = [ln[len(_RUNNING):] for ln in err.splitlines() if ln.startswith(_RUNNING)]
        return (f"{shown or path}: still running after {timeout:.0f} s, in "
                f"{running[-1] if running else 'its start-up'}")
    if done.returncode == 0:
        return None
    lines = [ln for ln in done.stderr.splitlines() if not _NATIVE_LOG.match(ln)]
    reason = [ln[len(_FAILED):] for ln in lines if ln.startswith(_FAILED)]
    rest = "\n".join(ln for ln in lines if not ln.startswith((_RUNNING, _FAILED)))
    head = reason[0] if reason else f"{shown or path}: exit status {done.returncode}"
    return f"{head}\n\n{rest[-6000:]}\n{done.stdout[-2000:]}".rstrip()


def main(argv: list[str]) -> int:
    shown = argv[argv.index("--shown") + 1] if "--shown" in argv else None
    try:
        run_blocks(Path(argv[0]), shown)
    except DocError as e:
        print(f"{_FAILED}{e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path[0] = os.getcwd()      # imports resolve as for a reader's script, not from tests/
    sys.exit(main(sys.argv[1:]))
