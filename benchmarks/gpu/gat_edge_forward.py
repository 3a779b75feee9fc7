"""GATConv's forward with edge terms against our sum gather-scatter, on CUDA: the op and the layer, for an
A/B of two code versions (run this file once per version, alternating processes, then ``--combine``).

Per case (graph, H x F, dropout), interleaved in rotating order over ``--rounds`` rounds, device time of
CUDA-graph replays (benchmarks/gpu/attention_forward.py's timer), medians; ``wall_us`` (one synchronised
call, host included) for the layer rows:
  * ``sum``: the node-feature sum of the same [N, H*F] width (what the goal compares with);
  * ``op.noedge``: gat_attention without edge terms (self loops, as the rows below);
  * ``op.perm``: gat_attention with alpha_edge [E, H] in edge_index order (the public op: it reorders the
    terms into CSR order on every call; attention_forward.py --edge-terms' GAT row);
  * ``op.csr``: the same terms already in CSR order (ops.attention._run(csr_edges=True), the layer's form
    for a constant edge_attr; versions without that entry skip it), ``op.csr.loop`` with the self loops'
    terms alpha_loop too (what GATConv passes), and ``op.csr.loop.<variant>`` with forward-loop knobs
    (attention_forward.py's variant names: a1 = AHEAD 1, m72 = MAXNREG 72, r8 = 8 rows; FORWARD_LOOP's
    entries for GAT without edge terms, which the edge-term kernels do not take);
  * ``layer``: gnnfuse.nn.GATConv(H*F, F, heads=H, edge_dim=--edge-dim) forward in training mode (grad
    enabled, the given dropout, PyG's default fill_value "mean"), x [N, H*F], a constant edge_attr;
    ``layer.egrad``: the edge_attr requires a gradient; ``layer.noedge``: the layer without edge_dim.

    PYTHONPATH=. python benchmarks/gpu/gat_edge_forward.py --warm 8 --compile-only   # compile first, in 8 processes
    PYTHONPATH=. python benchmarks/gpu/gat_edge_forward.py --tag new --out new1.json
    PYTHONPATH=. python benchmarks/gpu/gat_edge_forward.py --combine base1.json,new1.json,... --out FILE.md
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_forward import (DEVICE, _iqr, device_timer, rotating_rounds, shard_of,  # noqa: E402
                               warm_in_shards, with_variant)

# forward-loop knobs tried per head width F (--variants)
VARIANTS = {8: ("m64", "a1", "a1.m64"), 64: ("a1", "a1.m72", "a1.r8")}


def case_fns(h, a_src, a_dst, a_edge, a_loop, edge_index, dropout, heads, width, edge_dim, nodes, variants=VARIANTS):
    import gnnfuse
    import gnnfuse.nn as G
    from gnnfuse.ops import attention as ops

    kw = dict(negative_slope=0.2, dropout=dropout, seed=7, add_self_loops=True, backend="triton")
    flat = h.view(nodes, heads * width)
    fns = {"sum": lambda: gnnfuse.fused_gather_scatter(flat, edge_index, "sum", backend="triton"),
           "op.noedge": lambda: gnnfuse.gat_attention(h, a_src, a_dst, edge_index, **kw),
           "op.perm": lambda: gnnfuse.gat_attention(h, a_src, a_dst, edge_index, alpha_edge=a_edge, **kw)}
    if hasattr(ops, "_run"):
        from gnnfuse.csr import CSR
        perm = CSR.from_edge_index(edge_index, nodes).perm.long()
        e_csr = a_edge.index_select(0, perm)

        def csr(loop=None):
            return ops._run(h, a_src, a_dst, edge_index, e_csr, loop, 0.2, dropout, 7, True, "triton", csr_edges=True)
        fns["op.csr"] = csr
        fns["op.csr.loop"] = lambda: csr(a_loop)
        for v in variants.get(width, ()):
            fns[f"op.csr.loop.{v}"] = with_variant(v, lambda: csr(a_loop))
    torch.manual_seed(1)
    x = torch.randn(nodes, heads * width, device=DEVICE)
    conv = G.GATConv(heads * width, width, heads=heads, edge_dim=edge_dim, dropout=dropout).to(DEVICE).train()
    plain = G.GATConv(heads * width, width, heads=heads, dropout=dropout).to(DEVICE).train()
    ea = torch.randn(edge_index.shape[1], edge_dim, device=DEVICE)
    ea_grad = ea.clone().requires_grad_()
    fns["layer"] = lambda: conv(x, edge_index, ea)
    fns["layer.egrad"] = lambda: conv(x, edge_index, ea_grad)
    fns["layer.noedge"] = lambda: plain(x, edge_index)
    return fns


def run_case(gname, edge_index, nodes, heads, width, dropout, rounds, calls, edge_dim, compile_only, tag,
             variants=VARIANTS):
    torch.manual_seed(0)
    h = torch.randn(nodes, heads, width, device=DEVICE)
    a_src, a_dst, a_loop = (torch.randn(nodes, heads, device=DEVICE) for _ in range(3))
    a_edge = torch.randn(edge_index.shape[1], heads, device=DEVICE)
    fns = case_fns(h, a_src, a_dst, a_edge, a_loop, edge_index, dropout, heads, width, edge_dim, nodes, variants)
    outs = {name: fn() for name, fn in fns.items()}
    if compile_only:
        return []
    ref = outs["op.csr.loop"].float() if "op.csr.loop" in outs else None
    diffs = {n: float((o.float() - ref).abs().max()) for n, o in outs.items() if n.startswith("op.csr.loop.")}
    del outs
    timers = {name: device_timer(fn, calls) for name, fn in fns.items()}
    dev, wall = rotating_rounds(fns, timers, rounds, wall=lambda name: name.startswith("layer") or name == "sum")
    names = list(fns)
    s = statistics.median(dev["sum"])
    return [dict(tag=tag, graph=gname, HxF=f"{heads}x{width}", dropout=dropout, row=n,
                 device_us=statistics.median(dev[n]), device_iqr_us=_iqr(dev[n]), per_sum=statistics.median(dev[n]) / s,
                 wall_us=statistics.median(wall[n]) if wall[n] else None, max_diff=diffs.get(n)) for n in names]


def combine(files: list[str], out: str) -> None:
    """One table: per (graph, width, dropout, row), each tag's median over its processes of the per-process
    medians, the range over processes, and new / base."""
    rows = [r for f in files for r in json.load(open(f))["rows"]]
    meta = json.load(open(files[0]))["meta"]
    tags = list(dict.fromkeys(r["tag"] for r in rows))
    keys = list(dict.fromkeys((r["graph"], r["HxF"], r["dropout"], r["row"]) for r in rows))
    lines = [f"- {k}: {v}" for k, v in meta.items()] + [f"- processes: {', '.join(files)}", ""]
    head = ["graph", "HxF", "dropout", "row"]
    for t in tags:
        head += [f"{t}_us", f"{t}_range", f"{t}_per_sum", f"{t}_wall_us"]
    if len(tags) == 2:
        head += [f"{tags[1]}/{tags[0]}"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in keys:
        cells = [key[0], key[1], str(key[2]), key[3]]
        meds = {}
        for t in tags:
            got = [r for r in rows if r["tag"] == t and (r["graph"], r["HxF"], r["dropout"], r["row"]) == key]
            if not got:
                cells += ["", "", "", ""]
                continue
            d = [r["device_us"] for r in got]
            meds[t] = statistics.median(d)
            walls = [r["wall_us"] for r in got if r["wall_us"]]
            cells += [f"{meds[t]:.1f}", f"{min(d):.1f}-{max(d):.1f}",
                      f"{statistics.median(r['per_sum'] for r in got):.2f}",
                      f"{statistics.median(walls):.0f}" if walls else ""]
        if len(tags) == 2:
            cells.append(f"{meds[tags[1]] / meds[tags[0]]:.3f}" if len(meds) == 2 else "")
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        open(out, "w").write(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="arxiv-like,rfc-uniform")
    ap.add_argument("--widths", default="8x8,4x64")
    ap.add_argument("--dropouts", default="0,0.6")
    ap.add_argument("--edge-dim", type=int, default=16)
    ap.add_argument("--scale", type=float, default=1.0, help="graph scale (suite_graph)")
    ap.add_argument("--variants", default="", help="forward-loop knobs per width, e.g. '64:a1,a1.r8;8:' "
                    "(default: VARIANTS)")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--warm", type=int, default=0, help="compile every case first in this many processes")
    ap.add_argument("--compile-only", action="store_true", help="only the --warm processes' compiles, no timing")
    ap.add_argument("--shard", default="", help="(internal) i/n: compile only this share of the cases")
    ap.add_argument("--tag", default="new")
    ap.add_argument("--combine", default="", help="comma-separated JSON files of earlier runs: one table")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if args.combine:
        return combine(args.combine.split(","), args.out)
    from benchmarks.common import machine
    from gnnfuse.graphs import suite_graph

    parts = (part.split(":") for part in args.variants.split(";")) if args.variants else ()
    variants = {int(w): tuple(v for v in vs.split(",") if v) for w, vs in parts} if args.variants else VARIANTS
    cases = [(g, w, float(p)) for g in args.graphs.split(",") for w in args.widths.split(",")
             for p in args.dropouts.split(",")]
    if args.warm and not args.shard:
        warm_in_shards(__file__, argv or sys.argv[1:], args.warm)
        if args.compile_only:
            return
    graphs, rows = {}, []
    for gname, w, p in shard_of(cases, args.shard):
        if gname not in graphs:
            graphs[gname] = suite_graph(gname, scale=args.scale, device=DEVICE)
        ei, nodes = graphs[gname]
        heads, width = map(int, w.split("x"))
        t0 = time.time()
        got = run_case(gname, ei, nodes, heads, width, p, args.rounds, args.calls, args.edge_dim, bool(args.shard),
                       args.tag, variants)
        if not args.shard:
            print(f"{gname} {w} dropout {p}: {time.time() - t0:.1f} s", flush=True)
            for r in got:
                print("  " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()),
                      flush=True)
        rows += got
    if args.shard:
        return
    meta = {**machine(DEVICE), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "argv": " ".join(sys.argv[1:]), "edge_dim": args.edge_dim}
    if args.out:
        json.dump({"meta": meta, "rows": rows}, open(args.out, "w"))


if __name__ == "__main__":
    main()
