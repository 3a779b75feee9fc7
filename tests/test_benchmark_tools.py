"""The benchmark tooling: the entry point's help, timing summaries with spread, 3-digit result files."""
from __future__ import annotations

import json

from benchmarks import common


def test_entry_point_without_arguments_prints_help_and_runs_nothing(capsys):
    import benchmarks.__main__ as entry

    assert entry.main([]) == 0
    out = capsys.readouterr().out
    assert "usage: python -m benchmarks" in out and "--out" in out and "--quick" in out


def test_summary_has_median_and_interquartile_range():
    s = common.summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["median_ms"] == 3.0 and s["min_ms"] == 1.0 and s["samples"] == 5
    assert s["iqr_ms"] == 52.0 - 1.5  # statistics.quantiles, exclusive method
    assert common.summarize([2.5])["iqr_ms"] == 0.0
    timed = common.bench_interleaved({"a": lambda: None, "b": lambda: None}, rounds=4)
    assert set(timed) == {"a", "b"} and all("iqr_ms" in v for v in timed.values())


def test_result_files_have_three_significant_digits(tmp_path):
    assert [common.round_sig(v) for v in (12345.678, 0.000123456, -987.65, 0.0)] == [12300.0, 0.000123, -988.0, 0.0]
    md = common.save_results("x", {"device": "cpu", "ratio": 1.23456789}, [{"ms": 1234.5678, "speedup": 2.0 / 3}],
                             ["ms", "speedup"], out_dir=tmp_path)
    data = json.loads((tmp_path / "x.json").read_text())
    assert data["rows"] == [{"ms": 1230.0, "speedup": 0.667}] and data["meta"]["ratio"] == 1.23
    assert "| 1230 | 0.667 |" in md.read_text()


def test_cpu_attention_bench_cache_modes_call_each_function_as_described(monkeypatch):
    """bench_attention_cpu's --cache: "warm" runs an untimed call of the same function just before each
    timed one, "mixed" and "cold" only the timed ones (cold writes a buffer between them instead)."""
    from benchmarks import bench_attention_cpu as bench

    monkeypatch.setattr(bench, "COLD_BYTES", 1 << 12)  # a small buffer: the call pattern, not the flush
    for cache, per_sample in (("mixed", 1), ("warm", 2), ("cold", 1)):
        calls = {"a": 0, "b": 0}
        fns = {name: (lambda n=name: calls.__setitem__(n, calls[n] + 1)) for name in calls}
        samples = bench.time_interleaved(fns, rounds=3, clock="wall", cache=cache)
        assert {n: len(s) for n, s in samples.items()} == {"a": 3, "b": 3}
        assert calls == {"a": 1 + 3 * per_sample, "b": 1 + 3 * per_sample}, cache  # 1: the warm-up call
