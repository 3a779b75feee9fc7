"""Aggregation breadth: several reductions in one pass, the torch_scatter-compatible API, PNAConv.

    python -m benchmarks.bench_aggregation --device cpu  --out benchmarks/results   # Cora, Facebook, synthetic
    python -m benchmarks.bench_aggregation --device cuda --out "$OUT"               # synthetic, built on the device

Three tables, every variant of a row timed in the same process, interleaved
(benchmarks.common.bench_interleaved), median (and min) over rounds:

* ``multi``: ``fused_gather_scatter(x, csr, ["mean", "min", "max", "std"])`` (one pass) against one
  "sum" pass and against four single-reduction passes (mean, min, max and the two passes std
  would need), forward only and forward + backward (gradient of x). Goal: one pass of four <= 1.5x
  one sum pass.
* ``scatter``: ``gnnfuse.scatter(msg, dst, 0, dim_size=N, reduce=r)`` on messages [E, F] against
  ``torch.Tensor.scatter_reduce`` (include_self=False) and, for sum, ``index_add_``; torch_scatter
  too when it is installed. Two gnnfuse columns: ``gnnfuse`` with the same index tensor every call
  (a GNN's edge index: its sort is cached) and ``gnnfuse_oneoff`` with a fresh copy of the index
  every call (sorted, and its per-graph setup built, each time). On CPU, where torch_scatter is
  single-threaded, ``scatter_reduce_1t`` (scatter_reduce on one thread) stands in for it when it
  is not installed.
* ``pna``: a PNAConv training step (forward, loss, gradients of every parameter), gnnfuse.nn vs
  torch_geometric.nn with the same weights; ``gnnfuse_keep`` is our layer with
  ``recompute_aggregations = False`` (each tower keeps its aggregation for the backward). Peak
  memory above the inputs on CUDA (after one warm-up step, so the per-graph caches -- CSR,
  transpose, plans -- count as inputs), against the size of one [N, aggregators*F] output
  (``output_MB``) and of every tower's aggregation (``aggregations_MB``, towers times that); for
  our layers also by phase: the forward's peak, what it leaves saved for the backward, and the
  backward's peak.
"""
from __future__ import annotations

import os

import torch

from benchmarks.common import (bench_interleaved, benchmark_device, cpu_real_and_power_law_graphs, device_label,
                               geomean, machine, save_results, step_benchmark_parser, time_training_steps)

AGGRS = ["mean", "min", "max", "std"]
REDUCES = ["sum", "mean", "max", "min"]


def cpu_graphs():
    return cpu_real_and_power_law_graphs("synthetic power-law 60k/1.2M")


def cuda_graphs(device):
    def power_law(nodes, edges, seed):
        g = torch.Generator(device=device).manual_seed(seed)
        src = torch.randint(0, nodes, (edges,), generator=g, device=device)
        ranks = torch.arange(1, nodes + 1, dtype=torch.float32, device=device)
        dst = torch.multinomial(1.0 / ranks, edges, replacement=True, generator=g)
        return torch.stack([src, torch.randperm(nodes, generator=g, device=device)[dst]])

    def uniform(nodes, edges, seed):
        g = torch.Generator(device=device).manual_seed(seed)
        return torch.randint(0, nodes, (2, edges), generator=g, device=device)

    return {"arxiv-like (power-law)": (power_law(170_000, 1_170_000, 0), 170_000),
            "products-like (uniform)": (uniform(1_000_000, 12_000_000, 2), 1_000_000)}


def _times(row, prefix, times):
    for label, t in times.items():
        row[f"{prefix}{label}_ms"] = t["median_ms"]


def multi_row(name, csr, nodes, width, device, rounds):
    import gnnfuse

    x = torch.randn(nodes, width, device=device)
    xg = x.clone().requires_grad_()
    row = {"graph": name, "nodes": nodes, "edges": csr.num_edges, "F": width}

    def passes(t):
        return [gnnfuse.fused_gather_scatter(t, csr, r) for r in ("mean", "min", "max", "mean")] + \
               [gnnfuse.fused_gather_scatter(t * t, csr, "mean")]  # std from mean(x^2) - mean^2: 5 passes

    with torch.no_grad():
        fwd = bench_interleaved({
            "sum": lambda: gnnfuse.fused_gather_scatter(x, csr, "sum"),
            "multi4": lambda: gnnfuse.fused_gather_scatter(x, csr, AGGRS),
            "separate": lambda: passes(x),
        }, device, rounds=rounds, max_seconds=10.0)
    _times(row, "fwd_", fwd)
    train = bench_interleaved({
        "sum": lambda: torch.autograd.grad(gnnfuse.fused_gather_scatter(xg, csr, "sum").sum(), xg),
        "multi4": lambda: torch.autograd.grad(gnnfuse.fused_gather_scatter(xg, csr, AGGRS).sum(), xg),
        "separate": lambda: torch.autograd.grad(sum(p.sum() for p in passes(xg)), xg),
    }, device, rounds=rounds, max_seconds=10.0)
    _times(row, "train_", train)
    row["fwd multi4/sum"] = row["fwd_multi4_ms"] / row["fwd_sum_ms"]
    row["fwd separate/multi4"] = row["fwd_separate_ms"] / row["fwd_multi4_ms"]
    row["train multi4/sum"] = row["train_multi4_ms"] / row["train_sum_ms"]
    row["train separate/multi4"] = row["train_separate_ms"] / row["train_multi4_ms"]
    return row


