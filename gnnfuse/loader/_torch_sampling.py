"""Uniform neighbour sampling with torch ops: the GPU implementation, and the disjoint mode.

Same contract as the C++ sampler (csrc/sampler.cpp): the graph is given by target (``colptr``
over targets, ``row`` = the source of each in-edge); each hop keeps up to ``fanout`` in-neighbours
of every frontier node, without replacement by Floyd's algorithm (vectorised over targets, k
rounds of k comparisons), and emits its edges target by target, so the batch's edges come out
sorted by target. New nodes get local ids in order of first appearance.

With every fan-out >= 0 (:func:`sample_padded`), each hop works on padded [targets x fan-out]
tensors whose sizes the host knows in advance (the frontier is padded to the previous hop's
edge capacity), so nothing is read back until the end: one host sync per batch for the hop sizes
(PyG's batch format needs them as Python ints), then the valid entries are compacted in order.
A fan-out of -1 (every neighbour) needs the hop's edge count to size the next hop: :func:`sample`
reads it back per hop.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

UNSEEN = torch.iinfo(torch.int64).max


def pick_positions(degree: torch.Tensor, fanout: int, replace: bool, generator: torch.Generator | None):
    """(target index into ``degree``, position in [0, degree)) of every sampled edge, target-major."""
    T, device = degree.shape[0], degree.device
    if fanout < 0 or T == 0:  # every neighbour
        count = degree
        total = int(count.sum()) if T else 0
        target = torch.repeat_interleave(torch.arange(T, device=device), count, output_size=total)
        starts = torch.cumsum(count, 0) - count
        return target, torch.arange(total, device=device) - starts[target]
    picks, valid = pick_padded(degree, fanout, replace, generator)
    target = torch.arange(T, device=device).unsqueeze(1).expand(T, fanout)
    return target[valid], picks[valid]


def sample(colptr: torch.Tensor, row: torch.Tensor, seeds: torch.Tensor, fanouts: list[int], replace: bool,
           generator: torch.Generator | None, local: torch.Tensor, first: torch.Tensor, kernel_seed: int | None = None):
    """Non-disjoint sampling with dense scratch maps ``local`` [N + 1] (all -1) and ``first`` [N + 1]
    (all UNSEEN; slot N of each is a sink), both left as they came. Returns (node, row, col, edge =
    CSC position, nodes per hop, edges per hop). ``kernel_seed``: pick with the Triton kernel
    (gnnfuse.loader._triton_sampling), its random streams keyed by this seed, not ``generator``."""
    if all(k >= 0 for k in fanouts) and row.numel() and padded_capacity(seeds.shape[0], fanouts) <= MAX_PADDED:
        return sample_padded(colptr, row, seeds, fanouts, replace, generator, local, first, kernel_seed)
    device = seeds.device
    N = local.shape[0] - 1
    nodes = [seeds]
    num_nodes = seeds.shape[0]
    local[seeds] = torch.arange(num_nodes, device=device)
    rows, cols, edges = [], [], []
    nodes_per_hop, edges_per_hop = [num_nodes], []
    frontier, frontier_begin = seeds, 0
    for fanout in fanouts:
        start = colptr[frontier]
        target, pos = pick_positions(colptr[frontier + 1] - start, fanout, replace, generator)
        edge = start[target] + pos
        u = row[edge].long()
        E = u.shape[0]
        is_unknown = local[u] < 0
        p = torch.arange(E, device=device)
        first.scatter_reduce_(0, torch.where(is_unknown, u, N), p, "amin")
        is_first = is_unknown & (first[u] == p)
        new_nodes = u[is_first]  # in order of first appearance
        num_new = new_nodes.shape[0]
        local[new_nodes] = torch.arange(num_nodes, num_nodes + num_new, device=device)
        first[new_nodes] = UNSEEN
        first[N] = UNSEEN
        rows.append(local[u])
        cols.append(target + frontier_begin)
        edges.append(edge)
        nodes.append(new_nodes)
        nodes_per_hop.append(num_new)
        edges_per_hop.append(E)
        frontier, frontier_begin = new_nodes, num_nodes
        num_nodes += num_new
    node = torch.cat(nodes)
    local[node] = -1
    return node, torch.cat(rows), torch.cat(cols), torch.cat(edges), nodes_per_hop, edges_per_hop


MAX_PADDED = 2**25  # padded entries per hop above which the exact (per-hop sync) path runs instead


def hop_seed(seed: int | torch.Tensor, hop: int) -> int | torch.Tensor:
    """The Philox key of one hop of one batch (a positive int32; an int64 device tensor of it for a
    device tensor ``seed``)."""
    return (seed * 1_000_003 + hop * 7_919 + 1) % (2**31 - 1)


def padded_capacity(num_seeds: int, fanouts: list[int]) -> int:
    """Entries of the last (largest) hop of :func:`sample_padded`: seeds times the fan-outs' product."""
    cap = num_seeds
    for k in fanouts:
        cap *= max(k, 1)
    return cap


