"""Triton kernels of ``gnnfuse::multi_aggregate`` (host side: gnnfuse/triton/multi_aggregate.py).

The layout of the gather-scatter forward's hybrid plan (gather_scatter_fwd_kernels.py), with every
statistic a list of reductions needs kept in registers at once, so each source row is read once:

  * ``_multi_rowgroup_kernel``: rows of at most ``short_max`` edges, ROWS per program, sorted by
    degree; step j gathers the j-th edge of every row (a [ROWS, BLOCK_F] tile).
  * ``_multi_csr_kernel``: the longer rows, cut by the gather-scatter work list into pieces of at
    most SEG edges, one program per (piece, feature tile), element-wise accumulators reduced once
    after the loop. A row of one piece is written directly; pieces of a split (hub) row write
    their statistics into ``part[slot + k, NSTAT, F]`` (winners into ``parg[slot + k, 2, F]``)
    and ``_multi_combine_kernel`` folds them in CSR order, BLOCK_K pieces per step.
  * ``_multi_one_pass_kernel``: both of the above in one launch over the sum plan's id-ordered task
    list (schedule.task_list), where the sum plan runs one launch (``plan.one_pass``) and the
    graph has long rows.

Statistics: sum, sum of squares, max and min (with the first winning CSR position when TRACK),
product; each only when a requested reduction needs it (the NEED_* constexprs). Winners are
tracked as int32 offsets (within the row or piece) and written as int64 CSR positions. ``*_AT``: each
reduction's block in the output (-1: not requested). Max/min follow the gather-scatter kernels:
strict comparison (ties keep the earliest edge), a NaN wins and sticks. No atomics: bitwise
deterministic.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..constants import STD_CUT, STD_FLOOR
from ._launch import fast_kernel
from .reduce_codes import MAX, MIN
from .gather_scatter_fwd_kernels import (
    _BIG,
    _merge_winner,
    _mul_combine,
    _nan_max,
    _nan_min,
    _piece_at,
    _tile_winner,
    _winner_step,
)

NSTAT = 5  # partial statistics per split-row piece: sum, sum of squares, max, min, product
_STD_FLOOR = tl.constexpr(STD_FLOOR)  # a jit function may read only constexpr globals
_STD_CUT = tl.constexpr(STD_CUT)


@triton.jit
def _write_reductions(out_ptr, arg_ptr, row, offs_f, mask, count, s, q, mx, mn, p, amax, amin, num_rows, F,
                      K: tl.constexpr, TRACK: tl.constexpr, SUM_AT: tl.constexpr, MEAN_AT: tl.constexpr,
                      MAX_AT: tl.constexpr, MIN_AT: tl.constexpr, MUL_AT: tl.constexpr, VAR_AT: tl.constexpr,
                      STD_AT: tl.constexpr, MIN_SLOT: tl.constexpr, OUT_EVICT: tl.constexpr):
    """Every requested reduction of a row's statistics (a [BLOCK_F] vector with a scalar row and
    count, or a [ROWS, BLOCK_F] tile with [ROWS, 1] ones). Empty rows give 0 everywhere, winner -1.
    OUT_EVICT: the stores' cache eviction hint ("" or "evict_first": see multi_aggregate.Tuning)."""
    OUT = out_ptr.dtype.element_ty
    has = count > 0
    inv = 1.0 / tl.maximum(count, 1).to(s.dtype)
    base = out_ptr + row * (K * F) + offs_f
    if SUM_AT >= 0:
        tl.store(base + SUM_AT * F, s.to(OUT), mask=mask, eviction_policy=OUT_EVICT)
    if MEAN_AT >= 0:
        tl.store(base + MEAN_AT * F, (s * inv).to(OUT), mask=mask, eviction_policy=OUT_EVICT)
    if MUL_AT >= 0:
        tl.store(base + MUL_AT * F, tl.where(has, p, 0.0).to(OUT), mask=mask, eviction_policy=OUT_EVICT)
    if MAX_AT >= 0:
        tl.store(base + MAX_AT * F, tl.where(has, mx, 0.0).to(OUT), mask=mask, eviction_policy=OUT_EVICT)
        if TRACK:
            tl.store(arg_ptr + row * F + offs_f, amax.to(arg_ptr.dtype.element_ty), mask=mask,
                     eviction_policy=OUT_EVICT)
    if MIN_AT >= 0:
        tl.store(base + MIN_AT * F, tl.where(has, mn, 0.0).to(OUT), mask=mask, eviction_policy=OUT_EVICT)
        if TRACK:
            tl.store(arg_ptr + (MIN_SLOT * num_rows + row) * F + offs_f, amin.to(arg_ptr.dtype.element_ty),
                     mask=mask, eviction_policy=OUT_EVICT)
    if VAR_AT >= 0 or STD_AT >= 0:
        mean = s * inv
        var = q * inv - mean * mean
        if VAR_AT >= 0:
            tl.store(base + VAR_AT * F, var.to(OUT), mask=mask, eviction_policy=OUT_EVICT)
        if STD_AT >= 0:
            sd = tl.sqrt(tl.maximum(var, _STD_FLOOR))
            sd = tl.where(sd <= _STD_CUT, 0.0, sd)  # as PyG's StdAggregation
            tl.store(base + STD_AT * F, sd.to(OUT), mask=mask, eviction_policy=OUT_EVICT)