def scatter_rows(name, edge_index, nodes, width, device, rounds):
    import gnnfuse

    try:
        import torch_scatter
    except ImportError:
        torch_scatter = None
    src, dst = edge_index[0], edge_index[1]
    msg = torch.randn(nodes, width, device=device)[src]
    rows = []
    for reduce in REDUCES:
        torch_name = {"max": "amax", "min": "amin"}.get(reduce, reduce)
        idx = dst.view(-1, 1).expand(-1, width)
        fns = {
            "gnnfuse": lambda: gnnfuse.scatter(msg, dst, 0, dim_size=nodes, reduce=reduce),
            "gnnfuse_oneoff": lambda: gnnfuse.scatter(msg, dst.clone(), 0, dim_size=nodes, reduce=reduce),
            "scatter_reduce": lambda: msg.new_zeros(nodes, width).scatter_reduce(0, idx, msg, torch_name,
                                                                                include_self=False),
        }
        if device.type == "cpu" and torch_scatter is None:
            fns["scatter_reduce_1t"] = lambda: _one_thread(
                lambda: msg.new_zeros(nodes, width).scatter_reduce(0, idx, msg, torch_name, include_self=False))
        if reduce == "sum":
            fns["index_add_"] = lambda: msg.new_zeros(nodes, width).index_add_(0, dst, msg)
        if torch_scatter is not None:
            fns["torch_scatter"] = lambda: torch_scatter.scatter(msg, dst, 0, dim_size=nodes, reduce=reduce)
        with torch.no_grad():
            times = bench_interleaved(fns, device, rounds=rounds, max_seconds=8.0)
        row = {"graph": name, "edges": edge_index.shape[1], "F": width, "reduce": reduce}
        _times(row, "", times)
        row["scatter_reduce/gnnfuse"] = row["scatter_reduce_ms"] / row["gnnfuse_ms"]
        row["scatter_reduce/gnnfuse_oneoff"] = row["scatter_reduce_ms"] / row["gnnfuse_oneoff_ms"]
        if "scatter_reduce_1t_ms" in row:
            row["scatter_reduce_1t/gnnfuse"] = row["scatter_reduce_1t_ms"] / row["gnnfuse_ms"]
        if "torch_scatter_ms" in row:
            row["torch_scatter/gnnfuse"] = row["torch_scatter_ms"] / row["gnnfuse_ms"]
        rows.append(row)
        print(row, flush=True)
    return rows


def _one_thread(fn):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


def pna_row(name, edge_index, nodes, width, device, rounds):
    import torch_geometric.nn as pyg_nn

    import gnnfuse.nn as G
    from benchmarks.bench_attention import make_step

    deg = torch.bincount(torch.bincount(edge_index[1], minlength=nodes).cpu())
    kwargs = dict(aggregators=AGGRS, scalers=["identity", "amplification", "attenuation"], deg=deg, towers=4)
    torch.manual_seed(0)
    x = torch.randn(nodes, width, device=device)
    stock = pyg_nn.PNAConv(width, width, **kwargs).to(device).train()
    ours = G.PNAConv(width, width, **kwargs).to(device).train()
    ours.load_state_dict(stock.state_dict())
    keep = G.PNAConv(width, width, **kwargs).to(device).train()  # keeps each tower's aggregation
    keep.load_state_dict(stock.state_dict())
    keep.recompute_aggregations = False
    row = {"graph": name, "nodes": nodes, "edges": edge_index.shape[1], "F": width, "towers": 4}
    steps = {"gnnfuse": make_step(ours, x, edge_index), "gnnfuse_keep": make_step(keep, x, edge_index),
             "pyg": make_step(stock, x, edge_index)}
    for label in ("gnnfuse", "gnnfuse_keep"):  # graph caches (CSR, transpose, plans) built before the peaks
        steps[label]()
        row.update({f"{label}_{k}": v for k, v in phase_peaks_mb(ours if label == "gnnfuse" else keep, x,
                                                                  edge_index, device).items()})
    time_training_steps(row, steps, device, rounds)
    row["output_MB"] = nodes * len(AGGRS) * width * x.element_size() / 2**20  # one [N, aggregators*F]
    row["aggregations_MB"] = row["output_MB"] * ours.towers  # each tower's [N, aggregators*F_in]
    return row


