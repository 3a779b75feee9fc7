"""@triton.jit kernels of ``gnnfuse.gat_attention``'s backward, the forward's piece merge, and the
device helpers the attention kernels share; the host side (work lists, launches) and the
description of the scheme are in attention.py, the forwards in attention_forward_kernels.py.

GAT's kernels share one edge walk (``_edge_block``): the only place that knows how a logit is
made (alpha_src[j] + alpha_dst[i] (+ edge term), leaky_relu), how self loops are replaced and
how dropout is drawn. GATv2 and dot-product attention (pair_attention_kernels.py) have their own
edge walk and reuse the rest: the piece prologue, the gathers, the online-softmax step, the row
store, the piece merge and dropout.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._launch import fast_kernel

NEG_INF = tl.constexpr(float("-inf"))  # a jit function may read only constexpr globals


@triton.jit
def _fmix32(h):
    h ^= h >> 16
    h *= 0x85EBCA6B
    h ^= h >> 13
    h *= 0xC2B2AE35
    h ^= h >> 16
    return h


@triton.jit
def _dropout_scale(seed, ids, heads, H, threshold, scale):
    """[BE, HB]: scale where kept, 0 where dropped (csrc/dropout_hash.h, bit for bit)."""
    counter = ids[:, None].to(tl.uint32) * H.to(tl.uint32) + heads[None, :].to(tl.uint32)
    r = _fmix32(_fmix32(counter) ^ seed.to(tl.uint32))
    return tl.where((r >> 8) >= threshold.to(tl.uint32), scale, 0.0)


@triton.jit
def _endpoints(nbr, ks, end):
    """The other endpoints of edges ks, 0 from ``end`` on (the virtual self loop, masked lanes)."""
    return tl.load(nbr + ks, mask=ks < end, other=0)


@triton.jit
def _gather(t, j, v2, heads, feats, fmask, H, F, DENSE: tl.constexpr, FB: tl.constexpr, ACC: tl.constexpr):
    """[R, HB, FB]: the head vectors of rows ``j`` [R] of a [N, H, F] tensor where v2 [R, HB], 0 elsewhere.
    DENSE (F == FB, a power of two): the offsets are multiples of FB known at compile time and the
    mask is constant along a head's features, so a row is read in 16-byte vectors (with a run-time
    F the compiler cannot prove the alignment and reads 4 bytes at a time)."""
    if DENSE:
        ptrs = t + j[:, None, None] * H * FB + heads[None, :, None] * FB + feats[None, None, :]
        mask = tl.broadcast_to(v2[:, :, None], ptrs.shape)
    else:
        ptrs = t + j[:, None, None] * H * F + heads[None, :, None] * F + feats[None, None, :]
        mask = v2[:, :, None] & fmask[None, None, :]
    return tl.load(ptrs, mask=mask, other=0).to(ACC), mask


@triton.jit
def _edge_block(ks, end, stop, node, heads, hmask, a_other, a_edge, a_loop, ids, pos, ad_node,
                N_EDGES, H, slope, seed, threshold, scale,
                TRANSPOSED: tl.constexpr, HAS_EDGE: tl.constexpr, HAS_LOOP_TERM: tl.constexpr,
                SELF_LOOPS: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr):
    """One block of a row's edges [.., end) plus the virtual self loop at position ``end`` when stop == end + 1.

    ``node`` is the row's own node (target i in the graph, source j in the transpose); ``ids``
    the other endpoints of edges ks (``_endpoints``), ``pos`` (transpose only) the CSR positions; ``ad_node`` the
    row's own term, [1, HB]. The row-group forward passes one edge of each of its rows instead:
    ks, end, stop and node [ROWS], ad_node [ROWS, HB]. Returns (other
    endpoint [BE], valid [BE, HB], s [BE, HB] pre-activation logit, e [BE, HB] logit or -inf,
    keep [BE, HB] dropout factor (1/(1-p) or 0)). Its loads (``_edge_terms``) and its maths
    (``_edge_logit``) are apart so that the forward can issue one step's loads before the previous
    step's maths.
    """
    other, v2, real, k, t_other, t_edge, t_loop = _edge_terms(ks, end, stop, node, heads, hmask, a_other, a_edge,
                                                              a_loop, ids, pos, H, TRANSPOSED, HAS_EDGE,
                                                              HAS_LOOP_TERM, SELF_LOOPS, ACC)
    s, e, keep = _edge_logit(t_other, t_edge, t_loop, ad_node, v2, real, k, node, heads, N_EDGES, H, slope, seed,
                             threshold, scale, HAS_EDGE, HAS_LOOP_TERM, DROPOUT, ACC)
    return other, v2, s, e, keep


@triton.jit
def _edge_terms(ks, end, stop, node, heads, hmask, a_other, a_edge, a_loop, ids, pos, H, TRANSPOSED: tl.constexpr,
                HAS_EDGE: tl.constexpr, HAS_LOOP_TERM: tl.constexpr, SELF_LOOPS: tl.constexpr, ACC: tl.constexpr):
    """_edge_block's loads: (other endpoint [BE], valid [BE, HB], real edge (not the virtual loop)
    [BE], edge id [BE], the logit's terms [BE, HB]: the other endpoint's, the edge's and the self
    loop's (0 where absent; without HAS_EDGE / HAS_LOOP_TERM the other endpoint's again, unused; with
    both, the edge's term holds the self loop's on the virtual edge, one load, and the loop's is unused))."""
    real = ks < end
    other = tl.where(real, ids.to(node.dtype), node)  # the virtual loop's other endpoint is the node itself
    valid = ks < stop
    if SELF_LOOPS:
        valid = valid & ~(real & (other == node))
    else:
        valid = valid & real
    if TRANSPOSED:
        k = tl.load(pos + ks, mask=real, other=0).to(tl.int64)
    else:
        k = ks
    v2 = valid[:, None] & hmask[None, :]
    t_other = tl.load(a_other + other[:, None] * H + heads[None, :], mask=v2, other=0).to(ACC)
    t_edge = t_other
    t_loop = t_other
    if HAS_EDGE:
        if HAS_LOOP_TERM:  # one load: the edge's term, on the virtual self loop the loop's (t_edge, _edge_logit)
            loop_row = node + 0 * ks
            rows = tl.where(real[:, None], a_edge + k[:, None] * H, a_loop + loop_row[:, None] * H)
            t_edge = tl.load(rows + heads[None, :], mask=v2, other=0).to(ACC)
        else:
            t_edge = tl.load(a_edge + k[:, None] * H + heads[None, :], mask=v2 & real[:, None], other=0).to(ACC)
    elif HAS_LOOP_TERM:
        loop_row = node + 0 * ks
        t_loop = tl.load(a_loop + loop_row[:, None] * H + heads[None, :], mask=v2 & ~real[:, None], other=0).to(ACC)
    return other, v2, real, k, t_other, t_edge, t_loop


