"""Benchmark of gnnfuse.structured_scatter_add (density-map building) against its anchors.

    python -m benchmarks.bench_structured_scatter --device cpu --out benchmarks/results
    python -m benchmarks.bench_structured_scatter --device cuda --threads 1,2,4,8,16 --out "$OUT"

Rows (float32 values, int32 indices unless noted), all measured in one run:
  * ``gnnfuse``      the op (CPU: partitioned C++ kernel; CUDA: Triton), check_bounds=True;
  * ``gnnfuse_nocheck`` the same with check_bounds=False (CUDA: no host sync);
  * ``gnnfuse_fresh_order`` (CUDA) the op with what it caches on wa/wbwc (atom order, bounds-check
                     pass) dropped before every call: what a caller passing new wa/wbwc tensors
                     each call pays (an argsort where the map exceeds half of L2, and the check's sync);
  * ``index_add``    ``torch.zeros(map_size).index_add_(0, flat_index, values)`` on the explicit
                     int64 flat indices (built beforehand, not timed);
  * ``compiled``     torch.compile of the same maths from wa/wbwc (the flat index built inside the
                     compiled function, so Inductor may fuse it into the scatter);
  * ``torch_scatter`` torch_scatter.scatter_add on the explicit flat indices, if installed;
  * ``seed``         (CPU) the seed design: equal output ranges per thread, atom-level skip, every
                     element of every overlapping atom range-checked (C++ baseline in the same .cpp);
  * ``serial``       (CPU) a plain serial loop without checks (C++);
  * ``backward`` / ``index_select`` the gradient (structured gather) and its explicit-index anchor.
CPU thread scaling (``--threads``): gnnfuse and seed on sorted atoms, for each thread count, and
a control (``torch.add`` in place on two tensors of the cube's size) showing how the machine itself scales.
Atoms sit at random corners of a periodic NxNxN map; "sorted" orders them by their 1-D corner
index (x-major), as a map builder sorting atoms by centre would.
One results file pair (.json + .md) per run, named with the device and the date.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os

import torch

import gnnfuse
from benchmarks.common import bench, device_label, geomean, machine, save_results
from gnnfuse._build import load_extension
from gnnfuse.csr import clear_cache

# (atoms, box edge, map edge); the second is the reference point (seed: 18 ms on 2 threads)
CPU_CONFIGS = [(2_000, 8, 128), (20_000, 12, 160), (20_000, 16, 256), (100_000, 8, 320)]
CUDA_CONFIGS = CPU_CONFIGS + [(100_000, 12, 320), (100_000, 16, 320)]
SCALING_CONFIG = (20_000, 12, 160)


def make_atoms(C: int, n: int, grid: int, *, sort: bool, seed: int = 0, dtype=torch.float32,
               index_dtype=torch.int32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x0, y0, z0 = (torch.randint(0, grid, (C,), generator=g) for _ in range(3))
    if sort:
        order = torch.argsort(x0 * grid * grid + y0 * grid + z0)
        x0, y0, z0 = x0[order], y0[order], z0[order]
    r = torch.arange(n)
    wa = ((x0[:, None] + r) % grid) * grid * grid
    wbwc = (((y0[:, None] + r) % grid) * grid)[:, :, None] + ((z0[:, None] + r) % grid)[:, None, :]
    gd = torch.Generator(device).manual_seed(seed)
    cube = torch.rand(C, n, n, n, generator=gd, dtype=torch.float32, device=device).to(dtype)
    return cube, wa.to(index_dtype).to(device), wbwc.to(index_dtype).to(device), grid**3


def implicit_index_add(cube, wa, wbwc, map_size):
    """The maths in plain PyTorch: the user's alternative, for torch.compile."""
    flat = (wa.long()[:, :, None, None] + wbwc.long()[:, None, :, :]).reshape(-1)
    return torch.zeros(map_size, dtype=cube.dtype, device=cube.device).index_add_(0, flat, cube.reshape(-1))


def _row(config, sort, method, timing, **extra):
    C, n, grid = config
    return {"atoms": C, "box": f"{n}^3", "map": f"{grid}^3", "sorted": sort, "method": method,
            "median_ms": timing["median_ms"], "min_ms": timing["min_ms"], **extra}


