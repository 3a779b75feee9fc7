"""Triton forward of ``gnnfuse::multi_aggregate`` (see gnnfuse/ops/multi_aggregate.py).

One program per (target row, feature block) walks the row's edges BLOCK_E at a time: each chunk
of source rows is loaded once and folded into every statistic the requested reductions need
(sum, sum of squares, product, max/min with the first winning CSR position). The ``*_AT``
constexprs give each reduction's block in the output (-1: not requested), so one compiled kernel
serves each combination and unused statistics cost nothing. The backward reuses the gather-scatter
backward kernels (see the op module).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..reductions import CODES, MAX, MEAN, MIN, MUL, STD, SUM, VAR

_TL_ACC = {torch.float64: tl.float64}


@triton.jit
def _mul_combine(a, b):
    return a * b


@triton.jit
def _multi_kernel(x_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, num_rows, F,
                  K: tl.constexpr, HAS_W: tl.constexpr, ACC: tl.constexpr, TRACK: tl.constexpr,
                  SUM_AT: tl.constexpr, MEAN_AT: tl.constexpr, MAX_AT: tl.constexpr, MIN_AT: tl.constexpr,
                  MUL_AT: tl.constexpr, VAR_AT: tl.constexpr, STD_AT: tl.constexpr, MIN_SLOT: tl.constexpr,
                  BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    f_ok = offs_f < F
    e0 = tl.load(rowptr_ptr + row).to(tl.int64)
    e1 = tl.load(rowptr_ptr + row + 1).to(tl.int64)
    s = tl.zeros([BLOCK_F], dtype=ACC)
    q = tl.zeros([BLOCK_F], dtype=ACC)
    p = tl.zeros([BLOCK_F], dtype=ACC) + 1
    mx = tl.zeros([BLOCK_F], dtype=ACC) - float("inf")
    mn = tl.zeros([BLOCK_F], dtype=ACC) + float("inf")
    wmax = tl.zeros([BLOCK_F], dtype=tl.int64) - 1
    wmin = tl.zeros([BLOCK_F], dtype=tl.int64) - 1
    for start in range(e0, e1, BLOCK_E):
        offs_e = start + tl.arange(0, BLOCK_E)
        e_ok = offs_e < e1
        cols = tl.load(col_ptr + offs_e, mask=e_ok, other=0).to(tl.int64)
        ok = e_ok[:, None] & f_ok[None, :]
        v = tl.load(x_ptr + cols[:, None] * F + offs_f[None, :], mask=ok, other=0.0).to(ACC)
        if HAS_W:
            v = v * tl.load(w_ptr + offs_e, mask=e_ok, other=0.0).to(ACC)[:, None]
        if SUM_AT >= 0 or MEAN_AT >= 0 or VAR_AT >= 0 or STD_AT >= 0:
            s += tl.sum(v, axis=0)
        if VAR_AT >= 0 or STD_AT >= 0:
            q += tl.sum(v * v, axis=0)
        if MUL_AT >= 0:
            p *= tl.reduce(tl.where(ok, v, 1.0), 0, _mul_combine)
        if MAX_AT >= 0:
            chunk_max, at = tl.max(tl.where(ok, v, -float("inf")), axis=0, return_indices=True,
                                   return_indices_tie_break_left=True)
            take = (chunk_max > mx) | (start == e0)  # strict: ties keep the earlier edge
            if TRACK:
                wmax = tl.where(take, start + at, wmax)
            mx = tl.where(take, chunk_max, mx)
        if MIN_AT >= 0:
            chunk_min, at = tl.min(tl.where(ok, v, float("inf")), axis=0, return_indices=True,
                                   return_indices_tie_break_left=True)
            take = (chunk_min < mn) | (start == e0)
            if TRACK:
                wmin = tl.where(take, start + at, wmin)
            mn = tl.where(take, chunk_min, mn)
    count = e1 - e0
    inv = 1.0 / tl.maximum(count, 1).to(ACC)
    base = out_ptr + row * K * F + offs_f
    if SUM_AT >= 0:
        tl.store(base + SUM_AT * F, s.to(out_ptr.dtype.element_ty), mask=f_ok)
    if MEAN_AT >= 0:
        tl.store(base + MEAN_AT * F, (s * inv).to(out_ptr.dtype.element_ty), mask=f_ok)
    if MUL_AT >= 0:
        tl.store(base + MUL_AT * F, tl.where(count > 0, p, 0.0).to(out_ptr.dtype.element_ty), mask=f_ok)
    if MAX_AT >= 0:
        tl.store(base + MAX_AT * F, tl.where(count > 0, mx, 0.0).to(out_ptr.dtype.element_ty), mask=f_ok)
        if TRACK:
            tl.store(arg_ptr + row * F + offs_f, wmax.to(arg_ptr.dtype.element_ty), mask=f_ok)
    if MIN_AT >= 0:
        tl.store(base + MIN_AT * F, tl.where(count > 0, mn, 0.0).to(out_ptr.dtype.element_ty), mask=f_ok)
        if TRACK:
            tl.store(arg_ptr + (MIN_SLOT * num_rows + row) * F + offs_f, wmin.to(arg_ptr.dtype.element_ty),
                     mask=f_ok)
    if VAR_AT >= 0 or STD_AT >= 0:
        mean = s * inv
        var = q * inv - mean * mean
        if VAR_AT >= 0:
            tl.store(base + VAR_AT * F, var.to(out_ptr.dtype.element_ty), mask=f_ok)
        if STD_AT >= 0:
            sd = tl.sqrt(tl.maximum(var, 1e-5))
            sd = tl.where(sd <= 0.0031622776601683794, 0.0, sd)  # sqrt(1e-5), as PyG's StdAggregation
            tl.store(base + STD_AT * F, sd.to(out_ptr.dtype.element_ty), mask=f_ok)


def forward(x: torch.Tensor, rowptr: torch.Tensor, col: torch.Tensor, weight: torch.Tensor | None,
            codes: list[int], track_arg: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [N, K*F], arg [A, N, F] or [0, 0, 0]) as the C++ kernel."""
    num_rows, F = rowptr.shape[0] - 1, x.shape[1]
    unique = list(dict.fromkeys(codes))  # a repeated reduction is computed once, copied after
    at = {code: unique.index(code) if code in unique else -1 for code in CODES.values()}
    num_arg = ((MAX in unique) + (MIN in unique)) if track_arg else 0
    out = x.new_empty(num_rows, len(unique) * F)
    arg = rowptr.new_empty((num_arg, num_rows, F) if num_arg else (0, 0, 0))
    if num_rows and F:
        block_f = min(triton.next_power_of_2(F), 128)
        block_e = 32 if block_f <= 32 else 16
        _multi_kernel[(num_rows, triton.cdiv(F, block_f))](
            x, rowptr, col, weight if weight is not None else x, out, arg if num_arg else rowptr, num_rows, F,
            K=len(unique), HAS_W=weight is not None, ACC=_TL_ACC.get(x.dtype, tl.float32), TRACK=num_arg > 0,
            SUM_AT=at[SUM], MEAN_AT=at[MEAN], MAX_AT=at[MAX], MIN_AT=at[MIN], MUL_AT=at[MUL], VAR_AT=at[VAR],
            STD_AT=at[STD], MIN_SLOT=1 if MAX in unique else 0, BLOCK_E=block_e, BLOCK_F=block_f, num_warps=4)
    else:  # nothing to launch: no rows, or no features
        out.zero_()
        arg.fill_(-1)
    if len(unique) != len(codes):
        pick = torch.tensor([unique.index(c) for c in codes], device=x.device)
        out = out.view(num_rows, len(unique), F).index_select(1, pick).reshape(num_rows, len(codes) * F)
    return out, arg
