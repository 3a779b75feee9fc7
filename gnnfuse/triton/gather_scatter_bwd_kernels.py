"""Backward Triton kernels of ``gnnfuse::gather_scatter_backward`` (no E x F tensor): the transpose
walk for x's gradient, the atomic winner scatter of max/min, the per-edge weight gradient and the
mul statistics. Host code lives in gather_scatter.py, which describes when each runs.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._launch import fast_kernel
from .gather_scatter_fwd_kernels import _mul_combine, _work_piece
from .reduce_codes import MAX, MEAN, MIN, MUL


@triton.jit
def _dm(g, i, p, rowptr_ptr, arg_ptr, prod_ptr, zc_ptr, m, emask, m2, offs_f, F,
        REDUCE: tl.constexpr, ACC: tl.constexpr):
    """d out[i, f] / d message * grad_out[i, f] for a [BLOCK_E, BLOCK_F] tile of edges."""
    if REDUCE == MEAN:
        deg = tl.load(rowptr_ptr + i + 1, mask=emask, other=1) - tl.load(rowptr_ptr + i, mask=emask, other=0)
        g = g / tl.maximum(deg, 1).to(ACC)[:, None]
    if REDUCE == MAX or REDUCE == MIN:
        a = tl.load(arg_ptr + i[:, None] * F + offs_f[None, :], mask=m2, other=-1).to(tl.int64)
        g = tl.where(a == p[:, None], g, 0.0)
    if REDUCE == MUL:
        prod = tl.load(prod_ptr + i[:, None] * F + offs_f[None, :], mask=m2, other=0.0).to(ACC)
        zc = tl.load(zc_ptr + i[:, None] * F + offs_f[None, :], mask=m2, other=2)
        safe = tl.where(m == 0, 1.0, m)
        others = tl.where(zc == 0, prod / safe, tl.where((zc == 1) & (m == 0), prod, 0.0))
        g = g * others
    return g


@fast_kernel
@triton.jit
def _csr_bwd_x_kernel(go_ptr, x_ptr, rowptr_ptr, w_ptr, t_rowptr_ptr, t_col_ptr, t_pos_ptr, arg_ptr,
                      prod_ptr, zc_ptr, gx_ptr, part_ptr, seg_row_ptr, seg_ptr_ptr, slot_ptr, F,
                      REDUCE: tl.constexpr, HAS_W: tl.constexpr, ACC64: tl.constexpr,
                      SEG: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    """grad_x[j] = sum over transpose row j of dm * w; pieces of split rows go to partials."""
    ACC = tl.float64 if ACC64 else tl.float32
    j, k, q0, q1, start, end, offs_f, fmask = _work_piece(seg_row_ptr, seg_ptr_ptr, t_rowptr_ptr, F, SEG, BLOCK_F)
    acc2 = tl.zeros([BLOCK_E, BLOCK_F], ACC)
    xj = tl.zeros([BLOCK_F], ACC)
    if REDUCE == MUL:
        xj = tl.load(x_ptr + j * F + offs_f, mask=fmask, other=0.0).to(ACC)
    for e0 in range(start, end, BLOCK_E):
        offs_q = e0 + tl.arange(0, BLOCK_E)
        qmask = offs_q < end
        i = tl.load(t_col_ptr + offs_q, mask=qmask, other=0).to(tl.int64)
        p = tl.load(t_pos_ptr + offs_q, mask=qmask, other=-2).to(tl.int64)
        m2 = qmask[:, None] & fmask[None, :]
        g = tl.load(go_ptr + i[:, None] * F + offs_f[None, :], mask=m2, other=0.0).to(ACC)
        w = tl.full([BLOCK_E], 1.0, ACC)
        if HAS_W:
            w = tl.load(w_ptr + p, mask=qmask, other=0.0).to(ACC)
        m = w[:, None] * xj[None, :]
        dm = _dm(g, i, p, rowptr_ptr, arg_ptr, prod_ptr, zc_ptr, m, qmask, m2, offs_f, F, REDUCE, ACC)
        if HAS_W:
            dm = dm * w[:, None]
        acc2 += tl.where(m2, dm, 0.0)
    acc = tl.sum(acc2, axis=0)
    slot = tl.load(slot_ptr + j)
    if slot < 0:
        tl.store(gx_ptr + j * F + offs_f, acc.to(gx_ptr.dtype.element_ty), mask=fmask)
    else:
        tl.store(part_ptr + (slot + k) * F + offs_f, acc.to(part_ptr.dtype.element_ty), mask=fmask)


@fast_kernel
@triton.jit
def _winner_scatter_kernel(go_ptr, arg_ptr, col_ptr, w_ptr, gx_ptr, num_rows, F,
                           HAS_W: tl.constexpr, ACC64: tl.constexpr, ROWS: tl.constexpr, BLOCK_F: tl.constexpr):
    """max/min x-gradient, atomic: grad_x[col[p], f] += w[p] * grad_out[i, f] for p = arg[i, f],
    the winning edge. Reads [N_dst, F] where the transpose walk reads an [E, F] gather of arg."""
    ACC = tl.float64 if ACC64 else tl.float32
    offs_r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    m2 = (offs_r < num_rows)[:, None] & (offs_f < F)[None, :]
    at = offs_r[:, None] * F + offs_f[None, :]
    p = tl.load(arg_ptr + at, mask=m2, other=-1).to(tl.int64)
    won = m2 & (p >= 0)  # empty rows have no winner
    j = tl.load(col_ptr + p, mask=won, other=0).to(tl.int64)
    g = tl.load(go_ptr + at, mask=won, other=0.0).to(ACC)
    if HAS_W:
        g = g * tl.load(w_ptr + p, mask=won, other=0.0).to(ACC)
    tl.atomic_add(gx_ptr + j * F + offs_f[None, :], g, mask=won, sem="relaxed")


@fast_kernel
@triton.jit
def _grad_w_kernel(go_ptr, x_ptr, rowptr_ptr, row_ptr, col_ptr, w_ptr, arg_ptr, prod_ptr, zc_ptr, gw_ptr, E, F,
                   REDUCE: tl.constexpr, ACC64: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    """grad_w[p] = sum_f dm[p, f] * x[col[p], f], one program per block of CSR positions."""
    ACC = tl.float64 if ACC64 else tl.float32
    pid = tl.program_id(0).to(tl.int64)
    offs_p = pid * BLOCK_E + tl.arange(0, BLOCK_E)
    pmask = offs_p < E
    i = tl.load(row_ptr + offs_p, mask=pmask, other=0).to(tl.int64)
    j = tl.load(col_ptr + offs_p, mask=pmask, other=0).to(tl.int64)
    w = tl.load(w_ptr + offs_p, mask=pmask, other=0.0).to(ACC)
    dot = tl.zeros([BLOCK_E], ACC)
    for f0 in range(0, F, BLOCK_F):
        offs_f = f0 + tl.arange(0, BLOCK_F)
        m2 = pmask[:, None] & (offs_f < F)[None, :]
        g = tl.load(go_ptr + i[:, None] * F + offs_f[None, :], mask=m2, other=0.0).to(ACC)
        xv = tl.load(x_ptr + j[:, None] * F + offs_f[None, :], mask=m2, other=0.0).to(ACC)
        dm = _dm(g, i, offs_p, rowptr_ptr, arg_ptr, prod_ptr, zc_ptr, w[:, None] * xv, pmask, m2, offs_f, F,
                 REDUCE, ACC)
        dot += tl.sum(tl.where(m2, dm * xv, 0.0), axis=1)
    tl.store(gw_ptr + offs_p, dot.to(gw_ptr.dtype.element_ty), mask=pmask)


@fast_kernel
@triton.jit
def _mul_stats_kernel(x_ptr, rowptr_ptr, col_ptr, w_ptr, prod_ptr, zc_ptr, pprod_ptr, pzc_ptr,
                      seg_row_ptr, seg_ptr_ptr, slot_ptr, F,
                      HAS_W: tl.constexpr, ACC64: tl.constexpr, SEG: tl.constexpr, BLOCK_E: tl.constexpr,
                      BLOCK_F: tl.constexpr):
    """reduce="mul" backward helper: product of the non-zero messages and number of zero ones,
    per (row, feature); same work list as the forward (pieces of split rows go to partials)."""
    ACC = tl.float64 if ACC64 else tl.float32
    row, k, r0, r1, start, end, offs_f, fmask = _work_piece(seg_row_ptr, seg_ptr_ptr, rowptr_ptr, F, SEG, BLOCK_F)
    prod2 = tl.full([BLOCK_E, BLOCK_F], 1.0, ACC)
    zc2 = tl.zeros([BLOCK_E, BLOCK_F], tl.int32)
    for e0 in range(start, end, BLOCK_E):
        offs_e = e0 + tl.arange(0, BLOCK_E)
        emask = offs_e < end
        c = tl.load(col_ptr + offs_e, mask=emask, other=0).to(tl.int64)
        m2 = emask[:, None] & fmask[None, :]
        v = tl.load(x_ptr + c[:, None] * F + offs_f[None, :], mask=m2, other=1.0).to(ACC)
        if HAS_W:
            v = v * tl.load(w_ptr + offs_e, mask=emask, other=1.0).to(ACC)[:, None]
        zero = (v == 0) & m2
        prod2 = prod2 * tl.where(zero, 1.0, v)
        zc2 += zero.to(tl.int32)
    prod = tl.reduce(prod2, 0, _mul_combine)
    zc = tl.sum(zc2, axis=0)
    slot = tl.load(slot_ptr + row)
    if slot < 0:
        tl.store(prod_ptr + row * F + offs_f, prod.to(prod_ptr.dtype.element_ty), mask=fmask)
        tl.store(zc_ptr + row * F + offs_f, zc, mask=fmask)
    else:
        tl.store(pprod_ptr + (slot + k) * F + offs_f, prod.to(pprod_ptr.dtype.element_ty), mask=fmask)
        tl.store(pzc_ptr + (slot + k) * F + offs_f, zc.to(pzc_ptr.dtype.element_ty), mask=fmask)


# =============================================================================================
