"""Where the CPU epoch of bench_e2e_real goes beyond its dense-only bound: each aggregation call alone.

    python -m benchmarks.bench_e2e_breakdown [--models GCN,SAGE-mean,SAGE-max] [--rounds 20] [--threads 1]

For one model on Facebook (bench_e2e_real's configuration), the aggregation calls of one epoch are
recorded (their inputs copied), then timed in interleaved rounds with the whole epoch and the
dense-only epoch: each call through the public path (fused_gather_scatter: checks, cached CSR and
weights, the autograd node), its C++ forward kernel alone, the public forward + backward, and the
C++ backward kernel alone. A call whose input needs no gradient is the first layer's aggregation of
the raw features, which the layers keep from the second epoch (gnnfuse.nn._mixin.constant_result):
its row says "kept" and is timed as the lookup the epoch then pays. Timed by thread CPU time with
one thread (a loaded machine's time slicing does not inflate it), or wall time with --threads 2.
Calls alone run on warmer caches than inside the epoch: the sum of the rows is a guide, the epoch
minus dense only is the fact.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from unittest import mock

import torch

from benchmarks.bench_e2e_real import HIDDEN, MODELS, Net, load, make_epoch
from benchmarks.common import device_label, machine, save_results


def record_calls(model, x, ei, y):
    """(x_src, graph, reduce, kwargs) of every aggregation one epoch makes, with copied inputs."""
    from gnnfuse.nn import _mixin

    calls, real = [], _mixin.fused_gather_scatter

    def spy(x_src, graph, reduce, **kw):
        calls.append((x_src.detach().clone().requires_grad_(x_src.requires_grad), graph, reduce, kw))
        return real(x_src, graph, reduce, **kw)

    with mock.patch.dict(os.environ, {"GNNFUSE_CACHE_CONSTANT_AGGREGATION": "0"}), \
            mock.patch.object(_mixin, "fused_gather_scatter", spy):
        make_epoch(model, x, ei, y)()
    return calls


def call_timers(k, x_src, graph, reduce, kw):
    """name -> fn for one recorded call (see the module docstring)."""
    from gnnfuse._build import load_extension
    from gnnfuse.csr import csr_for_edge_index
    from gnnfuse.nn._mixin import constant_result, graph_tensors
    from gnnfuse.ops import gather_scatter as gs

    ext = load_extension("graph")
    csr = csr_for_edge_index(graph, x_src.shape[0], kw["num_nodes"])
    w = kw.get("edge_weight")
    weight = None if w is None else gs._weight_in_csr_order(w, csr, x_src.dtype)
    parts = csr._transpose_parts()
    xd = x_src.detach()
    tag = f"layer {k + 1} {reduce} F={x_src.shape[1]}"
    if not x_src.requires_grad:
        sources = (x_src, *graph_tensors(graph)) + (() if w is None else (w,))

        def kept():
            return constant_result("breakdown", sources, (),
                                   lambda: gs.fused_gather_scatter(x_src, graph, reduce, **kw))

        return {f"{tag} kept (constant input)": kept,
                f"{tag} its forward kernel, were it run": lambda: ext.gather_scatter(xd, csr.rowptr, csr.col, weight,
                                                                                    None, None, None, reduce)}
    out = gs.fused_gather_scatter(x_src, graph, reduce, **kw)
    grad_out = torch.randn_like(out)
    arg = ext.gather_scatter(xd, csr.rowptr, csr.col, weight, *parts, reduce)[1]
    gs._weight_in_transpose_order(weight, parts[2])  # (the first backward with a weight looks it up)
    t_weight = gs._weight_in_transpose_order(weight, parts[2]) if reduce in ("sum", "mean") else None
    return {
        f"{tag} public forward": lambda: gs.fused_gather_scatter(x_src, graph, reduce, **kw),
        f"{tag} forward kernel": lambda: ext.gather_scatter(xd, csr.rowptr, csr.col, weight, *parts, reduce),
        f"{tag} public forward + backward": lambda: gs.fused_gather_scatter(x_src, graph, reduce, **kw).backward(
            grad_out),
        f"{tag} backward kernel": lambda: ext.gather_scatter_backward(grad_out, xd, csr.rowptr, csr.col, weight, *parts,
                                                                      arg, reduce, True, False, t_weight),
    }


def run_model(name, x, ei, y, rounds, wall):
    import gnnfuse.nn as G

    conv, kw = MODELS[name]
    torch.manual_seed(0)
    model = Net(getattr(G, conv), x.shape[1], HIDDEN, int(y.max()) + 1, **kw)
    fns = {"epoch": make_epoch(model, x, ei, y), "dense only epoch": make_epoch(model, x, ei, y, dense_only=True)}
    for k, call in enumerate(record_calls(model, x, ei, y)):
        fns.update(call_timers(k, *call))
    clock = time.perf_counter if wall else time.thread_time
    samples = {k: [] for k in fns}
    for fn in fns.values():
        fn(), fn()
    for _ in range(rounds):
        for key, fn in fns.items():
            t0 = clock()
            fn()
            samples[key].append((clock() - t0) * 1e3)
    load = round(os.getloadavg()[0], 1)
    return [dict(model=name, part=key, median_ms=statistics.median(v), min_ms=min(v), load_1min=load)
            for key, v in samples.items()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="1: thread CPU time; more: wall time")
    ap.add_argument("--out", default=None)
    ap.add_argument("--name", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = load("Facebook")
    if data is None:
        print("SKIP Facebook: not found (needs ../shared/data or $GNNFUSE_DATA)")
        return
    rows = []
    for name in args.models.split(","):
        rows += run_model(name, *data, args.rounds, args.threads > 1)
        for r in rows[-8:]:
            print(f"  {r['model']:9s} {r['part']:48s} {r['median_ms']:7.3f} ms (min {r['min_ms']:.3f})", flush=True)
    meta = dict(machine("cpu"), benchmark="bench_e2e_breakdown", device=device_label("cpu"), dataset="Facebook",
                threads=args.threads, load_average_1min=round(os.getloadavg()[0], 2),
                clock="thread CPU time" if args.threads == 1 else "wall")
    md = save_results(args.name or f"e2e-breakdown_{device_label('cpu')}", meta, rows,
                      ["model", "part", "median_ms", "min_ms", "load_1min"], args.out,
                      notes=__doc__.split("\n\n", 2)[2])
    print(md)


if __name__ == "__main__":
    main()
