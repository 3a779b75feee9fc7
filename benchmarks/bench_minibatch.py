"""Mini-batch training on sampled neighbourhoods: sampler speed, per-batch graph preparation as a
share of the step, and a fused vs stock PyG SAGE step on the same sampled batches.

    python -m benchmarks.bench_minibatch                                   # CPU, products graph at scale 0.02
    python -m benchmarks.bench_minibatch --device cuda --scale 1.0 --out "$OUT"

Workload (the products mini-batch setting): community-products (gnnfuse.graphs) at ``--scale`` as the
node-classification task of examples/train_ddp.py, 3-layer SAGE-mean 100 -> 256 -> 256 -> 47, fan-outs
[15, 10, 5], 1024 seeds per batch, bipartite layers (each computes only what the next layer reads).

Measured, each table's variants interleaved in one process (median, IQR):
  * sampling one batch: gnnfuse.loader.NeighborSampler on the device (on CUDA torch ops with one
    Triton kernel per hop for the picks, C++ on CPU; on CUDA also with the picks as torch ops, and
    its exact path, which reads each hop's size back, as before the padded path), its
    C++ kernel on the host CPU (``--host-sampler``: builds the C++ sampler), its torch-ops path on
    CPU; PyG's own NeighborSampler is tried and reported unavailable when it needs pyg-lib /
    torch-sparse (not installable here);
  * graph preparation of one batch: ``layer_csrs`` (O(E) from the target-sorted edges, no sort; on
    CUDA four launches), also with ``transposes=True`` (the backward's transposes built up front,
    from one sort: what the training steps below use), vs
    ``CSR.from_edge_index`` per layer (a sort each, what an unsorted edge_index costs);
  * a training step on pre-sampled batches (graph prep + forward + backward + optimizer): gnnfuse
    layers on ``layer_csrs`` (the fresh-graph route of gnnfuse.fresh_graph, rows in id order; with
    ``--all-routes`` also degree-sorted, and the planned route, ``GNNFUSE_TRITON_KERNEL=hybrid``, which
    builds a work list, locality statistic and short-row order per graph) vs stock PyG SAGEConv on the plain edge_index
    prefixes (which need no prep), each step synchronised; then the same steps back to back (one
    synchronisation per round of ``--batches`` steps, so the host runs ahead of the device);
  * the fused step's split, with the device synchronised between phases;
  * with ``--profile DIR``: torch.profiler tables of one fused and one stock step (CUDA time per op,
    host-device synchronisations), as text files in DIR.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .common import bench_interleaved, device_label, machine, save_results

ROOT = Path(__file__).resolve().parents[1]
FANOUTS, BATCH, HIDDEN = [15, 10, 5], 1024, 256


def _example():
    spec = importlib.util.spec_from_file_location("train_ddp", ROOT / "examples" / "train_ddp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def pyg_sampler_or_reason(edge_index, num_nodes):
    """PyG's NeighborSampler if it can sample here, else why not."""
    try:
        from torch_geometric.data import Data
        from torch_geometric.sampler import NeighborSampler, NodeSamplerInput

        sampler = NeighborSampler(Data(edge_index=edge_index.cpu(), num_nodes=num_nodes), FANOUTS)
        seeds = torch.arange(BATCH)
        sampler.sample_from_nodes(NodeSamplerInput(None, seeds))
        return lambda s: sampler.sample_from_nodes(NodeSamplerInput(None, s)), None
    except Exception as exc:  # noqa: BLE001  (ImportError without pyg-lib/torch-sparse, whatever PyG raises)
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"


def padded_step(ex, kind, model, optimizer):
    """One whole training step on a padded batch, for gnnfuse.loader.CapturedStep."""
    def step(xb, yb, edge_index, nodes, edges):
        optimizer.zero_grad(set_to_none=True)
        graphs, sizes = ex.graphs_of(kind, edge_index, nodes, edges)
        loss = F.cross_entropy(model(xb, graphs, sizes), yb)  # padded seed slots: label -100, skipped
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


