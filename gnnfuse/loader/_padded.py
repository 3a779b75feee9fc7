"""Sampled batches padded to fixed per-hop sizes: every batch then has the same shapes, which is
what a captured CUDA graph (see gnnfuse.loader._captured) needs to replay the training step.

A batch of :class:`gnnfuse.loader.NeighborSampler` numbers its nodes hop by hop (seeds, then the
nodes hop 1 added, ...) and lists its edges sorted by target, hop by hop; each GNN layer's graph
is a prefix of nodes and edges (:func:`gnnfuse.loader.layer_sizes`). :class:`HopPadding` keeps that
layout with each hop's block of nodes and of edges grown to a fixed capacity:

* a hop's real nodes keep their order at the start of its block; the rest are dummy slots (every
  block has at least one);
* hop h's padded edges follow its real edges; they run from hop h's dummy slots to hop h - 1's,
  spread evenly over both (the k-th of P padded edges targets dummy slot floor(k * D / P) of the D
  in hop h - 1's block, and comes from dummy slot k mod D' of hop h's): targets stay sorted, every
  layer's graph stays a prefix, and no dummy row or source collects more edges than about the
  batch's mean degree (one row holding every padded edge serialised the fresh route's row-group
  kernel: 11 ms of a 14 ms step on the products batch);
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
        padded_ei, padded_node = out if out is not None else (
            torch.empty(2, self.num_edges, dtype=edge_index.dtype, device=device),
            torch.empty(self.num_nodes, dtype=node.dtype, device=device))
        edge_table, node_table = self._tables(nodes, edges)
        if device.type == "cuda":  # two Triton launches
            from ._triton_batch import pad_batch

            pad_batch(edge_index.contiguous(), node, edge_table, node_table, padded_ei, padded_node)
            return padded_ei, padded_node
        node_slot = _slots(sum(nodes), nodes, self.node_caps, device, edge_index.dtype)
        edge_slot = _slots(sum(edges), edges, self.edge_caps, device, torch.long)
        _padding_edges(edge_table, self.edge_caps, padded_ei)
        padded_ei.index_copy_(1, edge_slot, node_slot[edge_index])
        padded_node.zero_()
        padded_node.index_copy_(0, node_slot.long(), node)
        return padded_ei, padded_node

    def padded_sizes(self) -> tuple[list[int], list[int]]:
        """(num_sampled_nodes, num_sampled_edges) of every padded batch."""
        return list(self.node_caps), list(self.edge_caps)

    def _tables(self, nodes: list[int], edges: list[int]) -> tuple[list[list[int]], list[list[int]]]:
        """Where each hop's blocks lie, real and padded. Per hop h >= 1 (its edges): padded block
        start, real edges, real block start, then its padded edges' target base (hop h - 1's first
        dummy slot), target slots, number of padded edges (at least 1), source base (hop h's first
        dummy slot), source slots. Per hop h >= 0 (its nodes): padded block start, real nodes, real
        block start."""
        node_table, edge_table = [], []
        padded = real = 0
        for n, cap in zip(nodes, self.node_caps):
            node_table.append([padded, n, real])
            padded, real = padded + cap, real + n
        padded = real = 0
        for hop, (m, cap) in enumerate(zip(edges, self.edge_caps), start=1):
            (tgt_start, tgt_real, _), (src_start, src_real, _) = node_table[hop - 1], node_table[hop]
            edge_table.append([padded, m, real, tgt_start + tgt_real, self.node_caps[hop - 1] - tgt_real,
                               max(1, cap - m), src_start + src_real, self.node_caps[hop] - src_real])
            padded, real = padded + cap, real + m
        return edge_table, node_table


def _padding_edges(edge_table: list[list[int]], edge_caps: list[int], out: torch.Tensor) -> None:
    """Writes every hop's padded edges into ``out`` [2, num_edges] (at every position: the real
    edges' positions are overwritten after), by the per-hop table and a few element-wise ops
    (the CPU path; the GPU's is one Triton kernel)."""
    if not edge_table:
        return
    device = out.device
    table = torch.tensor(edge_table, dtype=torch.long)
    starts = torch.tensor([row[0] for row in edge_table[1:]], dtype=torch.long)
    pos = torch.arange(out.shape[1], device=device)
    start, real, _, tgt_base, tgt_slots, padded, src_base, src_slots = table[torch.searchsorted(starts, pos, right=True)].unbind(1)
    k = (pos - start - real).clamp_(min=0)  # index among the hop's padded edges (real positions: anything)
    out[1].copy_(tgt_base + torch.div(k * tgt_slots, padded, rounding_mode="floor"))
    out[0].copy_(src_base + k % src_slots)


def _to_device(table: torch.Tensor, device) -> torch.Tensor:
    """A small host table on ``device``: through pinned memory, asynchronously (no wait for the device)."""
    return table.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else table


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
    table = _to_device(torch.tensor(bounds[:-1] + shifts, dtype=torch.long), device)
    ids = torch.arange(count, device=device)
    block = torch.searchsorted(table[: len(sizes) - 1], ids, right=True)
    return (ids + table[len(sizes) - 1:][block]).to(dtype)
