"""``gnnfuse.edge_softmax``: softmax of per-edge logits over each target's incoming edges.

    p[e, h] = exp(logits[e, h]) / sum_{e': dst[e'] == dst[e]} exp(logits[e', h])

One pass per target row of the CSR (row max, then sum, then the weights), in edge order through
the CSR's ``perm`` (no permuted copy). Backward: grad = p * (g - sum_row(p * g)), also per row, so
no transpose and no atomics (deterministic). Kernels: csrc/attention.cpp (CPU), Triton (CUDA).
"""
from __future__ import annotations

import torch

from .._build import load_extension
from .._validate import require_floating, require_same_device, require_shape, require_tensor
from ..csr import CSR
from ._library import resolve_backend, triton_module
from ._opdef import OpDef
from .gather_scatter import _as_csr


_triton = triton_module("edge_softmax")


def _save(ctx, inputs, output):
    return output, inputs[1], inputs[2]  # the weights, rowptr, perm


def _backward(ctx, saved, grad):
    out, rowptr, perm = saved
    return BACKWARD.from_backward(ctx, grad.contiguous(), out, rowptr, perm), None, None


FORWARD = OpDef(
    "edge_softmax(Tensor logits, Tensor rowptr, Tensor perm) -> Tensor",
    kernels={"cpu": lambda logits, rowptr, perm: load_extension("attention").edge_softmax(logits, rowptr, perm),
             "triton": lambda logits, rowptr, perm: _triton().edge_softmax(logits, rowptr, perm)},
    fake=lambda logits, rowptr, perm: torch.empty_like(logits), save=_save, backward=_backward)
BACKWARD = OpDef(  # its own derivative is not implemented: double backward raises
    "edge_softmax_backward(Tensor grad, Tensor out, Tensor rowptr, Tensor perm) -> Tensor",
    kernels={"cpu": lambda grad, out, rowptr, perm: load_extension("attention").edge_softmax_backward(
                 grad, out, rowptr, perm),
             "triton": lambda grad, out, rowptr, perm: _triton().edge_softmax_backward(grad, out, rowptr, perm)},
    fake=lambda grad, out, rowptr, perm: torch.empty_like(out), public_name="edge_softmax")


def reference(logits: torch.Tensor, dst: torch.Tensor, num_dst: int) -> torch.Tensor:
    """Plain torch: scatter max, exp, scatter sum (autograd by torch)."""
    work = torch.float64 if logits.dtype == torch.float64 else torch.float32
    s = logits.to(work)
    index = dst.long().unsqueeze(1).expand_as(s)
    row_max = torch.full((num_dst, s.shape[1]), float("-inf"), dtype=work, device=s.device)
    row_max = row_max.scatter_reduce(0, index, s, "amax").detach()
    w = torch.exp(s - row_max[dst.long()])
    return (w / torch.zeros_like(row_max).index_add(0, dst.long(), w)[dst.long()]).to(logits.dtype)


def edge_softmax(logits: torch.Tensor, edge_index_or_csr: torch.Tensor | CSR, *, num_nodes: int | None = None,
                 backend: str = "auto") -> torch.Tensor:
    """Softmax of ``logits`` ([E] or [E, H], edge_index order) over the incoming edges of each target.

    ``edge_index_or_csr``: edge_index [2, E] or a :class:`gnnfuse.CSR`; ``num_nodes``: the number of
    targets (default: max index + 1 of the graph's nodes, or the CSR's rows). Same as PyG's
    ``torch_geometric.utils.softmax(logits, edge_index[1])``. Half types accumulate in float32.

    Example::

        logits = torch.randn(edge_index.size(1), 4)           # [E, H]
        alpha = gnnfuse.edge_softmax(logits, edge_index)       # sums to 1 over each target's edges
    """
    logits = require_tensor("logits", logits)
    require_floating("logits", logits)
    require_shape("logits", logits, "[E] or [E, H]", logits.dim() in (1, 2))
    flat = logits.dim() == 1
    logits2 = (logits.unsqueeze(1) if flat else logits).contiguous()
    if isinstance(edge_index_or_csr, CSR):
        csr = _as_csr(edge_index_or_csr, logits2, num_nodes)
    else:
        ei = require_tensor("edge_index_or_csr", edge_index_or_csr)
        if num_nodes is None:
            num_nodes = int(ei.max()) + 1 if ei.numel() else 0  # one host sync; pass num_nodes to avoid it
        probe = logits2.new_empty(num_nodes, 0)  # carries the node count and device for _as_csr
        csr = _as_csr(ei, probe, num_nodes)
    require_shape("logits", logits, f"[E] or [E, H] with E = {csr.num_edges}", logits.shape[0] == csr.num_edges)
    require_same_device(logits=logits, edge_index=csr.col)
    backend = resolve_backend(backend, logits.device)
    if backend == "reference":
        out = reference(logits2, csr.row()[torch.argsort(csr.perm.long())], csr.num_dst)
    else:
        out = FORWARD(logits2, csr.rowptr, csr.perm, backend=backend)
    return out.squeeze(1) if flat else out
