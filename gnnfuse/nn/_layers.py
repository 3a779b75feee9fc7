"""PyG's GCNConv, SAGEConv, GINConv and GraphConv with fused aggregation.

Each class subclasses the PyG class of the same name and adds nothing but behaviour: constructor,
parameters, state_dict keys, forward signature and ``repr`` are PyG's. GINConv needs no code
beyond the mixin. SAGEConv and GraphConv with sum/mean aggregate after their linear map when the
layer narrows (:class:`_LinearFirst`). GCNConv normalises differently (same numbers):

PyG's ``gcn_norm`` builds a new edge_index with the self-loops appended, which would have to be
sorted again on every call (or once per layer with ``cached=True``). Here the graph stays the one
the user passed, so its CSR (sorted once per graph, cached on the tensor) is shared by every layer
and epoch; self-loops become a separate diagonal term:

    out = A_w x + loop_norm * x,   A_w = the user's edges with weight dinv[j] w_ji dinv[i]
                                   (existing self-loops get weight 0 and move into loop_norm).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.nn.dense.linear import Linear as PygLinear

from ..csr import CSR, csr_for_edge_index
from ._message_form import message_form
from ._mixin import (REDUCE_OF_AGGR, FusedMessagePassing, constant_result, csr_to_edge_index, edge_endpoints,
                     graph_tensors)

__all__ = ["GCNConv", "GINConv", "GraphConv", "SAGEConv", "gcn_norm_weights"]


def gcn_norm_weights(graph: Tensor | CSR, edge_weight: Tensor | None, num_nodes: int, improved: bool = False,
                     add_self_loops: bool = True, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor | None]:
    """PyG's ``gcn_norm`` (flow source_to_target) without rebuilding the graph.

    Returns ``(norm [E], loop_norm [N] or None)``: ``norm`` in the graph's original edge order
    (existing self-loops get 0 when ``add_self_loops``), ``loop_norm`` the weight of each node's
    single self-loop, as ``add_remaining_self_loops`` would give it. Differentiable in edge_weight.
    """
    src, dst = edge_endpoints(graph)
    num_edges = src.shape[0]
    device = src.device
    if edge_weight is None:
        w = torch.ones(num_edges, dtype=dtype, device=device)
    else:
        w = edge_weight
    # As PyG 2.8: without edge weights the added self-loops get weight 1 even when improved=True
    # (add_remaining_self_loops only applies fill_value to an edge_attr it is given).
    fill = 2.0 if improved and edge_weight is not None else 1.0
    loop_w = None
    if add_self_loops:
        is_loop = src == dst
        loop_ext = torch.full((num_nodes + 1,), fill, dtype=w.dtype, device=device)
        if edge_weight is not None:  # an existing self-loop keeps its weight (without weights: 1)
            slot = torch.where(is_loop, src.long(), num_nodes)  # non-loops write a scratch slot
            loop_ext = loop_ext.index_put((slot,), w)
        loop_w = loop_ext[:num_nodes]
        w = torch.where(is_loop, torch.zeros_like(w), w)
    deg = torch.zeros(num_nodes, dtype=w.dtype, device=device).index_add(0, dst, w)
    if loop_w is not None:
        deg = deg + loop_w
    dinv = deg.pow(-0.5)
    dinv = dinv.masked_fill(dinv == float("inf"), 0.0)
    norm = dinv[src] * w * dinv[dst]
    loop_norm = None if loop_w is None else dinv * loop_w * dinv
    return norm, loop_norm


_PYG_GCN_FORM = message_form(pyg_nn.GCNConv)


class GCNConv(FusedMessagePassing, pyg_nn.GCNConv):
    """:class:`torch_geometric.nn.GCNConv` with fused aggregation (same arguments and results).

    With ``cached=True`` the normalisation is computed on the first call and reused (as in PyG);
    it lives in ``_gnnfuse_cached`` (PyG's ``_cached_edge_index`` is left None, and if a stock
    layer already filled it before :func:`gnnfuse.nn.fuse`, that cache is used as is).

    PyG applies ``lin`` first and aggregates ``x @ W.T``. Where aggregating ``x`` itself moves
    fewer features (the pass counts of :class:`_LinearFirst`: a first layer, whose raw input needs
    no gradient, aggregates it once forward, where ``x @ W.T`` needs a forward and a backward
    pass), this layer computes ``lin(A_w x + loop_norm * x)`` instead: same maths, different
    rounding. That propagated input is then constant across epochs and is kept
    (:func:`gnnfuse.nn._mixin.constant_result`). ``gnnfuse_aggregate_first = False`` keeps PyG's order.
    """

    gnnfuse_aggregate_first: bool = True

    def reset_parameters(self):
        super().reset_parameters()
        self._gnnfuse_cached = None

    def forward(self, x: Tensor, edge_index, edge_weight: Tensor | None = None) -> Tensor:
        if not self._fused_norm_applies(x, edge_index):
            if isinstance(edge_index, CSR):
                edge_index = csr_to_edge_index(edge_index)
            return super().forward(x, edge_index, edge_weight)
        cache = getattr(self, "_gnnfuse_cached", None)
        if cache is None:
            num_nodes: int = x.size(self.node_dim)  # type: ignore[assignment]
            if not isinstance(edge_index, CSR) and not torch.compiler.is_compiling():
                # the normalisation indexes by node id: sort (and range-check) the graph first, so that
                # a bad id raises gnnfuse's error quoting it; propagate below reuses this cached CSR
                csr_for_edge_index(edge_index, num_nodes, num_nodes)
            cache = gcn_norm_weights(edge_index, edge_weight, num_nodes, self.improved,
                                     self.add_self_loops, x.dtype)
            if self.cached:
                self._gnnfuse_cached = cache
        norm, loop_norm = cache
        if self._aggregates_first(x):
            def propagated() -> Tensor:
                h = self.propagate(edge_index, x=x, edge_weight=norm)
                return h if loop_norm is None else h + loop_norm.view(-1, 1) * x

            sources = (x, *graph_tensors(edge_index), norm) + (() if loop_norm is None else (loop_norm,))
            out = self.lin(constant_result("gcn_propagate", sources, (self.gnnfuse_backend,), propagated))
        else:
            x = self.lin(x)
            out = self.propagate(edge_index, x=x, edge_weight=norm)
            if loop_norm is not None:
                out = out + loop_norm.view(-1, 1) * x
        if self.bias is not None:
            out = out + self.bias
        return out

    def _aggregates_first(self, x: Tensor) -> bool:
        """Whether aggregating ``x`` before ``lin`` moves fewer features than PyG's order (see the class)."""
        lin = self.lin
        if not self.gnnfuse_aggregate_first or type(lin) is not PygLinear or lin._forward_hooks \
                or lin._forward_pre_hooks or isinstance(lin.weight, torch.nn.parameter.UninitializedParameter):
            return False
        if not isinstance(x, Tensor) or x.dim() != 2:
            return False
        aggregate_first, linear_first = pass_widths(lin, x, lin.weight.shape[0])
        return aggregate_first < linear_first

    def _fused_norm_applies(self, x, edge_index) -> bool:
        """The self-loop term is added outside message(): only valid when the message is PyG's
        GCN message and nothing (explain, hooks, decomposition, tracing, ...) observes the messages."""
        if not self.normalize or isinstance(x, (tuple, list)) or self._cached_edge_index is not None:
            return False  # PyG raises for pairs; a stock cache is honoured by PyG's forward
        if type(self.aggr_module) is not pyg_nn.aggr.SumAggregation:
            return False  # gcn_norm + a non-sum aggregation: PyG's forward, fused propagate
        if self._gnnfuse_form != _PYG_GCN_FORM or self._gnnfuse_why_pyg() is not None:
            return False  # PyG's forward; its propagate call says why (once)
        return isinstance(edge_index, CSR) or (isinstance(edge_index, Tensor) and edge_index.layout == torch.strided)


