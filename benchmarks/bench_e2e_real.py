"""End-to-end on the real graphs (CPU): one training epoch of 2-layer GNNs on Cora and Facebook.

    python -m benchmarks.bench_e2e_real [--datasets Cora,Facebook] [--models GCN,SAGE-mean,SAGE-max] [--out DIR]

The configuration of the first CPU e2e results (2 layers, hidden 64, Facebook's 4,714-dim features
projected to 128 dims outside the epoch): one epoch = zero_grad + forward + cross-entropy + backward
(no optimizer step). Variants, timed in interleaved rounds (one epoch each per round) from the same
weights: gnnfuse.nn, stock PyG on edge_index and on a transposed torch.sparse CSR adj_t (without
torch_scatter / torch_sparse), and "dense only": the gnnfuse model with every aggregation replaced
by one that costs nothing, zeros of its output shape forward and zeros of its input's shape
backward, so that the linear layers feeding an aggregation still run their backward (linear
layers, loss and autograd; results before 2026-11-23 07:00 UTC returned zeros without a gradient,
which skipped that backward: GCN's first layer entirely). dense only / gnnfuse is the share
of the dense bound an epoch reaches (1.0: the aggregations cost nothing); bound_vs_best_stock =
best stock / dense only is the most any aggregation could speed the epoch up. Median and fastest
round of each; on a shared machine the fastest rounds are the fairer figure. ``--cpu-time`` runs
everything on one thread and times it by the thread's CPU time, which time-slicing by other jobs does
not inflate (what a loaded machine can still measure; not the 2-thread wall time).
``--before`` adds "gnnfuse (before)": the same gnnfuse model as the code before constant inputs were
kept (GNNFUSE_CACHE_CONSTANT_AGGREGATION=0: the first layer's aggregation of the raw features runs in
every epoch) and GCN in PyG's order (lin, then aggregate: gnnfuse_aggregate_first=False);
speedup_vs_before: its epoch / gnnfuse's, medians; _fastest: fastest rounds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from unittest import mock

import torch
import torch.nn.functional as F

from benchmarks.common import bench_interleaved, device_label, machine, save_results
from gnnfuse.datasets import load_facebook, load_planetoid
from gnnfuse.testing import TwoLayerNet as Net

MODELS = {"GCN": ("GCNConv", dict(cached=True)), "SAGE-mean": ("SAGEConv", dict(aggr="mean")),
          "SAGE-max": ("SAGEConv", dict(aggr="max"))}
HIDDEN = 64


def load(name: str):
    """(x, edge_index, y) of Cora (raw 1,433-dim features) or Facebook (projected to 128 dims), or None."""
    if name == "Facebook":
        d = load_facebook()
        if d is None:
            return None
        # a fixed random projection: stock PyG would otherwise build a 341,825 x 4,714 message tensor
        proj = torch.randn(d.x.shape[1], 128, generator=torch.Generator().manual_seed(0)) / d.x.shape[1] ** 0.5
        return torch.sparse.mm(d.x, proj), d.edge_index, d.y
    d = load_planetoid(name)
    return None if d is None else (d.x, d.edge_index, d.y)


class FreeAggregation(torch.autograd.Function):
    """An aggregation that costs nothing: zeros out, and zeros back to its input (whose producers,
    e.g. the linear layer a GCNConv applies first, still run their backward)."""

    @staticmethod
    def forward(ctx, x_src, num_nodes):
        ctx.src_shape = x_src.shape
        return x_src.new_zeros(num_nodes, *x_src.shape[1:])

    @staticmethod
    def backward(ctx, grad):
        return grad.new_zeros(ctx.src_shape), None


def make_epoch(model, x, graph, y, dense_only=False):
    from gnnfuse.nn import _mixin

    def zeros(x_src, edge_index, reduce, *, num_nodes, **_):
        return FreeAggregation.apply(x_src, num_nodes)

    def epoch():
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x, graph), y)
        loss.backward()

    if not dense_only:
        return epoch

    def dense():
        with mock.patch.object(_mixin, "fused_gather_scatter", zeros):
            epoch()

    return dense


def before_constant_inputs(model, epoch):
    """The epoch as before constant inputs were kept: no kept aggregation, GCN in PyG's order."""
    for conv in model.modules():
        if hasattr(conv, "gnnfuse_aggregate_first"):
            conv.gnnfuse_aggregate_first = False

    def before():
        with mock.patch.dict(os.environ, {"GNNFUSE_CACHE_CONSTANT_AGGREGATION": "0"}):
            epoch()

    return before


def cpu_time_interleaved(fns, rounds):
    """Like bench_interleaved, timed by this thread's CPU time (one thread only)."""
    samples = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    names = list(fns)
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            t0 = time.thread_time()
            fns[name]()
            samples[name].append((time.thread_time() - t0) * 1e3)
    return {k: {"median_ms": statistics.median(v), "min_ms": min(v)} for k, v in samples.items()}


