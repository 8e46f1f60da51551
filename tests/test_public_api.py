"""help() helps: every public module says what it exports, and every export shows how to use it.

Public modules: the package, its four subpackages, every module a public module lists in its
``__all__``, and every module the documentation (README.md, docs/**/*.md) imports from.  Each
has an ``__all__`` whose names all exist, and a docstring with an example.  Every function,
class, module or other callable named in an ``__all__`` has a docstring of its own with a
runnable example: doctest lines (``>>>``, run by tests/test_doctests.py) or an ``Example:``
section.  Plain values (strings, numbers, tuples, dicts) carry no docstring of their own and are
only checked to exist.
"""
from __future__ import annotations

import importlib
import inspect
import os
import pydoc
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.docs_runner import python_blocks

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["tfx_vec", "tfx_vec.pfor", "tfx_vec.autobatch", "tfx_vec.lazy", "tfx_vec.tc_ops"]
_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(tfx_vec[\w.]*)[ \t]+import[ \t]+\(?([\w \t,]+)"
                     r"|import[ \t]+([\w., \t]+))", re.M)
_EXAMPLE = re.compile(r"^\s*>>>|^\s*Examples?:{1,2}\s*$|^\s*Examples?\s*\n\s*-{3,}\s*$", re.M)


def _documented_imports() -> set[str]:
    """Modules the documentation's Python blocks import from (``from M import a``: M, and a
    when it is a module)."""
    docs = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    found = set()
    for doc in filter(Path.exists, docs):
        for block in python_blocks(doc.read_text()):
            for source, names, plain in _IMPORT.findall(block.code):
                if source:
                    found.add(source)
                    found.update(f"{source}.{n.split(' as ')[0].strip()}"
                                 for n in names.split(",") if n.strip())
                else:
                    found.update(m.split(" as ")[0].strip() for m in plain.split(","))
    return {m for m in found if m.startswith("tfx_vec") and _is_module(m)}


def _is_module(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def public_modules() -> list[str]:
    todo, seen = PACKAGES + sorted(_documented_imports()), []
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.append(name)
        module = importlib.import_module(name)
        todo += [v.__name__ for v in map(lambda n: getattr(module, n, None),
                                         getattr(module, "__all__", []))
                 if isinstance(v, types.ModuleType)]
    return seen


MODULES = public_modules()
EXPORTS = [(m, n) for m in MODULES for n in getattr(importlib.import_module(m), "__all__", [])]


def has_example(doc: str | None) -> bool:
    return bool(doc and _EXAMPLE.search(doc))


def own_doc(value) -> str | None:
    """The docstring written for ``value`` itself (a class does not inherit its base's)."""
    if isinstance(value, type):
        return value.__dict__.get("__doc__")
    return getattr(value, "__doc__", None)


@pytest.mark.parametrize("name", MODULES)
def test_module_has_all_and_an_example(name):
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported, f"{name} has no __all__: help({name}) cannot tell what is public"
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"
    assert has_example(module.__doc__), f"{name}'s docstring has no example (>>> or Example:)"


@pytest.mark.parametrize("module_name,name", EXPORTS, ids=[f"{m}.{n}" for m, n in EXPORTS])
def test_export_has_a_docstring_with_an_example(module_name, name):
    value = getattr(importlib.import_module(module_name), name)
    if isinstance(value, types.ModuleType) or not callable(value):
        return      # a module is checked as one of MODULES; a plain value has no docstring
    doc = own_doc(value)
    assert doc and doc.strip(), f"{module_name}.{name} has no docstring"
    assert has_example(doc), f"{module_name}.{name}'s docstring has no example (>>> or Example:)"


@pytest.mark.parametrize("name", PACKAGES)
def test_help_lists_the_exports(name):
    module = importlib.import_module(name)
    text = pydoc.render_doc(module, renderer=pydoc.plaintext)
    for public in module.__all__:
        value = getattr(module, public)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert re.search(rf"^\s*(class )?{public}\b", text, re.M), \
                f"help({name}) does not show {public}"


def test_the_example_pattern():
    assert has_example(">>> f(1)\n2") and has_example("Do it.\n\nExample:\n    f(1)\n")
    assert has_example("Examples\n--------\nf(1)")
    assert not has_example("Example of nothing.") and not has_example(None)


def test_the_package_loads_subpackages_on_first_use():
    code = ("import sys, tfx_vec; assert 'tfx_vec.lazy' not in sys.modules; "
            "import tfx_vec as t; t.lazy.mark_step; t.autobatch.function; t.tc_ops.define; "
            "print(sorted(m for m in ('tfx_vec.lazy', 'tfx_vec.autobatch', 'tfx_vec.tc_ops') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "['tfx_vec.autobatch', 'tfx_vec.lazy', 'tfx_vec.tc_ops']"
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        importlib.import_module("tfx_vec").nonexistent
