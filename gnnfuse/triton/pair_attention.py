"""Triton host side of ``gnnfuse::pair_attention`` (GATv2 and dot-product attention): work lists,
partial buffers and launches. Kernels in pair_attention_kernels.py (backward) and
attention_forward_kernels.py (forward); the forward runs in one launch and merges split rows
exactly as GAT's (attention._one_pass_plan, the online-softmax merge), the backward splits rows
into pieces of SPLIT_EDGES with ordered sums as GAT's.
"""
from __future__ import annotations

import torch

from . import attention as gat
from .._tensor_cache import cached
from ._grid import cdiv
from ._launch import ALIGN, BoundLaunches
from .attention_forward_kernels import _pair_forward_one_pass_kernel
from .attention_launches import BackwardSetup, node_setup, shared_empty
from .pair_attention_kernels import _pair_backward_rows_kernel, _pair_backward_sources_kernel, _pair_row_term_kernel


# GATv2's att gradient: the row pass runs at most this many programs, each summing its pieces'
# partials, so the buffer is [ATT_SLOTS, H, F] floats (8 MB at 4x64) whatever the graph's size; a
# constant (not the GPU's SM count) keeps the sum's order, hence the bits, the same on every GPU.
ATT_SLOTS = 8192
# The backward on narrow heads (F < attention.WIDE_HEAD; wide heads keep GAT's tiles and 4-byte loads):
# BACKWARD_DENSE, 16-byte feature loads where the head width is a power of two (as the forward's), and
# at most BACKWARD_EDGE_BLOCK edges a step (GAT's _blocks follows the graph's average degree up to 32).
# The pair kernels hold two [BE, HB, FB] gathers (dot: keys and values, or queries and gradients;
# GATv2: keys and the rows' u) and their products: on an H100 at 8 x 8 with dropout 0.6 the dot row
# and source passes took 48 + 33 us on rfc-uniform (average degree 20) against 291 + 184 with 4-byte
# loads at the degree's BE 32, GATv2's 32 + 37 against 198 + 191, and on products-like (scale 0.4,
# average degree 25) 14.5 ms against 67.7 (dot, the row-term pass included) and 10.3 against 57.3
# (GATv2); arxiv-like (BE 4 already) 0.97 against 1.55 ms (dot) and 0.85 against 1.45 (GATv2).
# At 4 x 64 the 16-byte loads slowed GATv2's row pass on arxiv-like from 1.56 to 2.42 ms, hence narrow
# heads only (benchmarks/results/attention-pair-backward_h100_2026-11-24_gpudot.md). Both knobs as module
# attributes for A/B runs and tests (False / None: the previous kernels' loads and tiles).
BACKWARD_DENSE = True
BACKWARD_EDGE_BLOCK = 4


def _flags(k, v, self_loops, gatv2, p, edge, perm, num_edges: int) -> tuple:
    """The kernels' flags shared by the forward and the backward, as (name, value) pairs. Edge features
    (ops/pair_attention.py): EDGE_LOOPS, the tensor has the self loops' rows (E + loops rows; E rows:
    the loops' edge terms are zero, no row read or written); EDGE_PERM, its rows are in edge_index
    order, read through perm (else in CSR order, row k for CSR position k)."""
    has = edge is not None
    return (("SELF_LOOPS", bool(self_loops)), ("DROPOUT", p > 0), ("GATV2", bool(gatv2)), ("HAS_EDGE", has),
            ("EDGE_LOOPS", has and edge.shape[0] > num_edges), ("EDGE_PERM", has and perm is not None),
            ("KV_SAME", _same(k, v)))


def _same(k, v) -> bool:
    """v is k's memory (GATv2's values are the source features): one gather serves both."""
    return v.data_ptr() == k.data_ptr() and v.shape == k.shape and v.stride() == k.stride()


