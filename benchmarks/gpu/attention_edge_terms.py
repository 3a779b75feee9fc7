"""GATv2's and the dot product's forwards with [E, H, F] edge features against our sum gather-scatter and
against a floor that streams the edge tensor, on CUDA (issue goal: forward <= 2x the sum).

Per case (graph, H x F, layer), interleaved in rotating order over ``--rounds`` rounds, device time of
CUDA-graph replays (benchmarks/gpu/attention_forward.py's timer), medians:
  * ``sum``: the node-feature sum of the same [N, H*F] width (what the goal compares with);
  * ``read``: a torch read of the edge tensor (``edge.sum()``: E*H*F values once, the bytes the
    attention must stream on top of the sum's), and ``sum+read`` both in one replay (the floor used
    in ``per_floor``);
  * ``noedge``: the same attention without edge features;
  * ``before`` (GATv2, self loops): the previous op's work: zero rows appended for the self loops
    (``torch.cat``) and the kernel reading E + N rows;
  * ``perm``: the op now (edge features [E, H, F] in edge_index order, read through the CSR's perm;
    the self loops read none);
  * ``csr``: the same features already in CSR order (ops.pair_attention._run(csr_edges=True), the
    layers' form when they reorder the raw edge_attr: row k for CSR position k);
  * ``perm.a1`` / ``csr.a1``: the loop issuing step t + 1's loads before step t's maths (FORWARD_LOOP's
    AHEAD 1, which the edge-term kernels do not take by default);
  * ``reorder16``: the layers' reorder of a raw [E, 16] edge_attr into CSR order (ops._edge_order
    .in_csr_order), paid per call only for an edge_attr that needs a gradient (a constant one is cached).
GATv2 runs with self loops (edge features [E, H, F]: the loops get no edge term), the dot product without
(TransformerConv's). ``max_diff``: against ``perm``.

    PYTHONPATH=. python benchmarks/gpu/attention_edge_terms.py --graphs arxiv-like,rfc-uniform \\
        --widths 8x8,4x64 --layers gatv2,dot --rounds 11 --warm 8 --out FILE.md
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_forward import (DEVICE, _iqr, device_timer, emit, rotating_rounds, shard_of,  # noqa: E402
                               warm_in_shards, with_variant)


def case_fns(layer, h, att, edge_index, perm, edge, raw):
    import gnnfuse
    from gnnfuse.ops import pair_attention as ops
    from gnnfuse.ops._edge_order import in_csr_order

    loops = layer == "gatv2"
    kw = dict(backend="triton", add_self_loops=loops)
    flat = h.view(h.shape[0], -1)
    E = edge.shape[0]
    edge_csr = edge.index_select(0, perm.long())
    F = h.shape[2]

    def attn(e=None):
        if layer == "gatv2":
            return gnnfuse.gatv2_attention(h, h, att, edge_index, edge_attr=e, **kw)
        return gnnfuse.dot_attention(h, h, h, edge_index, edge_attr=e, **kw)

    def csr():
        return ops._run(h, h, h, att if loops else None, edge_csr, edge_index, loops, 0.2, 1.0 if loops else F ** -0.5,
                        0.0, None, loops, "triton", csr_edges=True)

    fns = {"sum": lambda: gnnfuse.fused_gather_scatter(flat, edge_index, "sum", backend="triton"),
           "read": lambda: edge.sum(),
           "sum+read": lambda: (gnnfuse.fused_gather_scatter(flat, edge_index, "sum", backend="triton"), edge.sum()),
           "noedge": lambda: attn()}
    if loops:
        zeros = edge.new_zeros(h.shape[0], *edge.shape[1:])
        fns["before"] = lambda: attn(torch.cat([edge, zeros]))
    fns.update({"perm": lambda: attn(edge), "csr": csr, "perm.a1": with_variant("a1", lambda: attn(edge)),
                "csr.a1": with_variant("a1", csr), "reorder16": lambda: in_csr_order(raw, perm)})
    assert E == edge_index.shape[1]
    return fns


def run_case(gname, edge_index, nodes, heads, width, layer, rounds, calls, compile_only):
    from gnnfuse.csr import CSR

    torch.manual_seed(0)
    h = torch.randn(nodes, heads, width, device=DEVICE)
    att = torch.randn(heads, width, device=DEVICE)
    E = edge_index.shape[1]
    edge = torch.randn(E, heads, width, device=DEVICE)
    raw = torch.randn(E, 16, device=DEVICE)
    perm = CSR.from_edge_index(edge_index, nodes).perm
    fns = case_fns(layer, h, att, edge_index, perm, edge, raw)
    with torch.no_grad():
        outs = {name: fn() for name, fn in fns.items()}
        if compile_only:
            return []
        ref = outs["perm"].float()
        diffs = {n: float((outs[n].float() - ref).abs().max()) for n in ("before", "perm", "csr", "perm.a1", "csr.a1")
                 if n in outs}
        timers = {name: device_timer(fn, calls) for name, fn in fns.items()}
        dev, _ = rotating_rounds(fns, timers, rounds, wall=lambda name: False)
        names = list(fns)
    med = {n: statistics.median(dev[n]) for n in names}
    return [dict(graph=gname, HxF=f"{heads}x{width}", layer=layer, variant=n, device_us=med[n],
                 device_iqr_us=_iqr(dev[n]), per_sum=med[n] / med["sum"], per_floor=med[n] / med["sum+read"],
                 max_diff=diffs.get(n, "")) for n in names]


def _fmt(v):
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="arxiv-like,rfc-uniform")
    ap.add_argument("--widths", default="8x8,4x64")
    ap.add_argument("--layers", default="gatv2,dot")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--warm", type=int, default=0, help="compile every case first in this many processes")
    ap.add_argument("--shard", default="", help="(internal) i/n: compile only this share of the cases")
    ap.add_argument("--scale", type=float, default=1.0, help="graph scale (suite_graph)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    from gnnfuse.graphs import suite_graph

    cases = [(g, w, l) for g in args.graphs.split(",") for w in args.widths.split(",") for l in args.layers.split(",")]
    if args.warm and not args.shard:
        warm_in_shards(__file__, argv or sys.argv[1:], args.warm)
    graphs = {}
    rows = []
    for gname, w, layer in shard_of(cases, args.shard):
        if gname not in graphs:
            graphs[gname] = suite_graph(gname, scale=args.scale, device=DEVICE)
        ei, nodes = graphs[gname]
        heads, width = map(int, w.split("x"))
        got = run_case(gname, ei, nodes, heads, width, layer, args.rounds, args.calls, bool(args.shard))
        for r in got:
            print(" ".join(f"{k}={_fmt(v)}" for k, v in r.items()), flush=True)
        rows += got
    if args.shard:
        return
    keys = list(rows[0]) if rows else []
    lines = [f"- torch {torch.__version__}; device {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu'}; "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; argv: {' '.join(sys.argv[1:])}", "",
             "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_fmt(r[k]) for k in keys) + " |" for r in rows]
    emit(lines, args.out)


if __name__ == "__main__":
    main()
