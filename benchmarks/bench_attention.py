"""Fused attention: a GATConv / GATv2Conv / TransformerConv training step (forward + backward) and its
peak memory, gnnfuse.nn vs stock torch-geometric, plus the fused forward against our sum
gather-scatter at the same width.

    python -m benchmarks.bench_attention --device cpu  --out benchmarks/results   # Cora, Facebook, products-down
    python -m benchmarks.bench_attention --device cuda --out "$OUT"               # suite graphs, generated on the device
    python -m benchmarks.bench_attention --device cuda --layers GATv2Conv,TransformerConv --out "$OUT"
    python -m benchmarks.bench_attention --device cuda --layers GATv2Conv --edge-dim 8 --out "$OUT"  # edge features
    python -m benchmarks.bench_attention --device cuda --edge-blocks 8,16,32 --out "$OUT"            # tile sweep

One layer (64 -> F, heads=H) in training mode (dropout on the coefficients; PyG's defaults
otherwise: GAT/GATv2 self loops, TransformerConv's root weight), loss = mean of squares, gradients of every parameter; both layers hold the same
weights and are timed in the same process, interleaved (benchmarks.common.bench_interleaved):
median and interquartile range over rounds. Peak memory (CUDA only: torch.cuda.max_memory_allocated) is that of
one step above what was allocated before it: ``*_peak_MB`` of a step after the first (a training loop's
steady state), ``*_first_peak_MB`` of the very first step, which for us includes building the graph's CSR,
transpose and work lists; ``gnnfuse_cache_MB`` is what those caches keep allocated. ``fwd/sum`` is our fused attention forward over our
sum gather-scatter of the same [N, H*F] features on the same graph (no gradients); ``fwd_no_groups_ms`` (CUDA)
the same forward with the Triton kernels' row groups off (every row in the per-piece kernel), interleaved with it.
A variant that fails (e.g. PyG out of memory) becomes a row with its error. ``--separate-projections``
adds our step with GATConv's projection and attention terms through autograd op by op
(``gnnfuse_fused_projections`` off; ``gnnfuse_separate_ms``; the other layers have no such switch and
run their default), interleaved with the others. ``--edge-dim D`` gives both layers edge features
(edge_attr [E, D]). ``--edge-blocks 4,16,W1,BE8W1,HB4W2`` times our training step and forward with
the Triton kernels' edge block BE (gnnfuse.triton.attention._blocks), heads per program
("HB<n>"), warps per program of the backward (``_warps``; "W<n>") or rows per row group and piece
of the forward ("G<n>"; benchmarks/gpu/attention_forward.py sweeps the forward's whole tile) forced
to each value or combination,
interleaved, against the default choice
(attention-edge-block_<device> results).
"""
from __future__ import annotations

import os
import re

import torch

from benchmarks.common import (bench_interleaved, benchmark_device, cpu_real_and_power_law_graphs, device_label,
                               geomean, machine, peak_mb, save_results, step_benchmark_parser, time_training_steps)

IN_CHANNELS = 64
CPU_CONFIGS = [(8, 8, 0.6)]  # (heads, F, dropout): the standard GAT layer
CUDA_CONFIGS = [(8, 8, 0.6), (4, 64, 0.1)]


def cpu_graphs():
    return cpu_real_and_power_law_graphs("products-down (synthetic, power-law)")


# (suite graph, scale): power-law stress graphs (hub rows) first, then realistic ones; products-like
# at 0.4 scale (1M nodes, 25M edges) so that PyG's 8x8 step still fits in 80 GB.
CUDA_GRAPHS = [("arxiv-like", 1.0), ("products-like", 0.4), ("community-arxiv", 1.0), ("rmat-arxiv", 1.0),
               ("rfc-uniform", 1.0)]


def cuda_graphs(device, names=None):
    from gnnfuse.graphs import SUITE, suite_graph

    graphs = {}
    for name, scale in CUDA_GRAPHS:
        if names and name not in names:
            continue
        edge_index, nodes = suite_graph(name, scale=scale, device=device)
        label = f"{name} ({SUITE[name].kind}{f', scale {scale}' if scale != 1 else ''})"
        graphs[label] = (edge_index, nodes)
    return graphs


