"""PyG's PNAConv with its aggregators computed in one fused pass and no per-edge messages.

PNA's message is ``pre_nn(cat[x_i, x_j])``; with one pre-layer (PyG's default) that is the linear
map ``A x_i + B x_j + b``, so for each target i

    sum_j m = deg(i) z_i + sum_j y_j,   mean/max/min_j m = z_i + mean/max/min_j y_j,
    var/std_j m = var/std_j y_j,         with y = B x (per source) and z = A x + b (per target).

Per tower, the layer computes y with a dense matmul and reduces it for every aggregator in one
pass of :func:`gnnfuse.ops.multi_aggregate.multi_aggregate` (no E x F message tensor, forward or
backward). The first post-layer is linear and PyG's degree scalers and the z terms are per-node
factors, so that layer is applied to the aggregation, to z and to x separately and the parts
weighted and added (see ``_tower``; z only ever appears multiplied by weights, so it is never
built): the [N, (S*K + 1) * F] input PyG builds per tower (S scalers, K aggregators) never exists.
Memory: by default no tower keeps its [N, K*F] aggregation (nor its max/min winners) for the
backward. The aggregation times its post-layer blocks is one autograd rule
(gnnfuse/nn/_pna_projection.py) that keeps only its inputs and whose backward recomputes the
aggregation, one tower (and chunk of features) at a time, without ever forming the aggregation's
gradient (``recompute_aggregations``, ``aggregation_chunk_features``).
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
from ..ops.gather_scatter import check_call
from ..ops.multi_aggregate import multi_aggregate
from ._pna_projection import AggregatedProjection, fold_repeated
from .aggr import reduce_of

__all__ = ["PNAConv"]

_HOOKS = ("_propagate_forward_pre_hooks", "_propagate_forward_hooks", "_message_forward_pre_hooks",
          "_message_forward_hooks", "_aggregate_forward_pre_hooks", "_aggregate_forward_hooks")
# how much of the target term z_i each aggregator carries, as a function of the in-degree
_SHIFTED = ("sum", "mean", "max", "min")


class PNAConv(pyg_nn.PNAConv):
    """:class:`torch_geometric.nn.PNAConv` (same signature, parameters, state_dict, results) with
    the aggregation fused; see the module docstring for when PyG's path runs instead.

    ``recompute_aggregations`` (class attribute, default True; set it on an instance to change
    one layer): keep no tower's aggregation for the backward, recompute it there, one tower at a
    time (:class:`gnnfuse.nn._pna_projection.AggregatedProjection`: the backward holds at most 8
    [N, F] arrays per tower, e.g. the recomputed [N, 4F] aggregation, its winners and the reductions'
    coefficients, and never the aggregation's gradient). False keeps each tower's [N, K*F]
    aggregation and its max/min winners from the forward instead: a little faster, towers times the
    memory. Eager only: compiled code keeps them.

    ``aggregation_chunk_features`` (class attribute, default None: all features at once): with
    ``recompute_aggregations``, each tower aggregates (and recomputes and differentiates in the
    backward) its features in chunks of this many, so the backward's working set shrinks with the
    chunk (the reductions are per feature: the results are the same, summed in another order). A
    memory-for-time trade, hence off by default: on an H100, arxiv-like graph (170K nodes, F=64, 4
    towers, benchmarks/results/aggregation-pna_h100_2026-11-23_fused-backward.md) the step's peak is
    453 MB by default (17.5 ms, 4.5x PyG), 306 MB with chunks of 32 (19.8 ms) and 253 MB with chunks
    of 16 (27.9 ms: more, narrower launches; there the benchmark loss's backward is the peak)."""

    recompute_aggregations = True
    aggregation_chunk_features = None

    def forward(self, x: Tensor, edge_index, edge_attr: Tensor | None = None) -> Tensor:
        names = self._fused_aggregators(x, edge_index, edge_attr)
        if names is None:
            # PyG generates this class's propagate from the comment below (its parent's forward calls it):
            # propagate_type: (x: Tensor, edge_attr: OptTensor)
            return super().forward(x, edge_index, edge_attr)
        T, F, N = self.towers, self.F_in, x.shape[0]
        csr, backend = check_call(x, edge_index, "sum", None, N, "auto")  # one validated graph for every tower
        deg = csr.in_degree().to(x.dtype)
        scale = self._scalers(deg)  # [N, S]
        shift = {"deg": deg, "nonempty": (deg > 0).to(deg.dtype)}
        outs = []
        for t in range(T):
            x_t = x.view(N, T, F)[:, t] if self.divide_input else x
            outs.append(self._tower(t, x_t, csr, backend, scale, shift, names))
        return self.lin(torch.cat(outs, dim=1))

    def _tower(self, t: int, x_t: Tensor, csr: CSR, backend: str, scale: Tensor, shift: dict, names) -> Tensor:
        """Tower t's post-layers on cat[x_t, scaler_s * (agg_k + shift_k z)] for every scaler s and
        aggregator k, without building that [N, (S*K + 1) F] input: the first post-layer is linear
        and the scalers and shifts are per-node numbers, so it is the sum of x_t W_x, of
        scaler_s * (agg W_s) and of shift_c * scaler_s * (z W_c) (W_c: the blocks of the
        aggregators that carry the target term z with the same factor c). Neither y nor z exists
        as a tensor outside the aggregation: z W_c = x_t (A^T W_c) + b W_c."""
        pre, post = self.pre_nns[t][0], self.post_nns[t]
        lin = post[0]
        F, K, S = self.F_in, len(names), scale.shape[1]
        Fo = lin.weight.shape[0]
        a, b = pre.weight[:, :F], pre.weight[:, F:]  # z = x_i A^T + bias, y = x_j B^T
        w_agg = lin.weight[:, F:].view(Fo, S, K, F)
        w_mat = w_agg.permute(2, 3, 1, 0).reshape(K * F, S * Fo)

        if self._recomputes(backend, x_t, b, w_mat):
            # the aggregation times its post-layer blocks in one autograd rule that keeps only its
            # inputs and, in the backward, never holds the aggregation and its gradient together
            unique, w_blocks = fold_repeated(names, w_mat.view(K, F, S * Fo))
            p = AggregatedProjection.apply(x_t, b, w_blocks, csr, unique, backend, self.aggregation_chunk_features,
                                           shift["deg"])
        else:
            p = multi_aggregate(x_t @ b.t(), csr, names, backend=backend) @ w_mat
        for factor, ks in _shift_groups(names).items():
            w_z = w_agg[:, :, ks].sum(dim=2).permute(2, 1, 0).reshape(F, S * Fo)  # [F, S*Fo]
            z_w = x_t @ (a.t() @ w_z)
            if pre.bias is not None:
                z_w = z_w + pre.bias @ w_z
            p = p + shift[factor].unsqueeze(1) * z_w
        h = torch.einsum("nso,ns->no", p.view(-1, S, Fo), scale) + x_t @ lin.weight[:, :F].t()
        if lin.bias is not None:
            h = h + lin.bias
        return post[1:](h) if len(post) > 1 else h

    def _recomputes(self, backend: str, *inputs: Tensor) -> bool:
        """Whether this tower takes :class:`AggregatedProjection` (the aggregation recomputed in the
        backward): when asked to and a gradient is wanted, in eager mode (torch.compile traces the
        plain ops) and on a kernel backend (the reference backend is plain torch)."""
        return (self.recompute_aggregations and torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
                and not torch.compiler.is_compiling() and backend != "reference")

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

