"""GPU benchmark of the Triton fused_gather_scatter against cuSPARSE, index_add_/scatter_reduce
and torch.compile, all timed in the same process.

    PYTHONPATH=. python benchmarks/bench_gpu.py [--out DIR] [--graphs products-like,...] [--widths 32,64]

Graphs are generated on the GPU (seeded) by gnnfuse.graphs.suite_graph. Writes gpu_<device>_<date>.{json,md,png}.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import gnnfuse  # noqa: E402
from benchmarks.common import bench, device_label, geomean, machine, save_results  # noqa: E402
from gnnfuse.csr import CSR  # noqa: E402
from gnnfuse.graphs import STRESS, suite_graph  # noqa: E402
from gnnfuse.triton import gather_scatter as tgs  # noqa: E402
from gnnfuse.triton.gather_scatter_dispatch import csr_configs  # noqa: E402

GRAPHS = STRESS  # the default --graphs; any gnnfuse.graphs.SUITE name is accepted
MATERIALISE_LIMIT = 33e9  # bytes of the E x F tensor the index_add_ anchor may build


def make_graph(name: str, seed: int = 0) -> CSR:
    ei, n = suite_graph(name, seed=seed, device="cuda")
    csr = CSR.from_edge_index(ei, n)
    del ei
    csr.transpose_parts()
    csr.row()
    torch.cuda.synchronize()
    return csr


def copy_bandwidth() -> float:
    a = torch.empty(2**28, device="cuda")  # 1 GiB
    b = torch.empty_like(a)
    t = bench(lambda: b.copy_(a), "cuda", warmup=3, repeat=10)["median_ms"]
    return 2 * a.numel() * 4 / (t * 1e-3) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--graphs", default=",".join(GRAPHS))
    ap.add_argument("--widths", default="32,64,128,256")
    ap.add_argument("--budget-s", type=float, default=330.0, help="stop starting new graphs after this")
    ap.add_argument("--sweep", action="store_true", help="also sweep CSR configs on products-like/reddit-like")
    ap.add_argument("--skip", default="", help="columns not to time, e.g. sum_csr,sum_coo,sum_atomic: the largest "
                    "graphs' kernel-level columns (bench_gpu_plans has them) to fit a call's time limit")
    ap.add_argument("--tag", default="", help="suffix of the result files' name (runs split over several calls)")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="no run: merge these result files (in order) into --name's table, summary and plot")
    ap.add_argument("--name", default=None, help="with --merge: the merged files' name")
    args = ap.parse_args()
    if args.merge:
        parts = [json.loads(Path(p).read_text()) for p in args.merge]
        meta = {**parts[0]["meta"], "merged_from": ", ".join(f"{Path(p).name} ({d['meta'].get('date')})"
                                                              for p, d in zip(args.merge, parts))}
        md = _save([r for d in parts for r in d["rows"]], meta, args.out, name=args.name)
        plot(Path(md).with_suffix(".json"))
        print(md.read_text(), flush=True)
        return
    t_start = time.time()
    skip = set(filter(None, args.skip.split(",")))
    torch.manual_seed(0)
    meta = machine("cuda")
    meta["copy_GBps"] = round(copy_bandwidth(), 1)
    meta["dispatch"] = "gnnfuse.triton.gather_scatter_dispatch.choose (auto)"
    print(meta, flush=True)
    compiled_add = torch.compile(lambda x, src, dst, n: torch.zeros(n, x.shape[1], device=x.device, dtype=x.dtype)
                                 .index_add_(0, dst, x.index_select(0, src)), dynamic=True)
    rows = []
    for gname in args.graphs.split(","):
        if time.time() - t_start > args.budget_s:
            print(f"budget spent: skipping {gname}", flush=True)
            continue
        t0 = time.time()
        csr = make_graph(gname)
        n, e = csr.num_dst, csr.num_edges
        deg = csr.in_degree()
        stats = dict(max_deg=int(deg.max()), empty=int((deg == 0).sum()))
        print(f"{gname}: N={n} E={e} {stats} built in {time.time() - t0:.1f}s", flush=True)
        src, dst = csr.col, csr.row()
        a = torch.sparse_csr_tensor(csr.rowptr, csr.col, torch.ones(e, device="cuda"), (n, csr.num_src))
        t_parts, no_arg = csr.transpose_parts(), csr.rowptr.new_empty(0, 0)
        for F in [int(f) for f in args.widths.split(",")]:
            x = torch.randn(csr.num_src, F, device="cuda")
            grad = torch.randn(n, F, device="cuda")
            xg = x.detach().clone().requires_grad_()
            min_bytes = e * (8 + F * 4) + n * F * 4 + (n + 1) * 8
            r: dict[str, object] = dict(graph=gname, F=F, N=n, E=e, max_deg=stats["max_deg"])
            plan = tgs.plan_for(x, csr.rowptr, csr.col, "sum")
            r["auto_kernel"] = plan.kernel

            def t(fn, key):  # timed again (a later round): the key keeps its fastest median
                if key in skip:
                    return
                t_key = time.time()
                try:
                    ms = bench(fn, "cuda", warmup=2, repeat=7, max_seconds=0.8)["median_ms"]
                    r[key] = min(ms, r.get(key) or math.inf)
                    print(f"  {gname} F={F} {key}: {ms:.4f} ms ({time.time() - t_key:.1f} s)", flush=True)
                except Exception as exc:  # noqa: BLE001 - an anchor may not exist / not fit
                    r[key] = None
                    print(f"  {key}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    torch.cuda.empty_cache()

            # ours (after 0.3 s of untimed calls: on the small graphs, where a call is ~20 us of host
            # time, the first timing of a width otherwise read up to 3x slow on the H200 host)
            bench(lambda: gnnfuse.fused_gather_scatter(x, csr, "sum"), "cuda", warmup=2, repeat=3, max_seconds=0.1,
                  min_warmup_seconds=0.3)
            # the reductions in rounds: calls of tens of microseconds drift with the host between
            # one key's timing and the next, and x_over_sum would read that drift as a cost
            for _ in range(3 if e * F <= 5e8 else 1):
                for red in ("sum", "mean", "max", "min", "mul"):
                    t(lambda red=red: gnnfuse.fused_gather_scatter(x, csr, red), f"ours_{red}")
            for k in ("csr", "coo", "atomic"):
                p = tgs.plan_for(x, csr.rowptr, csr.col, "sum", k)
                t(lambda p=p: tgs.forward(x, csr.rowptr, csr.col, None, "sum", plan=p), f"sum_{k}")
            # torch.autograd.grad, not .backward(): no x.grad accumulation (an [N, F] add of PyTorch's)
            for red in ("sum", "max"):
                t(lambda red=red: torch.autograd.grad(gnnfuse.fused_gather_scatter(xg, csr, red), xg, grad),
                  f"ours_{red}_fwdbwd")
            # the launchers alone (no autograd): backward against forward where host time does not hide it
            t(lambda: tgs.infer(x, csr.rowptr, csr.col, None, "sum"), "fwd_launcher")
            t(lambda: tgs.backward(grad, x, csr.rowptr, csr.col, None, *t_parts, no_arg, "sum", True, False),
              "bwd_launcher")
            # anchors
            t(lambda: torch.sparse.mm(a, x), "cusparse")
            t(lambda: torch.autograd.grad(torch.sparse.mm(a, xg), xg, grad), "cusparse_fwdbwd")
            if e * F * 4 <= MATERIALISE_LIMIT:
                t(lambda: torch.zeros(n, F, device="cuda").index_add_(0, dst, x.index_select(0, src)), "index_add")
                idx = dst.unsqueeze(1).expand(-1, F)
                t(lambda: torch.zeros(n, F, device="cuda").scatter_reduce_(0, idx, x.index_select(0, src), "amax",
                                                                          include_self=False), "scatter_amax")
                del idx
            t(lambda: compiled_add(x, src, dst, n), "compile")
            r["GBps_sum"] = min_bytes / (r["ours_sum"] * 1e-3) / 1e9 if r.get("ours_sum") else None
            r["pct_copy_bw"] = 100 * r["GBps_sum"] / meta["copy_GBps"] if r["GBps_sum"] else None
            for key in ("cusparse", "index_add", "compile"):
                r[f"x_vs_{key}"] = r[key] / r["ours_sum"] if r.get(key) and r.get("ours_sum") else None
            for red in ("mean", "max", "min"):
                r[f"{red}_over_sum"] = r[f"ours_{red}"] / r["ours_sum"] if r.get(f"ours_{red}") else None
            if r.get("ours_sum_fwdbwd"):
                r["bwd_over_fwd"] = (r["ours_sum_fwdbwd"] - r["ours_sum"]) / r["ours_sum"]
            if r.get("bwd_launcher") and r.get("fwd_launcher"):
                r["bwd_launcher_over_fwd"] = r["bwd_launcher"] / r["fwd_launcher"]
            if r.get("sum_atomic") and r.get("sum_coo"):
                r["coo_vs_atomic"] = r["sum_atomic"] / r["sum_coo"]
            rows.append(r)
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
            _save(rows, meta, args.out, args.tag)  # a run cut by a time limit keeps every finished width
            del x, xg, grad
            torch.cuda.empty_cache()
        if args.sweep and gname in ("products-like", "reddit-like"):  # CSR config sweep (what GNNFUSE_AUTOTUNE=1 would try)
            for F in (128, 256):
                x = torch.randn(csr.num_src, F, device="cuda")
                for cfg in csr_configs(F, e / n, 4)[: 6 if F == 128 else 4]:
                    p = tgs.plan_for(x, csr.rowptr, csr.col, "sum", "csr", **cfg)
                    ms = bench(lambda p=p: tgs.forward(x, csr.rowptr, csr.col, None, "sum", plan=p), "cuda",
                               warmup=1, repeat=5)["median_ms"]
                    tag = "csr be={block_e} bf={block_f} seg={seg} w={num_warps}".format(**cfg)
                    print(f"  sweep {gname} F={F} {tag}: {ms:.3f} ms", flush=True)
                    rows.append(dict(graph=gname, F=F, sweep=tag, sum_csr=ms))
                os.environ["GNNFUSE_AUTOTUNE"] = "1"  # the autotuned path (configs compiled above)
                out = gnnfuse.fused_gather_scatter(x, csr, "sum")
                ok = torch.allclose(out, torch.sparse.mm(a, x), atol=1e-3, rtol=1e-4)
                ms = bench(lambda: gnnfuse.fused_gather_scatter(x, csr, "sum"), "cuda", warmup=1, repeat=5)["median_ms"]
                os.environ.pop("GNNFUSE_AUTOTUNE")
                tuned = tgs._tuned(x, csr.rowptr, csr.col, None, "sum", tgs.plan_for(x, csr.rowptr, csr.col, "sum"))
                print(f"  autotuned {gname} F={F}: {ms:.3f} ms, matches cuSPARSE: {ok}; {tuned.describe()}", flush=True)
                rows.append(dict(graph=gname, F=F, sweep="autotuned", sum_csr=ms, auto_kernel=tuned.describe()))
                del x, out
        del csr, a, src, dst, t_parts, no_arg
        torch.cuda.empty_cache()
        _save(rows, meta, args.out, args.tag)  # partial results survive a timeout

    md = _save(rows, meta, args.out, args.tag)
    print(md.read_text(), flush=True)
    plot(Path(md).with_suffix(".json"))


def _save(rows, meta, out, tag="", name=None):
    main_rows = [r for r in rows if "sweep" not in r]
    summary = {
        "geomean_x_vs_cusparse": geomean([r["x_vs_cusparse"] for r in main_rows if r.get("x_vs_cusparse")]),
        "min_x_vs_cusparse": min([r["x_vs_cusparse"] for r in main_rows if r.get("x_vs_cusparse")], default=None),
        "max_red_over_sum": max([r[f"{k}_over_sum"] for r in main_rows for k in ("mean", "max", "min")
                                 if r.get(f"{k}_over_sum")], default=None),
        "max_bwd_over_fwd": max([r["bwd_over_fwd"] for r in main_rows if r.get("bwd_over_fwd")], default=None),
        "max_bwd_launcher_over_fwd": max([r["bwd_launcher_over_fwd"] for r in main_rows
                                          if r.get("bwd_launcher_over_fwd")], default=None),
        "min_coo_vs_atomic": min([r["coo_vs_atomic"] for r in main_rows if r.get("coo_vs_atomic")], default=None),
    }
    meta["summary"] = summary
    print("SUMMARY", json.dumps(summary), flush=True)
    name = name or f"gpu_{device_label('cuda')}_{dt.date.today().isoformat()}{tag}"
    cols = ["graph", "F", "auto_kernel", "ours_sum", "sum_csr", "sum_coo", "sum_atomic", "cusparse", "index_add",
            "compile", "x_vs_cusparse", "x_vs_compile", "GBps_sum", "pct_copy_bw", "mean_over_sum", "max_over_sum",
            "min_over_sum", "ours_mul", "ours_sum_fwdbwd", "cusparse_fwdbwd", "bwd_over_fwd", "fwd_launcher", "bwd_launcher",
            "bwd_launcher_over_fwd", "ours_max_fwdbwd",
            "coo_vs_atomic", "sweep"]
    return save_results(name, meta, rows, cols, out_dir=out,
                      notes="Times in ms (median, CUDA events). x_vs_* = anchor time / ours (higher is better).")


def plot(json_path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no PNG", flush=True)
        return
    data = json.loads(Path(json_path).read_text())
    rows = [r for r in data["rows"] if "sweep" not in r]
    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    fig, axes = plt.subplots(1, len(graphs), figsize=(4 * len(graphs), 3.6), sharey=True, squeeze=False)
    for ax, gname in zip(axes[0], graphs):
        rs = [r for r in rows if r["graph"] == gname]
        widths = [r["F"] for r in rs]
        for key, label in (("x_vs_cusparse", "vs cuSPARSE"), ("x_vs_compile", "vs torch.compile"),
                           ("x_vs_index_add", "vs index_add_")):
            ys = [r.get(key) or math.nan for r in rs]
            ax.plot(widths, ys, marker="o", label=label)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(gname)
        ax.set_xlabel("F")
    axes[0][0].set_ylabel("speed-up of gnnfuse sum (x)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"gnnfuse Triton fused_gather_scatter, {data['meta'].get('gpu')}, {data['meta'].get('date')}")
    fig.tight_layout()
    fig.savefig(Path(json_path).with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--plot":
        plot(Path(sys.argv[2]))
    else:
        main()