def make_step(layer, x, edge_index, edge_attr=None):
    params = list(layer.parameters())

    def step():
        out = layer(x, edge_index) if edge_attr is None else layer(x, edge_index, edge_attr)
        torch.autograd.grad(out.square().mean(), params)

    return step


LAYERS = ("GATConv", "GATv2Conv", "TransformerConv")


def fused_forward(layer, h, a_src, a_dst, edge_index):
    """The layer's fused attention op alone on projected features h [N, H, F] (PyG's default self loops)."""
    import gnnfuse

    if layer == "GATConv":
        return lambda: gnnfuse.gat_attention(h, a_src, a_dst, edge_index, add_self_loops=True)
    if layer == "GATv2Conv":
        att = torch.randn(h.shape[1:], device=h.device)
        return lambda: gnnfuse.gatv2_attention(h, h, att, edge_index, add_self_loops=True)
    return lambda: gnnfuse.dot_attention(h, h, h, edge_index)


def run_row(name, edge_index, nodes, heads, width, dropout, device, rounds, layer="GATConv", edge_dim=0,
            separate_projections=False):
    import torch_geometric.nn as pyg_nn

    import gnnfuse
    import gnnfuse.nn as G

    row = {"layer": layer, "graph": name, "nodes": nodes, "edges": edge_index.shape[1], "HxF": f"{heads}x{width}",
           "dropout": dropout, "edge_dim": edge_dim}
    torch.manual_seed(0)
    x = torch.randn(nodes, IN_CHANNELS, device=device)
    kw = dict(heads=heads, dropout=dropout, edge_dim=edge_dim or None)
    stock = getattr(pyg_nn, layer)(IN_CHANNELS, width, **kw).to(device).train()
    ours = getattr(G, layer)(IN_CHANNELS, width, **kw).to(device).train()
    ours.load_state_dict(stock.state_dict())
    ea = torch.randn(edge_index.shape[1], edge_dim, device=device) if edge_dim else None
    steps = {"gnnfuse": make_step(ours, x, edge_index, ea), "pyg": make_step(stock, x, edge_index, ea)}
    if separate_projections:  # ours with the projections one linear each (nn/_projections.py off)
        separate = getattr(G, layer)(IN_CHANNELS, width, **kw).to(device).train()
        separate.load_state_dict(stock.state_dict())
        separate.gnnfuse_fused_projections = False  # (GATConv's switch; a plain attribute on the others)
        steps["gnnfuse_separate"] = make_step(separate, x, edge_index, ea)
    first_steps(row, steps, device)
    time_training_steps(row, steps, device, rounds, spread="iqr_ms")  # its peaks: a step after the first
    for tag in ("", "first_"):
        if isinstance(row.get(f"pyg_{tag}peak_MB"), float) and isinstance(row.get(f"gnnfuse_{tag}peak_MB"), float):
            row[f"{tag}mem_ratio"] = row[f"pyg_{tag}peak_MB"] / max(row[f"gnnfuse_{tag}peak_MB"], 1e-9)
    # forward alone vs our sum gather-scatter at the same total width
    h = torch.randn(nodes, heads, width, device=device)
    a_src, a_dst = torch.randn(nodes, heads, device=device), torch.randn(nodes, heads, device=device)
    flat = h.view(nodes, heads * width)
    attention = fused_forward(layer, h, a_src, a_dst, edge_index)
    variants = {"attention": attention, "sum": lambda: gnnfuse.fused_gather_scatter(flat, edge_index, "sum")}
    if device.type == "cuda":  # the Triton forward without its row groups (every row in the per-piece kernel)
        variants["no_groups"] = without_row_groups(attention)
    with torch.no_grad():
        fwd = bench_interleaved(variants, device, rounds=rounds, max_seconds=10.0)
    row["fwd_attention_ms"], row["fwd_sum_ms"] = fwd["attention"]["median_ms"], fwd["sum"]["median_ms"]
    row["fwd/sum"] = row["fwd_attention_ms"] / row["fwd_sum_ms"]
    if "no_groups" in fwd:
        row["fwd_no_groups_ms"] = fwd["no_groups"]["median_ms"]
    return row


