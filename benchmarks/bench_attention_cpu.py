"""The CPU attention kernels alone (csrc/attention.cpp, pair_attention.cpp): forward and backward of
GAT, GATv2 and TransformerConv's dot-product attention against our sum gather-scatter of the same
total width (heads x F), optionally against a baseline build of other kernel sources, interleaved.

    python -m benchmarks.bench_attention_cpu                                   # Cora, Facebook, 8 x 8
    python -m benchmarks.bench_attention_cpu --baseline /path/to/old/csrc      # before/after in one process
    python -m benchmarks.bench_attention_cpu --threads 2 --clock wall --tag loaded

The C++ ops are called directly (no autograd, no Python layer), on the CSR and transpose the
layers would build, with PyG's defaults: GAT and GATv2 with self loops, the dot product without.
``--baseline DIR`` (and ``--new-src DIR`` for the "new" side) builds DIR's attention extension (attention.cpp, edge_softmax.cpp,
pair_attention.cpp and DIR's headers) once into the build cache under its own name, with the
project's compile flags, e.g. a ``git archive`` of main's csrc/: every round then times each kernel
of both builds and the sum, in a rotating order (benchmarks.common-style interleaving), so a shared
machine's drift hits all alike. ``--clock cpu`` (default with one thread) is the calling thread's
CPU time (time.thread_time: at one thread the kernels run on the calling thread), less sensitive to
other tenants than wall time; ``--clock wall`` is for several threads. Outputs of the two builds are
compared once (max abs difference) so a faster baseline-breaking variant is noticed.
``--floors`` also times what reading two source rows per edge costs (the dot product reads k_j and
v_j): the sum over rows of twice the width (one 2 x heads x F row per edge: k and v interleaved) and
two sums of the width (two separate rows per edge), as ratios to the sum. ``--cache warm`` / ``cold``
time every call with its own inputs in the caches / with none of them (time_interleaved): the default
back-to-back rotation leaves a large graph's sum and forwards reading partly evicted inputs.
"""
from __future__ import annotations

import argparse
import hashlib
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import machine, save_results

LAYERS = ("GAT", "GATv2", "Transformer")
SLOPE = 0.2


def build_from(csrc: Path, role: str = "baseline"):
    """The attention extension compiled from another csrc directory (cached by its content)."""
    from torch.utils import cpp_extension

    from gnnfuse._build import cache_root
    from gnnfuse._build_cache import compile_flags

    files = sorted(csrc.glob("*.h")) + [csrc / n for n in ("attention.cpp", "edge_softmax.cpp", "pair_attention.cpp")]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + f.read_bytes())
    cflags, ldflags = compile_flags()
    for flag in cflags:
        digest.update(flag.encode())
    name = f"gnnfuse_attention_{role}_{digest.hexdigest()[:12]}"
    directory = cache_root() / name
    directory.mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(name=name, sources=[str(f) for f in files if f.suffix == ".cpp"],
                              extra_cflags=cflags, extra_ldflags=ldflags, build_directory=str(directory))


def graph_parts(edge_index: torch.Tensor, nodes: int):
    from gnnfuse.csr import csr_for_edge_index, transpose_parts_of

    csr = csr_for_edge_index(edge_index, nodes, nodes)
    t_rowptr, t_col, t_pos = transpose_parts_of(csr.rowptr, csr.col, nodes)
    return csr, (t_rowptr, t_col, t_pos)


