"""Triton forward of ``gnnfuse::multi_aggregate`` (see gnnfuse/ops/multi_aggregate.py).

Rows are cut into pieces of at most PIECE edges (a power-law hub would otherwise keep one program
busy for the whole kernel). ``_piece_kernel``: one program per (piece, feature block) walks its
edges BLOCK_E at a time, loading each chunk of source rows once and folding it into every
statistic (sum, sum of squares, max/min with the first winning CSR position, product when asked)
in a small [pieces, 5, F] buffer. ``_finish_kernel``: one program per (row, feature block) folds
the row's pieces in CSR order and writes the requested reductions (the ``*_AT`` constexprs give
each one's block in the output, -1: not requested). The backward reuses the gather-scatter
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
def _piece_kernel(x_ptr, col_ptr, w_ptr, piece_start_ptr, piece_end_ptr, part_ptr, parg_ptr, F,
                  HAS_W: tl.constexpr, ACC: tl.constexpr, TRACK: tl.constexpr, NEED_MUL: tl.constexpr,
                  BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    """Statistics of one piece (at most PIECE edges of one row) into part[piece, 5, F]: sum, sum of
    squares, max, min, product; parg[piece, 2, F]: the first winning CSR position of max and min."""
    piece = tl.program_id(0).to(tl.int64)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    f_ok = offs_f < F
    e0 = tl.load(piece_start_ptr + piece).to(tl.int64)
    e1 = tl.load(piece_end_ptr + piece).to(tl.int64)
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
        s += tl.sum(v, axis=0)
        q += tl.sum(v * v, axis=0)
        if NEED_MUL:
            p *= tl.reduce(tl.where(ok, v, 1.0), 0, _mul_combine)
        chunk_max, at_max = tl.max(tl.where(ok, v, -float("inf")), axis=0, return_indices=True,
                                   return_indices_tie_break_left=True)
        take = (chunk_max > mx) | (start == e0)  # strict: ties keep the earlier edge
        if TRACK:
            wmax = tl.where(take, start + at_max, wmax)
        mx = tl.where(take, chunk_max, mx)
        chunk_min, at_min = tl.min(tl.where(ok, v, float("inf")), axis=0, return_indices=True,
                                   return_indices_tie_break_left=True)
        take = (chunk_min < mn) | (start == e0)
        if TRACK:
            wmin = tl.where(take, start + at_min, wmin)
        mn = tl.where(take, chunk_min, mn)
    base = part_ptr + piece * 5 * F + offs_f
    tl.store(base, s, mask=f_ok)
    tl.store(base + F, q, mask=f_ok)
    tl.store(base + 2 * F, mx, mask=f_ok)
    tl.store(base + 3 * F, mn, mask=f_ok)
    tl.store(base + 4 * F, p, mask=f_ok)
    if TRACK:
        tl.store(parg_ptr + piece * 2 * F + offs_f, wmax, mask=f_ok)
        tl.store(parg_ptr + piece * 2 * F + F + offs_f, wmin, mask=f_ok)


@triton.jit
def _finish_kernel(rowptr_ptr, first_piece_ptr, part_ptr, parg_ptr, out_ptr, arg_ptr, num_rows, F,
                   K: tl.constexpr, ACC: tl.constexpr, TRACK: tl.constexpr,
                   SUM_AT: tl.constexpr, MEAN_AT: tl.constexpr, MAX_AT: tl.constexpr, MIN_AT: tl.constexpr,
                   MUL_AT: tl.constexpr, VAR_AT: tl.constexpr, STD_AT: tl.constexpr, MIN_SLOT: tl.constexpr,
                   BLOCK_F: tl.constexpr):
    """Folds a row's pieces (consecutive, in CSR order) and writes every requested reduction."""
    row = tl.program_id(0).to(tl.int64)
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    f_ok = offs_f < F
    count = tl.load(rowptr_ptr + row + 1).to(tl.int64) - tl.load(rowptr_ptr + row).to(tl.int64)
    k0 = tl.load(first_piece_ptr + row).to(tl.int64)
    k1 = tl.load(first_piece_ptr + row + 1).to(tl.int64)
    s = tl.zeros([BLOCK_F], dtype=ACC)
    q = tl.zeros([BLOCK_F], dtype=ACC)
    p = tl.zeros([BLOCK_F], dtype=ACC) + 1
    mx = tl.zeros([BLOCK_F], dtype=ACC) - float("inf")
    mn = tl.zeros([BLOCK_F], dtype=ACC) + float("inf")
    wmax = tl.zeros([BLOCK_F], dtype=tl.int64) - 1
    wmin = tl.zeros([BLOCK_F], dtype=tl.int64) - 1
    for k in range(k0, k1):
        base = part_ptr + k * 5 * F + offs_f
        s += tl.load(base, mask=f_ok, other=0.0)
        q += tl.load(base + F, mask=f_ok, other=0.0)
        p *= tl.load(base + 4 * F, mask=f_ok, other=1.0)
        v = tl.load(base + 2 * F, mask=f_ok, other=0.0)
        take = (v > mx) | (k == k0)  # pieces in CSR order: ties keep the earlier one
        mx = tl.where(take, v, mx)
        if TRACK:
            wmax = tl.where(take, tl.load(parg_ptr + k * 2 * F + offs_f, mask=f_ok, other=-1), wmax)
        v = tl.load(base + 3 * F, mask=f_ok, other=0.0)
        take = (v < mn) | (k == k0)
        mn = tl.where(take, v, mn)
        if TRACK:
            wmin = tl.where(take, tl.load(parg_ptr + k * 2 * F + F + offs_f, mask=f_ok, other=-1), wmin)
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