def forward(q, k, v, att, edge, rowptr, col, perm, t_rowptr, t_col, t_pos, self_loops, gatv2, slope, scale, p, seed,
            memo=None, heads=None):
    """The op's forward. ``memo``: optional dict of the graph's (a CSR's ``_derived``, dropped with it
    when its tensors change) where a one-node route keeps this call's setup, found again by a small
    key instead of the setup cache's lookup (attention_launches.node_setup). ``heads``: q, k and v
    come as contiguous [N, heads * F] (a one-node route's products, no view to heads made)."""
    n_src, H, F = k.shape if heads is None else (k.shape[0], heads, k.shape[1] // heads)
    num_dst = q.shape[0]
    out = k.new_empty(num_dst, H, F)
    m = k.new_empty(num_dst, H, dtype=torch.float64 if k.dtype == torch.float64 else torch.float32)
    z = torch.empty_like(m)
    if not (num_dst and H):
        return out, m, z
    if memo is not None and edge is None and perm is None:  # (the one-node routes' calls)
        kv = v is k or _same(k, v)
        setup = node_setup(memo, ("pair-forward", n_src, H, F, k.dtype, bool(self_loops), bool(gatv2), p > 0, kv),
                               gat._forward_knobs(), lambda: _forward_setup(k.view(n_src, H, F), v.view(n_src, H, F),
                                                                            rowptr, col, self_loops, gatv2, p, None,
                                                                            None))
    else:
        k3, v3 = (k, v) if heads is None else (k.view(n_src, H, F), v.view(v.shape[0], H, F))
        setup = _forward_setup(k3, v3, rowptr, col, self_loops, gatv2, p, edge, perm)
    tensors = (q, k, v, att if att is not None else k, edge if edge is not None else k,
               perm if perm is not None else col, rowptr, col, out, m, z)
    fast = k.is_cuda and BoundLaunches.enabled() and ALIGN
    setup.run(tensors, _scalars(n_src, num_dst, col.shape[0], H, F, self_loops, slope, scale, p, seed), fast)
    return out, m, z


def _forward_setup(k, v, rowptr, col, self_loops, gatv2, p, edge, perm):
    return gat.forward_setup("pair-forward", _pair_forward_one_pass_kernel, k, rowptr, col,
                             _flags(k, v, self_loops, gatv2, p, edge, perm, col.shape[0]), pair=True)


def _scalars(n_src, num_dst, num_edges, H, F, self_loops, slope, scale, p, seed) -> tuple:
    """The kernels' runtime scalars: GAT's (attention._scalars) with the logit scale after the slope."""
    loops, edges, heads, width, slope, seed, threshold, keep = gat._scalars(n_src, num_dst, num_edges, H, F, self_loops,
                                                                           slope, p, seed)
    return loops, edges, heads, width, slope, float(scale), seed, threshold, keep


def _backward_setup(k, rowptr, t_rowptr, col, t_col, t_pos, flags: tuple, needs: tuple, d_given: bool) -> BackwardSetup:
    """The backward's work lists, grids, constexprs and bound launches (cached, as the forward's)."""
    n_src, H, F = k.shape
    need_q, need_k, need_v, need_att, need_edge, kv_sum = needs

    def build():
        num_dst = rowptr.shape[0] - 1
        be, hb, fb = gat._blocks(H, F, col.shape[0], num_dst)
        narrow = fb < gat.WIDE_HEAD
        if narrow and BACKWARD_EDGE_BLOCK:
            be = min(be, BACKWARD_EDGE_BLOCK)
        base = dict(flags, ACC=gat._acc(k.dtype), BE=be, HB=hb, FB=fb, SEG=gat.SPLIT_EDGES,
                    DENSE=bool(BACKWARD_DENSE and narrow and F == fb), num_warps=gat._warps(be, hb, fb))
        rows = gat._work(rowptr) if num_dst and H else None
        sources = gat._work(t_rowptr) if n_src and H and (need_k or need_v) else None
        d_inline = d_given and rows is not None and not rows.num_partials  # no split row: the row pass makes D
        rows_launch = term_launch = None
        if rows is not None:
            programs = min(rows.num_pieces, ATT_SLOTS) if need_att else rows.num_pieces
            rows_launch = ((programs, cdiv(H, hb)), dict(base, NEED_Q=need_q, NEED_ATT=need_att, NEED_EDGE=need_edge,
                                                         D_GIVEN=d_given, D_INLINE=d_inline))
            term_launch = ((rows.num_pieces, cdiv(H, hb)), base) if d_given and not d_inline else None
        sources_meta = {name: value for name, value in base.items() if name != "KV_SAME"}  # (reads v alone)
        return BackwardSetup(rows, rows_launch, sources, None if sources is None else (
            (sources.num_pieces, cdiv(H, hb)), dict(sources_meta, NEED_K=need_k, NEED_V=need_v, KV_SUM=kv_sum)),
            row_term=term_launch)

    key = (n_src, H, F, col.shape[0], k.dtype, col.dtype, t_col.dtype, t_pos.dtype, flags, needs, d_given,
           gat._knobs(), BACKWARD_DENSE, BACKWARD_EDGE_BLOCK)
    return cached("pair-backward", (rowptr, t_rowptr), key, build)


def backward(grad_out, out, m, z, q, k, v, att, edge, rowptr, col, perm, t_rowptr, t_col, t_pos, self_loops, gatv2,
             slope, scale, p, seed, needs, outs=None, memo=None, heads=None):
    """The op's backward; ``outs``: optional (g_q, g_k, g_v) buffers of q's, k's and v's shape, contiguous,
    to write those gradients into (a caller's slices of one tensor; the registered op passes none);
    ``memo``: as forward's (a one-node route's; the gradients not asked for are then one shared empty
    tensor, which that route drops); ``heads``: as forward's (grad_out contiguous, any shape of its size;
    q's, k's and v's gradients then come as [N, heads * F])."""
    n_src, H, F = k.shape if heads is None else (k.shape[0], heads, k.shape[1] // heads)
    num_dst = q.shape[0]
    need_q, need_k, need_v, need_att = bool(needs[0]), bool(needs[1]), bool(needs[2]), bool(needs[3]) and bool(gatv2)
    kv_sum = len(needs) > 5 and bool(needs[5]) and need_k and not need_v and _same(k, v)  # (ops/pair_attention.py)
    need_edge = bool(needs[4]) and edge is not None
    node = memo is not None and edge is None and perm is None  # (the one-node routes' calls)
    empty = shared_empty(k) if node else k.new_empty(0)
    if outs is None:
        g_q = torch.empty_like(q) if need_q else empty
        g_k = torch.empty_like(k) if need_k else empty
        g_v = torch.empty_like(v) if need_v else empty
    else:
        g_q, g_k, g_v = (t if need else empty for t, need in zip(outs, (need_q, need_k, need_v)))
    g_att = empty
    g_edge = empty
    if need_edge:  # every edge's row is written, but for the graph's own self loops that self loops skip
        every_row = not self_loops and edge.shape[0] == col.shape[0]
        g_edge = torch.empty_like(edge) if every_row else torch.zeros_like(edge)
    D = torch.empty_like(m)
    d_given = bool(out.numel() == 0 and num_dst and H)  # the forward did not keep out: D from the saved statistics
    needs_ = (need_q, need_k, need_v, need_att, need_edge, kv_sum)
    if node:
        kv = v is k or _same(k, v)
        setup = node_setup(memo, ("pair-backward", n_src, H, F, k.dtype, bool(self_loops), bool(gatv2), p > 0, kv,
                                      needs_, d_given), (gat._knobs(), BACKWARD_DENSE, BACKWARD_EDGE_BLOCK),
                               lambda: _backward_setup(k.view(n_src, H, F), rowptr, t_rowptr, col, t_col, t_pos,
                                                       _flags(k, v, self_loops, gatv2, p, None, None, col.shape[0]),
                                                       needs_, d_given))
    else:
        setup = _backward_setup(k if heads is None else k.view(n_src, H, F), rowptr, t_rowptr, col, t_col, t_pos,
                                _flags(k, v, self_loops, gatv2, p, edge, perm, col.shape[0]), needs_, d_given)
    scalars = _scalars(n_src, num_dst, col.shape[0], H, F, self_loops, slope, scale, p, seed)
    att_ = att if att is not None else k
    edge_ = edge if edge is not None else k
    perm_ = perm if perm is not None else col
    fast = k.is_cuda and BoundLaunches.enabled() and ALIGN
    launch, wl = setup.launch, setup.rows
    if wl is not None:
        term = setup.extra["row_term"]
        if term is not None:  # split rows: D by a pass of its own, folded, before the row pass
            p_d = m.new_empty(wl.num_partials, H) if wl.num_partials else m
            launch("row_term", _pair_row_term_kernel, term[0], (
                grad_out, m, z, q, k, v, att_, edge_, perm_, rowptr, col, D, p_d, wl.seg_row, wl.seg_ptr, wl.slot,
                *scalars), term[1], fast)
            setup.fold("fold_d", p_d, D, wl, H, fast)
        p_q = m.new_empty(wl.num_partials, H, F) if need_q and wl.num_partials else m
        grid, meta = setup.rows_launch
        p_att = m.new_empty(grid[0], H, F) if need_att else m
        launch("rows", _pair_backward_rows_kernel, grid, (
            grad_out, grad_out if d_given else out, m, z, q, k, v, att_, edge_, perm_, rowptr, col, D,
            g_q if need_q else k, p_q, p_att, g_edge if need_edge else k, wl.seg_row, wl.seg_ptr, wl.slot,
            wl.num_pieces, *scalars), meta, fast)
        if need_q:
            setup.fold("fold_q", p_q, g_q, wl, H * F, fast)
        if need_att:
            g_att = p_att.sum(0).to(att.dtype)  # pieces in a fixed order: deterministic
    elif need_att:
        g_att = torch.zeros_like(att)
    wl = setup.sources
    if wl is not None:
        parts = wl.num_partials
        p_k = m.new_empty(parts, H, F) if need_k and parts else m
        p_v = m.new_empty(parts, H, F) if need_v and parts else m
        launch("sources", _pair_backward_sources_kernel, setup.sources_launch[0], (
            grad_out, m, z, q, k, v, att_, edge_, perm_, t_rowptr, t_col, t_pos, D, g_k if need_k else k,
            g_v if need_v else k, p_k, p_v, wl.seg_row, wl.seg_ptr, wl.slot, *scalars), setup.sources_launch[1], fast)
        if need_k:
            setup.fold("fold_k", p_k, g_k, wl, H * F, fast)
        if need_v:
            setup.fold("fold_v", p_v, g_v, wl, H * F, fast)
    return g_q, g_k, g_v, g_att, g_edge