def pick_padded(degree: torch.Tensor, fanout: int, replace: bool, generator: torch.Generator | None):
    """(positions [T, fanout] in [0, degree), valid [T, fanout]): every target's sampled slots,
    invalid past its degree (without replacement) or for a degree of 0 (with)."""
    T, device = degree.shape[0], degree.device
    draws = torch.rand((T, fanout), generator=generator, device=device, dtype=torch.float64)
    if replace:
        return (draws * degree.unsqueeze(1)).long(), (degree > 0).unsqueeze(1).expand(T, fanout)
    slots = torch.arange(fanout, device=device)
    picks = slots.expand(T, fanout).clone()  # rows with degree <= fanout take every neighbour
    big = degree > fanout
    for i in range(fanout):  # Floyd: j = degree - fanout + i; r uniform in [0, j]; r if new, else j
        j = (degree - fanout + i).clamp(min=0)
        r = (draws[:, i] * (j + 1)).long().clamp(max=j)
        taken = (picks[:, :i] == r.unsqueeze(1)).any(1) if i else torch.zeros_like(big)
        picks[:, i] = torch.where(big, torch.where(taken, j, r), picks[:, i])
    return picks, slots.unsqueeze(0) < degree.unsqueeze(1)


def _compact(values: torch.Tensor, valid: torch.Tensor, total: int) -> torch.Tensor:
    """The valid entries of ``values`` in order, ``total`` of them (known), without a host sync."""
    out = values.new_empty(total + 1)
    at = torch.where(valid, torch.cumsum(valid, 0) - 1, total)
    return out.scatter_(0, at, values)[:total]


def sample_padded(colptr: torch.Tensor, row: torch.Tensor, seeds: torch.Tensor, fanouts: list[int], replace: bool,
                  generator: torch.Generator | None, local: torch.Tensor, first: torch.Tensor,
                  kernel_seed: int | torch.Tensor | None = None):
    """:func:`sample` for fan-outs >= 0 with one host sync per batch (see the module docstring):
    :func:`padded_hops`, the sync, :func:`finish_padded`."""
    hops = padded_hops(colptr, row, seeds, fanouts, replace, generator, local, first, kernel_seed)
    sizes = torch.stack(hops.counts).tolist() if fanouts else []  # the one host sync
    return finish_padded(hops, sizes, local)


class PaddedHops(NamedTuple):
    """What :func:`padded_hops` leaves on the device: the seeds, each hop's new nodes (a padded
    buffer, the first ``count`` real) and edges (padded, with a validity mask), and the counts
    (the hops' new nodes, then their edges: one-element tensors, read back by the caller)."""
    seeds: torch.Tensor
    new_nodes: list[torch.Tensor]
    edge_parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
    counts: list[torch.Tensor]


def padded_hops(colptr: torch.Tensor, row: torch.Tensor, seeds: torch.Tensor, fanouts: list[int], replace: bool,
                generator: torch.Generator | None, local: torch.Tensor, first: torch.Tensor,
                kernel_seed: int | torch.Tensor | None = None) -> PaddedHops:
    """The hops of :func:`sample_padded` up to the host sync: device work of shapes the host knows
    in advance, no read-back (so a CUDA graph can capture it; ``kernel_seed`` then a device tensor).
    Hop h's frontier is a buffer of the previous hop's capacity whose first ``count`` entries are
    the nodes it added; padded targets have degree 0 and padded slots are masked."""
    device = seeds.device
    N = local.shape[0] - 1
    B = seeds.shape[0]
    local[seeds] = torch.arange(B, device=device)
    num_nodes = torch.full((), B, device=device, dtype=torch.long)  # a device scalar: never read back
    frontier, frontier_valid, frontier_begin = seeds, None, num_nodes * 0
    new_nodes, new_counts, edge_parts, edge_counts = [], [], [], []
    count = None
    for hop, fanout in enumerate(fanouts):
        T = frontier.shape[0]
        if kernel_seed is not None:  # one launch: picks and their sources (padded slots: the sink N)
            from ._triton_sampling import pick_sources

            u, edge = pick_sources(frontier, count, colptr, row, fanout, replace, hop_seed(kernel_seed, hop), N)
            valid = u < N
        else:
            safe = frontier if frontier_valid is None else torch.where(frontier_valid, frontier, 0)
            start = colptr[safe]
            degree = colptr[safe + 1] - start
            if frontier_valid is not None:
                degree = torch.where(frontier_valid, degree, 0)
            picks, valid = pick_padded(degree, fanout, replace, generator)
            valid = valid.reshape(-1)
            edge = torch.where(valid, (start.unsqueeze(1) + picks).reshape(-1), 0)
            u = torch.where(valid, row[edge].long(), N)  # padded slots point at the sink
        is_unknown = valid & (local[u] < 0)
        p = torch.arange(u.shape[0], device=device)
        first.scatter_reduce_(0, torch.where(is_unknown, u, N), p, "amin")
        is_first = is_unknown & (first[u] == p)
        rank = torch.cumsum(is_first, 0) - 1
        fresh = torch.where(is_first, u, N)
        local[fresh] = num_nodes + rank
        # scalars written by fill kernels (an assignment of a Python number copies a host tensor,
        # which a CUDA graph cannot capture)
        first.index_fill_(0, fresh, UNSEEN)
        first[N:].fill_(UNSEEN)
        local[N:].fill_(-1)
        target = frontier_begin + torch.arange(T, device=device).unsqueeze(1).expand(T, fanout).reshape(-1)
        edge_parts.append((local[u], target, edge, valid))
        edge_counts.append(valid.sum())
        count = is_first.sum()
        buffer = u.new_full((u.shape[0] + 1,), N)
        buffer.scatter_(0, torch.where(is_first, rank, u.shape[0]), u)  # new nodes in order of first appearance
        frontier = buffer[:-1]
        frontier_valid = p < count
        new_nodes.append(frontier)
        new_counts.append(count)
        frontier_begin = num_nodes
        num_nodes = num_nodes + count
    return PaddedHops(seeds, new_nodes, edge_parts, new_counts + edge_counts)