def phase_peaks_mb(layer, x, edge_index, device) -> dict:
    """Memory of one training step by phase, MB above what was allocated before it: the forward's
    peak, what the forward leaves for the backward (``saved``), and the backward's peak (CUDA)."""
    if device.type != "cuda":
        return {}
    params = list(layer.parameters())
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = layer(x, edge_index).square().mean()
    torch.cuda.synchronize()
    fwd, saved = torch.cuda.max_memory_allocated() - base, torch.cuda.memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    torch.autograd.grad(loss, params)
    torch.cuda.synchronize()
    bwd = torch.cuda.max_memory_allocated() - base
    del loss
    return {"fwd_peak_MB": fwd / 2**20, "saved_MB": saved / 2**20, "bwd_peak_MB": bwd / 2**20}


def main(argv=None):
    parser = step_benchmark_parser(__doc__.splitlines()[0])
    parser.add_argument("--widths", default="64")
    parser.add_argument("--parts", default="multi,scatter,pna")
    parser.add_argument("--pna-max-edges", type=int, default=5_000_000,
                        help="skip the PNA step on larger graphs (PyG's per-edge messages: minutes, or OOM)")
    parser.add_argument("--quick", action="store_true", help="Cora-sized graphs only, 3 rounds (a smoke test)")
    args = parser.parse_args(argv)
    device = benchmark_device(args)
    graphs = cpu_graphs() if device.type == "cpu" else cuda_graphs(device)
    if args.quick:
        graphs = {k: v for k, v in list(graphs.items())[:1]}
        args.rounds = 3
    widths = [int(w) for w in args.widths.split(",")]
    parts = args.parts.split(",")
    import gnnfuse

    tables = {"multi": [], "scatter": [], "pna": []}
    for name, (edge_index, nodes) in graphs.items():
        edge_index = edge_index.to(device)
        csr = gnnfuse.CSR.from_edge_index(edge_index, num_nodes=nodes)
        for width in widths:
            for part, fn in (("multi", lambda: [multi_row(name, csr, nodes, width, device, args.rounds)]),
                             ("scatter", lambda: scatter_rows(name, edge_index, nodes, width, device, args.rounds)),
                             ("pna", lambda: [pna_row(name, edge_index, nodes, width, device, args.rounds)])):
                if part not in parts or (part == "pna" and edge_index.shape[1] > args.pna_max_edges):
                    continue
                try:
                    tables[part] += fn()
                except Exception as exc:  # a row, not a crash
                    tables[part].append({"graph": name, "F": width, "error": f"{type(exc).__name__}: {exc}"[:200]})
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                print(part, tables[part][-1], flush=True)
    meta = dict(machine(device), load_average_1_5_15min=os.getloadavg())  # other tenants show up here
    label = device_label(device)
    columns = {
        "multi": ["graph", "nodes", "edges", "F", "fwd_sum_ms", "fwd_multi4_ms", "fwd_separate_ms", "fwd multi4/sum",
                  "fwd separate/multi4", "train_sum_ms", "train_multi4_ms", "train_separate_ms", "train multi4/sum",
                  "train separate/multi4", "error"],
        "scatter": ["graph", "edges", "F", "reduce", "gnnfuse_ms", "gnnfuse_oneoff_ms", "scatter_reduce_ms",
                    "scatter_reduce_1t_ms", "index_add__ms", "torch_scatter_ms", "scatter_reduce/gnnfuse",
                    "scatter_reduce/gnnfuse_oneoff", "scatter_reduce_1t/gnnfuse", "torch_scatter/gnnfuse", "error"],
        "pna": ["graph", "nodes", "edges", "F", "towers", "gnnfuse_ms", "gnnfuse_min_ms", "gnnfuse_keep_ms", "pyg_ms",
                "pyg_min_ms", "speedup", "gnnfuse_peak_MB", "gnnfuse_keep_peak_MB", "pyg_peak_MB", "output_MB",
                "aggregations_MB", "gnnfuse_fwd_peak_MB", "gnnfuse_saved_MB", "gnnfuse_bwd_peak_MB",
                "gnnfuse_keep_fwd_peak_MB", "gnnfuse_keep_saved_MB", "gnnfuse_keep_bwd_peak_MB", "error"],
    }
    summary = {
        "multi": lambda rows: {"geomean fwd multi4/sum": geomean([r["fwd multi4/sum"] for r in rows if "F" in r and
                                                                   "fwd multi4/sum" in r]),
                               "geomean train multi4/sum": geomean([r.get("train multi4/sum") for r in rows])},
        "scatter": lambda rows: {"geomean scatter_reduce/gnnfuse": geomean([r.get("scatter_reduce/gnnfuse")
                                                                            for r in rows]),
                                 "geomean scatter_reduce/gnnfuse_oneoff": geomean(
                                     [r.get("scatter_reduce/gnnfuse_oneoff") for r in rows]),
                                 "geomean scatter_reduce_1t/gnnfuse": geomean(
                                     [r.get("scatter_reduce_1t/gnnfuse") for r in rows])},
        "pna": lambda rows: {"geomean speedup": geomean([r.get("speedup") for r in rows])},
    }
    for part in parts:
        if tables[part]:
            md = save_results(f"aggregation-{part}_{label}", {**meta, **summary[part](tables[part])}, tables[part],
                              columns[part], args.out)
            print(md.read_text())


if __name__ == "__main__":
    main()
