"""GPU benchmark of id locality: each realistic graph in three orders (as generated, scrambled,
and the scrambled graph after ``gnnfuse.reorder``), our sum forward against cuSPARSE given the
same ordered graph, all variants interleaved in one process.

    PYTHONPATH=. python -m benchmarks.bench_gpu_locality [--graphs community-products] [--widths 32,64,128,256]
        [--stress arxiv-like,products-like,hub-stress] [--reorder auto] [--out DIR]

Variants: ``auto`` (the default dispatch: the schedule the locality statistic picks), ``global``
(short rows in global degree order), ``windowed`` (L2-sized id windows, forced), ``csr`` (the CSR
row-parallel kernel alone, id order), ``coo`` (sorted-COO, id order, atomics), ``cusparse``
(torch.sparse.mm). Bandwidths: ``eff_GBps`` counts the minimum traffic (indices, each source row
once, each output row once) over our time, against the measured device copy bandwidth;
``bound_ms`` is that traffic at copy bandwidth; ``gather_GBps`` counts one source row per edge.
"""
from __future__ import annotations

import argparse
import datetime as dt
import time

import torch

import gnnfuse
from benchmarks.bench_gpu import copy_bandwidth
from benchmarks.common import bench_interleaved, device_label, geomean, machine, save_results, synchronize
from gnnfuse.csr import CSR
from gnnfuse.graphs import suite_graph
from gnnfuse.ordering import relabel
from gnnfuse.triton import gather_scatter as tgs
from gnnfuse.triton import schedule

VARIANTS = ("auto", "global", "windowed", "csr", "coo", "cusparse")
# --sweep [SET]: hybrid-plan overrides of the auto plan (the locality statistic still picks the window).
# "plans" (the one-launch plan's neighbours): 2l = two launches (row groups, then the long rows' CSR
# kernel), "2l before" = the default before the one-launch plan (16-edge long-row tiles, 8 row-group
# warps above F=32), gbfN = row-group feature tile, leN = the long rows' edge tile, gwN = row-group
# warps, rN = rows per group, smN = short_max, segN = longest piece.
# "reuse" (more reuse of source rows inside an SM): gbf32 = 32-wide (128-byte) row-group tiles, rN as
# above, big / big64 = 64-row groups of 8 warps on 32- / 64-wide tiles. (The per-SM task queues, the
# evict_first hint on the index/output streams and the register caps of
# benchmarks/results/gpu-locality-reuse_h100_2026-11-23.md were slower and are not in the library.)
# "evict": the auto plan against itself without the evict_last hint on the gathered x rows.
SWEEPS = {
    "plans": {
        "2l": dict(one_pass=False), "2l before": dict(one_pass=False, block_e=16, group_warps=8),
        "gbf128": dict(group_block_f=128), "le16": dict(block_e=16), "le64": dict(block_e=64),
        "gw2": dict(group_warps=2), "gw8": dict(group_warps=8), "r8": dict(group_rows=8), "r32": dict(group_rows=32),
        "sm32": dict(short_max=32), "sm128": dict(short_max=128), "seg512": dict(seg=512), "seg2048": dict(seg=2048),
    },
    "evict": {"no hint": dict(x_evict="")},
    "reuse": {
        "gbf32": dict(one_pass=True, group_block_f=32), "r8": dict(one_pass=True, group_rows=8),
        "r32": dict(one_pass=True, group_rows=32),
        "big": dict(one_pass=True, group_rows=64, group_warps=8, group_block_f=32),
        "big64": dict(one_pass=True, group_rows=64, group_warps=8),
    },
}


def _orders(name: str, method: str, scale: float, device: str):
    """(order, edge_index, n, reorder seconds) for the generated, scrambled and reordered graph,
    built one at a time."""
    ei, n = suite_graph(name, order="generated", device=device, scale=scale)
    yield "generated", ei, n, None
    del ei
    ei, n = suite_graph(name, order="scrambled", device=device, scale=scale)
    yield "scrambled", ei, n, None
    synchronize(device)
    t0 = time.perf_counter()
    perm = gnnfuse.reorder(ei, n, method)
    synchronize(device)
    seconds = time.perf_counter() - t0
    yield "reordered", relabel(ei, perm), n, seconds


