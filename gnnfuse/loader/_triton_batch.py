"""A sampled batch's per-layer CSRs on the GPU in four launches (graph preparation of a step).

Built from torch ops, a batch's CSR and its layers' prefixes took about 30 launches, nearly all
device-side checks (targets sorted, ids in range, each layer's rows holding exactly its first edges
from sources below its bound) at a few microseconds of host time each, and the step is bound by
host time. Here one kernel does every check over the edges and writes ``col`` in the index dtype
(plus the fill of its flag); ``rowptr`` is one binary search (torch.searchsorted), ``perm`` (the identity) and the search bounds
are slices of a cached ``arange`` (gnnfuse.fresh_graph.ids), and one device-side assertion reads the
kernel's flag. No host sync, so the whole thing can run inside a captured CUDA graph.

:func:`nested_transposes` builds the transposes the backward needs for several layers of a batch at
once: one stable sort for all of them instead of one each (see its docstring).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from .._validate import device_assert
from ..constants import INT32_MAX
from ..csr import CSR
from ..fresh_graph import ids, is_fresh, mark_fresh
from ..triton._grid import cdiv

BLOCK = 1024
PREFIXES_PER_LAUNCH = 4
_MESSAGE = ("layer_csrs: edge_index is not a target-sorted sampled batch with these sizes (targets not "
            "sorted, an id outside the batch, or a layer whose rows do not hold exactly its first edges "
            "from sources below its bound); the CPU path names which")
_SCALARS = [f"{name}{k}" for k in range(PREFIXES_PER_LAUNCH) for name in ("nd", "ns", "ne")]


@triton.jit(do_not_specialize=["E", "num_src", "num_dst"] + _SCALARS)  # sizes change every batch: no recompiles
def _check_batch_kernel(src_ptr, dst_ptr, col_ptr, ok_ptr, E, num_src, num_dst,
                        nd0, ns0, ne0, nd1, ns1, ne1, nd2, ns2, ne2, nd3, ns3, ne3,
                        NUM_PREFIXES: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < E
    s = tl.load(src_ptr + offs, mask=valid, other=0).to(tl.int64)
    d = tl.load(dst_ptr + offs, mask=valid, other=0).to(tl.int64)
    following = tl.load(dst_ptr + offs + 1, mask=offs + 1 < E, other=num_dst).to(tl.int64)
    bad = (s < 0) | (s >= num_src) | (d < 0) | (d >= num_dst) | (following < d)
    # layer k: the edges before ne_k target rows below nd_k from sources below ns_k; later ones rows from nd_k on
    if NUM_PREFIXES > 0:
        bad |= tl.where(offs < ne0, (d >= nd0) | (s >= ns0), d < nd0)
    if NUM_PREFIXES > 1:
        bad |= tl.where(offs < ne1, (d >= nd1) | (s >= ns1), d < nd1)
    if NUM_PREFIXES > 2:
        bad |= tl.where(offs < ne2, (d >= nd2) | (s >= ns2), d < nd2)
    if NUM_PREFIXES > 3:
        bad |= tl.where(offs < ne3, (d >= nd3) | (s >= ns3), d < nd3)
    tl.store(col_ptr + offs, s.to(col_ptr.dtype.element_ty), mask=valid)
    if tl.sum((bad & valid).to(tl.int32)) > 0:
        tl.store(ok_ptr, 0)


def sampled_layer_csrs(edge_index: torch.Tensor, num_nodes: int, sizes: Sequence[tuple[int, int, int]],
                       index_dtype: torch.dtype, transposes: Sequence[int] = ()) -> list[CSR]:
    """One fresh CSR per layer (``sizes``: (num_dst, num_src, num_edges) each, as
    gnnfuse.loader.layer_sizes gives them) of a target-sorted sampled batch, checked on the device;
    the layers listed in ``transposes`` get their transposes now (:func:`nested_transposes`)."""
    src, dst = edge_index[0].contiguous(), edge_index[1].contiguous()
    num_edges, device = src.shape[0], src.device
    sizes = [tuple(int(v) for v in size) for size in sizes]
    for num_dst, num_src, edges in sizes:
        if not (0 <= num_dst <= num_nodes and 0 <= num_src <= num_nodes and 0 <= edges <= num_edges):
            raise ValueError(f"layer_csrs: a layer of {num_dst} targets, {num_src} sources and {edges} edges "
                             f"does not fit a batch of {num_nodes} nodes and {num_edges} edges")
    rows = max((num_dst for num_dst, _, _ in sizes), default=0)  # the rows any layer reads
    col = torch.empty(num_edges, dtype=index_dtype, device=device)
    if num_edges:
        ok = torch.ones(1, dtype=torch.int32, device=device)
        for first in range(0, max(len(sizes), 1), PREFIXES_PER_LAUNCH):
            chunk = sizes[first:first + PREFIXES_PER_LAUNCH]
            scalars = [v for size in chunk for v in size] + [0] * (3 * (PREFIXES_PER_LAUNCH - len(chunk)))
            _check_batch_kernel[(cdiv(num_edges, BLOCK),)](
                src, dst, col, ok, num_edges, num_nodes, num_nodes, *scalars,
                NUM_PREFIXES=len(chunk), BLOCK=BLOCK, num_warps=4)
        device_assert(ok, _MESSAGE)
    bounds = ids(rows + 1, device, dst.dtype)
    rowptr = torch.searchsorted(dst, bounds, out_int32=index_dtype == torch.int32)
    perm = ids(num_edges, device, index_dtype)
    layers = []
    for num_dst, num_src, edges in sizes:
        layer_rowptr = rowptr[: num_dst + 1]
        layers.append(CSR._built(layer_rowptr, col[:edges], perm[:edges], num_src))
        mark_fresh(layer_rowptr)  # used once: see gnnfuse.fresh_graph
    if transposes:
        nested_transposes([layers[k] for k in transposes])
    return layers


def nested_transposes(layers: Sequence[CSR]) -> None:
    """Builds the transposes of ``layers`` (CSRs of one batch, each a prefix of the largest: the
    same ``col`` storage, as :func:`sampled_layer_csrs` gives them) with one stable sort, and caches
    each on its CSR as :meth:`CSR.transpose_parts` would build it (same tensors, bit for bit).

    Layer k's sources ``col[:e_k]`` are shifted by ``off_k`` (the sources of the layers before it),
    so that the layers' keys occupy disjoint ranges, and sorted together: the sorted keys of layer
    k then fill positions [base_k, base_k + e_k) (base_k: the edges of the layers before it), with
    its edges in source order and, the sort being stable, in CSR order within a source. Row
    pointers are one binary search over the concatenated keys, targets one over the largest
    layer's rowptr (layers' rowptrs are prefixes of it)."""
    layers = [csr for csr in layers if "transpose" not in csr._derived]
    if not layers:
        return
    largest = max(layers, key=lambda csr: csr.num_edges)
    device, dtype = largest.col.device, largest.col.dtype
    total_edges = sum(csr.num_edges for csr in layers)
    total_src = sum(csr.num_src for csr in layers)
    key_dtype = torch.int32 if total_src < INT32_MAX else torch.int64
    keys = torch.empty(total_edges, dtype=key_dtype, device=device)
    base = off = 0
    segments = []
    for csr in layers:
        torch.add(csr.col, off, out=keys[base: base + csr.num_edges])
        segments.append((csr, base, off))
        base, off = base + csr.num_edges, off + csr.num_src
    sorted_keys, order = torch.sort(keys, stable=True)
    t_rowptr_all = torch.searchsorted(sorted_keys, ids(total_src + 1, device, key_dtype),
                                      out_int32=dtype == torch.int32)
    t_pos_all = torch.empty(total_edges, dtype=dtype, device=device)
    for csr, base, _ in segments:
        torch.sub(order[base: base + csr.num_edges], base, out=t_pos_all[base: base + csr.num_edges])
    t_col_all = torch.searchsorted(largest.rowptr, t_pos_all, right=True, out_int32=dtype == torch.int32).sub_(1)
    for csr, base, off in segments:
        t_rowptr = t_rowptr_all[off: off + csr.num_src + 1]
        if base:
            t_rowptr = t_rowptr - base
        parts = (t_rowptr, t_col_all[base: base + csr.num_edges], t_pos_all[base: base + csr.num_edges])
        if is_fresh(csr.rowptr):
            mark_fresh(t_rowptr)
        csr._derived["transpose"] = parts


# ---- padding a batch to fixed per-hop sizes (gnnfuse.loader.HopPadding) in two launches -------------------
_EDGE_COLS = 8  # per hop: padded block start, real edges, real block start, target base, target slots,
#                 padded edges, source base, source slots
_NODE_COLS = 3  # per hop (seeds first): padded block start, real nodes, real block start


@triton.jit
def _hop_of(pos, table_ptr, STRIDE: tl.constexpr, COL: tl.constexpr, HOPS: tl.constexpr):
    """The block of each position: how many of blocks 1..HOPS-1 start at or before it."""
    hop = tl.zeros_like(pos)
    for j in tl.static_range(1, HOPS):
        hop += (pos >= tl.load(table_ptr + j * STRIDE + COL)).to(hop.dtype)
    return hop


@triton.jit
def _slot_of(v, node_ptr, NODE_HOPS: tl.constexpr):
    """Padded slot of local node id ``v`` (its hop block moved to its padded start)."""
    hop = _hop_of(v, node_ptr, 3, 2, NODE_HOPS)
    return v + tl.load(node_ptr + hop * 3) - tl.load(node_ptr + hop * 3 + 2)


@triton.jit
def _pad_edges_kernel(src_ptr, dst_ptr, out_ptr, edge_ptr, node_ptr, E_pad,
                      HOPS: tl.constexpr, BLOCK: tl.constexpr):
    pos = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = pos < E_pad
    row = edge_ptr + _hop_of(pos, edge_ptr, 8, 0, HOPS) * 8
    k = pos - tl.load(row, mask=inside, other=0)
    real_edges = tl.load(row + 1, mask=inside, other=0)
    real = inside & (k < real_edges)
    r = tl.load(row + 2, mask=inside, other=0) + k
    s = _slot_of(tl.load(src_ptr + r, mask=real, other=0).to(tl.int64), node_ptr, HOPS + 1)
    d = _slot_of(tl.load(dst_ptr + r, mask=real, other=0).to(tl.int64), node_ptr, HOPS + 1)
    q = tl.maximum(k - real_edges, 0)  # index among the hop's padded edges
    pad_d = tl.load(row + 3, mask=inside, other=0) + q * tl.load(row + 4, mask=inside, other=0) \
        // tl.load(row + 5, mask=inside, other=1)
    pad_s = tl.load(row + 6, mask=inside, other=0) + q % tl.load(row + 7, mask=inside, other=1)
    tl.store(out_ptr + pos, tl.where(real, s, pad_s).to(out_ptr.dtype.element_ty), mask=inside)
    tl.store(out_ptr + E_pad + pos, tl.where(real, d, pad_d).to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _pad_nodes_kernel(node_in_ptr, out_ptr, node_ptr, N_pad, NODE_HOPS: tl.constexpr, BLOCK: tl.constexpr):
    pos = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = pos < N_pad
    row = node_ptr + _hop_of(pos, node_ptr, 3, 0, NODE_HOPS) * 3
    k = pos - tl.load(row, mask=inside, other=0)
    real = inside & (k < tl.load(row + 1, mask=inside, other=0))
    value = tl.load(node_in_ptr + tl.load(row + 2, mask=inside, other=0) + k, mask=real, other=0)
    tl.store(out_ptr + pos, value, mask=inside)  # dummy slots: node 0


def pad_batch(edge_index: torch.Tensor, node: torch.Tensor, edge_table: list[list[int]], node_table: list[list[int]],
              out_edge_index: torch.Tensor, out_node: torch.Tensor) -> None:
    """HopPadding.pad's work in two launches (the tables: see HopPadding._tables). The tables travel
    to the device through pinned memory, asynchronously."""
    hops = len(edge_table)
    table = torch.tensor([v for row in edge_table for v in row] + [v for row in node_table for v in row],
                         dtype=torch.long)
    if out_node.is_cuda:
        table = table.pin_memory().to(out_node.device, non_blocking=True)
    edges, nodes = table[: hops * _EDGE_COLS], table[hops * _EDGE_COLS:]
    if hops and out_edge_index.shape[1]:
        _pad_edges_kernel[(cdiv(out_edge_index.shape[1], BLOCK),)](
            edge_index[0], edge_index[1], out_edge_index, edges, nodes, out_edge_index.shape[1],
            HOPS=hops, BLOCK=BLOCK, num_warps=4)
    if out_node.numel():
        _pad_nodes_kernel[(cdiv(out_node.numel(), BLOCK),)](node, out_node, nodes, out_node.numel(),
                                                              NODE_HOPS=hops + 1, BLOCK=BLOCK, num_warps=4)
