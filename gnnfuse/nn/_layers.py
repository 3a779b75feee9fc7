"""PyG's GCNConv, SAGEConv, GINConv and GraphConv with fused aggregation.

Each class subclasses the PyG class of the same name and adds nothing but behaviour: constructor,
parameters, state_dict keys, forward signature and ``repr`` are PyG's. SAGEConv, GINConv and
GraphConv need no code beyond the mixin. GCNConv normalises differently (same numbers):

PyG's ``gcn_norm`` builds a new edge_index with the self-loops appended, which would have to be
sorted again on every call (or once per layer with ``cached=True``). Here the graph stays the one
the user passed, so its CSR (sorted once per graph, cached on the tensor) is shared by every layer
and epoch; self-loops become a separate diagonal term:

    out = A_w x + loop_norm * x,   A_w = the user's edges with weight dinv[j] w_ji dinv[i]
                                   (existing self-loops get weight 0 and move into loop_norm).
"""
from __future__ import annotations

import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor

from ..csr import CSR
from ._mixin import FusedMessagePassing, csr_to_edge_index, edge_endpoints

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


class GCNConv(FusedMessagePassing, pyg_nn.GCNConv):
    """:class:`torch_geometric.nn.GCNConv` with fused aggregation (same arguments and results).

    With ``cached=True`` the normalisation is computed on the first call and reused (as in PyG);
    it lives in ``_gnnfuse_cached`` (PyG's ``_cached_edge_index`` is left None, and if a stock
    layer already filled it before :func:`gnnfuse.nn.fuse`, that cache is used as is).
    """

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
            cache = gcn_norm_weights(edge_index, edge_weight, x.size(self.node_dim), self.improved,
                                     self.add_self_loops, x.dtype)
            if self.cached:
                self._gnnfuse_cached = cache
        norm, loop_norm = cache
        x = self.lin(x)
        out = self.propagate(edge_index, x=x, edge_weight=norm)
        if loop_norm is not None:
            out = out + loop_norm.view(-1, 1) * x
        if self.bias is not None:
            out = out + self.bias
        return out

    def _fused_norm_applies(self, x, edge_index) -> bool:
        if not self.normalize or self.explain or self.flow != "source_to_target":
            return False
        if isinstance(x, (tuple, list)) or self._cached_edge_index is not None:
            return False  # PyG raises for pairs; a stock cache is honoured by PyG's forward
        if type(self.aggr_module) is not pyg_nn.aggr.SumAggregation:
            return False  # gcn_norm + a non-sum aggregation: PyG's forward, fused propagate
        return isinstance(edge_index, CSR) or (isinstance(edge_index, Tensor) and edge_index.layout == torch.strided)


class SAGEConv(FusedMessagePassing, pyg_nn.SAGEConv):
    """:class:`torch_geometric.nn.SAGEConv`; aggr sum/mean/max/min fused (others run PyG's code)."""


class GINConv(FusedMessagePassing, pyg_nn.GINConv):
    """:class:`torch_geometric.nn.GINConv` with fused aggregation."""


class GraphConv(FusedMessagePassing, pyg_nn.GraphConv):
    """:class:`torch_geometric.nn.GraphConv` with fused aggregation (edge_weight supported)."""


# Stock PyG class -> fused class, for gnnfuse.nn.fuse().
FUSED_CLASSES: dict[type, type] = {
    pyg_nn.GCNConv: GCNConv,
    pyg_nn.SAGEConv: SAGEConv,
    pyg_nn.GINConv: GINConv,
    pyg_nn.GraphConv: GraphConv,
}
