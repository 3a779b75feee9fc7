"""CPU suite of fused_gather_scatter against the anchors, all timed in one process.

    python -m benchmarks.bench_cpu [--quick] [--graphs arxiv-like,Facebook] [--widths 32,128]
                                   [--threads 1,2,4] [--orders generated,scrambled,reordered] [--out DIR]

Every graph can be timed in three orders: as generated (or loaded), with scrambled ids, and the
scrambled graph after ``gnnfuse.reorder`` (``--reorder`` method). The methods of one
configuration are timed in interleaved rounds (each round calls every method once, in a rotating
order), so on a shared machine they see the same conditions; the table gives each method's median
and its spread (median / fastest round - 1).

For each graph, width F and reduction (sum, max): forward and forward+backward of
  gnnfuse        fused_gather_scatter on a prebuilt CSR (C++ kernels)
  gnnfuse-fresh  the same with the reuse of dead outputs' buffers bypassed: every output is fresh
                 memory whose pages fault on first write, as torch.sparse.mm's do (--fresh-output)
  sparse.mm      torch.sparse.mm on a CSR tensor (MKL-style; reduce="amax" for max)
  index_add      index_select + index_add_ (sum) / scatter_reduce (max): stock PyG's path
  compiled       torch.compile of that index_add / scatter_reduce function
  torch_scatter  segment_csr, if installed
plus the CSR build against a bare torch.argsort of the targets. Ratios are anchor / gnnfuse.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import time
from pathlib import Path

import torch

import gnnfuse
from benchmarks.common import RESULTS_DIR, bench, bench_interleaved, device_label, geomean, machine, save_results
from benchmarks.graphs import real_edge_index
from gnnfuse.graphs import scramble, suite_graph
from gnnfuse.ordering import relabel

# products-like scaled to 1/8 so the anchors' E x F tensors fit in 24 GiB
DEFAULT_GRAPHS = ["Cora", "Facebook", "rfc-uniform", "arxiv-like", "products-like/8"]
ANCHORS = ["sparse.mm", "index_add", "compiled", "torch_scatter"]


def load_graph(spec: str, order: str = "generated", reorder_method: str = "community-refined"):
    """(edge_index, num_nodes, reorder seconds or None) of a real or suite graph in ``order``:
    "generated" (as loaded), "scrambled" (random ids) or "reordered" (scrambled, then gnnfuse.reorder)."""
    name, _, divisor = spec.partition("/")
    if name in ("Cora", "CiteSeer", "Facebook"):
        loaded = real_edge_index(name)
        if loaded is None:
            return None
        edge_index, n = loaded
        if order != "generated":
            edge_index, _ = scramble(edge_index, n, seed=1)
    else:
        edge_index, n = suite_graph(name, scale=1 / float(divisor) if divisor else 1.0,
                                    order="generated" if order == "generated" else "scrambled")
    if order != "reordered":
        return edge_index, n, None
    t0 = time.perf_counter()
    perm = gnnfuse.reorder(edge_index, n, reorder_method)
    return relabel(edge_index, perm), n, time.perf_counter() - t0


def fresh_output(fn):
    """fn with the C++ kernels' output cache bypassed during the call."""
    from gnnfuse._build import load_extension

    ext = load_extension()

    def call(x):
        previous = ext.output_cache_bypass(True)
        try:
            return fn(x)
        finally:
            ext.output_cache_bypass(previous)

    return call


def make_methods(edge_index: torch.Tensor, csr: gnnfuse.CSR, reduce: str):
    """name -> function(x) for gnnfuse and every available anchor."""
    src, dst = edge_index[0], edge_index[1]
    n_dst = csr.num_dst
    sparse = torch.sparse_csr_tensor(csr.rowptr, csr.col, torch.ones(csr.num_edges), (n_dst, csr.num_src))

    def stock(x):  # what PyG does without extensions
        msg = x.index_select(0, src)
        if reduce == "sum":
            return x.new_zeros(n_dst, x.shape[1]).index_add_(0, dst, msg)
        return x.new_zeros(n_dst, x.shape[1]).scatter_reduce_(
            0, dst.unsqueeze(1).expand_as(msg), msg, "amax", include_self=False
        )

    methods = {
        "gnnfuse": lambda x: gnnfuse.fused_gather_scatter(x, csr, reduce),
        "sparse.mm": (lambda x: torch.sparse.mm(sparse, x)) if reduce == "sum"
        else (lambda x: torch.sparse.mm(sparse, x, "amax")),
        "index_add": stock,
        "compiled": torch.compile(stock, dynamic=False),
    }
    try:
        import torch_scatter

        methods["torch_scatter"] = lambda x: torch_scatter.segment_csr(
            x.index_select(0, csr.col), csr.rowptr, reduce=reduce
        )
    except ImportError:
        pass
    return methods


