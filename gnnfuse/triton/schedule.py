"""Locality-aware row schedule of the Triton gather-scatter (no Triton import, like the dispatch).

The hybrid plan's row-group kernel takes the short rows in an order that puts rows of equal
degree into the same program. Sorting all rows by degree balances the programs but scatters
consecutive ids over the whole launch, so on a graph whose ids carry locality (community order,
or after ``gnnfuse.reorder``) the source rows that neighbouring targets share are fetched from
DRAM again and again. The windowed schedule keeps id order at cache scale: rows are cut into
windows of WINDOW_ROWS consecutive ids, windows run in id order, and rows are sorted by degree
only inside a window.

Which schedule runs is measured once per graph: ``gnnfuse.locality_stats`` on a few
window-sized stretches of the CSR (distinct source rows per edge, against what random ids would
give). When x fits in half of L2 the order does not matter and the global order stays.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from .._tensor_cache import cached
from ..constants import DEFAULT_L2_BYTES  # where the device's own size cannot be read

L2_SHARE = 0.5  # of L2 for the source rows (the rest: outputs, indices, other streams)
# Rows per window. Swept on an H100 (benchmarks/results/archive/gpu-locality_h100_2026-11-22.md,
# community-products, F=64-256): windows of 1024-4096 ids were 5-20% faster than L2-sized ones
# (25K-100K ids): the programs in flight then cover a few windows whose rows share sources, so
# the shared rows stay in L1/L2 while they are reused. Degree sorting inside so small a window
# still groups rows of equal degree.
WINDOW_ROWS = 4096
# Windowed when a window reads at most this share of the distinct rows random ids would read.
LOCAL_RATIO = 0.6
STAT_WINDOWS = 8  # windows sampled by the statistic


def l2_cache_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        if size:
            return int(size)
    return DEFAULT_L2_BYTES


def locality(rowptr: torch.Tensor, col: torch.Tensor, num_src: int, window_edges: int):
    """gnnfuse.locality_stats of this CSR on windows of ``window_edges`` edges, cached on rowptr."""
    from ..locality import locality_stats

    def build():
        n = rowptr.numel() - 1
        csr = SimpleNamespace(rowptr=rowptr, col=col, num_edges=col.numel(), num_src=num_src, num_dst=n,
                              device=rowptr.device)
        return locality_stats(csr, window_edges=max(1, window_edges), max_windows=STAT_WINDOWS)

    return cached("locality", (rowptr,), (num_src, window_edges), build)


def choose_window(rowptr: torch.Tensor, col: torch.Tensor, num_src: int, F: int, itemsize: int,
                  device: torch.device) -> tuple[int, str]:
    """(rows per window, or 0 for the global degree order; the reason, with the statistic)."""
    n, E = rowptr.numel() - 1, col.numel()
    l2 = l2_cache_bytes(device)
    footprint = num_src * F * itemsize
    if footprint <= l2 * L2_SHARE or E == 0:
        return 0, f"x ({footprint / 2**20:.1f} MiB) fits in L2 ({l2 / 2**20:.0f} MiB): rows in global degree order"
    window = WINDOW_ROWS
    if window >= n:
        return 0, "one window holds every row: rows in global degree order"
    stats = locality(rowptr, col, num_src, int(window * E / max(n, 1)))
    ratio = stats.distinct_fraction / max(stats.random_fraction, 1e-9)
    local = ratio <= LOCAL_RATIO
    verdict = (f"rows in windows of {window} consecutive ids, degree-sorted within a window"
               if local else "no id locality: rows in global degree order")
    return (window if local else 0), f"locality {ratio:.2f} of random ({stats}): {verdict}"


def short_rows(rowptr: torch.Tensor, short_max: int, window: int = 0) -> torch.Tensor:
    """Rows with at most ``short_max`` edges in the row-group kernel's order, cached on rowptr:
    by decreasing degree (stable), within windows of ``window`` consecutive ids (0: one window)."""
    def build():
        deg = (rowptr[1:] - rowptr[:-1]).long()
        rows = torch.nonzero(deg <= short_max).flatten()
        key = short_max - deg[rows]  # ascending key = descending degree
        if window > 0:
            key = key + (rows // window) * (short_max + 1)
        return rows[torch.sort(key, stable=True).indices].contiguous()

    return cached("short", (rowptr,), (short_max, window), build)


def task_list(rowptr: torch.Tensor, short: torch.Tensor, wl, group_rows: int, seg: int, short_max: int,
              window: int) -> torch.Tensor:
    """The hybrid plan's work as one id-ordered list for the one-launch kernel, cached on rowptr:
    window by window (``window`` consecutive ids; 0: one window), first the window's long-row
    pieces (the longest tasks start first), then its row groups in their degree order. Row group
    g is coded g, piece s of the work list ``wl`` is coded -1 - s. A group belongs to the window
    of its first row. (``seg`` and ``short_max`` only key the cache: they fix ``wl`` and ``short``.)"""
    def build():
        dev = rowptr.device
        groups = -(-short.numel() // group_rows)
        pieces = wl.seg_row.numel()
        first_rows = short[::group_rows][:groups]
        span = window if window > 0 else max(rowptr.numel(), 1)
        key = torch.cat([(wl.seg_row // span) * 2, (first_rows // span) * 2 + 1])  # pieces before groups
        code = torch.cat([-1 - torch.arange(pieces, device=dev), torch.arange(groups, device=dev)])
        return code[torch.sort(key, stable=True).indices].contiguous()

    return cached("tasks", (rowptr,), (group_rows, seg, short_max, window), build)
