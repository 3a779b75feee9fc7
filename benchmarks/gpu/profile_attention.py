"""Where a fused attention call's time goes on a GPU: kernel versus host.

For each graph (suite names, default arxiv-like and rfc-uniform) at heads x F (default 8 x 8):

* forward alone (no gradients) of gat_attention / gatv2_attention / dot_attention and our sum
  gather-scatter at the same width: per call the CUDA kernels (name, launches, device time from
  torch.profiler), the wall time of 200 calls back to back (enqueue time without a sync, total
  with the final sync), the host time of one call while the GPU is idle, and the replay time of
  a CUDA graph of 20 calls (device time without host gaps);
* the training step of the layers (gnnfuse.nn vs PyG, and ours with ``gnnfuse_fused_projections``
  off: GATConv's projections op by op through autograd; the others have no such switch): kernels and
  device time per step, wall time per step, and the host's Python functions by own time (cProfile)
  for ours (``--host-ops N``: also its N torch ops by own host time, torch.profiler);
* ``--timeline``: for our step on the profiled graphs, one step's host timeline on every thread
  (the forward on the caller's, the backward on autograd's device thread, which cProfile in the
  caller does not see): each top-level op or autograd node with its start and duration, the node's
  own ops under it, and the gaps between them (Python); plus a cProfile of the one-node route's
  backward taken on the thread that runs it;
* ``--sweep``: the one-pass forward's device time with rows per group and piece / warps forced;
* ``--breakdown GRAPHS``: where one training step's host time goes without a profiler's overhead (its
  timeline inflates every op): timestamps (perf_counter_ns) taken by thin wrappers around the layer's
  parts, median of 300 steps each started on an idle GPU (pre-node checks and the graph lookup, the
  one-node route's forward and its Triton host call, the loss, autograd up to the node's backward, the
  backward and its Triton host call, the rest), and the back-to-back step of ours, PyG's, and ours with
  the Triton host calls replaced by returning the first call's outputs (what all of that host work costs
  in the step, launches included).

    PYTHONPATH=. python benchmarks/gpu/profile_attention.py --out "$OUT" [--graphs arxiv-like] [--sweep]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import gnnfuse
import gnnfuse.nn as G
from gnnfuse.graphs import suite_graph

LAYERS = ("GATConv", "GATv2Conv", "TransformerConv")


def forwards(h, a_src, a_dst, edge_index):
    att = torch.randn(h.shape[1:], device=h.device)
    flat = h.reshape(h.shape[0], -1)
    return {
        "gat": lambda: gnnfuse.gat_attention(h, a_src, a_dst, edge_index, add_self_loops=True),
        "gatv2": lambda: gnnfuse.gatv2_attention(h, h, att, edge_index, add_self_loops=True),
        "dot": lambda: gnnfuse.dot_attention(h, h, h, edge_index),
        "sum": lambda: gnnfuse.fused_gather_scatter(flat, edge_index, "sum"),
    }


def kernel_table(fn, calls: int) -> tuple[list[tuple[str, float, float]], float, float]:
    """(name, launches per call, device us per call) of fn's CUDA kernels, total device us per call,
    wall us per call (profiled, so inflated)."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / calls * 1e6
    per = defaultdict(lambda: [0, 0.0])
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            name = evt.name[:60]
            per[name][0] += 1
            per[name][1] += evt.device_time
    rows = sorted(((n, c / calls, t / calls) for n, (c, t) in per.items()), key=lambda r: -r[2])
    return rows, sum(r[2] for r in rows), wall


def back_to_back(fn, calls: int = 200) -> tuple[float, float]:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    enqueue = time.perf_counter() - t0
    torch.cuda.synchronize()
    total = time.perf_counter() - t0
    return enqueue / calls * 1e6, total / calls * 1e6