@triton.jit
def _fold_edge(v, pos, m2, s, q, mx, mn, p, amax, amin, NEED_S: tl.constexpr, NEED_Q: tl.constexpr,
               NEED_MAX: tl.constexpr, NEED_MIN: tl.constexpr, NEED_MUL: tl.constexpr, TRACK: tl.constexpr):
    """Folds a tile of messages ``v`` (0 where ``m2`` is false) into every needed statistic."""
    if NEED_S:
        s += v
    if NEED_Q:
        q += v * v
    if NEED_MUL:
        p = tl.where(m2, p * v, p)
    if NEED_MAX:
        if TRACK:
            mx, amax = _winner_step(mx, amax, v, pos, m2, MAX)
        else:
            mx = tl.where(m2, _nan_max(mx, v), mx)
    if NEED_MIN:
        if TRACK:
            mn, amin = _winner_step(mn, amin, v, pos, m2, MIN)
        else:
            mn = tl.where(m2, _nan_min(mn, v), mn)
    return s, q, mx, mn, p, amax, amin


@triton.jit
def _absolute(rel, start):
    """Winning CSR positions from the int32 offsets the loops track (-1: none yet / empty row)."""
    return tl.where(rel >= 0, start + rel.to(tl.int64), -1)


@triton.jit
def _fresh_statistics(R: tl.constexpr, C: tl.constexpr, ACC64: tl.constexpr):
    """[R, C] accumulators of every statistic before the first edge: sum, sum of squares, product,
    max, min (in the accumulate dtype) and the int32 winner offsets of max and min (-1: none)."""
    ACC = tl.float64 if ACC64 else tl.float32
    return (tl.zeros([R, C], ACC), tl.zeros([R, C], ACC), tl.full([R, C], 1.0, ACC),
            tl.full([R, C], float("-inf"), ACC), tl.full([R, C], float("inf"), ACC),
            tl.full([R, C], -1, tl.int32), tl.full([R, C], -1, tl.int32))


