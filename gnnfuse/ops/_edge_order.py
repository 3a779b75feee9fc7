"""Per-edge tensors from edge_index order into CSR order, ``t[csr.perm]``, fast on CUDA.

torch's row gathers (index_select, advanced indexing, gather) of [E, H] rows with H >= 4 ran far below
the memory's speed on an H100: arxiv-like (1.17M edges), H = 8: 706 us for 37 MB, five times GAT's
whole fused forward, while a scatter of the same rows through the inverse permutation (index_copy_)
took 54 us (benchmarks/results/attention-edge-terms_h100_2026-11-24.md). So on CUDA, in plain eager
mode, the reorder is a scatter through the inverse permutation (built once per graph and cached) and its
gradient a scatter through perm; elsewhere (CPU, torch.compile, functorch transforms, deterministic
mode, where torch flags index_copy_ on CUDA) it stays an index_select. Both only copy values: the
same bits either way.
"""
from __future__ import annotations

import torch

from .._tensor_cache import cached
from ._opdef import eager_route_ok


def in_csr_order(t: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``t.index_select(0, perm)`` (t: [E, ...] in edge_index order, perm: the CSR's edge ids)."""
    if not (t.is_cuda and t.dim() >= 2 and eager_route_ok((t, perm))
            and not torch.are_deterministic_algorithms_enabled()):
        return t.index_select(0, perm)
    forward, backward = cached("csr-order-scatter", (perm,), (), lambda: _scatter_indices(perm))
    return _ScatterRows.apply(t, forward, backward)


def _scatter_indices(perm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(inverse, perm) as int64 (index_copy_'s index type): out[inverse[e]] = t[e] puts edge e at its
    CSR position; grad[perm[p]] = g[p] takes a gradient back."""
    perm64 = perm.long()
    inverse = torch.empty_like(perm64)
    inverse[perm64] = torch.arange(perm64.numel(), device=perm64.device)
    return inverse, perm64


class _ScatterRows(torch.autograd.Function):
    """``out[to[i]] = t[i]``; the gradient is the same scatter with ``back`` (the inverse of ``to``),
    so any order of derivative stays a scatter."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, to: torch.Tensor, back: torch.Tensor) -> torch.Tensor:
        ctx.to, ctx.back = to, back  # the graph's cached indices: never modified, no output of this node
        return t.new_empty(t.shape).index_copy_(0, to, t.contiguous())

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return _ScatterRows.apply(g, ctx.back, ctx.to), None, None
