"""PyG's GATv2Conv and TransformerConv with fused attention (:func:`gnnfuse.gatv2_attention`,
:func:`gnnfuse.dot_attention`).

Same constructors, parameters, state_dict and forward signatures as the PyG layers; the dense parts
(projections, residual, skip, beta gate, bias) are PyG's own modules, the attention aggregation is
one fused kernel (no [E, H] logits or coefficients, no [E, H, C] messages, forward or backward).
GATv2Conv's self loops are PyG's remove + add, without copying the graph. Attention dropout is
drawn inside the kernel (counter-based, seeded from torch's generator): same distribution as
``F.dropout``, another mask.

Edge features (``edge_dim``): the projection ``lin_edge(edge_attr)`` [E, H * C] is computed as PyG
computes it (for GATv2Conv over the edges and then the self loops' features, whose rows follow
``fill_value`` as PyG's ``add_self_loops``: the small [E + N, edge_dim] raw features are
concatenated, not the projection); a constant edge_attr is put in CSR order first, once per graph
(_attention.EDGES_IN_CSR_ORDER: the kernel then reads the projected rows in the order it walks the
edges; its self loops' features are cached too), one with a gradient stays in edge_index order and the
kernel reads it through the CSR's permutation; the kernel writes the projection's gradient directly.
No [E, H, C] message, key or value tensor exists.

Falls back to PyG's own forward, with a one-time warning naming the reason, for
``return_attention_weights``, sparse adjacency tensors, ``x_dst=None``, explain mode, hooks and
``flow="target_to_source"``.
"""
from __future__ import annotations

import math

import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.nn import MessagePassing
from torch import Tensor

from ..csr import CSR
from ..ops.gather_scatter import _as_csr
from ..ops.pair_attention import _run, dot_attention, gatv2_attention
from ._attention import _warn_once, csr_order_applies, loop_attr, raw_in_csr_order, why_not_fused
from ._layers import FUSED_CLASSES
from ._mixin import csr_to_edge_index
from ._pair_node import applies as node_applies
from ._pair_node import node_bias, node_skip, pair_node
from ._projections import submodule

__all__ = ["GATv2Conv", "TransformerConv"]

# Edge features in CSR order (_attention.EDGES_IN_CSR_ORDER, shared with GATConv): the kernels read the
# projected rows [E, H, C] of a constant edge_attr in the order they walk the edges, row k for CSR
# position k, instead of row perm[k] (a dependent load, then a scattered row). H100, float32 forward
# kernels: 2-10% faster on 7 of 8 rows (GATv2 and the dot product, arxiv-like and rfc-uniform, 8x8 and
# 4x64), 2.5% slower on one (dot, arxiv-like 8x8). A reorder on every call (an edge_attr with a gradient)
# costs more than that (90 us on arxiv-like at edge_dim 16 against 10-30 us saved), so such a tensor stays
# in edge_index order (benchmarks/results/attention-edge-terms_h100_2026-11-24_edgefeat.md).


def _edge_terms(layer, edge_attr: Tensor, edge_index, like: Tensor, num_dst: int, loops: int):
    """(projected edge features [E (+ loops), H, C], the graph to pass, whether the rows are in CSR
    order): lin_edge of the raw features, the self loops' rows last (``loops`` of them, PyG's fill)."""
    edge_attr = edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr
    graph, csr_order = edge_index, False
    if csr_order_applies(edge_attr):
        graph = _as_csr(edge_index, like, num_dst)
        raw, csr_order = raw_in_csr_order(edge_attr, graph), True
    else:
        raw = edge_attr
    if loops:  # PyG's add_self_loops: the loops' features last (made from the edge_index order's rows)
        raw = torch.cat([raw, loop_attr(edge_attr, edge_index, graph if csr_order else None, loops, layer.fill_value)])
    return layer.lin_edge(raw).view(-1, layer.heads, layer.out_channels), graph, csr_order


def _fallback(base, layer, reason, x, edge_index, edge_attr, return_attention_weights):
    """PyG's own forward (``base``: the PyG class), after a one-time warning naming the reason."""
    _warn_once(type(layer).__name__, reason)
    if isinstance(edge_index, CSR):
        edge_index = csr_to_edge_index(edge_index)
    return base.forward(layer, x, edge_index, edge_attr, return_attention_weights)