def fits_in_memory(num_edges: int, F: int, reduce: str, backward: bool) -> bool:
    """Whether the E x F anchors (index_add / scatter_reduce, compiled) fit in 60% of RAM:
    forward holds ~2 E x F tensors, backward ~3 more, scatter_reduce('amax') backward ~6."""
    copies = 2 + (0 if not backward else 6 if reduce == "max" else 3)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return num_edges * F * 4 * copies <= 0.6 * total


def step_fn(fn, x: torch.Tensor, backward: bool):
    if backward:
        grad = torch.ones(1)

        def step():
            out = fn(x)
            out.backward(grad.expand_as(out))
    else:
        def step():
            with torch.no_grad():
                fn(x)
    return step


def time_methods(methods: dict, x: torch.Tensor, backward: bool, rounds: int, max_seconds: float) -> dict:
    """name -> {median_ms, min_ms} (None when the method fails), timed in interleaved rounds."""
    steps = {}
    for name, fn in methods.items():
        step = step_fn(fn, x, backward)
        try:
            step()  # e.g. an anchor without backward fails here
            steps[name] = step
        except (RuntimeError, NotImplementedError) as exc:
            print(f"    {name} skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
    if not steps:
        return {}
    calls = 1
    t0 = time.perf_counter()
    next(iter(steps.values()))()
    if time.perf_counter() - t0 < 2e-3:  # microsecond-scale calls: time a batch of them per sample
        calls = 20
        steps = {k: (lambda s=s: [s() for _ in range(calls)]) for k, s in steps.items()}
    timed = bench_interleaved(steps, "cpu", rounds=rounds, max_seconds=max_seconds)
    return {k: {"median_ms": v["median_ms"] / calls, "min_ms": v["min_ms"] / calls} for k, v in timed.items()}


def run(graphs, widths, reductions, threads, max_seconds, only=None, checkpoint=None, orders=("generated",),
        passes=("fwd", "fwd+bwd"), rounds=9, reorder_method="community-refined", fresh=False):
    rows = []
    for spec in graphs:
        loaded = {}
        for order in orders:
            got = load_graph(spec, order, reorder_method)
            if got is not None:
                loaded[order] = got
        if not loaded:
            print(f"{spec}: skipped (no ../shared/data and GNNFUSE_DATA unset)")
            continue
        rows += run_graph(spec, loaded, widths, reductions, threads, max_seconds, only, passes, rounds, fresh)
        if checkpoint:
            checkpoint(rows)  # partial results survive a crash or a time limit
    return rows


def run_graph(spec, loaded, widths, reductions, threads, max_seconds, only, passes, rounds, fresh=False):
    """Every order of one graph: the orders' methods are timed in the same interleaved rounds, so
    the order comparison is as fair as the anchor comparison."""
    rows, csrs = [], {}
    for order, (edge_index, n, reorder_s) in loaded.items():
        argsort_ms = bench(lambda: torch.argsort(edge_index[1]), warmup=1, repeat=5)["median_ms"]
        build_ms = bench(lambda: gnnfuse.CSR.from_edge_index(edge_index, n), warmup=1, repeat=5)["median_ms"]
        print(f"{spec} ({order}): {n} nodes, {edge_index.shape[1]} edges; CSR build {build_ms:.1f} ms, "
              f"argsort {argsort_ms:.1f} ms ({build_ms / argsort_ms:.2f}x)" +
              (f"; reorder {reorder_s:.2f} s" if reorder_s is not None else ""), flush=True)
        rows.append({"graph": spec, "order": order, "nodes": n, "edges": edge_index.shape[1],
                     "threads": torch.get_num_threads(), "kind": "csr-build", "gnnfuse_ms": build_ms,
                     "argsort_ms": argsort_ms, "build/argsort": build_ms / argsort_ms, "reorder_s": reorder_s})
        csrs[order] = gnnfuse.CSR.from_edge_index(edge_index, n)
        csrs[order].transpose_parts()
    n = next(iter(loaded.values()))[1]
    for F in widths:
        x = torch.randn(n, F)
        for reduce in reductions:
            torch._dynamo.reset()  # a fresh compile cache per configuration (no recompile limit)
            methods = {}
            for order, (edge_index, _, _) in loaded.items():
                for name, fn in make_methods(edge_index, csrs[order], reduce).items():
                    if not only or name in only:
                        methods[(order, name)] = fn
                if fresh:
                    methods[(order, "gnnfuse-fresh")] = fresh_output(methods[(order, "gnnfuse")])
            for nthreads in threads:
                torch.set_num_threads(nthreads)
                for pass_ in passes:
                    backward = pass_ == "fwd+bwd"
                    xin = x.requires_grad_(backward)
                    num_edges = next(iter(csrs.values())).num_edges
                    chosen = {k: fn for k, fn in methods.items()
                              if k[1] not in ("index_add", "compiled") or fits_in_memory(num_edges, F, reduce,
                                                                                         backward)}
                    timed = time_methods(chosen, xin, backward, rounds, max_seconds)
                    for order in loaded:
                        row = {"graph": spec, "order": order, "nodes": n, "edges": num_edges, "F": F,
                               "reduce": reduce, "pass": pass_, "threads": nthreads, "kind": "op"}
                        for (o, name) in methods:
                            if o != order:
                                continue
                            t = timed.get((o, name))
                            row[f"{name}_ms"] = t["median_ms"] if t else None
                            if t:
                                row[f"{name}_min_ms"] = t["min_ms"]
                                row[f"{name}_spread"] = t["median_ms"] / t["min_ms"] - 1
                        ours = row.get("gnnfuse_ms")
                        if ours:
                            row["gather_GBps"] = num_edges * F * x.element_size() / (row["gnnfuse_min_ms"] * 1e-3) / 1e9
                            if row.get("gnnfuse-fresh_ms") and row.get("sparse.mm_ms"):
                                row["fresh vs sparse.mm"] = row["sparse.mm_ms"] / row["gnnfuse-fresh_ms"]
                                row["best fresh vs sparse.mm"] = row["sparse.mm_min_ms"] / row["gnnfuse-fresh_min_ms"]
                            for name in ANCHORS:
                                if row.get(f"{name}_ms"):
                                    row[f"vs {name}"] = row[f"{name}_ms"] / ours
                                    row[f"best vs {name}"] = row[f"{name}_min_ms"] / row["gnnfuse_min_ms"]
                        print("  " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                               for k, v in row.items() if k not in ("nodes", "edges", "kind", "graph")),
                              flush=True)
                        rows.append(row)
            x.requires_grad_(False)
    return rows