def run_dataset(name, x, ei, y, models, rounds, max_seconds, cpu_time=False, before=False):
    import torch_geometric.nn as P
    from torch_geometric.utils import to_torch_csr_tensor

    import gnnfuse.nn as G

    n, classes = x.shape[0], int(y.max()) + 1
    adj_t = to_torch_csr_tensor(ei.flip(0), size=(n, n))  # rows = targets
    rows = []
    for model_name in models:
        conv, kw = MODELS[model_name]
        torch.manual_seed(0)
        stock = Net(getattr(P, conv), x.shape[1], HIDDEN, classes, **kw)

        def copy(cls):
            model = Net(cls, x.shape[1], HIDDEN, classes, **kw)
            model.load_state_dict(stock.state_dict())
            return model

        epochs = {"stock edge_index": make_epoch(stock, x, ei, y),
                  "stock sparse adj_t": make_epoch(copy(getattr(P, conv)), x, adj_t, y),
                  "gnnfuse": make_epoch(copy(getattr(G, conv)), x, ei, y),
                  "dense only": make_epoch(copy(getattr(G, conv)), x, ei, y, dense_only=True)}
        if before:
            model = copy(getattr(G, conv))
            epochs["gnnfuse (before)"] = before_constant_inputs(model, make_epoch(model, x, ei, y))
        t = (cpu_time_interleaved(epochs, rounds) if cpu_time
             else bench_interleaved(epochs, "cpu", rounds=rounds, max_seconds=max_seconds))
        med = {k: v["median_ms"] for k, v in t.items()}
        low = {k: v["min_ms"] for k, v in t.items()}
        best = min(("stock edge_index", "stock sparse adj_t"), key=med.get)
        row = dict(dataset=name, nodes=n, edges=ei.shape[1], features=x.shape[1], hidden=HIDDEN, model=model_name,
                   stock_edge_index_ms=med["stock edge_index"], stock_sparse_ms=med["stock sparse adj_t"],
                   gnnfuse_ms=med["gnnfuse"], gnnfuse_min_ms=low["gnnfuse"], dense_only_ms=med["dense only"],
                   dense_only_min_ms=low["dense only"],
                   speedup_vs_best_stock=med[best] / med["gnnfuse"],
                   bound_vs_best_stock=med[best] / med["dense only"],
                   share_of_bound=med["dense only"] / med["gnnfuse"],
                   share_of_bound_fastest=low["dense only"] / low["gnnfuse"])
        if "gnnfuse (before)" in med:
            row.update(gnnfuse_before_ms=med["gnnfuse (before)"], gnnfuse_before_min_ms=low["gnnfuse (before)"],
                       speedup_vs_before=med["gnnfuse (before)"] / med["gnnfuse"],
                       speedup_vs_before_fastest=low["gnnfuse (before)"] / low["gnnfuse"],
                       share_of_bound_before=med["dense only"] / med["gnnfuse (before)"])
        row["load_1min"] = round(os.getloadavg()[0], 1)
        print("  " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
              flush=True)
        rows.append(row)
    return rows


COLUMNS = ["dataset", "nodes", "edges", "features", "hidden", "model", "stock_edge_index_ms", "stock_sparse_ms",
           "gnnfuse_ms", "gnnfuse_min_ms", "dense_only_ms", "dense_only_min_ms", "speedup_vs_best_stock",
           "bound_vs_best_stock", "share_of_bound", "share_of_bound_fastest", "load_1min"]
BEFORE_COLUMNS = ["gnnfuse_before_ms", "gnnfuse_before_min_ms", "speedup_vs_before", "speedup_vs_before_fastest",
                  "share_of_bound_before"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", default="Cora,Facebook")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--max-seconds", type=float, default=20.0, help="time budget per model and dataset")
    ap.add_argument("--out", default=None, help="directory (default benchmarks/results)")
    ap.add_argument("--name", default=None, help="results file name (default e2e-real_<device>)")
    ap.add_argument("--cpu-time", action="store_true", help="one thread, timed by thread CPU time (loaded machines)")
    ap.add_argument("--before", action="store_true",
                    help="also the code before constant inputs were kept (aggregated every epoch; GCN in PyG's order)")
    args = ap.parse_args(argv)
    if args.cpu_time:
        torch.set_num_threads(1)
    rows = []
    for name in args.datasets.split(","):
        data = load(name)
        if data is None:
            print(f"SKIP {name}: not found (needs ../shared/data or $GNNFUSE_DATA)")
            continue
        print(f"{name}: {data[0].shape[0]} nodes, {data[1].shape[1]} edges", flush=True)
        rows += run_dataset(name, *data, args.models.split(","), args.rounds, args.max_seconds, args.cpu_time,
                            args.before)
    meta = dict(machine("cpu"), benchmark="bench_e2e_real", device=device_label("cpu"),
                load_average_1min=round(os.getloadavg()[0], 2),
                clock="thread CPU time, 1 thread" if args.cpu_time else "wall, interleaved")
    import torch_geometric

    meta["torch_geometric"] = torch_geometric.__version__
    columns = COLUMNS + (BEFORE_COLUMNS if any("speedup_vs_before" in r for r in rows) else [])
    md = save_results(args.name or f"e2e-real_{device_label('cpu')}", meta, rows, columns,
                      args.out, notes=__doc__.split("\n\n", 2)[2])
    print(md.read_text())


if __name__ == "__main__":
    main()