@triton.jit
def _multi_row_group(group, ft, x_ptr, rows_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, num_short, num_rows, F,
                     HAS_W: tl.constexpr, ACC64: tl.constexpr, TRACK: tl.constexpr, NEED_S: tl.constexpr,
                     NEED_Q: tl.constexpr, NEED_MAX: tl.constexpr, NEED_MIN: tl.constexpr, NEED_MUL: tl.constexpr,
                     K: tl.constexpr, SUM_AT: tl.constexpr, MEAN_AT: tl.constexpr, MAX_AT: tl.constexpr,
                     MIN_AT: tl.constexpr, MUL_AT: tl.constexpr, VAR_AT: tl.constexpr, STD_AT: tl.constexpr,
                     MIN_SLOT: tl.constexpr, ROWS: tl.constexpr, BLOCK_F: tl.constexpr, X_EVICT: tl.constexpr,
                     OUT_EVICT: tl.constexpr):
    """Row group ``group`` (ROWS short rows of rows_ptr, degree-sorted), feature tile ``ft``: each
    row reduced in edge order. Winners are tracked as int32 offsets within the row (half the
    registers of int64 positions), made absolute when written. X_EVICT / OUT_EVICT: the cache
    eviction hints of the gathered x rows and of the stores (see multi_aggregate.Tuning)."""
    ACC = tl.float64 if ACC64 else tl.float32
    offs_r = group * ROWS + tl.arange(0, ROWS)
    rmask = offs_r < num_short
    rows = tl.load(rows_ptr + offs_r, mask=rmask, other=0).to(tl.int64)
    start = tl.load(rowptr_ptr + rows, mask=rmask, other=0).to(tl.int64)
    deg = tl.load(rowptr_ptr + rows + 1, mask=rmask, other=0).to(tl.int64) - start
    offs_f = ft * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = offs_f < F
    s, q, p, mx, mn, amax, amin = _fresh_statistics(ROWS, BLOCK_F, ACC64)
    # the next step's column indices load before this step's gathers (as in the sum kernels)
    c_next = tl.load(col_ptr + start, mask=rmask & (deg > 0), other=0)
    for j in range(0, tl.max(deg, axis=0).to(tl.int32)):  # int32 j: the tracked offsets stay int32
        emask = rmask & (j < deg)
        m2 = emask[:, None] & fmask[None, :]
        c = c_next.to(tl.int64)
        c_next = tl.load(col_ptr + start + j + 1, mask=rmask & (j + 1 < deg), other=0)
        v = tl.load(x_ptr + c[:, None] * F + offs_f[None, :], mask=m2, other=0.0, eviction_policy=X_EVICT).to(ACC)
        if HAS_W:
            v = v * tl.load(w_ptr + start + j, mask=emask, other=1.0).to(ACC)[:, None]
        pos = tl.zeros([ROWS, BLOCK_F], tl.int32) + j
        s, q, mx, mn, p, amax, amin = _fold_edge(v, pos, m2, s, q, mx, mn, p, amax, amin, NEED_S, NEED_Q, NEED_MAX,
                                                 NEED_MIN, NEED_MUL, TRACK)
    _write_reductions(out_ptr, arg_ptr, rows[:, None], offs_f[None, :], rmask[:, None] & fmask[None, :],
                      deg[:, None], s, q, mx, mn, p, _absolute(amax, start[:, None]), _absolute(amin, start[:, None]),
                      num_rows, F, K, TRACK, SUM_AT, MEAN_AT, MAX_AT, MIN_AT, MUL_AT, VAR_AT, STD_AT, MIN_SLOT,
                      OUT_EVICT)


