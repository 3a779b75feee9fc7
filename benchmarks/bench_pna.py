"""PNAConv training step: time and peak memory of gnnfuse's layer in several settings against PyG's.

    PYTHONPATH=. python -m benchmarks.bench_pna --device cuda --out "$OUT" [--before old_pna.py]
    PYTHONPATH=. python -m benchmarks.bench_pna --device cpu --quick      # a smoke test

Same layer, loss and graph as benchmarks.bench_aggregation's ``pna`` table (4 towers,
mean/min/max/std, three scalers, F=64, arxiv-like power-law graph of 170K nodes and 1.17M edges on
CUDA), one row per variant, every variant timed in the same process, interleaved (median and min
over rounds): ``pyg`` (torch_geometric.nn.PNAConv), ``gnnfuse`` (the default), ``gnnfuse_chunkC``
(``aggregation_chunk_features = C``), ``gnnfuse_keep`` (``recompute_aggregations = False``) and,
with ``--before FILE``, ``before``: the PNAConv class of another version of gnnfuse/nn/_pna.py
(e.g. main's, ``git show main:gnnfuse/nn/_pna.py``) loaded beside this one. Peak memory (CUDA) is
above the inputs, after a warm-up step (per-graph caches count as inputs), overall and by phase
(forward peak, what the forward leaves for the backward, backward peak), and in units of one
[N, aggregators*F] output (the goal: peak <= 1 output). On CPU: Cora, Facebook and the power-law
60K/1.2M graph of the pna table (``--skip pyg`` spares PyG's seconds-long steps there).
"""
from __future__ import annotations

import importlib.util
import os
import sys

import torch

from benchmarks.bench_aggregation import AGGRS, cpu_graphs, cuda_graphs, phase_peaks_mb
from benchmarks.common import (bench_interleaved, benchmark_device, device_label, machine, peak_mb, save_results,
                               step_benchmark_parser)


def load_before(path: str):
    """The PNAConv class of another version of gnnfuse/nn/_pna.py, imported as a sibling module (its
    relative imports resolve against this tree's gnnfuse.nn)."""
    import gnnfuse.nn  # noqa: F401  (the package the module's relative imports need)

    spec = importlib.util.spec_from_file_location("gnnfuse.nn._pna_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.PNAConv


def main(argv=None):
    parser = step_benchmark_parser(__doc__.splitlines()[0])
    parser.add_argument("--before", default=None, help="another version's gnnfuse/nn/_pna.py, timed as 'before'")
    parser.add_argument("--chunks", default="32,16", help="aggregation_chunk_features values to time")
    parser.add_argument("--suffix", default="", help="appended to the result file name")
    parser.add_argument("--skip", default="", help="variants not to run, e.g. 'pyg,gnnfuse_keep' (PyG's CPU step "
                        "takes seconds on the larger graphs); speedups are then against 'before'")
    parser.add_argument("--quick", action="store_true", help="a small graph, 3 rounds (a smoke test)")
    args = parser.parse_args(argv)
    device = benchmark_device(args)
    if args.quick:
        args.rounds = 3
        g = torch.Generator().manual_seed(0)
        graphs = {"random 3K/20K": (torch.randint(0, 3000, (2, 20_000), generator=g), 3000)}
    elif device.type == "cuda":
        graphs = dict([next(iter(cuda_graphs(device).items()))])  # arxiv-like, as the pna table
    else:
        graphs = cpu_graphs()  # Cora, Facebook, power-law 60K/1.2M, as the pna table
    rows = []
    for name, (edge_index, nodes) in graphs.items():
        rows += graph_rows(name, edge_index.to(device), nodes, device, args)
    meta = dict(machine(device), load_average_1_5_15min=os.getloadavg())
    columns = ["variant", "graph", "nodes", "edges", "F", "ms", "min_ms", "iqr_ms", "speedup", "output_MB", "peak_MB",
               "peak_outputs", "fwd_peak_MB", "saved_MB", "bwd_peak_MB"]
    md = save_results(f"aggregation-pna_{device_label(device)}{args.suffix}", meta, rows, columns, args.out)
    print(md.read_text())


def graph_rows(name, edge_index, nodes, device, args) -> list[dict]:
    """One row per variant on one graph (module docstring)."""
    import torch_geometric.nn as pyg_nn

    import gnnfuse.nn as G
    from benchmarks.bench_attention import make_step

    width = 64
    deg = torch.bincount(torch.bincount(edge_index[1], minlength=nodes).cpu())
    kwargs = dict(aggregators=AGGRS, scalers=["identity", "amplification", "attenuation"], deg=deg, towers=4)
    torch.manual_seed(0)
    x = torch.randn(nodes, width, device=device)
    stock = pyg_nn.PNAConv(width, width, **kwargs).to(device).train()
    layers = {"pyg": stock}
    if args.before:
        layers["before"] = load_before(args.before)(width, width, **kwargs)
    layers["gnnfuse"] = G.PNAConv(width, width, **kwargs)
    for chunk in [int(c) for c in args.chunks.split(",") if c]:
        layers[f"gnnfuse_chunk{chunk}"] = G.PNAConv(width, width, **kwargs)
        layers[f"gnnfuse_chunk{chunk}"].aggregation_chunk_features = chunk
    layers["gnnfuse_keep"] = G.PNAConv(width, width, **kwargs)
    layers["gnnfuse_keep"].recompute_aggregations = False
    skip = set(args.skip.split(","))
    for label, layer in list(layers.items()):
        if label != "pyg":
            layer.to(device).train().load_state_dict(stock.state_dict())
        if label in skip:
            del layers[label]
    output_mb = nodes * len(AGGRS) * width * x.element_size() / 2**20  # one [N, aggregators*F]
    steps = {label: make_step(layer, x, edge_index) for label, layer in layers.items()}
    rows = {}
    for label, step in steps.items():
        step()  # graph caches (CSR, transpose, plans) and kernels built before the peaks
        row = {"variant": label, "graph": name, "nodes": nodes, "edges": edge_index.shape[1], "F": width,
               "output_MB": output_mb}
        if label != "pyg":
            row.update(phase_peaks_mb(layers[label], x, edge_index, device))
        row["peak_MB"] = peak_mb(step, device)
        if isinstance(row["peak_MB"], float):
            row["peak_outputs"] = row["peak_MB"] / output_mb
        rows[label] = row
        if device.type == "cuda":
            torch.cuda.empty_cache()
    times = bench_interleaved(steps, device, rounds=args.rounds, max_seconds=30.0)
    anchor = times["pyg"] if "pyg" in times else times.get("before")
    for label, t in times.items():
        rows[label].update(ms=t["median_ms"], min_ms=t["min_ms"], iqr_ms=t["iqr_ms"],
                           speedup=anchor["median_ms"] / t["median_ms"] if anchor else None)
    print(name, {k: round(v["median_ms"], 2) for k, v in times.items()}, flush=True)
    return list(rows.values())


if __name__ == "__main__":
    main()
