"""Plan sweep of the Triton multi-aggregation forward (CUDA only), against a sum pass of the same plan.

    python benchmarks/bench_aggregation_plans.py          # prints one line per (graph, plan override, tracking)
    python benchmarks/bench_aggregation_plans.py --quick  # the default plan only, no profiler table

["mean", "min", "max", "std"] at F=64 on the two synthetic graphs of bench_aggregation, each
override of the gather-scatter's hybrid "sum" plan (which the kernels reuse) timed with
triton.testing.do_bench (median), without and with winner tracking (tracking: what a forward
that will be differentiated does), then a torch.profiler table of one forward+backward step.
Kernel times only: no op dispatch (compare bench_aggregation's ``fwd`` columns for that).
"""
import torch
from dataclasses import replace

from triton.testing import do_bench

import gnnfuse
from benchmarks.bench_aggregation import cuda_graphs
from gnnfuse.reductions import CODES
from gnnfuse.triton import gather_scatter as GS
from gnnfuse.triton import multi_aggregate as M

OVERRIDES = [{}, dict(group_rows=8), dict(group_rows=32), dict(group_warps=4), dict(group_warps=8),
             dict(group_block_f=32), dict(group_block_f=32, group_rows=32), dict(short_max=32), dict(short_max=128),
             dict(block_f=64, num_warps=4), dict(block_e=32, num_warps=8)]


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the default plan only, no profiler table")
    args = parser.parse_args(argv)
    dev = torch.device("cuda")
    codes = [CODES[a] for a in ["mean", "min", "max", "std"]]
    for name, (ei, n) in cuda_graphs(dev).items():
        csr = gnnfuse.CSR.from_edge_index(ei, num_nodes=n)
        x = torch.randn(n, 64, device=dev)
        base = GS.plan_for(x, csr.rowptr, csr.col, "sum", "hybrid")
        s = do_bench(lambda: GS.infer(x, csr.rowptr, csr.col, None, "sum"), return_mode="median")
        print(name, "sum", round(s, 4), base, flush=True)
        for ov in OVERRIDES[:1] if args.quick else OVERRIDES:
            p = replace(base, **ov)
            for track in (False, True):
                t = do_bench(lambda: M.forward(x, csr.rowptr, csr.col, None, codes, track, p), return_mode="median")
                print(name, ov, "track" if track else "", round(t, 4), round(t / s, 2), flush=True)
    if args.quick:
        return
    from torch.profiler import ProfilerActivity, profile
    for name, (ei, n) in cuda_graphs(dev).items():
        csr = gnnfuse.CSR.from_edge_index(ei, num_nodes=n)
        xg = torch.randn(n, 64, device=dev, requires_grad=True)

        def step():
            return torch.autograd.grad(gnnfuse.fused_gather_scatter(xg, csr, ["mean", "min", "max", "std"]).sum(), xg)
        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        print(name)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
