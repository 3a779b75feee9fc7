"""Kernel bench of the fused attention forwards (GAT, GATv2, dot product) against our sum
gather-scatter of the same [N, H*F] features (issue goal: forward <= 2x the sum), on CUDA.

Per call, for every variant, interleaved in rotating order over ``--rounds`` rounds (medians):
  * ``device_us``: device time, from replays of a CUDA graph of ``--calls`` back-to-back calls timed
    with CUDA events (no host time in it: what the kernels cost);
  * ``wall_us``: one call, synchronised before and after (host and launch included: what
    benchmarks/bench_attention.py's ``fwd/sum`` measures).
Variants: ``default`` (the shipped forward) and one-pass tiles written ``hb8.r16.w8.s1024.g64.a1.m72.sp2``
(heads per program, rows/lanes per program, warps, longest piece, longest row in row groups, the
loop's load order and register cap: attention_forward_kernels.FORWARD_LOOP's AHEAD and MAXNREG, m0 no
cap, and the pair loop's SPLIT, sp1 the 3D loop (pair_forward_split.py); any subset, the rest as the default,
FORWARD_LOOP's entry for the path, chooses; ``a0.m0`` is the
loop and registers of the forward before either knob). Each variant's output is compared with the first
one's (``max_diff``) and with its own output on a second call (``rerun_same``: the same bits). The
features are random; GATv2 and dot use the same tensor for keys and values (as bench_attention's fused
forward). ``--dropout P`` runs the forwards with attention dropout (a fixed seed:
the training path) and ``--dtype`` times every forward and the sum in float16 / bfloat16 (float32
accumulation); FORWARD_LOOP has entries per path (float32 or half, with or without dropout).
``--edge-terms`` passes projected edge terms as the layers with ``edge_dim`` do (their kernels keep the
plain loop); the sum stays the node-feature sum of the same width.

    PYTHONPATH=. python benchmarks/gpu/attention_forward.py --graphs arxiv-like,rfc-uniform \\
        --widths 8x8,4x64 --layers gat,gatv2,dot --variants default,hb4,hb2.r8 --out FILE.md
    PYTHONPATH=. python benchmarks/gpu/attention_forward.py --warm 8 ...   # compile in 8 processes first
    PYTHONPATH=. python benchmarks/gpu/attention_forward.py --warm 8 --compile-only ...   # only that
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time

import torch

KEYS = {"hb": "hb", "sp": "split", "r": "rows", "w": "warps", "s": "seg", "g": "short_max", "a": "ahead",
        "m": "maxnreg"}


def parse_variant(name: str) -> dict | None:
    """The one-pass config overrides of a variant name (None: the default)."""
    if name == "default":
        return None
    return {KEYS[k]: int(v) for k, v in re.findall(r"(hb|sp|r|w|s|g|a|m)(\d+)", name)}


def with_variant(name: str, fn):
    """``fn`` run with variant ``name``'s forward (the plan config patched for the call)."""
    from gnnfuse.triton import attention as A

    over = parse_variant(name)
    default_cfg = A._one_pass_config

    def run():
        if over:
            A._one_pass_config = lambda *a, **k: _config(default_cfg(*a, **k), over, a[1])
        try:
            return fn()
        finally:
            A._one_pass_config = default_cfg
    return run


def _config(cfg: dict, over: dict, F: int) -> dict:
    """The default config with a variant's overrides; rows follow a forced hb by the default's rule
    unless forced too."""
    from gnnfuse.triton import attention as A
    from gnnfuse.triton._grid import next_power_of_2

    cfg = {**cfg, **over}
    if "hb" in over and "rows" not in over:
        cfg["rows"] = A._one_pass_rows(cfg["hb"], next_power_of_2(F))
    cfg["short_max"] = min(cfg["short_max"], cfg["seg"])
    return cfg


