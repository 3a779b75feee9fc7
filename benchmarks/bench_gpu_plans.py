"""GPU sweep of the Triton forward plans (kernel launchers only) against cuSPARSE, same run.

    PYTHONPATH=. python -m benchmarks.bench_gpu_plans [--out DIR] [--graphs a,b] [--widths 32,64]

For each suite graph and width, sum forward: torch.sparse.mm (cuSPARSE), the CSR plan, the
sorted-COO plan and the hybrid plan over a grid of row-group settings (short_max, rows per
program, warps), each checked against the CSR result. This is the data behind
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

HYBRID_GRID = [dict(short_max=s, group_rows=r, group_warps=w) for s in (32, 64) for r in (8, 16) for w in (4, 8)]


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

        def run(plan):
            return tgs.forward(x, csr.rowptr, csr.col, None, "sum", track_arg=False, plan=plan)[0]

        cus = do_bench(lambda: torch.sparse.mm(a, x), return_mode="median")
        csr_plan = tgs.plan_for(x, csr.rowptr, csr.col, "sum", "csr")
        want = run(csr_plan)
        auto = choose("sum", n, e, F, x.dtype)
        plans = {"csr": csr_plan, "coo": tgs.plan_for(x, csr.rowptr, csr.col, "sum", "coo")}
        for cfg in HYBRID_GRID:
            label = "hybrid s{short_max} r{group_rows} w{group_warps}".format(**cfg)
            plans[label] = tgs.plan_for(x, csr.rowptr, csr.col, "sum", "hybrid", **cfg)
        for label, plan in plans.items():
            ok = torch.allclose(run(plan), want, rtol=1e-4, atol=1e-4)
            ms = do_bench(lambda plan=plan: run(plan), return_mode="median")
            is_auto = plan.kernel == auto.kernel and all(
                getattr(plan, k) == getattr(auto, k) for k in ("short_max", "group_rows", "group_warps"))
            rows.append(dict(graph=name, F=F, plan=label, ms=ms, cusparse_ms=cus, x_vs_cusparse=cus / ms,
                             matches_csr=ok, auto=is_auto))
        best = max((r for r in rows if r["graph"] == name and r["F"] == F), key=lambda r: r["x_vs_cusparse"])
        print(f"  F={F}: cuSPARSE {cus:.4f} ms, csr {rows[-len(plans)]['ms']:.4f}, best {best['plan']} "
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
             "matches_csr: output equals the CSR plan's (rtol/atol 1e-4).")
    columns = ["graph", "F", "plan", "auto", "ms", "cusparse_ms", "x_vs_cusparse", "matches_csr"]
    for graph in args.graphs.split(","):
        sweep_graph(graph, [int(f) for f in args.widths.split(",")], rows)
        save_results(name, meta, rows, columns, args.out, notes)  # after every graph: a cut run keeps its rows
    print(f"wrote {name}")


if __name__ == "__main__":
    main()