def summarise(rows) -> str:
    ops = [r for r in rows if r["kind"] == "op"]
    lines = ["## Geometric-mean speed-up of gnnfuse (anchor time / gnnfuse time)", ""]
    for order, threads in dict.fromkeys((r.get("order", "generated"), r["threads"]) for r in ops):
        for reduce in sorted({r["reduce"] for r in ops}):
            for pass_ in ("fwd", "fwd+bwd"):
                sel = [r for r in ops if r["reduce"] == reduce and r["pass"] == pass_
                       and r.get("order", "generated") == order and r["threads"] == threads]
                parts = []
                for name in ANCHORS:
                    vals = [r[f"vs {name}"] for r in sel if r.get(f"vs {name}")]
                    best = [r[f"best vs {name}"] for r in sel if r.get(f"best vs {name}")]
                    if vals:
                        parts.append(f"{name} {geomean(vals):.2f}x by medians (min {min(vals):.2f}x), "
                                     f"{geomean(best):.2f}x by fastest rounds (min {min(best):.2f}x), {len(vals)} rows")
                fresh = [r["fresh vs sparse.mm"] for r in sel if r.get("fresh vs sparse.mm")]
                if fresh:
                    best = [r["best fresh vs sparse.mm"] for r in sel]
                    parts.append(f"gnnfuse-fresh vs sparse.mm {geomean(fresh):.2f}x by medians, {geomean(best):.2f}x "
                                 "by fastest rounds")
                if parts:
                    lines.append(f"- {order} order, {threads} thread(s), {reduce} {pass_}: " + "; ".join(parts))
    # what an order is worth: scrambled time / this order's time, ours and sparse.mm's
    by = {(r["graph"], r.get("order", "generated"), r["F"], r["reduce"], r["pass"], r["threads"]): r for r in ops}
    for (g, order, F, red, pass_, th), r in by.items():
        s = by.get((g, "scrambled", F, red, pass_, th))
        if order == "scrambled" or not s or not r.get("gnnfuse_ms"):
            continue
        anchor = (f", sparse.mm {s['sparse.mm_min_ms'] / r['sparse.mm_min_ms']:.2f}x"
                  if r.get("sparse.mm_min_ms") and s.get("sparse.mm_min_ms") else "")
        lines.append(f"- {g} F={F} {red} {pass_} {th}t: {order} vs scrambled ids (fastest rounds): gnnfuse "
                     f"{s['gnnfuse_min_ms'] / r['gnnfuse_min_ms']:.2f}x{anchor}")
    builds = [r for r in rows if r["kind"] == "csr-build"]
    if builds:
        lines.append("- CSR build / torch.argsort(targets): " +
                     ", ".join(f"{r['graph']} ({r['order']}) {r['build/argsort']:.2f}x" for r in builds))
        reorders = [r for r in builds if r.get("reorder_s") is not None]
        if reorders:
            lines.append("- gnnfuse.reorder time: " + ", ".join(f"{r['graph']} {r['reorder_s']:.2f} s" for r in reorders))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", default=",".join(DEFAULT_GRAPHS))
    parser.add_argument("--widths", default="32,128")
    parser.add_argument("--reductions", default="sum,max")
    parser.add_argument("--threads", default=str(torch.get_num_threads()), help="comma list, e.g. 1,2,4,8,16")
    parser.add_argument("--max-seconds", type=float, default=4.0, help="time budget per measurement")
    parser.add_argument("--methods", default=None, help="subset of gnnfuse," + ",".join(ANCHORS))
    parser.add_argument("--quick", action="store_true", help="small graphs only (a smoke run)")
    parser.add_argument("--out", default=None, help=f"directory (default {RESULTS_DIR})")
    parser.add_argument("--name", default=None, help="results file name (default cpu_<label>_<date>)")
    parser.add_argument("--orders", default="generated", help="comma list of generated, scrambled, reordered")
    parser.add_argument("--reorder", default="community-refined",
                        help="gnnfuse.reorder method of the reordered order (what auto picks on CPU)")
    parser.add_argument("--passes", default="fwd,fwd+bwd")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds per configuration")
    parser.add_argument("--fresh-output", action="store_true",
                        help="also time gnnfuse with the output-buffer reuse bypassed (gnnfuse-fresh)")
    args = parser.parse_args(argv)
    graphs = ["Cora", "rfc-uniform"] if args.quick else args.graphs.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    only = args.methods.split(",") if args.methods else None
    meta = machine("cpu")
    meta["threads measured"] = threads
    name = args.name or f"cpu_{device_label('cpu')}_{dt.date.today().isoformat()}"
    meta["reorder method"] = args.reorder
    columns = ["graph", "order", "F", "reduce", "pass", "threads", "gnnfuse_ms", "gnnfuse_min_ms", "gnnfuse_spread",
               "sparse.mm_ms", "sparse.mm_min_ms", "sparse.mm_spread", "index_add_ms", "compiled_ms", "vs sparse.mm",
               "best vs sparse.mm", "vs index_add", "vs compiled", "vs torch_scatter", "gather_GBps", "argsort_ms",
               "build/argsort", "reorder_s"]
    if args.fresh_output:
        columns[9:9] = ["gnnfuse-fresh_ms", "gnnfuse-fresh_min_ms", "best fresh vs sparse.mm"]

    def save(rows):
        meta["torch_scatter"] = "installed" if any("torch_scatter_ms" in r for r in rows) else "not installed"
        ordered = [r for r in rows if r["kind"] == "op"] + [r for r in rows if r["kind"] != "op"]
        notes = summarise(rows) + ("\n\nTimes: median ms of interleaved rounds; *_spread = median / fastest round - 1. "
                                   "gather_GBps = edges x F x itemsize / gnnfuse time. Empty index_add/compiled cells: "
                                   "not run, or their E x F tensors would not fit in RAM.")
        return save_results(name, meta, ordered, columns, Path(args.out) if args.out else None, notes=notes)

    rows = run(graphs, [int(f) for f in args.widths.split(",")], args.reductions.split(","), threads,
               args.max_seconds, only, checkpoint=save, orders=args.orders.split(","), passes=args.passes.split(","),
               rounds=args.rounds, reorder_method=args.reorder, fresh=args.fresh_output)
    md = save(rows)
    print(summarise(rows))
    print(f"wrote {md}")


if __name__ == "__main__":
    main()