def host_alone(fn, calls: int = 50) -> float:
    """Median host time of one call started on an idle GPU (us)."""
    samples = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    samples.sort()
    return samples[len(samples) // 2] * 1e6


def graph_replay(fn, calls: int = 20) -> float | str:
    """Device us per call from replays of a CUDA graph of ``calls`` calls (no host gaps)."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(calls):
                fn()
        g.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        best = []
        for _ in range(5):
            start.record()
            g.replay()
            end.record()
            torch.cuda.synchronize()
            best.append(start.elapsed_time(end) * 1e3 / calls)
        return sorted(best)[2]
    except Exception as exc:  # capture may fail (a host sync inside): say so
        return f"{type(exc).__name__}: {str(exc)[:80]}"


def host_profile(fn, calls: int, top: int) -> str:
    fn()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def host_ops(fn, calls: int, top: int) -> str:
    """The torch ops (and autograd nodes) of ``calls`` calls by their own host time (torch.profiler, CPU
    side only): what a host-bound step spends its time on besides our Python (host_profile)."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def step_timeline(step, calls: int = 30) -> str:
    """One step's host timeline per thread (module doc, ``--timeline``): the step of median wall time
    out of ``calls``, its top-level profiler events by thread in start order (offset from the step's
    start, duration, name), each autograd node's direct children indented, and per thread the time
    inside events against the time between them."""
    from torch.profiler import record_function

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(calls):
            torch.cuda.synchronize()
            with record_function(f"step#{i}"):
                step()
            torch.cuda.synchronize()
    events = prof.profiler.function_events
    marks = sorted((e for e in events if e.name.startswith("step#")), key=lambda e: e.time_range.start)
    mark = sorted(marks, key=lambda e: e.time_range.elapsed_us())[len(marks) // 2]
    t0, t1 = mark.time_range.start, mark.time_range.end
    inside = [e for e in events if e is not mark and t0 <= e.time_range.start and e.time_range.end <= t1 + 1e3]
    lines = [f"step wall {t1 - t0:.0f} us (median of {calls}, profiled)"]
    tops = [e for e in inside if e.cpu_parent is None or e.cpu_parent is mark]
    for thread in sorted({e.thread for e in tops}):
        mine = sorted((e for e in tops if e.thread == thread), key=lambda e: e.time_range.start)
        busy = sum(e.time_range.elapsed_us() for e in mine)
        span = mine[-1].time_range.end - mine[0].time_range.start if mine else 0
        lines.append(f"  thread {thread}: {len(mine)} top-level events, {busy:.0f} us inside them, "
                     f"{span - busy:.0f} us between them (span {span:.0f})")
        for e in mine:
            lines.append(f"    +{e.time_range.start - t0:7.0f} {e.time_range.elapsed_us():6.0f}  {e.name[:70]}")
            _children(e, t0, lines, "        ")
    return "\n".join(lines)


def _children(event, t0: float, lines: list, indent: str) -> None:
    """The direct children of a non-aten event (an autograd node, a Function's forward) in start order,
    recursively down to the aten ops, with the time between them (the node's Python)."""
    if event.name.startswith("aten::") or not event.cpu_children:
        return
    kids = sorted(event.cpu_children, key=lambda c: c.time_range.start)
    for c in kids[:60]:
        lines.append(f"{indent}+{c.time_range.start - t0:7.0f} {c.time_range.elapsed_us():6.0f}  {c.name[:60]}")
        _children(c, t0, lines, indent + "    ")
    inner = sum(c.time_range.elapsed_us() for c in kids)
    lines.append(f"{indent}({inner:.0f} us in {len(kids)} child events, {event.time_range.elapsed_us() - inner:.0f} us "
                 f"between them)")


def node_backward_profile(step, calls: int = 50, top: int = 30) -> str:
    """cProfile of the one-node routes' backward (GATNode / PairNode), taken inside it: autograd runs
    a CUDA node's backward on its device thread, which a profiler enabled in the caller misses."""
    from gnnfuse.nn import _gat_node, _pair_node

    prof = cProfile.Profile()
    originals = {}
    for cls in (_gat_node.GATNode, _pair_node.PairNode):
        originals[cls] = vars(cls)["backward"]

        def wrapped(ctx, *grads, _orig=originals[cls].__func__):
            prof.enable()
            try:
                return _orig(ctx, *grads)
            finally:
                prof.disable()
        cls.backward = staticmethod(wrapped)
    try:
        step()
        prof = cProfile.Profile()  # (the warm-up's calls dropped)
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    finally:
        for cls, original in originals.items():
            cls.backward = original
    s = io.StringIO()
    try:
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    except TypeError:  # nothing recorded: the step took none of these nodes
        return "(no one-node backward ran)"
    return s.getvalue()


def make_step(layer, x, edge_index):
    params = list(layer.parameters())

    def step():
        out = layer(x, edge_index)
        torch.autograd.grad(out.square().mean(), params)
    return step


def emit(lines, text):
    print(text, flush=True)
    lines.append(text)


def run_graph(name, heads, width, args, lines):
    import torch_geometric.nn as pyg_nn

    dev = torch.device("cuda")
    edge_index, nodes = suite_graph(name, device=dev)
    emit(lines, f"\n## {name}: {nodes} nodes, {edge_index.shape[1]} edges, {heads}x{width}")
    torch.manual_seed(0)
    h = torch.randn(nodes, heads, width, device=dev)
    a_src, a_dst = torch.randn(nodes, heads, device=dev), torch.randn(nodes, heads, device=dev)
    with torch.no_grad():
        for label, fn in forwards(h, a_src, a_dst, edge_index).items():
            rows, device_us, _ = kernel_table(fn, 20)
            enq, tot = back_to_back(fn)
            host = host_alone(fn)
            emit(lines, f"### forward {label}: device {device_us:.1f} us/call in {sum(r[1] for r in rows):.0f} "
                        f"launches; back-to-back enqueue {enq:.1f} / total {tot:.1f} us/call; host alone "
                        f"{host:.1f} us")
            for n, c, t in rows:
                emit(lines, f"    {t:8.1f} us  x{c:.0f}  {n}")
            if label in args.host_profile:
                emit(lines, host_profile(fn, 200, 25))
    x = torch.randn(nodes, 64, device=dev)
    layers = [layer for layer in args.layers.split(",") if layer] if name in args.step_graphs.split(",") else []
    for layer in layers:
        torch.manual_seed(0)
        stock = getattr(pyg_nn, layer)(64, width, heads=heads, dropout=0.6).to(dev).train()
        ours = getattr(G, layer)(64, width, heads=heads, dropout=0.6).to(dev).train()
        ours.load_state_dict(stock.state_dict())
        separate = getattr(G, layer)(64, width, heads=heads, dropout=0.6).to(dev).train()
        separate.load_state_dict(stock.state_dict())
        separate.gnnfuse_fused_projections = False  # GATConv: projections op by op through autograd
        variants = (("ours", ours), ("ours-separate", separate), ("pyg", stock)) if layer == "GATConv" else \
            (("ours", ours), ("pyg", stock))  # (only GATConv has the switch)
        for label, layer_obj in variants:
            step = make_step(layer_obj, x, edge_index)
            rows, device_us, _ = kernel_table(step, 10)
            enq, tot = back_to_back(step, 50)
            host = host_alone(step, 20)
            emit(lines, f"### step {layer} {label}: device {device_us:.1f} us/step in {sum(r[1] for r in rows):.0f} "
                        f"launches; back-to-back enqueue {enq:.1f} / total {tot:.1f} us/step; host alone "
                        f"{host:.1f} us")
            for n, c, t in rows[:args.kernels]:
                emit(lines, f"    {t:8.1f} us  x{c:.0f}  {n}")
            if label == "ours" and name in args.step_profile:
                emit(lines, host_profile(step, 50, 40))
                if args.host_ops:
                    emit(lines, host_ops(step, 50, args.host_ops))
                if args.timeline:
                    emit(lines, step_timeline(step))
                    emit(lines, "### the one-node route's backward, cProfile on its thread\n"
                                + node_backward_profile(step))
    with torch.no_grad():  # last: a failed capture may leave the stream unusable
        for label, fn in forwards(h, a_src, a_dst, edge_index).items():
            replay = graph_replay(fn)
            emit(lines, f"### forward {label}: CUDA graph replay "
                        f"{replay if isinstance(replay, str) else f'{replay:.1f} us/call'}")


def sweep(name, heads, width, lines):
    from gnnfuse.triton import attention as kernels

    dev = torch.device("cuda")
    edge_index, nodes = suite_graph(name, device=dev)
    h = torch.randn(nodes, heads, width, device=dev)
    a_src, a_dst = torch.randn(nodes, heads, device=dev), torch.randn(nodes, heads, device=dev)
    fns = forwards(h, a_src, a_dst, edge_index)
    rows0, cfg0 = kernels._one_pass_rows, kernels._one_pass_config
    emit(lines, f"\n## sweep {name} {heads}x{width}: device us per call (profiler); G rows per group and piece, "
                f"W warps of the one-pass forward")
    for rows, warps in ((None, None), (8, None), (None, 8), (8, 8)):
        if rows is not None:
            kernels._one_pass_rows = (lambda *a, r=rows: r)
        if warps is not None:
            kernels._one_pass_config = (lambda *a, w=warps, **k: {**cfg0(*a, **k), "warps": w})
        try:
            res = []
            for label in ("gat", "gatv2", "dot"):
                with torch.no_grad():
                    res.append(kernel_table(fns[label], 10)[1])
            emit(lines, f"    G{rows or 'default'} W{warps or 'default'}: "
                        f"gat {res[0]:.1f}  gatv2 {res[1]:.1f}  dot {res[2]:.1f}")
        except Exception as exc:
            emit(lines, f"    G{rows} W{warps}: {type(exc).__name__}: {str(exc)[:300]}")
        finally:
            kernels._one_pass_rows, kernels._one_pass_config = rows0, cfg0


_BREAKDOWN = [("pre-node (checks, graph lookup)", "s0", "nodefwd>"), ("  of it checked_graph", "checked>", "checked<"),
              ("node forward", "nodefwd>", "nodefwd<"), ("  of it the Triton forward's host call", "tfwd>", "tfwd<"),
              ("node exit -> layer output", "nodefwd<", "s1"), ("loss", "s1", "s2"),
              ("loss -> node backward (engine, loss backward, hand-over)", "s2", "nodebwd>"),
              ("node backward", "nodebwd>", "nodebwd<"), ("  of it the Triton backward's host call", "tbwd>", "tbwd<"),
              ("node backward exit -> grad returns", "nodebwd<", "s3")]


assert len({label for label, _, _ in _BREAKDOWN}) == len(_BREAKDOWN)  # (rows are keyed by label)


def breakdown(name, heads, width, lines, steps=300):
    """--breakdown (module doc). Wraps, for the run, the one-node routes' autograd nodes, their graph
    check and the Triton host modules' forward / backward (looked up by module on each call)."""
    import importlib
    import statistics

    import torch_geometric.nn as pyg_nn

    from gnnfuse.nn import _gat_node, _pair_node

    dev = torch.device("cuda")
    edge_index, nodes = suite_graph(name, device=dev)
    torch.manual_seed(0)
    x = torch.randn(nodes, 64, device=dev)
    marks = {}
    clock = time.perf_counter_ns

    def timed(fn, tag):
        def run(*a, **k):
            marks[tag + ">"] = clock()
            try:
                return fn(*a, **k)
            finally:
                marks[tag + "<"] = clock()
        return run

    saved = []
    for mod, node, kernels in ((_gat_node, _gat_node.GATNode, "attention"),
                               (_pair_node, _pair_node.PairNode, "pair_attention")):
        tmod = importlib.import_module(f"gnnfuse.triton.{kernels}")
        for owner, attr, tag in ((node, "forward", "nodefwd"), (node, "backward", "nodebwd"),
                                 (mod, "checked_graph", "checked"), (tmod, "forward", "tfwd"),
                                 (tmod, "backward", "tbwd")):
            original = vars(owner)[attr]
            saved.append((owner, attr, original))
            fn = original.__func__ if isinstance(original, staticmethod) else original
            setattr(owner, attr, staticmethod(timed(fn, tag)) if isinstance(original, staticmethod) else timed(fn, tag))
    emit(lines, f"\n## breakdown {name}: {nodes} nodes, {edge_index.shape[1]} edges, {heads}x{width} (us, median)")
    try:
        for layer in LAYERS:
            torch.manual_seed(0)
            stock = getattr(pyg_nn, layer)(64, width, heads=heads, dropout=0.6).to(dev).train()
            ours = getattr(G, layer)(64, width, heads=heads, dropout=0.6).to(dev).train()
            ours.load_state_dict(stock.state_dict())
            params = list(ours.parameters())
            rows, total = {k: [] for k, _, _ in _BREAKDOWN}, []
            for i in range(steps + 20):
                torch.cuda.synchronize()
                marks.clear()
                marks["s0"] = clock()
                out = ours(x, edge_index)
                marks["s1"] = clock()
                loss = out.square().mean()
                marks["s2"] = clock()
                torch.autograd.grad(loss, params)
                marks["s3"] = clock()
                if i >= 20:
                    total.append((marks["s3"] - marks["s0"]) / 1e3)
                    for k, a, b in _BREAKDOWN:
                        if a in marks and b in marks:
                            rows[k].append((marks[b] - marks[a]) / 1e3)
            emit(lines, f"### {layer} ours: step started on an idle GPU {statistics.median(total):.0f}")
            for k, _, _ in _BREAKDOWN:
                if rows[k]:
                    emit(lines, f"    {k:58s} {statistics.median(rows[k]):7.1f}")
            kind = "attention" if layer == "GATConv" else "pair_attention"
            tmod = importlib.import_module(f"gnnfuse.triton.{kind}")
            forward, backward, first = tmod.forward, tmod.backward, {}

            def fixed(fn, tag):
                return lambda *a: first[tag] if tag in first else first.setdefault(tag, fn(*a))
            results = {"ours": [], "pyg": [], "ours, Triton host calls stubbed": []}
            for _ in range(5):
                results["ours"].append(back_to_back(make_step(ours, x, edge_index), 50)[1])
                results["pyg"].append(back_to_back(make_step(stock, x, edge_index), 50)[1])
                tmod.forward, tmod.backward = fixed(forward, "f"), fixed(backward, "b")
                try:
                    stubbed = back_to_back(make_step(ours, x, edge_index), 50)[1]
                    results["ours, Triton host calls stubbed"].append(stubbed)
                finally:
                    tmod.forward, tmod.backward = forward, backward
            med = {k: statistics.median(v) for k, v in results.items()}
            emit(lines, "    back to back, us/step: " + ", ".join(f"{k} {v:.0f}" for k, v in med.items())
                 + f" (PyG / ours {med['pyg'] / med['ours']:.2f})")
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", default="arxiv-like,rfc-uniform")
    parser.add_argument("--shape", default="8x8")
    parser.add_argument("--layers", default=",".join(LAYERS))
    parser.add_argument("--host-profile", default="gat", help="forwards to profile the host of (cProfile)")
    parser.add_argument("--step-graphs", default="arxiv-like,rfc-uniform", help="graphs whose training step is timed")
    parser.add_argument("--step-profile", default="rfc-uniform", help="graphs whose step's host is profiled")
    parser.add_argument("--kernels", type=int, default=12, help="kernels listed per step")
    parser.add_argument("--host-ops", type=int, default=0, help="torch ops listed by host time per profiled step")
    parser.add_argument("--shapes", default=None, help="heads x F of every graph, comma-separated (default: --shape)")
    parser.add_argument("--timeline", action="store_true", help="one step's host timeline per thread and a "
                        "cProfile of the one-node backward (profiled graphs, ours)")
    parser.add_argument("--sweep", default="", help="graphs to sweep the row-group kernel on")
    parser.add_argument("--breakdown", default="", help="graphs whose step's host time is split by timestamps")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    heads, width = (int(v) for v in args.shape.split("x"))
    lines = [f"# attention profile, {torch.cuda.get_device_name()}, torch {torch.__version__}"]
    for name in [g for g in args.sweep.split(",") if g]:
        sweep(name, heads, width, lines)
    for name in [g for g in args.breakdown.split(",") if g]:
        for shape in (args.shapes or args.shape).split(","):
            breakdown(name, *(int(v) for v in shape.split("x")), lines)
    for name in [g for g in args.graphs.split(",") if g]:
        for shape in (args.shapes or args.shape).split(","):
            heads, width = (int(v) for v in shape.split("x"))
            run_graph(name, heads, width, args, lines)
    if args.out:
        with open(f"{args.out}/attention-profile.txt", "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
