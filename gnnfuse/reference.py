"""Slow, obviously-correct pure-PyTorch versions of every op.

Used by the tests as the ground truth and by ``backend="reference"``. They materialise the
E x F message tensor on purpose: clarity over speed.
"""
from __future__ import annotations

import torch

_SCATTER_REDUCE = {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin", "mul": "prod"}


def coo_to_csr(key: torch.Tensor, other: torch.Tensor, num_rows: int, num_other: int):
    """Stable sort of edges by ``key``: (rowptr, col, perm) in the dtype of ``key``."""
    for name, values, limit in (("edge_index[1] (targets)", key, num_rows), ("edge_index[0] (sources)", other, num_other)):
        if values.numel() and (int(values.min()) < 0 or int(values.max()) >= limit):
            bad = values[(values < 0) | (values >= limit)][0]
            raise ValueError(f"{name} contains node id {int(bad)}, outside [0, {limit})")
    perm = torch.sort(key, stable=True).indices
    counts = torch.bincount(key.long(), minlength=num_rows)
    rowptr = torch.zeros(num_rows + 1, dtype=torch.long, device=key.device)
    torch.cumsum(counts, 0, out=rowptr[1:])
    return rowptr.to(key.dtype), other[perm].to(key.dtype), perm.to(key.dtype)


def gather_scatter(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, num_dst: int, reduce: str = "sum",
                   edge_weight: torch.Tensor | None = None) -> torch.Tensor:
    """out[i] = REDUCE_{e: dst[e] == i} w[e] * x[src[e]]; empty rows are 0.

    Edges must be given in CSR order (sorted by ``dst``, stably) for max/min gradients to
    follow gnnfuse's rule: the gradient of each (row, feature) goes to one winning edge, the
    first in CSR order among ties.
    """
    src, dst = src.long(), dst.long()
    feat = x.shape[1:]
    msg = x.reshape(x.shape[0], -1)[src]
    if edge_weight is not None:
        msg = msg * edge_weight.to(x.dtype).unsqueeze(-1)
    work_dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    msg = msg.to(work_dtype)
    index = dst.unsqueeze(-1).expand_as(msg)
    zeros = msg.new_zeros(num_dst, msg.shape[1])
    if reduce in ("max", "min"):
        best = zeros.scatter_reduce(0, index, msg, _SCATTER_REDUCE[reduce], include_self=False).detach()
        target = best[dst]
        is_best = (msg == target) | (msg.isnan() & target.isnan())
        # first winning edge of each (row, feature) in edge order: running count of winners == 1
        running = torch.cumsum(is_best.long(), 0)
        before_row = torch.zeros_like(running[:1]).expand(1, -1)
        row_start = torch.searchsorted(dst, torch.arange(num_dst, device=dst.device))
        prior = torch.cat([before_row, running])[row_start][dst]
        first = is_best & (running - prior == 1)
        out = zeros.index_add(0, dst, torch.where(first, msg, torch.zeros_like(msg)))
    else:
        out = zeros.scatter_reduce(0, index, msg, _SCATTER_REDUCE[reduce], include_self=False)
    return out.to(x.dtype).reshape(num_dst, *feat)
