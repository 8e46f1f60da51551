import json

from benchmarks.harness import Report, time_fn


def test_time_fn_counts_repeats():
    calls = []
    t = time_fn(lambda: calls.append(1), repeats=4, warmup=2, inner=3)
    assert len(calls) == 2 + 4 * 3
    assert t.repeats == 4 and t.min <= t.median <= t.max


def test_report_ratio_and_table(tmp_path):
    r = Report("unit", unit="ms", ours="us")
    r.add("case", "us", 2.0)
    r.add("case", "peer", 6.0)
    assert r.ratio("case", "peer") == 3.0          # 3x faster than the peer
    t = Report("thr", unit="items/s", ours="us", higher_is_better=True)
    t.add("c", "us", 10.0)
    t.add("c", "peer", 5.0)
    assert t.ratio("c", "peer") == 2.0
    assert "3.00x" in r.table()
    jpath, _ = r.save(tmp_path)
    data = json.loads(jpath.read_text())
    assert data["ratios"]["case"]["peer"] == 3.0


def test_measure_interleaved_rounds_and_failures():
    calls = {"a": 0, "b": 0}

    def a():
        calls["a"] += 1

    def b():
        calls["b"] += 1

    def broken():
        raise RuntimeError("peer cannot run this case")

    r = Report("inter", unit="items/s", ours="a", higher_is_better=True)
    t = r.measure_interleaved("c", {"a": a, "b": b, "x": broken}, items=10, rounds=3, warmup=2,
                              inner=2)
    assert calls == {"a": 2 + 3 * 2, "b": 2 + 3 * 2}
    assert set(t) == {"a", "b"} and r.impls() == ["a", "b"]
    assert "x: failed (RuntimeError: peer cannot run this case)" in r.notes
    assert r.value("c", "a") == 10 / t["a"].median


def test_measure_interleaved_varies_who_runs_before_whom(monkeypatch):
    # A sample pays for what the previous implementation left behind (spinning thread
    # pools), so no implementation may always follow the same one.
    import benchmarks.harness as harness
    monkeypatch.setattr(harness, "_SETTLE_S", 0.0)
    sequence = []
    impls = {name: (lambda name=name: sequence.append(name)) for name in "abcd"}
    Report("order", unit="items/s", ours="a").measure_interleaved("c", impls, rounds=12,
                                                                   warmup=1)
    n = len(impls)
    rounds = [sequence[k:k + n] for k in range(n, len(sequence), n)]
    assert all(sorted(r) == sorted(impls) for r in rounds)
    before = {name: {p for r in rounds for p, q in zip(r, r[1:]) if q == name} for name in impls}
    assert all(len(preds) >= 2 for preds in before.values()), before


def test_quick_runs_write_beside_full_runs(tmp_path, monkeypatch):
    """`make bench` (--quick) must never overwrite the full-size results the docs cite."""
    import sys
    import types

    import benchmarks.__main__ as cli
    import benchmarks.harness as harness
    monkeypatch.setattr(harness, "RESULTS", tmp_path)

    def run(quick):
        r = Report("fake_bench", unit="ms")
        r.add("case", "tfx_vec", 2.0 if quick else 1.0)
        return r
    monkeypatch.setitem(sys.modules, "benchmarks.fake_bench", types.SimpleNamespace(run=run))
    monkeypatch.setattr(cli, "available", lambda: ["fake_bench"])
    assert cli.main(["fake_bench"]) == 0
    assert cli.main(["--quick", "fake_bench"]) == 0
    full = json.loads((tmp_path / "fake_bench.json").read_text())
    quick = json.loads((tmp_path / "quick" / "fake_bench.json").read_text())
    assert [full["rows"][0]["value"], quick["rows"][0]["value"]] == [1.0, 2.0]
