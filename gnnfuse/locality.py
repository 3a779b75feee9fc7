"""How much cache reuse a graph's id order offers the gather of source rows: one cheap statistic.

The fused gather-scatter walks targets in CSR order and reads each edge's source row. Within a
window of consecutive CSR positions (consecutive targets), a source row read twice can come from
cache; a graph whose ids carry no locality (uniform random sources, or scrambled ids) touches a new
row on nearly every edge. :func:`locality_stats` measures this on a sample of windows, in time
proportional to the sampled edges (not the graph), so a dispatch or ``gnnfuse.explain`` can afford it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

WINDOW_EDGES = 16_384  # edges per window: ~ the rows whose features fill a 4-8 MB cache at F = 64-128 (fp32)
MAX_WINDOWS = 64


@dataclass(frozen=True)
class LocalityStats:
    distinct_fraction: float  # distinct source rows / edges per window (mean over sampled windows); 1 = no reuse
    random_fraction: float  # the same for uniformly random sources: what scrambled ids would give
    log_gap: float | None  # mean log2(1 + |src - dst|) / log2(num_nodes) (square graphs); ~0.9+ for random ids
    window_edges: int
    windows: int  # windows sampled

    @property
    def reuse(self) -> float:
        """1 - distinct_fraction: the share of gathers that hit a row already read in the window."""
        return 1.0 - self.distinct_fraction

    def __str__(self) -> str:
        gap = "n/a" if self.log_gap is None else f"{self.log_gap:.2f}"
        return (f"distinct rows/edge {self.distinct_fraction:.2f} per {self.window_edges}-edge window "
                f"(random ids: {self.random_fraction:.2f}), log-gap {gap}, {self.windows} windows")


def locality_stats(csr, *, window_edges: int = WINDOW_EDGES, max_windows: int = MAX_WINDOWS) -> LocalityStats:
    """Locality of a :class:`gnnfuse.CSR`'s current id order (see the module docstring).

    Windows are ``window_edges`` consecutive CSR positions; up to ``max_windows`` evenly spaced
    ones are sampled (all when the graph is small), the graph's last partial window only when it is
    the only one.

    Example::

        stats = gnnfuse.locality_stats(gnnfuse.CSR.from_edge_index(edge_index, num_nodes))
        print(stats)    # distinct source rows per edge, next to what random ids would give
    """
    e, n_src = csr.num_edges, csr.num_src
    if e == 0:
        return LocalityStats(1.0, 1.0, None, window_edges, 0)
    w = min(window_edges, e)
    full = e // w
    starts = torch.linspace(0, full - 1, min(full, max_windows), device=csr.device).round().long().unique() * w
    pos = starts[:, None] + torch.arange(w, device=csr.device)
    cols = csr.col.long()[pos]
    s = cols.sort(dim=1).values
    distinct = (s[:, 1:] != s[:, :-1]).sum(1) + 1
    distinct_fraction = float(distinct.double().mean()) / w
    random_fraction = n_src * -math.expm1(-w / n_src) / w if n_src else 1.0
    log_gap = None
    if n_src == csr.num_dst and n_src > 1:
        rows = torch.searchsorted(csr.rowptr.long(), pos.reshape(-1), right=True) - 1
        gap = torch.log2((cols.reshape(-1) - rows).abs().double() + 1.0)
        log_gap = float(gap.mean()) / math.log2(n_src)
    return LocalityStats(distinct_fraction, random_fraction, log_gap, w, int(starts.numel()))
