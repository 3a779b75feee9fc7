"""Triton kernels of ``gnnfuse::gather_scatter`` (forward) and ``gather_scatter_backward``.

Layers: @triton.jit kernels, then host launchers ("check, allocate, launch") that
gnnfuse/ops/gather_scatter.py calls (through the torch.library op or its eager shortcut). Tile
choice lives in gather_scatter_dispatch.py.

Forward kernels (see the dispatch module for when each runs):
  * ``_rowgroup_kernel`` (the default "hybrid" plan's short rows): rows of at most short_max
    edges, sorted by degree, ``ROWS`` per program; step j gathers the j-th edge of each row.
    The hybrid plan sends the remaining rows through the CSR kernel below.
  * ``_csr_fwd_kernel`` + ``_combine_kernel``: a work list splits every row into pieces of at
    most SEG edges; one program per (piece, feature tile) gathers [BLOCK_E, BLOCK_F] tiles of x
    and reduces them in registers. Rows of one piece write ``out`` directly; pieces of split
    (hub) rows write float32 partials that ``_combine_kernel`` folds in CSR order. No atomics:
    bitwise deterministic. Handles sum/mean/max/min/mul and max/min's winning positions.
  * ``_coo_kernel``: one program per (block of BLOCK_E consecutive CSR edges, feature tile);
    a segmented inclusive scan over the tile's target ids sums runs of equal target; a run
    fully inside the block is stored, a run touching the block edge is added with a relaxed
    atomic (about one atomic per row per block). ``SEGMENTED=False`` is the fully-atomic
    baseline.
Backward (no E x F tensor): for sum/mean, x's gradient is a sum forward over the cached
transpose (same kernels and plan); for max/min, ``_winner_scatter_kernel`` adds each winner's
gradient to its source row with atomics (under torch.use_deterministic_algorithms(True), and
for mul, ``_csr_bwd_x_kernel`` walks the transpose instead with the same work-list splitting:
dm = d out / d message; grad_x[j] += dm * w); ``_grad_w_kernel`` is a per-edge dot over
features in CSR order; ``_mul_stats_kernel`` precomputes, for reduce="mul", the product of
non-zero messages and the zero count per (row, feature).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _env
from .._tensor_cache import cached
from ._grid import cdiv, next_power_of_2
from ._launch import BoundLaunches, fast_kernel
from .gather_scatter_dispatch import Plan, choose, coo_configs, csr_configs, hybrid_configs
from .schedule import choose_window, short_rows

_CODES = {"sum": 0, "mean": 1, "max": 2, "min": 3, "mul": 4}
SUM, MEAN, MAX, MIN, MUL = 0, 1, 2, 3, 4
_BIG = tl.constexpr(2**62)
_COMBINE_K = 32  # partials folded per step by the second pass


# =============================================================================================
# kernels
# =============================================================================================
@triton.jit
def _mul_combine(a, b):
    return a * b


@triton.jit
def _nan_max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _nan_min(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _nan_max_min(acc, v, REDUCE: tl.constexpr):
    """One step of max (REDUCE 2) or min: a NaN wins and sticks. One NaN-propagating min/max
    instruction where the compare-or-NaN select took four (reddit-like F=32: max was 1.9x sum)."""
    if REDUCE == 2:
        return _nan_max(acc, v)
    return _nan_min(acc, v)


@triton.jit
def _seg_add(v1, h1, v2, h2):
    """Segmented sum with head flags: a run starting in the right operand drops the left's sum."""
    return tl.where(h2 != 0, v2, v1 + v2), h1 | h2


@triton.jit
def _identity_tile(ROWS: tl.constexpr, COLS: tl.constexpr, REDUCE: tl.constexpr, ACC: tl.constexpr):
    """A [ROWS, COLS] accumulator holding the reduction's identity: 1 (mul), -inf (max), +inf (min), 0."""
    if REDUCE == 4:
        acc = tl.full([ROWS, COLS], 1.0, ACC)
    elif REDUCE == 2:
        acc = tl.full([ROWS, COLS], float("-inf"), ACC)
    elif REDUCE == 3:
        acc = tl.full([ROWS, COLS], float("inf"), ACC)
    else:
        acc = tl.zeros([ROWS, COLS], ACC)
    return acc


@triton.jit
def _tile_winner(v, m2, pos, REDUCE: tl.constexpr):
    """Per feature: the winning value of the tile and its lowest position (first NaN wins)."""
    isnan = (v != v) & m2
    nan_pos = tl.min(tl.where(isnan, pos, _BIG), axis=0)
    if REDUCE == 2:
        clean = tl.where(isnan | (m2 == 0), float("-inf"), v)
        best = tl.max(clean, axis=0)
    else:
        clean = tl.where(isnan | (m2 == 0), float("inf"), v)
        best = tl.min(clean, axis=0)
    best_pos = tl.min(tl.where((clean == best[None, :]) & m2 & (isnan == 0), pos, _BIG), axis=0)
    has_nan = nan_pos < _BIG
    val = tl.where(has_nan, float("nan"), best)
    at = tl.where(has_nan, nan_pos, best_pos)
    return val, at


