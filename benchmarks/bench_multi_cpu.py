"""CPU multi-aggregation (mean, min, max, std in one pass): this tree's kernels against another
build's, and the public op against the sum pass, every variant interleaved in one process.

    python -m benchmarks.bench_multi_cpu --before-so ~/.cache/gnnfuse/gnnfuse_aggregate_<hash>/<same>.so

Per graph (Cora, Facebook, the synthetic power-law graph; F=64):

* kernels alone (the C++ entry points taking reduction codes): the forward without and with the
  max/min winners (inference, training), the backward of x with a contiguous gradient and (this
  tree) with one row broadcast over the rows (the gradient of ``out.sum()``), each against the sum
  pass's kernel; ``--before-so`` adds another build of the aggregate extension (e.g. main's, from the
  build cache) called the same way;
* the public calls: ``fused_gather_scatter(x, csr, ["mean", "min", "max", "std"])`` against
  ``fused_gather_scatter(x, csr, "sum")``, forward and training step (gradient of x from ``.sum()``).

With one thread the clock is the thread's CPU time (other tenants of a shared machine barely move
it); with more, wall time. Median (and min) over rounds; each sample runs enough calls to last ~2 ms.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import statistics
import time

import torch

from benchmarks.common import cpu_real_and_power_law_graphs, device_label, machine, save_results

AGGRS = ["mean", "min", "max", "std"]


def load_module(path: str):
    name = os.path.basename(path).split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def interleaved(fns: dict, rounds: int, clock) -> dict:
    """{name: (median us, min us)}: round r runs each function's batch in a rotating order."""
    names = list(fns)
    batch = {}
    for n in names:  # warm-up, then calls per sample for ~2 ms
        fns[n]()
        t0 = clock()
        fns[n]()
        batch[n] = max(1, int(2e6 / max(clock() - t0, 1)))
    samples = {n: [] for n in names}
    for r in range(rounds):
        for k in range(len(names)):
            n = names[(r + k) % len(names)]
            t0 = clock()
            for _ in range(batch[n]):
                fns[n]()
            samples[n].append((clock() - t0) / batch[n] / 1e3)
    return {n: (statistics.median(v), min(v)) for n, v in samples.items()}


