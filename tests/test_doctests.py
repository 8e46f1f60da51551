"""The runnable examples in every tfx_vec docstring pass (``doctest``), module by module."""
import doctest
import importlib
import pkgutil

import pytest

import tfx_vec

MODULES = ["tfx_vec"] + sorted(m.name for m in pkgutil.walk_packages(tfx_vec.__path__,
                                                                    "tfx_vec."))


def test_examples_exist_in_most_modules():
    with_examples = [name for name in MODULES
                     if doctest.DocTestFinder().find(importlib.import_module(name))
                     and any(t.examples for t in
                             doctest.DocTestFinder().find(importlib.import_module(name)))]
    assert len(with_examples) >= 0.75 * len(MODULES), sorted(set(MODULES) - set(with_examples))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)     # examples that write files (caches) write them here
    result = doctest.testmod(importlib.import_module(name), report=True,
                             optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {name} failed"


def test_public_names_survive_importing_every_submodule():
    """A public function named like its submodule (``tc_ops.autotune``, ``lazy.tensor``) must stay
    the function after the submodule is imported elsewhere (here: by walking every module)."""
    import types
    for name in MODULES:
        importlib.import_module(name)
    from tfx_vec import lazy, tc_ops
    for pkg, attr in [(tc_ops, "autotune"), (lazy, "tensor")]:
        assert not isinstance(getattr(pkg, attr), types.ModuleType), f"{pkg.__name__}.{attr}"
    for pkg_name in ["tfx_vec", "tfx_vec.pfor", "tfx_vec.autobatch", "tfx_vec.lazy", "tfx_vec.tc_ops"]:
        pkg = importlib.import_module(pkg_name)
        for public in getattr(pkg, "__all__", []):
            value = getattr(pkg, public)
            assert not isinstance(value, types.ModuleType) or public in {
                "pfor", "autobatch", "lazy", "tc_ops", "distribute", "data"}, \
                f"{pkg_name}.{public} is a module"
