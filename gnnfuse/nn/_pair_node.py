"""GATv2Conv's and TransformerConv's projections and fused attention as ONE autograd node, on
the Triton eager route (the pair attention's counterpart of _gat_node.py; see its module doc).

Through autograd, each of the layer's linears is three nodes (the product, its weight's transpose,
the view to heads) and the attention op a fourth: ten nodes for TransformerConv's query, key and
value, each costing the host tens of microseconds a step on the small graphs where the host is what
a step waits for. Here the same products (``addmm`` / ``mm``) and the same two kernels run under one
node, whose backward runs the attention backward and then each linear's (weight: one product,
bias: one sum, input: one product): the same launches and the same numbers, bit for bit, but for
the input's gradient, whose terms (query, key, value) are added in another order.

TransformerConv's skip (PyG's default: ``root_weight``, ``concat``, no ``beta``, a plain ``lin_skip``)
joins the node too (``skip``): its product and the addition forward, its weight's and bias's
gradients backward, in place of the skip linear's own autograd nodes (product, transpose, addition,
two gradient accumulations) around this one; the output and every gradient are the same numbers.
GATv2Conv's bias (PyG's default: concatenated heads, no residual) joins it alike (``b_s`` without
``w_s``): the addition forward, its sum backward, in place of an addition's and a view's nodes.

(q's, k's and v's gradients are not made slices of one [3, N, H*C] buffer for one bias ``sum``:
torch's sum of such a buffer over its rows allocated a temporary of twice its size, 15 MB on
rfc-uniform at 8 x 8, and took as long as the three sums on an H100 (101 us in the profiler against
3 x 32-58): benchmarks/results/attention-profile_h100_2026-11-24_hostcut.md.)

Where (:func:`applies`): plain linears without hooks (nn/_projections.linear_params), no edge
features, GATv2Conv without shared weights, the Triton backend, the eager route's conditions
(ops/_opdef.py), a gradient wanted. Else the layer's default path. Double backward raises.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..ops._library import resolve_backend, triton_module
from ..ops._opdef import eager_route_ok
from ..ops._torch_private import function_apply
from ..ops.attention import checked_graph
from ._gat_node import _wants_grad, node_memo, once_differentiable_eager
from ._projections import linear_params, submodule


# (F.linear on 2-D inputs is torch's own mm(x, weight.T) / addmm(bias, x, weight.T), the same products,
# with the transpose made in C++: one Python call less per linear)
_linear = F.linear
_kernels = triton_module("pair_attention")  # gnnfuse.triton.pair_attention, imported on the first call
_launches = triton_module("attention_launches")  # (shared_empty: dot attention's "out not kept" marker)


def _linear_grads(g: Tensor, x: Tensor, weight: Tensor, need_w: bool, need_b: bool):
    """(weight's, bias's) gradient of ``x @ weight.T + bias`` for the output's gradient g [N, out]."""
    return torch.mm(g.t(), x) if need_w else None, g.sum(0) if need_b else None