@triton.jit
def _multi_csr_piece(s_id, ft, x_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, part_ptr, parg_ptr, seg_row_ptr,
                     seg_ptr_ptr, slot_ptr, num_rows, F,
                     HAS_W: tl.constexpr, ACC64: tl.constexpr, TRACK: tl.constexpr, NEED_S: tl.constexpr,
                     NEED_Q: tl.constexpr, NEED_MAX: tl.constexpr, NEED_MIN: tl.constexpr, NEED_MUL: tl.constexpr,
                     K: tl.constexpr, SUM_AT: tl.constexpr, MEAN_AT: tl.constexpr, MAX_AT: tl.constexpr,
                     MIN_AT: tl.constexpr, MUL_AT: tl.constexpr, VAR_AT: tl.constexpr, STD_AT: tl.constexpr,
                     MIN_SLOT: tl.constexpr, SEG: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
                     X_EVICT: tl.constexpr, OUT_EVICT: tl.constexpr):
    """Piece ``s_id`` of the work list, feature tile ``ft``: [BLOCK_E, BLOCK_F] accumulators per
    statistic, reduced across edge lanes once after the loop; winners as int32 offsets from the
    piece's first edge. X_EVICT / OUT_EVICT as in _multi_row_group."""
    ACC = tl.float64 if ACC64 else tl.float32
    row, k, r0, r1, start, end, offs_f, fmask = _piece_at(s_id, ft, seg_row_ptr, seg_ptr_ptr, rowptr_ptr, F, SEG,
                                                          BLOCK_F)
    lane = tl.arange(0, BLOCK_E)
    s2, q2, p2, mx2, mn2, amax2, amin2 = _fresh_statistics(BLOCK_E, BLOCK_F, ACC64)
    c_next = tl.load(col_ptr + start + lane, mask=start + lane < end, other=0)
    for e0 in range(start, end, BLOCK_E):
        offs_e = e0 + lane
        emask = offs_e < end
        m2 = emask[:, None] & fmask[None, :]
        c = c_next.to(tl.int64)
        c_next = tl.load(col_ptr + offs_e + BLOCK_E, mask=offs_e + BLOCK_E < end, other=0)
        v = tl.load(x_ptr + c[:, None] * F + offs_f[None, :], mask=m2, other=0.0, eviction_policy=X_EVICT).to(ACC)
        if HAS_W:
            v = v * tl.load(w_ptr + offs_e, mask=emask, other=1.0).to(ACC)[:, None]
        rel = (e0 - start).to(tl.int32) + lane
        pos = rel[:, None] + tl.zeros([BLOCK_E, BLOCK_F], tl.int32)
        s2, q2, mx2, mn2, p2, amax2, amin2 = _fold_edge(v, pos, m2, s2, q2, mx2, mn2, p2, amax2, amin2, NEED_S,
                                                        NEED_Q, NEED_MAX, NEED_MIN, NEED_MUL, TRACK)
    s = tl.sum(s2, axis=0)
    q = tl.sum(q2, axis=0)
    p = tl.reduce(p2, 0, _mul_combine)
    amax = tl.full([BLOCK_F], -1, tl.int64)
    amin = tl.full([BLOCK_F], -1, tl.int64)
    if TRACK:  # the lowest winning position over the lanes (each lane's winner is its earliest)
        mx, at = _tile_winner(mx2, amax2 >= 0, amax2.to(tl.int64), MAX)
        amax = tl.where(at < _BIG, start + at, -1)
        mn, at = _tile_winner(mn2, amin2 >= 0, amin2.to(tl.int64), MIN)
        amin = tl.where(at < _BIG, start + at, -1)
    else:
        mx = tl.reduce(mx2, 0, _nan_max)
        mn = tl.reduce(mn2, 0, _nan_min)
    slot = tl.load(slot_ptr + row)
    if slot < 0:  # the whole row is ours
        _write_reductions(out_ptr, arg_ptr, row, offs_f, fmask, r1 - r0, s, q, mx, mn, p, amax, amin, num_rows, F,
                          K, TRACK, SUM_AT, MEAN_AT, MAX_AT, MIN_AT, MUL_AT, VAR_AT, STD_AT, MIN_SLOT, OUT_EVICT)
    else:  # a piece of a split row: its statistics, folded by _multi_combine_kernel
        base = part_ptr + (slot + k) * (5 * F) + offs_f
        if NEED_S:
            tl.store(base, s, mask=fmask)
        if NEED_Q:
            tl.store(base + F, q, mask=fmask)
        if NEED_MAX:
            tl.store(base + 2 * F, mx, mask=fmask)
        if NEED_MIN:
            tl.store(base + 3 * F, mn, mask=fmask)
        if NEED_MUL:
            tl.store(base + 4 * F, p, mask=fmask)
        if TRACK:
            tl.store(parg_ptr + (slot + k) * (2 * F) + offs_f, amax, mask=fmask)
            tl.store(parg_ptr + (slot + k) * (2 * F) + F + offs_f, amin, mask=fmask)


