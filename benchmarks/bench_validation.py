"""Cost of validating graphs at the op boundary (CPU), against its two goals.

Goal 1: a repeated call with an unchanged graph pays at most ~1 us for its check.
  * checked            ``CSR.checked()`` of an unchanged hand-built CSR (what every op call pays:
                       one stamp comparison of rowptr and col);
  * perm read          ``csr.perm`` of that CSR (what an op with per-edge inputs, e.g. edge
                       weights, pays on top: one stamp comparison of perm);
  * cache hit          the lookup of a raw edge_index's cached CSR (``csr_for_edge_index``);
  * checked, Python stamps   ``checked()`` with the stamps taken and compared in Python (what a
                       graph gets while gnnfuse's C++ graph kernels are not loaded, e.g. on CUDA);
                       on CPU tensors they compare two fingerprints, which a CUDA tensor's stamp has
                       not: '... no fingerprints (as on CUDA)' is the same without them;
  * x.add(1)           on a 3-element tensor: a same-process anchor of Python/dispatch speed.
  Each sample times a batch of calls (timeit); median and IQR of the samples, in wall time and in
  the calling thread's CPU time (``time.thread_time``: on a shared machine the wall time also counts
  the spells in which other jobs held the core; the goal is judged on the CPU time).

Goal 2: the first-call check of a hand-built CSR costs at most ~10% of building the CSR.
  * build              ``CSR.from_edge_index`` (the sort a hand-built CSR replaces);
  * first check        what an op's first use of a hand-built CSR runs: the layout of all three
                       tensors and the values of rowptr and col, plus their stamp
                       (``gnnfuse.csr_checks.check_structure``: one C++ call on CPU); the goal's ratio;
  * perm check         what the first read of ``perm`` adds (ops with per-edge inputs only): the
                       permutation check of the sort's own perm (shuffled on arxiv-like; Cora's
                       edge_index is sorted by target, so its perm is the identity), plus its stamp;
                       '+ perm / build' is the goal's ratio for an op that reads perm;
  * validate           ``CSR.validate()``: everything, on demand (first check + perm check);
  * validate, identity perm   the same with ``perm = arange(E)`` (as ``from_scipy`` builds it),
                       which skips the permutation bitmap;
  * aminmax            ``torch.aminmax(col)``, one parallel torch pass over the edges: what any
                       parallel pass costs on the machine at that moment.
  Timed interleaved (round-robin, wall time), median and IQR of the rounds; the goal is judged on
  the medians, and the ratios of the fastest rounds are given beside them (on a shared machine the
  rounds in which no other job took a core).

Graphs: Cora (or a Cora-sized synthetic graph when the data is absent) and arxiv-like (1.17M
edges). Takes about 30 s for ``--threads 1,2`` (a minute on a loaded 2-core VM). Writes validation_<device>_<date>[_tag].{json,md}
into --out (default benchmarks/results). Example, the two thread counts the results report:

    python -m benchmarks.bench_validation --threads 1,2 --tag quiet --notes "quiet machine"
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import statistics
import time
import timeit
from unittest import mock

import torch

import gnnfuse
from gnnfuse import _tensor_cache, csr_checks
from gnnfuse.csr import csr_for_edge_index
from gnnfuse.graphs import random_graph

from .common import _rounded, bench_interleaved, machine, markdown_table, save_results
from .graphs import real_edge_index, synthetic_edge_index

HOT_PATH_GOAL_US = 1.0
FIRST_CALL_GOAL = 0.10  # first check / build


def graphs() -> dict[str, tuple[torch.Tensor, int]]:
    cora = real_edge_index("Cora")
    name = "Cora"
    if cora is None:
        cora, name = (random_graph(2708, 2708, 10556, seed=0), 2708), "Cora-sized (synthetic)"
    return {name: cora, "arxiv-like": synthetic_edge_index("arxiv-like")}


def per_call_us(fn, timer, number: int = 20000, repeat: int = 15) -> dict[str, float]:
    """Median and IQR (us per call) over ``repeat`` samples of ``number`` calls each."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        samples = [t / number * 1e6 for t in timeit.repeat(fn, number=number, repeat=repeat, timer=timer)]
    finally:
        if gc_was_enabled:
            gc.enable()
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return {"median": statistics.median(samples), "iqr": q3 - q1}


def hand_built(built: gnnfuse.CSR, n: int, perm: torch.Tensor | None = None) -> gnnfuse.CSR:
    """A hand-built copy of ``built`` (own tensors, never checked)."""
    return gnnfuse.CSR(built.rowptr.clone(), built.col.clone(), built.perm.clone() if perm is None else perm, n)


def python_stamped(built: gnnfuse.CSR, n: int, fingerprints: bool = True) -> gnnfuse.CSR:
    """A checked hand-built CSR whose stamps were taken in Python (as without the C++ kernels);
    without ``fingerprints``, as the stamp of a CUDA tensor is (no memory is read)."""
    no_fingerprints = mock.patch.object(_tensor_cache, "fingerprint_view", lambda t: None)
    with _tensor_cache.python_stamps(), (contextlib.nullcontext() if fingerprints else no_fingerprints):
        csr = hand_built(built, n).checked()
        csr.perm  # noqa: B018  (the first read checks and stamps it)
    return csr


