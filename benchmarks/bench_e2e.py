"""End-to-end: full-batch training epochs of the standard OGB models, gnnfuse.nn vs stock PyG, per node order.

    python -m benchmarks.bench_e2e --device cpu --out benchmarks/results             # small scales (minutes)
    python -m benchmarks.bench_e2e --device cuda --scale 1.0 --out "$OUT"            # arxiv and products scale
    python -m benchmarks --suite e2e --device cuda -- --scale 0.5 --graphs community-products

Configurations (the OGB leaderboards' full-batch baselines): an arxiv-like graph trains a 3-layer GCN
128 -> 256 -> 256 -> 40 (cached normalisation), a products-like graph a 3-layer SAGE-mean 100 -> 256 ->
256 -> 47; ReLU and dropout 0.5 between layers, cross-entropy on every node, an Adam step. A graph is
taken in three orders: as generated, scrambled (random ids) and the scrambled graph after
``gnnfuse.reorder(method=--reorder)`` (features and labels permuted alike). In each order, gnnfuse.nn and
stock PyG (its edge_index path and its torch.sparse adj_t path, without torch_scatter/torch_sparse) train
the same model from the same weights on the same ordered graph.

Timing: each variant runs --warmup epochs, then --epochs consecutive epochs, timed one by one (median
reported): what a training loop runs. (This benchmark used to time one epoch per variant per round;
allocator churn of the variant with the largest footprint could then land on whichever ran next, which
an independent H100 run suggested penalised the stock paths on GPU; not measured on CPU here.) An epoch
is split by synchronised timestamps into forward, loss, backward, the Adam step (``optimizer_ms``) and
zero_grad (``other_ms``); the forward + backward is split into aggregation and dense work by timing the
same gnnfuse model with every aggregation replaced by zeros (``dense_ms``, the linear layers, activations, dropout and autograd; the
same dense work for the stock variants except that gnnfuse's SAGE aggregates after its linear map when
that narrows): ``aggregation_ms`` = forward + backward - dense_ms.

``--conv GCNConv`` trains the graph's configuration with another layer (e.g. a GCN on products-like);
``--lookup`` adds "gnnfuse (lookup)" to GCN runs: the backward looks its cached edge weights up through
the transpose's positions on every call instead of reading their transpose-order copy.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from unittest import mock

import torch
import torch.nn.functional as F

from benchmarks.common import device_label, geomean, machine, save_results, synchronize, transpose_weights_looked_up
from gnnfuse import CSR, locality_stats
from gnnfuse.graphs import SUITE, suite_graph
from gnnfuse.ordering import relabel, reorder

# graph-name part -> (conv, kwargs, in, hidden, classes, layers)
CONFIGS = {"arxiv": ("GCNConv", dict(cached=True), 128, 256, 40, 3),
           "products": ("SAGEConv", dict(aggr="mean"), 100, 256, 47, 3)}
CPU_SCALES = {"arxiv": 0.25, "products": 0.02}  # CPU defaults: a few minutes on 2 cores
VARIANTS = ("gnnfuse", "stock edge_index", "stock sparse adj_t")


class Net(torch.nn.Module):
    def __init__(self, conv, kw, f_in, hidden, classes, layers, dropout=0.5):
        super().__init__()
        dims = [f_in] + [hidden] * (layers - 1) + [classes]
        self.convs = torch.nn.ModuleList(conv(a, b, **kw) for a, b in zip(dims, dims[1:]))
        self.dropout = dropout

    def forward(self, x, graph):
        for i, conv in enumerate(self.convs):
            x = conv(x, graph)
            if i < len(self.convs) - 1:
                x = F.dropout(x.relu(), self.dropout, self.training)
        return x


def config_of(graph: str):
    for key, cfg in CONFIGS.items():
        if key in graph:
            return key, cfg
    raise SystemExit(f"no model configuration for graph {graph!r} (its name must contain one of {list(CONFIGS)})")


def time_epochs(model, x, graph, y, device, warmup, epochs, seed=0):
    """Median per-phase milliseconds over `epochs` consecutive epochs after `warmup` ones, and the first epoch's."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    torch.manual_seed(seed)
    phases = {k: [] for k in ("epoch", "forward", "loss", "backward", "optimizer", "other")}
    first = None
    for i in range(warmup + epochs):
        synchronize(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        synchronize(device)
        t1 = time.perf_counter()
        out = model(x, graph)
        synchronize(device)
        t2 = time.perf_counter()
        loss = F.cross_entropy(out, y)
        synchronize(device)
        t3 = time.perf_counter()
        loss.backward()
        synchronize(device)
        t4 = time.perf_counter()
        opt.step()
        synchronize(device)
        t5 = time.perf_counter()
        del out, loss
        if i == 0:
            first = (t5 - t0) * 1e3
        if i >= warmup:
            for key, ms in (("epoch", t5 - t0), ("forward", t2 - t1), ("loss", t3 - t2), ("backward", t4 - t3),
                            ("optimizer", t5 - t4), ("other", t1 - t0)):
                phases[key].append(ms * 1e3)
    result = {f"{k}_ms": statistics.median(v) for k, v in phases.items()}
    result["epoch_min_ms"] = min(phases["epoch"])
    result["first_epoch_ms"] = first
    return result


def dense_only(make_model, x, graph, y, device, warmup, epochs):
    """The gnnfuse model's forward + backward with every aggregation replaced by zeros."""
    from gnnfuse.nn import _mixin

    def zeros(x_src, edge_index, reduce, *, num_nodes, **_):
        return x_src.new_zeros(num_nodes, *x_src.shape[1:])

    with mock.patch.object(_mixin, "fused_gather_scatter", zeros):
        t = time_epochs(make_model(), x, graph, y, device, warmup, epochs)
    return t["forward_ms"] + t["backward_ms"]


def orders(name, scale, device, method, seed=0):
    """{order: (edge_index, perm or None, extra info)} for the three orders of a suite graph."""
    generated, n = suite_graph(name, scale=scale, device=device, seed=seed)
    scrambled, _ = suite_graph(name, scale=scale, order="scrambled", device=device, seed=seed)
    synchronize(device)
    t0 = time.perf_counter()
    perm = reorder(scrambled, n, method)
    reordered = relabel(scrambled, perm)
    synchronize(device)
    reorder_ms = (time.perf_counter() - t0) * 1e3
    return n, {"generated": (generated, None, {}), "scrambled": (scrambled, None, {}),
               f"reordered-{method}": (reordered, perm, {"reorder_ms": reorder_ms})}


def run_graph(name, args, device, rows):
    import torch_geometric.nn as P
    from torch_geometric.utils import to_torch_csr_tensor

    import gnnfuse.nn as G

    key, (conv, kw, f_in, hidden, classes, layers) = config_of(name)
    if args.conv:
        conv, kw = args.conv, (dict(cached=True) if args.conv == "GCNConv" else {})
    scale = args.scale if args.scale is not None else (1.0 if device.type == "cuda" else CPU_SCALES[key])
    n, variants = orders(name, scale, device, args.reorder)
    g = torch.Generator(device=device).manual_seed(1)
    x0 = torch.randn(n, f_in, generator=g, device=device)
    y0 = torch.randint(0, classes, (n,), generator=g, device=device)
    model_desc = f"{conv[:-4]}{'-mean' if kw.get('aggr') == 'mean' else ''} {layers}L {f_in}-{hidden}-{classes}"
    print(f"{name} (scale {scale}): {n} nodes, {variants['generated'][0].shape[1]} edges; {model_desc}", flush=True)
    torch.manual_seed(0)
    weights = Net(getattr(P, conv), kw, f_in, hidden, classes, layers).state_dict()

    def make(cls):
        m = Net(getattr(cls, conv), kw, f_in, hidden, classes, layers).to(device)
        m.load_state_dict(weights)
        return m

    runs = VARIANTS + (("gnnfuse (lookup)",) if args.lookup and conv == "GCNConv" else ())
    for order, (ei, perm, info) in variants.items():
        x, y = (x0, y0) if perm is None else (x0[perm], y0[perm])
        stats = locality_stats(CSR.from_edge_index(ei, n))
        base = dict(graph=name, dataset=f"{name} ({order})", order=order, model=model_desc, nodes=n,
                    edges=ei.shape[1], scale=scale, distinct_per_edge=round(stats.distinct_fraction, 3), **info)
        times, errors = {}, {}
        for variant in runs:
            if variant in args.skip:
                continue
            graph = ei
            try:
                if variant == "stock sparse adj_t":
                    graph = to_torch_csr_tensor(ei.flip(0), size=(n, n))  # transposed adjacency: rows = targets
                model = make(G if variant.startswith("gnnfuse") else P)
                if variant == "gnnfuse (lookup)":
                    with transpose_weights_looked_up():
                        times[variant] = time_epochs(model, x, graph, y, device, args.warmup, args.epochs)
                else:
                    times[variant] = time_epochs(model, x, graph, y, device, args.warmup, args.epochs)
            except (RuntimeError, MemoryError, NotImplementedError) as e:  # e.g. stock PyG out of memory
                errors[variant] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            model = graph = None
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            t = times.get(variant)
            print(f"  {order:24s} {variant:19s} " + (f"{t['epoch_ms']:9.1f} ms/epoch (fwd {t['forward_ms']:.1f}, "
                                                      f"bwd {t['backward_ms']:.1f}, opt {t['optimizer_ms']:.1f})"
                                                      if t else f"skip: {errors[variant]}"), flush=True)
        dense = None
        if "gnnfuse" in times:
            dense = dense_only(lambda: make(G), x, ei, y, device, 1, max(2, args.epochs // 2))
        for variant, t in times.items():
            row = dict(base, variant=variant, **{k: round(v, 3) for k, v in t.items() if v is not None})
            if dense is not None:
                row["dense_ms"] = round(dense, 3)
                row["aggregation_ms"] = round(t["forward_ms"] + t["backward_ms"] - dense, 3)
            rows.append(row)
        stock = {v: t["epoch_ms"] for v, t in times.items() if v.startswith("stock")}
        if "gnnfuse" in times and stock:
            best = min(stock, key=stock.get)
            summary = dict(base, variant="summary", best_stock=best, gnnfuse_ms=times["gnnfuse"]["epoch_ms"],
                           best_stock_ms=stock[best], speedup_vs_best_stock=stock[best] / times["gnnfuse"]["epoch_ms"],
                           speedup_vs_edge_index=(stock.get("stock edge_index") or float("nan"))
                           / times["gnnfuse"]["epoch_ms"],
                           status="ok" + "".join(f"; {k}: {v}" for k, v in errors.items()))
            rows.append(summary)
        elif errors:
            rows.append(dict(base, variant="summary", status="; ".join(f"{k}: {v}" for k, v in errors.items())))


COLUMNS = ["dataset", "model", "variant", "nodes", "edges", "distinct_per_edge", "reorder_ms", "epoch_ms", "forward_ms",
           "backward_ms", "loss_ms", "optimizer_ms", "other_ms", "aggregation_ms", "dense_ms", "first_epoch_ms",
           "best_stock", "speedup_vs_best_stock", "speedup_vs_edge_index", "status"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--graphs", default="community-arxiv,community-products",
                    help="gnnfuse.graphs.SUITE names containing 'arxiv' or 'products' (that picks the model)")
    ap.add_argument("--scale", type=float, default=None,
                    help=f"graph-scale factor (default: 1.0 on CUDA; on CPU {CPU_SCALES})")
    ap.add_argument("--reorder", default="auto", help="gnnfuse.reorder method of the third order")
    ap.add_argument("--warmup", type=int, default=None, help="untimed epochs per variant (default 3 CUDA, 1 CPU)")
    ap.add_argument("--epochs", type=int, default=None, help="timed consecutive epochs (default 10 CUDA, 3 CPU)")
    ap.add_argument("--skip", default="", help="variants not to run, comma-separated (e.g. 'stock edge_index')")
    ap.add_argument("--quick", action="store_true", help="tiny graphs, 1 + 2 epochs (smoke test)")
    ap.add_argument("--max-seconds", type=float, default=None, help="(kept for the entry point; unused)")
    ap.add_argument("--out", default=None, help="directory for e2e_<device>.json/.md (default benchmarks/results)")
    ap.add_argument("--conv", default=None, choices=["GCNConv", "SAGEConv"],
                    help="train every graph with this layer (default: the graph's configuration)")
    ap.add_argument("--lookup", action="store_true",
                    help='GCN runs also time "gnnfuse (lookup)": edge weights looked up per backward call')
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device")
    cuda = device.type == "cuda"
    args.warmup = args.warmup if args.warmup is not None else (3 if cuda else 1)
    args.epochs = args.epochs if args.epochs is not None else (10 if cuda else 3)
    if args.quick:
        args.scale, args.warmup, args.epochs = min(args.scale or 0.01, 0.01), 1, 2
    args.skip = set(filter(None, args.skip.split(",")))
    for name in args.graphs.split(","):
        if name not in SUITE:
            raise SystemExit(f"unknown graph {name!r}; known: {', '.join(SUITE)}")
    rows: list[dict] = []
    meta = dict(machine(device), benchmark="bench_e2e", device=device_label(device), warmup=args.warmup,
                epochs=args.epochs, reorder=args.reorder)
    import torch_geometric

    meta["torch_geometric"] = torch_geometric.__version__
    if hasattr(os, "getloadavg"):
        meta["load_average_1min_at_start"] = round(os.getloadavg()[0], 2)
    name = f"e2e_{device_label(device)}{args.tag}"
    notes = __doc__.split("\n\n", 2)[2]
    for gname in args.graphs.split(","):
        run_graph(gname, args, device, rows)
        ok = [r["speedup_vs_best_stock"] for r in rows if r.get("speedup_vs_best_stock")]
        meta.update(geomean_speedup_vs_best_stock=geomean(ok) if ok else None,
                    min_speedup_vs_best_stock=min(ok) if ok else None)
        md = save_results(name, meta, rows, COLUMNS, args.out, notes=notes)  # partial results survive a timeout
    print(md.read_text())


if __name__ == "__main__":
    main()
