"""Smoke tests of examples/ and of the benchmark entry point / plots (small sizes, a few epochs)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("torch_geometric")

ROOT = Path(__file__).resolve().parents[1]


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def train():
    return _example("train")


def _has_cora():
    from gnnfuse.datasets import find

    return find("Cora") is not None


def _has_facebook():
    from gnnfuse.datasets import find

    return find("Facebook") is not None


# ---- examples/train.py ---------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["gcn", "sage", "gin", "gat"])
def test_train_synthetic_compare(train, model):
    summary = train.main(["--model", model, "--dataset", "synthetic", "--epochs", "4", "--compare", "--no-progress"])
    assert summary["dataset"] == "synthetic"
    for backend in ("gnnfuse", "pyg"):
        s = summary[backend]
        assert 0.0 <= s["test_acc"] <= 100.0 and s["epoch_ms"] > 0 and len(s["runs"]) == 1
    assert summary["speedup"] > 0
    if model == "gcn":  # same seed, same weights, same dropout masks: the two backends agree
        assert summary["gnnfuse"]["runs"][0]["final_loss"] == pytest.approx(summary["pyg"]["runs"][0]["final_loss"],
                                                                         rel=1e-4)


def test_train_seeds_report_std(train, capsys):
    summary = train.main(["--dataset", "synthetic", "--epochs", "3", "--seeds", "2", "--backend", "pyg",
                          "--no-progress"])
    assert len(summary["pyg"]["runs"]) == 2 and "gnnfuse" not in summary
    assert "2 seeds: mean ± sample std" in capsys.readouterr().out


def test_train_learns_synthetic(train):
    summary = train.main(["--dataset", "synthetic", "--epochs", "20", "--no-progress"])
    run = summary["gnnfuse"]["runs"][0]
    assert run["final_loss"] < 1.9  # starts at ~ln(7) = 1.95 and must go down
    assert summary["gnnfuse"]["test_acc"] > 100 / 7  # better than chance


@pytest.mark.parametrize("method", ["rcm", "community"])
def test_train_reorder_gives_the_same_training(train, capsys, method):
    """Renumbering the nodes changes no result: the same loss and accuracies (dropout off: its masks
    would follow the new node order)."""
    argv = ["--dataset", "synthetic", "--epochs", "4", "--dropout", "0", "--no-progress"]
    plain = train.main(argv)["gnnfuse"]["runs"][0]
    reordered = train.main(argv + ["--reorder", method])["gnnfuse"]["runs"][0]
    assert "reordered the nodes" in capsys.readouterr().out
    assert reordered["final_loss"] == pytest.approx(plain["final_loss"], rel=1e-5)
    for key in ("test_acc", "final_test_acc", "best_val_acc"):
        assert reordered[key] == pytest.approx(plain[key], abs=1e-6), key


@pytest.mark.skipif(not _has_cora(), reason="Cora raw files not found (../shared/data or $GNNFUSE_DATA)")
def test_train_cora_few_epochs(train):
    summary = train.main(["--dataset", "Cora", "--epochs", "15", "--no-progress"])
    assert summary["dataset"] == "Cora"
    assert summary["gnnfuse"]["test_acc"] > 40.0


@pytest.mark.skipif(not _has_facebook(), reason="musae-facebook not found (../shared/data or $GNNFUSE_DATA)")
def test_train_facebook_sparse_features(train):
    summary = train.main(["--model", "sage", "--dataset", "Facebook", "--epochs", "2", "--hidden", "16",
                          "--compare", "--no-progress"])
    assert summary["dataset"] == "Facebook"
    assert summary["gnnfuse"]["test_acc"] > 0 and summary["pyg"]["test_acc"] > 0


def test_missing_data_falls_back_to_synthetic(train, tmp_path, monkeypatch, capsys):
    import torch_geometric.datasets

    class Offline:
        def __init__(self, *args, **kwargs):
            raise OSError("no network")

    monkeypatch.setattr(torch_geometric.datasets, "Planetoid", Offline)
    data, name = train.load_dataset("Cora", str(tmp_path))
    assert name == "synthetic" and data.num_nodes > 0
    data, name = train.load_dataset("Facebook", str(tmp_path))
    assert name == "synthetic"
    out = capsys.readouterr().out
    assert "Cora is not reachable" in out and "Facebook Page-Page not found" in out


@pytest.mark.skipif(not _has_facebook(), reason="musae-facebook not found (../shared/data or $GNNFUSE_DATA)")
def test_load_facebook_split_is_stratified_and_seeded():
    from gnnfuse.datasets import load_facebook

    data = load_facebook(seed=3)
    n = 22_470
    assert data.x.shape == (n, 4714) and data.x.layout == torch.sparse_csr
    assert data.x.values().sum().item() == 314_583 and data.edge_index.shape == (2, 341_825)
    assert data.y.shape == (n,) and int(data.y.max()) == 3 and len(data.classes) == 4
    masks = torch.stack([data.train_mask, data.val_mask, data.test_mask])
    assert bool((masks.sum(0) == 1).all())  # a partition
    for c in range(4):
        share = masks[:, data.y == c].float().mean(1)
        assert torch.allclose(share, torch.tensor([0.6, 0.2, 0.2]), atol=1e-3)
    again = load_facebook(seed=3)
    assert torch.equal(again.train_mask, data.train_mask) and torch.equal(again.y, data.y)
    assert not torch.equal(load_facebook(seed=4).train_mask, data.train_mask)


# ---- seed-op examples ------------------------------------------------------------------------------------
def test_density_map_example(tmp_path):
    result = _example("density_map").main(["--atoms", "64", "--grid", "16", "--box", "4",
                                           "--png", str(tmp_path / "map.png")])
    assert result["max_abs_diff"] < 1e-4 and result["map"].shape == (16 ** 3,)
    assert (tmp_path / "map.png").stat().st_size > 0


def test_planarity_refine_loss_goes_down():
    result = _example("planarity_refine").main(["--rings", "2", "--steps", "4"])
    losses = result["losses"]
    assert all(b < a for a, b in zip(losses, losses[1:]))
    assert result["rms"] < 0.05


# ---- benchmarks entry point and plots ---------------------------------------------------------------------
def test_quick_args_follow_the_scripts_parsers():
    import benchmarks.__main__ as entry
    import benchmarks.bench_cpu
    import benchmarks.bench_structured_scatter

    argv = entry.suite_argv("cpu", Path("/tmp/x"), "cpu", True, ["--widths", "32"], benchmarks.bench_cpu)
    assert argv == ["--out", "/tmp/x", "--quick", "--max-seconds", "0.5", "--widths", "32"]
    argv = entry.suite_argv("structured", Path("/tmp/x"), "cpu", True, [], benchmarks.bench_structured_scatter)
    assert argv[:4] == ["--out", "/tmp/x", "--device", "cpu"] and "--configs" in argv


def _fake_results(tmp_path: Path):
    meta = {"date": "2026-11-21 12:00 UTC", "gpu": "NVIDIA H100", "copy_GBps": 3000.0}
    gpu_rows = [dict(graph=g, F=F, ours_sum=1.0, GBps_sum=1000.0 + F, x_vs_cusparse=1.5, x_vs_compile=2.0,
                     x_vs_index_add=3.0, ours_sum_fwdbwd=2.0, cusparse_fwdbwd=3.0)
                for g in ("arxiv-like", "hub-stress") for F in (32, 64, 128, 256)]
    gpu_rows.append(dict(graph="arxiv-like", F=128, sweep="csr be=32", sum_csr=1.0))
    (tmp_path / "gpu_h100_2026-11-21.json").write_text(json.dumps({"meta": meta, "rows": gpu_rows}))
    cpu_rows = [{"graph": g, "F": F, "reduce": red, "pass": p, "threads": 2, "kind": "op", "gnnfuse_ms": 1.0,
                 "vs sparse.mm": 1.2, "vs index_add": 4.0, "vs compiled": None}
                for g in ("Cora", "rfc-uniform") for F in (32, 128) for red in ("sum", "max")
                for p in ("fwd", "fwd+bwd")]
    cpu_rows.append({"graph": "Cora", "kind": "csr-build", "gnnfuse_ms": 1.0, "argsort_ms": 1.0})
    (tmp_path / "cpu_cpu-2t_2026-11-21.json").write_text(json.dumps({"meta": {"cpu": "x"}, "rows": cpu_rows}))
    e2e_rows = [dict(dataset=d, model=m, speedup_vs_best_stock=1.3, speedup_vs_edge_index=2.0)
                for d in ("Cora", "Facebook") for m in ("GCN", "SAGE-mean")] + [dict(dataset="X", status="skip")]
    (tmp_path / "e2e_cpu-2t.json").write_text(json.dumps({"meta": {"benchmark": "bench_e2e"}, "rows": e2e_rows}))
    (tmp_path / "unrelated.json").write_text(json.dumps([1, 2]))


def test_plots_from_results_files(tmp_path):
    from benchmarks.plots import plot_dir

    _fake_results(tmp_path)
    pngs = {p.name for p in plot_dir(tmp_path)}
    assert pngs == {"gpu_h100_2026-11-21_speedup.png", "gpu_h100_2026-11-21_bandwidth.png",
                    "cpu_cpu-2t_2026-11-21_speedup.png", "e2e_cpu-2t_speedup.png"}
    assert all((tmp_path / p).stat().st_size > 1000 for p in pngs)


@pytest.mark.slow
def test_benchmark_entry_point_quick(tmp_path):
    import benchmarks.__main__ as entry

    rc = entry.main(["--suite", "planarity", "--quick", "--out", str(tmp_path), "--", "--sizes", "1000"])
    assert rc == 0
    data = json.loads((tmp_path / "planarity_cpu-{}t.json".format(torch.get_num_threads())).read_text())
    assert data["rows"][0]["atoms"] == 1000
    assert list(tmp_path.glob("*_speedup.png"))
