"""Mini-batch training on sampled neighbourhoods, in PyG's loader format (needs torch-geometric).

* :class:`NeighborSampler` - a ``torch_geometric.sampler.BaseSampler`` (C++ on CPU, torch ops on
  CUDA) whose batches list their edges sorted by target;
* :class:`NeighborLoader` - PyG's ``NodeLoader`` with that sampler; ``batch.edge_index`` is a PyG
  ``EdgeIndex`` marked ``sort_order="col"``, which the fused layers take without a sort;
* :func:`layer_csrs` - one bipartite :class:`gnnfuse.CSR` per GNN layer, views of one O(E) build;
* :class:`HopPadding` and :class:`CapturedStep` - batches padded to fixed per-hop sizes, and a
  training step captured once as a CUDA graph and replayed for every batch (host time per step
  then no longer grows with the launches);
* :class:`CapturedSampler` - the GPU sampler's hops replayed from a CUDA graph (the same batches,
  a fraction of the host time).

Example::

    loader = gnnfuse.loader.NeighborLoader(data, [15, 10, 5], batch_size=1024, input_nodes=train_idx,
                                           shuffle=True, seed=0)
    for batch in loader:
        csrs = gnnfuse.loader.layer_csrs(batch)        # layer 0 (all hops) ... layer 2 (seeds only)
        h = batch.x
        for conv, csr in zip(convs, csrs):
            h = conv((h, h[:csr.num_dst]), csr)         # bipartite: only the next layer's targets
        loss = F.cross_entropy(h[:batch.batch_size], batch.y[:batch.batch_size])
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch_geometric import EdgeIndex
from torch_geometric.loader import NodeLoader

from ..csr import CSR, check_edge_index
from ._captured import CapturedStep
from ._captured_sampler import CapturedSampler
from ._padded import HopPadding
from ._sampler import NeighborSampler

__all__ = ["CapturedSampler", "CapturedStep", "HopPadding", "NeighborLoader", "NeighborSampler", "layer_csrs",
           "layer_sizes", "sorted_edge_index"]


def layer_sizes(num_sampled_nodes: Sequence[int], num_sampled_edges: Sequence[int]) -> list[tuple[int, int, int]]:
    """(num_dst, num_src, num_edges) of each GNN layer, first layer first, for a batch sampled with
    ``len(num_sampled_edges)`` hops: layer l reads the nodes of hops 0..L-l and writes those of hops
    0..L-l-1, over the edges of hops 1..L-l (PyG's ``trim_to_layer``, made bipartite)."""
    nodes, edges = [int(n) for n in num_sampled_nodes], [int(e) for e in num_sampled_edges]
    hops = len(edges)
    if len(nodes) != hops + 1:
        raise ValueError(f"num_sampled_nodes needs one entry per hop plus the seeds ({hops + 1}); got {len(nodes)}")
    return [(sum(nodes[: hops - layer]), sum(nodes[: hops - layer + 1]), sum(edges[: hops - layer]))
            for layer in range(hops)]


def layer_csrs(batch=None, *, edge_index: torch.Tensor | None = None, num_sampled_nodes: Sequence[int] | None = None,
               num_sampled_edges: Sequence[int] | None = None, index_dtype: torch.dtype | None = None,
               transposes: bool = False) -> list[CSR]:
    """One bipartite :class:`gnnfuse.CSR` per GNN layer of a target-sorted sampled batch (a batch of
    :class:`NeighborLoader` / :class:`NeighborSampler`, or the fields given one by one). The batch's
    CSR is built once in O(E) (on CUDA in four launches, without a sort or a host sync, its checks
    in one Triton kernel; on CPU by the counting sort); each layer's is a view of a prefix. The
    transpose the backward needs is built per layer only when that layer's input requires a gradient
    (not for the first layer, whose input is the raw features); with ``transposes=True`` (and
    gradients enabled) every layer but the first gets its transpose now, on CUDA all of them from
    one sort (gnnfuse.loader._triton_batch.nested_transposes): fewer launches for a training step."""
    if batch is not None:
        edge_index = batch.edge_index if edge_index is None else edge_index
        num_sampled_nodes = batch.num_sampled_nodes if num_sampled_nodes is None else num_sampled_nodes
        num_sampled_edges = batch.num_sampled_edges if num_sampled_edges is None else num_sampled_edges
    if edge_index is None or num_sampled_nodes is None or num_sampled_edges is None:
        raise ValueError("layer_csrs needs a batch, or edge_index, num_sampled_nodes and num_sampled_edges")
    sizes = layer_sizes(num_sampled_nodes, num_sampled_edges)
    num_nodes = sum(int(n) for n in num_sampled_nodes)
    later = range(1, len(sizes)) if transposes and torch.is_grad_enabled() else range(0)
    if edge_index.is_cuda:  # four launches: see gnnfuse.loader._triton_batch
        from ..csr import _index_dtype
        from ._triton_batch import sampled_layer_csrs

        check_edge_index(edge_index)
        plain = edge_index.as_subclass(torch.Tensor) if type(edge_index) is not torch.Tensor else edge_index
        dtype = _index_dtype(index_dtype, num_nodes, num_nodes, plain.shape[1])
        return sampled_layer_csrs(plain, num_nodes, sizes, dtype, transposes=later)
    layers = CSR.from_sorted_edge_index(edge_index, num_nodes, index_dtype=index_dtype).hop_prefixes(sizes)
    for k in later:
        layers[k].transpose_parts()
    return layers


def sorted_edge_index(data):
    """A loader transform: ``data.edge_index`` as a PyG ``EdgeIndex`` sorted by target (column)."""
    n = int(data.num_nodes)
    data.edge_index = EdgeIndex(data.edge_index, sparse_size=(n, n), sort_order="col")
    return data


class NeighborLoader(NodeLoader):
    """PyG's ``NodeLoader`` driven by :class:`NeighborSampler`: the batches of PyG's
    ``NeighborLoader`` (``n_id``, ``e_id``, ``batch_size``, ``num_sampled_nodes``/``_edges``,
    features sliced by PyG's ``filter_data``), with ``edge_index`` an ``EdgeIndex`` sorted by target.

    Args: ``data`` (a homogeneous ``Data``), ``num_neighbors``, and :class:`NeighborSampler`'s
    ``replace``, ``disjoint``, ``seed``, ``device``; everything else (``input_nodes``,
    ``batch_size``, ``shuffle``, ``num_workers``, ``transform``, ...) goes to ``NodeLoader``.
    ``as_edge_index=False`` leaves ``edge_index`` a plain tensor (still sorted by target).
    """

    def __init__(self, data, num_neighbors: list[int], *, replace: bool = False, disjoint: bool = False,
                 seed: int | None = None, device: str | torch.device = "cpu", as_edge_index: bool = True,
                 transform: Callable | None = None, **kwargs):
        sampler = NeighborSampler(data, num_neighbors, replace=replace, disjoint=disjoint, seed=seed, device=device)
        if as_edge_index:
            transform = sorted_edge_index if transform is None else _compose(sorted_edge_index, transform)
        super().__init__(data, node_sampler=sampler, transform=transform, **kwargs)


def _compose(first: Callable, then: Callable) -> Callable:
    return lambda data: then(first(data))
