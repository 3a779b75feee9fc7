"""Per-call cost on CPU where the graph is small (Cora-sized): what a call spends above its kernel.

    python -m benchmarks.bench_cpu_overhead --out "$OUT" [--graph Cora] [--widths 16,64]

Rows, timed in turns (variants interleaved, median of per-call times over batches of calls): the
public call given a CSR (inference and forward+backward), the registered op
``torch.ops.gnnfuse.gather_scatter`` (the route torch.compile takes), the C++ kernel called alone,
and the anchors torch.sparse.mm (prebuilt CSR, forward and forward+backward) and ``x * 1``
forward+backward (the autograd round trip's floor). ``above_kernel_us`` = the row's time minus the
kernel alone (same reduction and width). Cora comes from the shared data folder when present,
else a random graph of Cora's size (2708 nodes, 10556 edges) is used (the ``graph`` column says which).
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from benchmarks.common import device_label, machine, save_results


def per_call_us(fns: dict, calls: int = 300, rounds: int = 15) -> dict[str, float]:
    """Median over rounds of (time of ``calls`` back-to-back calls) / calls, variants in turns."""
    names = list(fns)
    for name in names:
        for _ in range(50):
            fns[name]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    gc.disable()
    try:
        for r in range(rounds):
            for k in range(len(names)):
                name = names[(r + k) % len(names)]
                fn = fns[name]
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                samples[name].append((time.perf_counter() - t0) / calls * 1e6)
    finally:
        gc.enable()
    return {n: statistics.median(v) for n, v in samples.items()}


def _graph(name: str) -> tuple[torch.Tensor, int, str]:
    try:
        from benchmarks.graphs import real_edge_index

        found = real_edge_index(name)
    except Exception:  # noqa: BLE001  (no PyG or no data: fall back to a graph of the same size)
        found = None
    if found is not None:
        return found[0], found[1], name
    g = torch.Generator().manual_seed(0)
    n, e = 2708, 10556
    return torch.randint(0, n, (2, e), generator=g), n, f"random({n} nodes, {e} edges)"


def main(argv=None):
    import gnnfuse
    from gnnfuse._build import load_extension

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--graph", default="Cora")
    ap.add_argument("--widths", default="16,64")
    ap.add_argument("--label", default="", help="a tag for the result file name (e.g. before/after)")
    args = ap.parse_args(argv)
    ei, n, graph = _graph(args.graph)
    csr = gnnfuse.CSR.from_edge_index(ei, n)
    ext = load_extension()
    adj = torch.sparse_csr_tensor(csr.rowptr.long(), csr.col.long(), torch.ones(csr.num_edges), (n, n))
    rows = []
    for F in map(int, args.widths.split(",")):
        x = torch.randn(n, F)
        xr = x.clone().requires_grad_()
        g = torch.randn(n, F)
        t = csr.transpose_parts()
        fns = {
            "kernel alone (C++), forward": lambda: ext.gather_scatter_forward(x, csr.rowptr, csr.col, None, "sum",
                                                                              False),
            "public call, forward (no grad)": lambda: gnnfuse.fused_gather_scatter(x, csr, "sum"),
            "registered op, forward": lambda: torch.ops.gnnfuse.gather_scatter(x, csr.rowptr, csr.col, None,
                                                                               None, None, None, "sum"),
            "torch.sparse.mm, forward": lambda: torch.sparse.mm(adj, x),
            "public call, forward+backward": lambda: torch.autograd.grad(
                gnnfuse.fused_gather_scatter(xr, csr, "sum"), xr, g),
            "registered op, forward+backward": lambda: torch.autograd.grad(
                torch.ops.gnnfuse.gather_scatter(xr, csr.rowptr, csr.col, None, *t, "sum")[0], xr, g),
            "torch.sparse.mm, forward+backward": lambda: torch.autograd.grad(torch.sparse.mm(adj, xr), xr, g),
            "autograd floor: (x * 1) forward+backward": lambda: torch.autograd.grad(xr * 1.0, xr, g),
        }
        times = per_call_us(fns)
        kernel = times["kernel alone (C++), forward"]
        for name, us in times.items():
            anchor = times["torch.sparse.mm, forward+backward" if "backward" in name else "torch.sparse.mm, forward"]
            rows.append(dict(graph=graph, F=F, call=name, us_per_call=round(us, 2),
                             above_kernel_us=None if "backward" in name else round(us - kernel, 2),
                             vs_sparse_mm=round(anchor / us, 2)))
            print(f"F={F:4d} {name:42s} {us:8.2f} us  x{anchor / us:.2f}", flush=True)
    meta = machine("cpu")
    meta.update(benchmark="bench_cpu_overhead", graph=graph, nodes=n, edges=csr.num_edges,
                threads=torch.get_num_threads())
    tag = f"_{args.label}" if args.label else ""
    save_results(f"cpu-overhead_{device_label('cpu')}_{time.strftime('%Y-%m-%d')}{tag}", meta, rows,
                 ["graph", "F", "call", "us_per_call", "above_kernel_us", "vs_sparse_mm"], args.out,
                 notes=__doc__.split("\n\n", 2)[2])


if __name__ == "__main__":
    main()
