"""@triton.jit one-pass forward kernels of ``gnnfuse.gat_attention`` and ``gnnfuse::pair_attention``
(GATv2 and dot-product logits); host side in attention.py and pair_attention.py.

One launch does every row, as the sum gather-scatter's one-pass kernel does: program t runs task t
of an id-ordered task list (schedule.task_list), either a row group (R short rows, degree-sorted,
one edge of each per step) or a piece of a long row (R lanes, lane l taking the piece's edges l,
l + R, l + 2R, ...). Both are R independent online softmaxes (running max m, sum z, accumulator
rescaled when the max rises) over [R, HB, FB] tiles (lanes x heads x features), so one loop
serves both: a row group stores its R rows; a piece folds its lanes into the row's (max, sum, acc)
(``_merge_lanes``) and stores the row or, for a piece of a split row, a partial that
``_merge_pieces_kernel`` merges afterwards. No reduction across the tile's lanes inside the loop.
Feature loads are 16-byte vectors where the head width is a power of two (DENSE, see _gather).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._launch import fast_kernel
from .attention_kernels import (NEG_INF, _edge_block, _edge_logit, _edge_terms, _endpoints, _gather, _head_block,
                                _merge_lanes, _online_step, _piece_at)
from .pair_attention_kernels import _att_tile, _pair_edges, _pair_logit, _pair_terms
from .pair_forward_split import _pair_split_loop

# The forward loop per (narrow heads (FB <= 16), logit: "gat", "gatv2" or "dot", path: "float32", "float32-dropout",
# "half" (bfloat16 / float16) or "half-dropout", or "float16" / "float16-dropout" where float16 has an entry of its
# own): (AHEAD, MAXNREG, ROWS[, HEADS[, SPLIT]]), read by attention._forward_loop (other kernels, edge terms and
# float64 among them, get (0, 0, 0)). AHEAD 0 loads a step's logit terms, works them, then gathers its values; 1
# issues every load of step t + 1 before step t's maths (the loops below). MAXNREG caps a thread's registers (0: the
# compiler's choice) so that more programs share an SM; each cap here keeps the loop free of spills (ptxas for sm_90,
# Triton 3.6: benchmarks/gpu/compile_attention.py). ROWS (0: the tile's, attention._one_pass_rows) sets the rows of a
# row group and the lanes of a piece: more rows share a step's fixed work (the loop, the edge positions) and put more
# loads in flight per thread; it changes how a split row's edges are dealt to the lanes, so those rows' sums round
# differently from ROWS 0 (same bits run to run). HEADS (0 or absent: the tile's) sets the heads a program takes.
# SPLIT (pair kernels; 0, 1 or absent: the 3D loop) 2 runs pair_forward_split.py's loop, where a thread holds 2
# vectors of one (row, head) pair instead of one vector of 2 pairs (half the per-pair work a thread; where it applies:
# pair_forward_split.split_for; wide GATv2 in half types with dropout, 4 heads x 8 rows, loads not ahead and a
# 96-register cap (spill-free, 5 programs an SM):
# benchmarks/results/attention-forward-paths_h100_2026-11-24_gpugatv2.md; the other wide GATv2 / dot paths but
# GATv2 in half types without dropout (whose 64-register cap the SPLIT loop spills under), the half-type dot with 16
# rows: 2-22% faster, float32 GATv2 without dropout 1.3% slower on arxiv-like and 10% faster on rfc-uniform,
# benchmarks/results/attention-forward-paths_h100_2026-11-24_gpulrelu.md). Chosen on an H100 (kernel time against our
# sum of the same dtype, arxiv-like and rfc-uniform): float32 in
# benchmarks/results/attention-forward_h100_2026-11-23_gpukern.md, the other paths in
# benchmarks/results/attention-forward-paths_h100_2026-11-24_gpudrop.md (half types measured in bfloat16; float16
# takes the same entries) and, for wide GAT / GATv2 in half types with dropout and narrow GAT in float16,
# benchmarks/results/attention-forward-paths_h100_2026-11-24_gpuhalf.md (both half types; at 32 rows the wide GAT loop
# keeps one copy of the logits instead of two, see there); the loops there are latency- and issue-bound (ncu: about
# two thirds of a warp's cycles wait on its gathers, occupancy limited by registers), so the paths whose loop grew
# (the dropout hash) or whose sum got cheaper (half types read half the bytes) gained most from loads one step ahead
# and from more rows.
FORWARD_LOOP = {(True, "gat", "float32"): (0, 64, 0), (True, "gatv2", "float32"): (1, 80, 0),
                (True, "dot", "float32"): (0, 0, 0), (False, "gat", "float32"): (1, 72, 0),
                (False, "gatv2", "float32"): (1, 72, 0, 0, 2), (False, "dot", "float32"): (0, 0, 0, 0, 2),
                (True, "gatv2", "float32-dropout"): (1, 0, 0), (True, "dot", "float32-dropout"): (1, 0, 0),
                (False, "gat", "float32-dropout"): (1, 0, 8), (False, "gatv2", "float32-dropout"): (0, 0, 0, 0, 2),
                (False, "dot", "float32-dropout"): (0, 0, 0, 0, 2),
                (True, "gatv2", "half"): (1, 0, 0), (False, "gat", "half"): (0, 0, 16),
                (False, "gatv2", "half"): (1, 64, 0), (False, "dot", "half"): (0, 0, 16, 0, 2),
                (False, "gat", "half-dropout"): (0, 168, 32), (False, "gatv2", "half-dropout"): (0, 96, 8, 4, 2),
                (False, "dot", "half-dropout"): (0, 0, 16, 0, 2),
                (True, "gat", "float16"): (1, 0, 0),
                # [E, H, F] edge features, float32: AHEAD 1 3-30% faster for GATv2 and for the wide dot product,
                # 2.5-10% slower for the narrow one (`.a1` rows of
                # benchmarks/results/attention-edge-terms_h100_2026-11-24_edgefeat.md)
                (True, "gatv2", "float32-edge"): (1, 0, 0), (False, "gatv2", "float32-edge"): (1, 0, 0),
                (False, "dot", "float32-edge"): (1, 0, 0),
                # GAT with [E, H] edge terms and the self loops' terms (GATConv with edge_dim and self loops), float32,
                # wide heads: loads one step ahead and 8 rows, 6-11% faster than the plain loop (arxiv-like and
                # rfc-uniform 4x64, with and without dropout: the `op.csr.loop.a1.r8` rows of
                # benchmarks/results/attention-edge-terms_h100_2026-11-24_gatcsr.md); narrow heads keep the plain loop
                (False, "gat", "float32-edge-loop"): (1, 0, 8), (False, "gat", "float32-edge-loop-dropout"): (1, 0, 8)}


@triton.jit
def _task_lanes(task_ptr, rows_ptr, num_rows, seg_row, seg_ptr, slot, rowptr, NUM_LOOPS, R: tl.constexpr,
                SEG: tl.constexpr, IDX: tl.constexpr):
    """This program's task as R lanes: (a row group or not, the task's code, each lane's row [R],
    lane in use [R], first edge [R], the row's end [R], stop [R] (the row's end plus its virtual self
    loop where it has one; a piece's own end), edge step, number of steps). A row group's lane r
    walks row r one edge a step; a piece's lane l its edges first + l, first + l + R, ...
    Rows and edge positions come as IDX (tl.int32 where every index of the call fits, see
    attention._index_type: the loop's addresses and compares then take half the integer instructions)."""
    code = tl.load(task_ptr + tl.program_id(0)).to(tl.int64)
    lane = tl.arange(0, R)
    group = code >= 0
    if group:
        offs = code * R + lane
        used = offs < num_rows
        node = tl.load(rows_ptr + offs, mask=used, other=0).to(IDX)
        start = tl.load(rowptr + node, mask=used, other=0).to(IDX)
        end = tl.load(rowptr + node + 1, mask=used, other=0).to(IDX)
        stop = tl.where(used, end + (node < NUM_LOOPS).to(IDX), start)
        step = (code * 0 + 1).to(IDX)
        steps = tl.max(stop - start, 0)
    else:
        row, _k, first, row_end, piece_stop, _part = _piece_at(-1 - code, seg_row, seg_ptr, slot, rowptr, NUM_LOOPS,
                                                               SEG)
        used = lane < R
        node = (row + 0 * lane).to(IDX)
        start = (first + lane).to(IDX)
        end = (row_end + 0 * lane).to(IDX)
        stop = (piece_stop + 0 * lane).to(IDX)
        step = (code * 0 + R).to(IDX)
        steps = ((piece_stop - first + R - 1) // R).to(IDX)
    return group, code, node, used, start, end, stop, step, steps


@triton.jit
def _finish(group, code, node, used, seg_row, seg_ptr, slot, rowptr, out, m_out, z_out, p_acc, p_m, p_z, heads,
            hmask, feats, fmask, H, F, m, z, acc, NUM_LOOPS, DENSE: tl.constexpr, FB: tl.constexpr,
            SEG: tl.constexpr):
    """Stores a task's result: a row group's R rows (out = acc / z, 0 for a row without edges, and the
    saved row max and sum); a piece's lanes folded into its row, stored the same way, or for a piece
    of a split row its unnormalised partial (m, z, acc)."""
    if group:
        inv = tl.where(z > 0, 1.0 / tl.where(z > 0, z, 1.0), 0.0)
        rh = used[:, None] & hmask[None, :]
        if DENSE:
            ptrs = out + node[:, None, None] * H * FB + heads[None, :, None] * FB + feats[None, None, :]
            mask = tl.broadcast_to(rh[:, :, None], ptrs.shape)
        else:
            ptrs = out + node[:, None, None] * H * F + heads[None, :, None] * F + feats[None, None, :]
            mask = rh[:, :, None] & fmask[None, None, :]
        tl.store(ptrs, (acc * inv[:, :, None]).to(out.dtype.element_ty), mask=mask)
        tl.store(m_out + node[:, None] * H + heads[None, :], tl.where(z > 0, m, 0.0), mask=rh)
        tl.store(z_out + node[:, None] * H + heads[None, :], z, mask=rh)
    else:
        m1, z1, acc1 = _merge_lanes(m, z, acc)
        row, _k, _first, _end, _stop, part = _piece_at(-1 - code, seg_row, seg_ptr, slot, rowptr, NUM_LOOPS, SEG)
        hf = hmask[:, None] & fmask[None, :]
        if part < 0:  # the whole row
            inv = tl.where(z1 > 0, 1.0 / tl.where(z1 > 0, z1, 1.0), 0.0)
            tl.store(out + row * H * F + heads[:, None] * F + feats[None, :],
                     (acc1 * inv[:, None]).to(out.dtype.element_ty), mask=hf)
            tl.store(m_out + row * H + heads, tl.where(z1 > 0, m1, 0.0), mask=hmask)
            tl.store(z_out + row * H + heads, z1, mask=hmask)
        else:
            tl.store(p_acc + part * H * F + heads[:, None] * F + feats[None, :], acc1, mask=hf)
            tl.store(p_m + part * H + heads, m1, mask=hmask)
            tl.store(p_z + part * H + heads, z1, mask=hmask)


@triton.jit
def _gat_loads(ks, ids, end, stop, node, heads, hmask, feats, fmask, x, a_src, a_edge, a_loop, col, H, F,
               HAS_EDGE: tl.constexpr, HAS_LOOP_TERM: tl.constexpr, SELF_LOOPS: tl.constexpr, DENSE: tl.constexpr,
               FB: tl.constexpr, ACC: tl.constexpr):
    """Every load of GAT's forward step at edges ks (endpoints ids): _edge_terms' and the values' gather,
    as (valid, real, edge id, the logit's three terms, values [R, HB, FB])."""
    j, v2, real, k, t_src, t_edge, t_loop = _edge_terms(ks, end, stop, node, heads, hmask, a_src, a_edge, a_loop, ids,
                                                        col, H, False, HAS_EDGE, HAS_LOOP_TERM, SELF_LOOPS, ACC)
    xv, _mask = _gather(x, j, v2, heads, feats, fmask, H, F, DENSE, FB, ACC)
    return v2, real, k, t_src, t_edge, t_loop, xv


@fast_kernel
@triton.jit(do_not_specialize=["H", "seed", "threshold"])  # .to() needs tensors, not constexpr 1
def _forward_one_pass_kernel(x, a_src, a_dst, a_edge, a_loop, rowptr, col, out, m_out, z_out, rows_ptr, num_rows,
                             task_ptr, seg_row, seg_ptr, slot, p_acc, p_m, p_z, NUM_LOOPS, N_EDGES, H, F, slope, seed,
                             threshold, scale, HAS_EDGE: tl.constexpr, HAS_LOOP_TERM: tl.constexpr,
                             SELF_LOOPS: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr, HB: tl.constexpr,
                             FB: tl.constexpr, R: tl.constexpr, SEG: tl.constexpr, DENSE: tl.constexpr,
                             AHEAD: tl.constexpr, IDX: tl.constexpr):
    """GAT's forward over every row in one launch (module docstring): logits from the per-node
    terms alpha_src [N, H] and alpha_dst [N, H] (``_edge_block``), values x [N, H, F]."""
    group, code, node, used, start, end, stop, step, steps = _task_lanes(task_ptr, rows_ptr, num_rows, seg_row,
                                                                         seg_ptr, slot, rowptr, NUM_LOOPS, R, SEG, IDX)
    heads, hmask, feats, fmask = _head_block(H, F, HB, FB)
    ad = tl.load(a_dst + node[:, None] * H + heads[None, :], mask=used[:, None] & hmask[None, :], other=0).to(ACC)
    m = tl.full((R, HB), NEG_INF, ACC)
    z = tl.zeros((R, HB), ACC)
    acc = tl.zeros((R, HB, FB), ACC)
    ids = _endpoints(col, start, end)
    if AHEAD > 0:  # the first AHEAD steps' loads; each step then issues step t + AHEAD's loads before its maths
        nxt = _gat_loads(start, ids, end, stop, node, heads, hmask, feats, fmask, x, a_src, a_edge, a_loop, col, H, F,
                         HAS_EDGE, HAS_LOOP_TERM, SELF_LOOPS, DENSE, FB, ACC)
        ids = _endpoints(col, start + step, end)
        if AHEAD > 1:
            nxt2 = _gat_loads(start + step, ids, end, stop, node, heads, hmask, feats, fmask, x, a_src, a_edge, a_loop,
                              col, H, F, HAS_EDGE, HAS_LOOP_TERM, SELF_LOOPS, DENSE, FB, ACC)
            ids = _endpoints(col, start + 2 * step, end)
    for t in range(0, steps):
        ks = start + t * step
        if AHEAD > 0:
            cur = nxt
            if AHEAD > 1:
                nxt = nxt2
            nxt_ = _gat_loads(ks + AHEAD * step, ids, end, stop, node, heads, hmask, feats, fmask, x, a_src, a_edge,
                              a_loop, col, H, F, HAS_EDGE, HAS_LOOP_TERM, SELF_LOOPS, DENSE, FB, ACC)
            if AHEAD > 1:
                nxt2 = nxt_
            else:
                nxt = nxt_
            ids = _endpoints(col, ks + (AHEAD + 1) * step, end)
            v2, real, kk, t_src, t_edge, t_loop, xv = cur
            _s, e, keep = _edge_logit(t_src, t_edge, t_loop, ad, v2, real, kk, node, heads, N_EDGES, H, slope, seed,
                                      threshold, scale, HAS_EDGE, HAS_LOOP_TERM, DROPOUT, ACC)
        else:  # the next step's endpoints load before this step's gathers
            ids_this = ids
            ids = _endpoints(col, ks + step, end)
            j, v2, _s, e, keep = _edge_block(ks, end, stop, node, heads, hmask, a_src, a_edge, a_loop, ids_this, col,
                                             ad, N_EDGES, H, slope, seed, threshold, scale, False, HAS_EDGE,
                                             HAS_LOOP_TERM, SELF_LOOPS, DROPOUT, ACC)
            xv, _mask = _gather(x, j, v2, heads, feats, fmask, H, F, DENSE, FB, ACC)
        m, z, acc = _online_step(m, z, acc, e, keep, xv)
    _finish(group, code, node, used, seg_row, seg_ptr, slot, rowptr, out, m_out, z_out, p_acc, p_m, p_z, heads, hmask,
            feats, fmask, H, F, m, z, acc, NUM_LOOPS, DENSE, FB, SEG)


@triton.jit
def _values(v, kv, ev, j, v2, heads, feats, fmask, H, F, HAS_EDGE: tl.constexpr, KV_SAME: tl.constexpr,
            DENSE: tl.constexpr, FB: tl.constexpr, ACC: tl.constexpr):
    """The values of a step's edges [R, HB, FB]: the gathered keys kv where KV_SAME (GATv2's source
    features, one gather for both), else v's rows j plus, for TransformerConv, the edge term ev."""
    if KV_SAME:
        xv = kv
    else:
        xv, _mask = _gather(v, j, v2, heads, feats, fmask, H, F, DENSE, FB, ACC)
        if HAS_EDGE:  # TransformerConv: the edge term is added to the values too
            xv += ev
    return xv


@triton.jit
def _pair_loads(ks, ids, end, stop, node, heads, hmask, feats, fmask, k, v, edge, perm, col, N_EDGES, H, F,
                SELF_LOOPS: tl.constexpr, HAS_EDGE: tl.constexpr, EDGE_LOOPS: tl.constexpr, EDGE_PERM: tl.constexpr,
                KV_SAME: tl.constexpr, DENSE: tl.constexpr, FB: tl.constexpr, ACC: tl.constexpr):
    """Every load of the pair forward's step at edges ks (endpoints ids): _pair_terms' and the values',
    as (valid, real, edge id, keys [R, HB, FB], edge features' tile, values)."""
    j, v2, _v3, real, kk, kv, _er, ev = _pair_terms(ks, end, stop, node, heads, hmask, feats, fmask, k, ids, col, edge,
                                                    perm, N_EDGES, H, F, False, SELF_LOOPS, HAS_EDGE, EDGE_LOOPS,
                                                    EDGE_PERM, ACC, DENSE, FB)
    xv = _values(v, kv, ev, j, v2, heads, feats, fmask, H, F, HAS_EDGE, KV_SAME, DENSE, FB, ACC)
    return v2, real, kk, kv, ev, xv


@fast_kernel
@triton.jit(do_not_specialize=["H", "seed", "threshold"])
def _pair_forward_one_pass_kernel(q, k, v, att, edge, perm, rowptr, col, out, m_out, z_out, rows_ptr, num_rows,
                                  task_ptr, seg_row, seg_ptr, slot, p_acc, p_m, p_z, NUM_LOOPS, N_EDGES, H, F, slope,
                                  qk_scale, seed, threshold, scale, SELF_LOOPS: tl.constexpr, DROPOUT: tl.constexpr,
                                  GATV2: tl.constexpr, HAS_EDGE: tl.constexpr, EDGE_LOOPS: tl.constexpr,
                                  EDGE_PERM: tl.constexpr, KV_SAME: tl.constexpr, ACC: tl.constexpr, HB: tl.constexpr,
                                  FB: tl.constexpr, R: tl.constexpr,
                                  SEG: tl.constexpr, DENSE: tl.constexpr, AHEAD: tl.constexpr,
                                  IDX: tl.constexpr, SPLIT: tl.constexpr):
    """GATv2's and dot-product attention's forward over every row in one launch (module docstring):
    logits from the two endpoints' head vectors (``_pair_edges``); KV_SAME: the values are the
    gathered keys (GATv2's source features), one gather for both."""
    group, code, node, used, start, end, stop, step, steps = _task_lanes(task_ptr, rows_ptr, num_rows, seg_row,
                                                                         seg_ptr, slot, rowptr, NUM_LOOPS, R, SEG, IDX)
    if SPLIT > 1:  # each thread holds SPLIT vectors of one (row, head) pair (pair_forward_split.py)
        _pair_split_loop(q, k, v, att, rowptr, col, out, m_out, z_out, seg_row, seg_ptr, slot, p_acc, p_m, p_z, group,
                         code, node, used, start, end, stop, step, steps, NUM_LOOPS, N_EDGES, H, slope, qk_scale,
                         seed, threshold, scale, SELF_LOOPS, DROPOUT, GATV2, KV_SAME, ACC, HB, FB, R, SEG, DENSE,
                         AHEAD, SPLIT)
        return
    heads, hmask, feats, fmask = _head_block(H, F, HB, FB)
    qi, _mask = _gather(q, node, used[:, None] & hmask[None, :], heads, feats, fmask, H, F, DENSE, FB, ACC)
    a = _att_tile(att, heads, feats, hmask[:, None] & fmask[None, :], F, GATV2, ACC, HB, FB)
    m = tl.full((R, HB), NEG_INF, ACC)
    z = tl.zeros((R, HB), ACC)
    acc = tl.zeros((R, HB, FB), ACC)
    ids = _endpoints(col, start, end)
    if AHEAD > 0:  # the first AHEAD steps' loads; each step then issues step t + AHEAD's loads before its maths
        nxt = _pair_loads(start, ids, end, stop, node, heads, hmask, feats, fmask, k, v, edge, perm, col, N_EDGES, H, F,
                          SELF_LOOPS, HAS_EDGE, EDGE_LOOPS, EDGE_PERM, KV_SAME, DENSE, FB, ACC)
        ids = _endpoints(col, start + step, end)
        if AHEAD > 1:
            nxt2 = _pair_loads(start + step, ids, end, stop, node, heads, hmask, feats, fmask, k, v, edge, perm, col,
                               N_EDGES, H, F, SELF_LOOPS, HAS_EDGE, EDGE_LOOPS, EDGE_PERM, KV_SAME, DENSE, FB, ACC)
            ids = _endpoints(col, start + 2 * step, end)
    for t in range(0, steps):
        ks = start + t * step
        if AHEAD > 0:
            cur = nxt
            if AHEAD > 1:
                nxt = nxt2
            nxt_ = _pair_loads(ks + AHEAD * step, ids, end, stop, node, heads, hmask, feats, fmask, k, v, edge, perm,
                               col, N_EDGES, H, F, SELF_LOOPS, HAS_EDGE, EDGE_LOOPS, EDGE_PERM, KV_SAME, DENSE, FB,
                               ACC)
            if AHEAD > 1:
                nxt2 = nxt_
            else:
                nxt = nxt_
            ids = _endpoints(col, ks + (AHEAD + 1) * step, end)
            v2, real, kk, kv, ev, xv = cur
            e, keep = _pair_logit(kv, ev, qi, a, v2, real, kk, node, heads, N_EDGES, H, slope, qk_scale, seed,
                                  threshold, scale, False, DROPOUT, GATV2, HAS_EDGE, ACC)
        else:  # the next step's endpoints load before this step's gathers
            ids_this = ids
            ids = _endpoints(col, ks + step, end)
            j, v2, _v3, kv, e, keep, _er, ev = _pair_edges(ks, end, stop, node, heads, hmask, feats, fmask, k, ids_this,
                                                           col, qi, a, edge, perm, N_EDGES, H, F, slope, qk_scale,
                                                           seed, threshold, scale, False, SELF_LOOPS, DROPOUT, GATV2,
                                                           HAS_EDGE, EDGE_LOOPS, EDGE_PERM, ACC, DENSE, FB)
            xv = _values(v, kv, ev, j, v2, heads, feats, fmask, H, F, HAS_EDGE, KV_SAME, DENSE, FB, ACC)
        m, z, acc = _online_step(m, z, acc, e, keep, xv)
    _finish(group, code, node, used, seg_row, seg_ptr, slot, rowptr, out, m_out, z_out, p_acc, p_m, p_z, heads, hmask,
            feats, fmask, H, F, m, z, acc, NUM_LOOPS, DENSE, FB, SEG)
