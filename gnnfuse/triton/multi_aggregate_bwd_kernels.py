"""Triton kernels of the multi-aggregation backward's fast route (x's gradient, no edge weights; host
side: gnnfuse/triton/multi_aggregate.py, backward_x): the per-target coefficients of the linear part
(sum/mean/var/std) and the max/min winners' gradients."""
from __future__ import annotations

import triton
import triton.language as tl

from ._launch import fast_kernel


@fast_kernel
@triton.jit
def _coefficients_kernel(g_ptr, out_ptr, mean_ptr, deg_ptr, cd_ptr, num_rows, F,
                         K: tl.constexpr, SUM_AT: tl.constexpr, MEAN_AT: tl.constexpr, VAR_AT: tl.constexpr,
                         STD_AT: tl.constexpr, HAS_D: tl.constexpr, ROWS: tl.constexpr, BLOCK_F: tl.constexpr):
    """The linear part of d out / d message per target, dm = c[i] + d[i] m, in one pass over
    grad_out: c from sum (g), mean (g / deg), var/std (-2 gv mean / deg), d = 2 gv / deg, with
    gv = g_var + g_std / (2 std) (0 where std is 0). cd[i] = [c | d] (d only when HAS_D)."""
    offs_r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    m2 = (offs_r < num_rows)[:, None] & (offs_f < F)[None, :]
    inv = 1.0 / tl.load(deg_ptr + offs_r, mask=offs_r < num_rows, other=1.0)[:, None]
    at = offs_r[:, None] * (K * F) + offs_f[None, :]
    c = tl.zeros([ROWS, BLOCK_F], inv.dtype)
    if SUM_AT >= 0:
        c += tl.load(g_ptr + at + SUM_AT * F, mask=m2, other=0.0).to(inv.dtype)
    if MEAN_AT >= 0:
        c += tl.load(g_ptr + at + MEAN_AT * F, mask=m2, other=0.0).to(inv.dtype) * inv
    W = 2 * F if HAS_D else F
    dst = cd_ptr + offs_r[:, None] * W + offs_f[None, :]
    if HAS_D:
        if MEAN_AT >= 0:
            mean = tl.load(out_ptr + at + MEAN_AT * F, mask=m2, other=0.0).to(inv.dtype)
        else:
            mean = tl.load(mean_ptr + offs_r[:, None] * F + offs_f[None, :], mask=m2, other=0.0).to(inv.dtype)
        gv = tl.zeros([ROWS, BLOCK_F], inv.dtype)
        if VAR_AT >= 0:
            gv += tl.load(g_ptr + at + VAR_AT * F, mask=m2, other=0.0).to(inv.dtype)
        if STD_AT >= 0:
            sd = tl.load(out_ptr + at + STD_AT * F, mask=m2, other=0.0).to(inv.dtype)
            gs = tl.load(g_ptr + at + STD_AT * F, mask=m2, other=0.0).to(inv.dtype)
            gv += tl.where(sd > 0, gs / (2 * tl.where(sd > 0, sd, 1.0)), 0.0)
        c += -2 * gv * mean * inv
        tl.store(dst + F, 2 * gv * inv, mask=m2)
    tl.store(dst, c, mask=m2)


@fast_kernel
@triton.jit
def _winners_grad_kernel(g_ptr, arg_ptr, col_ptr, gx_ptr, num_rows, F, K: tl.constexpr, MAX_AT: tl.constexpr,
                         MIN_AT: tl.constexpr, MIN_SLOT: tl.constexpr, ROWS: tl.constexpr, BLOCK_F: tl.constexpr):
    """max and min in one launch: grad_x[col[p], f] += grad_out[i, block, f] for p = the winning CSR
    position, with a relaxed atomic (several targets a source wins for add in any order)."""
    offs_r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    m2 = (offs_r < num_rows)[:, None] & (offs_f < F)[None, :]
    g_at = offs_r[:, None] * (K * F) + offs_f[None, :]
    if MAX_AT >= 0:
        _winner_add(g_ptr + g_at + MAX_AT * F, arg_ptr + offs_r[:, None] * F + offs_f[None, :], col_ptr, gx_ptr,
                    offs_f, m2, F)
    if MIN_AT >= 0:
        _winner_add(g_ptr + g_at + MIN_AT * F, arg_ptr + (MIN_SLOT * num_rows + offs_r[:, None]) * F + offs_f[None, :],
                    col_ptr, gx_ptr, offs_f, m2, F)


@triton.jit
def _winner_add(g_ptrs, arg_ptrs, col_ptr, gx_ptr, offs_f, m2, F):
    p = tl.load(arg_ptrs, mask=m2, other=-1)
    won = m2 & (p >= 0)  # empty rows have no winner
    j = tl.load(col_ptr + p, mask=won, other=0).to(tl.int64)
    g = tl.load(g_ptrs, mask=won, other=0.0).to(gx_ptr.dtype.element_ty)
    tl.atomic_add(gx_ptr + j * F + offs_f[None, :], g, mask=won, sem="relaxed")
