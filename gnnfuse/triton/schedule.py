"""Locality-aware row schedule of the Triton gather-scatter (no Triton import, like the dispatch).

The hybrid plan's row-group kernel takes the short rows in an order that puts rows of equal
degree into the same program. Sorting all rows by degree balances the programs but scatters
consecutive ids over the whole launch, so on a graph whose ids carry locality (community order,
or after ``gnnfuse.reorder``) the source rows that neighbouring targets share are fetched from
DRAM again and again. The windowed schedule keeps id order at the scale of the L2 cache: rows
are cut into windows of consecutive ids whose source rows fill about half of L2, windows run in
id order, and rows are sorted by degree only inside a window.

Which schedule runs is measured once per graph: ``gnnfuse.locality_stats`` on a few
L2-window-sized stretches of the CSR (distinct source rows per edge, against what random ids
would give). Rows whose features all fit in L2 need no window.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from .._tensor_cache import cached

DEFAULT_L2_BYTES = 50 * 2**20  # H100; the device's own value is used where it can be read
L2_SHARE = 0.5  # of L2 for a window's source rows (the rest: outputs, indices, other streams)
MIN_WINDOW = 1024  # rows
# Windowed when a window reads at most this share of the distinct rows random ids would read.
LOCAL_RATIO = 0.6
STAT_WINDOWS = 8  # windows sampled by the statistic


def l2_cache_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        if size:
            return int(size)
    return DEFAULT_L2_BYTES


def window_rows(F: int, itemsize: int, l2_bytes: int) -> int:
    """Rows per window: their feature rows fill L2_SHARE of the L2 cache."""
    return max(MIN_WINDOW, int(l2_bytes * L2_SHARE) // max(1, F * itemsize))


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
    window = window_rows(F, itemsize, l2)
    if window >= n:
        return 0, "one window holds every row: rows in global degree order"
    stats = locality(rowptr, col, num_src, int(window * E / max(n, 1)))
    ratio = stats.distinct_fraction / max(stats.random_fraction, 1e-9)
    local = ratio <= LOCAL_RATIO
    verdict = (f"rows in windows of {window} consecutive ids (L2-sized), degree-sorted within a window"
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