class GATv2Conv(pyg_nn.GATv2Conv):
    """:class:`torch_geometric.nn.GATv2Conv` with fused attention (see the module doc)."""

    gnnfuse_backend: str = "auto"
    gnnfuse_checks_per_call = True  # fuse(): this class decides per call whether the fused path applies
    # PyG builds the fallback's propagate/edge_updater templates from these comments in the class source:
    # propagate_type: (x: PairTensor, alpha: Tensor)
    # edge_updater_type: (x: PairTensor, edge_attr: OptTensor)
    # PyG records `cls.propagate` as the class's original propagate (used in explain mode and for
    # decomposed_layers) on first instantiation; inherited, that would be the stock class's generated
    # template, which supports neither. Naming the generic one here keeps explainers working.
    propagate = MessagePassing.propagate

    def forward(self, x, edge_index, edge_attr=None, return_attention_weights=None):
        reason = why_not_fused(self, x, edge_index, None, return_attention_weights)
        if reason is None and edge_attr is not None and self.lin_edge is None:
            reason = "edge_attr is given but edge_dim is not set"  # PyG's own forward ignores it
        if reason is not None:
            return _fallback(pyg_nn.GATv2Conv, self, reason, x, edge_index, edge_attr, return_attention_weights)
        H, C = self.heads, self.out_channels
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        res = self.res(x_dst) if self.res is not None else None
        dropout = self.dropout if self.training else 0.0
        linears = (submodule(self, "lin_r"), submodule(self, "lin_l"), None)  # query, key (= value)
        if not self.share_weights and edge_attr is None and (
                params := node_applies(self, x_src, x_dst, linears, self.att)):
            bias = node_bias(self, x_dst)  # PyG's out + bias, inside the node where it may (_pair_node.py)
            out = pair_node(self, x_src, x_dst, edge_index, params, self.att, True, self.negative_slope, 1.0, dropout,
                            self.add_self_loops, bias=bias)  # one autograd node (_pair_node.py)
            return out if bias is not None else self._finish(out, res)
        x_l = self.lin_l(x_src).view(-1, H, C)
        x_r = x_l if (self.share_weights and x_dst is x_src) else self.lin_r(x_dst).view(-1, H, C)
        if edge_attr is None:
            out = gatv2_attention(x_l, x_r, self.att, edge_index, negative_slope=self.negative_slope,
                                  dropout=dropout, add_self_loops=self.add_self_loops, backend=self.gnnfuse_backend)
            return self._finish(out, res)
        loops = min(x_l.shape[0], x_r.shape[0]) if self.add_self_loops else 0
        edge, graph, csr_order = _edge_terms(self, edge_attr, edge_index, x_l, x_r.shape[0], loops)
        out = _run(x_r, x_l, x_l, self.att.reshape(H, C), edge, graph, True, self.negative_slope, 1.0, dropout, None,
                   self.add_self_loops, self.gnnfuse_backend, csr_edges=csr_order)
        return self._finish(out, res)

    def _finish(self, out, res):
        """PyG's tail: heads concatenated or averaged, the residual, the bias."""
        out = out.reshape(-1, self.heads * self.out_channels) if self.concat else out.mean(dim=1)
        if res is not None:
            out = out + res
        if self.bias is not None:
            out = out + self.bias
        return out


class TransformerConv(pyg_nn.TransformerConv):
    """:class:`torch_geometric.nn.TransformerConv` with fused attention (see the module doc)."""

    gnnfuse_backend: str = "auto"
    gnnfuse_checks_per_call = True
    # propagate_type: (query: Tensor, key:Tensor, value: Tensor, edge_attr: OptTensor)
    # PyG records `cls.propagate` as the class's original propagate (used in explain mode and for
    # decomposed_layers) on first instantiation; inherited, that would be the stock class's generated
    # template, which supports neither. Naming the generic one here keeps explainers working.
    propagate = MessagePassing.propagate

    def forward(self, x, edge_index, edge_attr=None, return_attention_weights=None):
        reason = why_not_fused(self, x, edge_index, None, return_attention_weights)
        lin_edge = submodule(self, "lin_edge")
        if reason is None and lin_edge is not None and edge_attr is None:
            reason = "edge_dim is set but no edge_attr is given"  # PyG's own forward decides what that means
        if reason is not None:
            return _fallback(pyg_nn.TransformerConv, self, reason, x, edge_index, edge_attr, return_attention_weights)
        H, C = self.heads, self.out_channels
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        dropout = self.dropout if self.training else 0.0
        linears = (submodule(self, "lin_query"), submodule(self, "lin_key"), submodule(self, "lin_value"))
        if lin_edge is None and (params := node_applies(self, x_src, x_dst, linears, None)):  # one node (_pair_node.py)
            skip = node_skip(self, x_dst)
            out = pair_node(self, x_src, x_dst, edge_index, params, None, False, 0.0, 1.0 / math.sqrt(C), dropout,
                            False, skip)
            if skip is not None:  # the skip was added inside the node
                return out
        else:
            query = self.lin_query(x_dst).view(-1, H, C)
            key = self.lin_key(x_src).view(-1, H, C)
            value = self.lin_value(x_src).view(-1, H, C)
            if self.lin_edge is None:
                out = dot_attention(query, key, value, edge_index, scale=1.0 / math.sqrt(C), dropout=dropout,
                                    backend=self.gnnfuse_backend)
            else:
                edge, graph, csr_order = _edge_terms(self, edge_attr, edge_index, key, query.shape[0], 0)
                out = _run(query, key, value, None, edge, graph, False, 0.0, 1.0 / math.sqrt(C), dropout, None, False,
                           self.gnnfuse_backend, csr_edges=csr_order)
        out = out.reshape(-1, H * C) if self.concat else out.mean(dim=1)
        if self.root_weight:
            x_r = self.lin_skip(x_dst)
            if self.lin_beta is not None:
                beta = self.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1)).sigmoid()
                out = beta * x_r + (1 - beta) * out
            else:
                out = out + x_r
        return out


FUSED_CLASSES[pyg_nn.GATv2Conv] = GATv2Conv
FUSED_CLASSES[pyg_nn.TransformerConv] = TransformerConv
