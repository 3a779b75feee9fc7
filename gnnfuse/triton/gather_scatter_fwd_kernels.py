"""Forward Triton kernels of ``gnnfuse::gather_scatter`` and the device helpers they share with the
backward kernels (reductions, NaN-propagating max/min, winner tracking, the work-list piece prologue).
Host code (plans, work lists, launches) lives in gather_scatter.py, which describes each kernel.

Reduce codes (``REDUCE: tl.constexpr``): the names of reduce_codes.py (SUM, MEAN, MAX, MIN, MUL), from the
one table in gnnfuse/reductions.py.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..reductions import CODES as _CODES  # noqa: F401  (tests/test_reductions.py checks it)
from ._launch import fast_kernel
from .reduce_codes import MAX, MEAN, MIN, MUL, SUM

_BIG = tl.constexpr(2**62)
_COMBINE_K = 32  # partials folded per step by the second pass


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
    """One step of max (REDUCE == MAX) or min: a NaN wins and sticks. One NaN-propagating min/max
    instruction where the compare-or-NaN select took four (reddit-like F=32: max was 1.9x sum)."""
    if REDUCE == MAX:
        return _nan_max(acc, v)
    return _nan_min(acc, v)


@triton.jit
def _seg_add(v1, h1, v2, h2):
    """Segmented sum with head flags: a run starting in the right operand drops the left's sum."""
    return tl.where(h2 != 0, v2, v1 + v2), h1 | h2


@triton.jit
def _identity_tile(ROWS: tl.constexpr, COLS: tl.constexpr, REDUCE: tl.constexpr, ACC: tl.constexpr):
    """A [ROWS, COLS] accumulator holding the reduction's identity: 1 (mul), -inf (max), +inf (min), 0."""
    if REDUCE == MUL:
        acc = tl.full([ROWS, COLS], 1.0, ACC)
    elif REDUCE == MAX:
        acc = tl.full([ROWS, COLS], float("-inf"), ACC)
    elif REDUCE == MIN:
        acc = tl.full([ROWS, COLS], float("inf"), ACC)
    else:
        acc = tl.zeros([ROWS, COLS], ACC)
    return acc


@triton.jit
def _tile_winner(v, m2, pos, REDUCE: tl.constexpr):
    """Per feature: the winning value of the tile and its lowest position (first NaN wins)."""
    isnan = (v != v) & m2
    nan_pos = tl.min(tl.where(isnan, pos, _BIG), axis=0)
    if REDUCE == MAX:
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
    """One edge of max (REDUCE == MAX) or min with winners, edges in CSR order: the edge at ``pos`` wins
    if strictly better, or the first NaN, or the row's first edge (arg -1); masked lanes never."""
    if REDUCE == MAX:
        better = v > acc
    else:
        better = v < acc
    win = (better | ((v != v) & (acc == acc)) | (arg < 0)) & m2
    return tl.where(win, v, acc), tl.where(win, pos, arg)


@triton.jit
def _merge_winner(acc, arg, val, at, REDUCE: tl.constexpr):
    """Folds a later winner (val, at) into (acc, arg): strict comparison, NaN sticks, -1 = none."""
    if REDUCE == MAX:
        better = val > acc
    else:
        better = val < acc
    win = (better | ((val != val) & (acc == acc)) | (arg < 0)) & (at >= 0)
    return tl.where(win, val, acc), tl.where(win, at, arg)


@triton.jit
def _piece_at(s, ft, seg_row_ptr, seg_ptr_ptr, rowptr_ptr, F, SEG: tl.constexpr, BLOCK_F: tl.constexpr):
    """Piece ``s`` of a work list (see work_lists.WorkList), feature tile ``ft``: the row, the piece's index
    k within it, the row's CSR range [r0, r1), the piece's edges [start, end), features."""
    row = tl.load(seg_row_ptr + s)
    k = s - tl.load(seg_ptr_ptr + row)
    r0 = tl.load(rowptr_ptr + row).to(tl.int64)
    r1 = tl.load(rowptr_ptr + row + 1).to(tl.int64)
    start = r0 + k * SEG
    end = tl.minimum(start + SEG, r1)
    offs_f = ft * BLOCK_F + tl.arange(0, BLOCK_F)
    return row, k, r0, r1, start, end, offs_f, offs_f < F