@triton.jit
def _edge_logit(t_other, t_edge, t_loop, ad_node, v2, real, k, node, heads, N_EDGES, H, slope, seed, threshold,
                scale, HAS_EDGE: tl.constexpr, HAS_LOOP_TERM: tl.constexpr, DROPOUT: tl.constexpr,
                ACC: tl.constexpr):
    """_edge_block's maths on _edge_terms' loads: (s pre-activation logit, e logit or -inf, keep)."""
    s = t_other + ad_node
    if HAS_EDGE:
        s += t_edge  # (with HAS_LOOP_TERM, the self loop's term on the virtual edge: see _edge_terms)
    elif HAS_LOOP_TERM:
        s += t_loop
    e = tl.where(s > 0, s, s * slope)
    e = tl.where(v2, e, NEG_INF)
    if DROPOUT:
        ids = tl.where(real, k, N_EDGES + node)
        keep = _dropout_scale(seed, ids, heads, H, threshold, scale)
    else:
        keep = tl.full(e.shape, 1.0, ACC)
    return s, e, keep


@triton.jit
def _piece(seg_row, seg_ptr, slot, rowptr, NUM_LOOPS, SEG: tl.constexpr):
    """This program's piece of a work list: (row, piece index, first edge, the row's end, the
    piece's stop (the row's virtual self loop, position ``end``, belongs to its last piece),
    the partial slot of the piece, or -1 when the row is not split)."""
    return _piece_at(tl.program_id(0).to(tl.int64), seg_row, seg_ptr, slot, rowptr, NUM_LOOPS, SEG)


@triton.jit
def _piece_at(s, seg_row, seg_ptr, slot, rowptr, NUM_LOOPS, SEG: tl.constexpr):
    """Piece ``s`` of a work list (see _piece)."""
    row = tl.load(seg_row + s).to(tl.int64)
    k = s - tl.load(seg_ptr + row)
    start = tl.load(rowptr + row).to(tl.int64) + k * SEG
    end = tl.load(rowptr + row + 1).to(tl.int64)
    stop = tl.where(start + SEG >= end, end + (row < NUM_LOOPS).to(tl.int64), start + SEG)
    first = tl.load(slot + row)
    return row, k, start, end, stop, tl.where(first >= 0, first + k, -1)


