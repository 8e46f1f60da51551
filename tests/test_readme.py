"""Every ```python block of README.md runs as written (the examples are part of the contract).

Each block is written to a file and run with ``runpy`` so that code needing its own source
(``autobatch.function`` reads it with ``inspect``) works as it does for a user.  Sections test
their examples' values in their own suites; this test guards against examples that rot.
"""
import pathlib
import re
import runpy

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def _section_of(code: str) -> str:
    text = README.read_text()
    at = text.index(code)
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"<!-- section:(\w+) -->", text)]
    return ([name for pos, name in starts if pos < at] or ["top"])[-1]


def test_readme_has_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("k", range(len(BLOCKS)), ids=[f"{_section_of(b)}-{k}" for k, b in enumerate(BLOCKS)])
def test_readme_block_runs(k, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)     # examples that write files (e.g. a tuning cache) write them here
    path = tmp_path / f"readme_block_{k}.py"
    path.write_text(BLOCKS[k])
    runpy.run_path(str(path), run_name="__main__")
