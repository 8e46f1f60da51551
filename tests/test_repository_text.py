"""What a reader of any file of the repository sees: no project-internal jargon, no links out.

The repository is read by users who never saw how it was built, so no file may speak of the
work that produced it (numbered issues, numbered sessions or periods of work, stage names
such as a letter and a digit for a piece of work), or point outside the repository (web links,
paths of the machine it was written on, planning documents that are not part of it).
Markdown links must lead to files that exist in the repository.  LICENSE is exempt: it is the
license's own text.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXEMPT = {"LICENSE"}
_SKIPPED_DIRS = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis"}

# Each pattern names what it catches; they are written so that ordinary code and prose (a TF
# `Session`, a tensor named `T1`, a paper's "Figure 3") do not match.
JARGON = {
    "an issue number": re.compile(r"\bissues?\s*#?\s*\d+|\(#\d+\)|\bPR\s*#\d+", re.I),
    "a session": re.compile(r"\bsessions?[- ]?\d+|\b(?:this|last|previous|next|earlier|later"
                            r"|current)\s+(?:work\s+)?session\b|\bsame-session\b", re.I),
    "a period of work": re.compile(r"\bwork[- ]periods?\b|\bperiod\s+\d+\b|\bwave\s+\d+"
                                   r"|\bthis wave\b", re.I),
    "a stage name": re.compile(r"\b[PT]\d\b(?:'s\b|\)|\s+(?:tests?|modules?|files?|backends?|work"
                               r"|stages?|subsections?|sections?|parts?|converters?)\b)"
                               r"|\([PT]\d\)|\bstage\s+[A-Z]?\d\b"),
    "a web link": re.compile(r"\b(?:https?|ftp)://|\bwww\.\w", re.I),  # file:// is local
    # (spelt so that this file does not match itself)
    "a path outside the repository": re.compile(r"/wor[k]/|\.\./share[d]\b|/tmp/peer[s]|"
                                                r"\b(?:DESIGN|STYLE|PEERS)\.md\b"),
}
_MD_LINK = re.compile(r"(?<!\\)\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def repository_files() -> list[Path]:
    """Tracked and new (not ignored) files; every file outside the usual build folders when the
    tree is not a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"],
                             cwd=ROOT, capture_output=True, check=True, timeout=60).stdout
        names = sorted({n for n in out.decode().split("\0") if n})
    except (OSError, subprocess.SubprocessError):
        names = sorted(os.path.relpath(os.path.join(d, f), ROOT)
                       for d, dirs, files in os.walk(ROOT)
                       for _ in [dirs.__setitem__(slice(None), [x for x in dirs
                                                                if x not in _SKIPPED_DIRS])]
                       for f in files)
    return [ROOT / n for n in names if n not in EXEMPT and (ROOT / n).is_file()]


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file (a PNG, a compiled object)."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def jargon_in(text: str) -> list[tuple[int, str, str]]:
    """``(line, what, matched text)`` for every piece of jargon or outside link in ``text``."""
    return [(n, what, m.group(0)) for n, line in enumerate(text.splitlines(), 1)
            for what, pattern in JARGON.items() for m in pattern.finditer(line)]


def broken_links(path: Path, text: str) -> list[tuple[int, str, str]]:
    """Markdown links of ``path`` that leave the repository or lead to no file."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for target in _MD_LINK.findall(line):
            if target.startswith("#") or re.match(r"^[a-z]+:", target):
                continue                    # an anchor; web links are JARGON's business
            resolved = (path.parent / target.split("#")[0]).resolve()
            if target.startswith("/") or not resolved.is_relative_to(ROOT):
                found.append((n, "a link outside the repository", target))
            elif not resolved.exists():
                found.append((n, "a link to a missing file", target))
    return found


def _problems(check, suffixes: tuple[str, ...] = ()) -> list[str]:
    problems = []
    for path in repository_files():
        text = text_of(path) if not suffixes or path.suffix in suffixes else None
        if text is not None:
            problems += [f"{path.relative_to(ROOT)}:{n}: {what}: {hit!r}"
                         for n, what, hit in check(path, text)]
    return problems


def test_no_jargon_or_outside_links_in_any_file():
    problems = _problems(lambda path, text: jargon_in(text))
    assert not problems, "\n".join(problems)


def test_markdown_links_lead_to_files_in_the_repository():
    problems = _problems(broken_links, (".md",))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("text", [
    "see issue #" + "5", "Issue " + "20 asks", "(#" + "12)", "in session" + "-3",
    "session " + "4's runs",
    "tried this " + "session", "a same-" + "session comparison", "work " + "period", "wave " + "2",
    "P" + "2's converters", "(P" + "3)", "T" + "1's CPrinter", "the P" + "2 test files",
    "htt" + "ps://example.org", "www" + ".example.org", "../sha" + "red/DESI" + "GN.md",
    "/wo" + "rk/main",
    "ST" + "YLE.md §10", "/tmp/pe" + "ers-x",
])
def test_the_patterns_catch(text):
    assert jargon_in(text), text


@pytest.mark.parametrize("text", [
    "with tf.compat.v1.Session() as sess:", "O2's band", "S0[m, n]", "T1 = tile(x)",
    "paper Figure 3, §3.5", "the session runs the graph", "period of 3 steps", "LUT1, L1 cache",
    "issues a warning", "#pragma omp parallel for", "x = tensor[2]  # P90 latency",
])
def test_the_patterns_spare(text):
    assert not jargon_in(text), jargon_in(text)


def test_the_link_check(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("x")
    page = tmp_path / "README.md"
    text = ("[ok](docs/a.md) [anchor](#top) [ok too](docs/a.md#part) [gone](docs/b.md)\n"
            "[out](../elsewhere.md) [abs](/etc/passwd) ![plot](docs/a.md)")
    assert [(n, what, t) for n, what, t in broken_links(page, text)] == [
        (1, "a link to a missing file", "docs/b.md"),
        (2, "a link outside the repository", "../elsewhere.md"),
        (2, "a link outside the repository", "/etc/passwd")]
