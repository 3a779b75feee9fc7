"""GATConv's default layer on small graphs with the Triton kernels, in eager mode: the projection,
both attention terms and the fused attention as ONE autograd node.

On a small graph a training step is bound by the host (benchmarks/results/attention-profile_*):
each autograd node costs the host tens of microseconds (its creation, the saved tensors, the
engine's call of its backward), and so does every argument check. The default path makes two
nodes, GATProjection (nn/_projections.py) and the attention op's (ops/attention.py, which checks
its tensors again); here the same maths and the same two kernels run under one node, whose
backward runs the attention backward and then the projection's, with fewer launches (GATNode's
doc; the bias of concatenated heads added inside too). The same dropout seed is drawn at the same
point; the products are grouped otherwise, so the numbers agree to rounding, not bit for bit.

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


class GATNode(torch.autograd.Function):
    """GATConv's projection + attention terms + fused attention (module doc): ``out [N, H, C]``, or
    with ``bias`` (given only for concatenated heads) ``out [N, H * C] + bias``. ``graph``: (rowptr,
    col, t_rowptr, t_col, t_pos); ``scalars``: the op's (self_loops, negative_slope, dropout, seed).

    The products are GATProjection's maths with fewer launches: the two attention terms come out of
    one batched product ``a [2, N, H]`` (a_src, a_dst: each slice contiguous, as the kernels read
    them) and the backward kernels write their gradients into the slices of one ``[2, N, H]``
    buffer, so that the folded weights' gradient is one ``bmm`` (no stack of the two terms'
    gradients); the bias's gradient is a sum inside the node (no autograd nodes of its own)."""

    @staticmethod
    def forward(ctx, graph: tuple, scalars: tuple, x: Tensor, weight: Tensor, att_src: Tensor, att_dst: Tensor,
                bias: Tensor | None):
        n, width = x.shape
        H, C = att_src.shape[-2], att_src.shape[-1]
        att = torch.stack((att_src, att_dst), -2).view(H, 2, C)
        w = torch.bmm(att, weight.view(H, C, width))  # [H, 2, in]: att_src / att_dst folded into the weight
        h = torch.mm(x, weight.t()).view(n, H, C)
        a = torch.bmm(x.expand(2, n, width), w.transpose(0, 1).transpose(1, 2))  # [2, N, H]: a_src, a_dst
        out, m, z = FORWARD.kernels["triton"](h, *a.unbind(0), None, None, *graph, *scalars)
        # (the graph's tensors as plain attributes: the cached CSR, never modified in place and no
        # output of this node, so no reference cycle; each saved tensor costs the host every step)
        ctx.scalars, ctx.graph = scalars, graph
        ctx.save_for_backward(x, weight, att, w, h, a, out, m, z)
        return out if bias is None else torch.add(out.view(n, H * C), bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_out: Tensor):
        x, weight, att, w, h, a, out, m, z = ctx.saved_tensors
        _, _, need_x, need_w, need_src, need_dst, need_b = ctx.needs_input_grad
        n, H, C = h.shape
        g_b = g_out.sum(0) if need_b else None
        g_a = a.new_empty(a.shape)  # the kernels write a_src's and a_dst's gradients into its slices
        # h's gradient feeds x's and the weight's; both terms' gradients feed all four
        needs = [need_x or need_w, True, True, False, False]
        g_src, g_dst = g_a.unbind(0)
        g_h = BACKWARD.kernels["triton"](g_out.contiguous().view(n, H, C), out, m, z, h, *a.unbind(0), None, None,
                                         *ctx.graph, *ctx.scalars, needs, (None, g_src, g_dst))[0]
        g_h = g_h.view(n, H * C) if needs[0] else None
        g_w = torch.bmm(g_a.transpose(1, 2), x.expand(2, n, x.shape[1])).transpose(0, 1)  # [H, 2, in], w's layout
        g_x = g_weight = g_att_src = g_att_dst = None
        if need_x:
            w_src, w_dst = w.unbind(1)
            g_x = torch.addmm(torch.addmm(torch.mm(g_h, weight), g_src, w_src), g_dst, w_dst)
        if need_w:
            g_weight = torch.addmm(torch.bmm(att.transpose(1, 2), g_w).view(weight.shape), g_h.t(), x)
        if need_src or need_dst:
            g_att = torch.bmm(g_w, weight.view(H, C, -1).transpose(1, 2)).view(1, H, 2, C)
            g_att_src, g_att_dst = g_att.unbind(2)  # [1, H, C] each
        return None, None, g_x, g_weight, g_att_src, g_att_dst, g_b


_apply = function_apply(GATNode)  # (the C apply: callers checked eager_route_ok)


def applies(layer, x: Tensor, weight: Tensor) -> bool:
    """Whether GATConv's call may take the one-node route (see the module doc); the caller has
    checked that the layer is PyG's default one (shared bias-free linear, one input, no edge term)."""
    tensors = (x, weight, layer.att_src, layer.att_dst) if layer.bias is None else \
        (x, weight, layer.att_src, layer.att_dst, layer.bias)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors) and eager_route_ok(tensors)):
        return False
    if x.shape[0] * weight.shape[0] * x.element_size() >= _recompute.MIN_BYTES:
        return False
    return resolve_backend(layer.gnnfuse_backend, x.device) == "triton"


def gat_node(layer, x: Tensor, edge_index, weight: Tensor, dropout: float, bias: Tensor | None = None) -> Tensor:
    """GATConv's ``out [N, H, C]`` through GATNode (after gat_attention's checks of the graph); with
    ``bias`` (concatenated heads only) ``out [N, H * C] + bias``."""
    csr, seed = checked_graph(x, x.shape[0], edge_index, layer.negative_slope, dropout, None)
    if csr.col.device != x.device:
        raise ValueError(f"all tensors must be on one device; got x on {x.device}, edge_index on {csr.col.device}")
    graph = (csr.rowptr, csr.col, *csr.transpose_parts())
    scalars = (bool(layer.add_self_loops), float(layer.negative_slope), float(dropout), seed)
    return _apply(graph, scalars, x, weight, layer.att_src, layer.att_dst, bias)
