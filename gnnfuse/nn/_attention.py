"""PyG's GATConv with fused attention (:func:`gnnfuse.gat_attention`).

Same constructor, parameters, state_dict and forward signature as
:class:`torch_geometric.nn.GATConv`; the attention coefficients are never materialised: no
[E, H] logits, no [E, H, C] messages, forward or backward. What differs from PyG's code path:

* self loops (``add_self_loops=True``) are not appended to a copy of the graph: the kernel skips
  the graph's own loops and adds one virtual loop per node (PyG's remove + add semantics, same
  numbers), so the graph's CSR is sorted once and shared by every layer and epoch;
* the edge term ``att_edge . lin_edge(edge_attr)`` is computed as ``edge_attr @ w_eff.T`` with
  ``w_eff [H, edge_dim]`` folded from lin_edge and att_edge (no [E, H * C] tensor), in CSR order
  (the order the kernels walk the edges): a constant edge_attr is reordered once per graph, cached
  (EDGES_IN_CSR_ORDER), one with a gradient on every call, the narrower of edge_attr [E, edge_dim]
  and the terms [E, H]; the self loops' edge features follow ``fill_value`` exactly as PyG's
  ``add_self_loops`` (for a constant edge_attr, cached too);
* the attention logits' node terms are ``x @ w_att.T`` with ``w_att [H, in]`` folded from the
  projection's weight and ``att_src`` / ``att_dst`` (no [N, H, C] product, forward or backward),
  and the projection ``lin(x)`` the kernel saves is recomputed in the backward from ``x``
  (``_recompute.py``): one [N, H * C] tensor less alive at a training step's peak (a projection
  under ``_recompute.MIN_BYTES`` is kept: on small graphs the host's time per step is what counts);
* attention dropout is drawn inside the kernel (counter-based, seeded from torch's generator, so
  ``torch.manual_seed`` reproduces it), not by ``F.dropout``: same distribution, another mask.

Falls back to PyG's own forward, with a one-time warning naming the reason, for
``return_attention_weights``, sparse adjacency tensors, an explicit ``size``, ``x_dst=None``,
explain mode, propagate hooks and ``flow="target_to_source"``.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch_geometric.nn import MessagePassing
from torch import Tensor
from torch_geometric.utils import scatter

from .._tensor_cache import cached
from ..csr import CSR
from ..ops._edge_order import in_csr_order
from ..ops.attention import _run as gat_run
from ..ops.gather_scatter import _as_csr
from ._layers import FUSED_CLASSES
from ._mixin import _HOOK_DICTS, csr_to_edge_index, edge_endpoints
from ._gat_node import applies as node_applies
from ._gat_node import gat_node
from ._projections import GATProjection, linear_params, param, submodule
from ._recompute import recompute

__all__ = ["GATConv"]
_warned: set[tuple[str, str]] = set()


def _warn_once(layer: str, reason: str) -> None:
    if (layer, reason) not in _warned:
        _warned.add((layer, reason))
        warnings.warn(f"gnnfuse.nn.{layer}: {reason}; running PyG's own forward", stacklevel=3)


class GATConv(pyg_nn.GATConv):
    """:class:`torch_geometric.nn.GATConv` with fused attention (see the module doc)."""

    gnnfuse_backend: str = "auto"
    gnnfuse_fused_projections = True  # projection + attention terms as one autograd node (nn/_projections.py)
    gnnfuse_checks_per_call = True  # fuse(): this class decides per call whether the fused path applies
    # PyG builds the fallback's propagate/edge_updater templates from these comments in the class source:
    # propagate_type: (x: OptPairTensor, alpha: Tensor)
    # edge_updater_type: (alpha: OptPairTensor, edge_attr: OptTensor)
    # PyG records `cls.propagate` as the class's original propagate (used in explain mode and for
    # decomposed_layers) on first instantiation; inherited, that would be the stock class's generated
    # template, which supports neither. Naming the generic one here keeps explainers working.
    propagate = MessagePassing.propagate

    def forward(self, x, edge_index, edge_attr=None, size=None, return_attention_weights=None):
        reason = self._why_not_fused(x, edge_index, size, return_attention_weights)
        if reason is not None:
            _warn_once(type(self).__name__, reason)
            if isinstance(edge_index, CSR):
                edge_index = csr_to_edge_index(edge_index)
            return super().forward(x, edge_index, edge_attr, size, return_attention_weights)
        H, C = self.heads, self.out_channels
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        res = self.res(x_dst) if self.res is not None else None
        lin = submodule(self, "lin")
        lin_src, lin_dst = (lin, lin) if lin is not None else (self.lin_src, self.lin_dst)
        shared = self.gnnfuse_fused_projections and lin_src is lin_dst and x_src is x_dst
        params = linear_params(lin_src) if shared else None  # (no bool() of a tuple: torch 2.11's dynamo rejects it)
        default = params is not None and params[1] is None  # PyG's default layer (one bias-free linear)
        dropout = self.dropout if self.training else 0.0
        if default and (edge_attr is None or self.lin_edge is None) and node_applies(self, x_src, params[0]):
            bias = param(self, "bias")
            if self.concat and res is None and bias is not None:  # the bias added in the node too
                return gat_node(self, x_src, edge_index, params[0], dropout, bias)
            out = gat_node(self, x_src, edge_index, params[0], dropout)  # one autograd node (_gat_node.py)
        else:
            out = self._attention(x_src, x_dst, edge_index, edge_attr, lin_src, lin_dst, default, dropout)
        out = out.reshape(-1, H * C) if self.concat else out.mean(dim=1)
        if res is not None:
            out = out + res
        if self.bias is not None:
            out = out + self.bias
        return out

    def _attention(self, x_src, x_dst, edge_index, edge_attr, lin_src, lin_dst, default: bool, dropout: float):
        """out [N_dst, H, C] through GATProjection (``default``: PyG's default layer) or the layer's
        own linears, and the fused attention op."""
        H, C = self.heads, self.out_channels
        if default:
            h_src, alpha_src, alpha_dst = GATProjection.apply(x_src, lin_src.weight, self.att_src, self.att_dst)
            h_src = h_src.view(-1, H, C)
        else:
            h_src = lin_src(x_src).view(-1, H, C)
            alpha_src = attention_logits(lin_src, x_src, self.att_src)
            alpha_dst = attention_logits(lin_dst, x_dst, self.att_dst)
        alpha_edge = alpha_loop = None
        graph = edge_index
        if edge_attr is not None and self.lin_edge is not None:
            alpha_edge, alpha_loop, graph = self._edge_terms(edge_attr, edge_index, h_src, x_dst.shape[0])
        # the op saves h_src for its backward: keep x_src (kept anyway) and make h_src again there
        with recompute(h_src, lambda: F.linear(x_src, lin_src.weight, lin_src.bias).view(-1, H, C),
                       (x_src, lin_src.weight) if lin_src.bias is None else (x_src, lin_src.weight, lin_src.bias)):
            return gat_run(h_src, alpha_src, alpha_dst, graph, alpha_edge, alpha_loop, self.negative_slope, dropout,
                           None, self.add_self_loops, self.gnnfuse_backend, csr_edges=True)

    def _edge_terms(self, edge_attr: Tensor, edge_index, like: Tensor, num_dst: int):
        """(alpha_edge [E, H] in CSR order, with self loops alpha_loop [N_dst, H] (PyG's fill_value
        rules) else None, the graph as a CSR). A constant edge_attr's reorder is cached
        (raw_in_csr_order); one with a gradient is reordered on every call, whichever of edge_attr
        [E, edge_dim] and alpha_edge [E, H] is narrower (in_csr_order's gradient takes it back)."""
        H, C = self.heads, self.out_channels
        if edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        weight = self.lin_edge.weight  # [H * C, edge_dim]; lin_edge has no bias in GATConv
        w_eff = (weight.view(H, C, -1) * self.att_edge.view(H, C, 1)).sum(1)  # [H, edge_dim]
        csr = _as_csr(edge_index, like, num_dst)
        if csr_order_applies(edge_attr):
            alpha_edge = raw_in_csr_order(edge_attr, csr) @ w_eff.t()
        elif edge_attr.shape[1] < H:
            alpha_edge = in_csr_order(edge_attr, csr.perm) @ w_eff.t()
        else:
            alpha_edge = in_csr_order(edge_attr @ w_eff.t(), csr.perm)
        if not self.add_self_loops:
            return alpha_edge, None, csr
        return alpha_edge, loop_attr(edge_attr, edge_index, csr, num_dst, self.fill_value) @ w_eff.t(), csr

    def _why_not_fused(self, x, edge_index, size, return_attention_weights) -> str | None:
        return why_not_fused(self, x, edge_index, size, return_attention_weights)


def attention_logits(lin, x: Tensor, att: Tensor) -> Tensor:
    """``(lin(x).view(-1, H, C) * att).sum(-1)`` [N, H] as ``x @ w_att.T`` with ``w_att [H, in]``
    folded from lin's weight and ``att [1, H, C]``: no [N, H, C] product forward and no [N, H, C]
    gradient backward (the weights' gradients come through the small fold)."""
    if isinstance(lin.weight, torch.nn.parameter.UninitializedParameter):
        lin(x)  # a lazy Linear takes its input width from its first call
    H, C = att.shape[-2], att.shape[-1]
    # one batched product per fold (forward one launch, backward two), not a product and a sum
    w_att = torch.einsum("hci,hc->hi", lin.weight.view(H, C, -1), att.view(H, C))
    b_att = None if lin.bias is None else torch.einsum("hc,hc->h", lin.bias.view(H, C), att.view(H, C))
    return F.linear(x, w_att, b_att)


# Edge features in CSR order (GATConv here, GATv2Conv and TransformerConv in _pair_attention.py): for a
# constant edge_attr (no gradient, eager mode, not an inference tensor) the layers reorder the raw
# features [E, edge_dim] once per (tensor, graph), cached (lin(a)[perm] == lin(a[perm])), and compute
# their edge terms in the order the kernels walk the edges. GATConv's kernels read [E, H] terms in CSR
# order only, so without the cache (an edge_attr with a gradient, EDGES_IN_CSR_ORDER False) it reorders
# them on every call; the pair layers' kernels can read [E, H, C] rows through the CSR's perm instead, and
# do so then (benchmarks/results/attention-edge-terms_h100_2026-11-24_edgefeat.md: a per-call reorder of
# [E, 16] costs them more than the in-order read saves). The self loops' features of a constant edge_attr
# (PyG's fill_value reduce) are cached as well.
EDGES_IN_CSR_ORDER = True


def constant_edge_attr(edge_attr: Tensor) -> bool:
    """Whether values derived from ``edge_attr`` may be cached: no gradient, not compiling, not an
    inference tensor (which has no version counter)."""
    return (not torch.compiler.is_compiling() and not edge_attr.requires_grad
            and not edge_attr.is_inference())  # (Dynamo cannot trace is_inference: compiling is asked first)


def csr_order_applies(edge_attr: Tensor) -> bool:
    """Whether the layers take ``edge_attr``'s cached copy in CSR order (see EDGES_IN_CSR_ORDER)."""
    return EDGES_IN_CSR_ORDER and constant_edge_attr(edge_attr)


def raw_in_csr_order(edge_attr: Tensor, csr: CSR) -> Tensor:
    """The constant raw edge features [E, edge_dim] in CSR order, cached per (tensor, graph) as
    ops.gather_scatter's edge weights (the cache's stamp sees in-place changes)."""
    return cached("csr_order_edge_attr", (edge_attr, csr.perm), (), lambda: in_csr_order(edge_attr, csr.perm))


def loop_attr(edge_attr: Tensor, edge_index, csr: CSR | None, num_dst: int, fill) -> Tensor:
    """``self_loop_attr``, cached per (tensor, graph) for a constant edge_attr with a reduce
    ``fill`` (a scatter over every edge on each call otherwise); ``csr``: edge_index's (None: not cached)."""
    if csr is None or not isinstance(fill, str) or not constant_edge_attr(edge_attr):
        return self_loop_attr(edge_attr, edge_index, num_dst, fill)
    return cached("self_loop_edge_attr", (edge_attr, csr.perm, csr.rowptr, csr.col), (num_dst, fill),
                  lambda: self_loop_attr(edge_attr, edge_index, num_dst, fill))  # (the graph: all three of its parts)


def self_loop_attr(edge_attr: Tensor, graph, num_dst: int, fill) -> Tensor:
    """[num_dst, edge_dim] features of the self loops PyG's ``add_self_loops(..., fill_value=fill)``
    appends after removing the graph's own loops: a reduce of each node's incoming non-loop edge
    features ("add"/"sum"/"mean"/"max"/...), or the constant ``fill``. Raw features: [E, edge_dim]."""
    if isinstance(fill, str):  # reduce of the node's incoming (non-loop) edge features
        src, dst = edge_endpoints(graph)
        not_loop = (src != dst).unsqueeze(1).to(edge_attr.dtype)
        if fill in ("add", "sum", "mean"):
            loop_attr = scatter(edge_attr * not_loop, dst.long(), 0, num_dst, reduce="sum")
            if fill == "mean":
                count = scatter(not_loop, dst.long(), 0, num_dst, reduce="sum")
                loop_attr = loop_attr / count.clamp(min=1)
            return loop_attr
        kept = src != dst
        return scatter(edge_attr[kept], dst[kept].long(), 0, num_dst, reduce=fill)
    fill_t = torch.as_tensor(fill, dtype=edge_attr.dtype, device=edge_attr.device)
    return fill_t.expand(num_dst, edge_attr.shape[1])


def why_not_fused(layer, x, edge_index, size, return_attention_weights) -> str | None:
    """Why an attention layer's call cannot take the fused path (None: it can); shared by the layers."""
    if return_attention_weights is not None:
        return "return_attention_weights is set (the fused kernel never materialises the coefficients)"
    if size is not None:
        return "an explicit size is given"
    if not (isinstance(edge_index, CSR) or (isinstance(edge_index, Tensor) and edge_index.layout == torch.strided
                                             and edge_index.dim() == 2)):
        return f"edge_index is a {type(edge_index).__name__} (sparse adjacency)"
    if not isinstance(x, Tensor) and (len(x) != 2 or x[1] is None):
        return "x_dst is None"
    if layer.explain or layer.flow != "source_to_target" or (layer.decomposed_layers or 1) > 1:
        return "explain mode, flow='target_to_source' or decomposed_layers"
    if any(getattr(layer, name, None) for name in _HOOK_DICTS):
        return "propagate/message/aggregate hooks are registered"
    return None


FUSED_CLASSES[pyg_nn.GATConv] = GATConv

from . import _pair_attention  # noqa: E402, F401  (registers GATv2Conv and TransformerConv with fuse())