@triton.jit
def _winner_step(acc, arg, v, pos, m2, REDUCE: tl.constexpr):
    """One edge of max (REDUCE 2) or min with winners, edges in CSR order: the edge at ``pos`` wins
    if strictly better, or the first NaN, or the row's first edge (arg -1); masked lanes never."""
    if REDUCE == 2:
        better = v > acc
    else:
        better = v < acc
    win = (better | ((v != v) & (acc == acc)) | (arg < 0)) & m2
    return tl.where(win, v, acc), tl.where(win, pos, arg)


@triton.jit
def _merge_winner(acc, arg, val, at, REDUCE: tl.constexpr):
    """Folds a later winner (val, at) into (acc, arg): strict comparison, NaN sticks, -1 = none."""
    if REDUCE == 2:
        better = val > acc
    else:
        better = val < acc
    win = (better | ((val != val) & (acc == acc)) | (arg < 0)) & (at >= 0)
    return tl.where(win, val, acc), tl.where(win, at, arg)


@triton.jit
def _work_piece(seg_row_ptr, seg_ptr_ptr, rowptr_ptr, F, SEG: tl.constexpr, BLOCK_F: tl.constexpr):
    """This program's (piece, feature tile) of a work list (see _WorkList): the row, the piece's
    index k within it, the row's CSR range [r0, r1), the piece's edges [start, end), features."""
    pid = tl.program_id(0).to(tl.int64)
    nft = tl.cdiv(F, BLOCK_F)
    s = pid // nft
    ft = pid % nft
    row = tl.load(seg_row_ptr + s)
    k = s - tl.load(seg_ptr_ptr + row)
    r0 = tl.load(rowptr_ptr + row).to(tl.int64)
    r1 = tl.load(rowptr_ptr + row + 1).to(tl.int64)
    start = r0 + k * SEG
    end = tl.minimum(start + SEG, r1)
    offs_f = ft * BLOCK_F + tl.arange(0, BLOCK_F)
    return row, k, r0, r1, start, end, offs_f, offs_f < F


