"""Dispatch heuristic and config builders for the Triton gather-scatter kernels.

Kept apart from the kernels (gather_scatter_fwd_kernels.py, gather_scatter_bwd_kernels.py): this
module imports no Triton, so ``gnnfuse.explain`` can report the plan without compiling anything.

Kernels:
  * ``coo``    sorted-COO segmented (edge blocks; local segmented scan over runs of equal
               target; relaxed atomics only for runs that cross a block edge). sum/mean only.
  * ``csr``    CSR row-parallel, atomic-free and deterministic; rows longer than ``seg``
               edges are split over several programs whose partials a second pass combines in
               order, so hub rows of power-law graphs do not serialise. All reductions.
  * ``hybrid`` rows of at most ``short_max`` edges go to a row-group kernel (``group_rows`` rows
               per program, one edge of each per step, rows sorted by degree); longer rows to
               the CSR kernel. Atomic-free and deterministic; both kernels record max/min winners.
               ``one_pass``: both in one launch, window by window (bitwise the same result).
  * ``atomic`` fully-atomic baseline (one atomic per edge and feature); benchmarks only.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .. import config
from ._grid import next_power_of_2

KERNELS = ("coo", "csr", "hybrid", "atomic")


@dataclass(frozen=True)
class Plan:
    kernel: str  # "coo" | "csr" | "hybrid" | "atomic"
    block_e: int  # edges per tile
    block_f: int  # features per tile
    seg: int  # csr: longest row piece one program owns (multiple of block_e)
    num_warps: int
    deterministic: bool
    reason: str
    group_rows: int = 16  # hybrid: short rows per program
    short_max: int = 0  # hybrid: rows with at most this many edges take the row-group kernel
    group_warps: int = 4  # hybrid: warps of the row-group kernel (num_warps is the CSR part's)
    group_block_f: int = 0  # hybrid: features per row-group tile (0: block_f)
    window: int = 0  # hybrid: short rows degree-sorted within windows of this many ids (0: globally)
    one_pass: bool = False  # hybrid: row groups and long-row pieces in one launch, window by window
    x_evict: str = ""  # one_pass: cache eviction hint of the gathered x rows ("", "evict_last", "evict_first")

    def describe(self) -> str:
        name = {
            "coo": "sorted-COO segmented (edge blocks, segmented scan, relaxed atomics at block-edge runs)",
            "csr": "CSR row-parallel, hub rows split into pieces + ordered second pass (atomic-free)",
            "hybrid": f"row groups for rows of <= {self.short_max} edges ({self.group_rows} rows x "
                      f"{self.group_block_f or self.block_f} features per program, {self.group_warps} warps, "
                      + (f"degree-sorted within windows of {self.window} consecutive ids" if self.window
                         else "in global degree order")
                      + ") + CSR row-parallel for longer rows (atomic-free)"
                      + ("; both in one launch, each window's long-row pieces next to its row groups" if self.one_pass
                         else "")
                      + (f", x rows gathered {self.x_evict}" if self.one_pass and self.x_evict else ""),
            "atomic": "fully-atomic COO baseline (one atomic per edge and feature)",
        }[self.kernel]
        return (f"gnnfuse.triton.gather_scatter_fwd_kernels: {name}; BLOCK_E={self.block_e} BLOCK_F={self.block_f} "
                f"SEG={self.seg} num_warps={self.num_warps}; {self.reason}")


def _block_f(F: int, itemsize: int) -> int:
    cap = 64 if itemsize >= 8 else (128 if itemsize == 4 else 256)
    return max(16, min(next_power_of_2(F), cap))


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
    first_e = min(max_e, 64, max(16, next_power_of_2(int(avg_degree))))
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


def hybrid_configs(F: int, avg_degree: float, itemsize: int) -> list[dict]:
    """Candidate configs of the hybrid plan: a tile for the long rows (CSR kernel) plus
    row-group settings, best guess first.

    From three H200 sweeps (benchmarks/results/gpu-plans_h200_2026-11-22*.md, sum forward,
    F=32-256 on the five suite graphs): rows of up to 64 edges to the row-group kernel, 16 rows
    per program, 4 warps at F=32 and 8 above, with tiles of up to 256 bytes (64 float32
    features). The long rows want many small programs with 4 warps each: 128-byte tiles of 16
    edges up to F*itemsize = 256 bytes (arxiv-like F=64: 0.093 vs 0.160 ms with the CSR plan's
    64-wide 1-warp tile; hub-stress, reddit-like and products-like 5-25% faster), 256-byte
    tiles above (arxiv-like F=128: 0.18 vs 0.26 ms with 128-wide tiles).

    From 256-byte rows up (float32 F >= 64), one launch (``one_pass``) with 4 warps and 32-edge
    long-row tiles: the long rows of an id window then run next to its short rows, and the
    source rows both read come from DRAM once (H100, benchmarks/results/gpu-locality-sweep_h100_2026-11-23.md:
    community-products reordered F=128/256 5.95/11.6 -> 5.34/10.5 ms, R-MAT F=256 13.0 -> 9.8 ms;
    uniform-source graphs and L2-resident rows no slower; R-MAT F=64 6% slower; at F=32 2-10% slower).
    The one launch gathers x rows with an evict_last hint, so they outlive the streamed column
    indices and outputs in L1/L2 (bitwise the same result; H100,
    benchmarks/results/gpu-locality-evict_h100_2026-11-23.md: reordered community-products 4-5% and
    R-MAT 8% faster at F = 128-256, mesh and uniform-source graphs within noise; hinting the
    index and output streams evict_first as well was slower)."""
    csr = csr_configs(F, avg_degree, itemsize)[0]
    group_f = min(csr["block_f"], max(16, 256 // itemsize))
    if F * itemsize <= 256:
        long_rows = dict(block_e=16, block_f=min(group_f, max(16, 128 // itemsize)), seg=csr["seg"], num_warps=4)
    else:
        long_rows = dict(csr, block_f=group_f, num_warps=4)
    first = dict(long_rows, short_max=64, group_rows=16, group_warps=4 if F <= 32 else 8, group_block_f=group_f,
                 one_pass=False)
    if F * itemsize >= 256:
        first = dict(first, one_pass=True, block_e=32, group_warps=4, x_evict="evict_last")
    out = [first, dict(first, one_pass=not first["one_pass"])]
    wide = _block_f(F, itemsize)
    for short_max in (32, 64):
        for group_rows in (8, 16, 32):
            for group_warps in (4, 8):
                for block_f in sorted({group_f, wide}):
                    cfg = dict(long_rows, short_max=short_max, group_rows=group_rows, group_warps=group_warps,
                               group_block_f=block_f, one_pass=False)
                    if cfg not in out:
                        out.append(cfg)
    return out


def coo_configs(F: int, itemsize: int) -> list[dict]:
    """Candidate tile configs of the sorted-COO kernel, best guess first."""
    bf = _block_f(F, itemsize)
    out = []
    for be in (32, 64, 128):  # 32 first: faster than 64 in the H200 sweep of 2026-11-22 (gpu-plans)
        be = max(16, min(be, 8192 // bf))
        cfg = dict(block_e=be, block_f=bf, seg=0, num_warps=_warps(be, bf))
        if cfg not in out:
            out.append(cfg)
    return out


def choose(reduce: str, num_dst: int, num_edges: int, F: int, dtype: torch.dtype,
           deterministic: bool | None = None, kernel: str | None = None) -> Plan:
    """Picks the kernel and tiles: the hybrid plan (atomic-free) unless ``kernel`` (or env
    ``GNNFUSE_TRITON_KERNEL``) forces one. ``deterministic`` (default:
    ``torch.are_deterministic_algorithms_enabled()``) rules out the atomic kernels (coo, atomic),
    which also only do sum/mean."""
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    forced = kernel or config.get("GNNFUSE_TRITON_KERNEL") or None
    return _choose(reduce, num_dst, num_edges, F, dtype, deterministic, forced)


@functools.lru_cache(maxsize=1024)  # a pure function of small values: the plan is not rebuilt per call
def _choose(reduce: str, num_dst: int, num_edges: int, F: int, dtype: torch.dtype, deterministic: bool,
            forced: str | None) -> Plan:
    itemsize = dtype.itemsize
    avg = num_edges / max(num_dst, 1)
    if forced is not None and forced not in KERNELS:
        raise ValueError(f"GNNFUSE_TRITON_KERNEL / kernel must be one of {KERNELS}; got {forced!r}")
    if forced in ("csr", "hybrid"):  # atomic-free: every reduction, deterministic or not
        name, reason = forced, f"forced kernel={forced}"
    elif forced is not None and reduce in ("sum", "mean") and not deterministic:
        name, reason = forced, f"forced kernel={forced}"
    else:
        name = "hybrid"
        reason = (f"avg in-degree {avg:.1f}, F={F}: short rows in row groups, long rows CSR with hub splitting"
                  + ("; deterministic algorithms requested (this plan is atomic-free)" if deterministic else ""))
    if name in ("coo", "atomic"):
        cfg = coo_configs(F, itemsize)[0]
    elif name == "hybrid":
        cfg = hybrid_configs(F, avg, itemsize)[0]
    else:
        cfg = csr_configs(F, avg, itemsize)[0]
    return Plan(kernel=name, deterministic=name in ("csr", "hybrid"), reason=reason, **cfg)
