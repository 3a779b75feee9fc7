"""Triton kernels of ``gnnfuse.gat_attention`` (maths in gnnfuse/ops/attention.py).

One program per (target row, block of HB heads) in the forward and in the backward's row pass,
one per (source row, block of heads) in the backward's transpose pass: every output row is
written by one program, so there are no atomics and results are deterministic. Edges are walked
in blocks of BE; a tile is [BE, HB, FB] (edges x heads x features).

Forward: online softmax (flash-attention style): a running max m and sum z per head, the
accumulator rescaled by exp(m_old - m_new) when a block raises the max.

The three kernels share one edge walk (``_edge_block``): the only place that knows how a logit is
made (alpha_src[j] + alpha_dst[i] (+ edge term), leaky_relu), how self loops are replaced and
how dropout is drawn. Another attention form (GATv2, dot-product) changes only that function.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._grid import cdiv, next_power_of_2

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
def _edge_block(ks, end, stop, node, heads, hmask, a_other, a_edge, a_loop, nbr, pos, ad_node,
                N_EDGES, H, slope, seed, threshold, scale,
                TRANSPOSED: tl.constexpr, HAS_EDGE: tl.constexpr, HAS_LOOP_TERM: tl.constexpr,
                SELF_LOOPS: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr):
    """One block of a row's edges [.., end) plus the virtual self loop at position ``end`` when stop == end + 1.

    ``node`` is the row's own node (target i in the graph, source j in the transpose); ``nbr``
    holds the other endpoints and ``pos`` (transpose only) the CSR positions. Returns (other
    endpoint [BE], valid [BE, HB], s [BE, HB] pre-activation logit, e [BE, HB] logit or -inf,
    keep [BE, HB] dropout factor (1/(1-p) or 0)).
    """
    real = ks < end
    other = tl.load(nbr + ks, mask=real, other=0).to(tl.int64)
    other = tl.where(real, other, node)  # the virtual loop's other endpoint is the node itself
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
    s = tl.load(a_other + other[:, None] * H + heads[None, :], mask=v2, other=0).to(ACC) + ad_node[None, :]
    if HAS_EDGE:
        s += tl.load(a_edge + k[:, None] * H + heads[None, :], mask=v2 & real[:, None], other=0).to(ACC)
    if HAS_LOOP_TERM:
        loop_row = node + 0 * ks
        s += tl.load(a_loop + loop_row[:, None] * H + heads[None, :], mask=v2 & ~real[:, None], other=0).to(ACC)
    e = tl.where(s > 0, s, s * slope)
    e = tl.where(v2, e, NEG_INF)
    if DROPOUT:
        ids = tl.where(real, k, N_EDGES + node)
        keep = _dropout_scale(seed, ids, heads, H, threshold, scale)
    else:
        keep = tl.full(e.shape, 1.0, ACC)
    return other, v2, s, e, keep


@triton.jit(do_not_specialize=["H", "seed", "threshold"])  # .to() needs tensors, not constexpr 1
def _forward_kernel(x, a_src, a_dst, a_edge, a_loop, rowptr, col, out, m_out, z_out,
                    NUM_LOOPS, N_EDGES, H, F, slope, seed, threshold, scale,
                    HAS_EDGE: tl.constexpr, HAS_LOOP_TERM: tl.constexpr, SELF_LOOPS: tl.constexpr,
                    DROPOUT: tl.constexpr, ACC: tl.constexpr, BE: tl.constexpr, HB: tl.constexpr, FB: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HB + tl.arange(0, HB)
    hmask = heads < H
    feats = tl.arange(0, FB)
    fmask = feats < F
    start = tl.load(rowptr + i).to(tl.int64)
    end = tl.load(rowptr + i + 1).to(tl.int64)
    stop = end + (i < NUM_LOOPS).to(tl.int64)
    ad = tl.load(a_dst + i * H + heads, mask=hmask, other=0).to(ACC)
    m = tl.full((HB,), NEG_INF, ACC)
    z = tl.zeros((HB,), ACC)
    acc = tl.zeros((HB, FB), ACC)
    for k0 in range(start, stop, BE):
        ks = k0 + tl.arange(0, BE)
        j, v2, s, e, keep = _edge_block(ks, end, stop, i, heads, hmask, a_src, a_edge, a_loop, col, col, ad, N_EDGES, H,
                                        slope, seed, threshold, scale, False, HAS_EDGE, HAS_LOOP_TERM, SELF_LOOPS,
                                        DROPOUT, ACC)
        m_new = tl.maximum(m, tl.max(e, 0))
        m_safe = tl.where(m_new == NEG_INF, 0.0, m_new)  # a block of skipped edges only
        rescale = tl.exp(m - m_safe)
        w = tl.exp(e - m_safe[None, :])
        z = z * rescale + tl.sum(w, 0)
        xv = tl.load(x + j[:, None, None] * H * F + heads[None, :, None] * F + feats[None, None, :],
                     mask=v2[:, :, None] & fmask[None, None, :], other=0).to(ACC)
        acc = acc * rescale[:, None] + tl.sum((w * keep)[:, :, None] * xv, 0)
        m = m_new
    inv = tl.where(z > 0, 1.0 / tl.where(z > 0, z, 1.0), 0.0)
    tl.store(out + i * H * F + heads[:, None] * F + feats[None, :], (acc * inv[:, None]).to(out.dtype.element_ty),
             mask=hmask[:, None] & fmask[None, :])
    tl.store(m_out + i * H + heads, tl.where(z > 0, m, 0.0), mask=hmask)
    tl.store(z_out + i * H + heads, z, mask=hmask)


@triton.jit(do_not_specialize=["H", "seed", "threshold"])
def _backward_rows_kernel(g, out, m_in, z_in, x, a_src, a_dst, a_edge, a_loop, rowptr, col, D, g_dst, g_edge, g_loop,
                          NUM_LOOPS, N_EDGES, H, F, slope, seed, threshold, scale,
                          HAS_EDGE: tl.constexpr, HAS_LOOP_TERM: tl.constexpr, SELF_LOOPS: tl.constexpr,
                          DROPOUT: tl.constexpr, PER_EDGE: tl.constexpr, NEED_DST: tl.constexpr,
                          NEED_EDGE: tl.constexpr, NEED_LOOP: tl.constexpr, ACC: tl.constexpr,
                          BE: tl.constexpr, HB: tl.constexpr, FB: tl.constexpr):
    """D_i = g_i . out_i; with PER_EDGE, ds of every edge: grad alpha_dst (row sum), alpha_edge, alpha_loop."""
    i = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HB + tl.arange(0, HB)
    hmask = heads < H
    feats = tl.arange(0, FB)
    hf = hmask[:, None] & (feats < F)[None, :]
    offs = i * H * F + heads[:, None] * F + feats[None, :]
    gi = tl.load(g + offs, mask=hf, other=0).to(ACC)
    d = tl.sum(gi * tl.load(out + offs, mask=hf, other=0).to(ACC), 1)
    tl.store(D + i * H + heads, d, mask=hmask)
    if PER_EDGE:
        start = tl.load(rowptr + i).to(tl.int64)
        end = tl.load(rowptr + i + 1).to(tl.int64)
        stop = end + (i < NUM_LOOPS).to(tl.int64)
        ad = tl.load(a_dst + i * H + heads, mask=hmask, other=0).to(ACC)
        mi = tl.load(m_in + i * H + heads, mask=hmask, other=0)
        zi = tl.load(z_in + i * H + heads, mask=hmask, other=1)
        zi = tl.where(zi > 0, zi, 1.0)
        acc = tl.zeros((HB,), ACC)
        for k0 in range(start, stop, BE):
            ks = k0 + tl.arange(0, BE)
            j, v2, s, e, keep = _edge_block(ks, end, stop, i, heads, hmask, a_src, a_edge, a_loop, col, col, ad,
                                            N_EDGES, H, slope, seed, threshold, scale, False, HAS_EDGE, HAS_LOOP_TERM,
                                            SELF_LOOPS, DROPOUT, ACC)
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
            tl.store(g_dst + i * H + heads, acc.to(g_dst.dtype.element_ty), mask=hmask)


@triton.jit(do_not_specialize=["H", "seed", "threshold"])
def _backward_sources_kernel(g, m_in, z_in, x, a_src, a_dst, a_edge, a_loop, t_rowptr, t_col, t_pos, D, g_x, g_src,
                             NUM_LOOPS, N_EDGES, H, F, slope, seed, threshold, scale,
                             HAS_EDGE: tl.constexpr, HAS_LOOP_TERM: tl.constexpr, SELF_LOOPS: tl.constexpr,
                             DROPOUT: tl.constexpr, NEED_X: tl.constexpr, NEED_SRC: tl.constexpr,
                             ACC: tl.constexpr, BE: tl.constexpr, HB: tl.constexpr, FB: tl.constexpr):
    """grad x[j] = sum_k c_k g_i and grad alpha_src[j] = sum_k ds_k over j's out-edges (the transpose's row)."""
    j = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HB + tl.arange(0, HB)
    hmask = heads < H
    feats = tl.arange(0, FB)
    fmask = feats < F
    hf = hmask[:, None] & fmask[None, :]
    offs = j * H * F + heads[:, None] * F + feats[None, :]
    xj = tl.load(x + offs, mask=hf, other=0).to(ACC)
    asrc = tl.load(a_src + j * H + heads, mask=hmask, other=0).to(ACC)
    start = tl.load(t_rowptr + j).to(tl.int64)
    end = tl.load(t_rowptr + j + 1).to(tl.int64)
    stop = end + (j < NUM_LOOPS).to(tl.int64)
    acc_x = tl.zeros((HB, FB), ACC)
    acc_s = tl.zeros((HB,), ACC)
    for q0 in range(start, stop, BE):
        qs = q0 + tl.arange(0, BE)
        i, v2, s, e, keep = _edge_block(qs, end, stop, j, heads, hmask, a_dst, a_edge, a_loop, t_col, t_pos, asrc,
                                        N_EDGES, H, slope, seed, threshold, scale, True, HAS_EDGE, HAS_LOOP_TERM,
                                        SELF_LOOPS, DROPOUT, ACC)
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
    if NEED_X:
        tl.store(g_x + offs, acc_x.to(g_x.dtype.element_ty), mask=hf)
    if NEED_SRC:
        tl.store(g_src + j * H + heads, acc_s.to(g_src.dtype.element_ty), mask=hmask)


# ---- launchers ------------------------------------------------------------------------------------
def _blocks(H: int, F: int) -> tuple[int, int, int]:
    """(BE, HB, FB): all features of a head in one tile, heads packed up to 128 columns, tile <= 4096."""
    fb = next_power_of_2(F)
    hb = max(1, min(next_power_of_2(H), 128 // fb))
    be = max(4, min(32, 4096 // (hb * fb)))
    return be, hb, fb


def _common(x, rowptr, col, self_loops, slope, p, seed):
    n_src, H, F = x.shape
    num_dst = rowptr.shape[0] - 1
    acc = tl.float64 if x.dtype == torch.float64 else tl.float32
    scalars = (min(n_src, num_dst) if self_loops else 0, col.shape[0], H, F, float(slope), int(seed),
               int(round(p * (1 << 24))), 1.0 / (1.0 - p))
    return n_src, num_dst, H, F, acc, scalars


def forward(x, a_src, a_dst, a_edge, a_loop, rowptr, col, t_rowptr, t_col, t_pos, self_loops, slope, p, seed):
    n_src, num_dst, H, F, acc, scalars = _common(x, rowptr, col, self_loops, slope, p, seed)
    stat = torch.float64 if x.dtype == torch.float64 else torch.float32
    out = x.new_empty(num_dst, H, F)
    m = x.new_empty(num_dst, H, dtype=stat)
    z = torch.empty_like(m)
    be, hb, fb = _blocks(H, F)
    if num_dst and H:
        with torch.cuda.device(x.device) if x.is_cuda else _nullcontext():
            _forward_kernel[(num_dst, cdiv(H, hb))](
                x, a_src, a_dst, a_edge if a_edge is not None else x, a_loop if a_loop is not None else x, rowptr, col,
                out, m, z, *scalars, HAS_EDGE=a_edge is not None, HAS_LOOP_TERM=a_loop is not None,
                SELF_LOOPS=bool(self_loops), DROPOUT=p > 0, ACC=acc, BE=be, HB=hb, FB=fb)
    return out, m, z


def backward(grad_out, out, m, z, x, a_src, a_dst, a_edge, a_loop, rowptr, col, t_rowptr, t_col, t_pos, self_loops,
             slope, p, seed, needs):
    n_src, num_dst, H, F, acc, scalars = _common(x, rowptr, col, self_loops, slope, p, seed)
    need_x, need_src, need_dst = needs[0], needs[1], needs[2]
    need_edge, need_loop = needs[3] and a_edge is not None, needs[4] and a_loop is not None
    empty = x.new_empty(0)
    g_x = torch.empty_like(x) if need_x else empty
    g_src = torch.empty_like(a_src) if need_src else empty
    g_dst = torch.empty_like(a_dst) if need_dst else empty
    g_edge = torch.zeros_like(a_edge) if need_edge else empty  # skipped self loops keep 0
    g_loop = torch.zeros_like(a_loop) if need_loop else empty
    D = torch.empty_like(m)
    be, hb, fb = _blocks(H, F)
    flags = dict(HAS_EDGE=a_edge is not None, HAS_LOOP_TERM=a_loop is not None, SELF_LOOPS=bool(self_loops),
                 DROPOUT=p > 0, ACC=acc, BE=be, HB=hb, FB=fb)
    a_edge_, a_loop_ = (a_edge if a_edge is not None else x), (a_loop if a_loop is not None else x)
    with torch.cuda.device(x.device) if x.is_cuda else _nullcontext():
        if num_dst and H:
            _backward_rows_kernel[(num_dst, cdiv(H, hb))](
                grad_out, out, m, z, x, a_src, a_dst, a_edge_, a_loop_, rowptr, col, D, g_dst if need_dst else x,
                g_edge if need_edge else x, g_loop if need_loop else x, *scalars,
                PER_EDGE=need_dst or need_edge or need_loop, NEED_DST=need_dst, NEED_EDGE=need_edge,
                NEED_LOOP=need_loop, **flags)
        if n_src and H and (need_x or need_src):
            _backward_sources_kernel[(n_src, cdiv(H, hb))](
                grad_out, m, z, x, a_src, a_dst, a_edge_, a_loop_, t_rowptr, t_col, t_pos, D,
                g_x if need_x else x, g_src if need_src else x, *scalars, NEED_X=need_x, NEED_SRC=need_src, **flags)
    return g_x, g_src, g_dst, g_edge, g_loop


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


# ---- edge_softmax ---------------------------------------------------------------------------------
@triton.jit
def _edge_softmax_kernel(logits, rowptr, perm, out, H, ACC: tl.constexpr, BE: tl.constexpr, HB: tl.constexpr):
    """One program per target row: online max and sum, then the normalised weights (edge order via perm)."""
    i = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, HB)
    hmask = heads < H
    start = tl.load(rowptr + i).to(tl.int64)
    end = tl.load(rowptr + i + 1).to(tl.int64)
    m = tl.full((HB,), NEG_INF, ACC)
    z = tl.zeros((HB,), ACC)
    for k0 in range(start, end, BE):
        ks = k0 + tl.arange(0, BE)
        v2 = (ks < end)[:, None] & hmask[None, :]
        e = tl.load(perm + ks, mask=ks < end, other=0).to(tl.int64)
        s = tl.load(logits + e[:, None] * H + heads[None, :], mask=v2, other=NEG_INF).to(ACC)
        m_new = tl.maximum(m, tl.max(s, 0))
        m_safe = tl.where(m_new == NEG_INF, 0.0, m_new)
        z = z * tl.exp(m - m_safe) + tl.sum(tl.exp(s - m_safe[None, :]), 0)
        m = m_new
    z = tl.where(z > 0, z, 1.0)
    m = tl.where(m == NEG_INF, 0.0, m)  # padded heads
    for k0 in range(start, end, BE):
        ks = k0 + tl.arange(0, BE)
        v2 = (ks < end)[:, None] & hmask[None, :]
        e = tl.load(perm + ks, mask=ks < end, other=0).to(tl.int64)
        offs = e[:, None] * H + heads[None, :]
        s = tl.load(logits + offs, mask=v2, other=NEG_INF).to(ACC)
        tl.store(out + offs, (tl.exp(s - m[None, :]) / z[None, :]).to(out.dtype.element_ty), mask=v2)


@triton.jit
def _edge_softmax_backward_kernel(g, p, rowptr, perm, grad, H, ACC: tl.constexpr, BE: tl.constexpr,
                                  HB: tl.constexpr):
    """grad = p * (g - sum_row(p * g)), one program per target row."""
    i = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, HB)
    hmask = heads < H
    start = tl.load(rowptr + i).to(tl.int64)
    end = tl.load(rowptr + i + 1).to(tl.int64)
    acc = tl.zeros((HB,), ACC)
    for k0 in range(start, end, BE):
        ks = k0 + tl.arange(0, BE)
        v2 = (ks < end)[:, None] & hmask[None, :]
        offs = tl.load(perm + ks, mask=ks < end, other=0).to(tl.int64)[:, None] * H + heads[None, :]
        acc += tl.sum(tl.load(p + offs, mask=v2, other=0).to(ACC) * tl.load(g + offs, mask=v2, other=0).to(ACC), 0)
    for k0 in range(start, end, BE):
        ks = k0 + tl.arange(0, BE)
        v2 = (ks < end)[:, None] & hmask[None, :]
        offs = tl.load(perm + ks, mask=ks < end, other=0).to(tl.int64)[:, None] * H + heads[None, :]
        pv = tl.load(p + offs, mask=v2, other=0).to(ACC)
        gv = tl.load(g + offs, mask=v2, other=0).to(ACC)
        tl.store(grad + offs, (pv * (gv - acc[None, :])).to(grad.dtype.element_ty), mask=v2)


def _softmax_launch(kernel, tensors, rowptr, H, dtype, device):
    num_rows = rowptr.shape[0] - 1
    hb = next_power_of_2(H)
    if num_rows and H:
        with torch.cuda.device(device) if device.type == "cuda" else _nullcontext():
            kernel[(num_rows,)](*tensors, H, ACC=tl.float64 if dtype == torch.float64 else tl.float32,
                                BE=max(8, min(128, 1024 // hb)), HB=hb)


def edge_softmax(logits, rowptr, perm):
    out = torch.zeros_like(logits)
    _softmax_launch(_edge_softmax_kernel, (logits, rowptr, perm, out), rowptr, logits.shape[1], logits.dtype,
                    logits.device)
    return out


def edge_softmax_backward(grad, out, rowptr, perm):
    result = torch.zeros_like(out)
    _softmax_launch(_edge_softmax_backward_kernel, (grad.contiguous(), out, rowptr, perm, result), rowptr,
                    out.shape[1], out.dtype, out.device)
    return result