def profile_steps(directory, fns, device):
    """torch.profiler tables of one call of each of ``fns`` (after a warm-up call): ops by device
    time, with the host-device synchronisations counted."""
    from torch.profiler import ProfilerActivity, profile

    Path(directory).mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for name, fn in fns.items():
        fn()
        _sync(device)
        with profile(activities=activities) as prof:
            fn()
            _sync(device)
        events = prof.key_averages()
        syncs = sum(e.count for e in events
                    if "Synchronize" in e.key or e.key in ("aten::item", "aten::_local_scalar_dense"))
        sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
        text = f"# {name}\n\nsync-like events (cudaStreamSynchronize/cudaDeviceSynchronize/item): {syncs}\n\n"
        text += events.table(sort_by=sort, row_limit=40, max_name_column_width=60)
        if device.type == "cuda":  # the host side: where a launch-bound step spends its time
            text += "\n\nby host time:\n" + events.table(sort_by="self_cpu_time_total", row_limit=40,
                                                           max_name_column_width=60)
        slug = "".join(c if c.isalnum() else "_" for c in name).strip("_")
        (Path(directory) / f"profile_{slug}.txt").write_text(text)
        print(text[:6000], flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--scale", type=float, default=None, help="default: 1.0 on CUDA, 0.02 on CPU")
    ap.add_argument("--batches", type=int, default=8, help="pre-sampled batches the steps cycle through")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default=None)
    ap.add_argument("--host-sampler", action="store_true", help="on CUDA: also time the C++ sampler on the host")
    ap.add_argument("--profile", default=None, help="directory for torch.profiler tables of one step each")
    ap.add_argument("--all-routes", action="store_true",
                    help="CUDA: also time the fresh route with degree-sorted rows and the planned route")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    scale = args.scale if args.scale is not None else (1.0 if device.type == "cuda" else 0.02)
    ex = _example()
    from gnnfuse import CSR
    from gnnfuse.loader import NeighborSampler, layer_csrs, layer_sizes

    t0 = time.perf_counter()
    task = ex.realistic_task(scale, seed=0, device=device)
    x, y, train = task["x"], task["y"], task["train"]
    n = task["num_nodes"]
    print(f"graph {task['name']}: {n} nodes, {task['edge_index'].shape[1]} edges, built in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    rows = []

    # ---- sampling ----------------------------------------------------------------------------------
    samplers = {"gnnfuse (device)": NeighborSampler(task["edge_index"], FANOUTS, num_nodes=n, seed=0, device=device)}
    if device.type == "cuda" and args.host_sampler:  # the same graph on the host (copied, not sorted again)
        samplers["gnnfuse C++ (host CPU)"] = samplers["gnnfuse (device)"].to("cpu")
    else:  # the CUDA implementation's torch ops, here on CPU (too slow to time at products scale)
        torch_ops = NeighborSampler(task["edge_index"], FANOUTS, num_nodes=n, seed=0)
        torch_ops._ext = None
        samplers["gnnfuse torch ops (CPU)"] = torch_ops
    pyg, reason = pyg_sampler_or_reason(task["edge_index"] if n < 10**6 else task["edge_index"][:, :BATCH], n)
    g = torch.Generator().manual_seed(0)
    seed_sets = [train[torch.randperm(train.numel(), generator=g)[:BATCH].to(train.device)] for _ in range(args.batches)]
    fns = {name: (lambda s=s: s.sample(seed_sets[0])) for name, s in samplers.items()}
    if device.type == "cuda":
        from gnnfuse.loader import _torch_sampling

        def exact():  # the per-hop-sync path (what every fan-out >= 0 took before the padded path)
            cap, _torch_sampling.MAX_PADDED = _torch_sampling.MAX_PADDED, 0
            try:
                samplers["gnnfuse (device)"].sample(seed_sets[0])
            finally:
                _torch_sampling.MAX_PADDED = cap

        def torch_picks():  # the padded path with the picks as torch ops (Floyd: ~8 launches per round)
            sampler = samplers["gnnfuse (device)"]
            sampler.picks = "torch"
            try:
                sampler.sample(seed_sets[0])
            finally:
                sampler.picks = "auto"

        fns["gnnfuse (device), picks as torch ops"] = torch_picks
        fns["gnnfuse (device), exact path: a host sync per hop"] = exact
    if pyg is not None:
        fns["PyG NeighborSampler"] = lambda: pyg(seed_sets[0].cpu())
    timing = bench_interleaved(fns, device, rounds=args.rounds)
    sample = samplers["gnnfuse (device)"].sample(seed_sets[0])
    for name, t in timing.items():
        rows.append(dict(table="sampling", variant=name, median_ms=t["median_ms"], iqr_ms=t["iqr_ms"],
                         note=f"{sum(sample.num_sampled_edges)} edges, {sample.node.numel()} nodes"))
    if pyg is None:
        rows.append(dict(table="sampling", variant="PyG NeighborSampler", note=f"unavailable: {reason}"))
    samplers = {"gnnfuse (device)": samplers["gnnfuse (device)"]}

    # ---- pre-sampled batches -------------------------------------------------------------------------
    sampler = samplers["gnnfuse (device)"]
    batches = []
    for seeds in seed_sets:
        out = sampler.sample(seeds)
        batches.append(dict(x=x[out.node], y=y[seeds], edge_index=torch.stack([out.row, out.col]), node=out.node,
                            nodes=out.num_sampled_nodes, edges=out.num_sampled_edges,
                            sizes=layer_sizes(out.num_sampled_nodes, out.num_sampled_edges)))

    # ---- graph preparation ---------------------------------------------------------------------------
    b0 = batches[0]

    def prep_sorted():
        return layer_csrs(edge_index=b0["edge_index"], num_sampled_nodes=b0["nodes"], num_sampled_edges=b0["edges"])

    def prep_sorting():
        return [CSR.from_edge_index(b0["edge_index"][:, :e], (s, d)) for d, s, e in b0["sizes"]]

    def prep_with_transposes():
        return layer_csrs(edge_index=b0["edge_index"], num_sampled_nodes=b0["nodes"], num_sampled_edges=b0["edges"],
                          transposes=True)

    prep = {"layer_csrs (sorted input, no sort)": prep_sorted,
            "layer_csrs(transposes=True): + the backward's transposes of layers 2..L (one sort)": prep_with_transposes,
            "CSR.from_edge_index per layer (sort)": prep_sorting}
    if device.type == "cuda":
        from gnnfuse.loader import HopPadding

        padding = HopPadding()
        padding.grow(b0["nodes"], b0["edges"])
        prep["HopPadding.pad (a captured step's per-batch input: padded edge_index and node ids)"] = \
            lambda: padding.pad(b0["edge_index"], b0["node"], b0["nodes"], b0["edges"])
    timing = bench_interleaved(prep, device, rounds=args.rounds)
    for name, t in timing.items():
        rows.append(dict(table="graph prep", variant=name, median_ms=t["median_ms"], iqr_ms=t["iqr_ms"]))

    # ---- training step: fused vs stock on the same batches ------------------------------------------
    dims = [x.shape[1], HIDDEN, HIDDEN, task["num_classes"]]
    torch.manual_seed(0)
    models = {"gnnfuse": ex.SAGE("gnnfuse", dims, 0.5).to(device), "pyg": ex.SAGE("pyg", dims, 0.5).to(device)}
    models["pyg"].load_state_dict(models["gnnfuse"].state_dict())
    # fused Adam on CUDA (one launch per step instead of a few per parameter group), for both variants
    optims = {k: torch.optim.Adam(m.parameters(), lr=0.003, fused=device.type == "cuda") for k, m in models.items()}
    counter = {"gnnfuse": 0, "pyg": 0, "gnnfuse captured": 0, "pyg captured": 0}
    captured = {}
    if device.type == "cuda":  # the same models' copies, each step captured as a CUDA graph on padded batches
        from gnnfuse.loader import CapturedStep

        for kind in ("gnnfuse", "pyg"):
            model = ex.SAGE(kind, dims, 0.5).to(device)
            model.load_state_dict(models["gnnfuse"].state_dict())
            models[f"{kind} captured"] = model
            optims[f"{kind} captured"] = torch.optim.Adam(model.parameters(), lr=0.003, fused=True, capturable=True)
            captured[kind] = CapturedStep(padded_step(ex, kind, model, optims[f"{kind} captured"]), x, warmup=3)
            for b in batches:  # capacities that fit every pre-sampled batch: no new capture while timing
                if not captured[kind].padding.fits(b["nodes"], b["edges"]):
                    captured[kind].padding.grow(b["nodes"], b["edges"])

    def step(kind):
        b = batches[counter[kind] % len(batches)]
        counter[kind] += 1
        if kind.endswith("captured"):  # pad into the static inputs, replay
            captured[kind.split()[0]](b["node"], b["edge_index"], b["nodes"], b["edges"], b["y"])
            return
        if kind == "gnnfuse":
            graphs = layer_csrs(edge_index=b["edge_index"], num_sampled_nodes=b["nodes"], num_sampled_edges=b["edges"],
                                transposes=True)
        else:
            graphs = [b["edge_index"][:, :e] for _, _, e in b["sizes"]]
        loss = F.cross_entropy(models[kind](b["x"], graphs, b["sizes"]), b["y"])
        optims[kind].zero_grad(set_to_none=True)
        loss.backward()
        optims[kind].step()

    from gnnfuse import fresh_graph

    @contextlib.contextmanager
    def route(name):
        """gnnfuse's route for this variant: fresh graphs (id or degree row order), or planned."""
        planned, order = name.endswith("planned route"), fresh_graph.FRESH_ROW_ORDER
        if planned:
            os.environ["GNNFUSE_TRITON_KERNEL"] = "hybrid"  # any forced kernel turns the fresh route off
        if name.endswith("degree order"):
            fresh_graph.FRESH_ROW_ORDER = "degree"
        try:
            yield
        finally:
            os.environ.pop("GNNFUSE_TRITON_KERNEL", None)
            fresh_graph.FRESH_ROW_ORDER = order

    variants = {"gnnfuse, fresh-graph route": "gnnfuse", "gnnfuse, fresh-graph route, degree order": "gnnfuse",
                "gnnfuse, planned route": "gnnfuse", "gnnfuse, captured step (CUDA graph, padded batches)":
                "gnnfuse captured", "stock PyG SAGEConv": "pyg",
                "stock PyG SAGEConv, captured step (CUDA graph, padded batches)": "pyg captured"}
    if not args.all_routes:  # (both measured in results/archive/minibatch_h200_2026-11-23b: slower than the default route)
        variants = {k: v for k, v in variants.items() if not k.endswith(("degree order", "planned route"))}
    if device.type != "cuda":
        variants = {"gnnfuse": "gnnfuse", "stock PyG SAGEConv": "pyg"}

    def run(name, steps=1):
        with route(name):
            for _ in range(steps):
                step(variants[name])

    for name in variants:  # warm-up: Triton compiles, C++ loads, captured steps capture
        run(name, 5)
    for table, steps, rounds in (("train step", 1, args.rounds * len(batches)),
                                 ("train step, back to back", len(batches), args.rounds)):
        timing = bench_interleaved({name: (lambda name=name: run(name, steps)) for name in variants}, device,
                                   rounds=rounds, max_seconds=60)
        stock = timing["stock PyG SAGEConv"]["median_ms"] / steps
        for name, t in timing.items():
            ms = t["median_ms"] / steps
            note = f"speed-up {stock / ms:.2f}x" if name.startswith("gnnfuse") else ""
            kind = variants[name]
            if kind.endswith("captured"):
                note += f" ({captured[kind.split()[0]].captures} captures)"
            rows.append(dict(table=table, variant=name, median_ms=ms, iqr_ms=t["iqr_ms"] / steps, note=note))

    if args.profile:
        profile_steps(args.profile, {name: (lambda name=name: run(name)) for name in variants}, device)

    # ---- the fused step's split (synchronised phases, a sampled batch each step) -----------------------
    phases = {k: [] for k in ("sampling", "gather", "graph prep", "forward", "backward", "optimizer")}
    model, opt = models["gnnfuse"], optims["gnnfuse"]
    for i in range(args.rounds * 2):
        seeds = seed_sets[i % len(seed_sets)]
        marks = [time.perf_counter()]

        def lap():
            _sync(device)
            marks.append(time.perf_counter())

        out = sampler.sample(seeds)
        lap()
        xb, yb = x[out.node], y[seeds]
        lap()
        graphs = layer_csrs(edge_index=torch.stack([out.row, out.col]), num_sampled_nodes=out.num_sampled_nodes,
                            num_sampled_edges=out.num_sampled_edges, transposes=True)
        lap()
        loss = F.cross_entropy(model(xb, graphs, layer_sizes(out.num_sampled_nodes, out.num_sampled_edges)), yb)
        lap()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        lap()
        opt.step()
        lap()
        for name, a, b in zip(phases, marks, marks[1:]):
            phases[name].append((b - a) * 1e3)
    medians = {k: statistics.median(v) for k, v in phases.items()}
    total = sum(medians.values())
    for name, ms in medians.items():
        rows.append(dict(table="fused step split", variant=name, median_ms=ms, share=f"{100 * ms / total:.1f}%"))
    train_step = medians["graph prep"] + medians["forward"] + medians["backward"] + medians["optimizer"]
    rows.append(dict(table="fused step split", variant="graph prep / (prep + fwd + bwd + opt)",
                     share=f"{100 * medians['graph prep'] / train_step:.1f}%"))

    meta = dict(machine(device), graph=task["name"], nodes=n, edges=int(task["edge_index"].shape[1]),
                fanouts=FANOUTS, batch=BATCH, model=f"SAGE-mean {dims}", batches=len(batches))
    name = f"minibatch_{device_label(device)}"
    md = save_results(name, meta, rows, ["table", "variant", "median_ms", "iqr_ms", "share", "note"], args.out)
    print(md.read_text())


if __name__ == "__main__":
    main()