@triton.jit
def _online_step(m, z, acc, e, keep, xv):
    """One edge of each row of a row group: the online softmax's max m and sum z [ROWS, HB] and the
    accumulator [ROWS, HB, FB] take logit e [ROWS, HB] (-inf: no edge) with values xv."""
    m_new = tl.maximum(m, e)
    m_safe = tl.where(m_new == NEG_INF, 0.0, m_new)  # no edge yet
    # One exponential: of the old max where the edge raises it (the old state's rescale; the edge's
    # weight is then exp(0) = 1), else of the edge (its weight; the rescale is exp(0) = 1). The same
    # values, bit for bit, as rescale = exp(m - m_safe), w = exp(e - m_safe).
    rises = e > m
    x = tl.exp(tl.where(rises, m, e) - m_safe)
    rescale = tl.where(rises, x, 1.0)
    w = tl.where(rises, 1.0, x)
    return m_new, z * rescale + w, acc * rescale[:, :, None] + (w * keep)[:, :, None] * xv


@triton.jit
def _head_block(H, F, HB: tl.constexpr, FB: tl.constexpr):
    """This program's block of HB heads (grid axis 1) and the FB feature lanes, with their masks:
    (heads, hmask, feats, fmask)."""
    heads = tl.program_id(1) * HB + tl.arange(0, HB)
    feats = tl.arange(0, FB)
    return heads, heads < H, feats, feats < F


@triton.jit
def _merge_lanes(m, z, acc):
    """The per-lane states of a piece walked BE edges a step (lane l took edges l, l + BE, ...; m, z
    [BE, HB], acc [BE, HB, FB]) folded into the piece's (max [HB], sum [HB], acc [HB, FB]) by the
    piece merge's rule. On tiles spread over several warps the lanes keep the loop free of
    reductions over the tile's edges (across warps: through shared memory and a barrier, three a
    step); they come once, here."""
    m_row = tl.max(m, 0)
    m_safe = tl.where(m_row == NEG_INF, 0.0, m_row)  # no edge in the piece
    lane_scale = tl.exp(m - m_safe[None, :])  # 0 for lanes without an edge
    return m_row, tl.sum(z * lane_scale, 0), tl.sum(acc * lane_scale[:, :, None], 0)


@triton.jit
def _store_row(out, m_out, z_out, i, heads, feats, hmask, hf, H, F, m, z, acc):
    """A finished row: out = acc / z (0 for a row without edges), the saved row max and sum."""
    inv = tl.where(z > 0, 1.0 / tl.where(z > 0, z, 1.0), 0.0)
    tl.store(out + i * H * F + heads[:, None] * F + feats[None, :], (acc * inv[:, None]).to(out.dtype.element_ty),
             mask=hf)
    tl.store(m_out + i * H + heads, tl.where(z > 0, m, 0.0), mask=hmask)
    tl.store(z_out + i * H + heads, z, mask=hmask)


@fast_kernel
@triton.jit
def _merge_pieces_kernel(p_acc, p_m, p_z, out, m_out, z_out, split_rows, seg_ptr, slot, H, F, ACC: tl.constexpr,
                         BK: tl.constexpr, HB: tl.constexpr, FB: tl.constexpr):
    """Second pass of the forward over split rows: the pieces' states (m_k, z_k, acc_k) merged in piece
    order, BK at a time, by the online softmax's rule (M = max m_k, Z = sum z_k exp(m_k - M),
    acc = sum acc_k exp(m_k - M)) in one pass over them."""
    i = tl.load(split_rows + tl.program_id(0)).to(tl.int64)
    heads, hmask, feats, fmask = _head_block(H, F, HB, FB)
    hf = hmask[:, None] & fmask[None, :]
    n = tl.load(seg_ptr + i + 1) - tl.load(seg_ptr + i)
    first = tl.load(slot + i)
    m = tl.full((HB,), NEG_INF, ACC)
    z = tl.zeros((HB,), ACC)
    acc = tl.zeros((HB, FB), ACC)
    for k0 in range(0, n, BK):
        ks = first + k0 + tl.arange(0, BK)
        k2 = ((k0 + tl.arange(0, BK)) < n)[:, None] & hmask[None, :]
        pm = tl.load(p_m + ks[:, None] * H + heads[None, :], mask=k2, other=NEG_INF)
        pz = tl.load(p_z + ks[:, None] * H + heads[None, :], mask=k2, other=0)
        pa = tl.load(p_acc + ks[:, None, None] * H * F + heads[None, :, None] * F + feats[None, None, :],
                     mask=k2[:, :, None] & fmask[None, None, :], other=0)
        m_new = tl.maximum(m, tl.max(pm, 0))
        m_safe = tl.where(m_new == NEG_INF, 0.0, m_new)
        rescale = tl.exp(m - m_safe)
        w = tl.exp(pm - m_safe[None, :])  # 0 for pieces without an edge (m_k = -inf)
        z = z * rescale + tl.sum(w * pz, 0)
        acc = acc * rescale[:, None] + tl.sum(w[:, :, None] * pa, 0)
        m = m_new
    _store_row(out, m_out, z_out, i, heads, feats, hmask, hf, H, F, m, z, acc)


