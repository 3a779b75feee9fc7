"""One entry point for every benchmark suite, then the plots.

    python -m benchmarks --suite cpu|gpu|e2e|structured|planarity|all [--out DIR] [--quick] [--device cpu|cuda]
                         [extra arguments passed to the suite's script]

Without arguments it prints this help: a full run takes hours. Start with --quick.

    python -m benchmarks --suite cpu --out benchmarks/results/cpu-2t-2026-11-21
    python -m benchmarks --suite gpu --out benchmarks/results/h100-2026-11-21
    python -m benchmarks --suite e2e --device cuda --quick --out /tmp/smoke
    python -m benchmarks --suite cpu --quick -- --widths 32 --reductions sum    # extra args after --

Suites (each is also runnable alone as ``python -m benchmarks.bench_<name>``):
  cpu         benchmarks/bench_cpu.py                fused_gather_scatter vs sparse.mm, index_add_,
                                                     torch.compile, torch_scatter (CPU)
  gpu         benchmarks/bench_gpu.py                Triton kernels vs cuSPARSE, index_add_, torch.compile
  e2e         benchmarks/bench_e2e.py                training epoch of GCN/SAGE, gnnfuse.nn vs stock PyG
  reorder     benchmarks/bench_reorder.py            gnnfuse.reorder: cost, saving per forward / epoch, break-even
  minibatch   benchmarks/bench_minibatch.py          sampled-batch SAGE: sampler, graph prep, fused vs stock step
  structured  benchmarks/bench_structured_scatter.py structured_scatter_add vs index_add_
  planarity   benchmarks/bench_planarity.py          planarity_nll vs the pure-torch reference
  aggregation benchmarks/bench_aggregation.py        several reductions in one pass, gnnfuse.scatter vs
                                                     scatter_reduce (and torch_scatter), PNAConv vs PyG
  all         cpu, e2e, structured, planarity on the chosen device (+ gpu when CUDA is available)

``--out DIR`` chooses where results go. Without it they go into the source tree's record of results,
benchmarks/results/<device label>-<date> (e.g. cpu-2t-2026-11-21, h100-2026-11-21): that is for
maintainers recording a run (see CONTRIBUTING.md); anyone else should pass --out.
``--quick`` runs each suite on small inputs (a smoke test; not numbers to quote). After the suites,
benchmarks/plots.py draws PNGs next to the JSON files.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib
import inspect
import sys
import time
from pathlib import Path

import torch

SUITES = {
    "cpu": "benchmarks.bench_cpu",
    "gpu": "benchmarks.bench_gpu",
    "e2e": "benchmarks.bench_e2e",
    "reorder": "benchmarks.bench_reorder",
    "minibatch": "benchmarks.bench_minibatch",
    "structured": "benchmarks.bench_structured_scatter",
    "planarity": "benchmarks.bench_planarity",
    "aggregation": "benchmarks.bench_aggregation",
}
# --quick for each suite: (flag, value) pairs, matching the scripts' parsers; a flag the script does not
# know (read from its source) is left out, so a script that changes its CLI still gets a valid command.
QUICK_ARGS = {
    "cpu": [("--quick", None), ("--max-seconds", "0.5")],
    "gpu": [("--graphs", "rfc-uniform,arxiv-like"), ("--widths", "32,128"), ("--budget-s", "60")],
    "e2e": [("--quick", None), ("--max-seconds", "0.3")],
    "reorder": [("--quick", None)],
    "minibatch": [("--scale", "0.002"), ("--batches", "2"), ("--rounds", "2")],
    "structured": [("--configs", "2000x8x128"), ("--threads", "1"), ("--repeat", "3"), ("--max-seconds", "0.3")],
    "planarity": [("--sizes", "5000"), ("--dtypes", "float32"), ("--no-compile", None)],
    "aggregation": [("--quick", None)],
}


def _accepts(module, flag: str) -> bool:
    """Whether the suite's argument parser knows `flag` (read from its source: parsers are built in main)."""
    try:
        return f'"{flag}"' in inspect.getsource(module)
    except (OSError, TypeError):
        return False


def suite_argv(suite: str, out: Path, device: str, quick: bool, extra: list[str], module) -> list[str]:
    argv = ["--out", str(out)]
    if suite in ("e2e", "reorder", "structured", "planarity", "minibatch", "aggregation"):
        argv += ["--device", device]
    if quick:
        pairs = [("--quick", None)] if suite == "gpu" and _accepts(module, "--quick") else QUICK_ARGS[suite]
        for flag, value in pairs:
            if _accepts(module, flag):
                argv += [flag] if value is None else [flag, value]
    return argv + extra


def run_suite(suite: str, argv: list[str]) -> None:
    """Calls the suite's main with argv (main(argv) when it takes one, else through sys.argv)."""
    module = importlib.import_module(SUITES[suite])
    main = module.main
    if inspect.signature(main).parameters:
        main(argv)
        return
    saved = sys.argv
    sys.argv = [module.__file__] + argv
    try:
        main()
    finally:
        sys.argv = saved


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", required=True, choices=[*SUITES, "all"])
    p.add_argument("--out", default=None, help="results directory (default: the repository's record, "
                                               "benchmarks/results/<device>-<date>)")
    p.add_argument("--device", default=None, choices=["cpu", "cuda"],
                   help="for e2e / structured / planarity (default: cuda for --suite gpu, else cpu)")
    p.add_argument("--quick", action="store_true", help="small inputs: a smoke run, not numbers to quote")
    p.add_argument("--no-plots", action="store_true")
    if not (sys.argv[1:] if argv is None else argv):
        p.print_help()
        return 0
    args, extra = p.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]

    device = args.device or ("cuda" if args.suite == "gpu" else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("CUDA suites need a GPU: torch.cuda.is_available() is False")
    if args.suite == "all":
        suites = ["cpu", "e2e", "structured", "planarity"] if device == "cpu" else ["gpu", "e2e", "structured",
                                                                                      "planarity"]
        if device == "cpu" and torch.cuda.is_available():
            suites.append("gpu")
    else:
        suites = [args.suite]
    if args.out:
        out = Path(args.out)
    else:
        from benchmarks.common import RESULTS_DIR, device_label

        label = device_label("cuda" if "gpu" in suites or device == "cuda" else "cpu")
        out = RESULTS_DIR / f"{label}-{dt.date.today().isoformat()}{'-quick' if args.quick else ''}"
        print(f"results go to {out} (the repository's record; --out DIR to write elsewhere)", flush=True)
    out.mkdir(parents=True, exist_ok=True)

    failed = []
    for suite in suites:
        module = importlib.import_module(SUITES[suite])
        suite_args = suite_argv(suite, out, device, args.quick, extra if len(suites) == 1 else [], module)
        print(f"=== {suite}: {SUITES[suite]} {' '.join(suite_args)}", flush=True)
        t0 = time.perf_counter()
        try:
            run_suite(suite, suite_args)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - one suite failing must not lose the others
            if isinstance(exc, SystemExit) and exc.code in (0, None):
                pass
            else:
                print(f"=== {suite} FAILED: {type(exc).__name__}: {exc}", flush=True)
                failed.append(suite)
        print(f"=== {suite}: {time.perf_counter() - t0:.0f} s", flush=True)

    if not args.no_plots:
        from benchmarks.plots import plot_dir

        for png in plot_dir(out):
            print(f"plot: {png}")
    print(f"results in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
