"""Timing, machine description and result files shared by every benchmark script.

Every timer reports the median and the interquartile range (``iqr_ms``: 75th minus 25th percentile
of the samples) next to the minimum. Result files round every number to 3 significant digits.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import math
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from gnnfuse import config

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def bench(fn: Callable[[], object], device: torch.device | str = "cpu", *, warmup: int = 2, repeat: int = 7,
          max_seconds: float = 5.0, min_warmup_seconds: float = 0.05, min_sample_ms: float = 1.0) -> dict[str, float]:
    """Median and min wall time (ms) of ``fn()``; CUDA events on GPU.

    Warm-up runs at least ``warmup`` calls and ``min_warmup_seconds`` (microsecond-scale ops need
    many calls before caches, allocator and thread pool settle). A sample times a batch of calls
    long enough to last ``min_sample_ms`` (timer resolution), divided back to one call. Repeats
    stop early, with at least 3 samples, once ``max_seconds`` of timed calls are spent.
    """
    device = torch.device(device)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as timeit does: a collection landing in one sample skews microsecond-scale calls
    try:
        return _bench(fn, device, warmup, repeat, max_seconds, min_warmup_seconds, min_sample_ms)
    finally:
        if gc_was_enabled:
            gc.enable()


def _bench(fn, device, warmup, repeat, max_seconds, min_warmup_seconds, min_sample_ms) -> dict[str, float]:
    calls, start = 0, time.perf_counter()
    while calls < warmup or (time.perf_counter() - start < min_warmup_seconds and calls < 10_000):
        fn()
        calls += 1
    synchronize(device)
    per_call_ms = (time.perf_counter() - start) * 1e3 / calls
    if per_call_ms < 100:  # size batches on calls after the warm-up: its first call may have compiled
        start = time.perf_counter()
        for _ in range(3):
            fn()
        synchronize(device)
        per_call_ms = (time.perf_counter() - start) * 1e3 / 3
    batch = max(1, min(1000, int(min_sample_ms / max(per_call_ms, 1e-6))))
    samples: list[float] = []
    spent = 0.0
    for _ in range(repeat):
        if device.type == "cuda":
            start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start_ev.record()
            for _ in range(batch):
                fn()
            end_ev.record()
            end_ev.synchronize()
            ms = start_ev.elapsed_time(end_ev) / batch
        else:
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            ms = (time.perf_counter() - t0) * 1e3 / batch
        samples.append(ms)
        spent += ms * batch / 1e3
        if spent > max_seconds and len(samples) >= 3:
            break
    return {**summarize(samples), "calls_per_sample": batch}


def bench_interleaved(fns: dict[str, Callable[[], object]], device: torch.device | str = "cpu", *, rounds: int = 15,
                      max_seconds: float = 10.0) -> dict[str, dict[str, float]]:
    """Median and min wall time (ms) of each of ``fns``, timed in turns: round r runs every
    function once, in a rotating order. On a shared machine whose speed drifts (other tenants,
    frequency), every variant then sees the same conditions, so ratios stay fair where timing one
    variant after another would credit whichever ran in a quiet spell. For calls of milliseconds
    (one call per sample); each function is called once beforehand as warm-up."""
    device = torch.device(device)
    names = list(fns)
    for name in names:
        fns[name]()
    synchronize(device)
    samples: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            synchronize(device)
            t0 = time.perf_counter()
            fns[name]()
            synchronize(device)
            samples[name].append((time.perf_counter() - t0) * 1e3)
        if time.perf_counter() - start > max_seconds and r >= 2:
            break
    return {n: summarize(v) for n, v in samples.items()}


def summarize(samples_ms: Sequence[float]) -> dict[str, float]:
    """Median, interquartile range, min and count of timing samples (ms)."""
    q1, _, q3 = statistics.quantiles(samples_ms, n=4) if len(samples_ms) > 1 else (samples_ms[0],) * 3
    return {"median_ms": statistics.median(samples_ms), "iqr_ms": q3 - q1, "min_ms": min(samples_ms),
            "samples": len(samples_ms)}


def round_sig(value: float, digits: int = 3) -> float:
    """``value`` rounded to ``digits`` significant digits (0, inf and nan unchanged)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def _rounded(obj: object) -> object:
    """Every float inside ``obj`` (dicts, lists) rounded to 3 significant digits."""
    if isinstance(obj, float):
        return round_sig(obj)
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_rounded(v) for v in obj]
    return obj


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: torch.device | str = "cpu") -> dict[str, object]:
    """What the numbers were measured on."""
    device = torch.device(device)
    info: dict[str, object] = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": config.get("OMP_NUM_THREADS") or "unset",
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def device_label(device: torch.device | str = "cpu") -> str:
    """Short file-name label, e.g. 'cpu-2t' or 'h100'."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device).lower()
        for gpu in ("h200", "h100", "a100", "l4", "t4"):
            if gpu in name:
                return gpu
        return "cuda"
    return f"cpu-{torch.get_num_threads()}t"


def markdown_table(rows: Sequence[dict[str, object]], columns: Sequence[str]) -> str:
    def fmt(v: object) -> str:
        if isinstance(v, float):  # 3 significant digits, without an exponent below 1e6
            return f"{v:.3g}" if not math.isfinite(v) or abs(v) < 100 or abs(v) >= 1e6 else f"{round_sig(v):.0f}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def save_results(name: str, meta: dict[str, object], rows: list[dict[str, object]], columns: Sequence[str],
                 out_dir: Path | str | None = None, notes: str = "") -> Path:
    """Writes <out_dir>/<name>.json (rows and metadata, numbers to 3 significant digits) and <name>.md
    (table). Returns the .md path."""
    out = Path(out_dir) if out_dir else RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(_rounded({"meta": meta, "rows": rows}), indent=1, default=str))
    header = f"# {name}\n\n" + "\n".join(f"- {k}: {v}" for k, v in meta.items()) + "\n\n"
    md = out / f"{name}.md"
    md.write_text(header + (notes + "\n\n" if notes else "") + markdown_table(rows, columns) + "\n")
    return md


def geomean(values: Sequence[float]) -> float:
    vals = [v for v in values if v and v > 0]
    return statistics.geometric_mean(vals) if vals else float("nan")


def cpu_real_and_power_law_graphs(power_law_name: str) -> dict[str, tuple[torch.Tensor, int]]:
    """Cora and Facebook when their files are found, plus a seeded power-law graph of 60K nodes and
    1.2M edges named ``power_law_name``: {name: (edge_index, num_nodes)}."""
    from gnnfuse.datasets import load_facebook_edge_index, load_planetoid
    from gnnfuse.testing import random_graph

    graphs = {}
    cora = load_planetoid("Cora")
    if cora is not None:
        graphs["Cora"] = (cora.edge_index, cora.num_nodes)
    fb = load_facebook_edge_index()
    if fb is not None:
        graphs["Facebook"] = fb
    graphs[power_law_name] = (random_graph(60_000, 60_000, 1_200_000, seed=0, power_law=True), 60_000)
    return graphs


def peak_mb(fn: Callable[[], object], device: torch.device) -> float | str:
    """Peak CUDA memory (MB) one call of ``fn`` adds; "n/a" on CPU."""
    if device.type != "cuda":
        return "n/a"
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def time_training_steps(row: dict, steps: dict[str, Callable[[], object]], device: torch.device, rounds: int,
                        spread: str = "min_ms") -> dict:
    """Fills ``row`` for the "gnnfuse" and "pyg" training steps: each one's peak memory ("OOM" drops it),
    then their interleaved median time and ``spread`` (a key of bench_interleaved's summary), and
    pyg / gnnfuse as "speedup". Returns bench_interleaved's result."""
    steps = dict(steps)
    for label, fn in list(steps.items()):
        try:
            row[f"{label}_peak_MB"] = peak_mb(fn, device)
        except torch.OutOfMemoryError:
            row[f"{label}_peak_MB"] = "OOM"
            steps.pop(label)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # outside the except block: its traceback no longer holds the tensors
    times = bench_interleaved(steps, device, rounds=rounds, max_seconds=20.0)
    for label, t in times.items():
        row[f"{label}_ms"], row[f"{label}_{spread}"] = t["median_ms"], t[spread]
    if "pyg" in times:
        row["speedup"] = times["pyg"]["median_ms"] / times["gnnfuse"]["median_ms"]
    return times


def step_benchmark_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every training-step benchmark takes: device, result folder, CPU threads, rounds
    (see :func:`benchmark_device`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (CPU runs)")
    parser.add_argument("--rounds", type=int, default=10)
    return parser


def benchmark_device(args: argparse.Namespace) -> torch.device:
    """The device of a :func:`step_benchmark_parser` run, with torch's CPU threads set for CPU runs."""
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    return device


def transpose_weights_looked_up():
    """A context in which the GCN backward looks its edge weights up through the transpose's positions on
    every call, as before the transpose-order copy was cached: the "before" of that change's A/B."""
    from unittest import mock

    from gnnfuse.ops import gather_scatter

    return mock.patch.object(gather_scatter, "_weight_in_transpose_order", lambda weight, t_pos: None)
