"""Plan sweep of the Triton multi-aggregation forward (CUDA only), against a sum pass of the same plan.

    python benchmarks/bench_aggregation_plans.py          # prints one line per (graph, plan override, tracking)
    python benchmarks/bench_aggregation_plans.py --quick  # a few overrides, the one-off scatter sweep, no profiler

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

# --quick: the multi plan against the two-launch plan and the sum plan's one-launch tiles
QUICK = [{}, dict(one_pass=False), dict(block_e=32), dict(group_warps=4), dict(group_warps=4, block_e=32)]
OVERRIDES = [{}, dict(group_rows=8), dict(group_rows=32), dict(group_warps=4), dict(group_warps=8),
             dict(group_block_f=32), dict(group_block_f=32, group_rows=32), dict(short_max=32), dict(short_max=128),
             dict(block_f=64, num_warps=4), dict(block_e=32, num_warps=8)]


def scatter_sweep(name, edge_index, nodes, x):
    """The one-off scatter's atomic kernel (gnnfuse/triton/scatter_atomic.py) on the messages
    x[src] -> dst: tiles and the skip-losers read, against torch.scatter_reduce."""
    from gnnfuse.triton import scatter_atomic

    msg = x[edge_index[0]]
    dst = edge_index[1]
    idx = dst.view(-1, 1).expand(-1, msg.shape[1])
    for reduce in ("sum", "max"):
        torch_name = {"max": "amax"}.get(reduce, reduce)
        ref = do_bench(lambda: msg.new_zeros(nodes, msg.shape[1]).scatter_reduce(0, idx, msg, torch_name,
                                                                                 include_self=False),
                       return_mode="median")
        for rows in (0, 16, 8):
            for skip in ((True, False) if reduce == "max" else (True,)):
                t = do_bench(lambda: scatter_atomic.scatter(msg, dst, nodes, reduce, rows_per_program=rows,
                                                            skip_losers=skip), return_mode="median")
                print(name, "scatter", reduce, f"rows_per_program={rows} skip_losers={skip}", round(t, 4),
                      "scatter_reduce", round(ref, 4), "ratio", round(ref / t, 2), flush=True)


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few plan overrides and the one-off scatter kernel sweep, no profiler table")
    args = parser.parse_args(argv)
    dev = torch.device("cuda")
    codes = [CODES[a] for a in ["mean", "min", "max", "std"]]
    for name, (ei, n) in cuda_graphs(dev).items():
        csr = gnnfuse.CSR.from_edge_index(ei, num_nodes=n)
        x = torch.randn(n, 64, device=dev)
        base = GS.plan_for(x, csr.rowptr, csr.col, "sum", "hybrid")
        s = do_bench(lambda: GS.infer(x, csr.rowptr, csr.col, None, "sum"), return_mode="median")
        print(name, "sum", round(s, 4), base, flush=True)
        base = M.multi_tiles(base, x.shape[1], x.element_size())  # the multi kernels' default tiles
        for ov in QUICK if args.quick else OVERRIDES:
            p = replace(base, **ov)
            for track in (False, True):
                t = do_bench(lambda: M.forward(x, csr.rowptr, csr.col, None, codes, track, p), return_mode="median")
                print(name, ov, "track" if track else "", round(t, 4), round(t / s, 2), flush=True)
        if args.quick:
            scatter_sweep(name, ei, n, x)
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
