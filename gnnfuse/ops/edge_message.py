"""``gnnfuse.gine_aggregate``: GINEConv's message and aggregation in one pass.

    out[i] = REDUCE_{e: dst[e] == i} relu(x[src[e]] + edge_attr[e]),   REDUCE = sum or mean

Gather, add the edge term, activation and reduction run in one kernel per target row: no [E, F]
message tensor, forward or backward (the backward's only [E, F] tensor is edge_attr's own
gradient, when it is wanted). The backward recomputes each pre-activation's sign from x and
edge_attr; x's gradient is row-parallel over the graph's cached transpose (no atomics).
Kernels: csrc/edge_message.cpp (CPU), gnnfuse/triton/edge_message.py (CUDA).
"""
from __future__ import annotations

import torch

from .._validate import require_choice, require_floating, require_same_device, require_shape, require_tensor
from ..csr import CSR
from ._library import resolve_backend, triton_module
from ._opdef import CppKernel, OpDef
from .gather_scatter import _as_csr

REDUCTIONS = ("sum", "mean")


_triton = triton_module("edge_message")


def _save(ctx, inputs, output):
    x, edge_attr, rowptr, col, perm, t_rowptr, t_col, t_pos, mean = inputs
    ctx.mean = mean
    return x, edge_attr, rowptr, col, perm, t_rowptr, t_col, t_pos


def _backward(ctx, saved, grad):
    x, edge_attr, rowptr, col, perm, t_rowptr, t_col, t_pos = saved
    need_x, need_edge = ctx.needs[0], ctx.needs[1]
    if t_rowptr is None and need_x:
        raise RuntimeError("gine_aggregate: x needs a gradient but the forward got no transpose")
    if t_rowptr is None:  # only edge_attr's gradient: the transpose is not read
        t_rowptr, t_col, t_pos = rowptr.new_zeros(1), rowptr.new_empty(0), rowptr.new_empty(0)
    gx, ge = BACKWARD(grad.contiguous(), x, edge_attr, rowptr, col, perm, t_rowptr, t_col, t_pos, ctx.mean,
                      need_x, need_edge, backend=ctx.backend)
    return (gx if need_x else None), (ge if need_edge else None), None, None, None, None, None, None, None


def _forward_fake(x, edge_attr, rowptr, col, perm, t_rowptr, t_col, t_pos, mean):
    return x.new_empty(rowptr.shape[0] - 1, x.shape[1])


def _backward_fake(grad, x, edge_attr, rowptr, col, perm, t_rowptr, t_col, t_pos, mean, need_x, need_edge):
    return (x.new_empty(x.shape) if need_x else x.new_empty(0),
            edge_attr.new_empty(edge_attr.shape) if need_edge else x.new_empty(0))


FORWARD = OpDef(
    "gine_aggregate(Tensor x, Tensor edge_attr, Tensor rowptr, Tensor col, Tensor perm, Tensor? t_rowptr, "
    "Tensor? t_col, Tensor? t_pos, bool mean) -> Tensor",
    kernels={"cpu": CppKernel("edge_message", "gine_aggregate"),  # registered in C++ (csrc/edge_message.cpp)
             "triton": lambda x, ea, rowptr, col, perm, tr, tc, tp, mean: _triton().forward(
                 x, ea, rowptr, col, perm, mean)},
    fake=_forward_fake, save=_save, backward=_backward)
BACKWARD = OpDef(  # its own derivative is not implemented: double backward raises
    "gine_aggregate_backward(Tensor grad, Tensor x, Tensor edge_attr, Tensor rowptr, Tensor col, Tensor perm, "
    "Tensor t_rowptr, Tensor t_col, Tensor t_pos, bool mean, bool need_x, bool need_edge) -> (Tensor, Tensor)",
    kernels={"cpu": CppKernel("edge_message", "gine_aggregate_backward"),
             "triton": lambda *a: _triton().backward(*a)},
    fake=_backward_fake, public_name="gine_aggregate")


def reference(x: torch.Tensor, edge_attr: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, num_dst: int,
              reduce: str = "sum") -> torch.Tensor:
    """Plain torch (materialises the [E, F] messages; autograd by torch)."""
    msg = (x.index_select(0, src.long()) + edge_attr).relu()
    out = torch.zeros(num_dst, x.shape[1], dtype=x.dtype, device=x.device).index_add(0, dst.long(), msg)
    if reduce == "mean":
        deg = torch.zeros(num_dst, dtype=x.dtype, device=x.device).index_add(
            0, dst.long(), torch.ones_like(dst, dtype=x.dtype))
        out = out / deg.clamp(min=1).unsqueeze(1)
    return out


def gine_aggregate(x: torch.Tensor, edge_attr: torch.Tensor, edge_index_or_csr: torch.Tensor | CSR,
                   reduce: str = "sum", *, num_nodes: int | None = None, backend: str = "auto") -> torch.Tensor:
    """``REDUCE_{e: dst[e] == i} relu(x[src[e]] + edge_attr[e])`` in one pass (GINEConv's aggregation).

    Args:
        x: [N_src, F] node features (float16, bfloat16, float32, float64).
        edge_attr: [E, F] edge features in edge_index order, x's dtype and device.
        edge_index_or_csr: edge_index [2, E], a PyG ``EdgeIndex`` or a :class:`gnnfuse.CSR`.
        reduce: "sum" or "mean" (empty target rows give 0).
        num_nodes: number of target nodes (default ``x.size(0)``, or the CSR's rows).
        backend: "auto" | "cpu" | "triton" | "reference".

    Example::

        out = gnnfuse.gine_aggregate(x, edge_attr, edge_index)   # == PyG's GINEConv aggregation
    """
    x = require_tensor("x", x)
    edge_attr = require_tensor("edge_attr", edge_attr)
    require_floating("x", x)
    require_shape("x", x, "[N, F]", x.dim() == 2)
    require_choice("reduce", reduce, REDUCTIONS)
    csr = _as_csr(edge_index_or_csr, x, num_nodes)
    require_shape("edge_attr", edge_attr, f"[E, F] = [{csr.num_edges}, {x.shape[1]}]",
                  edge_attr.shape == (csr.num_edges, x.shape[1]))
    if edge_attr.dtype != x.dtype:
        raise TypeError(f"edge_attr must have x's dtype {x.dtype}; got {edge_attr.dtype}")
    require_same_device(x=x, edge_attr=edge_attr, edge_index=csr.col)
    if x.shape[0] < csr.num_src:
        raise ValueError(f"x has {x.shape[0]} rows but the graph has {csr.num_src} source nodes")
    backend = resolve_backend(backend, x.device)
    if backend == "reference":
        src, dst = csr.col[torch.argsort(csr.perm.long())], csr.row()[torch.argsort(csr.perm.long())]
        return reference(x, edge_attr, src, dst, csr.num_dst, reduce)
    wants_x_grad = torch.is_grad_enabled() and x.requires_grad
    t_rowptr, t_col, t_pos = csr._transpose_parts() if wants_x_grad else (None, None, None)
    return FORWARD(x.contiguous(), edge_attr.contiguous(), csr.rowptr, csr.col, csr.perm, t_rowptr, t_col, t_pos,
                   reduce == "mean", backend=backend)