def kernel_calls(ext, layer: str, csr, transpose, nodes: int, heads: int, width: int, dropout: float):
    """(forward, backward) closures of one build's kernels for one layer, on fixed seeded inputs."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(nodes, heads, width, generator=g)
    grad = torch.randn(nodes, heads, width, generator=g)
    rowptr, col = csr.rowptr, csr.col
    if layer == "GAT":
        a_src, a_dst = torch.randn(nodes, heads, generator=g), torch.randn(nodes, heads, generator=g)
        args = (x, a_src, a_dst, None, None, rowptr, col)
        scalars = (True, SLOPE, dropout, 7)
        out, m, z = ext.gat_forward(*args, *scalars)
        needs = [True, True, True, False, False]
        return (lambda: ext.gat_forward(*args, *scalars),
                lambda: ext.gat_backward(grad, out, m, z, *args, *transpose, *scalars, needs))
    q = torch.randn(nodes, heads, width, generator=g)
    v = x if layer == "GATv2" else torch.randn(nodes, heads, width, generator=g)  # GATv2: the keys are the values
    att = torch.randn(heads, width, generator=g) if layer == "GATv2" else None
    gatv2 = layer == "GATv2"
    scalars = (gatv2, gatv2, SLOPE, 1.0 / math.sqrt(width), dropout, 7)  # (self_loops, gatv2, ...)
    args = (q, x, v, att, None, rowptr, col, None)
    out, m, z = ext.pair_forward(*args, *scalars)
    needs = [True, True, True, gatv2, False]
    return (lambda: ext.pair_forward(*args, *scalars),
            lambda: ext.pair_backward(grad, out, m, z, *args, *transpose, *scalars, needs))


def floor_calls(csr, flat: torch.Tensor) -> dict:
    """The two ways of reading two source rows of width heads x F per edge, as sums (--floors)."""
    import gnnfuse

    g = torch.Generator().manual_seed(1)
    wide = torch.randn(flat.shape[0], 2 * flat.shape[1], generator=g)  # k and v interleaved: one row per edge
    other = torch.randn(flat.shape, generator=g)  # a second tensor: two rows per edge
    return {"sum_2x": lambda: gnnfuse.fused_gather_scatter(wide, csr, "sum"),
            "two_sums": lambda: (gnnfuse.fused_gather_scatter(flat, csr, "sum"),
                                 gnnfuse.fused_gather_scatter(other, csr, "sum"))}


def source_commit() -> str:
    """The checkout's commit (with '+changes' when its csrc/ or benchmarks/ differ from it), or 'unknown'."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        status = ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "csrc", "benchmarks"]
        dirty = subprocess.run(status, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def max_difference(a, b) -> float:
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    return max((float((u - w).abs().max()) for u, w in zip(a, b) if u.numel()), default=0.0)


# Bytes written between calls with --cache cold: several times any last-level cache of these machines.
COLD_BYTES = 256 << 20


def time_interleaved(fns: dict, rounds: int, clock: str, cache: str = "mixed") -> dict[str, list[float]]:
    """Samples (ms) of each of ``fns``, timed in turns in a rotating order. ``cache`` sets what the
    caches hold when a timed call starts: "mixed", whatever the call before left (the calls run back
    to back: a large graph's inputs are partly evicted by the other calls' reads); "warm", the same
    call's inputs and output (an untimed call of it just before: inputs that fit in the caches are
    there, as right after the projection that wrote them); "cold", nothing of them (COLD_BYTES written
    just before: every read comes from memory)."""
    now = time.thread_time if clock == "cpu" else time.perf_counter
    for fn in fns.values():
        fn()
    flush = torch.empty(COLD_BYTES // 4) if cache == "cold" else None
    names = list(fns)
    samples = {n: [] for n in names}
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            if cache == "warm":
                fns[name]()
            elif flush is not None:
                flush.fill_(float(r + k))
            t0 = now()
            fns[name]()
            samples[name].append((now() - t0) * 1e3)
    return samples


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a csrc/ directory to build and time as 'old'")
    parser.add_argument("--new-src", type=Path, help="a csrc/ directory to time as 'new' (default: this checkout's)")
    parser.add_argument("--graphs", default="Cora,Facebook")
    parser.add_argument("--layers", default=",".join(LAYERS))
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), help="default: cpu at one thread, else wall")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--forward-only", action="store_true", help="time the forwards and the sum only")
    parser.add_argument("--cache", choices=("mixed", "warm", "cold"), default="mixed",
                        help="what the caches hold when a timed call starts (time_interleaved)")
    parser.add_argument("--floors", action="store_true",
                        help="also time a sum of twice the width and two sums (reading two rows per edge)")
    parser.add_argument("--tag", default="", help="suffix of the result name, e.g. loaded")
    parser.add_argument("--out", type=Path, help="directory for the result files (none: print only)")
    parser.add_argument("--notes", default="", help="text for the result file, above the table")
    args = parser.parse_args(argv)
    clock = args.clock or ("cpu" if args.threads == 1 else "wall")
    torch.set_num_threads(args.threads)

    import gnnfuse
    from gnnfuse._build import load_extension
    from benchmarks.common import cpu_real_and_power_law_graphs

    builds = {"new": build_from(args.new_src, "candidate") if args.new_src else load_extension("attention")}
    if args.baseline:
        builds["old"] = build_from(args.baseline)
    graphs = {k: v for k, v in cpu_real_and_power_law_graphs("power-law 60K").items()
              if k in args.graphs.split(",")}
    load_before = os.getloadavg()
    rows = []
    for gname, (edge_index, nodes) in graphs.items():
        csr, transpose = graph_parts(edge_index, nodes)
        flat = torch.randn(nodes, args.heads * args.width)
        for layer in args.layers.split(","):
            fns, results = {}, {}
            for tag, ext in builds.items():
                fwd, bwd = kernel_calls(ext, layer, csr, transpose, nodes, args.heads, args.width, args.dropout)
                fns[f"fwd_{tag}"] = fwd
                if not args.forward_only:
                    fns[f"bwd_{tag}"] = bwd
                results[tag] = (fwd(), None if args.forward_only else bwd())
            fns["sum"] = lambda: gnnfuse.fused_gather_scatter(flat, csr, "sum")
            if args.floors:
                fns.update(floor_calls(csr, flat))
            samples = time_interleaved(fns, args.rounds, clock, args.cache)
            row = {"layer": layer, "graph": gname, "edges": int(edge_index.shape[1]), "HxF": f"{args.heads}x{args.width}",
                   "dropout": args.dropout}
            med = {n: statistics.median(s) for n, s in samples.items()}
            row["sum_ms"] = med["sum"]
            for tag in builds:
                row[f"fwd_{tag}_ms"] = med[f"fwd_{tag}"]
                if not args.forward_only:
                    row[f"bwd_{tag}_ms"] = med[f"bwd_{tag}"]
                row[f"fwd_{tag}/sum"] = med[f"fwd_{tag}"] / med["sum"]
                q1, _, q3 = statistics.quantiles(samples[f"fwd_{tag}"], n=4)
                row[f"fwd_{tag}_iqr"] = q3 - q1
            if "old" in builds:
                row["fwd_speedup"] = med["fwd_old"] / med["fwd_new"]
                row["max_diff_fwd"] = max_difference(results["new"][0], results["old"][0])
                if not args.forward_only:
                    row["bwd_speedup"] = med["bwd_old"] / med["bwd_new"]
                    row["max_diff_bwd"] = max_difference(results["new"][1], results["old"][1])
            if args.floors:
                row["sum2x/sum"] = med["sum_2x"] / med["sum"]
                row["two_sums/sum"] = med["two_sums"] / med["sum"]
            rows.append(row)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **machine("cpu"),
            "command": " ".join(["python -m benchmarks.bench_attention_cpu", *(sys.argv[1:] if argv is None else argv)]),
            "commit": source_commit(),
            "threads": args.threads, "clock": "thread CPU time" if clock == "cpu" else "wall",
            "rounds": args.rounds, "cache": args.cache, "baseline": str(args.baseline) if args.baseline else "none",
            "load_average_before": tuple(round(v, 2) for v in load_before),
            "load_average_after": tuple(round(v, 2) for v in os.getloadavg())}
    columns = list(rows[0]) if rows else []
    name = f"attention-cpu-kernels_cpu-{args.threads}t_{time.strftime('%Y-%m-%d')}" + (f"_{args.tag}" if args.tag else "")
    if args.out:
        print(save_results(name, meta, rows, columns, args.out, notes=args.notes))
    return rows


if __name__ == "__main__":
    main()
