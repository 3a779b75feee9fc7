"""Opt-in (``TransformerConv.gnnfuse_transformer_node = True``): TransformerConv's default layer on a
small graph with its four linears (query, key, value, skip), the dot attention and the skip's
addition as ONE autograd node, on the Triton eager route.

Off by default: on an H100 (benchmarks/results/attention_gatconv-gatv2conv-transformerconv_h100_2026-11-23_gpuhost-2257.md,
rfc-uniform 8 x 8) its training step took 1.54 ms against the default route's 1.78 ms, but in
processes whose PyG step differed as much (the ratio to PyG: 1.48 against 1.46x), and the step's
peak memory was 45.6 MB against 21.9 (about 8 [N, H*C] more than this module's tensors explain;
cause not found: a trace of torch's CPU allocations of the same step, interpreter, shows the two
[N, H*C] more that ``y``'s and its gradient's skip slices account for, so the rest is CUDA-side; a
likely cause, not measured on this route: the biases' one ``g_y.sum(1)`` over the [4, N, H*C] buffer,
since the same sum of a [3, N, H*C] buffer in _pair_node.py allocated a temporary of twice its size
on the H100, benchmarks/results/attention_transformerconv_h100_2026-11-24_gpudot-ab.md).

A small graph's training step waits on the host (benchmarks/results/attention-profile_*: each torch
op costs it tens of microseconds, a weight gradient's product with its split-K reduction more).
Through _pair_node.PairNode (which takes the skip in too) the layer costs four
products and the skip's addition forward and eight ops for the weights' and biases' gradients
backward. Here the four products write into the slices of one ``y [4, N, H*C]`` (q, k and
v as the kernels read them, contiguous, and the skip), the skip is added inside the node, and the
backward kernels write q's, k's and v's gradients into slices of one
``[4, N, H*C]`` buffer whose last slice is the output's gradient (the skip's), so that the four
biases' gradients are one ``sum`` (the weights' are one product each: see the backward). The
parameters and the state_dict stay PyG's own (four linears). (One ``baddbmm`` of the input
expanded over the four stacked weights cost the H100's host more than the four products, and
copied the input; one ``bmm`` for the four weights' gradients is not split over the rows by
cuBLAS: 290 us of device time at N = 10K.)

Where (:func:`applies`): PyG's default TransformerConv (``concat``, ``root_weight``, no ``beta``, no
edge features, four plain linears with biases), one input tensor for both roles, the Triton backend,
the eager route's conditions (ops/_opdef.py), a gradient wanted, and ``y`` under
``_recompute.MIN_BYTES``: the node keeps ``y`` (the skip's slice with it) and its gradient buffer
holds one ``[N, H*C]`` more than the separate linears' route, which only a small graph should pay.
Elsewhere PairNode or the layer's default path. Double backward raises.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..ops._library import resolve_backend
from ..ops._opdef import eager_route_ok
from ..ops._torch_private import function_apply
from ..ops.attention import checked_graph
from ..ops.pair_attention import BACKWARD, FORWARD
from . import _recompute
from ._projections import plain_linear


class TransformerNode(torch.autograd.Function):
    """``out [N, H*C]`` = dot attention of (q, k, v) + skip, with (q, k, v, skip) the four linears of
    ``x`` written into one ``[4, N, H*C]`` tensor (module doc). ``graph``: (rowptr, col, t_rowptr, t_col, t_pos);
    ``scalars``: the pair op's (self_loops, gatv2, negative_slope, scale, dropout, seed)."""

    @staticmethod
    def forward(ctx, graph: tuple, scalars: tuple, heads: int, x: Tensor, w_q: Tensor, b_q: Tensor, w_k: Tensor,
                b_k: Tensor, w_v: Tensor, b_v: Tensor, w_s: Tensor, b_s: Tensor):
        n = x.shape[0]
        y = x.new_empty(4, n, w_q.shape[0])  # [4, N, H*C]: q, k, v, skip
        q, k, v, skip = y.unbind(0)
        for out, w, b in ((q, w_q, b_q), (k, w_k, b_k), (v, w_v, b_v), (skip, w_s, b_s)):
            torch.addmm(b, x, w.t(), out=out)  # (the bias in the product's epilogue, written in place)
        q, k, v, skip = (t.view(n, heads, -1) for t in (q, k, v, skip))
        rowptr, col, t_rowptr, t_col, t_pos = graph
        out, m, z = FORWARD.kernels["triton"](q, k, v, None, None, rowptr, col, None, t_rowptr, t_col, t_pos, *scalars)
        # (the graph's tensors as plain attributes: the cached CSR, never modified in place, and no
        # output of this node, so no reference cycle; each saved tensor costs the host every step)
        ctx.scalars, ctx.heads, ctx.graph = scalars, heads, graph
        ctx.save_for_backward(x, w_q, w_k, w_v, w_s, y, m, z)
        return torch.add(out, skip).view(n, -1)

    @staticmethod
    @once_differentiable
    def backward(ctx, g_out: Tensor):
        x, w_q, w_k, w_v, w_s, y, m, z = ctx.saved_tensors
        n = x.shape[0]
        heads = ctx.heads
        g_y = y.new_empty(4, n, heads, y.shape[2] // heads)  # q's, k's, v's and the skip's gradients
        g_q, g_k, g_v, g_skip = g_y.unbind(0)
        g_skip.copy_(g_out.view(g_skip.shape))  # the skip's gradient is the output's (and what the kernels read)
        q, k, v, _ = (t.view(n, heads, -1) for t in y.unbind(0))
        rowptr, col, t_rowptr, t_col, t_pos = ctx.graph
        # (out not kept: the dot attention's backward recomputes what it reads of it)
        BACKWARD.kernels["triton"](g_skip, y.new_empty(0), m, z, q, k, v, None, None, rowptr, col, None, t_rowptr, t_col,
                                   t_pos, *ctx.scalars, [True, True, True, False, False], (g_q, g_k, g_v))
        g_y = g_y.view(4, n, -1)
        # one product per weight, not one bmm of the four: a product summing over the N rows is
        # split over the rows by cuBLAS (split-K), a batched one is not (on an H100 at N = 10K the
        # bmm took 290 us of device time, at the step's end, against 4 x ~10 us)
        g_parts = g_y.unbind(0)
        g_wq, g_wk, g_wv, g_ws = (torch.mm(g.t(), x) for g in g_parts)
        g_bq, g_bk, g_bv, g_bs = g_y.sum(1).unbind(0)
        g_x = None
        if ctx.needs_input_grad[3]:
            g_x = torch.mm(g_parts[0], w_q)
            for g, w in zip(g_parts[1:], (w_k, w_v, w_s)):
                g_x = torch.addmm(g_x, g, w)
        return None, None, None, g_x, g_wq, g_bq, g_wk, g_bk, g_wv, g_bv, g_ws, g_bs


_apply = function_apply(TransformerNode)  # (the C apply: callers checked eager_route_ok)


def applies(layer, x) -> bool:
    """Whether TransformerConv's call may take this route (module doc); the caller has checked that
    there are no edge features (``lin_edge`` None)."""
    if not (isinstance(x, Tensor) and x.dim() == 2 and layer.concat and layer.root_weight and layer.lin_beta is None):
        return False
    linears = (layer.lin_query, layer.lin_key, layer.lin_value, layer.lin_skip)
    if not all(plain_linear(lin) and lin.bias is not None for lin in linears):
        return False
    tensors = [x] + [t for lin in linears for t in (lin.weight, lin.bias)]
    if any(t.dtype != x.dtype for t in tensors) or any(lin.weight.shape != linears[0].weight.shape for lin in linears):
        return False
    if 4 * x.shape[0] * linears[0].weight.shape[0] * x.element_size() >= _recompute.MIN_BYTES:
        return False
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors) and eager_route_ok(tensors)):
        return False
    return resolve_backend(layer.gnnfuse_backend, x.device) == "triton"


def transformer_node(layer, x: Tensor, edge_index, scale: float, dropout: float) -> Tensor:
    """The layer's ``out [N, H*C]`` (skip added) through TransformerNode (after the pair ops' checks of the graph)."""
    csr, seed = checked_graph(x, x.shape[0], edge_index, 0.0, dropout, None)
    if csr.col.device != x.device:
        raise ValueError(f"all tensors must be on one device; got x on {x.device}, edge_index on {csr.col.device}")
    graph = (csr.rowptr, csr.col, *csr.transpose_parts())
    q, k, v, s = layer.lin_query, layer.lin_key, layer.lin_value, layer.lin_skip
    return _apply(graph, (False, False, 0.0, float(scale), float(dropout), seed), layer.heads, x, q.weight, q.bias,
                  k.weight, k.bias, v.weight, v.bias, s.weight, s.bias)
