"""GPU sweep of the Triton forward plans (kernel launchers only) against cuSPARSE, same run.

    PYTHONPATH=. python -m benchmarks.bench_gpu_plans [--out DIR] [--graphs a,b] [--widths 32,64]

For each suite graph and width, sum forward: torch.sparse.mm (cuSPARSE), the CSR plan, the
sorted-COO plan and the fully-atomic baseline at 32 and 64 edges per block, and the hybrid plan
over a grid of row-group settings (rows per program, features per tile, warps; rows of up to 64
edges, the setting that won every earlier sweep) and over the CSR part's tile (edges, features,
warps) for the rows longer than that, each checked against the CSR result; and max/min with the
default plan (no winners tracked), against its sum. This is the data behind
gnnfuse/triton/gather_scatter_dispatch.hybrid_configs. Times are triton.testing.do_bench
medians (GPU time, L2 flushed between calls), so they leave out the Python launch overhead
that benchmarks/bench_gpu.py includes. Writes gpu-plans_<device>_<date>.{json,md}.
"""
from __future__ import annotations

import argparse
import datetime as dt
import time

import torch

from benchmarks.bench_gpu import GRAPHS, make_graph
from benchmarks.common import device_label, machine, save_results
from gnnfuse.triton import gather_scatter as tgs
from gnnfuse.triton.gather_scatter_dispatch import choose

HYBRID_GRID = [dict(short_max=64, group_rows=r, group_block_f=f, group_warps=w)
               for r in (8, 16) for f in (32, 64) for w in (4, 8)]
CSR_PART_GRID = [dict(block_e=e, block_f=f, num_warps=w) for e in (16, 32) for f in (32, 64, 128) for w in (1, 2, 4)]


def sweep_graph(name: str, widths: list[int], rows: list[dict]) -> None:
    from triton.testing import do_bench

    t0 = time.time()
    csr = make_graph(name)
    n, e = csr.num_dst, csr.num_edges
    deg = csr.in_degree()
    print(f"{name}: N={n} E={e} max degree {int(deg.max())} built in {time.time() - t0:.1f}s", flush=True)
    a = torch.sparse_csr_tensor(csr.rowptr, csr.col, torch.ones(e, device="cuda"), (n, csr.num_src))
    for F in widths:
        x = torch.randn(csr.num_src, F, device="cuda")

        def run(plan, reduce="sum"):
            return tgs.forward(x, csr.rowptr, csr.col, None, reduce, track_arg=False, plan=plan)[0]

        cus = do_bench(lambda: torch.sparse.mm(a, x), return_mode="median")
        csr_plan = tgs.plan_for(x, csr.rowptr, csr.col, "sum", "csr")
        want = run(csr_plan)
        auto = choose("sum", n, e, F, x.dtype)
        plans = {"csr": csr_plan, "auto": auto}
        for kernel in ("coo", "atomic"):
            for block_e in (32, 64):
                warps = max(1, min(8, block_e * min(F, 128) // 1024))
                plans[f"{kernel} e{block_e}"] = tgs.plan_for(x, csr.rowptr, csr.col, "sum", kernel, block_e=block_e,
                                                           num_warps=warps)
        for cfg in HYBRID_GRID:
            if cfg["group_block_f"] > max(F, 32):
                continue
            label = "hybrid r{group_rows} f{group_block_f} w{group_warps}".format(**cfg)
            plans[label] = tgs.plan_for(x, csr.rowptr, csr.col, "sum", "hybrid", **cfg)
        group = "r{group_rows} f{group_block_f} w{group_warps}".format(**auto.__dict__)
        for cfg in CSR_PART_GRID:  # the long rows' tile, row groups as the default plan has them
            if cfg["block_f"] <= max(F, 32):
                label = f"hybrid {group}, long rows " + "e{block_e} f{block_f} w{num_warps}".format(**cfg)
                plans[label] = tgs.plan_for(x, csr.rowptr, csr.col, "sum", "hybrid", **cfg)
        # sums of up to 1e5 terms in another order: rounding grows with the partial sums' size
        atol = 1e-5 * (1 + float(want.abs().max()))
        for label, plan in plans.items():
            ok = torch.allclose(run(plan), want, rtol=1e-4, atol=atol)
            ms = do_bench(lambda plan=plan: run(plan), return_mode="median")
            is_auto = plan.kernel == auto.kernel and all(
                getattr(plan, k) == getattr(auto, k) for k in ("short_max", "group_rows", "group_warps",
                                                               "group_block_f", "block_e", "block_f", "num_warps"))
            rows.append(dict(graph=name, F=F, plan=label, ms=ms, cusparse_ms=cus, x_vs_cusparse=cus / ms,
                             matches_csr=ok, auto=is_auto))
        timed = {r["plan"]: r for r in rows[-len(plans):]}
        sum_ms = timed["auto"]["ms"]
        for reduce in ("max", "min"):
            ms = do_bench(lambda reduce=reduce: run(auto, reduce), return_mode="median")
            rows.append(dict(graph=name, F=F, plan=f"auto, {reduce}", ms=ms, cusparse_ms=cus, x_vs_cusparse=cus / ms,
                             auto=True, over_sum=ms / sum_ms))
        best = max((r for r in rows if r["graph"] == name and r["F"] == F and "over_sum" not in r),
                   key=lambda r: r["x_vs_cusparse"])
        print(f"  F={F}: cuSPARSE {cus:.4f} ms, csr {timed['csr']['ms']:.4f}, best {best['plan']} "
              f"{best['ms']:.4f} ({best['x_vs_cusparse']:.2f}x)", flush=True)
    del csr, a
    torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--graphs", default=",".join(GRAPHS))
    ap.add_argument("--widths", default="32,64,128,256")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows: list[dict] = []
    name = f"gpu-plans_{device_label('cuda')}_{dt.date.today().isoformat()}"
    meta = machine("cuda")
    notes = ("sum forward, kernel launchers only (triton.testing.do_bench medians, ms). x_vs_cusparse = "
             "cuSPARSE time / plan time. auto: the plan gnnfuse.triton.gather_scatter_dispatch.choose picks. "
             "matches_csr: output equals the CSR plan's (rtol 1e-4, atol 1e-5 x (1 + its largest magnitude)). "
             "over_sum: the max/min rows' time over the auto plan's sum.")
    columns = ["graph", "F", "plan", "auto", "ms", "cusparse_ms", "x_vs_cusparse", "matches_csr", "over_sum"]
    for graph in args.graphs.split(","):
        sweep_graph(graph, [int(f) for f in args.widths.split(",")], rows)
        save_results(name, meta, rows, columns, args.out, notes)  # after every graph: a cut run keeps its rows
    print(f"wrote {name}")


if __name__ == "__main__":
    main()