def run_config(config, sort, device, rows, timing_args):
    C, n, grid = config
    cube, wa, wbwc, M = make_atoms(C, n, grid, sort=sort, device=device)
    flat = (wa.long()[:, :, None, None] + wbwc.long()[:, None, :, :]).reshape(-1)
    values = cube.reshape(-1)
    threads = torch.get_num_threads() if device == "cpu" else None
    ext = load_extension("density") if device == "cpu" else None

    def t(fn):
        return bench(fn, device, **timing_args)

    def fresh_order():
        clear_cache()
        return gnnfuse.structured_scatter_add(cube, wa, wbwc, M)

    torch._dynamo.reset()  # a fresh compile cache per configuration (no recompile limit)
    compiled = torch.compile(implicit_index_add, dynamic=False)
    res = {
        "gnnfuse": t(lambda: gnnfuse.structured_scatter_add(cube, wa, wbwc, M)),
        "gnnfuse_nocheck": t(lambda: gnnfuse.structured_scatter_add(cube, wa, wbwc, M, check_bounds=False)),
        **({"gnnfuse_fresh_order": t(fresh_order)} if device == "cuda" else {}),
        "index_add": t(lambda: torch.zeros(M, device=device).index_add_(0, flat, values)),
        "compiled": t(lambda: compiled(cube, wa, wbwc, M)),
    }
    try:
        import torch_scatter
    except ImportError:
        pass
    else:
        res["torch_scatter"] = t(lambda: torch_scatter.scatter_add(values, flat, dim=0, dim_size=M))
    if device == "cpu":
        res["seed"] = t(lambda: ext.structured_scatter_seed_baseline(cube, wa, wbwc, M))
        res["serial"] = t(lambda: ext.structured_scatter_serial_baseline(cube, wa, wbwc, M))
    grad = torch.rand(M, device=device)
    res["backward"] = t(lambda: torch.ops.gnnfuse.structured_gather(grad, wa, wbwc, n, n, False))
    res["index_select"] = t(lambda: grad.index_select(0, flat).view(cube.shape))
    ours = res["gnnfuse"]["median_ms"]
    for method, timing in res.items():
        extra = {"threads": threads, "vs_index_add": res["index_add"]["median_ms"] / timing["median_ms"],
                 "vs_compiled": res["compiled"]["median_ms"] / timing["median_ms"]}
        if "seed" in res:
            extra["vs_seed"] = res["seed"]["median_ms"] / timing["median_ms"]
        if method in ("backward", "index_select"):
            extra["vs_index_add"] = res["index_select"]["median_ms"] / timing["median_ms"]
            extra.pop("vs_seed", None)
            extra.pop("vs_compiled")
        rows.append(_row(config, sort, method, timing, **extra))
    print(f"{device} C={C} box={n}^3 map={grid}^3 sorted={sort}: gnnfuse {ours:.2f} ms, "
          + ", ".join(f"{k} {v['median_ms']:.2f}" for k, v in res.items() if k != "gnnfuse"), flush=True)
    del cube, wa, wbwc, flat, values, grad


def run_scaling(thread_counts, rows, timing_args):
    """CPU thread scaling on sorted atoms (gnnfuse and the seed design)."""
    cube, wa, wbwc, M = make_atoms(*SCALING_CONFIG, sort=True)
    ext = load_extension("density")
    # control: a plain parallel torch op of similar size, to tell the machine's own scaling
    # (memory bandwidth, other load) from the kernel's
    a, b = torch.rand(cube.numel()), torch.rand(cube.numel())
    before = torch.get_num_threads()
    base = {}
    try:
        for n in thread_counts:
            torch.set_num_threads(n)
            for method, fn in (("gnnfuse", lambda: gnnfuse.structured_scatter_add(cube, wa, wbwc, M)),
                               ("seed", lambda: ext.structured_scatter_seed_baseline(cube, wa, wbwc, M)),
                               ("control_torch_add", lambda: torch.add(a, b, out=a))):
                timing = bench(fn, "cpu", **timing_args)
                base.setdefault(method, timing["median_ms"] * thread_counts[0])
                speedup = base[method] / timing["median_ms"]
                rows.append(_row(SCALING_CONFIG, True, f"scaling:{method}", timing, threads=n,
                                 speedup=speedup, efficiency=speedup / n))
                print(f"threads={n} {method}: {timing['median_ms']:.2f} ms, efficiency {speedup / n:.2f}", flush=True)
    finally:
        torch.set_num_threads(before)


