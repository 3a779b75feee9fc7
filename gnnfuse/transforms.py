"""PyG transforms: :class:`Reorder` renumbers a graph's nodes for locality (see gnnfuse.ordering).

    from gnnfuse.transforms import Reorder
    data = Reorder("auto")(data)            # or in a T.Compose([...]) / dataset transform
    out = model(data.x, data.edge_index)    # same results, node rows in the new order
    out = gnnfuse.ordering.unpermute(out, data.node_perm)   # rows back in the original ids

Needs torch_geometric (imported here).
"""
from __future__ import annotations

import copy

import torch
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

from .ordering import inverse, reorder


class Reorder(BaseTransform):
    """Renumbers the nodes of a :class:`~torch_geometric.data.Data` by ``gnnfuse.reorder(method=...)``.

    - every node-level attribute (``data.is_node_attr(key)``: x, y, pos, masks, batch-like vectors,
      anything with ``num_nodes`` rows along its node dimension) is permuted: ``value[perm]``;
    - every attribute holding node ids (a key containing ``"index"``, e.g. ``edge_index``,
      ``edge_label_index``, and ``face``) is relabelled; edge order is unchanged, so edge attributes
      (``edge_attr``, ``edge_weight``) stay aligned as they are;
    - the permutation is stored as ``data[perm_attr]`` (default ``node_perm``: ``node_perm[new_id] =
      original id``); it is itself node-level, so a second Reorder composes with the first and
      ``gnnfuse.ordering.unpermute(out, data.node_perm)`` maps a model's node outputs back.

    Sparse node features ([num_nodes, F], COO or CSR) are permuted too. The input is not modified.
    HeteroData and sparse adjacency attributes (``adj_t``) are refused: apply Reorder before
    ``ToSparseTensor``.

    Example::

        data = gnnfuse.transforms.Reorder(method="auto")(data)   # data.node_perm: new id -> old id
        pred = model(data.x, data.edge_index)
        pred_in_original_order = gnnfuse.ordering.unpermute(pred, data.node_perm)
    """

    def __init__(self, method: str = "auto", *, seed: int = 0, perm_attr: str = "node_perm"):
        self.method, self.seed, self.perm_attr = method, seed, perm_attr

    def forward(self, data: Data) -> Data:
        if not isinstance(data, Data):
            raise TypeError(f"Reorder takes a torch_geometric.data.Data; got {type(data).__name__}")
        n = data.num_nodes
        if data.edge_index is None:
            raise ValueError("Reorder needs data.edge_index")
        perm = reorder(data.edge_index, n, self.method, seed=self.seed)
        inv = inverse(perm)
        out = copy.copy(data)
        if self.perm_attr not in data:
            out[self.perm_attr] = torch.arange(n, device=perm.device)  # permuted below like any node attribute
        for key, value in out.items():
            if isinstance(value, torch.Tensor) and value.layout != torch.strided:
                out[key] = _sparse_rows(key, value, perm, n)
                continue
            if not isinstance(value, torch.Tensor):
                if hasattr(value, "sparse_sizes"):  # torch_sparse.SparseTensor
                    raise ValueError(f"Reorder: attribute {key!r} is a SparseTensor; "
                                     "apply Reorder before ToSparseTensor")
                continue
            if "index" in key or key == "face":
                out[key] = inv.to(value.device, value.dtype)[value.long()]
            elif out.is_node_attr(key):
                dim = out.__cat_dim__(key, value) % max(value.dim(), 1)
                out[key] = value.index_select(dim, perm.to(value.device))
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}(method={self.method!r})"


def _sparse_rows(key: str, value: torch.Tensor, perm: torch.Tensor, n: int) -> torch.Tensor:
    """Rows of a sparse node-feature matrix (COO or CSR, [num_nodes, F]) in the new order."""
    if value.layout not in (torch.sparse_coo, torch.sparse_csr) or value.dim() != 2 or value.shape[0] != n \
            or value.shape[1] == n:
        raise ValueError(f"Reorder: attribute {key!r} is a sparse {tuple(value.shape)} tensor ({value.layout}); only "
                         "sparse node features [num_nodes, F] are permuted: apply Reorder before building sparse "
                         "adjacencies")
    rows = value.to_sparse_coo().index_select(0, perm.to(value.device)).coalesce()
    return rows.to_sparse_csr() if value.layout == torch.sparse_csr else rows
