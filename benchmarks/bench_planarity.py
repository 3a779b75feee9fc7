"""Benchmark of gnnfuse.planarity_nll (forward + backward) against the eager pure-torch reference.

Protein-sized inputs: 5K, 50K, 500K atoms on a random-walk chain, planes of 4-12 consecutive-ish
atoms (P ~ A/8, atoms shared between planes), one bucket per plane size.

    python -m benchmarks.bench_planarity --device cpu|cuda [--out DIR] [--dtypes float32,float64]

Columns: ref_ms (eager reference, forward + autograd backward), ours_ms (gnnfuse, forward +
backward), speedup = ref_ms / ours_ms; fwd_ms / bwd_ms = gnnfuse's forward alone and
(forward + backward) - forward; bwd/fwd their ratio; compiled_ms = torch.compile of the
reference (blank when skipped: see the notes).
"""
from __future__ import annotations

import argparse
import time

import torch

import gnnfuse
from gnnfuse import reference

from .common import bench, device_label, geomean, machine, save_results

SIZES = (5_000, 50_000, 500_000)
WINDOW = 16  # a plane's atoms lie within this many consecutive atom ids


def make_problem(num_atoms: int, dtype: torch.dtype, device: str, seed: int = 0, index_dtype=torch.int64):
    g = torch.Generator().manual_seed(seed)
    steps = torch.randn(num_atoms, 3, generator=g, dtype=torch.float64)
    steps = 1.5 * steps / steps.norm(dim=1, keepdim=True)
    xyz = steps.cumsum(0).to(dtype).to(device)
    num_planes = num_atoms // 8
    sizes = torch.randint(4, 13, (num_planes,), generator=g)
    groups = []
    for n in range(4, 13):
        P = int((sizes == n).sum())
        if P == 0:
            continue
        starts = torch.randint(0, num_atoms - WINDOW, (P, 1), generator=g)
        offsets = torch.rand(P, WINDOW, generator=g).argsort(dim=1)[:, :n].sort(dim=1).values
        idx = (starts + offsets).to(index_dtype).to(device)
        sig = (0.01 + 0.02 * torch.rand(P, generator=g, dtype=torch.float64)).to(dtype).to(device)
        groups.append((idx, sig))
    return xyz, groups


def _fwd_bwd(fn, xyz, groups):
    def run():
        x = xyz.detach().requires_grad_(True)
        loss = fn(x, groups)
        loss.backward()
        return x.grad

    return run


def _fwd(fn, xyz, groups):
    def run():
        with torch.no_grad():
            return fn(xyz, groups)

    return run


