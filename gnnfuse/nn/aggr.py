"""PyG's aggregation modules on gnnfuse's kernels: ``aggr=`` for any PyG layer.

Each class subclasses the PyG class of the same name (same constructor, same results, accepted
wherever PyG takes an ``Aggregation``) and changes two things:

* called on messages (``aggr(x, index, dim_size=...)``, what PyG's ``MessagePassing.aggregate``
  does), the reduction runs on :func:`gnnfuse.scatter`: fused multithreaded C++ on CPU, Triton on
  CUDA (products keep PyG's code: its empty product is 1);
* ``gnnfuse_reduce`` names the reduction (a list for :class:`MultiAggregation`), which lets
  gnnfuse's fused layers skip the messages entirely and gather-scatter node features directly.

:class:`MultiAggregation` with ``mode="cat"`` over these reductions computes them all in one pass
(:func:`gnnfuse.fused_gather_scatter` with a list): ``[N, len(aggrs) * F]``, PyG's layout.

Example::

    conv = torch_geometric.nn.SAGEConv(16, 32, aggr=gnnfuse.nn.aggr.MultiAggregation(["mean", "max", "std"]))
    conv = gnnfuse.nn.GINConv(mlp, aggr=gnnfuse.nn.aggr.MaxAggregation())   # fused path
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.nn import aggr as pyg_aggr

from ..csr import CSR
from ..ops.multi_aggregate import multi_aggregate
from ..reductions import MULTI
from ..scatter import _sorted_segments, scatter
from ._mixin import REDUCE_OF_AGGR

__all__ = ["MaxAggregation", "MeanAggregation", "MinAggregation", "MultiAggregation", "StdAggregation",
           "SumAggregation", "VarAggregation", "reduce_of"]


def _fusable(x: Tensor) -> bool:
    return x.is_floating_point() and (x.is_cpu or x.is_cuda)


class _ScatterOnGnnfuse:
    """Replaces PyG's ``Aggregation.reduce`` (index form) by :func:`gnnfuse.scatter`."""

    def reduce(self, x: Tensor, index: Tensor | None = None, ptr: Tensor | None = None, dim_size: int | None = None,
               dim: int = -2, reduce: str = "sum") -> Tensor:
        if index is not None and reduce != "mul" and _fusable(x) and (ptr is None or not self._deterministic):  # type: ignore[attr-defined]
            return scatter(x, index, dim, dim_size=dim_size, reduce=reduce)
        return super().reduce(x, index, ptr, dim_size, dim, reduce)  # type: ignore[misc]


class SumAggregation(_ScatterOnGnnfuse, pyg_aggr.SumAggregation):
    gnnfuse_reduce = "sum"


class MeanAggregation(_ScatterOnGnnfuse, pyg_aggr.MeanAggregation):
    gnnfuse_reduce = "mean"


class MaxAggregation(_ScatterOnGnnfuse, pyg_aggr.MaxAggregation):
    gnnfuse_reduce = "max"


class MinAggregation(_ScatterOnGnnfuse, pyg_aggr.MinAggregation):
    gnnfuse_reduce = "min"


def _full_gradient_only(semi_grad: bool, name: str) -> None:
    if semi_grad:
        raise ValueError(f"gnnfuse.nn.aggr.{name} computes the full gradient (semi_grad=False); "
                         f"use torch_geometric.nn.aggr.{name} for semi_grad=True")


class VarAggregation(_ScatterOnGnnfuse, pyg_aggr.VarAggregation):
    """mean(x^2) - mean(x)^2 (PyG's), full gradient only."""

    gnnfuse_reduce = "var"

    def __init__(self, semi_grad: bool = False):
        _full_gradient_only(semi_grad, "VarAggregation")
        super().__init__(semi_grad)


class StdAggregation(_ScatterOnGnnfuse, pyg_aggr.StdAggregation):
    """sqrt(max(var, 1e-5)), 0 where that is <= sqrt(1e-5) (PyG's), full gradient only."""

    gnnfuse_reduce = "std"

    def __init__(self, semi_grad: bool = False):
        _full_gradient_only(semi_grad, "StdAggregation")
        super().__init__(semi_grad)


_NAME_OF_PYG = {pyg_aggr.SumAggregation: "sum", pyg_aggr.MeanAggregation: "mean", pyg_aggr.MaxAggregation: "max",
                pyg_aggr.MinAggregation: "min"}


def reduce_of(module: torch.nn.Module) -> str | list[str] | None:
    """The gnnfuse reduce name (or list, for a multi-aggregation) that ``module`` computes on
    messages, or None when gnnfuse cannot compute it in its kernels."""
    name = getattr(module, "gnnfuse_reduce", None)
    if name is not None:
        return name
    if type(module) in _NAME_OF_PYG:
        return _NAME_OF_PYG[type(module)]
    if type(module) is pyg_aggr.VarAggregation and not module.semi_grad:
        return "var"
    if type(module) is pyg_aggr.StdAggregation and not module.var_aggr.semi_grad:  # type: ignore[union-attr]
        return "std"
    if isinstance(module, pyg_aggr.MultiAggregation):
        return _multi_names(module)
    return None


def _multi_names(module: pyg_aggr.MultiAggregation) -> list[str] | None:
    if module.mode != "cat":
        return None
    names = [reduce_of(a) for a in module.aggrs]
    if any(not isinstance(n, str) or n not in MULTI or n == "mul" for n in names):
        return None
    return names  # type: ignore[return-value]


class MultiAggregation(pyg_aggr.MultiAggregation):
    """PyG's MultiAggregation; with ``mode="cat"`` over sum/mean/max/min/var/std (names or
    modules) every reduction comes from one pass over the messages."""

    @property
    def gnnfuse_reduce(self):
        return _multi_names(self)

    def forward(self, x: Tensor, index: Tensor | None = None, ptr: Tensor | None = None, dim_size: int | None = None,
                dim: int = -2, max_num_elements: int | None = None) -> Tensor:
        names = self.gnnfuse_reduce
        if names is None or index is None or x.dim() != 2 or dim not in (0, -2) or not _fusable(x):
            return super().forward(x, index, ptr, dim_size, dim, max_num_elements)
        if index.dim() != 1 or index.numel() != x.shape[0]:
            raise ValueError(f"index must have shape [{x.shape[0]}] (one target per message); got {tuple(index.shape)}")
        if dim_size is None:
            dim_size = int(index.max()) + 1 if index.numel() else 0
        # the messages are the CSR's sources, one edge each (an identity gather)
        rowptr, perm, _ = _sorted_segments(index.long(), dim_size, presorted=False, need_transpose=False)
        return multi_aggregate(x, CSR._built(rowptr, perm, perm, x.shape[0]), names)


# gnnfuse's fused layers look aggregations up by exact type: register ours beside PyG's
for _cls in (SumAggregation, MeanAggregation, MaxAggregation, MinAggregation, VarAggregation, StdAggregation):
    REDUCE_OF_AGGR.setdefault(_cls, _cls.gnnfuse_reduce)