def pass_widths(lin, x_src: Tensor, out_width: int, backward_cost: float = 1.5) -> tuple[float, float]:
    """(features moved aggregating ``x_src`` then applying ``lin``, the same for ``x_src @ W.T`` then
    aggregating), a backward pass counted as ``backward_cost`` forward ones (see _LinearFirst)."""
    grad = torch.is_grad_enabled()
    x_pass = 1 + backward_cost * (grad and x_src.requires_grad)
    xw_pass = 1 + backward_cost * (grad and (x_src.requires_grad or lin.weight.requires_grad))
    return x_src.shape[1] * x_pass, out_width * xw_pass


# _LinearFirst is mixed into fused MessagePassing layers; type checkers see it as one.
_LinearFirstBase = FusedMessagePassing if TYPE_CHECKING else object


class _LinearFirst(_LinearFirstBase):  # type: ignore[misc,valid-type]
    """Aggregate after the linear map when that moves fewer features.

    For sum and mean, ``lin(aggr(x)) = aggr(x @ W.T) + b`` (also on rows without edges, where both
    give ``b``). When the layer narrows (out_channels < in_channels) the right side aggregates
    out_channels features instead of in_channels: on a 2-layer SAGE model the second layer's
    forward and backward aggregations shrink from the hidden width to the class count. DGL's
    SAGEConv makes the same choice. Same maths, different rounding (like the CSR summation order).
    Set ``gnnfuse_linear_first = False`` (class or instance) for PyG's order of operations.

    One catch: when x needs no gradient (raw input features) but W does, aggregating first needs
    no backward aggregation at all, while ``x @ W.T`` needs one. So the choice compares widths
    times passes, a backward pass counted as ``_BACKWARD_COST`` forward ones (the CPU kernels'
    ratio on Facebook at F=64, 2026-11-21: 1.3-1.5).
    """

    gnnfuse_linear_first: bool = True
    _BACKWARD_COST = 1.5

    def _linear_first_pays(self, lin, x_src: Tensor, out_width: int) -> bool:
        aggregate_first, linear_first = pass_widths(lin, x_src, out_width, self._BACKWARD_COST)
        return linear_first < aggregate_first

    def _narrowing_weight(self, lin, x, edge_index, size, extra) -> Tensor | None:
        """``lin``'s weight when aggregating ``x[0] @ W.T`` runs fused and costs less, else None."""
        if not self.gnnfuse_linear_first or REDUCE_OF_AGGR.get(type(self.aggr_module)) not in ("sum", "mean"):
            return None
        if type(lin) is not PygLinear or lin._forward_hooks or lin._forward_pre_hooks:
            return None
        weight = lin.weight
        if isinstance(weight, torch.nn.parameter.UninitializedParameter):
            return None  # lazy in_channels=-1 before its first call
        x_src = x[0]
        if not isinstance(x_src, Tensor) or x_src.dim() != 2 or not self._linear_first_pays(lin, x_src, weight.shape[0]):
            return None
        if isinstance(self._gnnfuse_plan(edge_index, size, dict(extra, x=x)), str):
            return None  # PyG's propagate runs: keep its order, so its hooks see what they expect
        return weight

    def _aggregate_then_linear(self, lin, x, edge_index, size, **extra) -> Tensor:
        """``lin(propagate(x))``, computed as ``propagate(x @ W.T) + b`` when that is narrower."""
        weight = self._narrowing_weight(lin, x, edge_index, size, extra)
        if weight is None:
            return lin(self.propagate(edge_index, x=x, size=size, **extra))
        out = self.propagate(edge_index, x=(F.linear(x[0], weight), x[1]), size=size, **extra)
        return out if lin.bias is None else out + lin.bias