@fast_kernel
@triton.jit(do_not_specialize=["H", "seed", "threshold"])
def _backward_rows_kernel(g, out, m_in, z_in, x, a_src, a_dst, a_edge, a_loop, rowptr, col, D, g_dst, g_edge, g_loop,
                          seg_row, seg_ptr, slot, p_dst, NUM_LOOPS, N_EDGES, H, F, slope, seed, threshold, scale,
                          HAS_EDGE: tl.constexpr, HAS_LOOP_TERM: tl.constexpr, SELF_LOOPS: tl.constexpr,
                          DROPOUT: tl.constexpr, PER_EDGE: tl.constexpr, NEED_DST: tl.constexpr,
                          NEED_EDGE: tl.constexpr, NEED_LOOP: tl.constexpr, ACC: tl.constexpr,
                          BE: tl.constexpr, HB: tl.constexpr, FB: tl.constexpr, SEG: tl.constexpr):
    """D_i = g_i . out_i (every piece recomputes it, the first stores it); with PER_EDGE, ds of
    every edge: grad alpha_edge, alpha_loop, and grad alpha_dst (the row sum; a partial per piece
    of a split row)."""
    i, k, start, end, stop, part = _piece(seg_row, seg_ptr, slot, rowptr, NUM_LOOPS, SEG)
    heads, hmask, feats, fmask = _head_block(H, F, HB, FB)
    hf = hmask[:, None] & fmask[None, :]
    offs = i * H * F + heads[:, None] * F + feats[None, :]
    gi = tl.load(g + offs, mask=hf, other=0).to(ACC)
    d = tl.sum(gi * tl.load(out + offs, mask=hf, other=0).to(ACC), 1)
    tl.store(D + i * H + heads, d, mask=hmask & (k + 0 * heads == 0))  # [HB] masks: the interpreter wants arrays
    if PER_EDGE:
        ad = tl.load(a_dst + i * H + heads, mask=hmask, other=0).to(ACC)
        mi = tl.load(m_in + i * H + heads, mask=hmask, other=0)
        zi = tl.load(z_in + i * H + heads, mask=hmask, other=1)
        zi = tl.where(zi > 0, zi, 1.0)
        acc = tl.zeros((HB,), ACC)
        for k0 in range(start, stop, BE):
            ks = k0 + tl.arange(0, BE)
            j, v2, s, e, keep = _edge_block(ks, end, stop, i, heads, hmask, a_src, a_edge, a_loop,
                                            _endpoints(col, ks, end), col, ad[None, :], N_EDGES, H, slope, seed,
                                            threshold, scale, False, HAS_EDGE, HAS_LOOP_TERM, SELF_LOOPS, DROPOUT, ACC)
            p = tl.exp(e - mi[None, :]) / zi[None, :]
            xv = tl.load(x + j[:, None, None] * H * F + heads[None, :, None] * F + feats[None, None, :],
                         mask=v2[:, :, None] & (feats < F)[None, None, :], other=0).to(ACC)
            gx = tl.sum(gi[None, :, :] * xv, 2)
            ds = tl.where(v2, p * (keep * gx - d[None, :]) * tl.where(s > 0, 1.0, slope), 0.0)
            acc += tl.sum(ds, 0)
            real = (ks < end)[:, None]
            if NEED_EDGE:
                tl.store(g_edge + ks[:, None] * H + heads[None, :], ds.to(g_edge.dtype.element_ty), mask=v2 & real)
            if NEED_LOOP:
                loop_row = i + 0 * ks
                tl.store(g_loop + loop_row[:, None] * H + heads[None, :], ds.to(g_loop.dtype.element_ty),
                         mask=v2 & ~real)
        if NEED_DST:
            whole = part + 0 * heads < 0  # the row is one piece
            tl.store(g_dst + i * H + heads, acc.to(g_dst.dtype.element_ty), mask=hmask & whole)
            tl.store(p_dst + part * H + heads, acc, mask=hmask & ~whole)


