"""Cost of validating graphs at the op boundary (CPU).

For Cora (or a Cora-sized synthetic graph when the data is absent) and a ~1M-edge graph:
  * build      CSR.from_edge_index (the sort the cache saves);
  * validate   the full check of a hand-built CSR on first use (CSR.validate: rowptr, col range,
               perm a permutation), which must stay a small fraction of the build;
  * checked    a repeated call's check of an unchanged CSR (stamp comparison), in microseconds,
               next to ``x.add(1)`` on a 3-element tensor as a same-process anchor of Python/dispatch speed;
  * cache hit  the lookup of a raw edge_index's cached CSR;
  * aminmax    torch.aminmax(col), one parallel torch reduction over the edges: an anchor for what
               any parallel pass costs on the machine at that moment.
Build and validate are timed interleaved (median of rounds); the microsecond calls with timeit.

    python -m benchmarks.bench_validation
"""
from __future__ import annotations

import timeit

import torch

import gnnfuse
from gnnfuse.csr import csr_for_edge_index

from .common import bench_interleaved, device_label, machine
from .graphs import real_edge_index, synthetic_edge_index


def _us(fn, number: int = 20000, repeat: int = 15) -> tuple[float, float]:
    times = sorted(t / number * 1e6 for t in timeit.repeat(fn, number=number, repeat=repeat))
    return times[len(times) // 2], times[0]


def graphs() -> dict[str, tuple[torch.Tensor, int]]:
    cora = real_edge_index("Cora")
    if cora is None:
        g = torch.Generator().manual_seed(0)
        cora = (torch.randint(0, 2708, (2, 10556), generator=g), 2708)
    return {"Cora" if real_edge_index("Cora") is not None else "Cora-sized (synthetic)": cora,
            "arxiv-like (1.17M edges)": synthetic_edge_index("arxiv-like")}


def main() -> None:
    info = machine("cpu")
    print(f"# validation cost, {device_label('cpu')}, torch {torch.__version__}, {info.get('date', '')}")
    print("| graph | nodes | edges | build ms | validate ms | validate / build | aminmax(col) ms "
          "| checked us (median, min) | cache hit us | x.add(1) us |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, (edge_index, n) in graphs().items():
        built = gnnfuse.CSR.from_edge_index(edge_index, n)
        hand = gnnfuse.CSR(built.rowptr.clone(), built.col.clone(), built.perm.clone(), n)
        times = bench_interleaved({"build": lambda: gnnfuse.CSR.from_edge_index(edge_index, n),
                                   "validate": hand.validate, "aminmax": lambda: torch.aminmax(hand.col)}, rounds=21)
        build, validate = times["build"]["median_ms"], times["validate"]["median_ms"]
        aminmax = times["aminmax"]["median_ms"]
        checked = _us(hand.checked)
        csr_for_edge_index(edge_index, n, n)
        hit = _us(lambda: csr_for_edge_index(edge_index, n, n))
        x = torch.ones(3)
        anchor = _us(lambda: x.add(1))
        print(f"| {name} | {n} | {edge_index.shape[1]} | {build:.3f} | {validate:.3f} | {validate / build:.1%} "
              f"| {aminmax:.3f} | {checked[0]:.2f}, {checked[1]:.2f} | {hit[0]:.2f} | {anchor[0]:.2f} |")


if __name__ == "__main__":
    main()
