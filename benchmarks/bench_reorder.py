"""Cost accounting of node reordering: what ``gnnfuse.reorder`` costs and what it saves, per graph and method.

    python -m benchmarks.bench_reorder --device cpu --out benchmarks/results            # community-1m
    python -m benchmarks.bench_reorder --device cuda --graphs community-products --width 128
    python -m benchmarks --suite reorder --quick

Each realistic graph is taken in three orders: as generated (its ids carry the planted locality:
the best case), scrambled (random ids), and the scrambled graph reordered by each method. Per order:
the locality statistic (gnnfuse.locality_stats), the reorder time (reorder() + relabelling the edges
+ permuting the features; ``reorder_s`` warm, as the epochs are timed, ``reorder_cold_s`` the
method's first call: for the first method (``auto`` by default) the process's first gnnfuse call, made
right after the graphs are generated; ``triton_cache_files_at_start`` says whether Triton's on-disk
cache was empty), the CSR rebuild of the
relabelled graph, the sum forward of our kernel and of torch.sparse.mm at F = --width, and one
training epoch of a 2-layer GCN (gnnfuse.nn, hidden --hidden, cached normalisation, Adam step).
Forwards and epochs of all orders are timed in turns (benchmarks.common.bench_interleaved).
``break_even_epochs`` = (reorder + CSR rebuild) / (scrambled epoch - reordered epoch): the epochs
after which reordering has paid for itself (counting the rebuild as extra, which is conservative:
the scrambled graph needed its own CSR too); ``break_even_cold_epochs`` the same with the first
call's reorder time. ``recovered`` = the share of the true order's speed-up (scrambled / generated)
that the reorder recovers.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from benchmarks.common import bench_interleaved, device_label, machine, save_results, synchronize
from gnnfuse import CSR, fused_gather_scatter, locality_stats
from gnnfuse.graphs import suite_graph
from gnnfuse.ordering import relabel, reorder

DEFAULT_METHODS = "auto,community,rcm,degree,metis"


def _timed(fn, device):
    synchronize(device)
    t0 = time.perf_counter()
    value = fn()
    synchronize(device)
    return value, time.perf_counter() - t0


def gcn_epoch(x, edge_index, y, hidden, device):
    """One full-batch epoch (forward, loss, backward, Adam step) of a 2-layer gnnfuse GCN."""
    import torch.nn.functional as F

    import gnnfuse.nn as G
    from gnnfuse.testing import TwoLayerNet

    torch.manual_seed(0)
    model = TwoLayerNet(G.GCNConv, x.shape[1], hidden, int(y.max()) + 1, cached=True).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def epoch():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x, edge_index), y).backward()
        opt.step()

    return epoch


def triton_cache_files():
    """Files in Triton's on-disk kernel cache (TRITON_CACHE_DIR or its default), or None where this
    Triton does not say where that is (``triton.knobs``: Triton 3.4 and later)."""
    try:
        import triton

        cache = Path(triton.knobs.cache.dir)
    except (ImportError, AttributeError):
        return None
    return sum(1 for p in cache.rglob("*") if p.is_file()) if cache.is_dir() else 0


def time_phases(edge_index, n, device):
    """The steps of ``reorder(method="community-refined")`` (what ``auto`` runs on a large scrambled
    graph) timed one by one: where a first call's time goes."""
    from gnnfuse.ordering import cluster_embedding, refine_blocks, zorder

    csr, t_csr = _timed(lambda: CSR.from_edge_index(edge_index, n), device)
    _, t_stats = _timed(lambda: locality_stats(csr), device)
    x, t_embed = _timed(lambda: cluster_embedding(csr), device)
    perm, t_zorder = _timed(lambda: zorder(x), device)
    _, t_refine = _timed(lambda: refine_blocks(csr, perm), device)
    return dict(csr=t_csr, locality_stats=t_stats, embedding=t_embed, zorder=t_zorder, refine=t_refine)


