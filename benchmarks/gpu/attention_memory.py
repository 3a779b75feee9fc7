"""Where a GATConv / GATv2Conv / TransformerConv training step's peak memory comes from: the
allocated memory after every operator of one step (after a warm-up step, so graph caches are
already built), ours and PyG's, printing each operator that moves it by more than a fifth of one
[N, H * C] tensor ("T") and the operator during which the step peaks.

    PYTHONPATH=. python benchmarks/gpu/attention_memory.py --layers GATConv,TransformerConv --hf 8x8,4x64

CUDA: torch.cuda.memory_allocated / max_memory_allocated around each operator (the peak inside an
operator, e.g. a kernel's temporary buffers, counts). CPU: not supported (no allocator statistics).
"""
from __future__ import annotations

import argparse

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.bench_attention import IN_CHANNELS, cuda_graphs, make_step


class _Timeline(TorchDispatchMode):
    """(operator, memory after it, peak during it) for every operator dispatched."""

    def __init__(self):
        super().__init__()
        self.log = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        torch.cuda.reset_peak_memory_stats()
        out = func(*args, **(kwargs or {}))
        self.log.append((func.__name__, torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()))
        return out


def breakdown(label, step, unit):
    step()  # warm-up: caches, lazy parameters
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    with _Timeline() as timeline:
        step()
    peak = max(p for _, _, p in timeline.log)
    print(f"  {label}: peak {(peak - base) / 2**20:.0f} MB = {(peak - base) / unit:.2f} T above the step's start")
    prev = base
    for name, now, top in timeline.log:
        if abs(now - prev) > 0.2 * unit or top == peak:
            mark = f"   <== peak {(top - base) / unit:.2f} T during it" if top == peak else ""
            print(f"    {name:40s} {(now - prev) / unit:+6.2f} T   live {(now - base) / unit:5.2f} T{mark}")
        prev = now


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="GATConv,GATv2Conv,TransformerConv")
    parser.add_argument("--hf", default="8x8,4x64", help="heads x F configs")
    parser.add_argument("--graph", default="arxiv-like")
    args = parser.parse_args()
    import torch_geometric.nn as pyg_nn

    import gnnfuse.nn as G

    device = torch.device("cuda")
    (name, (edge_index, nodes)), = cuda_graphs(device, [args.graph]).items()
    torch.manual_seed(0)
    x = torch.randn(nodes, IN_CHANNELS, device=device)
    for layer in args.layers.split(","):
        for hf in args.hf.split(","):
            heads, width = map(int, hf.split("x"))
            unit = nodes * heads * width * 4
            print(f"{layer} {hf} on {name}: T = [N, H * C] float32 = {unit / 2**20:.1f} MB")
            for label, module in (("gnnfuse", G), ("pyg", pyg_nn)):
                torch.manual_seed(0)
                conv = getattr(module, layer)(IN_CHANNELS, width, heads=heads, dropout=0.1).to(device).train()
                try:
                    breakdown(label, make_step(conv, x, edge_index), unit)
                except torch.OutOfMemoryError:
                    print(f"  {label}: out of memory")
                del conv
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