class SAGEConv(_LinearFirst, FusedMessagePassing, pyg_nn.SAGEConv):
    """:class:`torch_geometric.nn.SAGEConv`; aggr sum/mean/max/min fused (others run PyG's code).
    sum/mean aggregate after ``lin_l`` when the layer narrows (see :class:`_LinearFirst`)."""

    def forward(self, x, edge_index, size=None) -> Tensor:  # PyG 2.8's forward, lin_l moved
        if isinstance(x, Tensor):
            x = (x, x)
        if self.project and hasattr(self, "lin"):
            x = (self.lin(x[0]).relu(), x[1])
        out = self._aggregate_then_linear(self.lin_l, x, edge_index, size)
        x_r = x[1]
        if self.root_weight and x_r is not None:
            out = out + self.lin_r(x_r)
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out


class GINConv(FusedMessagePassing, pyg_nn.GINConv):
    """:class:`torch_geometric.nn.GINConv` with fused aggregation."""


class GraphConv(_LinearFirst, FusedMessagePassing, pyg_nn.GraphConv):
    """:class:`torch_geometric.nn.GraphConv` with fused aggregation (edge_weight supported).
    sum/mean aggregate after ``lin_rel`` when the layer narrows (see :class:`_LinearFirst`)."""

    def forward(self, x, edge_index, edge_weight=None, size=None) -> Tensor:  # PyG 2.8's forward
        if isinstance(x, Tensor):
            x = (x, x)
        out = self._aggregate_then_linear(self.lin_rel, x, edge_index, size, edge_weight=edge_weight)
        x_r = x[1]
        if x_r is not None:
            out = out + self.lin_root(x_r)
        return out


# Stock PyG class -> fused class, for gnnfuse.nn.fuse().
FUSED_CLASSES: dict[type, type] = {
    pyg_nn.GCNConv: GCNConv,
    pyg_nn.SAGEConv: SAGEConv,
    pyg_nn.GINConv: GINConv,
    pyg_nn.GraphConv: GraphConv,
}