def without_row_groups(fn):
    """``fn`` run with the Triton attention forwards' row groups off (every row in pieces:
    gnnfuse.triton.attention.GROUP_MAX_DEGREE -1)."""
    from gnnfuse.triton import attention as kernels

    def run():
        default = kernels.GROUP_MAX_DEGREE
        kernels.GROUP_MAX_DEGREE = -1
        try:
            return fn()
        finally:
            kernels.GROUP_MAX_DEGREE = default
    return run


def first_steps(row: dict, steps: dict, device) -> None:
    """Runs each step once before the measured ones. On CUDA records that first step's peak
    (``<label>_first_peak_MB``: it includes one-time work such as building and caching our CSR, its
    transpose and work lists) and what it leaves allocated (``<label>_cache_MB``: those caches,
    kept with the graph like the parameters are with the model)."""
    for label, fn in steps.items():
        if device.type != "cuda":
            fn()
            continue
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        try:
            row[f"{label}_first_peak_MB"] = peak_mb(fn, device)
        except torch.OutOfMemoryError:
            row[f"{label}_first_peak_MB"] = "OOM"
        else:
            row[f"{label}_cache_MB"] = (torch.cuda.memory_allocated() - before) / 2**20
        torch.cuda.empty_cache()


def sweep_row(name, edge_index, nodes, heads, width, dropout, device, rounds, layer, blocks):
    """Our training step and fused forward with BE forced to each of ``blocks`` and at the default."""
    import gnnfuse.nn as G
    from gnnfuse.triton import attention as kernels

    torch.manual_seed(0)
    x = torch.randn(nodes, IN_CHANNELS, device=device)
    ours = getattr(G, layer)(IN_CHANNELS, width, heads=heads, dropout=dropout).to(device).train()
    h = torch.randn(nodes, heads, width, device=device)
    a_src, a_dst = torch.randn(nodes, heads, device=device), torch.randn(nodes, heads, device=device)
    default_blocks, default_warps, default_rows = kernels._blocks, kernels._warps, kernels._one_pass_rows
    be, hb, fb = default_blocks(heads, width, edge_index.shape[1], nodes)

    def forced(label, fn):  # "default", or any of "BE<n>" (edges per step), "HB<n>" (heads per program), "W<n>"
        # (backward warps), "G<n>" (rows per row group and piece of the forward), e.g. "BE8W1", "G8"
        knobs = {k: int(v) for k, v in re.findall(r"(BE|HB|G|W)(\d+)", label)}

        def blocks(H, F, *rest):
            be, hb, fb = default_blocks(H, F, *rest)
            return knobs.get("BE", be), knobs.get("HB", hb), fb

        def run():
            kernels._blocks = blocks
            if "W" in knobs:  # the backward kernels; else the default warps of the (forced) tile
                kernels._warps = lambda *tile: knobs["W"]
            if "G" in knobs:  # the forward's rows per row group and piece (benchmarks/gpu/attention_forward.py
                kernels._one_pass_rows = lambda *tile: knobs["G"]  # sweeps the forward's whole tile)
            try:
                fn()
            finally:
                kernels._blocks, kernels._warps, kernels._one_pass_rows = default_blocks, default_warps, default_rows
        return run

    step, fwd = make_step(ours, x, edge_index), fused_forward(layer, h, a_src, a_dst, edge_index)
    variants = ["default", *blocks]
    steps = bench_interleaved({v: forced(v, step) for v in variants}, device, rounds=rounds)
    with torch.no_grad():
        fwds = bench_interleaved({v: forced(v, fwd) for v in variants}, device, rounds=rounds)
    row = {"layer": layer, "graph": name, "HxF": f"{heads}x{width}",
           "avg_degree": round(edge_index.shape[1] / nodes, 1),
           "default_BE": be, "default_warps": default_warps(be, hb, fb),
           "default_group_rows": kernels._one_pass_config(heads, width, layer != "GATConv")["rows"]}
    for v in variants:
        row[f"step_{v}_ms"] = steps[v]["median_ms"]
        row[f"fwd_{v}_ms"] = fwds[v]["median_ms"]
    return row


