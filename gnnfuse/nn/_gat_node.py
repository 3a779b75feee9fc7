"""GATConv's default layer on small graphs with the Triton kernels, in eager mode: the projection,
both attention terms and the fused attention as ONE autograd node.

On a small graph a training step is bound by the host (benchmarks/results/attention-profile_*):
each autograd node costs the host tens of microseconds (its creation, the saved tensors, the
engine's call of its backward), and so does every argument check. The default path makes two
nodes, GATProjection (nn/_projections.py) and the attention op's (ops/attention.py, which checks
its tensors again); here the same maths and the same two kernels run under one node (and, for
concatenated heads, the bias's addition: no autograd nodes of its own). Its backward asks the
attention backward's transpose pass for h's whole gradient (the attention terms' parts folded in,
``fold_att``), so that x's and the weight's gradients are one product each and the attention
vectors' one more (the default path: five). The forward's numbers are the same (same products and
kernels, the same dropout seed drawn at the same point); the gradients agree to rounding.

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

from ..ops._library import resolve_backend, triton_module
from ..ops._opdef import _scan
from ..ops._torch_private import function_apply
from ..ops.attention import checked_graph
from . import _recompute
from ._projections import param, project

_kernels = triton_module("attention")  # gnnfuse.triton.attention, imported on the first call


def once_differentiable_eager(backward):
    """``torch.autograd.function.once_differentiable(backward)``, without its ``torch.no_grad()``
    around the call where grad mode is already off (every backward but a ``create_graph=True`` one):
    there the context manager changes nothing and costs the host a few Python calls every step.
    With grad mode on, torch's own wrapper runs (which makes double backward raise)."""
    wrapped = once_differentiable(backward)

    def run(ctx, *grads):
        if torch.is_grad_enabled():
            return wrapped(ctx, *grads)
        return backward(ctx, *grads)

    run.__name__, run.__doc__ = backward.__name__, backward.__doc__
    run.__wrapped__ = backward  # type: ignore[attr-defined]
    return run


class GATNode(torch.autograd.Function):
    """GATConv's projection + attention terms + fused attention (module doc): ``out [N, H, C]``, or
    with ``bias`` (given only for concatenated heads) ``out [N, H * C] + bias``, the bias's gradient
    a sum inside the node (no autograd nodes of its own). ``graph``: (rowptr, col, t_rowptr, t_col,
    t_pos); ``scalars``: the op's (self_loops, negative_slope, dropout, seed); ``memo``: the CSR's dict of
    derived state where the kernels keep their launch setups (triton/attention_launches.py node_setup), or None."""

    @staticmethod
    def forward(ctx, graph: tuple, scalars: tuple, memo: dict | None, x: Tensor, weight: Tensor, att_src: Tensor,
                att_dst: Tensor, bias: Tensor | None):
        h, a_src, a_dst, att, _ = project(x, weight, att_src, att_dst)  # (h [N, H * C]: the kernels take it so)
        out, m, z = _kernels().forward(h, a_src, a_dst, None, None, *graph, *scalars, memo, att.shape[0])
        # (the graph's tensors as plain attributes: the cached CSR, never modified in place and no
        # output of this node, so no reference cycle; each saved tensor costs the host every step)
        ctx.scalars, ctx.graph, ctx.memo = scalars, graph, memo
        ctx.save_for_backward(x, weight, att_src, att_dst, h, a_src, a_dst, out, m, z)
        return out if bias is None else torch.add(out.view(x.shape[0], -1), bias)

    @staticmethod
    @once_differentiable_eager
    def backward(ctx, g_out: Tensor):
        x, weight, att_src, att_dst, h, a_src, a_dst, out, m, z = ctx.saved_tensors
        _, _, _, need_x, need_w, need_src, need_dst, need_b = ctx.needs_input_grad
        n, heads, width = h.shape[0], att_src.shape[-2], att_src.shape[-1]
        g_b = g_out.sum(0) if need_b else None
        # the transpose pass folds the terms' gradients into h's (a_src = h . att_src, a_dst = h . att_dst):
        # g_h is h's whole gradient, so x's and the weight's are one product each, and the attention
        # vectors' gradients (sum over nodes of g_src[n, h] h[n, h, :], g_dst's alike) one more
        g_h, g_src, g_dst, _, _ = _kernels().backward(  # (h, g_h: [N, H * C]; g_out any shape of its size)
            g_out.contiguous(), out, m, z, h, a_src, a_dst, None, None, *ctx.graph, *ctx.scalars, _NEEDS,
            (_heads_rows(att_src, heads, width), _heads_rows(att_dst, heads, width)), ctx.memo, heads)
        g_x = torch.mm(g_h, weight) if need_x else None
        g_weight = torch.mm(g_h.t(), x) if need_w else None
        g_att_src = g_att_dst = None
        if need_src or need_dst:
            # [2H, H*C] products of every head's term gradient with every head's h; the attention
            # vectors' gradients are its diagonal blocks (a head's with its own): one split-K
            # product rather than a batched one (cuBLAS splits only the former over the N rows),
            # its diagonal blocks read as one strided view of the (fresh, contiguous) product:
            # element (r, 0, h, c) at row r * H + h, column h * C + c
            g_terms = torch.cat((g_src, g_dst), 1)  # [N, 2H], columns (role, head)
            g_att = torch.mm(g_terms.t(), h).as_strided(
                (2, 1, heads, width), (heads * heads * width, 0, heads * width + width, 1))
            g_att_src, g_att_dst = g_att.unbind(0)  # [1, H, C] each
        return None, None, None, g_x, g_weight, g_att_src, g_att_dst, g_b


