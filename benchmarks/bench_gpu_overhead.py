"""Per-call cost on GPU where the kernels are tiny: what a small graph's call spends on the host.

    python -m benchmarks.bench_gpu_overhead --out "$OUT"

On rfc-uniform (10K nodes, 200K edges) a gather-scatter kernel takes ~10 us, so a call's time is
what the host spends launching it. Each row is a loop of back-to-back calls with one
synchronisation at the end (time per call): the public call (given a CSR, and given the raw
edge_index whose CSR is cached on it), its Triton launchers (forward with the cached per-graph
setup; backward: sum's x gradient, max's x and weight gradients), one kernel launched through Triton's JIT, through gnnfuse's FastKernel and
through a bound launch (gnnfuse/triton/_launch.py), and the anchors torch.sparse.mm (cuSPARSE,
prebuilt CSR) and a trivial autograd round trip, all in the same run. vs_cusparse = cuSPARSE's time / the row's (forward rows against torch.sparse.mm,
forward+backward rows against torch.sparse.mm forward+backward).
"""
from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import device_label, machine, save_results
from benchmarks.graphs import synthetic_edge_index


def per_call_us(fn, calls: int = 2000, repeats: int = 5) -> float:
    """Median over repeats of (time of `calls` back-to-back calls) / calls."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return sorted(samples)[len(samples) // 2]


def main(argv=None):
    import triton

    import gnnfuse
    from gnnfuse.triton import gather_scatter as tgs
    from gnnfuse.triton._launch import BoundLaunches

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--graph", default="rfc-uniform")
    ap.add_argument("--widths", default="32,128")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    ei, n = synthetic_edge_index(args.graph, device="cuda")
    csr = gnnfuse.CSR.from_edge_index(ei, n)
    adj = torch.sparse_csr_tensor(csr.rowptr.long(), csr.col.long(),
                                  torch.ones(csr.num_edges, device="cuda"), (n, n))
    rows = []
    for F in map(int, args.widths.split(",")):
        x = torch.randn(n, F, device="cuda")
        xr = x.clone().requires_grad_()
        g = torch.randn(n, F, device="cuda")
        plan = tgs.plan_for(x, csr.rowptr, csr.col, "sum")
        short = tgs.short_rows(csr.rowptr, plan.short_max)
        out = torch.empty(n, F, device="cuda")
        grid = (triton.cdiv(short.numel(), plan.group_rows), triton.cdiv(F, plan.block_f))
        kargs = (x, short, csr.rowptr, csr.col, x, out, out, short.numel(), F)
        meta = dict(REDUCE=0, HAS_W=False, ACC64=False, TRACK=False, ROWS=plan.group_rows, BLOCK_F=plan.block_f,
                    num_warps=plan.group_warps)
        bound = BoundLaunches()
        t_parts = csr.transpose_parts()
        no_arg = csr.rowptr.new_empty(0, 0)
        w = torch.rand(csr.num_edges, device="cuda") + 0.5
        max_arg = tgs.forward(x, csr.rowptr, csr.col, w, "max")[1]
        t = {
            "public call, forward": lambda: gnnfuse.fused_gather_scatter(x, csr, "sum"),
            "public call, forward (edge_index)": lambda: gnnfuse.fused_gather_scatter(x, ei, "sum"),
            "launcher, forward (cached setup)": lambda: tgs.infer(x, csr.rowptr, csr.col, None, "sum"),
            "launcher, backward (x grad)": lambda: tgs.backward(g, x, csr.rowptr, csr.col, None, *t_parts, no_arg,
                                                                "sum", True, False),
            "launcher, backward (max, x and weight grads)": lambda: tgs.backward(
                g, x, csr.rowptr, csr.col, w, *t_parts, max_arg, "max", True, True),
            "one kernel, Triton JIT launch": lambda: tgs._rowgroup_kernel.kernel[grid](*kargs, **meta),
            "one kernel, FastKernel launch": lambda: tgs._rowgroup_kernel[grid](*kargs, **meta),
            "one kernel, bound launch": lambda: bound("k", tgs._rowgroup_kernel, grid, kargs, meta, True),
            "torch.sparse.mm": lambda: torch.sparse.mm(adj, x),
            "public call, forward+backward": lambda: torch.autograd.grad(
                gnnfuse.fused_gather_scatter(xr, csr, "sum"), xr, g),
            "torch.sparse.mm, forward+backward": lambda: torch.autograd.grad(torch.sparse.mm(adj, xr), xr, g),
            "autograd floor: (x * 1) forward+backward": lambda: torch.autograd.grad(xr * 1.0, xr, g),
        }
        times = {name: per_call_us(fn, calls=500 if "backward" in name else 2000) for name, fn in t.items()}
        for name, us in times.items():
            anchor = times["torch.sparse.mm, forward+backward" if "forward+backward" in name else "torch.sparse.mm"]
            rows.append(dict(graph=args.graph, F=F, call=name, us_per_call=round(us, 1),
                             vs_cusparse=round(anchor / us, 2)))
            print(f"F={F:4d} {name:42s} {us:8.1f} us  x{anchor / us:.2f}", flush=True)
    meta = machine("cuda")
    meta.update(benchmark="bench_gpu_overhead", graph=args.graph, nodes=n, edges=csr.num_edges)
    save_results(f"gpu-overhead_{device_label('cuda')}_{time.strftime('%Y-%m-%d')}", meta, rows,
                 ["graph", "F", "call", "us_per_call", "vs_cusparse"], args.out, notes=__doc__.split("\n\n", 2)[2])


if __name__ == "__main__":
    main()
