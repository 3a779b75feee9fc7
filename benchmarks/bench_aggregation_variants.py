"""Settings of the Triton multi-aggregation forward against one sum pass (CUDA only).

    python -m benchmarks.bench_aggregation_variants --out "$OUT"                # every graph, F = 32, 64, 128
    python -m benchmarks.bench_aggregation_variants --warm community-arxiv      # compile only (one graph)
    python -m benchmarks.bench_aggregation_variants --profile                   # one call of each, for ncu

["mean", "min", "max", "std"], no winners tracked (a forward without gradient), on bench_aggregation's
synthetic graphs and the realistic suite graphs (gnnfuse.graphs.SUITE: community, R-MAT). Each setting
(gnnfuse.triton.multi_aggregate.Tuning) is timed against the sum pass (gather_scatter.infer) of the
same graph in the same process, interleaved: round r runs every variant ``reps`` times back to back
between two CUDA events, in a rotating order; median over rounds, per call. No L2 flush: x stays
in L2 between calls where it fits, as in a layer's repeated calls. Every variant's output is
compared bitwise with the current kernel's. Then the public op (fused_gather_scatter, synchronised
after every call, as bench_aggregation's ``fwd`` columns) for sum and two settings, the host time
per call on a small graph, and the registers of each compiled kernel.

``--warm NAME`` runs each variant once on one graph (Triton's disk cache then holds its kernels:
benchmarks/gpu/aggregation_variants.sh compiles the graphs in parallel processes first).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

AGGRS = ["mean", "min", "max", "std"]
GRAPHS = ["arxiv-like (power-law)", "products-like (uniform)", "community-arxiv", "rmat-arxiv",
          "community-products", "rmat-products"]


def variants() -> dict[str, object]:
    from gnnfuse.triton.multi_aggregate import Tuning

    hints = dict(x_evict="evict_last", out_evict="evict_first")
    return {"current": Tuning(), "combine1": Tuning(combine_pieces=1), "seg512": Tuning(seg=512),
            "seg256": Tuning(seg=256), "out_first": Tuning(out_evict="evict_first"), "hints": Tuning(**hints),
            "hints_nreg64": Tuning(max_registers=64, **hints), "hints_sumtiles": Tuning(retile=False, **hints)}


WIDE = "current,combine1,seg512,seg256,out_first"  # --variants: at F=64
NARROW = "current,combine1,seg512"  # --side-variants: at F=32 and 128 (compile time)


def widths_of(wide: str = WIDE, narrow: str = NARROW) -> dict[int, list[str]]:
    """The variants timed at each width."""
    return {32: narrow.split(","), 64: wide.split(","), 128: narrow.split(",")}


def build_graph(name: str, device):
    import gnnfuse
    from benchmarks.bench_aggregation import cuda_graphs
    from gnnfuse.graphs import suite_graph

    if name in ("arxiv-like (power-law)", "products-like (uniform)"):
        ei, n = cuda_graphs(device)[name]
    else:
        ei, n = suite_graph(name, device=device)
    return gnnfuse.CSR.from_edge_index(ei, num_nodes=n), n


def calls(csr, x, names):
    from gnnfuse.reductions import CODES
    from gnnfuse.triton import gather_scatter as GS
    from gnnfuse.triton import multi_aggregate as M

    codes = [CODES[a] for a in AGGRS]
    table = variants()
    fns = {"sum": lambda: GS.infer(x, csr.rowptr, csr.col, None, "sum")}
    for v in names:
        fns[v] = lambda t=table[v]: M.forward(x, csr.rowptr, csr.col, None, codes, False, tuning=t)[0]
    return fns


def time_interleaved(fns, rounds: int, reps: int, max_seconds: float) -> dict[str, dict[str, float]]:
    names = list(fns)
    for name in names:
        fns[name]()
        fns[name]()
    torch.cuda.synchronize()
    samples = {n: [] for n in names}
    start = time.perf_counter()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            fn = fns[name]
            torch.cuda.synchronize()
            begin.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            samples[name].append(begin.elapsed_time(end) / reps)
        if time.perf_counter() - start > max_seconds and r >= 3:
            break
    return {n: {"ms": statistics.median(v), "min_ms": min(v), "n": len(v)} for n, v in samples.items()}


def warm(name: str, wide: str = WIDE, narrow: str = NARROW) -> None:
    device = torch.device("cuda")
    csr, n = build_graph(name, device)
    for F, names in widths_of(wide, narrow).items():
        x = torch.randn(n, F, device=device)
        for fn in calls(csr, x, names).values():
            fn()
        torch.cuda.synchronize()
        del x
    print("warm", name, "done", flush=True)


def registers() -> list[str]:
    """n_regs / n_spills of every compiled multi kernel, with its settings (from the fast launch's table)."""
    from gnnfuse.triton import multi_aggregate_kernels as K

    lines = []
    for kname in ("_multi_one_pass_kernel", "_multi_rowgroup_kernel", "_multi_csr_kernel"):
        fk = getattr(K, kname)
        for key, entry in getattr(fk, "_compiled", {}).items():
            if not entry:
                continue
            compiled, constexprs = entry
            meta = dict(key[2])
            lines.append(f"{kname} F-tile={meta.get('BLOCK_F')} rows={meta.get('ROWS')} block_e={meta.get('BLOCK_E')} "
                         f"warps={meta.get('num_warps')} x_evict={meta.get('X_EVICT')!r} "
                         f"out_evict={meta.get('OUT_EVICT')!r} maxnreg={meta.get('maxnreg', 0)} "
                         f"track={meta.get('TRACK')} -> n_regs={getattr(compiled, 'n_regs', '?')} "
                         f"n_spills={getattr(compiled, 'n_spills', '?')}")
    return lines


def public_op_rows(device, rounds, best: str) -> list[dict]:
    """fused_gather_scatter as bench_aggregation times it (synchronised per call): sum, multi4 with
    the current settings and with ``best``; and the host time per call (no sync) on a small graph."""
    import gnnfuse
    from benchmarks.common import bench_interleaved
    from gnnfuse.graphs import suite_graph
    from gnnfuse.triton import multi_aggregate as M

    rows = []
    table = variants()
    default = M.DEFAULT_TUNING

    def with_tuning(t, fn):
        def run():
            M.DEFAULT_TUNING = t
            try:
                return fn()
            finally:
                M.DEFAULT_TUNING = default
        return run

    for name in GRAPHS[:2]:
        csr, n = build_graph(name, device)
        x = torch.randn(n, 64, device=device)
        with torch.no_grad():
            t = bench_interleaved({
                "sum": lambda: gnnfuse.fused_gather_scatter(x, csr, "sum"),
                "multi4_current": with_tuning(table["current"], lambda: gnnfuse.fused_gather_scatter(x, csr, AGGRS)),
                "multi4_best": with_tuning(table[best], lambda: gnnfuse.fused_gather_scatter(x, csr, AGGRS)),
            }, device, rounds=rounds, max_seconds=6.0)
        row = {"graph": name, "F": 64, "best": best, **{f"{k}_ms": v["median_ms"] for k, v in t.items()}}
        row["current/sum"] = row["multi4_current_ms"] / row["sum_ms"]
        row["best/sum"] = row["multi4_best_ms"] / row["sum_ms"]
        rows.append(row)
        print("public", row, flush=True)
    ei, n = suite_graph("community-arxiv", scale=0.02, device=device)
    csr = gnnfuse.CSR.from_edge_index(ei, num_nodes=n)
    x = torch.randn(n, 64, device=device)
    host = {}
    with torch.no_grad():
        for label, fn in (("sum", lambda: gnnfuse.fused_gather_scatter(x, csr, "sum")),
                          ("multi4", lambda: gnnfuse.fused_gather_scatter(x, csr, AGGRS))):
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(200):
                    fn()
                best = min(best, (time.perf_counter() - t0) / 200 * 1e6)
                torch.cuda.synchronize()
            host[label] = best
    rows.append({"graph": f"community-arxiv x0.02 ({n} nodes): host us per call, no sync",
                 "F": 64, "sum_ms": host["sum"] / 1e3, "multi4_current_ms": host["multi4"] / 1e3})
    print("host us/call", host, flush=True)
    return rows


def profile() -> None:
    """One call each of sum and multi4 (current, combine1) on arxiv-like F=64 between
    cudaProfilerStart/Stop (run under ncu --profile-from-start off)."""
    device = torch.device("cuda")
    csr, n = build_graph(GRAPHS[0], device)
    x = torch.randn(n, 64, device=device)
    fns = calls(csr, x, ["current", "combine1"])
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def graph_rows(name, device, args) -> list[dict]:
    from gnnfuse import reference

    csr, n = build_graph(name, device)
    rows = []
    for F, names in widths_of(args.variants, args.side_variants).items():
        x = torch.randn(n, F, device=device)
        fns = calls(csr, x, names)
        ref = fns["current"]()
        same = {v: torch.equal(fns[v](), ref) for v in names}
        want = reference.multi_aggregate(x, csr.col, csr._row(), n, AGGRS)  # the current setting's error
        err = ((ref - want).abs().max() / want.abs().max()).item()
        del want
        t = time_interleaved(fns, args.rounds, args.reps, max_seconds=8.0)
        row = {"graph": name, "nodes": n, "edges": csr.num_edges, "F": F, "sum_ms": t["sum"]["ms"]}
        for v in names:
            row[f"{v}_ms"] = t[v]["ms"]
            row[f"{v}/sum"] = t[v]["ms"] / t["sum"]["ms"]
        row["bitwise"] = all(same.values()) or str(same)
        row["current max err / max"] = err
        rows.append(row)
        print(row, flush=True)
        del x, fns, ref
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", help="compile only, on this graph")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--graphs", default=",".join(GRAPHS))
    parser.add_argument("--variants", default=WIDE, help="settings timed at F=64 (names of variants())")
    parser.add_argument("--side-variants", default=NARROW, help="settings timed at F=32 and 128")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=90.0, help="skip the graphs left after this")
    parser.add_argument("--out", default=None)
    parser.add_argument("--official", action="store_true",
                        help="then bench_aggregation's multi table with the fastest setting as the default")
    args = parser.parse_args(argv)
    if args.warm:
        return warm(args.warm, args.variants, args.side_variants)
    if args.profile:
        return profile()
    from benchmarks.common import device_label, geomean, machine, save_results

    device = torch.device("cuda")
    start = time.perf_counter()
    rows = []
    for name in args.graphs.split(","):
        if time.perf_counter() - start > args.max_seconds:
            rows.append({"graph": name, "error": "skipped: time"})
            continue
        try:
            rows += graph_rows(name, device, args)
        except Exception as exc:  # a row, not a crash
            rows.append({"graph": name, "error": f"{type(exc).__name__}: {exc}"[:200]})
        torch.cuda.empty_cache()
    names = list(dict.fromkeys(args.variants.split(",") + args.side_variants.split(",")))
    meta = dict(machine(device), load_average_1_5_15min=os.getloadavg(), rounds=args.rounds, reps=args.reps)
    for v in names:
        meta[f"geomean {v}/sum"] = geomean([r.get(f"{v}/sum") for r in rows])
    columns = ["graph", "nodes", "edges", "F", "sum_ms"] + [f"{v}_ms" for v in names] + \
              [f"{v}/sum" for v in names] + ["bitwise", "current max err / max", "error"]
    notes = "Registers (n_regs, n_spills) of the compiled multi kernels:\n\n" + \
            "\n".join(f"- {line}" for line in registers())
    # the fastest setting at F=64 (every variant runs there)
    best = min(args.variants.split(","), key=lambda v: geomean([r.get(f"{v}/sum") for r in rows if r.get("F") == 64]))
    meta["fastest at F=64"] = best
    save_results(f"aggregation-variants_{device_label(device)}", meta, rows, columns, args.out, notes)
    public = public_op_rows(device, rounds=9, best=best)
    save_results(f"aggregation-variants-public_{device_label(device)}", meta, public,
                 ["graph", "F", "best", "sum_ms", "multi4_current_ms", "multi4_best_ms", "current/sum", "best/sum"],
                 args.out)
    print("\n".join(registers()))
    for r in rows:
        print(r.get("graph"), r.get("F"), {k: round(v, 3) for k, v in r.items() if k.endswith("/sum")})
    if args.official:  # bench_aggregation's multi table with the fastest setting at F=64 as the default
        from benchmarks import bench_aggregation
        from gnnfuse.triton import multi_aggregate as M

        M.DEFAULT_TUNING = variants()[best]
        print("official table with", best, M.DEFAULT_TUNING, flush=True)
        bench_aggregation.main(["--device", "cuda", "--parts", "multi", "--rounds", "7", "--out", args.out or "."])


if __name__ == "__main__":
    main()