def calls(layer: str, h, a_src, a_dst, att, edge_index, dropout: float = 0.0, edge_terms: bool = False):
    """The forward of ``layer`` on projected features; ``edge_terms``: with projected edge terms in
    edge_index order, as the layers with edge_dim pass them (GAT's [E, H] logit terms, GATv2's and the
    dot product's [E, H, F] features; the self loops get none)."""
    import gnnfuse

    kw = dict(dropout=dropout, seed=7, backend="triton")
    E, (heads, width) = edge_index.shape[1], h.shape[1:]
    if layer == "gat":
        a_edge = torch.randn(E, heads, device=h.device, dtype=h.dtype) if edge_terms else None
        return lambda: gnnfuse.gat_attention(h, a_src, a_dst, edge_index, alpha_edge=a_edge, add_self_loops=True, **kw)
    edge = torch.randn(E, heads, width, device=h.device, dtype=h.dtype) if edge_terms else None
    if layer == "gatv2":
        return lambda: gnnfuse.gatv2_attention(h, h, att, edge_index, edge_attr=edge, add_self_loops=True, **kw)
    return lambda: gnnfuse.dot_attention(h, h, h, edge_index, edge_attr=edge, **kw)


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # (cpu: a smoke run in the interpreter, wall times)


def device_timer(fn, calls_per_graph: int):
    """A function returning the device time (us) of one call: replay of a CUDA graph of several calls,
    timed with events (falls back to events around eager calls if the capture fails)."""
    if DEVICE == "cpu":
        return lambda: wall_us(fn)
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            for _ in range(calls_per_graph):
                fn()
        replay = graph.replay
    except Exception as exc:  # noqa: BLE001  (an op that cannot be captured: eager calls)
        print(f"  (no CUDA graph: {type(exc).__name__}: {exc}; eager calls)", flush=True)

        def replay():
            for _ in range(calls_per_graph):
                fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed():
        torch.cuda.synchronize()
        start.record()
        replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / calls_per_graph
    return timed


def wall_us(fn):
    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t0) * 1e6


def warm_in_shards(script: str, argv: list[str], warm: int) -> None:
    """Compile every case first in ``warm`` processes: ``script`` again with ``argv`` and ``--shard i/warm``,
    each compiling its share of the cases (:func:`shard_of`) and timing nothing, so that the timed process
    finds Triton's cache warm."""
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, script, *argv, "--shard", f"{i}/{warm}"]) for i in range(warm)]
    print(f"warm-up: {[p.wait() for p in procs]} in {time.time() - t0:.0f} s", flush=True)


def shard_of(cases: list, shard: str) -> list:
    """The cases a ``--shard i/n`` process compiles (every case without ``shard``)."""
    if not shard:
        return cases
    i, n = map(int, shard.split("/"))
    return cases[i::n]


def rotating_rounds(fns: dict, timers: dict, rounds: int, wall=lambda name: True) -> tuple[dict, dict]:
    """Device samples of every timer, ``rounds`` rounds in rotating order (round r starts at name r), and a
    synchronised wall sample of the names ``wall`` picks: ({name: [device us]}, {name: [wall us]})."""
    dev = {name: [] for name in fns}
    walls = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            dev[name].append(timers[name]())
            if wall(name):
                walls[name].append(wall_us(fns[name]))
    return dev, walls


def run_case(graph_name, edge_index, nodes, heads, width, layer, variants, rounds, calls_per_graph, compile_only,
             dropout=0.0, dtype=torch.float32, edge_terms=False):
    import gnnfuse

    torch.manual_seed(0)
    h = torch.randn(nodes, heads, width, device=DEVICE, dtype=dtype)
    a_src, a_dst = (torch.randn(nodes, heads, device=DEVICE, dtype=dtype) for _ in range(2))
    att = torch.randn(heads, width, device=DEVICE, dtype=dtype)
    flat = h.view(nodes, heads * width)
    base = calls(layer, h, a_src, a_dst, att, edge_index, dropout, edge_terms)
    fns = {"sum": lambda: gnnfuse.fused_gather_scatter(flat, edge_index, "sum", backend="triton")}
    fns.update({v: with_variant(v, base) for v in variants})
    with torch.no_grad():
        outs = {name: fn() for name, fn in fns.items()}
        if compile_only:
            return []
        first = outs[variants[0]]
        diffs = {v: float((outs[v].float() - first.float()).abs().max()) for v in variants}
        rerun = {v: torch.equal(fns[v](), outs[v]) for v in variants}  # the same bits on a second call
        timers = {name: device_timer(fn, calls_per_graph) for name, fn in fns.items()}
        dev, wall = rotating_rounds(fns, timers, rounds)
        names = list(fns)
    med = {name: (statistics.median(dev[name]), statistics.median(wall[name])) for name in names}
    rows = []
    for name in names:
        d, w = med[name]
        rows.append(dict(graph=graph_name, HxF=f"{heads}x{width}", layer=layer if name != "sum" else "sum",
                         variant=name, device_us=d, device_iqr_us=_iqr(dev[name]), wall_us=w,
                         device_per_sum=d / med["sum"][0], wall_per_sum=w / med["sum"][1],
                         max_diff=diffs.get(name, ""), rerun_same=rerun.get(name, "")))
    return rows