def graph_rows(name, csr, nodes, width, rounds, clock, before, backward_parts=False):
    import gnnfuse
    from gnnfuse._build import load_extension
    from gnnfuse.ops.multi_aggregate import _codes

    graph, aggregate = load_extension("graph"), load_extension("aggregate")
    codes = _codes(",".join(AGGRS))
    x = torch.randn(nodes, width)
    xg = x.clone().requires_grad_()
    rowptr, col = csr.rowptr, csr.col
    transpose = csr._transpose_parts()
    out, arg = aggregate.multi_aggregate_forward(x, rowptr, col, None, codes, True)
    grad = torch.randn_like(out)
    row = torch.randn(1, out.shape[1]).expand_as(out)
    s_out, _ = graph.gather_scatter_forward(x, rowptr, col, None, "sum", False)
    s_grad = torch.randn_like(s_out)
    no_arg = torch.empty(0, 0, dtype=rowptr.dtype)
    fns = {
        "fwd sum": lambda: graph.gather_scatter_forward(x, rowptr, col, None, "sum", False),
        "fwd multi": lambda: aggregate.multi_aggregate_forward(x, rowptr, col, None, codes, False),
        "fwd+winners multi": lambda: aggregate.multi_aggregate_forward(x, rowptr, col, None, codes, True),
        "bwd sum": lambda: graph.gather_scatter_backward(s_grad, x, rowptr, col, None, *transpose, no_arg, "sum", True,
                                                         False),
        "bwd multi": lambda: aggregate.multi_aggregate_backward_codes(grad, x, out, rowptr, col, None, *transpose, arg,
                                                                      codes, True, False),
        "bwd multi, broadcast grad": lambda: aggregate.multi_aggregate_backward_codes(
            row, x, out, rowptr, col, None, *transpose, arg, codes, True, False),
    }
    if before is not None:
        fns["fwd multi before"] = lambda: before.multi_aggregate_forward(x, rowptr, col, None, codes, False)
        fns["fwd+winners multi before"] = lambda: before.multi_aggregate_forward(x, rowptr, col, None, codes, True)
        before_bwd = getattr(before, "multi_aggregate_backward_codes", before.multi_aggregate_backward)
        fns["bwd multi before"] = lambda: before_bwd(grad, x, out, rowptr, col, None, *transpose, arg, codes, True,
                                                     False)
    if hasattr(aggregate, "output_writes_only") and width % 16 == 0 and rowptr.dtype == torch.int32:
        # the control: the forward's output stores alone, [N, F] (the sum's output) and [N, K*F]
        for label, k in (("fwd writes only [N,F]", 1), (f"fwd writes only [N,{len(codes)}F]", len(codes))):
            fns[label] = (lambda o: lambda: aggregate.output_writes_only(o, rowptr))(torch.empty(nodes, k * width))
    if backward_parts:  # each reduction's backward alone and in pairs (broadcast gradient, as "out.sum()")
        for names in (["mean"], ["min"], ["max"], ["std"], ["mean", "std"], ["min", "max"]):
            sub = _codes(",".join(names))
            o, a = aggregate.multi_aggregate_forward(x, rowptr, col, None, sub, True)
            g = torch.randn(1, o.shape[1]).expand_as(o)
            fns[f"bwd {'+'.join(names)}, broadcast grad"] = (
                lambda g, o, a, sub: lambda: aggregate.multi_aggregate_backward_codes(
                    g, x, o, rowptr, col, None, *transpose, a, sub, True, False))(g, o, a, sub)
    kernels = interleaved(fns, rounds, clock)
    public = interleaved({
        "sum": lambda: gnnfuse.fused_gather_scatter(x, csr, "sum"),
        "multi": lambda: gnnfuse.fused_gather_scatter(x, csr, AGGRS),
        "train sum": lambda: torch.autograd.grad(gnnfuse.fused_gather_scatter(xg, csr, "sum").sum(), xg),
        "train multi": lambda: torch.autograd.grad(gnnfuse.fused_gather_scatter(xg, csr, AGGRS).sum(), xg),
    }, rounds, clock)
    rows = []
    w1, wk = kernels.get("fwd writes only [N,F]"), kernels.get(f"fwd writes only [N,{len(codes)}F]")
    if w1 and wk:  # the sum pass plus what the wider output's stores cost beyond the sum's
        kernels["fwd floor: sum + (writes [N,KF] - writes [N,F])"] = tuple(
            kernels["fwd sum"][i] + wk[i] - w1[i] for i in range(2))
    for label, (median, best) in list(kernels.items()) + [(f"public {k}", v) for k, v in public.items()]:
        anchor = ("fwd sum" if label.startswith("fwd") else "bwd sum" if label.startswith("bwd") else
                  "public train sum" if "train" in label else "public sum")
        base = (kernels if anchor in kernels else {f"public {k}": v for k, v in public.items()})[anchor][0]
        rows.append({"graph": name, "F": width, "variant": label, "median_us": median, "min_us": best,
                     "x anchor": median / base, "anchor": anchor})
        print(rows[-1], flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before-so", default=None, help="another build of the aggregate extension (.so)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--graphs", default=None, help="comma-separated names (default: all)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--suffix", default="")
    parser.add_argument("--backward-parts", action="store_true",
                        help="also each reduction's backward alone and mean+std, min+max (broadcast gradient)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import gnnfuse

    clock = time.thread_time_ns if args.threads == 1 else time.perf_counter_ns
    before = load_module(args.before_so) if args.before_so else None
    graphs = cpu_real_and_power_law_graphs("synthetic power-law 60k/1.2M")
    wanted = args.graphs.split(",") if args.graphs else list(graphs)
    load_start = os.getloadavg()
    gc.disable()
    rows = []
    for name, (edge_index, nodes) in graphs.items():
        if name in wanted:
            csr = gnnfuse.CSR.from_edge_index(edge_index, num_nodes=nodes)
            rows += graph_rows(name, csr, nodes, args.width, args.rounds, clock, before, args.backward_parts)
    gc.enable()
    meta = dict(machine("cpu"), clock="thread CPU time" if args.threads == 1 else "wall",
                load_average_at_start=load_start, load_average_at_end=os.getloadavg(),
                before_so=os.path.basename(args.before_so) if args.before_so else None)
    md = save_results(f"aggregation-multi-before-after_{device_label('cpu')}{args.suffix}", meta, rows,
                      ["graph", "F", "variant", "median_us", "min_us", "x anchor", "anchor"], args.out)
    print(md.read_text())


if __name__ == "__main__":
    main()