def measure(csr: CSR, F: int, copy_gbps: float, variants, rounds: int, sweep: str | None = None) -> dict:
    n, e, device = csr.num_dst, csr.num_edges, csr.device
    x = torch.randn(csr.num_src, F, device=device)
    auto = tgs.plan_for(x, csr.rowptr, csr.col, "sum")
    window = schedule.WINDOW_ROWS
    plans = {"global": tgs.plan_for(x, csr.rowptr, csr.col, "sum", "hybrid", window=0),
             "windowed": tgs.plan_for(x, csr.rowptr, csr.col, "sum", "hybrid", window=window),
             "csr": tgs.plan_for(x, csr.rowptr, csr.col, "sum", "csr"),
             "coo": tgs.plan_for(x, csr.rowptr, csr.col, "sum", "coo")}
    a = torch.sparse_csr_tensor(csr.rowptr, csr.col, torch.ones(e, device=device), (n, csr.num_src))
    backend = "auto" if device.type == "cuda" else "triton"  # (cpu: the smoke test, interpreted)
    fns = {"auto": lambda: gnnfuse.fused_gather_scatter(x, csr, "sum", backend=backend),
           "cusparse": lambda: torch.sparse.mm(a, x)}
    for k, p in plans.items():
        fns[k] = lambda p=p: tgs.forward(x, csr.rowptr, csr.col, None, "sum", plan=p)
    fns = {k: v for k, v in fns.items() if k in variants}
    for k, cfg in (SWEEPS[sweep] if sweep else {}).items():
        p = tgs.plan_for(x, csr.rowptr, csr.col, "sum", "hybrid", **cfg)
        fns[k] = lambda p=p: tgs.forward(x, csr.rowptr, csr.col, None, "sum", plan=p)
    ref = torch.sparse.mm(a, x)
    base = fns["auto"]() if "auto" in fns else None
    differ = []  # sweep variants whose result is not bitwise the auto plan's
    failed = []  # sweep variants that did not run (e.g. a Triton without some instruction): reported, not timed
    for k, fn in list(fns.items()):  # every variant computes the same sum
        try:
            out = fn()
        except Exception as err:  # noqa: BLE001
            if not sweep or k not in SWEEPS[sweep]:
                raise
            print(f"{k} failed: {type(err).__name__}: {err}"[:2000], flush=True)
            failed.append(k)
            del fns[k]
            continue
        out = out[0] if isinstance(out, tuple) else out
        rel = float((out - ref).norm() / ref.norm().clamp_min(1e-30))
        if not rel < 1e-5:  # float32 sums in different orders (hub rows of millions of edges)
            raise AssertionError(f"{k} differs from cuSPARSE: relative error {rel:.2e}")
        if sweep and base is not None and k in SWEEPS[sweep] and not torch.equal(out, base):
            differ.append(k)
    del ref, base
    timed = bench_interleaved(fns, device, rounds=rounds, max_seconds=6.0)
    r = {"F": F, "window": auto.window, "auto_reason": auto.reason.split("; ")[-1]}
    if sweep:
        r["not_bitwise"] = " ".join(differ) or "-"
        r["failed"] = " ".join(failed) or "-"
    for k, t in timed.items():
        r[k] = t["median_ms"]
        r[f"{k}_min"] = t["min_ms"]
    idx = csr.col.element_size()
    min_bytes = e * idx + (csr.num_src + n) * F * 4 + (n + 1) * idx
    r["bound_ms"] = min_bytes / (copy_gbps * 1e9) * 1e3
    r["eff_GBps"] = min_bytes / (r["auto"] * 1e-3) / 1e9
    r["pct_copy"] = 100 * r["eff_GBps"] / copy_gbps
    r["gather_GBps"] = e * F * 4 / (r["auto"] * 1e-3) / 1e9
    if "cusparse" in r:
        r["x_vs_cusparse"] = r["cusparse"] / r["auto"]
    return r


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="community-products")
    ap.add_argument("--stress", default="arxiv-like,products-like,hub-stress",
                    help="uniform-source graphs, timed as generated (no locality to recover)")
    ap.add_argument("--widths", default="32,64,128,256")
    ap.add_argument("--reorder", default="auto", help="gnnfuse.reorder method for the third order")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default=None)
    ap.add_argument("--name", default=None)
    ap.add_argument("--scale", type=float, default=1.0, help="shrink every graph (smoke tests)")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test under TRITON_INTERPRET=1")
    ap.add_argument("--sweep", nargs="?", const="plans", default=None, choices=list(SWEEPS),
                    help="also time a set of SWEEPS plans (generated/reordered orders; default set: plans)")
    ap.add_argument("--orders", default="generated,scrambled,reordered", help="orders of the realistic graphs")
    ap.add_argument("--l2-ceiling", action="store_true",
                    help="also time a graph whose sources fit in a quarter of L2: every gather an L2 hit, the "
                         "ceiling of what a better order can give")
    args = ap.parse_args(argv)
    device = args.device
    meta = machine(device)
    meta["copy_GBps"] = round(copy_bandwidth(), 1) if device == "cuda" else float("nan")
    meta["L2_bytes"] = schedule.l2_cache_bytes(torch.device(device))
    meta["reorder_method"] = args.reorder
    widths = [int(f) for f in args.widths.split(",")]
    variants = args.variants.split(",")
    name = args.name or f"gpu-locality_{device_label(device)}_{dt.date.today().isoformat()}"
    print(meta, flush=True)
    rows = []

    def save():
        columns = COLUMNS + (list(SWEEPS[args.sweep]) + ["not_bitwise", "failed"] if args.sweep else [])
        return save_results(name, meta, rows, columns, out_dir=args.out, notes=summarise(rows))

    for gname, stress in [(g, False) for g in filter(None, args.graphs.split(","))] + \
                         [(g, True) for g in filter(None, args.stress.split(","))]:
        orders = _orders(gname, args.reorder, args.scale, device) if not stress else iter(
            [("generated", *suite_graph(gname, device=device, scale=args.scale), None)])
        for order, ei, n, reorder_s in orders:
            if (args.sweep and order == "scrambled") or (not stress and order not in args.orders.split(",")):
                continue
            t0 = time.perf_counter()
            csr = CSR.from_edge_index(ei, n)
            synchronize(device)
            build_s = time.perf_counter() - t0
            for F in widths:
                r = {"graph": gname, "order": order, "N": n, "E": csr.num_edges,
                     "reorder_s": reorder_s, "csr_build_s": build_s, **measure(csr, F, meta["copy_GBps"], variants,
                                                                             args.rounds, args.sweep)}
                rows.append(r)
                print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
                save()
            del csr, ei
            if device == "cuda":
                torch.cuda.empty_cache()
    if args.l2_ceiling:
        rows.extend(l2_ceiling(widths, meta, variants, args.rounds, args.scale, device, args.sweep))
    md = save()
    print(md.read_text(), flush=True)


