"""PyG's PNAConv with its aggregators computed in one fused pass and no per-edge messages.

PNA's message is ``pre_nn(cat[x_i, x_j])``; with one pre-layer (PyG's default) that is the linear
map ``A x_i + B x_j + b``, so for each target i

    sum_j m = deg(i) z_i + sum_j y_j,   mean/max/min_j m = z_i + mean/max/min_j y_j,
    var/std_j m = var/std_j y_j,         with y = B x (per source) and z = A x + b (per target).

The layer computes y and z with two dense matmuls and reduces each tower's y for every aggregator
in one pass of :func:`gnnfuse.ops.multi_aggregate.multi_aggregate` (no E x F message tensor,
forward or backward). The first post-layer is linear and PyG's degree scalers and the z terms are
per-node factors, so that layer is applied to the aggregation, to z and to x separately and the
parts weighted and added (see ``_tower``): the [N, (S*K + 1) * F] input PyG builds per tower (S
scalers, K aggregators) never exists; each tower keeps its [N, K*F] aggregation for the backward.
Further post-layers run unchanged. Same constructor, parameters
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
from ..ops.multi_aggregate import multi_aggregate
from .aggr import reduce_of

__all__ = ["PNAConv"]

_HOOKS = ("_propagate_forward_pre_hooks", "_propagate_forward_hooks", "_message_forward_pre_hooks",
          "_message_forward_hooks", "_aggregate_forward_pre_hooks", "_aggregate_forward_hooks")
# how much of the target term z_i each aggregator carries, as a function of the in-degree
_SHIFTED = ("sum", "mean", "max", "min")


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
        pre = [nn[0] for nn in self.pre_nns]
        weight = torch.stack([lin.weight for lin in pre])  # [T, F, 2F]: [A | B], A acts on x_i
        # y_t = B_t x (per source), z_t = A_t x + b_t (per target), tower-major [T, N, F] so that
        # each tower's y is one contiguous matrix for the aggregation
        if self.divide_input:
            xt = x.view(N, T, F)
            y = torch.einsum("ntf,tgf->tng", xt, weight[..., F:])
            z = torch.einsum("ntf,tgf->tng", xt, weight[..., :F])
        else:
            y = torch.einsum("nf,tgf->tng", x, weight[..., F:])
            z = torch.einsum("nf,tgf->tng", x, weight[..., :F])
        if pre[0].bias is not None:
            z = z + torch.stack([lin.bias for lin in pre]).unsqueeze(1)
        scale = None
        outs = []
        for t in range(T):
            agg, deg = multi_aggregate(y[t], edge_index, names, num_nodes=N, return_degree=True)  # [N, K*F]
            if scale is None:
                scale = self._scalers(deg)  # [N, S]
                shift = {"deg": deg, "nonempty": (deg > 0).to(deg.dtype)}
            x_t = x.view(N, T, F)[:, t] if self.divide_input else x
            outs.append(self._tower(t, agg, z[t], x_t, scale, shift, names))
        return self.lin(torch.cat(outs, dim=1))

    def _tower(self, t: int, agg: Tensor, z: Tensor, x_t: Tensor, scale: Tensor, shift: dict, names) -> Tensor:
        """Tower t's post-layers on cat[x_t, scaler_s * (agg_k + shift_k z)] for every scaler s and
        aggregator k, without building that [N, (S*K + 1) F] input: the first post-layer is linear
        and the scalers and shifts are per-node numbers, so it is the sum of x_t W_x, of
        scaler_s * (agg W_s) and of shift_c * scaler_s * (z W_c) (W_c: the blocks of the
        aggregators that carry the target term z with the same factor c)."""
        post = self.post_nns[t]
        lin = post[0]
        F, K, S = self.F_in, len(names), scale.shape[1]
        Fo = lin.weight.shape[0]
        w_agg = lin.weight[:, F:].view(Fo, S, K, F)
        p = agg @ w_agg.permute(2, 3, 1, 0).reshape(K * F, S * Fo)  # [N, S*Fo]
        for factor, ks in _shift_groups(names).items():
            w_z = w_agg[:, :, ks].sum(dim=2)  # [Fo, S, F]
            p = p + shift[factor].unsqueeze(1) * (z @ w_z.permute(2, 1, 0).reshape(F, S * Fo))
        h = torch.einsum("nso,ns->no", p.view(-1, S, Fo), scale) + x_t @ lin.weight[:, :F].t()
        if lin.bias is not None:
            h = h + lin.bias
        return post[1:](h) if len(post) > 1 else h

    def _scalers(self, deg: Tensor) -> Tensor:
        """PyG's DegreeScalerAggregation scalers as per-node factors [N, S] (identity: 1)."""
        aggr = self.aggr_module
        cols = []
        for scaler in aggr.scaler:
            if scaler == "identity":
                cols.append(torch.ones_like(deg))
            elif scaler == "amplification":
                cols.append(torch.log(deg + 1) / aggr.avg_deg_log)
            elif scaler == "attenuation":
                cols.append(aggr.avg_deg_log / torch.log(deg.clamp(min=1) + 1))
            elif scaler == "linear":
                cols.append(deg / aggr.avg_deg_lin)
            elif scaler == "inverse_linear":
                cols.append(aggr.avg_deg_lin / deg.clamp(min=1))
            else:
                raise ValueError(f"Unknown scaler '{scaler}'")
        return torch.stack(cols, dim=1)

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
        if any(not hasattr(nn[0], "weight") or isinstance(nn[0].weight, UninitializedParameter)
               for nn in self.post_nns):
            return None
        names = reduce_of(self.aggr_module.aggr)
        names = [names] if isinstance(names, str) else names
        if not names or any(n not in _SHIFTED and n not in ("var", "std") for n in names):
            return None
        return names


def _shift_groups(names) -> dict[str, list[int]]:
    """Aggregator positions by the factor their target term z carries: sum deg * z, mean/max/min
    z on non-empty rows (0 on empty ones), var/std none."""
    groups: dict[str, list[int]] = {}
    for k, name in enumerate(names):
        if name == "sum":
            groups.setdefault("deg", []).append(k)
        elif name in ("mean", "max", "min"):
            groups.setdefault("nonempty", []).append(k)
    return groups