class PairNode(torch.autograd.Function):
    """``out [N_dst, H, C]`` of q = x_dst Wq^T + bq, k = x_src Wk^T + bk, v = x_src Wv^T + bv (GATv2:
    v is k, ``w_v`` None) and the pair attention; with ``w_s`` (TransformerConv's skip) ``out [N_dst,
    H*C] + x_dst Ws^T + bs``; with ``b_s`` alone (GATv2Conv's bias) ``out [N_dst, H*C] + bs``.
    ``graph``: (rowptr, col, t_rowptr, t_col, t_pos); ``scalars``: the op's
    (self_loops, gatv2, negative_slope, scale, dropout, seed); ``memo``: as GATNode's."""

    @staticmethod
    def forward(ctx, graph: tuple, scalars: tuple, memo: dict | None, heads: int, x_src: Tensor, x_dst: Tensor,
                w_q: Tensor, b_q: Tensor | None, w_k: Tensor, b_k: Tensor | None, w_v: Tensor | None,
                b_v: Tensor | None, att: Tensor | None, w_s: Tensor | None = None, b_s: Tensor | None = None):
        gatv2 = scalars[1]
        # (q, k and v stay [N, H * C]: the kernels take them so, given the heads; no view ops forward or backward)
        q = _linear(x_dst, w_q, b_q)
        k = _linear(x_src, w_k, b_k)
        v = k if w_v is None else _linear(x_src, w_v, b_v)
        att_ = None if att is None else att.view(heads, -1)
        rowptr, col, t_rowptr, t_col, t_pos = graph
        out, m, z = _kernels().forward(q, k, v, att_, None, rowptr, col, None, t_rowptr, t_col, t_pos, *scalars, memo,
                                       heads)
        # (the graph's tensors as plain attributes, as GATNode's: the cached CSR, never modified in place
        # and no output of this node; each saved tensor costs the host every step)
        ctx.scalars, ctx.heads, ctx.graph, ctx.memo = scalars, heads, graph, memo
        kept = out if gatv2 else _launches().shared_empty(out)  # dot attention's Triton backward recomputes what it reads of out
        ctx.save_for_backward(x_src, x_dst, w_q, w_k, w_v, q, k, v, att_, kept, m, z, w_s)
        if w_s is None:  # (b_s alone: GATv2Conv's bias, PyG's out + bias)
            return out if b_s is None else torch.add(out.view(out.shape[0], -1), b_s)
        res = _linear(x_dst, w_s, b_s)  # PyG's out + lin_skip(x_dst) (the same sum: addition commutes)
        return res.add_(out.view(res.shape))

    @staticmethod
    @once_differentiable_eager
    def backward(ctx, g_out: Tensor):
        x_src, x_dst, w_q, w_k, w_v, q, k, v, att, kept, m, z, w_s = ctx.saved_tensors
        rowptr, col, t_rowptr, t_col, t_pos = ctx.graph
        _, _, _, _, n_xs, n_xd, n_wq, n_bq, n_wk, n_bk, n_wv, n_bv, n_att, n_ws, n_bs = ctx.needs_input_grad
        gatv2 = ctx.scalars[1]
        need_q, need_k, need_v = n_xd or n_wq or n_bq, n_xs or n_wk or n_bk, n_xs or n_wv or n_bv
        if gatv2:  # v is k: the kernel adds v's gradient into k's (ops/pair_attention.py _kv_sum)
            needs = [need_q, True, False, n_att, False, True]
        else:
            needs = [need_q, need_k, need_v, False, False]
        g_out = g_out.contiguous()
        g_q, g_k, g_v, g_att, _ = _kernels().backward(  # (g_out: [N, H, C] or [N, H * C], contiguous)
            g_out, kept, m, z, q, k, v, att, None, rowptr, col, None, t_rowptr, t_col, t_pos, *ctx.scalars, needs,
            None, ctx.memo, ctx.heads)
        g_xs = g_xd = g_wq = g_bq = g_wk = g_bk = g_wv = g_bv = g_ws = g_bs = None
        if need_q:  # (q's, k's and v's gradients come as [N, H * C], as q, k and v)
            g_wq, g_bq = _linear_grads(g_q, x_dst, w_q, n_wq, n_bq)
            g_xd = torch.mm(g_q, w_q) if n_xd else None
        if needs[1]:
            g_wk, g_bk = _linear_grads(g_k, x_src, w_k, n_wk, n_bk)
            g_xs = torch.mm(g_k, w_k) if n_xs else None
        if needs[2]:
            g_wv, g_bv = _linear_grads(g_v, x_src, w_v, n_wv, n_bv)
            if n_xs:
                g_xs = torch.mm(g_v, w_v) if g_xs is None else torch.addmm(g_xs, g_v, w_v)
        if w_s is not None:  # the skip: its output's gradient is the node's
            g_ws, g_bs = _linear_grads(g_out, x_dst, w_s, n_ws, n_bs)
            if n_xd:
                g_xd = torch.addmm(g_xd, g_out, w_s) if g_xd is not None else torch.mm(g_out, w_s)
        elif n_bs:  # the output's bias alone (GATv2Conv's)
            g_bs = g_out.sum(0)
        g_att = g_att.view(1, *att.shape) if n_att else None
        return None, None, None, None, g_xs, g_xd, g_wq, g_bq, g_wk, g_bk, g_wv, g_bv, g_att, g_ws, g_bs


