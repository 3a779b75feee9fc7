"""Fused GINE message: a GINEConv training step (forward + backward), gnnfuse.nn vs stock PyG, plus
the fused op's forward against our sum gather-scatter of the same width.

    python -m benchmarks.bench_gine --device cpu  --out benchmarks/results   # Cora, a power-law graph
    python -m benchmarks.bench_gine --device cuda --out "$OUT"               # synthetic, on the device

One GINEConv(MLP(F -> F -> F), edge_dim=D) layer, loss = mean of squares, gradients of every
parameter and of x; both layers hold the same weights and are timed in the same process,
interleaved (benchmarks.common.bench_interleaved): median and min over rounds. Peak memory (CUDA
only) is that of one step above what was allocated before it. ``fwd/sum`` is gine_aggregate's
forward over fused_gather_scatter's sum on the same [N, F] features (no gradients): what the edge
term and activation cost over a plain gather-scatter.
"""
from __future__ import annotations

import os

import torch

from benchmarks.common import (bench_interleaved, benchmark_device, device_label, geomean, machine, save_results,
                               step_benchmark_parser, time_training_steps)
from gnnfuse.testing import random_graph

WIDTH, EDGE_DIM = 64, 16


def graphs(device):
    out = {}
    if device.type == "cpu":
        from gnnfuse.datasets import load_planetoid

        cora = load_planetoid("Cora")
        if cora is not None:
            out["Cora"] = (cora.edge_index, cora.num_nodes)
        out["power-law 50k/500k"] = (random_graph(50_000, 50_000, 500_000, seed=0, power_law=True), 50_000)
    else:
        out["power-law 200k/4M"] = (random_graph(200_000, 200_000, 4_000_000, seed=0, power_law=True), 200_000)
        out["power-law 1M/20M"] = (random_graph(1_000_000, 1_000_000, 20_000_000, seed=1, power_law=True), 1_000_000)
    return out


def make_step(layer, x, edge_index, edge_attr):
    params = [x, *layer.parameters()]

    def step():
        out = layer(x, edge_index, edge_attr)
        torch.autograd.grad(out.square().mean(), params)

    return step


def run_row(name, edge_index, nodes, device, rounds):
    import torch_geometric.nn as pyg_nn

    import gnnfuse
    import gnnfuse.nn as G

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH))

    row = {"graph": name, "nodes": nodes, "edges": edge_index.shape[1], "F": WIDTH, "edge_dim": EDGE_DIM}
    torch.manual_seed(0)
    x = torch.randn(nodes, WIDTH, device=device, requires_grad=True)
    edge_attr = torch.randn(edge_index.shape[1], EDGE_DIM, device=device)
    stock = pyg_nn.GINEConv(mlp(), edge_dim=EDGE_DIM).to(device)
    ours = G.GINEConv(mlp(), edge_dim=EDGE_DIM).to(device)
    ours.load_state_dict(stock.state_dict())
    csr = gnnfuse.CSR.from_edge_index(edge_index, nodes)
    steps = {"gnnfuse": make_step(ours, x, csr, edge_attr), "pyg": make_step(stock, x, edge_index, edge_attr)}
    time_training_steps(row, steps, device, rounds)
    h, e = x.detach(), torch.randn(edge_index.shape[1], WIDTH, device=device)
    with torch.no_grad():
        fwd = bench_interleaved({"gine": lambda: gnnfuse.gine_aggregate(h, e, csr),
                                 "sum": lambda: gnnfuse.fused_gather_scatter(h, csr, "sum")},
                                device, rounds=rounds, max_seconds=10.0)
    row["fwd_gine_ms"], row["fwd_sum_ms"] = fwd["gine"]["median_ms"], fwd["sum"]["median_ms"]
    row["fwd/sum"] = row["fwd_gine_ms"] / row["fwd_sum_ms"]
    return row


def main(argv=None):
    parser = step_benchmark_parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    device = benchmark_device(args)
    rows = []
    for name, (edge_index, nodes) in graphs(device).items():
        try:
            rows.append(run_row(name, edge_index.to(device), nodes, device, args.rounds))
        except Exception as exc:  # a row, not a crash
            rows.append({"graph": name, "error": f"{type(exc).__name__}: {exc}"[:200]})
        print(rows[-1], flush=True)
    speedups = [r["speedup"] for r in rows if "speedup" in r]
    meta = dict(machine(device), benchmark="GINEConv training step vs PyG; gine_aggregate forward vs sum",
                geomean_speedup=round(geomean(speedups), 3) if speedups else "n/a",
                load_average_1_5_15min=os.getloadavg())  # other tenants of a shared host show up here
    columns = ["graph", "nodes", "edges", "F", "edge_dim", "gnnfuse_ms", "gnnfuse_min_ms", "pyg_ms", "pyg_min_ms",
               "speedup", "gnnfuse_peak_MB", "pyg_peak_MB", "fwd_gine_ms", "fwd_sum_ms", "fwd/sum", "error"]
    md = save_results(f"gine_{device_label(device)}", meta, rows, columns, args.out)
    print(md.read_text())


if __name__ == "__main__":
    main()