def _iqr(samples):
    if len(samples) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return q3 - q1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="arxiv-like,rfc-uniform")
    ap.add_argument("--widths", default="8x8,4x64")
    ap.add_argument("--layers", default="gat,gatv2,dot")
    ap.add_argument("--variants", default="default")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=10, help="calls per CUDA graph replay")
    ap.add_argument("--warm", type=int, default=0, help="compile every case first in this many processes")
    ap.add_argument("--compile-only", action="store_true", help="only the --warm processes' compiles, no timing")
    ap.add_argument("--shard", default="", help="(internal) i/n: compile only this share of the cases")
    ap.add_argument("--scale", type=float, default=1.0, help="graph scale (suite_graph)")
    ap.add_argument("--dropout", type=float, default=0.0, help="attention dropout of the forwards (fixed seed)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                    help="the features' (and the sum's) dtype")
    ap.add_argument("--edge-terms", action="store_true",
                    help="with projected edge terms (GAT [E, H], GATv2 / dot [E, H, F]; see calls)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    from benchmarks.common import machine
    from gnnfuse.graphs import suite_graph

    variants = args.variants.split(",")
    cases = [(g, tuple(map(int, w.split("x"))), layer) for g in args.graphs.split(",")
             for w in args.widths.split(",") for layer in args.layers.split(",")]
    if args.warm and not args.shard:
        warm_in_shards(__file__, argv or sys.argv[1:], args.warm)
    if args.compile_only and not args.shard:
        return
    graphs = {}
    rows = []
    for gname, (heads, width), layer in shard_of(cases, args.shard):
        if gname not in graphs:
            graphs[gname] = suite_graph(gname, scale=args.scale, device=DEVICE)
        edge_index, nodes = graphs[gname]
        t0 = time.time()
        got = run_case(gname, edge_index, nodes, heads, width, layer, variants, args.rounds, args.calls,
                       bool(args.shard), args.dropout, getattr(torch, args.dtype), args.edge_terms)
        rows += got
        if not args.shard:
            print(f"{gname} {heads}x{width} {layer}: {time.time() - t0:.1f} s", flush=True)
            for r in got:
                print("  " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()),
                      flush=True)
    if args.shard:
        return
    cols = ["graph", "HxF", "layer", "variant", "device_us", "device_iqr_us", "device_per_sum", "wall_us",
            "wall_per_sum", "max_diff", "rerun_same"]
    lines = [f"# attention forward kernels vs sum ({' '.join(sys.argv[1:])})", ""]
    lines += [f"- {k}: {v}" for k, v in machine(DEVICE).items()]
    lines += [f"- dropout: {args.dropout}; dtype: {args.dtype}; edge terms: {args.edge_terms}"]
    lines += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    seen = set()
    for r in rows:
        if r["variant"] == "sum":  # one sum row per (graph, width)
            key = (r["graph"], r["HxF"])
            if key in seen:
                continue
            seen.add(key)
        lines.append("| " + " | ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    emit(lines, args.out)


def emit(lines: list[str], out: str) -> None:
    """Prints a results table's lines and writes them to ``out`` (if given)."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