@fast_kernel
@triton.jit(do_not_specialize=["H", "seed", "threshold"])
def _backward_sources_kernel(g, m_in, z_in, x, a_src, a_dst, a_edge, a_loop, t_rowptr, t_col, t_pos, D, g_x, g_src,
                             att_src, att_dst, g_dst, seg_row, seg_ptr, slot, p_x, p_src, NUM_LOOPS, N_EDGES, H, F,
                             slope, seed, threshold, scale, HAS_EDGE: tl.constexpr, HAS_LOOP_TERM: tl.constexpr,
                             SELF_LOOPS: tl.constexpr, DROPOUT: tl.constexpr, NEED_X: tl.constexpr,
                             NEED_SRC: tl.constexpr, FOLD_ATT: tl.constexpr, ACC: tl.constexpr, BE: tl.constexpr,
                             HB: tl.constexpr, FB: tl.constexpr, SEG: tl.constexpr):
    """grad x[j] = sum_k c_k g_i and grad alpha_src[j] = sum_k ds_k over j's out-edges (the transpose's
    row; partial sums per piece of a split row). FOLD_ATT (x is the projection h whose terms are
    alpha_src = h . att_src, alpha_dst = h . att_dst, one node set for both roles): grad x[j] also
    takes grad alpha_src[j] att_src + grad alpha_dst[j] att_dst (g_dst: the row pass's, complete),
    h's whole gradient; linear, so each piece of a split row adds its own alpha_src part and the
    row's first piece the alpha_dst term."""
    j, _k, start, end, stop, part = _piece(seg_row, seg_ptr, slot, t_rowptr, NUM_LOOPS, SEG)
    heads, hmask, feats, fmask = _head_block(H, F, HB, FB)
    hf = hmask[:, None] & fmask[None, :]
    offs = j * H * F + heads[:, None] * F + feats[None, :]
    xj = tl.load(x + offs, mask=hf, other=0).to(ACC)
    asrc = tl.load(a_src + j * H + heads, mask=hmask, other=0).to(ACC)
    acc_x = tl.zeros((HB, FB), ACC)
    acc_s = tl.zeros((HB,), ACC)
    for q0 in range(start, stop, BE):
        qs = q0 + tl.arange(0, BE)
        i, v2, s, e, keep = _edge_block(qs, end, stop, j, heads, hmask, a_dst, a_edge, a_loop,
                                        _endpoints(t_col, qs, end), t_pos, asrc[None, :], N_EDGES, H, slope, seed,
                                        threshold, scale, True, HAS_EDGE, HAS_LOOP_TERM, SELF_LOOPS, DROPOUT, ACC)
        ih = i[:, None] * H + heads[None, :]
        mi = tl.load(m_in + ih, mask=v2, other=0)
        zi = tl.load(z_in + ih, mask=v2, other=1)
        p = tl.where(v2, tl.exp(e - mi) / tl.where(zi > 0, zi, 1.0), 0.0)
        gi = tl.load(g + i[:, None, None] * H * F + heads[None, :, None] * F + feats[None, None, :],
                     mask=v2[:, :, None] & fmask[None, None, :], other=0).to(ACC)
        if NEED_X:
            acc_x += tl.sum((p * keep)[:, :, None] * gi, 0)
        if NEED_SRC:
            gx = tl.sum(gi * xj[None, :, :], 2)
            di = tl.load(D + ih, mask=v2, other=0)
            acc_s += tl.sum(tl.where(v2, p * (keep * gx - di) * tl.where(s > 0, 1.0, slope), 0.0), 0)
    whole = part + 0 * heads < 0  # the row is one piece
    if FOLD_ATT:
        hf_offs = heads[:, None] * F + feats[None, :]
        gd = tl.load(g_dst + j * H + heads, mask=hmask & (_k + 0 * heads == 0), other=0).to(ACC)
        acc_x += acc_s[:, None] * tl.load(att_src + hf_offs, mask=hf, other=0).to(ACC)
        acc_x += gd[:, None] * tl.load(att_dst + hf_offs, mask=hf, other=0).to(ACC)
    if NEED_X:
        tl.store(g_x + offs, acc_x.to(g_x.dtype.element_ty), mask=hf & whole[:, None])
        tl.store(p_x + part * H * F + heads[:, None] * F + feats[None, :], acc_x, mask=hf & ~whole[:, None])
    if NEED_SRC:
        tl.store(g_src + j * H + heads, acc_s.to(g_src.dtype.element_ty), mask=hmask & whole)
        tl.store(p_src + part * H + heads, acc_s, mask=hmask & ~whole)