@triton.jit
def _work_piece(seg_row_ptr, seg_ptr_ptr, rowptr_ptr, F, SEG: tl.constexpr, BLOCK_F: tl.constexpr):
    """This program's (piece, feature tile) of a work list: _piece_at of a 1-D grid, tiles minor."""
    pid = tl.program_id(0).to(tl.int64)
    nft = tl.cdiv(F, BLOCK_F)
    return _piece_at(pid // nft, pid % nft, seg_row_ptr, seg_ptr_ptr, rowptr_ptr, F, SEG, BLOCK_F)


@triton.jit
def _csr_piece(s, ft, x_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, part_ptr, parg_ptr,
               seg_row_ptr, seg_ptr_ptr, slot_ptr, F,
               REDUCE: tl.constexpr, HAS_W: tl.constexpr, ACC64: tl.constexpr, TRACK: tl.constexpr,
               SEG: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
               X_EVICT: tl.constexpr):
    """One (piece, feature tile) of the CSR kernel. TRACK: max/min also record the winning CSR
    position (only when a backward will need it). X_EVICT: the cache eviction hint of the gathered
    x rows ("", "evict_last", "evict_first"; passed explicitly: Triton 3.6 does not apply a device
    function's default constexpr arguments)."""
    ACC = tl.float64 if ACC64 else tl.float32
    row, k, r0, r1, start, end, offs_f, fmask = _piece_at(s, ft, seg_row_ptr, seg_ptr_ptr, rowptr_ptr, F, SEG,
                                                          BLOCK_F)
    # Element-wise accumulators over the loop (one per edge lane and feature), reduced across
    # lanes once after it: no cross-warp reduction per tile.
    lane = tl.arange(0, BLOCK_E)
    acc2 = _identity_tile(BLOCK_E, BLOCK_F, REDUCE, ACC)
    arg2 = tl.full([BLOCK_E, BLOCK_F], -1, tl.int32)  # winning position - start, per lane
    # the next tile's column indices load before this tile's gathers, which then wait on no index load
    c_next = tl.load(col_ptr + start + lane, mask=start + lane < end, other=0)
    for e0 in range(start, end, BLOCK_E):
        offs_e = e0 + lane
        emask = offs_e < end
        c = c_next.to(tl.int64)
        c_next = tl.load(col_ptr + offs_e + BLOCK_E, mask=offs_e + BLOCK_E < end, other=0)
        m2 = emask[:, None] & fmask[None, :]
        if REDUCE == MUL:
            v = tl.load(x_ptr + c[:, None] * F + offs_f[None, :], mask=m2, other=1.0,
                        eviction_policy=X_EVICT).to(ACC)
        elif REDUCE == MAX and not TRACK:
            v = tl.load(x_ptr + c[:, None] * F + offs_f[None, :], mask=m2, other=float("-inf"),
                        eviction_policy=X_EVICT).to(ACC)
        elif REDUCE == MIN and not TRACK:
            v = tl.load(x_ptr + c[:, None] * F + offs_f[None, :], mask=m2, other=float("inf"),
                        eviction_policy=X_EVICT).to(ACC)
        else:
            v = tl.load(x_ptr + c[:, None] * F + offs_f[None, :], mask=m2, other=0.0,
                        eviction_policy=X_EVICT).to(ACC)
        if HAS_W:
            w = tl.load(w_ptr + offs_e, mask=emask, other=1.0).to(ACC)
            v = v * w[:, None]
        if REDUCE == SUM or REDUCE == MEAN:
            acc2 += v
        elif REDUCE == MUL:
            acc2 = acc2 * v
        elif not TRACK:  # values only: masked lanes hold -inf/+inf; a NaN wins and sticks
            acc2 = _nan_max_min(acc2, v, REDUCE)
        else:
            rel = (e0 - start).to(tl.int32) + lane
            acc2, arg2 = _winner_step(acc2, arg2, v, rel[:, None] + tl.zeros([BLOCK_E, BLOCK_F], tl.int32), m2,
                                      REDUCE)
    arg = tl.full([BLOCK_F], -1, tl.int64)
    if REDUCE == SUM or REDUCE == MEAN:
        acc = tl.sum(acc2, axis=0)
    elif REDUCE == MUL:
        acc = tl.reduce(acc2, 0, _mul_combine)
    elif not TRACK:
        if REDUCE == MAX:
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
        if REDUCE == MEAN:
            res = acc / tl.maximum(count, 1).to(ACC)
        if REDUCE == MAX or REDUCE == MIN or REDUCE == MUL:
            res = tl.where(count > 0, acc, 0.0)
        if (REDUCE == MAX or REDUCE == MIN) and TRACK:
            tl.store(arg_ptr + row * F + offs_f, arg.to(arg_ptr.dtype.element_ty), mask=fmask)
        tl.store(out_ptr + row * F + offs_f, res.to(out_ptr.dtype.element_ty), mask=fmask)
    else:  # a piece of a split row: partial, folded by _combine_kernel
        tl.store(part_ptr + (slot + k) * F + offs_f, acc.to(part_ptr.dtype.element_ty), mask=fmask)
        if (REDUCE == MAX or REDUCE == MIN) and TRACK:
            tl.store(parg_ptr + (slot + k) * F + offs_f, arg, mask=fmask)


@fast_kernel
@triton.jit
def _csr_fwd_kernel(x_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, part_ptr, parg_ptr,
                    seg_row_ptr, seg_ptr_ptr, slot_ptr, F,
                    REDUCE: tl.constexpr, HAS_W: tl.constexpr, ACC64: tl.constexpr, TRACK: tl.constexpr,
                    SEG: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    """Every piece of a work list, one program per (piece, feature tile), tiles minor."""
    pid = tl.program_id(0).to(tl.int64)
    nft = tl.cdiv(F, BLOCK_F)
    _csr_piece(pid // nft, pid % nft, x_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, part_ptr, parg_ptr,
               seg_row_ptr, seg_ptr_ptr, slot_ptr, F, REDUCE, HAS_W, ACC64, TRACK, SEG, BLOCK_E, BLOCK_F, "")


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
    if REDUCE == MUL:
        acc = tl.full([BLOCK_F], 1.0, ACC)
    else:
        acc = tl.zeros([BLOCK_F], ACC)
    arg = tl.full([BLOCK_F], -1, tl.int64)
    for k0 in range(0, npieces, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < npieces
        m2 = kmask[:, None] & fmask[None, :]
        ptrs = (slot + offs_k)[:, None] * F + offs_f[None, :]
        if REDUCE == MUL:
            v = tl.load(part_ptr + ptrs, mask=m2, other=1.0).to(ACC)
            acc = acc * tl.reduce(v, 0, _mul_combine)
        elif REDUCE == SUM or REDUCE == MEAN:
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
    if REDUCE == MEAN:
        count = (tl.load(rowptr_ptr + row + 1) - tl.load(rowptr_ptr + row)).to(ACC)
        res = acc / count
    if (REDUCE == MAX or REDUCE == MIN) and TRACK:
        tl.store(arg_ptr + row * F + offs_f, arg.to(arg_ptr.dtype.element_ty), mask=fmask)
    tl.store(out_ptr + row * F + offs_f, res.to(out_ptr.dtype.element_ty), mask=fmask)


@triton.jit
def _row_group(group, ft, x_ptr, rows_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, num_rows, F,
               REDUCE: tl.constexpr, HAS_W: tl.constexpr, ACC64: tl.constexpr, TRACK: tl.constexpr,
               ROWS: tl.constexpr, BLOCK_F: tl.constexpr, X_EVICT: tl.constexpr):
    """Row group ``group`` (ROWS short rows) of the row-group kernel, feature tile ``ft``; X_EVICT
    as in _csr_piece."""
    ACC = tl.float64 if ACC64 else tl.float32
    offs_r = group * ROWS + tl.arange(0, ROWS)
    rmask = offs_r < num_rows
    rows = tl.load(rows_ptr + offs_r, mask=rmask, other=0).to(tl.int64)
    start = tl.load(rowptr_ptr + rows, mask=rmask, other=0).to(tl.int64)
    deg = tl.load(rowptr_ptr + rows + 1, mask=rmask, other=0).to(tl.int64) - start
    offs_f = ft * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = offs_f < F
    acc = _identity_tile(ROWS, BLOCK_F, REDUCE, ACC)
    arg = tl.full([ROWS, BLOCK_F], -1, tl.int64)
    # the next step's column indices load before this step's gathers (as in _csr_piece)
    c_next = tl.load(col_ptr + start, mask=rmask & (deg > 0), other=0)
    for j in range(0, tl.max(deg, axis=0)):
        emask = rmask & (j < deg)
        m2 = emask[:, None] & fmask[None, :]
        c = c_next.to(tl.int64)
        c_next = tl.load(col_ptr + start + j + 1, mask=rmask & (j + 1 < deg), other=0)
        v = tl.load(x_ptr + c[:, None] * F + offs_f[None, :], mask=m2, other=0.0, eviction_policy=X_EVICT).to(ACC)
        if HAS_W:
            v = v * tl.load(w_ptr + start + j, mask=emask, other=1.0).to(ACC)[:, None]
        if REDUCE == SUM or REDUCE == MEAN:
            acc += v
        elif REDUCE == MUL:
            acc = tl.where(m2, acc * v, acc)
        elif TRACK:
            acc, arg = _winner_step(acc, arg, v, (start + j)[:, None] + tl.zeros([ROWS, BLOCK_F], tl.int64), m2,
                                    REDUCE)
        else:  # max/min: a NaN wins and sticks, as in the CSR kernel
            acc = tl.where(m2, _nan_max_min(acc, v, REDUCE), acc)
    res = acc
    if REDUCE == MEAN:
        res = acc / tl.maximum(deg, 1).to(ACC)[:, None]
    if REDUCE == MAX or REDUCE == MIN or REDUCE == MUL:
        res = tl.where((deg > 0)[:, None], acc, 0.0)
    dst = rows[:, None] * F + offs_f[None, :]
    tl.store(out_ptr + dst, res.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & fmask[None, :])
    if (REDUCE == MAX or REDUCE == MIN) and TRACK:
        tl.store(arg_ptr + dst, arg.to(arg_ptr.dtype.element_ty), mask=rmask[:, None] & fmask[None, :])


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
    _row_group(tl.program_id(0).to(tl.int64), tl.program_id(1), x_ptr, rows_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr,
               arg_ptr, num_rows, F, REDUCE, HAS_W, ACC64, TRACK, ROWS, BLOCK_F, "")


@fast_kernel
@triton.jit
def _one_pass_kernel(x_ptr, rows_ptr, num_rows, task_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, part_ptr,
                     parg_ptr, seg_row_ptr, seg_ptr_ptr, slot_ptr, F,
                     REDUCE: tl.constexpr, HAS_W: tl.constexpr, ACC64: tl.constexpr, TRACK: tl.constexpr,
                     ROWS: tl.constexpr, SEG: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
                     X_EVICT: tl.constexpr):
    """The hybrid plan in one launch: program (t, ft) runs task t of an id-ordered task list
    (schedule.task_list), a row group (code g >= 0: _row_group) or a long-row piece (code
    -1 - s: _csr_piece), so the long rows of a window run next to its short rows and the source
    rows they share are read from DRAM once, not once per kernel. Each row is reduced by the same
    code as in the two-launch plan: bitwise the same result. X_EVICT: see _csr_piece."""
    code = tl.load(task_ptr + tl.program_id(0))
    ft = tl.program_id(1)
    if code >= 0:
        _row_group(code, ft, x_ptr, rows_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, num_rows, F,
                   REDUCE, HAS_W, ACC64, TRACK, ROWS, BLOCK_F, X_EVICT)
    else:
        _csr_piece(-1 - code, ft, x_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, part_ptr, parg_ptr,
                   seg_row_ptr, seg_ptr_ptr, slot_ptr, F, REDUCE, HAS_W, ACC64, TRACK, SEG, BLOCK_E, BLOCK_F,
                   X_EVICT)


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
