"""Every ```python block of README.md and docs/**/*.md runs as written, with the output it claims.

The files are collected when the tests run, so a guide added to docs/ is tested without
touching this file.  Each file runs in a fresh interpreter (``tests/docs_runner.py``): its
blocks in order, in one namespace, in a scratch working directory (examples that write files
write them there).  Keep each file's examples small: the whole file should take seconds.
"""
from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest

from tests.docs_runner import python_blocks, run_doc

ROOT = Path(__file__).resolve().parents[1]
DOC_TIMEOUT_S = 300      # a file's examples take ~15 s; the margin is for a loaded 2-core machine


def documentation() -> list[Path]:
    """README.md and every Markdown file under docs/."""
    docs = ROOT / "docs"
    return [ROOT / "README.md"] + (sorted(docs.rglob("*.md")) if docs.is_dir() else [])


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


WITH_EXAMPLES = [p for p in documentation() if python_blocks(p.read_text())]


@pytest.mark.parametrize("doc", WITH_EXAMPLES, ids=_name)
def test_examples_run_as_documented(doc, tmp_path):
    failure = run_doc(doc, timeout=DOC_TIMEOUT_S, cwd=tmp_path, shown=_name(doc), env=_env())
    assert failure is None, failure


_FENCE = re.compile(r"^ *```(.*)$")
_NOT_RUN = {"py", "python3", "pycon", "ipython", "py3", "Python"}


def fence_problems(text: str) -> list[str]:
    """Opening fences that would hide Python from the runner: no language, or Python spelt
    another way than ``python`` (use ```text for output, ```sh for shell commands)."""
    problems, inside = [], False
    for n, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if not m:
            continue
        if inside:
            inside = False
            continue
        inside, lang = True, m.group(1).strip()
        if not lang or lang in _NOT_RUN:
            problems.append(f"line {n}: ```{lang} (say ```python to have it run, or ```text, "
                            "```sh ...)")
    return problems


@pytest.mark.parametrize("doc", documentation(), ids=_name)
def test_every_code_block_says_its_language(doc):
    problems = fence_problems(doc.read_text())
    assert not problems, f"{_name(doc)}: " + "; ".join(problems)


def test_the_fence_check():
    text = "```python\nx\n```\n```\nout\n```\n```py\ny\n```\n```text\nz\n```\n"
    assert [p.split(":")[0] for p in fence_problems(text)] == ["line 4", "line 7"]


def test_readme_has_a_quickstart_per_subpackage():
    code = "".join(b.code for b in python_blocks((ROOT / "README.md").read_text()))
    for sub in ["pfor", "autobatch", "lazy", "tc_ops"]:
        assert f"tfx_vec.{sub}" in code or f"import {sub}" in code, sub


# -- the runner itself, on small Markdown files (no TensorFlow: these take well under a second) --

def _doc(tmp_path: Path, text: str, name: str = "page.md") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _run(path: Path, timeout: float = 60) -> str | None:
    return run_doc(path, timeout=timeout, cwd=path.parent, shown=path.name, env=_env())


def test_blocks_share_names_and_claims_hold(tmp_path):
    page = _doc(tmp_path, """\
        Text.

        ```python
        import inspect
        def double(x):
            return 2 * x
        ```

        ```text
        not run: print(1)  # -> 2
        ```

        ```python
        print(double(21))  # -> 42
        for k in range(2):
            print("same", end="")  # -> same
        print(inspect.getsource(double).splitlines()[0])  # -> def double(x):
        print(__name__)  # -> __main__
        ```
        """)
    assert _run(page) is None


def test_a_wrong_claim_names_file_block_and_line(tmp_path):
    page = _doc(tmp_path, """\
        ```python
        x = 0.1 + 0.2
        ```

        ```python
        print(round(x, 2))  # -> 0.3
        print(x)  # -> 0.3
        ```
        """)
    failure = _run(page)
    assert failure.splitlines()[0] == ("page.md: block 2, line 7: printed '0.30000000000000004', "
                                       "the comment claims '0.3'"), failure


def test_each_run_of_a_claimed_print_is_checked(tmp_path):
    page = _doc(tmp_path, """\
        ```python
        for k in range(3):
            print(min(k, 1))  # -> 0
        ```
        """)
    assert "line 3: printed '1', the comment claims '0'" in _run(page)


def test_a_claim_that_never_runs_or_is_not_on_a_print_fails(tmp_path):
    never = _doc(tmp_path, "```python\nif False:\n    print(1)  # -> 1\n```\n", "never.md")
    assert "never.md: block 1, line 3: the print claiming '1' never ran" in _run(never)
    value = _doc(tmp_path, "```python\nx = 1  # -> 1\n```\n", "value.md")
    assert "value.md: block 1, line 2: a '# ->' claim must end a print(...) call" in _run(value)


def test_an_error_names_the_block_and_the_traceback_the_markdown_line(tmp_path):
    page = _doc(tmp_path, """\
        - a list item with an indented block:

          ```python
          ok = 1
          ```

        ```python
        ok += 1
        {}["missing"]
        ```
        """)
    failure = _run(page)
    assert failure.splitlines()[0] == "page.md: block 2 (line 8) raised KeyError: 'missing'"
    assert f'File "{page.resolve()}", line 9' in failure


def test_a_hanging_block_is_stopped_and_named(tmp_path):
    page = _doc(tmp_path, "```python\nx = 1\n```\n\n```python\nimport time\ntime.sleep(60)\n```\n")
    assert _run(page, timeout=5) == "page.md: still running after 5 s, in block 2 (line 6)"