def _kernel_timings(xyz, groups, device, max_s) -> tuple[float, float]:
    from gnnfuse.ops.planarity import BACKWARD, FORWARD

    backend = "cpu" if device == "cpu" else "triton"
    fwd_kernel, bwd_kernel = FORWARD.kernels[backend], BACKWARD.kernels[backend]
    indices, sigmas = [i for i, _ in groups], [s for _, s in groups]
    _, planes, coef = fwd_kernel(xyz, indices, sigmas)
    grad = torch.ones((), dtype=xyz.dtype, device=xyz.device)
    f = bench(lambda: fwd_kernel(xyz, indices, sigmas), device, max_seconds=max_s, repeat=15)["median_ms"]
    b = bench(lambda: bwd_kernel(grad, xyz, indices, sigmas, planes, coef, False), device, max_seconds=max_s,
              repeat=15)["median_ms"]
    return f, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", default=None, help="results directory (default benchmarks/results)")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile of the reference")
    args = parser.parse_args()
    device = args.device
    ours = lambda x, gr: gnnfuse.planarity_nll(x, gr)  # noqa: E731
    compiled = None if args.no_compile else torch.compile(reference.planarity_nll, dynamic=False)
    compile_note = ("torch.compile of the reference: skipped (--no-compile; on CPU its first call took 88 s for "
                    "the 5K problem and then ran ~100x slower than eager)") if compiled is None else ""
    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for num_atoms in map(int, args.sizes.split(",")):
            xyz, groups = make_problem(num_atoms, dtype, device)
            num_planes = sum(int(i.shape[0]) for i, _ in groups)
            # correctness guard: the benchmark only reports numbers for matching results
            x1, x2 = xyz.detach().requires_grad_(True), xyz.detach().requires_grad_(True)
            l1, l2 = gnnfuse.planarity_nll(x1, groups), reference.planarity_nll(x2, groups)
            l1.backward()
            l2.backward()
            rtol = 1e-4 if dtype == torch.float32 else 1e-9
            assert torch.allclose(l1.double(), l2.double(), rtol=rtol), (l1, l2)
            scale = x2.grad.abs().max()
            assert ((x1.grad - x2.grad).abs().max() <= 1e-3 * scale + 1e-6), "gradients disagree"
            max_s = 3.0 if num_atoms >= 500_000 else 2.0
            ref = bench(_fwd_bwd(reference.planarity_nll, xyz, groups), device, max_seconds=max_s)
            ours_fb = bench(_fwd_bwd(ours, xyz, groups), device, max_seconds=max_s, repeat=15)
            ours_f = bench(_fwd(ours, xyz, groups), device, max_seconds=max_s, repeat=15)
            row = {
                "atoms": num_atoms, "planes": num_planes, "dtype": dtype_name,
                "ref_ms": ref["median_ms"], "ours_ms": ours_fb["median_ms"],
                "speedup": ref["median_ms"] / ours_fb["median_ms"],
                "fwd_ms": ours_f["median_ms"],
                "bwd_ms": max(ours_fb["median_ms"] - ours_f["median_ms"], 0.0),
            }
            row["bwd/fwd"] = row["bwd_ms"] / row["fwd_ms"]
            # the kernels alone (the launchers the op calls), without autograd and the public checks
            kf, kb = _kernel_timings(xyz, groups, device, max_s)
            row.update(fwd_kernel_ms=kf, bwd_kernel_ms=kb, kernel_bwd_over_fwd=kb / kf)
            # what any autograd op pays here: forward + backward of a trivial differentiable function
            trivial = lambda x, _groups: (x * 1.0).sum()  # noqa: E731
            row["autograd_floor_ms"] = bench(_fwd_bwd(trivial, xyz, groups), device, max_seconds=max_s,
                                             repeat=15)["median_ms"]
            # best-of-N too: on a shared, oversubscribed CPU the medians include preemption
            row["speedup_min"] = ref["min_ms"] / ours_fb["min_ms"]
            row["fwd_min_ms"] = ours_f["min_ms"]
            row["bwd_min_ms"] = max(ours_fb["min_ms"] - ours_f["min_ms"], 0.0)
            if compiled is not None:
                try:
                    t0 = time.perf_counter()
                    _fwd_bwd(compiled, xyz, groups)()
                    compile_s = time.perf_counter() - t0
                    comp = bench(_fwd_bwd(compiled, xyz, groups), device, max_seconds=max_s)
                    row["compiled_ms"] = comp["median_ms"]
                    row["speedup_vs_compiled"] = comp["median_ms"] / ours_fb["median_ms"]
                    row["compile_s"] = compile_s
                except Exception as exc:  # noqa: BLE001  (report and carry on without it)
                    compile_note = f"torch.compile of the reference failed, skipped: {type(exc).__name__}: {exc}"[:300]
                    compiled = None
            rows.append(row)
            print(row, flush=True)
    fb = [r["speedup"] for r in rows]
    notes = (
        "Forward + backward (autograd backward from a scalar loss), median wall time. "
        f"Geomean speedup over the eager reference: {geomean(fb):.2f}x. "
        "bwd_ms = (fwd+bwd) - fwd-only; *_min columns use the best sample instead of the median. "
        "*_kernel_ms: the forward and backward launchers alone (no autograd, no argument checks). "
        "autograd_floor_ms: forward + backward of (x * 1.0).sum(), the fixed cost of any autograd call. "
        + compile_note
    )
    meta = machine(device)
    meta["device"] = device
    path = save_results(f"planarity_{device_label(device)}", meta, rows,
                        ["atoms", "planes", "dtype", "ref_ms", "compiled_ms", "ours_ms", "speedup",
                         "speedup_vs_compiled", "fwd_ms", "bwd_ms", "bwd/fwd", "speedup_min", "fwd_min_ms",
                         "bwd_min_ms", "fwd_kernel_ms", "bwd_kernel_ms", "kernel_bwd_over_fwd", "autograd_floor_ms"], args.out, notes)
    print(path.read_text())


if __name__ == "__main__":
    main()
