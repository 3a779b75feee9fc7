"""Triton host side of ``gnnfuse::pair_attention`` (GATv2 and dot-product attention): work lists,
partial buffers and launches. Kernels in pair_attention_kernels.py (backward) and
attention_forward_kernels.py (forward); the forward runs in one launch and merges split rows
exactly as GAT's (attention._one_pass_plan, the online-softmax merge), the backward splits rows
into pieces of SPLIT_EDGES with ordered sums as GAT's.
"""
from __future__ import annotations

import torch
import triton.language as tl

from . import attention as gat
from ._grid import cdiv
from .attention_forward_kernels import _pair_forward_one_pass_kernel
from .pair_attention_kernels import _pair_backward_rows_kernel, _pair_backward_sources_kernel, _pair_row_term_kernel


# GATv2's att gradient: the row pass runs at most this many programs, each summing its pieces'
# partials, so the buffer is [ATT_SLOTS, H, F] floats (8 MB at 4x64) whatever the graph's size; a
# constant (not the GPU's SM count) keeps the sum's order, hence the bits, the same on every GPU.
ATT_SLOTS = 8192


def _setup(q, k, rowptr, col, self_loops, gatv2, slope, scale, p, seed):
    n_src, H, F = k.shape
    acc = tl.float64 if k.dtype == torch.float64 else tl.float32
    scalars = (min(n_src, q.shape[0]) if self_loops else 0, col.shape[0], H, F, float(slope), float(scale), int(seed),
               int(round(p * (1 << 24))), 1.0 / (1.0 - p))
    be, hb, fb = gat._blocks(H, F, col.shape[0], q.shape[0])
    flags = dict(SELF_LOOPS=bool(self_loops), DROPOUT=p > 0, GATV2=bool(gatv2), ACC=acc, BE=be, HB=hb, FB=fb,
                 SEG=gat.SPLIT_EDGES, num_warps=gat._warps(be, hb, fb))
    return n_src, H, F, scalars, flags


def _same(k, v) -> bool:
    """v is k's memory (GATv2's values are the source features): one gather serves both."""
    return v.data_ptr() == k.data_ptr() and v.shape == k.shape and v.stride() == k.stride()


def forward(q, k, v, att, edge, rowptr, col, perm, t_rowptr, t_col, t_pos, self_loops, gatv2, slope, scale, p, seed):
    n_src, H, F, scalars, flags = _setup(q, k, rowptr, col, self_loops, gatv2, slope, scale, p, seed)
    num_dst = q.shape[0]
    stat = torch.float64 if k.dtype == torch.float64 else torch.float32
    out = k.new_empty(num_dst, H, F)
    m = k.new_empty(num_dst, H, dtype=stat)
    z = torch.empty_like(m)
    if not (num_dst and H):
        return out, m, z
    plan = gat._one_pass_plan(rowptr, col, n_src, H, F, k.element_size(), pair=True)
    wl = plan.wl
    p_acc, p_m, p_z = gat._partials(m, wl.num_partials, H, F, stat)
    _pair_forward_one_pass_kernel[(plan.tasks.numel(), cdiv(H, plan.hb))](
        q, k, v, att if att is not None else k, edge if edge is not None else k, perm if perm is not None else col,
        rowptr, col, out, m, z, plan.short, plan.short.numel(), plan.tasks, wl.seg_row, wl.seg_ptr, wl.slot, p_acc,
        p_m, p_z, *scalars, SELF_LOOPS=bool(self_loops), DROPOUT=p > 0, GATV2=bool(gatv2), HAS_EDGE=edge is not None,
        KV_SAME=_same(k, v), ACC=flags["ACC"], HB=plan.hb, FB=plan.fb, R=plan.rows, SEG=plan.seg,
        DENSE=F == plan.fb, num_warps=plan.warps)
    if wl.num_partials:
        gat._merge_pieces(p_acc, p_m, p_z, out, m, z, wl, H, F, plan.hb, plan.fb, flags["ACC"])
    return out, m, z