def finish_padded(hops: PaddedHops, sizes: list[int], local: torch.Tensor):
    """The batch of :func:`padded_hops` once its ``sizes`` (the counts, read back) are known: nodes
    and edges compacted in order, the scratch map ``local`` reset. Returns :func:`sample`'s tuple."""
    seeds = hops.seeds
    num_hops = len(hops.new_nodes)
    nodes_per_hop = [seeds.shape[0]] + [int(c) for c in sizes[:num_hops]]
    edges_per_hop = [int(c) for c in sizes[num_hops:]]
    node = torch.cat([seeds] + [nodes[:c] for nodes, c in zip(hops.new_nodes, nodes_per_hop[1:])])
    local[node] = -1
    if not num_hops:
        empty = seeds.new_empty(0)
        return node, empty, empty, empty, nodes_per_hop, edges_per_hop
    valid = torch.cat([part[3] for part in hops.edge_parts])
    total = sum(edges_per_hop)
    rows, cols, edges = (_compact(torch.cat([part[i] for part in hops.edge_parts]), valid, total) for i in range(3))
    return node, rows, cols, edges, nodes_per_hop, edges_per_hop


def sample_disjoint(colptr: torch.Tensor, row: torch.Tensor, seeds: torch.Tensor, fanouts: list[int], replace: bool,
                    generator: torch.Generator | None, num_nodes_total: int):
    """Disjoint sampling: one tree per seed, a node repeated across seeds' trees (merged within one).
    Node identity is (seed index, node); returns the sample tuple plus ``batch`` (seed of each node)."""
    device = seeds.device
    B = seeds.shape[0]
    batch = torch.arange(B, device=device)
    known_keys = batch * num_nodes_total + seeds  # sorted by key, with their local ids
    known_keys, order = torch.sort(known_keys)
    known_ids = order
    nodes, batches = [seeds], [batch]
    rows, cols, edges = [], [], []
    nodes_per_hop, edges_per_hop = [B], []
    frontier, frontier_batch, frontier_begin, num_nodes = seeds, batch, 0, B
    for fanout in fanouts:
        start = colptr[frontier]
        target, pos = pick_positions(colptr[frontier + 1] - start, fanout, replace, generator)
        edge = start[target] + pos
        u = row[edge].long()
        b = frontier_batch[target]
        keys = b * num_nodes_total + u
        at = torch.searchsorted(known_keys, keys).clamp(max=max(known_keys.shape[0] - 1, 0))
        known = known_keys[at] == keys if known_keys.numel() else torch.zeros_like(keys, dtype=torch.bool)
        unique, inverse = torch.unique(torch.where(known, -1, keys), return_inverse=True)
        first = torch.full((unique.shape[0],), UNSEEN, device=device).scatter_reduce_(
            0, inverse, torch.arange(keys.shape[0], device=device), "amin")
        fresh = unique >= 0
        new_first = first[fresh]
        order = torch.argsort(new_first)  # new nodes in order of first appearance
        new_keys = unique[fresh][order]
        new_ids = torch.empty_like(order)
        new_ids[order] = torch.arange(num_nodes, num_nodes + order.shape[0], device=device)
        slot_id = torch.full((unique.shape[0],), -1, device=device, dtype=torch.long)
        slot_id[fresh] = new_ids
        row_local = torch.where(known, known_ids[at], slot_id[inverse])
        new_nodes, new_batch = new_keys % num_nodes_total, new_keys // num_nodes_total
        rows.append(row_local)
        cols.append(target + frontier_begin)
        edges.append(edge)
        nodes.append(new_nodes)
        batches.append(new_batch)
        nodes_per_hop.append(new_nodes.shape[0])
        edges_per_hop.append(keys.shape[0])
        known_keys, order = torch.sort(torch.cat([known_keys, new_keys]))
        known_ids = torch.cat([known_ids, torch.arange(num_nodes, num_nodes + new_keys.shape[0], device=device)])[order]
        frontier, frontier_batch, frontier_begin = new_nodes, new_batch, num_nodes
        num_nodes += new_nodes.shape[0]
    return (torch.cat(nodes), torch.cat(rows), torch.cat(cols), torch.cat(edges), nodes_per_hop, edges_per_hop,
            torch.cat(batches))