def traced_ops(fn, device, TorchDispatchMode):
    """``fn()`` with every aten op timed on its own (synchronised before and after): seconds per op
    name and first tensor's dtype. Diffing a first call's trace with a second's shows what each op
    pays on first use (CUDA loads a kernel's module on its first launch)."""
    times: dict[str, float] = {}

    class Trace(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            synchronize(device)
            t0 = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            synchronize(device)
            dtype = next((str(a.dtype).replace("torch.", "") for a in args if isinstance(a, torch.Tensor)), "")
            key = f"{func.overloadpacket.__name__}({dtype})"
            times[key] = times.get(key, 0.0) + time.perf_counter() - t0
            return out

    with Trace():
        fn()
    return times


def print_op_trace(scrambled, n, method, device, top=25):
    try:  # torch's dispatch-mode hook (private module, as in the other memory and trace tools here)
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:
        print("  op trace: this torch has no torch.utils._python_dispatch.TorchDispatchMode; skipped", flush=True)
        return
    first, second = (traced_ops(lambda: reorder(scrambled, n, method), device, TorchDispatchMode) for _ in range(2))
    extra = sorted(((first[k] - second.get(k, 0.0), k) for k in first), reverse=True)
    print(f"  op trace of {method}: first call {1e3 * sum(first.values()):.1f} ms in ops, second "
          f"{1e3 * sum(second.values()):.1f} ms; first-use extra by op (ms): "
          + ", ".join(f"{k} {1e3 * d:.1f}" for d, k in extra[:top]), flush=True)


def run_graph(name, args, device, rows):
    methods = [m for m in args.methods.split(",") if m]
    scrambled, n = suite_graph(name, scale=args.scale, order="scrambled", device=device)
    generated = None if args.reorder_only else suite_graph(name, scale=args.scale, device=device)[0]
    print(f"{name}: {n} nodes, {scrambled.shape[1]} edges", flush=True)
    if args.phases:
        for when in ("first call", "second call"):
            phases = time_phases(scrambled, n, device)
            print(f"  phases ({when}): " + ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in phases.items())
                  + f", total {1e3 * sum(phases.values()):.1f} ms", flush=True)

    def features():
        g = torch.Generator(device=device).manual_seed(0)
        return (torch.randn(n, args.width, generator=g, device=device),
                torch.randint(0, args.classes, (n,), generator=g, device=device))

    if args.after_epoch:  # a training process's kernels first: a reorder's first call then pays only its own
        x0, y0 = features()
        epoch = gcn_epoch(x0, scrambled, y0, args.hidden, device)
        for _ in range(2):
            _, t_epoch = _timed(epoch, device)
        print(f"  after two GCN epochs on the scrambled graph (the second {1e3 * t_epoch:.1f} ms)", flush=True)
    if args.op_trace:
        print_op_trace(scrambled, n, methods[0], device)
    perms = {}
    for method in methods:
        try:  # the first method's first call is the process's first gnnfuse call (right after the graphs are
            # made): it pays whatever is loaded or compiled on first use and grows the allocator's pools
            _, t_cold = _timed(lambda: reorder(scrambled, n, method), device)
            perm, t_reorder = _timed(lambda: reorder(scrambled, n, method), device)
        except ImportError as e:
            print(f"  {method}: skipped ({e})", flush=True)
            continue
        print(f"  {method}: reorder {t_reorder:.3f} s (first call {t_cold:.3f} s)", flush=True)
        perms[method] = perm, t_reorder, t_cold
    if not args.after_epoch:
        x0, y0 = features()
    variants = {"generated": dict(edge_index=generated, x=x0, y=y0),
                "scrambled": dict(edge_index=scrambled, x=x0, y=y0)}
    for method, (perm, t_reorder, t_cold) in perms.items():
        (ei, x, y), t_apply = _timed(lambda: (relabel(scrambled, perm), x0[perm], y0[perm]), device)
        variants[f"scrambled+{method}"] = dict(edge_index=ei, x=x, y=y, reorder_s=t_reorder + t_apply,
                                               reorder_cold_s=t_cold + t_apply)
        print(f"  {method}: relabel/permute {t_apply:.3f} s", flush=True)
    if args.reorder_only:
        return
    warm = CSR.from_edge_index(scrambled[:, :1000], n)  # load the extension / compile kernels outside the timings
    fused_gather_scatter(torch.ones(n, 1, device=device), warm, "sum")
    forwards, epochs = {}, {}
    for label, v in variants.items():
        csr, t_csr = _timed(lambda: CSR.from_edge_index(v["edge_index"], n), device)
        v["csr_s"], v["stats"] = t_csr, locality_stats(csr)
        a = torch.sparse_csr_tensor(csr.rowptr, csr.col, torch.ones(csr.num_edges, device=device), (n, n))
        forwards[f"{label}|ours"] = lambda x=v["x"], csr=csr: fused_gather_scatter(x, csr, "sum")
        forwards[f"{label}|sparse.mm"] = lambda x=v["x"], a=a: torch.sparse.mm(a, x)
        if not args.no_epochs:
            epochs[label] = gcn_epoch(v["x"], v["edge_index"], v["y"], args.hidden, device)
        print(f"  {label}: CSR {t_csr:.2f} s, {v['stats']}", flush=True)
    fwd = bench_interleaved(forwards, device, rounds=args.rounds, max_seconds=args.max_seconds * len(forwards))
    ep = bench_interleaved(epochs, device, rounds=args.epoch_rounds, max_seconds=args.max_seconds * 3 * len(epochs)) \
        if epochs else {}
    base = {k: fwd[f"scrambled|{k}"]["median_ms"] for k in ("ours", "sparse.mm")}
    best = {k: fwd[f"generated|{k}"]["median_ms"] for k in ("ours", "sparse.mm")}
    for label, v in variants.items():
        s = v["stats"]
        r = dict(graph=name, nodes=n, edges=scrambled.shape[1], F=args.width, order=label,
                 distinct_per_edge=round(s.distinct_fraction, 3),
                 log_gap=None if s.log_gap is None else round(s.log_gap, 3),
                 reorder_s=v.get("reorder_s"), reorder_cold_s=v.get("reorder_cold_s"), csr_build_s=v["csr_s"],
                 ours_ms=fwd[f"{label}|ours"]["median_ms"], sparse_mm_ms=fwd[f"{label}|sparse.mm"]["median_ms"])
        for k, key in (("ours", "ours_ms"), ("sparse.mm", "sparse_mm_ms")):
            r[f"x_{k}_vs_scrambled"] = base[k] / r[key]
            gain, best_gain = base[k] - r[key], base[k] - best[k]
            r[f"recovered_{k}"] = gain / best_gain if best_gain > 0 and label.startswith("scrambled+") else None
        r["ours_vs_sparse_mm"] = r["sparse_mm_ms"] / r["ours_ms"]
        if label in ep:
            r["epoch_ms"] = ep[label]["median_ms"]
            saving = ep["scrambled"]["median_ms"] - r["epoch_ms"]
            r["epoch_saving_ms"] = saving
            if v.get("reorder_s") is not None:
                cost_ms = 1e3 * (v["reorder_s"] + v["csr_s"])
                r["break_even_epochs"] = cost_ms / saving if saving > 0 else None
                cold_ms = 1e3 * (v["reorder_cold_s"] + v["csr_s"])
                r["break_even_cold_epochs"] = cold_ms / saving if saving > 0 else None
        rows.append(r)
        print("  " + ", ".join(f"{k}={round(val, 3) if isinstance(val, float) else val}" for k, val in r.items()
                               if k not in ("graph", "nodes", "edges", "F")), flush=True)