def backward(grad_out, out, m, z, q, k, v, att, edge, rowptr, col, perm, t_rowptr, t_col, t_pos, self_loops, gatv2,
             slope, scale, p, seed, needs):
    n_src, H, F, scalars, flags = _setup(q, k, rowptr, col, self_loops, gatv2, slope, scale, p, seed)
    flags["HAS_EDGE"] = edge is not None
    num_dst = q.shape[0]
    need_q, need_k, need_v, need_att = needs[0], needs[1], needs[2], needs[3] and bool(gatv2)
    kv_sum = len(needs) > 5 and bool(needs[5]) and need_k and not need_v and _same(k, v)  # (ops/pair_attention.py)
    need_edge = needs[4] and edge is not None
    empty = k.new_empty(0)
    g_q = torch.empty_like(q) if need_q else empty
    g_k = torch.empty_like(k) if need_k else empty
    g_v = torch.empty_like(v) if need_v else empty
    g_att = empty
    g_edge = torch.zeros_like(edge) if need_edge else empty  # rows of skipped self-loop edges stay 0
    D = torch.empty_like(m)
    hb = flags["HB"]
    att_ = att if att is not None else k
    edge_, perm_ = (edge, perm) if edge is not None else (k, col)
    kv_same = _same(k, v)
    d_given = out.numel() == 0 and num_dst and H  # the forward did not keep out: D from the saved statistics
    if num_dst and H:
        wl = gat._work(rowptr)
        d_inline = bool(d_given) and not wl.num_partials  # no split row: the row pass makes D itself
        if d_given and not d_inline:
            p_d = m.new_empty(wl.num_partials, H) if wl.num_partials else m
            _pair_row_term_kernel[(wl.num_pieces, cdiv(H, hb))](
                grad_out, m, z, q, k, v, att_, edge_, perm_, rowptr, col, D, p_d, wl.seg_row, wl.seg_ptr, wl.slot,
                *scalars, KV_SAME=kv_same, **flags)
            gat._fold(p_d, D, wl, H)
        p_q = m.new_empty(wl.num_partials, H, F) if need_q and wl.num_partials else m
        programs = min(wl.num_pieces, ATT_SLOTS) if need_att else wl.num_pieces
        p_att = m.new_empty(programs, H, F) if need_att else m
        _pair_backward_rows_kernel[(programs, cdiv(H, hb))](
            grad_out, grad_out if d_given else out, m, z, q, k, v, att_, edge_, perm_, rowptr, col, D,
            g_q if need_q else k, p_q, p_att, g_edge if need_edge else k, wl.seg_row, wl.seg_ptr, wl.slot,
            wl.num_pieces, *scalars,
            KV_SAME=kv_same, NEED_Q=need_q, NEED_ATT=need_att, NEED_EDGE=need_edge, D_GIVEN=bool(d_given),
            D_INLINE=d_inline, **flags)
        if need_q:
            gat._fold(p_q, g_q, wl, H * F)
        if need_att:
            g_att = p_att.sum(0).to(att.dtype)  # pieces in a fixed order: deterministic
    elif need_att:
        g_att = torch.zeros_like(att)
    if n_src and H and (need_k or need_v):
        wl = gat._work(t_rowptr)
        parts = wl.num_partials
        p_k = m.new_empty(parts, H, F) if need_k and parts else m
        p_v = m.new_empty(parts, H, F) if need_v and parts else m
        _pair_backward_sources_kernel[(wl.num_pieces, cdiv(H, hb))](
            grad_out, m, z, q, k, v, att_, edge_, perm_, t_rowptr, t_col, t_pos, D, g_k if need_k else k,
            g_v if need_v else k, p_k, p_v, wl.seg_row, wl.seg_ptr, wl.slot, *scalars, NEED_K=need_k, NEED_V=need_v,
            KV_SUM=kv_sum, **flags)
        if need_k:
            gat._fold(p_k, g_k, wl, H * F)
        if need_v:
            gat._fold(p_v, g_v, wl, H * F)
    return g_q, g_k, g_v, g_att, g_edge