@fast_kernel
@triton.jit
def _csr_fwd_kernel(x_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, part_ptr, parg_ptr,
                    seg_row_ptr, seg_ptr_ptr, slot_ptr, F,
                    REDUCE: tl.constexpr, HAS_W: tl.constexpr, ACC64: tl.constexpr, TRACK: tl.constexpr,
                    SEG: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    """TRACK: max/min also record the winning CSR position (only when a backward will need it)."""
    ACC = tl.float64 if ACC64 else tl.float32
    row, k, r0, r1, start, end, offs_f, fmask = _work_piece(seg_row_ptr, seg_ptr_ptr, rowptr_ptr, F, SEG, BLOCK_F)
    # Element-wise accumulators over the loop (one per edge lane and feature), reduced across
    # lanes once after it: no cross-warp reduction per tile.
    lane = tl.arange(0, BLOCK_E)
    acc2 = _identity_tile(BLOCK_E, BLOCK_F, REDUCE, ACC)
    arg2 = tl.full([BLOCK_E, BLOCK_F], -1, tl.int32)  # winning position - start, per lane
    for e0 in range(start, end, BLOCK_E):
        offs_e = e0 + lane
        emask = offs_e < end
        c = tl.load(col_ptr + offs_e, mask=emask, other=0).to(tl.int64)
        m2 = emask[:, None] & fmask[None, :]
        if REDUCE == 4:
            v = tl.load(x_ptr + c[:, None] * F + offs_f[None, :], mask=m2, other=1.0).to(ACC)
        elif REDUCE == 2 and not TRACK:
            v = tl.load(x_ptr + c[:, None] * F + offs_f[None, :], mask=m2, other=float("-inf")).to(ACC)
        elif REDUCE == 3 and not TRACK:
            v = tl.load(x_ptr + c[:, None] * F + offs_f[None, :], mask=m2, other=float("inf")).to(ACC)
        else:
            v = tl.load(x_ptr + c[:, None] * F + offs_f[None, :], mask=m2, other=0.0).to(ACC)
        if HAS_W:
            w = tl.load(w_ptr + offs_e, mask=emask, other=1.0).to(ACC)
            v = v * w[:, None]
        if REDUCE <= 1:
            acc2 += v
        elif REDUCE == 4:
            acc2 = acc2 * v
        elif not TRACK:  # values only: masked lanes hold -inf/+inf; a NaN wins and sticks
            acc2 = _nan_max_min(acc2, v, REDUCE)
        else:
            rel = (e0 - start).to(tl.int32) + lane
            acc2, arg2 = _winner_step(acc2, arg2, v, rel[:, None] + tl.zeros([BLOCK_E, BLOCK_F], tl.int32), m2,
                                      REDUCE)
    arg = tl.full([BLOCK_F], -1, tl.int64)
    if REDUCE <= 1:
        acc = tl.sum(acc2, axis=0)
    elif REDUCE == 4:
        acc = tl.reduce(acc2, 0, _mul_combine)
    elif not TRACK:
        if REDUCE == 2:
            acc = tl.reduce(acc2, 0, _nan_max)
        else:
            acc = tl.reduce(acc2, 0, _nan_min)
    else:
        acc, at = _tile_winner(acc2, arg2 >= 0, arg2.to(tl.int64), REDUCE)
        arg = tl.where(at < _BIG, start + at, -1)
    slot = tl.load(slot_ptr + row)
    if slot < 0:  # the whole row is ours: finish and write
        count = r1 - r0
        res = acc
        if REDUCE == 1:
            res = acc / tl.maximum(count, 1).to(ACC)
        if REDUCE >= 2:
            res = tl.where(count > 0, acc, 0.0)
        if (REDUCE == 2 or REDUCE == 3) and TRACK:
            tl.store(arg_ptr + row * F + offs_f, arg.to(arg_ptr.dtype.element_ty), mask=fmask)
        tl.store(out_ptr + row * F + offs_f, res.to(out_ptr.dtype.element_ty), mask=fmask)
    else:  # a piece of a split row: partial, folded by _combine_kernel
        tl.store(part_ptr + (slot + k) * F + offs_f, acc.to(part_ptr.dtype.element_ty), mask=fmask)
        if (REDUCE == 2 or REDUCE == 3) and TRACK:
            tl.store(parg_ptr + (slot + k) * F + offs_f, arg, mask=fmask)


@fast_kernel
@triton.jit
def _combine_kernel(part_ptr, parg_ptr, out_ptr, arg_ptr, rowptr_ptr, split_rows_ptr, seg_ptr_ptr, slot_ptr, F,
                    REDUCE: tl.constexpr, ACC64: tl.constexpr, TRACK: tl.constexpr, BLOCK_K: tl.constexpr,
                    BLOCK_F: tl.constexpr):
    """Second pass over split rows: folds the row's partials (BLOCK_K at a time) in CSR order."""
    ACC = tl.float64 if ACC64 else tl.float32
    pid = tl.program_id(0).to(tl.int64)
    nft = tl.cdiv(F, BLOCK_F)
    i = pid // nft
    ft = pid % nft
    row = tl.load(split_rows_ptr + i)
    npieces = tl.load(seg_ptr_ptr + row + 1) - tl.load(seg_ptr_ptr + row)
    slot = tl.load(slot_ptr + row)
    offs_f = ft * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = offs_f < F
    if REDUCE == 4:
        acc = tl.full([BLOCK_F], 1.0, ACC)
    else:
        acc = tl.zeros([BLOCK_F], ACC)
    arg = tl.full([BLOCK_F], -1, tl.int64)
    for k0 in range(0, npieces, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < npieces
        m2 = kmask[:, None] & fmask[None, :]
        ptrs = (slot + offs_k)[:, None] * F + offs_f[None, :]
        if REDUCE == 4:
            v = tl.load(part_ptr + ptrs, mask=m2, other=1.0).to(ACC)
            acc = acc * tl.reduce(v, 0, _mul_combine)
        elif REDUCE <= 1:
            v = tl.load(part_ptr + ptrs, mask=m2, other=0.0).to(ACC)
            acc += tl.sum(v, axis=0)
        else:
            v = tl.load(part_ptr + ptrs, mask=m2, other=0.0).to(ACC)
            if TRACK:
                a = tl.load(parg_ptr + ptrs, mask=m2, other=-1)
            else:  # piece order stands in for CSR order
                a = (slot + offs_k)[:, None] + tl.zeros([BLOCK_K, BLOCK_F], tl.int64)
            # partials come in CSR order, so the lowest winning CSR position is the first piece's
            val, at = _tile_winner(v, m2, a, REDUCE)
            acc, arg = _merge_winner(acc, arg, val, at, REDUCE)
    res = acc
    if REDUCE == 1:
        count = (tl.load(rowptr_ptr + row + 1) - tl.load(rowptr_ptr + row)).to(ACC)
        res = acc / count
    if (REDUCE == 2 or REDUCE == 3) and TRACK:
        tl.store(arg_ptr + row * F + offs_f, arg.to(arg_ptr.dtype.element_ty), mask=fmask)
    tl.store(out_ptr + row * F + offs_f, res.to(out_ptr.dtype.element_ty), mask=fmask)


@fast_kernel
@triton.jit
def _rowgroup_kernel(x_ptr, rows_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, num_rows, F,
                     REDUCE: tl.constexpr, HAS_W: tl.constexpr, ACC64: tl.constexpr, TRACK: tl.constexpr,
                     ROWS: tl.constexpr, BLOCK_F: tl.constexpr):
    """Short rows, ROWS per program: step j gathers the j-th edge of every row at once (a
    [ROWS, BLOCK_F] tile), so a program keeps ROWS source rows in flight where the CSR kernel
    would spend a whole [BLOCK_E, BLOCK_F] tile on a row of 2-3 edges. Rows come sorted by
    degree (rows_ptr), so a program's rows need about the same number of steps. Each row is
    reduced in edge order (as on CPU). TRACK: max/min also record the winning CSR position."""
    ACC = tl.float64 if ACC64 else tl.float32
    offs_r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = offs_r < num_rows
    rows = tl.load(rows_ptr + offs_r, mask=rmask, other=0).to(tl.int64)
    start = tl.load(rowptr_ptr + rows, mask=rmask, other=0).to(tl.int64)
    deg = tl.load(rowptr_ptr + rows + 1, mask=rmask, other=0).to(tl.int64) - start
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = offs_f < F
    acc = _identity_tile(ROWS, BLOCK_F, REDUCE, ACC)
    arg = tl.full([ROWS, BLOCK_F], -1, tl.int64)
    for j in range(0, tl.max(deg, axis=0)):
        emask = rmask & (j < deg)
        m2 = emask[:, None] & fmask[None, :]
        c = tl.load(col_ptr + start + j, mask=emask, other=0).to(tl.int64)
        v = tl.load(x_ptr + c[:, None] * F + offs_f[None, :], mask=m2, other=0.0).to(ACC)
        if HAS_W:
            v = v * tl.load(w_ptr + start + j, mask=emask, other=1.0).to(ACC)[:, None]
        if REDUCE <= 1:
            acc += v
        elif REDUCE == 4:
            acc = tl.where(m2, acc * v, acc)
        elif TRACK:
            acc, arg = _winner_step(acc, arg, v, (start + j)[:, None] + tl.zeros([ROWS, BLOCK_F], tl.int64), m2,
                                    REDUCE)
        else:  # max/min: a NaN wins and sticks, as in the CSR kernel
            acc = tl.where(m2, _nan_max_min(acc, v, REDUCE), acc)
    res = acc
    if REDUCE == 1:
        res = acc / tl.maximum(deg, 1).to(ACC)[:, None]
    if REDUCE >= 2:
        res = tl.where((deg > 0)[:, None], acc, 0.0)
    dst = rows[:, None] * F + offs_f[None, :]
    tl.store(out_ptr + dst, res.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & fmask[None, :])
    if (REDUCE == 2 or REDUCE == 3) and TRACK:
        tl.store(arg_ptr + dst, arg.to(arg_ptr.dtype.element_ty), mask=rmask[:, None] & fmask[None, :])


@fast_kernel
@triton.jit
def _coo_kernel(x_ptr, row_ptr, col_ptr, w_ptr, out_ptr, E, F,
                HAS_W: tl.constexpr, SEGMENTED: tl.constexpr, ACC64: tl.constexpr,
                BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    ACC = tl.float64 if ACC64 else tl.float32
    pid = tl.program_id(0).to(tl.int64)
    nft = tl.cdiv(F, BLOCK_F)
    eb = pid // nft
    ft = pid % nft
    lane = tl.arange(0, BLOCK_E)
    offs_e = eb * BLOCK_E + lane
    emask = offs_e < E
    offs_f = ft * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = offs_f < F
    r = tl.load(row_ptr + offs_e, mask=emask, other=-1).to(tl.int64)
    c = tl.load(col_ptr + offs_e, mask=emask, other=0).to(tl.int64)
    m2 = emask[:, None] & fmask[None, :]
    v = tl.load(x_ptr + c[:, None] * F + offs_f[None, :], mask=m2, other=0.0).to(ACC)
    if HAS_W:
        w = tl.load(w_ptr + offs_e, mask=emask, other=0.0).to(ACC)
        v = v * w[:, None]
    dst = out_ptr + r[:, None] * F + offs_f[None, :]
    if SEGMENTED:
        # Head-flag segmented scan: a 0/1 int32 flag per edge (a run of equal target starts here)
        # rather than the int64 targets themselves, so the scanned tile holds 2 words per element,
        # not 3 (the wide-F tiles spilled registers with int64 keys).
        r_prev = tl.load(row_ptr + offs_e - 1, mask=emask & (lane > 0), other=-1).to(tl.int64)
        head = (r != r_prev).to(tl.int32)
        run, _ = tl.associative_scan((v, head[:, None] + tl.zeros([BLOCK_E, BLOCK_F], tl.int32)), 0, _seg_add)
        r_next = tl.load(row_ptr + offs_e + 1, mask=(offs_e + 1) < E, other=-1).to(tl.int64)
        is_end = emask & (r != r_next)
        write = emask & (is_end | (lane == BLOCK_E - 1))
        first = eb * BLOCK_E
        first_r = tl.load(row_ptr + first).to(tl.int64)
        prev_r = tl.load(row_ptr + first - 1, mask=first > 0, other=-1).to(tl.int64)
        cont = (r == first_r) & (prev_r == first_r)  # the block's first run began in an earlier block
        shared = write & (~is_end | cont)
        alone = write & is_end & ~cont
        tl.store(dst, run.to(out_ptr.dtype.element_ty), mask=m2 & (alone[:, None] != 0))
        tl.atomic_add(dst, run.to(out_ptr.dtype.element_ty), mask=m2 & (shared[:, None] != 0), sem="relaxed")
    else:
        tl.atomic_add(dst, v.to(out_ptr.dtype.element_ty), mask=m2, sem="relaxed")


@triton.jit
def _dm(g, i, p, rowptr_ptr, arg_ptr, prod_ptr, zc_ptr, m, emask, m2, offs_f, F,
        REDUCE: tl.constexpr, ACC: tl.constexpr):
    """d out[i, f] / d message * grad_out[i, f] for a [BLOCK_E, BLOCK_F] tile of edges."""
    if REDUCE == 1:
        deg = tl.load(rowptr_ptr + i + 1, mask=emask, other=1) - tl.load(rowptr_ptr + i, mask=emask, other=0)
        g = g / tl.maximum(deg, 1).to(ACC)[:, None]
    if REDUCE == 2 or REDUCE == 3:
        a = tl.load(arg_ptr + i[:, None] * F + offs_f[None, :], mask=m2, other=-1).to(tl.int64)
        g = tl.where(a == p[:, None], g, 0.0)
    if REDUCE == 4:
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
    if REDUCE == 4:
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
# work lists (cached per rowptr tensor object)
# =============================================================================================
class _WorkList:
    """Rows split into pieces of at most ``seg`` edges.

    seg_row[s]: row of piece s; seg_ptr[r]: first piece of row r; slot[r]: first partial slot
    of row r if it is split (more than one piece), else -1; split_rows: the split rows.
    With ``short_max`` >= 0, rows of at most that many edges get no piece (the hybrid plan's
    row-group kernel covers them, empty rows included).
    """

    def __init__(self, rowptr: torch.Tensor, seg: int, short_max: int = -1):
        n = rowptr.numel() - 1
        dev = rowptr.device
        deg = (rowptr[1:] - rowptr[:-1]).long()
        pieces = ((deg + seg - 1) // seg).clamp_(min=1)
        if short_max >= 0:
            pieces = torch.where(deg <= short_max, 0, pieces)
        self.seg_ptr = torch.zeros(n + 1, dtype=torch.long, device=dev)
        torch.cumsum(pieces, 0, out=self.seg_ptr[1:])
        split = pieces > 1
        split_pieces = torch.where(split, pieces, 0)
        slot_end = torch.cumsum(split_pieces, 0)
        self.slot = torch.where(split, slot_end - split_pieces, -1)
        self.split_rows = torch.nonzero(split).flatten()
        totals = torch.stack([self.seg_ptr[-1], slot_end[-1] if n else self.seg_ptr[-1] * 0]).tolist()  # 1 sync
        self.num_pieces, self.num_partials = int(totals[0]), int(totals[1])
        self.seg_row = torch.repeat_interleave(torch.arange(n, device=dev), pieces, output_size=self.num_pieces)
        self.max_degree = None


def work_list(rowptr: torch.Tensor, seg: int, short_max: int = -1) -> _WorkList:
    return cached("work", (rowptr,), (seg, short_max), lambda: _WorkList(rowptr, seg, short_max))


def expanded_rows(rowptr: torch.Tensor, num_edges: int) -> torch.Tensor:
    """Target of each CSR position (what CSR.row() holds), cached on rowptr."""
    def build():
        n = rowptr.numel() - 1
        deg = rowptr[1:] - rowptr[:-1]
        return torch.repeat_interleave(torch.arange(n, device=rowptr.device, dtype=rowptr.dtype), deg,
                                       output_size=num_edges)
    return cached("rows", (rowptr,), (num_edges,), build)


def _mean_divisor(rowptr: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[N_dst, 1] in-degrees clamped to 1 (empty rows stay 0), cached on rowptr: one kernel per mean."""
    return cached("degree", (rowptr,), (dtype,),
                  lambda: (rowptr[1:] - rowptr[:-1]).clamp(min=1).unsqueeze(1).to(dtype))


# =============================================================================================
# launchers
# =============================================================================================
def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check(x, rowptr, col, weight):
    """The op's contract (plain ifs: this runs on every call, outside any trace)."""
    if x.dim() != 2 or not x.is_contiguous():
        raise ValueError("gather_scatter: x must be a contiguous 2-D tensor")
    if rowptr.dtype != col.dtype:
        raise ValueError("gather_scatter: rowptr and col dtypes differ")
    if weight is not None and (weight.shape != col.shape or weight.dtype != x.dtype or not weight.is_contiguous()):
        raise ValueError("gather_scatter: weight must be a contiguous [E] tensor with x's dtype")


def plan_for(x: torch.Tensor, rowptr: torch.Tensor, col: torch.Tensor, reduce: str,
             kernel: str | None = None, **overrides) -> Plan:
    plan = choose(reduce, rowptr.numel() - 1, col.numel(), x.shape[1], x.dtype, kernel=kernel)
    if plan.kernel == "hybrid" and "window" not in overrides:  # the graph's locality picks the row order
        window, why = choose_window(rowptr, col, x.shape[0], x.shape[1], x.element_size(), x.device)
        plan = Plan(**{**plan.__dict__, "window": window, "reason": f"{plan.reason}; {why}"})
    if overrides:
        plan = Plan(**{**plan.__dict__, **overrides})
    return plan


def autotune_enabled() -> bool:
    """GNNFUSE_AUTOTUNE=1: the first call per (graph, F, dtype, reduce) times the config
    builder's candidates and keeps the fastest (cached on the rowptr tensor)."""
    return _env.get("GNNFUSE_AUTOTUNE") == "1"


def _tuned(x, rowptr, col, weight, reduce, plan: Plan, track_arg: bool = True) -> Plan:
    from triton.testing import do_bench

    def build():
        n, F = rowptr.numel() - 1, x.shape[1]
        avg = col.numel() / max(n, 1)
        if plan.kernel == "hybrid":
            cands = hybrid_configs(F, avg, x.element_size())
        elif plan.kernel == "csr":
            cands = csr_configs(F, avg, x.element_size())
        else:
            cands = coo_configs(F, x.element_size())
        best, best_ms = plan, float("inf")
        for cfg in cands:
            p = Plan(**{**plan.__dict__, **cfg})
            ms = do_bench(lambda p=p: forward(x, rowptr, col, weight, reduce, track_arg=track_arg, plan=p),
                          warmup=5, rep=25,
                          return_mode="median")
            if ms < best_ms:
                best, best_ms = p, ms
        return Plan(**{**best.__dict__, "reason": best.reason + f"; autotuned {len(cands)} configs"})

    return cached("tune", (rowptr,), (plan.kernel, reduce, x.shape[1], x.dtype, weight is None), build)


class _ForwardSetup:
    """Everything a forward call needs besides its tensors, for one graph (rowptr) and one
    (F, dtype, reduce, weighted or not, tracking or not, plan): the plan, work list, short rows,
    grids and constexprs, and the kernels bound to their compiled code. On a small graph a call
    is mostly host time, and all of this is the same call after call (see _forward_setup)."""

    def __init__(self, plan: Plan, rowptr: torch.Tensor, E: int, F: int, dtype: torch.dtype, reduce: str,
                 has_w: bool, tracks: bool):
        # (holds tensors derived from rowptr, never rowptr itself: the cache entry must die with it)
        self.plan = plan
        self.launches = BoundLaunches()
        nft = cdiv(F, plan.block_f)
        acc64 = dtype == torch.float64
        code = _CODES[reduce]
        self.atomic = plan.kernel in ("coo", "atomic") and reduce in ("sum", "mean")
        if self.atomic:
            self.rows = expanded_rows(rowptr, E) if E else None
            self.coo_grid = (cdiv(E, plan.block_e) * nft,)
            self.coo_meta = dict(HAS_W=has_w, SEGMENTED=plan.kernel == "coo", ACC64=acc64, BLOCK_E=plan.block_e,
                                 BLOCK_F=plan.block_f, num_warps=plan.num_warps)
            return
        hybrid = plan.kernel == "hybrid"
        self.wl = work_list(rowptr, plan.seg, plan.short_max if hybrid else -1)
        self.short = short_rows(rowptr, plan.short_max, plan.window) if hybrid else None
        if self.short is not None and self.short.numel():
            group_block_f = plan.group_block_f or plan.block_f
            self.rowgroup_grid = (cdiv(self.short.numel(), plan.group_rows), cdiv(F, group_block_f))
            self.rowgroup_meta = dict(REDUCE=code, HAS_W=has_w, ACC64=acc64, TRACK=tracks, ROWS=plan.group_rows,
                                      BLOCK_F=group_block_f, num_warps=plan.group_warps)
        self.csr_grid = (self.wl.num_pieces * nft,)
        self.csr_meta = dict(REDUCE=code, HAS_W=has_w, ACC64=acc64, TRACK=tracks, SEG=plan.seg,
                             BLOCK_E=plan.block_e, BLOCK_F=plan.block_f, num_warps=plan.num_warps)
        self.combine_grid = (self.wl.split_rows.numel() * nft,)
        self.combine_meta = dict(REDUCE=code, ACC64=acc64, TRACK=tracks, BLOCK_K=_COMBINE_K, BLOCK_F=plan.block_f,
                                 num_warps=4)


def _forward_setup(x, rowptr, col, weight, reduce, tracks, kernel, plan) -> _ForwardSetup:
    """The cached setup of this call (an explicit ``plan`` builds one, uncached)."""
    F, E, has_w = x.shape[1], col.numel(), weight is not None
    if plan is not None:
        return _ForwardSetup(plan, rowptr, E, F, x.dtype, reduce, has_w, tracks)
    forced = kernel or _env.get("GNNFUSE_TRITON_KERNEL")
    tune = autotune_enabled() and x.is_cuda
    deterministic = torch.are_deterministic_algorithms_enabled()

    def build():
        p = plan_for(x, rowptr, col, reduce, kernel)
        if tune:
            p = _tuned(x, rowptr, col, weight, reduce, p, tracks)
        return _ForwardSetup(p, rowptr, E, F, x.dtype, reduce, has_w, tracks)

    return cached("forward", (rowptr,), (F, x.dtype, reduce, has_w, tracks, E, forced, deterministic, tune), build)


def forward(x: torch.Tensor, rowptr: torch.Tensor, col: torch.Tensor, weight: torch.Tensor | None,
            reduce: str, *, track_arg: bool = True, kernel: str | None = None,
            plan: Plan | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """out [N_dst, F] and arg ([N_dst, F] for max/min when ``track_arg``, else [0, 0]); see the op's
    contract (the op tracks winners exactly when it is given the transpose, i.e. for backward)."""
    out, arg = _forward(x, rowptr, col, weight, reduce, track_arg and reduce in ("max", "min"), kernel, plan)
    return out, (arg if arg is not None else rowptr.new_empty(0, 0))


def infer(x: torch.Tensor, rowptr: torch.Tensor, col: torch.Tensor, weight: torch.Tensor | None,
          reduce: str) -> torch.Tensor:
    """forward's ``out`` alone, no winners tracked: the eager path when no gradient is wanted."""
    return _forward(x, rowptr, col, weight, reduce, False, None, None)[0]


def _forward(x, rowptr, col, weight, reduce, tracks: bool, kernel, plan) -> tuple[torch.Tensor, torch.Tensor | None]:
    _check(x, rowptr, col, weight)
    n, F, E = rowptr.numel() - 1, x.shape[1], col.numel()
    if n == 0 or F == 0:
        return x.new_zeros(n, F), (rowptr.new_empty(n, F) if tracks else None)
    setup = _forward_setup(x, rowptr, col, weight, reduce, tracks, kernel, plan)
    w = weight if weight is not None else x  # dummy pointer when HAS_W is False
    launch = setup.launches
    fast = x.is_cuda and launch.usable(x, col, w)
    if setup.atomic:
        half = x.dtype in (torch.float16, torch.bfloat16)
        out = torch.zeros(n, F, dtype=torch.float32 if half else x.dtype, device=x.device)
        if E:
            launch("coo", _coo_kernel, setup.coo_grid, (x, setup.rows, col, w, out, E, F), setup.coo_meta, fast)
        if reduce == "mean":
            out.div_(_mean_divisor(rowptr, out.dtype))
        return out.to(x.dtype), None
    out = torch.empty(n, F, dtype=x.dtype, device=x.device)
    arg = torch.empty(n, F, dtype=rowptr.dtype, device=x.device) if tracks else None
    # (unused pointer arguments get any tensor: no allocation for them)
    arg_p = arg if tracks else col
    short = setup.short
    if short is not None and short.numel():
        launch("rowgroup", _rowgroup_kernel, setup.rowgroup_grid,
               (x, short, rowptr, col, w, out, arg_p, short.numel(), F), setup.rowgroup_meta, fast)
    wl = setup.wl
    if wl.num_pieces == 0:
        return out, arg
    part = torch.empty(wl.num_partials, F, dtype=_acc_dtype(x.dtype), device=x.device) if wl.num_partials else out
    parg = torch.empty(wl.num_partials, F, dtype=torch.long, device=x.device) if wl.num_partials and tracks else col
    launch("csr", _csr_fwd_kernel, setup.csr_grid,
           (x, rowptr, col, w, out, arg_p, part, parg, wl.seg_row, wl.seg_ptr, wl.slot, F), setup.csr_meta, fast)
    if wl.split_rows.numel():
        launch("combine", _combine_kernel, setup.combine_grid,
               (part, parg, out, arg_p, rowptr, wl.split_rows, wl.seg_ptr, wl.slot, F), setup.combine_meta, fast)
    return out, arg


def _sum_mean_x_grad(grad_out, x, rowptr, weight, t_rowptr, t_col, t_pos, reduce, plan) -> torch.Tensor:
    """x's gradient for sum/mean: grad_x[j] = sum over the edges e leaving j of w[e] * g[target(e)],
    with g = grad_out (sum) or grad_out / in-degree (mean). That is a sum gather-scatter over the
    cached transpose, so it runs the forward's kernels and plan: row groups for the short rows,
    which most rows of a power-law graph's transpose are (the CSR kernel alone spends a whole
    edge tile on each). Atomic-free and deterministic; [N_dst, F] and [E] temporaries only."""
    g = grad_out
    if reduce == "mean":  # scaled in the accumulation dtype, as the forward divides
        acc = _acc_dtype(x.dtype)
        g = grad_out.to(acc) / _mean_divisor(rowptr, acc)
    w_t = None if weight is None else weight.index_select(0, t_pos).to(g.dtype)  # transpose order
    out, _ = _forward(g, t_rowptr, t_col, w_t, "sum", False, "hybrid", plan)
    nt = t_rowptr.numel() - 1
    if nt == x.shape[0] and out.dtype == x.dtype:
        return out
    grad_x = torch.zeros_like(x)
    grad_x[:nt] = out
    return grad_x


def _winner_x_grad(grad_out, x, col, weight, arg) -> torch.Tensor:
    """x's gradient for max/min, each winner's gradient added to its source row with a relaxed
    atomic: [N_dst, F] reads where walking the transpose gathers arg over every edge ([E, F]
    int64; products-like F=32: ~16 GB). Several targets a source wins for add in any order, so
    the result may differ in the last bits from run to run: deterministic algorithms take the
    transpose walk instead (see backward)."""
    n, F = grad_out.shape
    acc = _acc_dtype(x.dtype)
    grad_x = torch.zeros(x.shape, dtype=acc, device=x.device)
    rows, block_f = 16, min(max(16, next_power_of_2(F)), 64)
    w = weight if weight is not None else grad_out  # dummy pointer when HAS_W is False
    _winner_scatter_kernel[(cdiv(n, rows), cdiv(F, block_f))](
        grad_out, arg, col, w, grad_x, n, F, HAS_W=weight is not None, ACC64=acc == torch.float64, ROWS=rows,
        BLOCK_F=block_f, num_warps=4)
    return grad_x.to(x.dtype)


def backward(grad_out, x, rowptr, col, weight, t_rowptr, t_col, t_pos, arg, reduce, need_x_grad, need_w_grad,
             *, plan: Plan | None = None):
    """(grad_x, grad_w) per the op's contract; empty tensors for gradients not asked for."""
    _check(x, rowptr, col, weight)
    code = _CODES[reduce]
    n, F, E = rowptr.numel() - 1, x.shape[1], col.numel()
    grad_out = grad_out.contiguous()
    acc64 = x.dtype == torch.float64
    want_w = need_w_grad and weight is not None
    grad_x = x.new_empty(0)
    grad_w = x.new_empty(E) if want_w else x.new_empty(0)
    if n == 0 or F == 0 or E == 0:
        return (torch.zeros_like(x) if need_x_grad else grad_x), (grad_w.zero_() if want_w else grad_w)
    given_plan = plan
    if plan is None:
        plan = choose(reduce, t_rowptr.numel() - 1, E, F, x.dtype, deterministic=True)
    w = weight if weight is not None else x
    arg_p = arg if arg.numel() else rowptr
    prod = zc = x  # dummies
    if reduce == "mul":
        prod = torch.empty(n, F, dtype=_acc_dtype(x.dtype), device=x.device)
        zc = torch.empty(n, F, dtype=torch.int32, device=x.device)
        bf = plan.block_f
        nft = cdiv(F, bf)
        wl = work_list(rowptr, plan.seg)
        pprod = pzc = prod  # partials (float; counts are exact below 2**24) only if rows are split
        if wl.num_partials:
            pprod = torch.empty(wl.num_partials, F, dtype=prod.dtype, device=x.device)
            pzc = torch.empty(wl.num_partials, F, dtype=torch.float32, device=x.device)
        _mul_stats_kernel[(wl.num_pieces * nft,)](
            x, rowptr, col, w, prod, zc, pprod, pzc, wl.seg_row, wl.seg_ptr, wl.slot, F, HAS_W=weight is not None,
            ACC64=acc64, SEG=plan.seg, BLOCK_E=plan.block_e, BLOCK_F=bf, num_warps=plan.num_warps)
        if wl.split_rows.numel():
            for part, dst, code_ in ((pprod, prod, MUL), (pzc, zc, SUM)):
                _combine_kernel[(wl.split_rows.numel() * nft,)](
                    part, part, dst, rowptr, rowptr, wl.split_rows, wl.seg_ptr, wl.slot, F,
                    REDUCE=code_, ACC64=acc64, TRACK=False, BLOCK_K=_COMBINE_K, BLOCK_F=bf, num_warps=4)
    if need_x_grad and reduce in ("sum", "mean"):
        grad_x = _sum_mean_x_grad(grad_out, x, rowptr, weight, t_rowptr, t_col, t_pos, reduce, given_plan)
    elif need_x_grad and reduce in ("max", "min") and not torch.are_deterministic_algorithms_enabled():
        grad_x = _winner_x_grad(grad_out, x, col, weight, arg)
    elif need_x_grad:  # mul, or max/min atomic-free: walk the transpose
        grad_x = torch.empty_like(x)
        nt = t_rowptr.numel() - 1
        if nt < x.shape[0]:
            grad_x[nt:].zero_()
        wl = work_list(t_rowptr, plan.seg)
        nft = cdiv(F, plan.block_f)
        part = x  # unused unless some rows are split
        if wl.num_partials:
            part = torch.empty(wl.num_partials, F, dtype=_acc_dtype(x.dtype), device=x.device)
        _csr_bwd_x_kernel[(wl.num_pieces * nft,)](
            grad_out, x, rowptr, w, t_rowptr, t_col, t_pos, arg_p, prod, zc, grad_x, part,
            wl.seg_row, wl.seg_ptr, wl.slot, F, REDUCE=code, HAS_W=weight is not None, ACC64=acc64,
            SEG=plan.seg, BLOCK_E=plan.block_e, BLOCK_F=plan.block_f, num_warps=plan.num_warps)
        if wl.split_rows.numel():
            _combine_kernel[(wl.split_rows.numel() * nft,)](
                part, part, grad_x, rowptr, t_rowptr, wl.split_rows, wl.seg_ptr, wl.slot, F,
                REDUCE=SUM, ACC64=acc64, TRACK=False, BLOCK_K=_COMBINE_K, BLOCK_F=plan.block_f, num_warps=4)
    if want_w:
        rows = expanded_rows(rowptr, E)
        be = 32
        bf = min(plan.block_f, 128)
        _grad_w_kernel[(cdiv(E, be),)](grad_out, x, rowptr, rows, col, w, arg_p, prod, zc, grad_w, E, F,
                                       REDUCE=code, ACC64=acc64, BLOCK_E=be, BLOCK_F=bf,
                                       num_warps=max(1, be * bf // 1024))
    return grad_x, grad_w