def hot_path_rows(name: str, edge_index: torch.Tensor, n: int) -> list[dict[str, object]]:
    built = gnnfuse.CSR.from_edge_index(edge_index, n)
    hand = hand_built(built, n).checked()
    hand.perm  # noqa: B018  (checked on first read)
    in_python = python_stamped(built, n)
    in_python_bare = python_stamped(built, n, fingerprints=False)
    csr_for_edge_index(edge_index, n, n)
    x = torch.ones(3)
    calls = {"checked (hand-built CSR)": hand.checked,
             "perm read (per-edge inputs)": lambda: hand.perm,
             "cache hit (raw edge_index)": lambda: csr_for_edge_index(edge_index, n, n),
             "checked, Python stamps": in_python.checked,
             "checked, Python stamps, no fingerprints (as on CUDA)": in_python_bare.checked,
             "x.add(1) (anchor)": lambda: x.add(1)}
    rows = []
    for what, fn in calls.items():
        wall, cpu = per_call_us(fn, time.perf_counter), per_call_us(fn, time.thread_time)
        judged = what.startswith(("checked (", "cache hit"))
        rows.append({"threads": torch.get_num_threads(), "graph": name, "call": what,
                     "cpu us": cpu["median"], "cpu IQR us": cpu["iqr"], "wall us": wall["median"],
                     "wall IQR us": wall["iqr"],
                     "goal": "" if not judged else f"<= {HOT_PATH_GOAL_US:g} us: "
                     + ("met" if cpu["median"] <= HOT_PATH_GOAL_US else "not met")})
    return rows


def first_call_row(name: str, edge_index: torch.Tensor, n: int, rounds: int) -> dict[str, object]:
    built = gnnfuse.CSR.from_edge_index(edge_index, n)
    shuffled = hand_built(built, n)
    identity = hand_built(built, n, torch.arange(built.num_edges, dtype=built.perm.dtype))
    times = bench_interleaved({"build": lambda: gnnfuse.CSR.from_edge_index(edge_index, n),
                               "first": lambda: csr_checks.check_structure(shuffled),
                               "perm": lambda: csr_checks.checked_perm(shuffled),
                               "validate": shuffled.validate, "validate_identity": identity.validate,
                               "aminmax": lambda: torch.aminmax(built.col)}, rounds=rounds, max_seconds=60)
    ms = {k: v["median_ms"] for k, v in times.items()}
    ratio, with_perm = ms["first"] / ms["build"], (ms["first"] + ms["perm"]) / ms["build"]
    fastest = {k: v["min_ms"] for k, v in times.items()}  # on a loaded machine, the rounds that ran undisturbed
    return {"threads": torch.get_num_threads(), "graph": name, "edges": edge_index.shape[1],
            "build ms": ms["build"], "build IQR": times["build"]["iqr_ms"],
            "first check ms": ms["first"], "first check IQR": times["first"]["iqr_ms"],
            "first check / build": f"{ratio:.1%}",
            "perm check ms": ms["perm"], "+ perm / build": f"{with_perm:.1%}",
            "fastest rounds: first / build": f"{fastest['first'] / fastest['build']:.1%}",
            "fastest rounds: + perm / build": f"{(fastest['first'] + fastest['perm']) / fastest['build']:.1%}",
            "validate ms": ms["validate"], "validate, identity perm ms": ms["validate_identity"],
            "aminmax ms": ms["aminmax"],
            "goal": f"<= {FIRST_CALL_GOAL:.0%}: " + ("met" if ratio <= FIRST_CALL_GOAL else "not met"),
            "goal, + perm": f"<= {FIRST_CALL_GOAL:.0%}: " + ("met" if with_perm <= FIRST_CALL_GOAL else "not met")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0], epilog=__doc__.split("\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default=str(torch.get_num_threads()), help="comma-separated thread counts")
    ap.add_argument("--rounds", type=int, default=21, help="interleaved rounds of the first-call timing")
    ap.add_argument("--out", default=None, help="result folder (default benchmarks/results)")
    ap.add_argument("--tag", default="", help="suffix of the result files' name")
    ap.add_argument("--notes", default="", help="a line about the machine's state, written into the result")
    args = ap.parse_args(argv)
    loaded = graphs()
    hot, first = [], []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for name, (edge_index, n) in loaded.items():
            hot += hot_path_rows(name, edge_index, n)
            first.append(first_call_row(name, edge_index, n, args.rounds))
    meta = {**machine("cpu"), "threads": args.threads}
    first_columns = ["threads", "graph", "edges", "build ms", "build IQR", "first check ms", "first check IQR",
                     "first check / build", "perm check ms", "+ perm / build", "fastest rounds: first / build",
                     "fastest rounds: + perm / build", "validate ms",
                     "validate, identity perm ms", "aminmax ms", "goal", "goal, + perm"]
    hot_columns = ["threads", "graph", "call", "cpu us", "cpu IQR us", "wall us", "wall IQR us", "goal"]

    notes = (args.notes + "\n\n" if args.notes else "") + (
        "Goal 2, first-call check (interleaved rounds, wall time; IQR = 75th - 25th percentile; "
        "'+ perm / build': an op that also reads perm):\n\n"
        + markdown_table(first, first_columns)
        + "\n\nGoal 1, repeated call with an unchanged graph (per call; cpu = the thread's CPU time):")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    label = "cpu-" + "-".join(args.threads.split(",")) + "t"
    name = f"validation_{label}_{stamp}" + (f"_{args.tag}" if args.tag else "")
    md = save_results(name, meta, hot, hot_columns, args.out, notes=notes)
    json_path = md.with_suffix(".json")  # both tables in the JSON
    json_path.write_text(json.dumps(_rounded({"meta": meta, "hot_path": hot, "first_call": first}), indent=1,
                                    default=str))
    print(md.read_text())


if __name__ == "__main__":
    main()