@fast_kernel
@triton.jit
def _multi_rowgroup_kernel(x_ptr, rows_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, num_short, num_rows, F,
                           HAS_W: tl.constexpr, ACC64: tl.constexpr, TRACK: tl.constexpr, NEED_S: tl.constexpr,
                           NEED_Q: tl.constexpr, NEED_MAX: tl.constexpr, NEED_MIN: tl.constexpr,
                           NEED_MUL: tl.constexpr, K: tl.constexpr, SUM_AT: tl.constexpr, MEAN_AT: tl.constexpr,
                           MAX_AT: tl.constexpr, MIN_AT: tl.constexpr, MUL_AT: tl.constexpr, VAR_AT: tl.constexpr,
                           STD_AT: tl.constexpr, MIN_SLOT: tl.constexpr, ROWS: tl.constexpr, BLOCK_F: tl.constexpr,
                           X_EVICT: tl.constexpr, OUT_EVICT: tl.constexpr):
    """Short rows, ROWS per program: _multi_row_group over a 2-D grid (group, feature tile)."""
    _multi_row_group(tl.program_id(0).to(tl.int64), tl.program_id(1), x_ptr, rows_ptr, rowptr_ptr, col_ptr, w_ptr,
                     out_ptr, arg_ptr, num_short, num_rows, F, HAS_W, ACC64, TRACK, NEED_S, NEED_Q, NEED_MAX,
                     NEED_MIN, NEED_MUL, K, SUM_AT, MEAN_AT, MAX_AT, MIN_AT, MUL_AT, VAR_AT, STD_AT, MIN_SLOT, ROWS,
                     BLOCK_F, X_EVICT, OUT_EVICT)


@fast_kernel
@triton.jit
def _multi_csr_kernel(x_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, part_ptr, parg_ptr, seg_row_ptr,
                      seg_ptr_ptr, slot_ptr, num_rows, F,
                      HAS_W: tl.constexpr, ACC64: tl.constexpr, TRACK: tl.constexpr, NEED_S: tl.constexpr,
                      NEED_Q: tl.constexpr, NEED_MAX: tl.constexpr, NEED_MIN: tl.constexpr, NEED_MUL: tl.constexpr,
                      K: tl.constexpr, SUM_AT: tl.constexpr, MEAN_AT: tl.constexpr, MAX_AT: tl.constexpr,
                      MIN_AT: tl.constexpr, MUL_AT: tl.constexpr, VAR_AT: tl.constexpr, STD_AT: tl.constexpr,
                      MIN_SLOT: tl.constexpr, SEG: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr,
                      X_EVICT: tl.constexpr, OUT_EVICT: tl.constexpr):
    """Every piece of the work list, one program per (piece, feature tile), tiles minor."""
    pid = tl.program_id(0).to(tl.int64)
    nft = tl.cdiv(F, BLOCK_F)
    _multi_csr_piece(pid // nft, pid % nft, x_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, part_ptr, parg_ptr,
                     seg_row_ptr, seg_ptr_ptr, slot_ptr, num_rows, F, HAS_W, ACC64, TRACK, NEED_S, NEED_Q, NEED_MAX,
                     NEED_MIN, NEED_MUL, K, SUM_AT, MEAN_AT, MAX_AT, MIN_AT, MUL_AT, VAR_AT, STD_AT, MIN_SLOT, SEG,
                     BLOCK_E, BLOCK_F, X_EVICT, OUT_EVICT)