def summarize(rows):
    def ratio(method, key):
        return geomean([r[key] for r in rows if r["method"] == method and r.get(key)])

    lines = [f"- geomean speedup of gnnfuse over index_add_: {ratio('gnnfuse', 'vs_index_add'):.2f}x "
             f"(check_bounds=False: {ratio('gnnfuse_nocheck', 'vs_index_add'):.2f}x)",
             f"- geomean speedup of gnnfuse over torch.compile: {ratio('gnnfuse', 'vs_compiled'):.2f}x",
             f"- geomean speedup of backward (structured gather) over index_select: "
             f"{ratio('backward', 'vs_index_add'):.2f}x"]
    if any(r["method"] == "gnnfuse_fresh_order" for r in rows):
        lines.append(f"- geomean speedup over index_add_ when the atom order is rebuilt every call: "
                     f"{ratio('gnnfuse_fresh_order', 'vs_index_add'):.2f}x")
    if any(r["method"] == "seed" for r in rows):
        lines.append(f"- geomean speedup of gnnfuse over the seed design: {ratio('gnnfuse', 'vs_seed'):.2f}x")
        ref = [r for r in rows if (r["atoms"], r["box"], r["map"], r["sorted"]) == (20_000, "12^3", "160^3", True)
               and r["method"] in ("gnnfuse", "seed", "serial")]
        if ref:
            lines.append("- reference point (C=20000, 12^3, 160^3, sorted, float32, int32): "
                         + ", ".join(f"{r['method']} {r['median_ms']:.2f} ms" for r in ref))
    for r in rows:
        if r["method"].startswith("scaling:") and r["threads"] != 1:
            lines.append(f"- scaling {r['method'][8:]}, {r['threads']} threads: efficiency {r['efficiency']:.2f}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", default=None, help="results directory (default benchmarks/results)")
    p.add_argument("--threads", default=None,
                   help="CPU thread counts for the scaling rows, e.g. 1,2,4,8,16 (default on cpu: 1..all cores; "
                        "on cuda: none)")
    p.add_argument("--configs", default=None, help="subset, e.g. 2000x8x128,20000x12x160")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--max-seconds", type=float, default=1.5)
    args = p.parse_args(argv)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device")
    # a longer warm-up on GPU: sub-millisecond rows timed right after building a config's data read
    # up to 1.6x slow in one H200 run (clocks settling), against interleaved A/B timings
    timing_args = {"repeat": args.repeat, "max_seconds": args.max_seconds, "warmup": 2,
                   "min_warmup_seconds": 0.3 if device == "cuda" else 0.05}
    configs = CUDA_CONFIGS if device == "cuda" else CPU_CONFIGS
    if args.configs:
        configs = [tuple(int(v) for v in c.split("x")) for c in args.configs.split(",")]
    if args.threads:
        thread_counts = [int(v) for v in args.threads.split(",")]
    elif device == "cpu":
        cores = os.cpu_count() or 1
        thread_counts = sorted({1, cores} | {2**k for k in range(1, 6) if 2**k < cores})
    else:
        thread_counts = []

    label = device_label(device)
    meta = machine(device)
    meta["load_average"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    rows: list[dict] = []
    columns = ["atoms", "box", "map", "sorted", "method", "threads", "median_ms", "min_ms", "vs_index_add",
               "vs_compiled", "vs_seed", "speedup", "efficiency"]
    name = f"structured_scatter_{label}_{dt.date.today().isoformat()}"

    def save(final=False):  # after every step, so a run cut short still leaves its results
        meta["load_average_end"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
        meta["complete"] = final
        notes = ("float32 values, int32 indices. vs_index_add / vs_compiled / vs_seed: time of the anchor / "
                 "time of the row "
                 "(backward rows: vs index_select). Scaling rows: speedup over the first thread count, "
                 "efficiency = speedup / threads.\n\n" + summarize(rows))
        return save_results(name, meta, rows, columns, out_dir=args.out, notes=notes), notes

    if thread_counts:
        run_scaling(thread_counts, rows, timing_args)
        save()
    for config in configs:
        for sort in (True, False):
            run_config(config, sort, device, rows, timing_args)
        save()
    path, notes = save(final=True)
    print(notes)
    print(f"wrote {path} and {path.with_suffix('.json')}")


if __name__ == "__main__":
    main()