def l2_ceiling(widths, meta, variants, rounds, scale, device, sweep=None):
    """Rows of a bipartite graph (1M targets x 16 uniform sources each) whose sources fit in a
    quarter of L2 at each width: its gather_GBps is what L2 serves, the bound for any ordering."""
    rows = []
    g = torch.Generator(device=device).manual_seed(0)
    n_dst, deg = max(1, int(1_000_000 * scale)), 16
    for F in widths:
        n_src = max(1, meta["L2_bytes"] // 4 // (F * 4))
        ei = torch.stack([torch.randint(0, n_src, (n_dst * deg,), generator=g, device=device),
                          torch.arange(n_dst, device=device).repeat_interleave(deg)])
        csr = CSR.from_edge_index(ei, (n_src, n_dst))
        r = {"graph": "l2-resident-sources", "order": "uniform", "N": n_dst, "E": csr.num_edges,
             **measure(csr, F, meta["copy_GBps"], variants, rounds, sweep)}
        rows.append(r)
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
    return rows


COLUMNS = ["graph", "order", "F", "window", "auto", "global", "windowed", "csr", "coo", "cusparse", "x_vs_cusparse",
           "eff_GBps", "pct_copy", "bound_ms", "gather_GBps", "reorder_s", "auto_reason"]


def summarise(rows) -> str:
    lines = ["Times in ms (median of interleaved rounds, host-synchronised). x_vs_cusparse = cuSPARSE / auto.", ""]
    by = {(r["graph"], r["order"], r["F"]): r for r in rows}
    for (g, order, F), r in by.items():
        if order != "reordered":
            continue
        s, gen = by.get((g, "scrambled", F)), by.get((g, "generated", F))
        if s and gen:  # (--orders may leave either out)
            lines.append(f"- {g} F={F}: reordered / scrambled speed-up ours {s['auto'] / r['auto']:.2f}x, "
                         f"cuSPARSE {s['cusparse'] / r['cusparse']:.2f}x; ours vs cuSPARSE "
                         f"{r['x_vs_cusparse']:.2f}x (generated order: {gen['x_vs_cusparse']:.2f}x)")
    vs = [r["x_vs_cusparse"] for r in rows if r.get("x_vs_cusparse")]
    if vs:
        lines.append(f"- ours vs cuSPARSE over all rows: geomean {geomean(vs):.2f}x, min {min(vs):.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