@fast_kernel
@triton.jit
def _multi_one_pass_kernel(x_ptr, rows_ptr, num_short, task_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr,
                           part_ptr, parg_ptr, seg_row_ptr, seg_ptr_ptr, slot_ptr, num_rows, F,
                           HAS_W: tl.constexpr, ACC64: tl.constexpr, TRACK: tl.constexpr, NEED_S: tl.constexpr,
                           NEED_Q: tl.constexpr, NEED_MAX: tl.constexpr, NEED_MIN: tl.constexpr,
                           NEED_MUL: tl.constexpr, K: tl.constexpr, SUM_AT: tl.constexpr, MEAN_AT: tl.constexpr,
                           MAX_AT: tl.constexpr, MIN_AT: tl.constexpr, MUL_AT: tl.constexpr, VAR_AT: tl.constexpr,
                           STD_AT: tl.constexpr, MIN_SLOT: tl.constexpr, ROWS: tl.constexpr, SEG: tl.constexpr,
                           BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr, X_EVICT: tl.constexpr,
                           OUT_EVICT: tl.constexpr):
    """The hybrid plan in one launch, as the gather-scatter's _one_pass_kernel: program (t, ft) runs
    task t of the id-ordered task list (schedule.task_list), a row group (code g >= 0) or a
    long-row piece (code -1 - s). Each row is reduced as in the two-launch plan: bitwise the same."""
    code = tl.load(task_ptr + tl.program_id(0))
    ft = tl.program_id(1)
    if code >= 0:
        _multi_row_group(code, ft, x_ptr, rows_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, num_short,
                         num_rows, F, HAS_W, ACC64, TRACK, NEED_S, NEED_Q, NEED_MAX, NEED_MIN, NEED_MUL, K, SUM_AT,
                         MEAN_AT, MAX_AT, MIN_AT, MUL_AT, VAR_AT, STD_AT, MIN_SLOT, ROWS, BLOCK_F, X_EVICT, OUT_EVICT)
    else:
        _multi_csr_piece(-1 - code, ft, x_ptr, rowptr_ptr, col_ptr, w_ptr, out_ptr, arg_ptr, part_ptr, parg_ptr,
                         seg_row_ptr, seg_ptr_ptr, slot_ptr, num_rows, F, HAS_W, ACC64, TRACK, NEED_S, NEED_Q,
                         NEED_MAX, NEED_MIN, NEED_MUL, K, SUM_AT, MEAN_AT, MAX_AT, MIN_AT, MUL_AT, VAR_AT, STD_AT,
                         MIN_SLOT, SEG, BLOCK_E, BLOCK_F, X_EVICT, OUT_EVICT)


@triton.jit
def _fold_extreme(acc, arg, v, a, m2, TRACK: tl.constexpr, REDUCE: tl.constexpr):
    """Folds a [BLOCK_K, BLOCK_F] tile of consecutive pieces' max (REDUCE == MAX) or min into (acc, arg):
    with winners, the tile's best value at its lowest CSR position (first NaN wins), merged after the
    earlier tiles' (strict comparison: ties keep the earliest); values only, a NaN-propagating reduce."""
    if TRACK:
        val, at = _tile_winner(v, m2, a, REDUCE)
        return _merge_winner(acc, arg, val, at, REDUCE)
    if REDUCE == MAX:
        return _nan_max(acc, tl.reduce(tl.where(m2, v, float("-inf")), 0, _nan_max)), arg
    return _nan_min(acc, tl.reduce(tl.where(m2, v, float("inf")), 0, _nan_min)), arg


