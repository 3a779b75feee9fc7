"""GATConv's default layer on small graphs with the Triton kernels, in eager mode: the projection,
both attention terms and the fused attention as ONE autograd node.

On a small graph a training step is bound by the host (benchmarks/results/attention-profile_*):
each autograd node costs the host tens of microseconds (its creation, the saved tensors, the
engine's call of its backward), and so does every argument check. The default path makes two
nodes, GATProjection (nn/_projections.py) and the attention op's (ops/attention.py, which checks
its tensors again); here the same products and the same two kernels run under one node, whose
backward runs the attention backward and then the projection's. The numbers are the same
(same kernels, same products, same dropout seed drawn at the same point).

Used by GATConv only where all of this holds (:func:`applies`), else the default path:
PyG's default layer (one bias-free linear for both roles, no edge features), the Triton backend,
the eager route's conditions (ops/_opdef.py: no compile, no functorch transform, no dispatch mode,
plain tensors), a gradient wanted, and a projection under ``_recompute.MIN_BYTES`` (the node keeps
it for the backward; larger ones are recomputed on the default path). Double backward raises.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..ops._library import resolve_backend
from ..ops._opdef import eager_route_ok
from ..ops._torch_private import function_apply
from ..ops.attention import BACKWARD, FORWARD, checked_graph
from . import _recompute
from ._projections import project, project_backward


class GATNode(torch.autograd.Function):
    """``out [N, H, C]`` of GATConv's projection + attention terms + fused attention (module doc).
    ``graph``: (rowptr, col, t_rowptr, t_col, t_pos); ``scalars``: the op's (self_loops,
    negative_slope, dropout, seed)."""

    @staticmethod
    def forward(ctx, graph: tuple, scalars: tuple, x: Tensor, weight: Tensor, att_src: Tensor, att_dst: Tensor):
        h, a_src, a_dst, att, w = project(x, weight, att_src, att_dst)
        h = h.view(x.shape[0], att.shape[0], att.shape[2])
        out, m, z = FORWARD.kernels["triton"](h, a_src, a_dst, None, None, *graph, *scalars)
        ctx.scalars = scalars
        ctx.save_for_backward(x, weight, att, w, h, a_src, a_dst, out, m, z, *graph)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g_out: Tensor):
        x, weight, att, w, h, a_src, a_dst, out, m, z, *graph = ctx.saved_tensors
        _, _, need_x, need_w, need_src, need_dst = ctx.needs_input_grad
        # h's gradient feeds x's and the weight's; both terms' gradients feed all four
        needs = [need_x or need_w, True, True, False, False]
        g_h, g_src, g_dst, _, _ = BACKWARD.kernels["triton"](g_out.contiguous(), out, m, z, h, a_src, a_dst, None, None,
                                                            *graph, *ctx.scalars, needs)
        grads = project_backward(x, weight, att, w, g_h.view(x.shape[0], -1) if needs[0] else None, g_src, g_dst,
                                 (need_x, need_w, need_src, need_dst))
        return None, None, *grads


_apply = function_apply(GATNode)  # (the C apply: callers checked eager_route_ok)


def applies(layer, x: Tensor, weight: Tensor) -> bool:
    """Whether GATConv's call may take the one-node route (see the module doc); the caller has
    checked that the layer is PyG's default one (shared bias-free linear, one input, no edge term)."""
    tensors = (x, weight, layer.att_src, layer.att_dst)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors) and eager_route_ok(tensors)):
        return False
    if x.shape[0] * weight.shape[0] * x.element_size() >= _recompute.MIN_BYTES:
        return False
    return resolve_backend(layer.gnnfuse_backend, x.device) == "triton"


def gat_node(layer, x: Tensor, edge_index, weight: Tensor, dropout: float) -> Tensor:
    """GATConv's ``out [N, H, C]`` through GATNode (after gat_attention's checks of the graph)."""
    csr, seed = checked_graph(x, x.shape[0], edge_index, layer.negative_slope, dropout, None)
    if csr.col.device != x.device:
        raise ValueError(f"all tensors must be on one device; got x on {x.device}, edge_index on {csr.col.device}")
    graph = (csr.rowptr, csr.col, *csr.transpose_parts())
    scalars = (bool(layer.add_self_loops), float(layer.negative_slope), float(dropout), seed)
    return _apply(graph, scalars, x, weight, layer.att_src, layer.att_dst)