_apply = function_apply(GATNode)  # (the C apply: callers checked eager_route_ok)
_NEEDS = (True, True, True, False, False)  # the backward's: h's (folded), a_src's and a_dst's gradients


def _heads_rows(att: Tensor, heads: int, width: int) -> Tensor:
    """An attention vector [1, H, C] as the backward's contiguous [H, C] rows: itself where contiguous
    (the kernel reads its memory; no reshape op), else a contiguous copy."""
    return att if att.is_contiguous() else att.reshape(heads, width)


def _wants_grad(tensors) -> bool:
    """``eager_route_ok(tensors)`` and one of them requires grad, in the gate's one pass (ops/_opdef.py)."""
    ok, grad_positions = _scan(tensors)
    return ok and bool(grad_positions)


def applies(layer, x: Tensor, weight: Tensor) -> bool:
    """Whether GATConv's call may take the one-node route (see the module doc); the caller has
    checked that the layer is PyG's default one (shared bias-free linear, one input, no edge term)."""
    bias = param(layer, "bias")
    tensors = (x, weight, param(layer, "att_src"), param(layer, "att_dst")) if bias is None else \
        (x, weight, param(layer, "att_src"), param(layer, "att_dst"), bias)
    if not (torch.is_grad_enabled() and _wants_grad(tensors)):
        return False
    if x.shape[0] * weight.shape[0] * x.element_size() >= _recompute.MIN_BYTES:
        return False
    return resolve_backend(layer.gnnfuse_backend, x.device) == "triton"


def gat_node(layer, x: Tensor, edge_index, weight: Tensor, dropout: float, bias: Tensor | None = None) -> Tensor:
    """GATConv's ``out [N, H, C]`` through GATNode (after gat_attention's checks of the graph); with
    ``bias`` (concatenated heads only) ``out [N, H * C] + bias``."""
    csr, seed = checked_graph(x, x.shape[0], edge_index, layer.negative_slope, dropout, None)
    if csr.col.get_device() != x.get_device():  # (CPU or CUDA tensors, applies checked: their devices as ints)
        raise ValueError(f"all tensors must be on one device; got x on {x.device}, edge_index on {csr.col.device}")
    graph = (csr.rowptr, csr.col, *csr.transpose_parts())
    scalars = (bool(layer.add_self_loops), float(layer.negative_slope), float(dropout), seed)
    return _apply(graph, scalars, node_memo(csr), x, weight, param(layer, "att_src"), param(layer, "att_dst"), bias)


def node_memo(csr) -> dict | None:
    """Where the one-node routes' kernels keep their launch setups for this graph (triton/attention_launches.py
    node_setup): the CSR's dict of derived state, which the CSR clears whenever it finds its tensors
    changed (csr_checks.checked, run by transpose_parts above) and keeps only while it holds stamps of
    them (a CSR without stamps, e.g. of CUDA inference tensors: None, and the setups are looked up in
    their own cache)."""
    return csr._derived if csr._stamps is not None else None
