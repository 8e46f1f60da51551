"""Compilation cache: round trip, best-k, templated names, corruption, two writing processes."""
import json
import multiprocessing
import os
import warnings

import pytest

from tfx_vec.tc_ops.cache import CacheWarning, CompilationCache, canonical_tc

TMM = """
def tmm(float(M,K) A, float(N,K) B) -> (C) {
    C(m,n) +=! A(m,kk) * B(n,kk)   # transposed matmul
}
"""
TMM_RENAMED = "def mm(float(P,Q) X, float(R,Q) Y)->(Z){Z(p,r)+=!X(p,q)*Y(r,q)}"
SHAPES = [((3, 4), "float32"), ((5, 4), "float32")]


def _key(cache, source=TMM, entry="tmm", shapes=SHAPES, backend="cpu", device="host"):
    return cache.key(source, entry, shapes, backend, device)


def test_round_trip_and_best_k(tmp_path):
    c = CompilationCache(tmp_path / "c.json", k=2)
    key = _key(c)
    assert c.lookup(key) == [] and c.best(key) is None
    c.record(key, {"tile": [8]}, 3e-3, source="/* v1 */")
    c.record(key, {"tile": [16]}, 1e-3, source="/* v2 */")
    c.record(key, {"tile": [32]}, 2e-3)
    c.record(key, {"tile": [16]}, 0.5e-3, source="/* v2 faster */")  # same options: replaced
    fresh = CompilationCache(tmp_path / "c.json", k=2)  # reads from disk
    got = fresh.lookup(key)
    assert [(e.options, e.runtime, e.source) for e in got] == [
        ({"tile": [16]}, 0.5e-3, "/* v2 faster */"), ({"tile": [32]}, 2e-3, None)]
    assert fresh.best(key).options == {"tile": [16]}


def test_key_templates_names_but_not_structure(tmp_path):
    c = CompilationCache(tmp_path / "c.json")
    assert _key(c) == _key(c, source=TMM_RENAMED, entry="mm")
    assert canonical_tc(TMM) == canonical_tc(TMM_RENAMED)
    different = [
        _key(c, source=TMM.replace("+=!", "max=!")),
        _key(c, shapes=[((3, 4), "float32"), ((6, 4), "float32")]),
        _key(c, shapes=[((3, 4), "float64"), ((5, 4), "float64")]),
        _key(c, backend="opencl"),
        _key(c, device="other"),
    ]
    assert len({k.digest for k in different + [_key(c)]}) == len(different) + 1
    c.record(_key(c), {"a": 1}, 1.0)
    assert c.best(_key(c, source=TMM_RENAMED, entry="mm")).options == {"a": 1}
    assert all(c.best(k) is None for k in different)


@pytest.mark.parametrize("content", [
    "{not json", '{"format": "someone.else", "version": 1, "keys": {}}', "[1, 2, 3]",
    '{"format": "tfx_vec.tc_ops.cache", "version": 999, "keys": {}}'])
def test_corrupt_or_foreign_file_is_reported_and_ignored(tmp_path, content):
    path = tmp_path / "c.json"
    path.write_text(content)
    c = CompilationCache(path)
    key = _key(c)
    with pytest.warns(CacheWarning, match="ignoring it"):
        assert c.lookup(key) == []
    with pytest.warns(CacheWarning):
        c.record(key, {"x": 1}, 1.0)  # replaces the bad file
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert c.best(key).options == {"x": 1}


def test_malformed_entry_is_skipped(tmp_path):
    c = CompilationCache(tmp_path / "c.json")
    key = _key(c)
    c.record(key, {"x": 1}, 1.0)
    data = json.loads((tmp_path / "c.json").read_text())
    data["keys"][key.digest]["entries"].append({"options": "nope", "runtime": "fast"})
    (tmp_path / "c.json").write_text(json.dumps(data))
    with pytest.warns(CacheWarning, match="malformed"):
        assert [e.options for e in c.lookup(key)] == [{"x": 1}]


def test_unserializable_options_fail_before_writing(tmp_path):
    c = CompilationCache(tmp_path / "c.json")
    with pytest.raises(TypeError):
        c.record(_key(c), {"x": object()}, 1.0)
    assert not (tmp_path / "c.json").exists()


def _writer(path, worker, n):
    c = CompilationCache(path, k=1000)
    for i in range(n):
        key = c.key(TMM, "tmm", [((worker + 1, i + 1), "float32")], "cpu")
        c.record(key, {"worker": worker, "i": i}, float(i + 1))


def test_two_processes_writing_keep_every_entry(tmp_path):
    path = str(tmp_path / "c.json")
    ctx = multiprocessing.get_context("fork")  # the child only needs cache.py, already imported
    procs = [ctx.Process(target=_writer, args=(path, w, 15)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    c = CompilationCache(path)
    for w in range(2):
        for i in range(15):
            key = c.key(TMM, "tmm", [((w + 1, i + 1), "float32")], "cpu")
            assert c.best(key).options == {"worker": w, "i": i}
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tc_cache.")]  # no temp left
