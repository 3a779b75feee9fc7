"""Hardware counters of the sum forward's two kernels (row groups, CSR long rows) under Nsight Compute:
the L2-resident-sources graph and community-products (generated order) at one width, for the auto plan
and for each plan named on the command line (keys of bench_gpu_locality's SWEEPS sets). Warm-up runs outside the
profiled range, so only one launch of each kernel per plan is profiled.

    ncu --profile-from-start off --clock-control none -k regex:"rowgroup|csr_fwd|one_pass" \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \\
        python -m benchmarks.gpu.profile_gather --width 128 --plans "2l,2l before"
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.bench_gpu_locality import SWEEPS
from gnnfuse.csr import CSR
from gnnfuse.graphs import suite_graph
from gnnfuse.triton import gather_scatter as tgs
from gnnfuse.triton import schedule


def graphs(width: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    n_dst, deg = 1_000_000, 16
    n_src = schedule.l2_cache_bytes(torch.device("cuda")) // 4 // (width * 4)
    ei = torch.stack([torch.randint(0, n_src, (n_dst * deg,), generator=g, device="cuda"),
                      torch.arange(n_dst, device="cuda").repeat_interleave(deg)])
    yield "l2-resident-sources", CSR.from_edge_index(ei, (n_src, n_dst))
    ei, n = suite_graph("community-products", device="cuda")
    yield "community-products", CSR.from_edge_index(ei, n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--plans", default="", help="comma-separated keys of SWEEPS sets")
    args = ap.parse_args()
    sweeps = {k: cfg for plans in SWEEPS.values() for k, cfg in plans.items()}
    for name, csr in graphs(args.width):
        x = torch.randn(csr.num_src, args.width, device="cuda")
        plans = {"auto": tgs.plan_for(x, csr.rowptr, csr.col, "sum")}
        for key in filter(None, args.plans.split(",")):
            plans[key] = tgs.plan_for(x, csr.rowptr, csr.col, "sum", "hybrid", **sweeps[key])
        for key, plan in plans.items():
            tgs.forward(x, csr.rowptr, csr.col, None, "sum", plan=plan)  # compile, build the setup
            torch.cuda.synchronize()
            print(f"== {name} F={args.width} plan {key}: {plan.describe()}", flush=True)
            torch.cuda.cudart().cudaProfilerStart()
            tgs.forward(x, csr.rowptr, csr.col, None, "sum", plan=plan)
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
        del csr, x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