COLUMNS = ["graph", "nodes", "edges", "F", "order", "distinct_per_edge", "log_gap", "reorder_s", "reorder_cold_s",
           "csr_build_s",
           "ours_ms",
           "sparse_mm_ms", "ours_vs_sparse_mm", "x_ours_vs_scrambled", "x_sparse.mm_vs_scrambled", "recovered_ours",
           "recovered_sparse.mm", "epoch_ms", "epoch_saving_ms", "break_even_epochs", "break_even_cold_epochs"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--graphs", default=None, help="gnnfuse.graphs.SUITE names (default: community-1m on CPU, "
                    "community-products on CUDA)")
    ap.add_argument("--scale", type=float, default=1.0, help="graph-scale factor (nodes and edges)")
    ap.add_argument("--methods", default=DEFAULT_METHODS)
    ap.add_argument("--width", type=int, default=128, help="feature width of the forwards and the GCN's input")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--classes", type=int, default=47)
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds of the forwards")
    ap.add_argument("--epoch-rounds", type=int, default=5, help="interleaved rounds of the epochs")
    ap.add_argument("--no-epochs", action="store_true", help="forwards only")
    ap.add_argument("--reorder-only", action="store_true",
                    help="time the reorder calls only (first and second call of this process), print, save nothing: "
                         "run after a full run, it shows what a later process pays once the kernels are compiled")
    ap.add_argument("--phases", action="store_true",
                    help="first time the steps of community-refined one by one (the process's first call, then a "
                         "second), before the methods")
    ap.add_argument("--op-trace", action="store_true",
                    help="first trace the first method's first and second call op by op (what each op pays on first use)")
    ap.add_argument("--after-epoch", action="store_true",
                    help="first run two GCN epochs on the scrambled graph, so that the reorder's first call pays only "
                         "for what training does not load anyway (its marginal first-call cost)")
    ap.add_argument("--max-seconds", type=float, default=3.0)
    ap.add_argument("--quick", action="store_true", help="a 2%% scale smoke run")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device")
    if args.quick:
        args.scale, args.rounds, args.epoch_rounds, args.max_seconds = min(args.scale, 0.02), 3, 3, 0.3
        args.methods = "auto,community,rcm,degree"
    graphs = args.graphs or ("community-products" if device.type == "cuda" else "community-1m")
    rows: list[dict] = []
    meta = dict(machine(device), benchmark="bench_reorder", device=device_label(device), scale=args.scale,
                width=args.width, hidden=args.hidden)
    try:
        meta["load_average_1min"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    if device.type == "cuda":
        meta["triton_cache_files_at_start"] = triton_cache_files()
    if "triton_cache_files_at_start" in meta:
        print(f"Triton cache files at start: {meta['triton_cache_files_at_start']}", flush=True)
    name = f"reorder_{device_label(device)}{args.tag}"
    for gname in graphs.split(","):
        run_graph(gname, args, device, rows)
        if args.reorder_only:
            continue
        save_results(name, meta, rows, COLUMNS, args.out, notes=__doc__.split("\n\n", 2)[2])
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if not args.reorder_only:
        md = save_results(name, meta, rows, COLUMNS, args.out, notes=__doc__.split("\n\n", 2)[2])
        print(md.read_text())


if __name__ == "__main__":
    main()
