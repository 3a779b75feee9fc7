"""PNG plots from the benchmark JSON files (matplotlib, no display needed).

    python -m benchmarks.plots benchmarks/results/cpu-2t-2026-11-21        # every *.json in a folder
    python -m benchmarks.plots benchmarks/results/e2e_cpu-2t.json           # or given files

Each JSON (``{"meta": {...}, "rows": [...]}``, written by benchmarks.common.save_results) is recognised
by its rows and gets, next to it:
  cpu_*        <stem>_speedup.png    speed-up of gnnfuse per anchor (anchor time / gnnfuse time) against
                                     the feature width, one panel per graph and (reduction, pass)
  gpu_*        <stem>_speedup.png    the same for the Triton kernels (sum forward; fwd+bwd vs cuSPARSE)
               <stem>_bandwidth.png  achieved GB/s (minimum bytes / time) against the measured copy
                                     bandwidth, when the JSON has GBps_sum and meta.copy_GBps
  e2e_*        <stem>_speedup.png    training-epoch speed-up over stock PyG per dataset and model
  structured_* <stem>_speedup.png    structured_scatter_add vs index_add_ per configuration
  planarity_*  <stem>_speedup.png    planarity_nll vs the eager (and compiled) reference by size
Speed-ups are drawn on a log axis with a line at 1x (above it gnnfuse is faster).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, stem: Path, suffix: str) -> Path:
    """Writes ``fig`` as <stem><suffix>.png next to the results file and closes it."""
    fig.tight_layout()
    out = stem.with_name(stem.name + suffix + ".png")
    fig.savefig(out, dpi=110)
    _plt().close(fig)
    return out


def _num(v) -> float:
    return float(v) if isinstance(v, (int, float)) and v is not None and v > 0 else math.nan


def _title(meta: dict, what: str) -> str:
    where = meta.get("gpu") or f"{meta.get('cpu', '?')}, {meta.get('cpu_threads', '?')} threads"
    return f"{what}\n{where}, {meta.get('date', '')}"


def kind_of(path: Path, data: dict) -> str | None:
    rows = data.get("rows") or []
    keys = set().union(*(r.keys() for r in rows)) if rows else set()
    name = path.name
    if "x_vs_cusparse" in keys or name.startswith("gpu_"):
        return "gpu"
    if any(k.startswith("vs ") for k in keys) and "reduce" in keys:
        return "cpu"
    if "speedup_vs_best_stock" in keys or data.get("meta", {}).get("benchmark") == "bench_e2e":
        return "e2e"
    if "vs_index_add" in keys and "method" in keys:
        return "structured"
    if "atoms" in keys and "planes" in keys:
        return "planarity"
    return None


def _speedup_grid(rows, panels, graphs, title, out: Path) -> Path | None:
    """panels: list of (label, row filter, anchors [(key, legend)]); one subplot per (panel, graph);
    one line per anchor: speed-up against the feature width F."""
    plt = _plt()
    panels = [(label, sel, anchors) for label, sel, anchors in panels if any(sel(r) for r in rows)]
    if not panels or not graphs:
        return None
    keys = list(dict.fromkeys(k for _, _, anchors in panels for k, _ in anchors))  # one colour per anchor
    fig, axes = plt.subplots(len(panels), len(graphs), figsize=(3.2 * len(graphs) + 0.6, 2.8 * len(panels) + 0.8),
                             sharey=True, squeeze=False)
    for i, (label, sel, anchors) in enumerate(panels):
        for j, graph in enumerate(graphs):
            ax = axes[i][j]
            rs = sorted((r for r in rows if sel(r) and r.get("graph") == graph), key=lambda r: r["F"])
            for key, name in anchors:
                ys = [_num(r.get(key)) for r in rs]
                if any(not math.isnan(y) for y in ys):
                    ax.plot([r["F"] for r in rs], ys, marker="o", label=name, color=f"C{keys.index(key)}")
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
            ax.set_xscale("log", base=2)
            widths = sorted({r["F"] for r in rows})
            ax.set_xticks(widths, [str(w) for w in widths])
            ax.minorticks_off()
            ax.set_yscale("log")
            ax.grid(True, alpha=0.3)
            if i == 0:
                ax.set_title(graph, fontsize=10)
            if i == len(panels) - 1:
                ax.set_xlabel("feature width F")
            if j == 0:
                ax.set_ylabel(f"{label}\nspeed-up (x)", fontsize=9)
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    ncol = len(labels) if len(labels) <= 3 else 2
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8,
               title="speed-up = anchor time / gnnfuse time (medians); above the dashed 1x line gnnfuse is faster",
               title_fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.035 * (1 + (len(labels) - 1) // ncol) + 0.02, 1, 0.96))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_cpu(data: dict, stem: Path) -> list[Path]:
    rows = [r for r in data["rows"] if r.get("kind", "op") == "op" and "F" in r]
    if not rows:
        return []
    threads = max(r.get("threads", 1) for r in rows)
    rows = [r for r in rows if r.get("threads", 1) == threads]
    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    anchors = [("vs sparse.mm", "vs torch.sparse.mm"), ("vs index_add", "vs index_add_/scatter_reduce"),
               ("vs compiled", "vs torch.compile"), ("vs torch_scatter", "vs torch_scatter")]
    panels = [(f"{red} {p}", lambda r, red=red, p=p: r.get("reduce") == red and r.get("pass") == p, anchors)
              for red in dict.fromkeys(r["reduce"] for r in rows) for p in ("fwd", "fwd+bwd")]
    out = _speedup_grid(rows, panels, graphs,
                        _title(data["meta"], f"gnnfuse CPU fused_gather_scatter, {threads} threads"),
                        stem.with_name(stem.name + "_speedup.png"))
    return [out] if out else []


def plot_gpu(data: dict, stem: Path) -> list[Path]:
    rows = [r for r in data["rows"] if "sweep" not in r and "F" in r and "graph" in r]
    if not rows:
        return []
    for r in rows:
        if r.get("ours_sum_fwdbwd") and r.get("cusparse_fwdbwd"):
            r["x_vs_cusparse_fwdbwd"] = r["cusparse_fwdbwd"] / r["ours_sum_fwdbwd"]
    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    fwd = [("x_vs_cusparse", "vs cuSPARSE (torch.sparse.mm)"), ("x_vs_index_add", "vs index_add_"),
           ("x_vs_compile", "vs torch.compile"), ("x_vs_torch_scatter", "vs torch_scatter")]
    panels = [("sum fwd", lambda r: True, fwd),
              ("sum fwd+bwd", lambda r: r.get("x_vs_cusparse_fwdbwd") is not None,
               [("x_vs_cusparse_fwdbwd", "fwd+bwd vs cuSPARSE fwd+bwd")])]
    outs = []
    out = _speedup_grid(rows, panels, graphs, _title(data["meta"], "gnnfuse Triton fused_gather_scatter"),
                        stem.with_name(stem.name + "_speedup.png"))
    if out:
        outs.append(out)
    copy = data["meta"].get("copy_GBps")
    if copy and any(r.get("GBps_sum") for r in rows):
        plt = _plt()
        widths = sorted({r["F"] for r in rows})
        fig, ax = plt.subplots(figsize=(1.6 * len(graphs) + 3, 3.6))
        bar = 0.8 / len(widths)
        for k, F in enumerate(widths):
            ys = [_num(next((r.get("GBps_sum") for r in rows if r["graph"] == g and r["F"] == F), None))
                  for g in graphs]
            ax.bar([i + (k - (len(widths) - 1) / 2) * bar for i in range(len(graphs))], ys, bar, label=f"F={F}")
        ax.axhline(copy, color="black", ls="--", lw=1, label=f"copy bandwidth {copy:.0f} GB/s")
        ax.set_xticks(range(len(graphs)), graphs, rotation=15)
        ax.set_ylabel("GB/s (minimum bytes / time)")
        ax.legend(fontsize=8, ncol=2)
        ax.set_title(_title(data["meta"], "fused_gather_scatter sum: achieved bandwidth"), fontsize=10)
        outs.append(_save(fig, stem, "_bandwidth"))
    return outs


def _grouped_bars(ax, groups, series, value):
    """Bars: one group per `groups` item, one bar per `series` item; value(group, series) -> float."""
    width = 0.8 / max(len(series), 1)
    for k, s in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(groups))]
        ys = [_num(value(g, s)) for g in groups]
        bars = ax.bar(xs, ys, width, label=str(s))
        for b, y in zip(bars, ys):
            if not math.isnan(y):
                ax.annotate(f"{y:.2f}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(groups)), [str(g) for g in groups])


def plot_e2e(data: dict, stem: Path) -> list[Path]:
    rows = [r for r in data["rows"] if r.get("model")]
    if not rows:
        return []
    plt = _plt()
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    models = list(dict.fromkeys(r["model"] for r in rows))
    keys = [("speedup_vs_best_stock", "vs the faster stock PyG path"),
            ("speedup_vs_edge_index", "vs stock PyG edge_index")]
    keys = [(k, t) for k, t in keys if any(r.get(k) for r in rows)]
    if not keys:
        return []
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.6), squeeze=False)
    for ax, (key, label) in zip(axes[0], keys):
        _grouped_bars(ax, datasets, models,
                      lambda d, m: next((r.get(key) for r in rows if r["dataset"] == d and r["model"] == m), None))
        ax.set_ylabel("training-epoch speed-up (x)")
        ax.set_title(label, fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(_title(data["meta"], "end-to-end: one training epoch, gnnfuse.nn vs stock PyG"), fontsize=10)
    return [_save(fig, stem, "_speedup")]


def plot_structured(data: dict, stem: Path) -> list[Path]:
    rows = [r for r in data["rows"] if r.get("vs_index_add") and not str(r.get("method", "")).startswith("scaling")]
    if not rows:
        return []
    plt = _plt()

    def cube(v) -> str:  # the JSON holds '8^3' (newer) or 8 (older)
        return str(v).replace("^3", "") + "³"

    def config(r):
        return f"{r['atoms']} atoms\nbox {cube(r['box'])} → {cube(r['map'])}" + ("\nsorted" if r.get("sorted") else "")

    configs = list(dict.fromkeys(config(r) for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, ax = plt.subplots(figsize=(1.8 * len(configs) + 2, 3.8))
    _grouped_bars(ax, configs, methods,
                  lambda c, m: next((r["vs_index_add"] for r in rows if config(r) == c and r["method"] == m), None))
    ax.set_yscale("log")
    ax.set_ylabel("speed-up vs index_add_ (x, log)")
    ax.set_xlabel("configuration: atoms, box per atom → density map (voxels)", fontsize=8)
    legend = {"gnnfuse": "gnnfuse (bounds checked)", "gnnfuse_nocheck": "gnnfuse, check_bounds=False",
              "index_add": "index_add_ (anchor, 1x)", "seed": "first design (C++)", "serial": "serial loop (C++)",
              "backward": "gnnfuse backward vs index_select", "index_select": "index_select (backward anchor)"}
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, [legend.get(k, k) for k in labels], fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0),
              title="anchor time / time (medians)", title_fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(_title(data["meta"], "structured_scatter_add vs index_add_ on explicit indices"), fontsize=9)
    return [_save(fig, stem, "_speedup")]


def plot_planarity(data: dict, stem: Path) -> list[Path]:
    rows = data["rows"]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for dtype in dict.fromkeys(r.get("dtype") for r in rows):
        rs = sorted((r for r in rows if r.get("dtype") == dtype), key=lambda r: r["atoms"])
        for key, label in (("speedup", "vs eager reference"), ("speedup_vs_compiled", "vs compiled reference")):
            ys = [_num(r.get(key)) for r in rs]
            if any(not math.isnan(y) for y in ys):
                ax.plot([r["atoms"] for r in rs], ys, marker="o", label=f"{dtype} {label}")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("atoms")
    ax.set_ylabel("speed-up, fwd+bwd (x)")
    ax.legend(fontsize=7)
    ax.set_title(_title(data["meta"], "planarity_nll"), fontsize=9)
    return [_save(fig, stem, "_speedup")]


PLOTTERS = {"cpu": plot_cpu, "gpu": plot_gpu, "e2e": plot_e2e, "structured": plot_structured,
            "planarity": plot_planarity}


def plot_file(path: Path | str, out_dir: Path | str | None = None) -> list[Path]:
    """PNGs for one results JSON (next to it, or in out_dir); [] when the file is not a known suite."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"{path}: not readable ({exc})")
        return []
    if not isinstance(data, dict) or "rows" not in data:
        return []
    data.setdefault("meta", {})
    kind = kind_of(path, data)
    if kind is None:
        return []
    stem = (Path(out_dir) if out_dir else path.parent) / path.stem
    try:
        return PLOTTERS[kind](data, stem)
    except Exception as exc:  # noqa: BLE001 - a plot must never lose a benchmark run
        print(f"{path}: no {kind} plot ({type(exc).__name__}: {exc})")
        return []


def plot_dir(folder: Path | str) -> list[Path]:
    return [png for path in sorted(Path(folder).glob("*.json")) for png in plot_file(path)]


def main(argv=None) -> None:
    paths = (sys.argv[1:] if argv is None else argv) or [str(Path(__file__).parent / "results")]
    for p in map(Path, paths):
        for png in plot_dir(p) if p.is_dir() else plot_file(p):
            print(f"wrote {png}")


if __name__ == "__main__":
    main()
