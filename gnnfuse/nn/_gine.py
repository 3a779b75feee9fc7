"""PyG's GINEConv with its message and aggregation fused (:func:`gnnfuse.gine_aggregate`).

Same constructor, parameters, state_dict and forward signature as
:class:`torch_geometric.nn.GINEConv`. The messages ``relu(x_j + lin(edge_attr))`` are never
materialised: gather, edge term, activation and sum/mean run in one kernel per target row.
``lin(edge_attr)`` (with ``edge_dim``) is computed once per call, as PyG does inside message().

Runs PyG's own forward, with a one-time warning naming the reason, for what the fused op does not
express: aggregations other than sum/mean, a ``message`` overridden in a subclass, no
``edge_attr``, sparse adjacency tensors, non-2-D features, and the PyG machinery of
gnnfuse/nn/_pyg_path.py (explain, hooks, decomposition, tracing, ONNX export).
"""
from __future__ import annotations

import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn.conv import MessagePassing

from ..csr import CSR
from ..ops.edge_message import gine_aggregate
from ._layers import FUSED_CLASSES
from ._mixin import csr_to_edge_index
from ._pyg_path import instance_reason, scriptable_stock_copy, warn_pyg_path

__all__ = ["GINEConv"]
_REDUCE = {pyg_nn.aggr.SumAggregation: "sum", pyg_nn.aggr.MeanAggregation: "mean"}


class GINEConv(pyg_nn.GINEConv):
    """:class:`torch_geometric.nn.GINEConv` with fused message + aggregation (see the module doc)."""

    gnnfuse_backend: str = "auto"
    gnnfuse_checks_per_call = True  # fuse(): this class decides per call whether the fused path applies
    # PyG builds the fallback's propagate template from this comment in the class source:
    # propagate_type: (x: OptPairTensor, edge_attr: OptTensor)
    # PyG records `cls.propagate` as the class's original propagate (bound in explain mode and for
    # decomposed_layers) when the class is first instantiated; inherited, that would be the stock
    # class's generated template, which supports neither. Naming the generic one here fixes it.
    propagate = MessagePassing.propagate

    def forward(self, x, edge_index, edge_attr=None, size=None) -> Tensor:
        if isinstance(x, Tensor):
            x = (x, x)
        plan = self._gnnfuse_plan(x, edge_index, edge_attr, size)
        if isinstance(plan, str):
            warn_pyg_path(type(self).__name__, plan)
            if isinstance(edge_index, CSR):
                size = size or (edge_index.num_src, edge_index.num_dst)
                edge_index = csr_to_edge_index(edge_index)
            return super().forward(x, edge_index, edge_attr, size)
        num_dst, reduce = plan
        if self.lin is not None:
            edge_attr = self.lin(edge_attr)
        elif edge_attr.shape[-1] != x[0].shape[-1]:
            raise ValueError("Node and edge feature dimensionalities do not match. Consider setting the "
                             "'edge_dim' attribute of 'GINEConv'")  # PyG's message() raises the same
        out = gine_aggregate(x[0], edge_attr, edge_index, reduce, num_nodes=num_dst, backend=self.gnnfuse_backend)
        x_r = x[1]
        if x_r is not None:
            out = out + (1 + self.eps) * x_r
        return self.nn(out)

    def _gnnfuse_plan(self, x, edge_index, edge_attr, size) -> tuple[int, str] | str:
        """(number of targets, reduce) for the fused op, or why PyG's forward runs."""
        reduce = _REDUCE.get(type(self.aggr_module))
        if reduce is None:
            return f"aggregation {self.aggr!r} is not sum/mean"
        if type(self).message is not pyg_nn.GINEConv.message or self.flow != "source_to_target":
            return "custom message() or flow='target_to_source'"
        why = instance_reason(self)
        if why is not None:
            return why
        x_src, x_dst = x
        if not isinstance(edge_attr, Tensor) or edge_attr.dim() != 2:
            return "edge_attr is not an [E, D] tensor"
        if not isinstance(x_src, Tensor) or x_src.dim() != 2 or not x_src.is_floating_point():
            return "x is not a 2-D floating-point tensor"
        edge_dtype = self.lin.weight.dtype if self.lin is not None else edge_attr.dtype
        if edge_dtype != x_src.dtype:
            return "the edge term's dtype differs from x's (type promotion)"
        if isinstance(edge_index, Tensor) and edge_index.layout != torch.strided:
            return "a torch.sparse adjacency (PyG's spmm path)"
        if not isinstance(edge_index, (Tensor, CSR)):
            return f"edge_index is a {type(edge_index).__name__}"
        num_dst = x_dst.shape[0] if isinstance(x_dst, Tensor) else None
        if size is not None:
            if size[0] is not None and size[0] != x_src.shape[0]:
                return "size disagrees with x"  # PyG raises its own error
            num_dst = size[1] if size[1] is not None else num_dst
        if isinstance(edge_index, CSR):
            return (edge_index.num_dst if num_dst is None else num_dst), reduce
        if isinstance(edge_index, EdgeIndex) and num_dst is None:
            num_dst = edge_index.sparse_size(1)
        return (x_src.shape[0] if num_dst is None else num_dst), reduce

    def __prepare_scriptable__(self):
        """``torch.jit.script`` scripts the stock PyG layer (same parameters)."""
        return scriptable_stock_copy(self)


FUSED_CLASSES[pyg_nn.GINEConv] = GINEConv
