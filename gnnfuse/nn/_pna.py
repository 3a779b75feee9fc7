"""PyG's PNAConv with its aggregators computed in one fused pass and no per-edge messages.

PNA's message is ``pre_nn(cat[x_i, x_j])``; with one pre-layer (PyG's default) that is the linear
map ``A x_i + B x_j + b``, so for each target i

    sum_j m = deg(i) z_i + sum_j y_j,   mean/max/min_j m = z_i + mean/max/min_j y_j,
    var/std_j m = var/std_j y_j,         with y = B x (per source) and z = A x + b (per target).

The layer computes y and z with two dense matmuls, reduces y for every aggregator in one pass of
:func:`gnnfuse.fused_gather_scatter` (no E x F message tensor, forward or backward), adds the z
terms, then applies PyG's degree scalers and post-layers unchanged. Same constructor, parameters
and state_dict as PyG's class. PyG's own code runs for what this does not cover: edge features
(``edge_dim``), more than one pre-layer, the "mul" aggregator, a sparse-tensor adjacency, explain
mode, hooks and non-default ``flow``.
"""
from __future__ import annotations

import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch.nn.parameter import UninitializedParameter

from ..csr import CSR
from ..ops.gather_scatter import fused_gather_scatter
from .aggr import reduce_of

__all__ = ["PNAConv"]

_HOOKS = ("_propagate_forward_pre_hooks", "_propagate_forward_hooks", "_message_forward_pre_hooks",
          "_message_forward_hooks", "_aggregate_forward_pre_hooks", "_aggregate_forward_hooks")
# how much of the target term z_i each aggregator carries, as a function of the in-degree
_SHIFT = {"sum": lambda deg: deg, "mean": lambda deg: (deg > 0).to(deg.dtype),
          "max": lambda deg: (deg > 0).to(deg.dtype), "min": lambda deg: (deg > 0).to(deg.dtype)}


class PNAConv(pyg_nn.PNAConv):
    """:class:`torch_geometric.nn.PNAConv` (same signature, parameters, state_dict, results) with
    the aggregation fused; see the module docstring for when PyG's path runs instead."""

    def forward(self, x: Tensor, edge_index, edge_attr: Tensor | None = None) -> Tensor:
        names = self._fused_aggregators(x, edge_index, edge_attr)
        if names is None:
            # PyG generates this class's propagate from the comment below (its parent's forward calls it):
            # propagate_type: (x: Tensor, edge_attr: OptTensor)
            return super().forward(x, edge_index, edge_attr)
        T, F = self.towers, self.F_in
        N = x.shape[0]
        xt = x.view(-1, T, F) if self.divide_input else x.view(-1, 1, F).repeat(1, T, 1)
        lins = [nn[0] for nn in self.pre_nns]
        weight = torch.stack([lin.weight for lin in lins])  # [T, F, 2F]: [A | B], A acts on x_i
        z = torch.einsum("ntf,tgf->ntg", xt, weight[..., :F])
        if lins[0].bias is not None:
            z = z + torch.stack([lin.bias for lin in lins])
        y = torch.einsum("ntf,tgf->ntg", xt, weight[..., F:])
        agg = fused_gather_scatter(y.reshape(N, T * F), edge_index, names, num_nodes=N)
        agg = agg.view(N, len(names), T, F).transpose(1, 2)  # [N, T, K, F], PyG's order
        deg = _in_degree(edge_index, N, x.dtype)
        shift = torch.stack([_SHIFT[n](deg) if n in _SHIFT else torch.zeros_like(deg) for n in names], dim=1)
        agg = agg + shift.view(N, 1, -1, 1) * z.unsqueeze(2)
        out = self._scale(agg.reshape(N, T, -1), deg)
        out = torch.cat([xt, out], dim=-1)
        out = torch.cat([nn(out[:, i]) for i, nn in enumerate(self.post_nns)], dim=1)
        return self.lin(out)

    def _scale(self, out: Tensor, deg: Tensor) -> Tensor:
        """PyG's DegreeScalerAggregation scalers, on [N, T, K*F]."""
        aggr = self.aggr_module
        deg = deg.view(-1, 1, 1)
        outs = []
        for scaler in aggr.scaler:
            if scaler == "identity":
                outs.append(out)
            elif scaler == "amplification":
                outs.append(out * (torch.log(deg + 1) / aggr.avg_deg_log))
            elif scaler == "attenuation":
                outs.append(out * (aggr.avg_deg_log / torch.log(deg.clamp(min=1) + 1)))
            elif scaler == "linear":
                outs.append(out * (deg / aggr.avg_deg_lin))
            elif scaler == "inverse_linear":
                outs.append(out * (aggr.avg_deg_lin / deg.clamp(min=1)))
            else:
                raise ValueError(f"Unknown scaler '{scaler}'")
        return torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]

    def _fused_aggregators(self, x, edge_index, edge_attr) -> list[str] | None:
        """The aggregator names when the fused path applies, else None."""
        if edge_attr is not None or self.edge_dim is not None or self.explain:
            return None
        if self.decomposed_layers != 1 or self.flow != "source_to_target":
            return None
        if not isinstance(edge_index, (Tensor, CSR)) or (isinstance(edge_index, Tensor) and
                                                         (edge_index.layout != torch.strided or edge_index.dim() != 2)):
            return None
        if not isinstance(x, Tensor) or not x.is_floating_point() or any(len(getattr(self, h)) for h in _HOOKS):
            return None
        if any(len(nn) != 1 or isinstance(nn[0].weight, UninitializedParameter) for nn in self.pre_nns):
            return None
        names = reduce_of(self.aggr_module.aggr)
        names = [names] if isinstance(names, str) else names
        if not names or any(n not in _SHIFT and n not in ("var", "std") for n in names):
            return None
        return names


def _in_degree(edge_index, num_nodes: int, dtype: torch.dtype) -> Tensor:
    if isinstance(edge_index, CSR):
        return edge_index.in_degree().to(dtype)
    target = edge_index[1]
    return torch.zeros(num_nodes, dtype=dtype, device=target.device).index_add_(
        0, target, torch.ones_like(target, dtype=dtype))