PIECE = 128  # edges per piece: long rows (power-law hubs) are cut so that no program walks a whole hub


def _pieces(rowptr: torch.Tensor, num_rows: int):
    """(piece_start, piece_end, first_piece [num_rows + 1]): each row cut into ceil(deg / PIECE) pieces."""
    deg = (rowptr[1:] - rowptr[:-1]).long()
    per_row = (deg + PIECE - 1) // PIECE
    first_piece = torch.zeros(num_rows + 1, dtype=torch.long, device=rowptr.device)
    torch.cumsum(per_row, 0, out=first_piece[1:])
    num_pieces = int(first_piece[-1])  # one host sync: the grid size
    row_of = torch.repeat_interleave(torch.arange(num_rows, device=rowptr.device), per_row, output_size=num_pieces)
    start = rowptr[:-1].long()[row_of] + (torch.arange(num_pieces, device=rowptr.device) - first_piece[row_of]) * PIECE
    end = torch.minimum(start + PIECE, rowptr[1:].long()[row_of])
    return start, end, first_piece


def forward(x: torch.Tensor, rowptr: torch.Tensor, col: torch.Tensor, weight: torch.Tensor | None,
            codes: list[int], track_arg: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [N, K*F], arg [A, N, F] or [0, 0, 0]) as the C++ kernel: pieces, then one fold per row."""
    num_rows, F = rowptr.shape[0] - 1, x.shape[1]
    unique = list(dict.fromkeys(codes))  # a repeated reduction is computed once, copied after
    at = {code: unique.index(code) if code in unique else -1 for code in CODES.values()}
    num_arg = ((MAX in unique) + (MIN in unique)) if track_arg else 0
    out = x.new_empty(num_rows, len(unique) * F)
    arg = rowptr.new_empty((num_arg, num_rows, F) if num_arg else (0, 0, 0))
    if num_rows and F:
        acc_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        start, end, first_piece = _pieces(rowptr, num_rows)
        num_pieces = start.shape[0]
        part = torch.empty(num_pieces, 5, F, dtype=acc_dtype, device=x.device)
        parg = torch.empty((num_pieces, 2, F) if num_arg else (0,), dtype=torch.long, device=x.device)
        block_f = min(triton.next_power_of_2(F), 64)
        acc = _TL_ACC.get(x.dtype, tl.float32)
        if num_pieces:
            _piece_kernel[(num_pieces, triton.cdiv(F, block_f))](
                x, col, weight if weight is not None else x, start, end, part, parg if num_arg else part, F,
                HAS_W=weight is not None, ACC=acc, TRACK=num_arg > 0, NEED_MUL=MUL in unique,
                BLOCK_E=32 if block_f <= 32 else 16, BLOCK_F=block_f, num_warps=4)
        _finish_kernel[(num_rows, triton.cdiv(F, block_f))](
            rowptr, first_piece, part, parg if num_arg else part, out, arg if num_arg else rowptr, num_rows, F,
            K=len(unique), ACC=acc, TRACK=num_arg > 0,
            SUM_AT=at[SUM], MEAN_AT=at[MEAN], MAX_AT=at[MAX], MIN_AT=at[MIN], MUL_AT=at[MUL], VAR_AT=at[VAR],
            STD_AT=at[STD], MIN_SLOT=1 if MAX in unique else 0, BLOCK_F=block_f, num_warps=4)
    else:  # nothing to launch: no rows, or no features
        out.zero_()
        arg.fill_(-1)
    if len(unique) != len(codes):
        pick = torch.tensor([unique.index(c) for c in codes], device=x.device)
        out = out.view(num_rows, len(unique), F).index_select(1, pick).reshape(num_rows, len(codes) * F)
    return out, arg
