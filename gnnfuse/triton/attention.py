"""Triton kernels of ``gnnfuse.gat_attention`` (maths in gnnfuse/ops/attention.py).

One program per (piece of a target row, block of HB heads) in the forward and in the backward's
row pass, one per (piece of a source row, block of heads) in the backward's transpose pass.
The forward takes short rows (at most GROUP_MAX_DEGREE edges) apart: a row-group kernel runs
ROWS of them per program, sorted by degree as the sum gather-scatter's row groups are, one edge of
each row per step, each row with its own online softmax (``_forward_plan``). Rows
are cut into pieces of at most SPLIT_EDGES edges by the gather-scatter's work list
(``gather_scatter.work_list``), so the hub rows of power-law graphs are spread over many programs
instead of serialising one. A row of one piece writes its results directly; the pieces of a split
row write partials that a second pass folds in piece order. No atomics: deterministic. Edges are
walked in blocks of BE; a tile is [BE, HB, FB] (edges x heads x features).

Forward: online softmax (flash-attention style): a running max m and sum z per head, the
accumulator rescaled by exp(m_old - m_new) when an edge raises the max. On tiles of several warps
the per-piece kernel keeps one such state per edge lane of its [BE, HB, FB] tile and folds the
lanes once at the end (``_forward_lanes``), so its loop has no reduction across warps. A split row's pieces
leave (m, z, unnormalised acc) each; ``_merge_pieces_kernel`` merges them the same way
(M = max m_k, Z = sum z_k exp(m_k - M), acc = sum acc_k exp(m_k - M)). The backward's partials
are plain sums (gradients of alpha_dst, x, alpha_src), folded by the gather-scatter's
``_combine_kernel``.

The @triton.jit kernels are in attention_kernels.py; this module is the host side and
``gnnfuse.edge_softmax``'s kernels.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._tensor_cache import cached
from ..reductions import SUM
from ._grid import cdiv, next_power_of_2
from .attention_kernels import (
    NEG_INF,
    _backward_rows_kernel,
    _backward_sources_kernel,
    _forward_groups_kernel,
    _forward_kernel,
    _merge_pieces_kernel,
)
from ._launch import BoundLaunches
from .attention_launches import BackwardSetup, ForwardSetup
from .gather_scatter import work_list
from .gather_scatter_fwd_kernels import _COMBINE_K, _combine_kernel
from .schedule import choose_window, short_rows

# Longest row piece one program walks. Rows up to this length (nearly all rows of realistic
# graphs) keep one program; a hub row of 100K edges becomes ~400 programs. A multiple of every BE.
SPLIT_EDGES = 256
SPARSE_DEGREE = 8  # graphs of at most this average degree get 4-edge steps (see _blocks)
WIDE_HEAD = 32  # head widths from this one get one-warp programs on short tiles (see _warps)
# The forward's row groups: rows of at most this many edges (and at most SPLIT_EDGES), as the sum
# gather-scatter's row groups, in tiles of about GROUP_TILE elements [ROWS, HB, FB].
GROUP_MAX_DEGREE = 64
GROUP_TILE = 1024


# ---- launchers ------------------------------------------------------------------------------------
def _blocks(H: int, F: int, num_edges: int | None = None, num_rows: int | None = None) -> tuple[int, int, int]:
    """(BE, HB, FB): all features of a head in one tile, heads packed up to 128 columns, tile <= 4096.

    BE (edges per step) follows the graph's average degree E / rows when given: 4 up to an average
    of SPARSE_DEGREE, else the next power of two above it. Most rows of sparse graphs have a
    handful of edges, and a 32-edge tile over a 7-edge row is mostly masked lanes that still cost
    registers (fewer programs resident to hide the gathers' latency) and instructions. Measured on
    an H100 (benchmarks/results/attention-edge-block_h100_2026-11-23_*.md, arxiv-scale graph of
    average degree 6.9): a GATv2 / Transformer training step took 3.5 ms at BE 4, 5.0 at 8, 8.2 at
    16 and 11 at 32 (8 heads x 8); at 4 x 64 with one warp (see _warps) BE 4 beat BE 8 by 1.2-1.25x
    (training step)."""
    fb = next_power_of_2(F)
    hb = max(1, min(next_power_of_2(H), 128 // fb))
    be = max(4, min(32, 4096 // (hb * fb)))
    if num_edges is not None and num_rows:
        average = -(-num_edges // num_rows)
        be = min(be, 4 if average <= SPARSE_DEGREE else next_power_of_2(average))
    return be, hb, fb


def _warps(be: int, hb: int, fb: int) -> int:
    """Warps per program of the backward kernels (and of the forward's larger tiles, _forward_warps).
    One warp for wide heads (F >= WIDE_HEAD) in tiles of at most 1024 elements (4 edges x 2 heads x
    64 features on sparse graphs): a thread then holds all edges of its features, so the sums over
    a tile's edges stay in registers, with no cross-warp reduction; at 4 x 64 the GAT, GATv2 and
    Transformer training steps ran 1.2-1.3x faster than with 2 warps. 2 warps for other tiles of at most 512
    elements (4 edges x 8 heads x 8 features), where 4 warps would hold 4 elements a thread and pay
    cross-warp reductions for the softmax and the per-head sums (and one warp made the 8 x 8 GAT
    backward slower); 4 otherwise."""
    if fb >= WIDE_HEAD and be * hb * fb <= 1024:
        return 1
    return 2 if be * hb * fb <= 512 else 4


def _forward_warps(be: int, hb: int, fb: int) -> int:
    """Warps per program of the forward kernels: one for tiles of at most 512 elements (the sparse
    graphs' 4-edge tiles), where the online softmax's sums over a tile's edges then stay in one
    warp; the forward ran 1.15-1.25x faster than with 2 warps at 8 x 8 (GAT, Transformer; GATv2
    within 5%) and 1.5-1.6x at 4 x 64 (benchmarks/results/attention-edge-block_h100_2026-11-23_
    fwd-warps.md). _warps otherwise."""
    return 1 if be * hb * fb <= 512 else _warps(be, hb, fb)


def _group_rows(hb: int, fb: int, average_degree: float, wide_sparse: bool = False) -> int:
    """Rows per program of the row-group forward, 0 for none (every row in the per-piece kernel):
    GROUP_TILE elements, between 2 and 32 rows (16 at 8 heads x 8, 8 at 2 heads x 64 per program).

    None for wide heads (F >= WIDE_HEAD) on sparse graphs (average degree <= SPARSE_DEGREE) unless
    ``wide_sparse`` (GATv2): there a one-warp program walks a row in one or two [4, HB, FB] steps,
    each with 4 gathers of HB * FB features in flight, and row groups measured slower for GAT and
    TransformerConv. On an H100 (benchmarks/results/attention_gatconv-gatv2conv-transformerconv_h100_
    2026-11-23_groups-everywhere.md and archive/..._edge-dim8_h100_2026-11-23_groups-everywhere.md,
    forward with / without row groups, interleaved, time ratio): arxiv-scale graphs (average degree
    6.9) at 8 x 8 0.84-1.01 (all three); at 4 x 64 GAT 1.10-1.19, TransformerConv 1.01-1.10,
    GATv2 0.87-1.00 (with edge features 0.87); products-like (average degree 25) 0.48-0.66 at
    both widths."""
    if fb >= WIDE_HEAD and average_degree <= SPARSE_DEGREE and not wide_sparse:
        return 0
    return max(2, min(32, GROUP_TILE // (hb * fb)))


def _group_warps(rows: int, hb: int, fb: int) -> int:
    """Warps of the row-group forward: 4 (the sum's row groups use 4 at 16 rows x 64 features)."""
    return 4


def _forward_lanes(be: int, hb: int, fb: int) -> bool:
    """Whether the per-piece forward keeps one online softmax per edge lane (folded once at the
    end) instead of reducing each [BE, HB, FB] block over its edges: where the tile spans several
    warps, whose reductions go through shared memory with a barrier, three a step. On an H100 the
    per-piece kernel (32-edge tiles, 4 warps) took 147 us of the GAT forward's 257 us at 8 x 8 on
    arxiv-like, the row groups 89 us (benchmarks/results/attention-profile_h100_2026-11-23_before.md).
    One-warp tiles (4-edge steps on sparse graphs) reduce within a thread and keep the block form."""
    return _forward_warps(be, hb, fb) > 1


def _forward_stages() -> int:
    """Software-pipelining depth of the forward kernels' edge loops (``tl.range(num_stages=)``; 1:
    none, each step's gathers issued after the step before has finished)."""
    return 1


def _forward_plan(rowptr, col, num_src, H, F, itemsize, wide_sparse=False):
    """The forward's split of the target rows: (the per-piece kernel's work list and edge block BE,
    the row-group kernel's rows (None: no row groups) and rows per group). The short rows come
    sorted by decreasing degree, within windows of consecutive ids where the graph's ids carry
    locality and the features do not fit in L2 (schedule.choose_window: the sum plan's rule at the
    same width). The per-piece kernel then walks only rows longer than GROUP_MAX_DEGREE: full
    edge blocks, not the ones sized for the graph's average degree. ``wide_sparse``: see _group_rows."""
    num_rows = rowptr.shape[0] - 1
    be, hb, fb = _blocks(H, F, col.shape[0], num_rows)
    rows = _group_rows(hb, fb, col.shape[0] / max(num_rows, 1), wide_sparse)
    if not rows:
        return _work(rowptr), be, None, 0
    short_max = min(GROUP_MAX_DEGREE, SPLIT_EDGES)
    window = cached("attention-window", (rowptr,), (num_src, H * F, itemsize),
                    lambda: choose_window(rowptr, col, num_src, H * F, itemsize, rowptr.device)[0])
    return work_list(rowptr, SPLIT_EDGES, short_max), _blocks(H, F)[0], short_rows(rowptr, short_max, window), rows


def _knobs() -> tuple:
    """The tile and plan choices above, as functions: part of every cached setup's key, so that a
    benchmark or test swapping one of them (bench_attention.py's sweeps) gets a setup made with them."""
    return (_blocks, _warps, _forward_warps, _group_rows, _group_warps, _forward_stages, _forward_lanes)


def _acc(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _scalars(n_src, num_dst, num_edges, H, F, self_loops, slope, p, seed) -> tuple:
    """The kernels' runtime scalars: self loops, edges, heads, width, slope, seed, dropout threshold, 1 / keep."""
    return (min(n_src, num_dst) if self_loops else 0, num_edges, H, F, float(slope), int(seed),
            int(round(p * (1 << 24))), 1.0 / (1.0 - p))


def _work(rowptr):
    """The row pieces of ``rowptr`` (cached on it) and the partial buffers' row count."""
    return work_list(rowptr, SPLIT_EDGES)


def forward_setup(kind: str, kernels, features, rowptr, col, flags: tuple, wide_sparse: bool = False) -> ForwardSetup:
    """The forward's plan, grids, constexprs and bound launches for this graph, the [N_src, H, F]
    ``features``' shape and dtype and the kernels' ``flags`` ((name, value) pairs), cached on rowptr
    (``kind``: the cache's name for ``kernels``, the row-group and per-piece forwards)."""
    n_src, H, F = features.shape
    dtype = features.dtype

    def build():
        _, hb, fb = _blocks(H, F, col.shape[0], rowptr.shape[0] - 1)
        wl, be, short, rows = _forward_plan(rowptr, col, n_src, H, F, dtype.itemsize, wide_sparse)
        base = dict(flags, ACC=_acc(dtype), HB=hb, FB=fb)
        groups = dict(base, ROWS=rows, STAGES=_forward_stages(), num_warps=_group_warps(rows, hb, fb))
        pieces = dict(base, BE=be, SEG=SPLIT_EDGES, STAGES=_forward_stages(), LANES=_forward_lanes(be, hb, fb),
                      num_warps=_forward_warps(be, hb, fb))
        return ForwardSetup(kernels, wl, short, rows, cdiv(H, hb), groups, pieces, dict(ACC=base["ACC"], BK=32, HB=hb,
                                                                                       FB=fb))

    key = (n_src, H, F, dtype, col.dtype, col.shape[0], flags, wide_sparse, _knobs())
    return cached(kind, (rowptr,), key, build)


def forward(x, a_src, a_dst, a_edge, a_loop, rowptr, col, t_rowptr, t_col, t_pos, self_loops, slope, p, seed):
    n_src, H, F = x.shape
    num_dst = rowptr.shape[0] - 1
    out = x.new_empty(num_dst, H, F)
    m = x.new_empty(num_dst, H, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
    z = torch.empty_like(m)
    if not (num_dst and H):
        return out, m, z
    has_edge, has_loop = a_edge is not None, a_loop is not None
    flags = (("HAS_EDGE", has_edge), ("HAS_LOOP_TERM", has_loop), ("SELF_LOOPS", bool(self_loops)), ("DROPOUT", p > 0))
    setup = forward_setup("attention-forward", (_forward_groups_kernel, _forward_kernel), x, rowptr, col, flags)
    tensors = (x, a_src, a_dst, a_edge if has_edge else x, a_loop if has_loop else x, rowptr, col, out, m, z)
    fast = x.is_cuda and BoundLaunches.usable(*tensors[:7])
    setup.run(tensors, _scalars(n_src, num_dst, col.shape[0], H, F, self_loops, slope, p, seed), fast)
    return out, m, z


def _fold(part, out, wl, width):
    """out[row] = sum of the row's partials, in piece order, for the split rows (out: [N, width])."""
    if wl.num_partials and out.numel():
        bf = min(128, next_power_of_2(width))
        _combine_kernel[(wl.split_rows.numel() * cdiv(width, bf),)](
            part, part, out, part, wl.seg_ptr, wl.split_rows, wl.seg_ptr, wl.slot, width,
            REDUCE=SUM, ACC64=part.dtype == torch.float64, TRACK=False, BLOCK_K=_COMBINE_K, BLOCK_F=bf, num_warps=4)


def _backward_setup(x, rowptr, t_rowptr, col, t_col, t_pos, flags: tuple, needs: tuple) -> BackwardSetup:
    """The backward's work lists, grids, constexprs and bound launches (cached, as forward_setup's)."""
    n_src, H, F = x.shape
    need_x, need_src, need_dst, need_edge, need_loop = needs

    def build():
        num_dst = rowptr.shape[0] - 1
        be, hb, fb = _blocks(H, F, col.shape[0], num_dst)
        base = dict(flags, ACC=_acc(x.dtype), BE=be, HB=hb, FB=fb, SEG=SPLIT_EDGES, num_warps=_warps(be, hb, fb))
        rows = _work(rowptr) if num_dst and H else None
        sources = _work(t_rowptr) if n_src and H and (need_x or need_src) else None
        rows_meta = dict(base, PER_EDGE=need_dst or need_edge or need_loop, NEED_DST=need_dst, NEED_EDGE=need_edge,
                         NEED_LOOP=need_loop)
        return BackwardSetup(rows, None if rows is None else ((rows.num_pieces, cdiv(H, hb)), rows_meta), sources,
                             None if sources is None else ((sources.num_pieces, cdiv(H, hb)),
                                                           dict(base, NEED_X=need_x, NEED_SRC=need_src)))

    key = (n_src, H, F, col.shape[0], x.dtype, col.dtype, t_col.dtype, t_pos.dtype, flags, needs, _knobs())
    return cached("attention-backward", (rowptr, t_rowptr), key, build)


def backward(grad_out, out, m, z, x, a_src, a_dst, a_edge, a_loop, rowptr, col, t_rowptr, t_col, t_pos, self_loops,
             slope, p, seed, needs):
    n_src, H, F = x.shape
    need_x, need_src, need_dst = bool(needs[0]), bool(needs[1]), bool(needs[2])
    need_edge, need_loop = bool(needs[3]) and a_edge is not None, bool(needs[4]) and a_loop is not None
    empty = x.new_empty(0)
    g_x = torch.empty_like(x) if need_x else empty
    g_src = torch.empty_like(a_src) if need_src else empty
    g_dst = torch.empty_like(a_dst) if need_dst else empty
    g_edge = torch.zeros_like(a_edge) if need_edge else empty  # skipped self loops keep 0
    g_loop = torch.zeros_like(a_loop) if need_loop else empty
    D = torch.empty_like(m)
    flags = (("HAS_EDGE", a_edge is not None), ("HAS_LOOP_TERM", a_loop is not None), ("SELF_LOOPS", bool(self_loops)),
             ("DROPOUT", p > 0))
    setup = _backward_setup(x, rowptr, t_rowptr, col, t_col, t_pos, flags,
                            (need_x, need_src, need_dst, need_edge, need_loop))
    scalars = _scalars(n_src, rowptr.shape[0] - 1, col.shape[0], H, F, self_loops, slope, p, seed)
    a_edge_, a_loop_ = (a_edge if a_edge is not None else x), (a_loop if a_loop is not None else x)
    fast = x.is_cuda and BoundLaunches.usable(grad_out, x, a_src, a_dst, a_edge_, a_loop_, rowptr, col, t_rowptr,
                                              t_col, t_pos)
    launch, wl = setup.launch, setup.rows
    if wl is not None:
        p_dst = m.new_empty(wl.num_partials, H) if need_dst and wl.num_partials else m
        launch("rows", _backward_rows_kernel, setup.rows_launch[0], (
            grad_out, out, m, z, x, a_src, a_dst, a_edge_, a_loop_, rowptr, col, D, g_dst if need_dst else x,
            g_edge if need_edge else x, g_loop if need_loop else x, wl.seg_row, wl.seg_ptr, wl.slot, p_dst, *scalars),
            setup.rows_launch[1], fast)
        if need_dst:
            setup.fold("fold_dst", p_dst, g_dst, wl, H, fast)
    wl = setup.sources
    if wl is not None:
        parts = wl.num_partials
        p_x = m.new_empty(parts, H, F) if need_x and parts else m
        p_src = m.new_empty(parts, H) if need_src and parts else m
        launch("sources", _backward_sources_kernel, setup.sources_launch[0], (
            grad_out, m, z, x, a_src, a_dst, a_edge_, a_loop_, t_rowptr, t_col, t_pos, D, g_x if need_x else x,
            g_src if need_src else x, wl.seg_row, wl.seg_ptr, wl.slot, p_x, p_src, *scalars),
            setup.sources_launch[1], fast)
        if need_x:
            setup.fold("fold_x", p_x, g_x, wl, H * F, fast)
        if need_src:
            setup.fold("fold_src", p_src, g_src, wl, H, fast)
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