def main(argv=None):
    parser = step_benchmark_parser(__doc__.splitlines()[0])
    parser.add_argument("--graphs", default="", help="comma-separated graph names (CUDA: suite names; CPU: Cora, Facebook, products-down); default all")
    parser.add_argument("--layers", default="GATConv", help=f"comma-separated, of {', '.join(LAYERS)}")
    parser.add_argument("--edge-dim", type=int, default=0, help="edge features per edge (0: none)")
    parser.add_argument("--separate-projections", action="store_true",
                        help="also time our step with GATConv's projections through autograd op by op "
                        "(gnnfuse_separate_ms)")
    parser.add_argument("--edge-blocks", default="", help="comma-separated BE values (e.g. 8) and warp counts "
                        "(e.g. W2) to sweep (CUDA)")
    args = parser.parse_args(argv)
    device = benchmark_device(args)
    names = [g for g in args.graphs.split(",") if g]
    if device.type == "cpu":
        graphs = {k: v for k, v in cpu_graphs().items() if not names or k.split(" ")[0] in names}
    else:
        graphs = cuda_graphs(device, names)
    configs = CPU_CONFIGS if device.type == "cpu" else CUDA_CONFIGS
    if args.edge_blocks:
        return sweep(args, graphs, configs, device)
    rows = each_row(args, graphs, configs, device,
                    lambda name, ei, nodes, heads, width, dropout, layer: run_row(
                        name, ei, nodes, heads, width, dropout, device, args.rounds, layer, args.edge_dim,
                        args.separate_projections))
    speedups = [r["speedup"] for r in rows if "speedup" in r]
    meta = dict(machine(device), benchmark=f"{args.layers} training step and forward vs sum gather-scatter",
                geomean_speedup=round(geomean(speedups), 3),
                load_average_1_5_15min=os.getloadavg())  # other tenants of a shared host show up here
    columns = ["layer", "graph", "nodes", "edges", "HxF", "dropout", "edge_dim", "gnnfuse_ms", "gnnfuse_iqr_ms", "pyg_ms", "pyg_iqr_ms",
               "speedup", "gnnfuse_peak_MB", "pyg_peak_MB", "mem_ratio", "gnnfuse_first_peak_MB", "pyg_first_peak_MB",
               "first_mem_ratio", "gnnfuse_cache_MB", "fwd_attention_ms", "fwd_sum_ms", "fwd/sum",
               "fwd_no_groups_ms", "error"]
    if args.separate_projections:
        columns[columns.index("pyg_ms"):columns.index("pyg_ms")] = ["gnnfuse_separate_ms", "gnnfuse_separate_iqr_ms"]
    tag = "" if args.layers == "GATConv" else "_" + args.layers.replace(",", "-").lower()
    tag += f"_edge-dim{args.edge_dim}" if args.edge_dim else ""
    md = save_results(f"attention{tag}_{device_label(device)}", meta, rows, columns, args.out)
    print(md.read_text())


def each_row(args, graphs, configs, device, measure) -> list[dict]:
    """One row per (graph, layer, heads x width config): ``measure(name, edge_index, nodes, heads,
    width, dropout, layer)``; a failing row is recorded with its error instead of ending the run."""
    rows = []
    for name, (edge_index, nodes) in graphs.items():
        edge_index = edge_index.to(device)
        for layer in args.layers.split(","):
            for heads, width, dropout in configs:
                try:
                    rows.append(measure(name, edge_index, nodes, heads, width, dropout, layer))
                except Exception as exc:  # a row, not a crash
                    rows.append({"layer": layer, "graph": name, "HxF": f"{heads}x{width}",
                                 "error": f"{type(exc).__name__}: {exc}"[:200]})
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                print(rows[-1], flush=True)
    return rows


def sweep(args, graphs, configs, device):
    blocks = [b if b[0] in "BHWG" else f"BE{b}" for b in args.edge_blocks.split(",")]
    rows = each_row(args, graphs, configs, device,
                    lambda name, ei, nodes, heads, width, dropout, layer: sweep_row(
                        name, ei, nodes, heads, width, dropout, device, args.rounds, layer, blocks))
    meta = dict(machine(device), benchmark=f"{args.layers}: edge block BE sweep (training step, forward)",
                load_average_1_5_15min=os.getloadavg())
    columns = ["layer", "graph", "HxF", "avg_degree", "default_BE", "default_warps",
               "default_group_rows"] + [
        f"{kind}_{label}_ms" for kind in ("step", "fwd") for label in ["default", *blocks]] + ["error"]
    md = save_results(f"attention-edge-block_{device_label(device)}", meta, rows, columns, args.out)
    print(md.read_text())


if __name__ == "__main__":
    main()