_apply = function_apply(PairNode)  # (the C apply: callers checked eager_route_ok)


def applies(layer, x_src: Tensor, x_dst: Tensor, linears: tuple, att: Tensor | None) -> tuple | None:
    """Whether the layer's call may take the one-node route (module doc): the query's, key's and value's
    (weight, bias) where it may (GATv2: the value's None), else None; ``linears``: the query's, key's and
    value's (GATv2: lin_r, lin_l, None). The caller has checked: no edge features."""
    params = tuple(None if lin is None else linear_params(lin) for lin in linears)
    if any(p is None for p, lin in zip(params, linears) if lin is not None):
        return None
    tensors = [x_src, x_dst] if att is None else [x_src, x_dst, att]
    for p in params:
        if p is not None:
            tensors.append(p[0])
            if p[1] is not None:
                tensors.append(p[1])
    if not (torch.is_grad_enabled() and _wants_grad(tensors)):
        return None
    return params if resolve_backend(layer.gnnfuse_backend, x_src.device) == "triton" else None


def pair_node(layer, x_src: Tensor, x_dst: Tensor, edge_index, params: tuple, att: Tensor | None, gatv2: bool,
              slope: float, scale: float, dropout: float, self_loops: bool, skip=None, bias=None) -> Tensor:
    """The layer's ``out [N_dst, H, C]`` through PairNode (after the pair ops' checks of the graph);
    ``params``: :func:`applies`' answer; with ``skip`` (the skip linear's (weight, bias), see
    :func:`node_skip`) ``out [N_dst, H*C]`` plus the skip; with ``bias`` (no skip) ``out [N_dst, H*C] + bias``."""
    csr, seed = checked_graph(x_src, x_dst.shape[0], edge_index, slope, dropout, None)
    device = x_src.get_device()  # (CPU or CUDA tensors: applies checked; an int, no device object)
    if csr.col.get_device() != device or x_dst.get_device() != device:
        raise ValueError(f"all tensors must be on one device; got x on {x_src.device} and {x_dst.device}, "
                         f"edge_index on {csr.col.device}")
    graph = (csr.rowptr, csr.col, *csr.transpose_parts())
    scalars = (bool(self_loops), bool(gatv2), float(slope), float(scale), float(dropout), seed)
    (w_q, b_q), (w_k, b_k), value = params
    w_v, b_v = (None, None) if value is None else value
    w_s, b_s = (None, bias) if skip is None else skip
    return _apply(graph, scalars, node_memo(csr), layer.heads, x_src, x_dst, w_q, b_q, w_k, b_k, w_v, b_v, att,
                  w_s, b_s)


def node_bias(layer, x_dst: Tensor):
    """GATv2Conv's bias where it may join PairNode (``b_s`` alone): PyG's default tail (concatenated
    heads, no residual) with a bias on x_dst's dtype and device that may take the eager route, else None."""
    bias = layer.bias if layer.concat and layer.res is None else None
    if bias is None or bias.dtype != x_dst.dtype or bias.device != x_dst.device or not eager_route_ok((bias,)):
        return None
    return bias


def node_skip(layer, x_dst: Tensor):
    """TransformerConv's ``lin_skip`` (weight, bias) where it may join PairNode (module doc), else None:
    PyG's default tail (concat, root weight, no beta) with a plain lin_skip whose tensors may take the
    eager route, on x_dst's dtype and device. (PairNode's own conditions: :func:`applies`, checked by
    the caller.)"""
    skip = submodule(layer, "lin_skip") if layer.root_weight and layer.concat and submodule(layer, "lin_beta") is None \
        else None
    params = None if skip is None else linear_params(skip)
    if params is None:
        return None
    tensors = [params[0]] if params[1] is None else list(params)
    if not eager_route_ok(tensors):  # (CPU or CUDA tensors: their devices compare as ints)
        return None
    dtype, device = x_dst.dtype, x_dst.get_device()
    if any(t.dtype != dtype or t.get_device() != device for t in tensors):
        return None
    return params
