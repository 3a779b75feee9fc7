"""Graphs used once (a sampled mini-batch): marked, so that the GPU path skips per-graph setup.

A kernel plan with a work list, a locality statistic and a degree-sorted short-row list is worth
building for a graph that many calls share (full-batch training: one graph, every epoch): it is
cached on the graph and paid once. A neighbour-sampled batch is a new graph every step, used by one
forward and one backward; there that setup costs more than the kernels it plans, because it reads
sizes back to the host (a synchronisation that stalls the launch queue) several times per layer.

A CSR whose ``rowptr`` is marked fresh (:func:`mark_fresh`; :meth:`gnnfuse.CSR.from_sorted_edge_index`
and :meth:`gnnfuse.CSR.hop_prefix` do it, so every :func:`gnnfuse.loader.layer_csrs` batch is) takes
the "fresh graph" route of the Triton gather-scatter instead (gnnfuse/triton/gather_scatter.py):
every row in row groups of the row-group kernel, in id order (:data:`FRESH_ROW_ORDER`), no work
list, no statistic, nothing read back to the host; its transpose (for the backward) is marked fresh
too, and on CUDA built without the range check's host sync (:func:`unchecked_transpose`). The results are the same reductions in the same per-row edge order (atomic-free and
deterministic); only the schedule differs. ``GNNFUSE_TRITON_KERNEL`` (any value) turns the route off.

The mark lives in gnnfuse's tensor cache, keyed on the rowptr's memory: it dies with that memory and
is dropped when the rowptr is written in place (then the graph is planned as usual).
"""
from __future__ import annotations

import functools

import torch

from ._tensor_cache import cached

_KIND = "fresh-graph"


def mark_fresh(rowptr: torch.Tensor) -> None:
    """Marks the CSR with this ``rowptr`` as used once (see the module docstring). Inference tensors
    and tensor subclasses cannot be marked (the cache does not hold them): they are planned as usual."""
    if not torch.compiler.is_compiling():
        cached(_KIND, (rowptr,), (), lambda: True)


def is_fresh(rowptr: torch.Tensor) -> bool:
    """True if :func:`mark_fresh` marked this ``rowptr`` (unchanged since). A first query of an
    unmarked rowptr records that it is not fresh, so a later mark does not apply to it. False while
    torch.compile traces (the cache is Python state; compiled code keeps the planned route)."""
    if torch.compiler.is_compiling():
        return False
    return bool(cached(_KIND, (rowptr,), (), lambda: False))


def unchecked_transpose(rowptr: torch.Tensor, col: torch.Tensor, num_src: int):
    """(t_rowptr, t_col, t_pos) of a CSR whose ids are known to be in range (a validated or
    gnnfuse-built CSR), with device-side torch ops only: a stable sort of the sources, row pointers by
    binary search, and each edge's target by binary search of its CSR position in ``rowptr`` (no
    expanded row list). Unlike the general build (gnnfuse::coo_to_csr), no range check reads ids
    back to the host, so nothing waits for the device."""
    dtype = col.dtype
    sorted_src, order = torch.sort(col, stable=True)
    bounds = torch.arange(num_src + 1, device=col.device, dtype=dtype)
    t_rowptr = torch.searchsorted(sorted_src, bounds, out_int32=dtype == torch.int32)
    t_pos = order.to(dtype)
    t_col = torch.searchsorted(rowptr, t_pos, right=True, out_int32=dtype == torch.int32).sub_(1)
    return t_rowptr, t_col, t_pos


# ---- the route's plan (for gnnfuse/triton/gather_scatter.py; no Triton import here) ------------------
class NoPieces:
    """The work list of a plan that sends every row to the row-group kernel: no pieces."""
    num_pieces = num_partials = 0


# Row order of the fresh route: "id" keeps id order (no sort; balanced when degrees are bounded, as a
# sampled batch's targets' are by the fan-out); "degree" sorts rows by decreasing degree on the device
# (row-group programs then hold rows of equal length, the longest first). On the H200 products-scale
# mini-batch step (benchmarks/results/archive/minibatch_h200_2026-11-23b/) id order was the faster: the
# row-group kernels took 0.40 ms vs 0.44 ms per step, and the sort costs launches besides.
FRESH_ROW_ORDER = "id"
_IDS: dict[tuple, torch.Tensor] = {}  # (device, dtype) -> 0, 1, 2, ... grown on demand (slices cost no launch)


def ids(n: int, device, dtype: torch.dtype) -> torch.Tensor:
    """``torch.arange(n)`` as a slice of a cached, grown-on-demand arange: no launch once it is large
    enough. Read-only (it is shared). Not grown while a CUDA graph is being captured (that memory
    would belong to the graph): then a plain arange, which the graph replays."""
    key = (torch.device(device), dtype)
    cached_ids = _IDS.get(key)
    if cached_ids is None or cached_ids.numel() < n:
        if key[0].type == "cuda" and torch.cuda.is_current_stream_capturing():
            return torch.arange(n, device=device, dtype=dtype)
        size = max(n, 2 * (0 if cached_ids is None else cached_ids.numel()))
        cached_ids = _IDS[key] = torch.arange(size, device=device, dtype=dtype)
    return cached_ids[:n]


def fresh_rows(rowptr: torch.Tensor, order: str | None = None) -> torch.Tensor:
    """Every row of the graph in the fresh route's order, by device-side ops only."""
    n = rowptr.numel() - 1
    if (order or FRESH_ROW_ORDER) == "id":
        return ids(n, rowptr.device, rowptr.dtype)
    deg = rowptr[1:] - rowptr[:-1]
    return torch.sort(deg, descending=True).indices


@functools.lru_cache(maxsize=256)
def fresh_plan(plan):
    """The default plan's tiles with every row in row groups (``short_max`` unbounded, no windows)."""
    return type(plan)(**{**plan.__dict__, "short_max": 2**62, "window": 0,
                         "reason": "fresh graph (used once): every row in row groups, no work list (no host sync); "
                                   + plan.reason})
