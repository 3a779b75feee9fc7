"""Sampled batches padded to fixed per-hop sizes: every batch then has the same shapes, which is
what a captured CUDA graph (see gnnfuse.loader._captured) needs to replay the training step.

A batch of :class:`gnnfuse.loader.NeighborSampler` numbers its nodes hop by hop (seeds, then the
nodes hop 1 added, ...) and lists its edges sorted by target, hop by hop; each GNN layer's graph
is a prefix of nodes and edges (:func:`gnnfuse.loader.layer_sizes`). :class:`HopPadding` keeps that
layout with each hop's block of nodes and of edges grown to a fixed capacity:

* a hop's real nodes keep their order at the start of its block; the rest are dummy slots (every
  block has at least one);
* hop h's padded edges all run from the last slot of hop h's node block to the last slot of hop
  h - 1's, after its real edges: targets stay sorted, and every layer's graph stays a prefix;
* dummy slots take the features of node 0 (finite values).

Dummy rows only ever read dummy rows, so real rows -- and with the loss taken on the real seeds
alone, the loss and every gradient -- are those of the unpadded batch (up to the summation order
of GEMMs of another shape). Capacities start at the first batch's sizes plus a margin and grow
(:meth:`HopPadding.grow`) when a batch does not fit; each growth means new shapes (a new capture).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


def _round_up(value: int, granule: int) -> int:
    return -(-value // granule) * granule


class HopPadding:
    """Per-hop capacities of nodes and edges, and the padding of batches to them.

    Args:
        margin: head-room over the sizes that set (or grow) the capacities, as a fraction.
        granule: capacities are multiples of this.
    """

    def __init__(self, margin: float = 0.05, granule: int = 128):
        if margin < 0 or granule < 1:
            raise ValueError(f"HopPadding needs margin >= 0 and granule >= 1; got {margin}, {granule}")
        self.margin, self.granule = float(margin), int(granule)
        self.node_caps: list[int] | None = None  # per hop (seeds first)
        self.edge_caps: list[int] | None = None  # per hop (hop 1 first)
        self._templates: dict = {}

    # ---- capacities ------------------------------------------------------------------------------
    def fits(self, num_sampled_nodes: Sequence[int], num_sampled_edges: Sequence[int]) -> bool:
        """Whether a batch of these sizes fits the current capacities (a dummy slot left in every block)."""
        if self.node_caps is None or len(num_sampled_nodes) != len(self.node_caps):
            return False
        return (all(int(n) < cap for n, cap in zip(num_sampled_nodes, self.node_caps))
                and all(int(m) <= cap for m, cap in zip(num_sampled_edges, self.edge_caps)))

    def grow(self, num_sampled_nodes: Sequence[int], num_sampled_edges: Sequence[int]) -> None:
        """Capacities that fit this batch with the margin (never smaller than before)."""
        if len(num_sampled_edges) + 1 != len(num_sampled_nodes):
            raise ValueError("num_sampled_nodes needs one entry per hop plus the seeds")
        old_n = self.node_caps or [0] * len(num_sampled_nodes)
        old_e = self.edge_caps or [0] * len(num_sampled_edges)
        if len(old_n) != len(num_sampled_nodes):
            old_n, old_e = [0] * len(num_sampled_nodes), [0] * len(num_sampled_edges)
        head = 1.0 + self.margin
        self.node_caps = [max(o, _round_up(int(int(n) * head) + 1, self.granule)) for o, n in zip(old_n, num_sampled_nodes)]
        self.edge_caps = [max(o, _round_up(int(int(m) * head), self.granule)) for o, m in zip(old_e, num_sampled_edges)]
        self._templates.clear()

    @property
    def num_nodes(self) -> int:
        return sum(self.node_caps)

    @property
    def num_edges(self) -> int:
        return sum(self.edge_caps)

    # ---- padding ---------------------------------------------------------------------------------
    def pad(self, edge_index: torch.Tensor, node: torch.Tensor, num_sampled_nodes: Sequence[int],
            num_sampled_edges: Sequence[int], *, out: tuple[torch.Tensor, torch.Tensor] | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """(edge_index [2, num_edges], node [num_nodes]) of the batch in the padded layout: the
        local ids of ``edge_index`` and the global ids of ``node`` moved to their slots, the padding
        added. ``out``: buffers of those shapes to write into (a captured step's static inputs).
        The batch must fit (:meth:`fits`). A few device ops, no host sync."""
        if not self.fits(num_sampled_nodes, num_sampled_edges):
            raise ValueError(f"HopPadding.pad: a batch of {list(num_sampled_nodes)} nodes and "
                             f"{list(num_sampled_edges)} edges per hop does not fit the capacities "
                             f"{self.node_caps} / {self.edge_caps} (call grow first)")
        edge_index = edge_index.as_subclass(torch.Tensor) if type(edge_index) is not torch.Tensor else edge_index
        device = edge_index.device
        nodes = [int(n) for n in num_sampled_nodes]
        edges = [int(m) for m in num_sampled_edges]
        node_slot = _slots(sum(nodes), nodes, self.node_caps, device, edge_index.dtype)
        edge_slot = _slots(sum(edges), edges, self.edge_caps, device, torch.long)
        template_ei, template_node = self._template(device, edge_index.dtype, node.dtype)
        padded_ei, padded_node = out if out is not None else (torch.empty_like(template_ei),
                                                               torch.empty_like(template_node))
        padded_ei.copy_(template_ei)
        padded_ei.index_copy_(1, edge_slot, node_slot[edge_index])
        padded_node.copy_(template_node)
        padded_node.index_copy_(0, node_slot.long(), node)
        return padded_ei, padded_node

    def padded_sizes(self) -> tuple[list[int], list[int]]:
        """(num_sampled_nodes, num_sampled_edges) of every padded batch."""
        return list(self.node_caps), list(self.edge_caps)

    def _template(self, device, index_dtype, node_dtype):
        """The padding alone: each hop's edge block filled with its padded edge, node slots with node 0."""
        key = (device, index_dtype, node_dtype)
        if key not in self._templates:
            node_off = [0]
            for cap in self.node_caps:
                node_off.append(node_off[-1] + cap)
            src, dst = [], []
            for hop, cap in enumerate(self.edge_caps, start=1):  # last slot of hop h -> last slot of hop h - 1
                src.append(torch.full((cap,), node_off[hop + 1] - 1, dtype=index_dtype))
                dst.append(torch.full((cap,), node_off[hop] - 1, dtype=index_dtype))
            ei = torch.stack([torch.cat(src), torch.cat(dst)]) if src else torch.empty(2, 0, dtype=index_dtype)
            self._templates[key] = (ei.to(device), torch.zeros(self.num_nodes, dtype=node_dtype, device=device))
        return self._templates[key]


def _slots(count: int, sizes: list[int], caps: list[int], device, dtype) -> torch.Tensor:
    """The padded position of each of ``count`` items laid out in blocks of ``sizes``, when each
    block is widened to ``caps``: item i of block b goes to i + (cap offset - size offset of b)."""
    if count == 0:
        return torch.empty(0, dtype=dtype, device=device)
    bounds, shifts = [], []
    real = pad = 0
    for size, cap in zip(sizes, caps):
        bounds.append(real + size)
        shifts.append(pad - real)
        real, pad = real + size, pad + cap
    table = torch.tensor(bounds[:-1] + shifts, dtype=torch.long)
    if device.type == "cuda":  # pinned and asynchronous: no wait for the device
        table = table.pin_memory().to(device, non_blocking=True)
    ids = torch.arange(count, device=device)
    block = torch.searchsorted(table[: len(sizes) - 1], ids, right=True)
    return (ids + table[len(sizes) - 1:][block]).to(dtype)
