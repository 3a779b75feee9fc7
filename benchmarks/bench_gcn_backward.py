"""GCN's weighted backward on CPU, kernel alone: edge weights looked up through t_pos (before) against
the weights laid out in transpose order once and cached (after), timed in interleaved rounds.

    python -m benchmarks.bench_gcn_backward [--graphs Facebook,community-arxiv] [--widths 16,64,128]
                                            [--threads 2] [--orders generated] [--rounds 51] [--cpu-time]
                                            [--out DIR]

The x-gradient of a weighted sum, grad_x[j] = sum over the edges e leaving j of w[e] * grad_out[target(e)],
walks the transpose: each edge's weight sits at its CSR position, t_pos[q], a dependent random read
per edge (before); GCNConv's normalisation is constant, so the op layer caches weight[t_pos] and the
kernel reads it in order (after). Variants, each the C++ backward kernel alone (pybind, no autograd):
  lookup     the weights looked up through t_pos (the code before the cache; t_weight=None)
  cached     the weights already in transpose order (what a training run gets from its second epoch)
  permuted   w.index_select(0, t_pos) on every call, then the kernel: the per-call alternative
Outputs of the three are checked bitwise equal. Columns: median and fastest round (ms); speed-ups
lookup / cached of the medians and of the fastest rounds; the machine's 1-minute load average while
each configuration ran. On a loaded machine a 2-thread wall time waits whenever one of the threads is
descheduled (whole scheduler slices of milliseconds): read the fastest rounds there, or use
``--cpu-time`` (one thread, timed by the thread's CPU time, which time-slicing does not inflate).
"""
from __future__ import annotations

import argparse
import os

import torch

from benchmarks.bench_e2e_real import cpu_time_interleaved
from benchmarks.common import bench_interleaved, device_label, machine, save_results
from benchmarks.graphs import real_edge_index, scramble, suite_graph
from gnnfuse._build import load_extension
from gnnfuse.csr import CSR


def load(spec: str, order: str) -> tuple[torch.Tensor, int] | None:
    """(edge_index, num_nodes) of a real graph or a suite graph, as generated or with scrambled ids."""
    if spec in ("Cora", "CiteSeer", "Facebook"):
        found = real_edge_index(spec)
        if found is None:
            return None
        ei, n = found
        return (ei, n) if order == "generated" else (scramble(ei, n, seed=1)[0], n)
    return suite_graph(spec, order=order)


def run_graph(name: str, order: str, widths: list[int], rounds: int, max_seconds: float,
              cpu_time: bool = False) -> list[dict]:
    loaded = load(name, order)
    if loaded is None:
        print(f"SKIP {name}: not found (needs ../shared/data or $GNNFUSE_DATA)")
        return []
    edge_index, n = loaded
    csr = CSR.from_edge_index(edge_index, n)
    t_rowptr, t_col, t_pos = csr.transpose_parts()
    backward = load_extension("graph").gather_scatter_backward
    g = torch.Generator().manual_seed(0)
    w = torch.rand(csr.num_edges, generator=g) + 0.1
    w_t = w.index_select(0, t_pos)
    arg = csr.rowptr.new_empty(0, 0)
    rows = []
    for F in widths:
        x = torch.randn(n, F, generator=g)
        go = torch.randn(csr.num_dst, F, generator=g)

        def call(tw, go=go, x=x):
            return backward(go, x, csr.rowptr, csr.col, w, t_rowptr, t_col, t_pos, arg, "sum", True, False, tw)[0]

        fns = {"lookup": lambda: call(None), "cached": lambda: call(w_t),
               "permuted": lambda: call(w.index_select(0, t_pos))}
        outs = [fn() for fn in fns.values()]
        assert all(torch.equal(o, outs[0]) for o in outs[1:]), "results differ"
        load0 = os.getloadavg()[0]
        t = (cpu_time_interleaved(fns, rounds) if cpu_time
             else bench_interleaved(fns, "cpu", rounds=rounds, max_seconds=max_seconds))
        load1 = os.getloadavg()[0]
        row = dict(graph=name, order=order, nodes=n, edges=csr.num_edges, F=F, threads=torch.get_num_threads(),
                   lookup_ms=t["lookup"]["median_ms"], lookup_min_ms=t["lookup"]["min_ms"],
                   cached_ms=t["cached"]["median_ms"], cached_min_ms=t["cached"]["min_ms"],
                   permuted_ms=t["permuted"]["median_ms"], permuted_min_ms=t["permuted"]["min_ms"],
                   speedup_median=t["lookup"]["median_ms"] / t["cached"]["median_ms"],
                   speedup_fastest=t["lookup"]["min_ms"] / t["cached"]["min_ms"],
                   load_1min=f"{load0:.1f}-{load1:.1f}")
        print("  " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
              flush=True)
        rows.append(row)
    return rows


COLUMNS = ["graph", "order", "nodes", "edges", "F", "threads", "lookup_ms", "lookup_min_ms", "cached_ms",
           "cached_min_ms", "permuted_ms", "permuted_min_ms", "speedup_median", "speedup_fastest", "load_1min"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", default="Facebook,community-arxiv")
    ap.add_argument("--widths", default="16,64,128")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--orders", default="generated", help="comma list of generated, scrambled")
    ap.add_argument("--rounds", type=int, default=51)
    ap.add_argument("--cpu-time", action="store_true", help="one thread, timed by thread CPU time (loaded machines)")
    ap.add_argument("--max-seconds", type=float, default=20.0, help="time budget per configuration")
    ap.add_argument("--out", default=None, help="directory (default benchmarks/results)")
    ap.add_argument("--name", default=None, help="results file name (default gcn-backward_<device>)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1 if args.cpu_time else args.threads)
    widths = [int(f) for f in args.widths.split(",")]
    rows = []
    for order in args.orders.split(","):
        for name in args.graphs.split(","):
            rows += run_graph(name, order, widths, args.rounds, args.max_seconds, args.cpu_time)
    meta = dict(machine("cpu"), benchmark="bench_gcn_backward", device=device_label("cpu"),
                load_average_1min=round(os.getloadavg()[0], 2),
                clock="thread CPU time, 1 thread" if args.cpu_time else "wall, interleaved")
    md = save_results(args.name or f"gcn-backward_{device_label('cpu')}", meta, rows, COLUMNS, args.out,
                      notes=__doc__.split("\n\n", 2)[2])
    print(md.read_text())


if __name__ == "__main__":
    main()
