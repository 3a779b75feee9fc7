"""@triton.jit kernels of ``gnnfuse::pair_attention`` (GATv2 and dot-product logits; maths in
gnnfuse/ops/pair_attention.py, host side in pair_attention.py).

The backward kernels, by the same scheme as GAT's (attention_kernels.py, whose piece prologue,
gathers and dropout they use): one program per (piece of a row, block of heads), partials of split
rows folded afterwards; the forward is attention_forward_kernels.py's one-launch kernel.
``_pair_edges`` (used by both) is the one place that knows how a logit is made from the two
endpoints' [HB, FB] head vectors. With KV_SAME (GATv2: the values are the source features the
logit reads) the gathered source tile serves both.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._launch import fast_kernel
from .attention_kernels import NEG_INF, _dropout_scale, _endpoints, _gather, _head_block, _piece, _piece_at


@triton.jit
def _pair_edges(ks, end, stop, node, heads, hmask, feats, fmask, others, ids, pos, node_vec, att, edge, perm, N_EDGES,
                H, F, slope, qk_scale, seed, threshold, scale, TRANSPOSED: tl.constexpr, SELF_LOOPS: tl.constexpr,
                DROPOUT: tl.constexpr, GATV2: tl.constexpr, HAS_EDGE: tl.constexpr, EDGE_LOOPS: tl.constexpr,
                EDGE_PERM: tl.constexpr, ACC: tl.constexpr, DENSE: tl.constexpr, FB: tl.constexpr):
    """One block of a row's edges (the virtual self loop at position ``end`` when stop == end + 1),
    as GAT's _edge_block (``ids``: the other endpoints, ``node_vec``: the row's own vectors [1, HB, FB],
    [ROWS, HB, FB] in the row-group forward).
    Returns (other endpoint [BE], valid [BE, HB], valid [BE, HB, FB], the other endpoints' vectors
    [BE, HB, FB], logit e [BE, HB] (-inf where invalid), dropout factor [BE, HB], the edge
    features' row [BE] and tile [BE, HB, FB] (zeros without HAS_EDGE)). DENSE: vector loads (see _gather)."""
    other, v2, v3, real, k, ov, erow, ev = _pair_terms(ks, end, stop, node, heads, hmask, feats, fmask, others, ids,
                                                       pos, edge, perm, N_EDGES, H, F, TRANSPOSED, SELF_LOOPS,
                                                       HAS_EDGE, EDGE_LOOPS, EDGE_PERM, ACC, DENSE, FB)
    e, keep = _pair_logit(ov, ev, node_vec, att, v2, real, k, node, heads, N_EDGES, H, slope, qk_scale, seed, threshold,
                          scale, TRANSPOSED, DROPOUT, GATV2, HAS_EDGE, ACC)
    return other, v2, v3, ov, e, keep, erow, ev


@triton.jit
def _pair_terms(ks, end, stop, node, heads, hmask, feats, fmask, others, ids, pos, edge, perm, N_EDGES, H, F,
                TRANSPOSED: tl.constexpr, SELF_LOOPS: tl.constexpr, HAS_EDGE: tl.constexpr,
                EDGE_LOOPS: tl.constexpr, EDGE_PERM: tl.constexpr, ACC: tl.constexpr, DENSE: tl.constexpr,
                FB: tl.constexpr):
    """_pair_edges' loads (apart from its maths, ``_pair_logit``, so that the forward can issue one
    step's loads before the previous step's maths): (other endpoint, valid [BE, HB], valid
    [BE, HB, FB], real edge (not the virtual loop) [BE], edge id [BE], the other endpoints' vectors,
    the edge features' row and tile (zeros without HAS_EDGE)).
    The edge features' rows: perm[k] for CSR position k (EDGE_PERM: rows in edge_index order) or k
    itself (rows in CSR order), E + node for the row's virtual self loop where the tensor has those
    rows (EDGE_LOOPS); without them a loop's edge term is zero (its load masked off)."""
    real = ks < end
    other = tl.where(real, ids.to(node.dtype), node)
    valid = ks < stop
    if SELF_LOOPS:
        valid = valid & ~(real & (other == node))
    else:
        valid = valid & real
    v2 = valid[:, None] & hmask[None, :]
    ov, v3 = _gather(others, other, v2, heads, feats, fmask, H, F, DENSE, FB, ACC)
    if TRANSPOSED:
        k = tl.load(pos + ks, mask=real, other=0).to(tl.int64)
    else:
        k = ks
    if HAS_EDGE:
        if EDGE_PERM:
            erow = tl.where(real, tl.load(perm + k, mask=real, other=0).to(tl.int64), N_EDGES + node)
        else:
            erow = tl.where(real, k.to(tl.int64), N_EDGES + node)
        if EDGE_LOOPS:
            ev, _v3 = _gather(edge, erow, v2, heads, feats, fmask, H, F, DENSE, FB, ACC)
        else:
            ev, _v3 = _gather(edge, erow, v2 & real[:, None], heads, feats, fmask, H, F, DENSE, FB, ACC)
    else:
        erow = k
        ev = tl.zeros(ov.shape, ACC)
    return other, v2, v3, real, k, ov, erow, ev


@triton.jit
def _pair_logit(ov, ev, node_vec, att, v2, real, k, node, heads, N_EDGES, H, slope, qk_scale, seed, threshold, scale,
                TRANSPOSED: tl.constexpr, DROPOUT: tl.constexpr, GATV2: tl.constexpr, HAS_EDGE: tl.constexpr,
                ACC: tl.constexpr):
    """_pair_edges' maths on _pair_terms' loads: (logit e [BE, HB] (-inf where invalid), dropout factor)."""
    if GATV2:
        u = ov + node_vec
        if HAS_EDGE:
            u += ev
        e = tl.sum(tl.where(u > 0, u, u * slope) * att[None, :, :], 2)
    elif HAS_EDGE and TRANSPOSED:  # the walking row is the key: q_i . (k_j + edge)
        e = tl.sum(ov * (node_vec + ev), 2) * qk_scale
    elif HAS_EDGE:
        e = tl.sum((ov + ev) * node_vec, 2) * qk_scale
    else:
        e = tl.sum(ov * node_vec, 2) * qk_scale
    return _masked_logit(e, v2, real, k, node, heads, N_EDGES, H, seed, threshold, scale, DROPOUT, ACC)


@triton.jit
def _masked_logit(e, v2, real, k, node, heads, N_EDGES, H, seed, threshold, scale, DROPOUT: tl.constexpr,
                  ACC: tl.constexpr):
    """A step's logits e [R, HB] with -inf where invalid, and their dropout factor (edge ids k where real, the
    virtual self loop's E + node else): the end of _pair_logit and of pair_forward_split._logit5."""
    e = tl.where(v2, e, NEG_INF)
    if DROPOUT:
        keep = _dropout_scale(seed, tl.where(real, k, N_EDGES + node), heads, H, threshold, scale)
    else:
        keep = tl.full(e.shape, 1.0, ACC)
    return e, keep


@triton.jit
def _head_tile(t, row, heads, feats, hf, H, F, ACC: tl.constexpr):
    """[HB, FB] of row ``row`` of a [N, H, F] tensor (0 outside)."""
    return tl.load(t + row * H * F + heads[:, None] * F + feats[None, :], mask=hf, other=0).to(ACC)


@triton.jit
def _att_tile(att, heads, feats, hf, F, GATV2: tl.constexpr, ACC: tl.constexpr, HB: tl.constexpr, FB: tl.constexpr):
    """GATv2's attention vector [HB, FB] (zeros for the dot product, which has none)."""
    if GATV2:
        return tl.load(att + heads[:, None] * F + feats[None, :], mask=hf, other=0).to(ACC)
    return tl.zeros((HB, FB), ACC)


@fast_kernel
@triton.jit(do_not_specialize=["H", "seed", "threshold"])
def _pair_backward_rows_kernel(g, out, m_in, z_in, q, k, v, att, edge, perm, rowptr, col, D, g_q, p_q, p_att, g_edge,
                               seg_row, seg_ptr, slot, NUM_PIECES, NUM_LOOPS, N_EDGES, H, F, slope, qk_scale, seed,
                               threshold, scale, SELF_LOOPS: tl.constexpr, DROPOUT: tl.constexpr,
                               GATV2: tl.constexpr, HAS_EDGE: tl.constexpr, EDGE_LOOPS: tl.constexpr,
                               EDGE_PERM: tl.constexpr, KV_SAME: tl.constexpr, NEED_Q: tl.constexpr,
                               NEED_ATT: tl.constexpr, NEED_EDGE: tl.constexpr,
                               D_GIVEN: tl.constexpr, D_INLINE: tl.constexpr, ACC: tl.constexpr,
                               BE: tl.constexpr, HB: tl.constexpr, FB: tl.constexpr, SEG: tl.constexpr,
                               DENSE: tl.constexpr):
    """D_i = g_i . out_i (the first piece stores it; D_GIVEN: read from D, which
    _pair_row_term_kernel filled without ``out``; D_INLINE, where every row is one piece: made
    here from the saved statistics, ``_row_term``, one launch less); grad q (partials for split rows), the edge
    features' gradient (each edge's row written once) and, for GATv2, grad att. Each program walks
    pieces pid, pid + P, pid + 2P, ... (P programs; P = NUM_PIECES unless grad att is wanted) and
    keeps grad att's partial across them: p_att has P rows (summed on the host in a fixed order),
    not one per piece. DENSE: 16-byte feature loads (_gather)."""
    heads, hmask, feats, fmask = _head_block(H, F, HB, FB)
    hf = hmask[:, None] & fmask[None, :]
    a = _att_tile(att, heads, feats, hf, F, GATV2, ACC, HB, FB)
    acc_a = tl.zeros((HB, FB), ACC)
    for s in range(tl.program_id(0), NUM_PIECES, tl.num_programs(0)):
        i, kk, start, end, stop, part = _piece_at(s, seg_row, seg_ptr, slot, rowptr, NUM_LOOPS, SEG)
        gi = _head_tile(g, i, heads, feats, hf, H, F, ACC)
        if D_INLINE:
            d = _row_term(g, m_in, z_in, q, k, v, edge, perm, col, a, i, start, end, stop, heads, hmask, feats, fmask,
                          hf, N_EDGES, H, F, slope, qk_scale, seed, threshold, scale, SELF_LOOPS, DROPOUT, GATV2,
                          HAS_EDGE, EDGE_LOOPS, EDGE_PERM, KV_SAME, ACC, BE, FB, DENSE)
            tl.store(D + i * H + heads, d, mask=hmask)
        elif D_GIVEN:
            d = tl.load(D + i * H + heads, mask=hmask, other=0)
        else:
            d = tl.sum(gi * _head_tile(out, i, heads, feats, hf, H, F, ACC), 1)
            # [HB] masks: the interpreter wants arrays
            tl.store(D + i * H + heads, d, mask=hmask & (kk + 0 * heads == 0))
        if NEED_Q or NEED_ATT or NEED_EDGE:
            qi = _head_tile(q, i, heads, feats, hf, H, F, ACC)
            mi = tl.load(m_in + i * H + heads, mask=hmask, other=0)
            zi = tl.load(z_in + i * H + heads, mask=hmask, other=1)
            zi = tl.where(zi > 0, zi, 1.0)
            acc_q = tl.zeros((HB, FB), ACC)
            for k0 in range(start, stop, BE):
                ks = k0 + tl.arange(0, BE)
                j, v2, v3, kv, e, keep, er, ev = _pair_edges(ks, end, stop, i, heads, hmask, feats, fmask, k,
                                                             _endpoints(col, ks, end), col, qi[None, :, :], a, edge,
                                                             perm, N_EDGES, H, F, slope, qk_scale, seed, threshold,
                                                             scale, False, SELF_LOOPS, DROPOUT, GATV2, HAS_EDGE,
                                                             EDGE_LOOPS, EDGE_PERM, ACC, DENSE, FB)
                p = tl.exp(e - mi[None, :]) / zi[None, :]
                if KV_SAME:
                    xv = kv
                else:
                    xv, _mask = _gather(v, j, v2, heads, feats, fmask, H, F, DENSE, FB, ACC)
                    if HAS_EDGE:
                        xv += ev
                ds = tl.where(v2, p * (keep * tl.sum(gi[None, :, :] * xv, 2) - d[None, :]), 0.0)
                if GATV2:
                    u = kv + qi[None, :, :]
                    if HAS_EDGE:
                        u += ev
                    t = ds[:, :, None] * a[None, :, :] * tl.where(u > 0, 1.0, slope)  # d logit / d u, times ds
                    acc_q += tl.sum(t, 0)
                    if NEED_ATT:
                        acc_a += tl.sum(ds[:, :, None] * tl.where(u > 0, u, u * slope), 0)
                else:
                    if HAS_EDGE:
                        acc_q += tl.sum(ds[:, :, None] * (kv + ev), 0) * qk_scale
                    else:
                        acc_q += tl.sum(ds[:, :, None] * kv, 0) * qk_scale
                    t = ds[:, :, None] * qi[None, :, :] * qk_scale + (p * keep)[:, :, None] * gi[None, :, :]
                if NEED_EDGE:  # a virtual loop without an edge row (EDGE_LOOPS False) has no gradient to write
                    w3 = v3 if EDGE_LOOPS else v3 & (ks < end)[:, None, None]
                    tl.store(g_edge + er[:, None, None] * H * F + heads[None, :, None] * F + feats[None, None, :],
                             t.to(g_edge.dtype.element_ty), mask=w3)
            whole = part + 0 * heads < 0  # the row is one piece
            if NEED_Q:
                tl.store(g_q + i * H * F + heads[:, None] * F + feats[None, :], acc_q.to(g_q.dtype.element_ty),
                         mask=hf & whole[:, None])
                tl.store(p_q + part * H * F + heads[:, None] * F + feats[None, :], acc_q, mask=hf & ~whole[:, None])
    if NEED_ATT:
        slot_a = tl.program_id(0).to(tl.int64)
        tl.store(p_att + slot_a * H * F + heads[:, None] * F + feats[None, :], acc_a, mask=hf)


@triton.jit
def _row_term(g, m_in, z_in, q, k, v, edge, perm, col, a, i, start, end, stop, heads, hmask, feats, fmask, hf,
              N_EDGES, H, F, slope, qk_scale, seed, threshold, scale, SELF_LOOPS: tl.constexpr,
              DROPOUT: tl.constexpr, GATV2: tl.constexpr, HAS_EDGE: tl.constexpr, EDGE_LOOPS: tl.constexpr,
              EDGE_PERM: tl.constexpr, KV_SAME: tl.constexpr,
              ACC: tl.constexpr, BE: tl.constexpr, FB: tl.constexpr, DENSE: tl.constexpr):
    """[HB]: sum over edges [start, stop) of row i of c_k g_i . v_k (values with the edge term),
    each c_k recomputed from the saved row max and sum: the whole row's D_i = g_i . out_i when
    the range is the whole row."""
    gi = _head_tile(g, i, heads, feats, hf, H, F, ACC)
    qi = _head_tile(q, i, heads, feats, hf, H, F, ACC)
    mi = tl.load(m_in + i * H + heads, mask=hmask, other=0)
    zi = tl.load(z_in + i * H + heads, mask=hmask, other=1)
    zi = tl.where(zi > 0, zi, 1.0)
    acc = tl.zeros(mi.shape, ACC)
    for k0 in range(start, stop, BE):
        ks = k0 + tl.arange(0, BE)
        j, v2, v3, kv, e, keep, _er, ev = _pair_edges(ks, end, stop, i, heads, hmask, feats, fmask, k,
                                                      _endpoints(col, ks, end), col, qi[None, :, :], a, edge, perm,
                                                      N_EDGES, H, F, slope, qk_scale, seed, threshold, scale, False,
                                                      SELF_LOOPS, DROPOUT, GATV2, HAS_EDGE, EDGE_LOOPS, EDGE_PERM, ACC,
                                                      DENSE, FB)
        if KV_SAME:
            xv = kv
        else:
            xv, _mask = _gather(v, j, v2, heads, feats, fmask, H, F, DENSE, FB, ACC)
            if HAS_EDGE:
                xv += ev
        p = tl.exp(e - mi[None, :]) / zi[None, :]  # 0 where e is -inf (no edge)
        acc += tl.sum(p * keep * tl.sum(gi[None, :, :] * xv, 2), 0)
    return acc


@fast_kernel
@triton.jit(do_not_specialize=["H", "seed", "threshold"])
def _pair_row_term_kernel(g, m_in, z_in, q, k, v, att, edge, perm, rowptr, col, D, p_d, seg_row, seg_ptr, slot,
                          NUM_LOOPS, N_EDGES, H, F, slope, qk_scale, seed, threshold, scale,
                          SELF_LOOPS: tl.constexpr, DROPOUT: tl.constexpr, GATV2: tl.constexpr, HAS_EDGE: tl.constexpr,
                          EDGE_LOOPS: tl.constexpr, EDGE_PERM: tl.constexpr, KV_SAME: tl.constexpr, ACC: tl.constexpr,
                          BE: tl.constexpr, HB: tl.constexpr,
                          FB: tl.constexpr, SEG: tl.constexpr, DENSE: tl.constexpr):
    """The row pass's per-row term without the op's output: D_i = g_i . out_i (``_row_term``), so
    the forward need not keep ``out`` for the backward. One program per (piece, head block); a
    split row's pieces write partials (p_d), folded in piece order afterwards. (Where no row is
    split, the row pass computes it itself: D_INLINE.)"""
    i, _k, start, end, stop, part = _piece(seg_row, seg_ptr, slot, rowptr, NUM_LOOPS, SEG)
    heads, hmask, feats, fmask = _head_block(H, F, HB, FB)
    hf = hmask[:, None] & fmask[None, :]
    a = _att_tile(att, heads, feats, hf, F, GATV2, ACC, HB, FB)
    acc = _row_term(g, m_in, z_in, q, k, v, edge, perm, col, a, i, start, end, stop, heads, hmask, feats, fmask, hf,
                    N_EDGES, H, F, slope, qk_scale, seed, threshold, scale, SELF_LOOPS, DROPOUT, GATV2, HAS_EDGE,
                    EDGE_LOOPS, EDGE_PERM, KV_SAME, ACC, BE, FB, DENSE)
    whole = part + 0 * heads < 0  # the row is one piece
    tl.store(D + i * H + heads, acc, mask=hmask & whole)
    tl.store(p_d + part * H + heads, acc, mask=hmask & ~whole)


@fast_kernel
@triton.jit(do_not_specialize=["H", "seed", "threshold"])
def _pair_backward_sources_kernel(g, m_in, z_in, q, k, v, att, edge, perm, t_rowptr, t_col, t_pos, D, g_k, g_v, p_k,
                                  p_v, seg_row, seg_ptr, slot, NUM_LOOPS, N_EDGES, H, F, slope, qk_scale, seed,
                                  threshold, scale, SELF_LOOPS: tl.constexpr, DROPOUT: tl.constexpr,
                                  GATV2: tl.constexpr, HAS_EDGE: tl.constexpr, EDGE_LOOPS: tl.constexpr,
                                  EDGE_PERM: tl.constexpr, NEED_K: tl.constexpr, NEED_V: tl.constexpr,
                                  KV_SUM: tl.constexpr,
                                  ACC: tl.constexpr, BE: tl.constexpr, HB: tl.constexpr, FB: tl.constexpr,
                                  SEG: tl.constexpr, DENSE: tl.constexpr):
    """grad k[j] and grad v[j] over j's out-edges (the transpose's row; partials for split rows).
    KV_SUM (k and v are one tensor, GATv2's source features): their sum, into g_k / p_k alone.
    DENSE: 16-byte feature loads (_gather)."""
    j, _k, start, end, stop, part = _piece(seg_row, seg_ptr, slot, t_rowptr, NUM_LOOPS, SEG)
    heads, hmask, feats, fmask = _head_block(H, F, HB, FB)
    hf = hmask[:, None] & fmask[None, :]
    kj = _head_tile(k, j, heads, feats, hf, H, F, ACC)
    vj = _head_tile(v, j, heads, feats, hf, H, F, ACC)
    a = _att_tile(att, heads, feats, hf, F, GATV2, ACC, HB, FB)
    acc_k = tl.zeros((HB, FB), ACC)
    acc_v = tl.zeros((HB, FB), ACC)
    for q0 in range(start, stop, BE):
        qs = q0 + tl.arange(0, BE)
        i, v2, v3, qv, e, keep, _er, ev = _pair_edges(qs, end, stop, j, heads, hmask, feats, fmask, q,
                                                      _endpoints(t_col, qs, end), t_pos, kj[None, :, :], a, edge,
                                                      perm, N_EDGES, H, F, slope, qk_scale, seed, threshold, scale,
                                                      True, SELF_LOOPS, DROPOUT, GATV2, HAS_EDGE, EDGE_LOOPS,
                                                      EDGE_PERM, ACC, DENSE, FB)
        ih = i[:, None] * H + heads[None, :]
        mi = tl.load(m_in + ih, mask=v2, other=0)
        zi = tl.load(z_in + ih, mask=v2, other=1)
        p = tl.where(v2, tl.exp(e - mi) / tl.where(zi > 0, zi, 1.0), 0.0)
        gi, _mask = _gather(g, i, v2, heads, feats, fmask, H, F, DENSE, FB, ACC)
        if NEED_V or KV_SUM:
            acc_v += tl.sum((p * keep)[:, :, None] * gi, 0)
        if NEED_K:
            di = tl.load(D + ih, mask=v2, other=0)
            if GATV2 or not HAS_EDGE:
                gv = tl.sum(gi * vj[None, :, :], 2)
            else:  # TransformerConv's values carry the edge term
                gv = tl.sum(gi * (vj[None, :, :] + ev), 2)
            ds = tl.where(v2, p * (keep * gv - di), 0.0)
            if GATV2:
                u = qv + kj[None, :, :]
                if HAS_EDGE:
                    u += ev
                acc_k += tl.sum(ds[:, :, None] * a[None, :, :] * tl.where(u > 0, 1.0, slope), 0)
            else:
                acc_k += tl.sum(ds[:, :, None] * qv, 0) * qk_scale
    whole = (part + 0 * heads < 0)[:, None]  # the row is one piece
    offs = heads[:, None] * F + feats[None, :]
    if KV_SUM:
        acc_k += acc_v
    if NEED_K:
        tl.store(g_k + j * H * F + offs, acc_k.to(g_k.dtype.element_ty), mask=hf & whole)
        tl.store(p_k + part * H * F + offs, acc_k, mask=hf & ~whole)
    if NEED_V:
        tl.store(g_v + j * H * F + offs, acc_v.to(g_v.dtype.element_ty), mask=hf & whole)
        tl.store(p_v + part * H * F + offs, acc_v, mask=hf & ~whole)