@fast_kernel
@triton.jit
def _multi_combine_kernel(part_ptr, parg_ptr, out_ptr, arg_ptr, rowptr_ptr, split_rows_ptr, seg_ptr_ptr, slot_ptr,
                          num_rows, F,
                          ACC64: tl.constexpr, TRACK: tl.constexpr, NEED_S: tl.constexpr, NEED_Q: tl.constexpr,
                          NEED_MAX: tl.constexpr, NEED_MIN: tl.constexpr, NEED_MUL: tl.constexpr, K: tl.constexpr,
                          SUM_AT: tl.constexpr, MEAN_AT: tl.constexpr, MAX_AT: tl.constexpr, MIN_AT: tl.constexpr,
                          MUL_AT: tl.constexpr, VAR_AT: tl.constexpr, STD_AT: tl.constexpr, MIN_SLOT: tl.constexpr,
                          BLOCK_K: tl.constexpr, BLOCK_F: tl.constexpr, OUT_EVICT: tl.constexpr):
    """Second pass over split rows: folds the row's pieces in CSR order, BLOCK_K at a time (as the
    gather-scatter's _combine_kernel: one piece per step left a hub row of ~90 pieces waiting on ~90
    dependent loads, 64 us of arxiv-like's 213 us on an H100), then writes."""
    ACC = tl.float64 if ACC64 else tl.float32
    pid = tl.program_id(0).to(tl.int64)
    nft = tl.cdiv(F, BLOCK_F)
    row = tl.load(split_rows_ptr + pid // nft)
    offs_f = (pid % nft) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = offs_f < F
    npieces = tl.load(seg_ptr_ptr + row + 1) - tl.load(seg_ptr_ptr + row)
    slot = tl.load(slot_ptr + row)
    s = tl.zeros([BLOCK_F], ACC)
    q = tl.zeros([BLOCK_F], ACC)
    p = tl.full([BLOCK_F], 1.0, ACC)
    mx = tl.full([BLOCK_F], float("-inf"), ACC)
    mn = tl.full([BLOCK_F], float("inf"), ACC)
    amax = tl.full([BLOCK_F], -1, tl.int64)
    amin = tl.full([BLOCK_F], -1, tl.int64)
    for k0 in range(0, npieces, BLOCK_K):
        pieces = slot + k0 + tl.arange(0, BLOCK_K)
        m2 = (k0 + tl.arange(0, BLOCK_K) < npieces)[:, None] & fmask[None, :]
        base = part_ptr + pieces[:, None] * (5 * F) + offs_f[None, :]
        won = parg_ptr + pieces[:, None] * (2 * F) + offs_f[None, :]
        if NEED_S:
            s += tl.sum(tl.load(base, mask=m2, other=0.0), axis=0)
        if NEED_Q:
            q += tl.sum(tl.load(base + F, mask=m2, other=0.0), axis=0)
        if NEED_MUL:
            p *= tl.reduce(tl.load(base + 4 * F, mask=m2, other=1.0), 0, _mul_combine)
        if NEED_MAX:
            a = tl.full([BLOCK_K, BLOCK_F], -1, tl.int64)
            if TRACK:
                a = tl.load(won, mask=m2, other=-1)
            mx, amax = _fold_extreme(mx, amax, tl.load(base + 2 * F, mask=m2, other=0.0), a, m2, TRACK, MAX)
        if NEED_MIN:
            a = tl.full([BLOCK_K, BLOCK_F], -1, tl.int64)
            if TRACK:
                a = tl.load(won + F, mask=m2, other=-1)
            mn, amin = _fold_extreme(mn, amin, tl.load(base + 3 * F, mask=m2, other=0.0), a, m2, TRACK, MIN)
    count = tl.load(rowptr_ptr + row + 1).to(tl.int64) - tl.load(rowptr_ptr + row).to(tl.int64)
    _write_reductions(out_ptr, arg_ptr, row, offs_f, fmask, count, s, q, mx, mn, p, amax, amin, num_rows, F, K,
                      TRACK, SUM_AT, MEAN_AT, MAX_AT, MIN_AT, MUL_AT, VAR_AT, STD_AT, MIN_SLOT, OUT_EVICT)
