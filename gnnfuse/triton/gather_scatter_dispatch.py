"""Dispatch heuristic and config builders for the Triton gather-scatter kernels.

Kept apart from the kernels (gather_scatter.py): this module imports no Triton, so
``gnnfuse.explain`` can report the plan without compiling anything.

Kernels:
  * ``coo``    sorted-COO segmented (edge blocks; local segmented scan over runs of equal
               target; relaxed atomics only for runs that cross a block edge). sum/mean only.
  * ``csr``    CSR row-parallel, atomic-free and deterministic; rows longer than ``seg``
               edges are split over several programs whose partials a second pass combines in
               order, so hub rows of power-law graphs do not serialise. All reductions.
  * ``atomic`` fully-atomic baseline (one atomic per edge and feature); benchmarks only.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

KERNELS = ("coo", "csr", "atomic")
# sum/mean on graphs whose average in-degree is below this go to the sorted-COO kernel
# (short rows waste most of a CSR program's edge tile); set from benchmarks/bench_gpu.py.
# (H100 run 1: COO beat CSR at F=32 on arxiv-like (avg 6.9) and hub-stress (avg 2), and at F=64
# only on hub-stress; at F>=128 CSR won everywhere.)
COO_MAX_AVG_DEGREE = 12.0
COO_MAX_F = 32
COO_MAX_F_VERY_SPARSE = 64  # avg in-degree below 4 (mostly empty rows)


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


@dataclass(frozen=True)
class Plan:
    kernel: str  # "coo" | "csr" | "atomic"
    block_e: int  # edges per tile
    block_f: int  # features per tile
    seg: int  # csr: longest row piece one program owns (multiple of block_e)
    num_warps: int
    deterministic: bool
    reason: str

    def describe(self) -> str:
        name = {
            "coo": "sorted-COO segmented (edge blocks, segmented scan, relaxed atomics at block-edge runs)",
            "csr": "CSR row-parallel, hub rows split into pieces + ordered second pass (atomic-free)",
            "atomic": "fully-atomic COO baseline (one atomic per edge and feature)",
        }[self.kernel]
        return (f"gnnfuse/triton/gather_scatter.py: {name}; BLOCK_E={self.block_e} BLOCK_F={self.block_f} "
                f"SEG={self.seg} num_warps={self.num_warps}; {self.reason}")


def _block_f(F: int, itemsize: int) -> int:
    cap = 64 if itemsize >= 8 else (128 if itemsize == 4 else 256)
    return max(16, min(_pow2(F), cap))


def _warps(block_e: int, block_f: int) -> int:
    return max(1, min(8, block_e * block_f // 1024))


def csr_configs(F: int, avg_degree: float, itemsize: int) -> list[dict]:
    """Candidate tile configs of the CSR kernel, best guess first (GNNFUSE_AUTOTUNE=1 times them all)."""
    bf = _block_f(F, itemsize)
    max_e = max(16, 4096 // bf)
    # First guess, from the H100 sweep in benchmarks/results/gpu_h100_2026-11-21.md (sum, F=128/256):
    # short rows (products-like, avg 25) liked small edge tiles (BLOCK_E=16, 2-4 warps) and, at
    # F>=256, one 256-wide feature tile; long rows (reddit-like, avg 492) liked BLOCK_E=32 with
    # 2048-edge pieces. Narrow features keep the run-1/run-2 default (BLOCK_E ~ avg degree, 1024).
    first_e = min(max_e, 64, max(16, _pow2(int(avg_degree))))
    first = (first_e, bf, 1024)
    if bf * itemsize >= 512:  # >= 128 float32 features per tile
        if avg_degree < 64:
            wide = F >= 2 * bf and bf * itemsize < 1024
            first = (16, 2 * bf if wide else bf, 1024)
        else:
            first = (32, bf, 2048)
    cands = [first, (first_e, bf, 1024), (32, bf, 2048), (16, bf, 1024), (64, bf, 1024), (32, bf, 512)]
    if bf < F and bf * itemsize < 1024:
        cands.append((16, 2 * bf, 1024))
    out = []
    for be, f, seg in cands:
        be = min(be, max(16, 8192 // f))
        for warps in (_warps(be, f), 2 * _warps(be, f)):
            cfg = dict(block_e=be, block_f=f, seg=max(seg, be), num_warps=min(warps, 8))
            if cfg not in out:
                out.append(cfg)
    return out


def coo_configs(F: int, itemsize: int) -> list[dict]:
    """Candidate tile configs of the sorted-COO kernel, best guess first."""
    bf = _block_f(F, itemsize)
    out = []
    for be in (64, 32, 128):
        be = max(16, min(be, 8192 // bf))
        cfg = dict(block_e=be, block_f=bf, seg=0, num_warps=_warps(be, bf))
        if cfg not in out:
            out.append(cfg)
    return out


def choose(reduce: str, num_dst: int, num_edges: int, F: int, dtype: torch.dtype,
           deterministic: bool | None = None, kernel: str | None = None) -> Plan:
    """Picks the kernel and tiles. ``deterministic`` defaults to
    ``torch.are_deterministic_algorithms_enabled()``; it forces the atomic-free CSR kernel.
    ``kernel`` (or env ``GNNFUSE_TRITON_KERNEL``) forces one, where the reduction allows it."""
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    forced = kernel or os.environ.get("GNNFUSE_TRITON_KERNEL") or None
    return _choose(reduce, num_dst, num_edges, F, dtype, deterministic, forced)


@functools.lru_cache(maxsize=1024)  # a pure function of small values: the plan is not rebuilt per call
def _choose(reduce: str, num_dst: int, num_edges: int, F: int, dtype: torch.dtype, deterministic: bool,
            forced: str | None) -> Plan:
    itemsize = dtype.itemsize
    avg = num_edges / max(num_dst, 1)
    if forced is not None and forced not in KERNELS:
        raise ValueError(f"GNNFUSE_TRITON_KERNEL / kernel must be one of {KERNELS}; got {forced!r}")
    if deterministic:
        name, reason = "csr", "deterministic algorithms requested: atomic-free CSR"
    elif reduce not in ("sum", "mean"):
        name, reason = "csr", f"reduce={reduce} needs ordered winners/products: CSR"
    elif forced is not None:
        name, reason = forced, f"forced kernel={forced}"
    elif avg < COO_MAX_AVG_DEGREE and (F <= COO_MAX_F or (avg < 4 and F <= COO_MAX_F_VERY_SPARSE)):
        name, reason = "coo", f"avg in-degree {avg:.1f}, F={F}: short rows, edge-balanced COO"
    else:
        name, reason = "csr", f"avg in-degree {avg:.1f}, F={F}: CSR with hub splitting"
    cfg = (csr_configs(F, avg, itemsize) if name == "csr" else coo_configs(F, itemsize))[0]
    return Plan(kernel=name, deterministic=name == "csr", reason=reason, **cfg)
