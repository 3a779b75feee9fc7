"""CPU suite of fused_gather_scatter against the anchors, all timed in one process.

    python -m benchmarks.bench_cpu [--quick] [--graphs arxiv-like,Facebook] [--widths 32,128]
                                   [--threads 1,2,4] [--out DIR]

For each graph, width F and reduction (sum, max): forward and forward+backward of
  gnnfuse        fused_gather_scatter on a prebuilt CSR (C++ kernels)
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
from pathlib import Path

import torch

import gnnfuse
from benchmarks.common import RESULTS_DIR, bench, device_label, geomean, machine, save_results
from benchmarks.graphs import real_edge_index, synthetic_edge_index

# products-like scaled to 1/8 so the anchors' E x F tensors fit in 24 GiB
DEFAULT_GRAPHS = ["Cora", "Facebook", "rfc-uniform", "arxiv-like", "products-like/8"]
ANCHORS = ["sparse.mm", "index_add", "compiled", "torch_scatter"]


def load_graph(spec: str) -> tuple[torch.Tensor, int] | None:
    name, _, divisor = spec.partition("/")
    if name in ("Cora", "CiteSeer", "Facebook"):
        return real_edge_index(name)
    return synthetic_edge_index(name, scale=1 / float(divisor) if divisor else 1.0)


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


def time_method(fn, x: torch.Tensor, backward: bool, max_seconds: float) -> float | None:
    if backward:
        grad = torch.ones(1)

        def step():
            out = fn(x)
            out.backward(grad.expand_as(out))
    else:
        def step():
            with torch.no_grad():
                fn(x)
    try:
        return bench(step, warmup=1, repeat=5, max_seconds=max_seconds)["median_ms"]
    except (RuntimeError, NotImplementedError) as exc:  # e.g. an anchor without backward
        print(f"    skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
        return None


def run(graphs, widths, reductions, threads, max_seconds, only=None, checkpoint=None):
    rows = []
    for spec in graphs:
        loaded = load_graph(spec)
        if loaded is None:
            print(f"{spec}: skipped (no ../shared/data and GNNFUSE_DATA unset)")
            continue
        edge_index, n = loaded
        argsort_ms = bench(lambda: torch.argsort(edge_index[1]), warmup=1, repeat=5)["median_ms"]
        build_ms = bench(lambda: gnnfuse.CSR.from_edge_index(edge_index, n), warmup=1, repeat=5)["median_ms"]
        print(f"{spec}: {n} nodes, {edge_index.shape[1]} edges; CSR build {build_ms:.1f} ms, "
              f"argsort {argsort_ms:.1f} ms ({build_ms / argsort_ms:.2f}x)")
        rows.append({"graph": spec, "nodes": n, "edges": edge_index.shape[1], "threads": torch.get_num_threads(),
                     "kind": "csr-build", "gnnfuse_ms": build_ms, "argsort_ms": argsort_ms,
                     "build/argsort": build_ms / argsort_ms})
        csr = gnnfuse.CSR.from_edge_index(edge_index, n)
        csr.transpose_parts()
        for F in widths:
            x = torch.randn(n, F)
            for reduce in reductions:
                torch._dynamo.reset()  # a fresh compile cache per configuration (no recompile limit)
                methods = make_methods(edge_index, csr, reduce)
                if only:
                    methods = {k: v for k, v in methods.items() if k in only}
                for nthreads in threads:
                    torch.set_num_threads(nthreads)
                    for backward in (False, True):
                        xin = x.requires_grad_(backward)
                        row = {"graph": spec, "nodes": n, "edges": edge_index.shape[1], "F": F, "reduce": reduce,
                               "pass": "fwd+bwd" if backward else "fwd", "threads": nthreads, "kind": "op"}
                        for name, fn in methods.items():
                            if name in ("index_add", "compiled") and not fits_in_memory(
                                    csr.num_edges, F, reduce, backward):
                                row[f"{name}_ms"] = None  # skipped: its E x F tensors would not fit
                                continue
                            row[f"{name}_ms"] = time_method(fn, xin, backward, max_seconds)
                        ours = row["gnnfuse_ms"]
                        for name in ANCHORS:
                            if row.get(f"{name}_ms"):
                                row[f"vs {name}"] = row[f"{name}_ms"] / ours
                        print("  " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                               for k, v in row.items() if k not in ("nodes", "edges", "kind")))
                        rows.append(row)
                x.requires_grad_(False)
        if checkpoint:
            checkpoint(rows)  # partial results survive a crash or a time limit
    return rows


def summarise(rows) -> str:
    ops = [r for r in rows if r["kind"] == "op"]
    lines = ["## Geometric-mean speed-up of gnnfuse (anchor time / gnnfuse time)", ""]
    for reduce in sorted({r["reduce"] for r in ops}):
        for pass_ in ("fwd", "fwd+bwd"):
            sel = [r for r in ops if r["reduce"] == reduce and r["pass"] == pass_]
            parts = []
            for name in ANCHORS:
                vals = [r[f"vs {name}"] for r in sel if r.get(f"vs {name}")]
                if vals:
                    parts.append(f"{name} {geomean(vals):.2f}x (min {min(vals):.2f}x)")
            lines.append(f"- {reduce} {pass_}: " + "; ".join(parts))
    builds = [r for r in rows if r["kind"] == "csr-build"]
    if builds:
        lines.append("- CSR build / torch.argsort(targets): " +
                     ", ".join(f"{r['graph']} {r['build/argsort']:.2f}x" for r in builds))
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
    args = parser.parse_args(argv)
    graphs = ["Cora", "rfc-uniform"] if args.quick else args.graphs.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    only = args.methods.split(",") if args.methods else None
    meta = machine("cpu")
    meta["threads measured"] = threads
    name = args.name or f"cpu_{device_label('cpu')}_{dt.date.today().isoformat()}"
    columns = ["graph", "F", "reduce", "pass", "threads", "gnnfuse_ms", "sparse.mm_ms", "index_add_ms",
               "compiled_ms", "vs sparse.mm", "vs index_add", "vs compiled", "vs torch_scatter", "argsort_ms",
               "build/argsort"]

    def save(rows):
        meta["torch_scatter"] = "installed" if any("torch_scatter_ms" in r for r in rows) else "not installed"
        ordered = [r for r in rows if r["kind"] == "op"] + [r for r in rows if r["kind"] != "op"]
        notes = summarise(rows) + "\n\nEmpty index_add/compiled cells: skipped, their E x F tensors would not fit in RAM."
        return save_results(name, meta, ordered, columns, Path(args.out) if args.out else None, notes=notes)

    rows = run(graphs, [int(f) for f in args.widths.split(",")], args.reductions.split(","), threads,
               args.max_seconds, only, checkpoint=save)
    md = save(rows)
    print(summarise(rows))
    print(f"wrote {md}")


if __name__ == "__main__":
    main()
