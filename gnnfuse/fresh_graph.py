"""Graphs used once (a sampled mini-batch): marked, so that the GPU path skips per-graph setup.

A kernel plan with a work list, a locality statistic and a degree-sorted short-row list is worth
building for a graph that many calls share (full-batch training: one graph, every epoch): it is
cached on the graph and paid once. A neighbour-sampled batch is a new graph every step, used by one
forward and one backward; there that setup costs more than the kernels it plans, because it reads
sizes back to the host (a synchronisation that stalls the launch queue) several times per layer.

A CSR whose ``rowptr`` is marked fresh (:func:`mark_fresh`; :meth:`gnnfuse.CSR.from_sorted_edge_index`
and :meth:`gnnfuse.CSR.hop_prefix` do it, so every :func:`gnnfuse.loader.layer_csrs` batch is) takes
the "fresh graph" route of the Triton gather-scatter instead (gnnfuse/triton/gather_scatter.py):
every row in row groups of the row-group kernel, in a row order computed on the device, no work
list, no statistic, nothing read back to the host; its transpose (for the backward) is marked fresh
too. The results are the same reductions in the same per-row edge order (atomic-free and
deterministic); only the schedule differs. ``GNNFUSE_TRITON_KERNEL`` (any value) turns the route off.

The mark lives in gnnfuse's tensor cache, keyed on the rowptr's memory: it dies with that memory and
is dropped when the rowptr is written in place (then the graph is planned as usual).
"""
from __future__ import annotations

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
    unmarked rowptr records that it is not fresh, so a later mark does not apply to it."""
    return bool(cached(_KIND, (rowptr,), (), lambda: False))


def unchecked_transpose(col: torch.Tensor, row: torch.Tensor, num_src: int):
    """(t_rowptr, t_col, t_pos) of a CSR whose ids are known to be in range (a validated or
    gnnfuse-built CSR), with device-side torch ops only: a stable sort of the sources, row pointers by
    binary search. Unlike the general build (gnnfuse::coo_to_csr), no range check reads ids back to
    the host, so nothing waits for the device."""
    dtype = col.dtype
    sorted_src, order = torch.sort(col, stable=True)
    bounds = torch.arange(num_src + 1, device=col.device, dtype=dtype)
    t_rowptr = torch.searchsorted(sorted_src, bounds, out_int32=dtype == torch.int32)
    return t_rowptr, row.index_select(0, order), order.to(dtype)
