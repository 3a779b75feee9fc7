"""Triton kernels of ``gnnfuse.gat_attention`` (maths in gnnfuse/ops/attention.py): host side.

Forward: one launch over every target row (attention_forward_kernels.py), as the sum
gather-scatter's one-pass plan: rows of at most GROUP_MAX_DEGREE edges in row groups (several
rows per program, sorted by degree), longer rows cut into pieces of at most FORWARD_SPLIT_EDGES
edges by the gather-scatter's work list (``gather_scatter.work_list``), so the hub rows of
power-law graphs are spread over many programs, both in one id-ordered task list
(``_one_pass_plan``). Online softmax (flash-attention style): a running max m and sum z per head,
the accumulator rescaled by exp(m_old - m_new) when an edge raises the max. A row of one piece
writes its results directly; a split row's pieces leave (m, z, unnormalised acc) each, which
``_merge_pieces_kernel`` merges in piece order (M = max m_k, Z = sum z_k exp(m_k - M),
acc = sum acc_k exp(m_k - M)). No atomics: deterministic.

Backward: one program per (piece of a target row, block of HB heads) in the row pass, one per
(piece of a source row, block of heads) in the transpose pass, pieces of at most SPLIT_EDGES
edges, edges walked in blocks of BE ([BE, HB, FB] tiles: edges x heads x features). Its partials
are plain sums (gradients of alpha_dst, x, alpha_src), folded by the gather-scatter's
``_combine_kernel``.

The @triton.jit kernels are in attention_forward_kernels.py and attention_kernels.py; this module
is the host side (``gnnfuse.edge_softmax``'s kernels are in edge_softmax.py). The forward's and the backward's plans,
grids and constexprs are built once per graph and configuration (forward_setup, _backward_setup,
cached on rowptr) and launched through attention_launches.py's bound launches.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton.language as tl

from .._tensor_cache import cached
from ..constants import HALF_DTYPES, INT32_MAX
from ..reductions import SUM
from ._grid import cdiv, next_power_of_2
from .attention_forward_kernels import FORWARD_LOOP, _forward_one_pass_kernel
from .pair_forward_split import split_for
from .attention_kernels import (
    NEG_INF,
    _backward_rows_kernel,
    _backward_sources_kernel,
)
from ._launch import ALIGN, BoundLaunches
from .attention_launches import BackwardSetup, ForwardSetup, node_setup, shared_empty
from .gather_scatter import work_list
from .gather_scatter_fwd_kernels import _COMBINE_K, _combine_kernel
from .schedule import choose_window, short_rows, task_list
from .work_lists import WorkList

# Longest row piece one program walks. Rows up to this length (nearly all rows of realistic
# graphs) keep one program; a hub row of 100K edges becomes ~400 programs. A multiple of every BE.
SPLIT_EDGES = 256
SPARSE_DEGREE = 8  # graphs of at most this average degree get 4-edge steps (see _blocks)
WIDE_HEAD = 32  # head widths from this one get one-warp programs on short tiles (see _warps)
# Wide heads take at most this many edges a step whatever the degree: a one-warp tile of 8 x 2 x 64
# (see _warps). On an H100, rfc-uniform (average degree 20, 4 x 64), the GATv2 / Transformer
# training step took 1.47 / 1.56 ms against 1.95 / 1.85 at the degree's 32 edges (GAT 1.63 / 1.66;
# benchmarks/results/attention-edge-block_h100_2026-11-23_gpuhost-2248.md).
WIDE_EDGE_BLOCK = 8
# The forward (one launch, attention_forward_kernels.py): rows of at most GROUP_MAX_DEGREE edges in
# row groups, as the sum gather-scatter's one-pass plan, longer rows in pieces of at most
# FORWARD_SPLIT_EDGES (the sum's too; the backward's pieces are SPLIT_EDGES), tiles of GROUP_TILE
# elements [rows, HB, FB].
GROUP_MAX_DEGREE = 64
GROUP_TILE = 1024
FORWARD_SPLIT_EDGES = 1024
FORWARD_AHEAD = None  # where set, overrides every load order (check_attention.py --ahead)


# ---- launchers ------------------------------------------------------------------------------------
def _blocks(H: int, F: int, num_edges: int | None = None, num_rows: int | None = None,
            wide_cap: bool = True) -> tuple[int, int, int]:
    """(BE, HB, FB): all features of a head in one tile, heads packed up to 128 columns, tile <= 4096.

    BE (edges per step) follows the graph's average degree E / rows when given: 4 up to an average
    of SPARSE_DEGREE, else the next power of two above it. Most rows of sparse graphs have a
    handful of edges, and a 32-edge tile over a 7-edge row is mostly masked lanes that still cost
    registers (fewer programs resident to hide the gathers' latency) and instructions. Measured on
    an H100 (benchmarks/results/attention-edge-block_h100_2026-11-23_*.md, arxiv-scale graph of
    average degree 6.9): a GATv2 / Transformer training step took 3.5 ms at BE 4, 5.0 at 8, 8.2 at
    16 and 11 at 32 (8 heads x 8); at 4 x 64 with one warp (see _warps) BE 4 beat BE 8 by 1.2-1.25x
    (training step). ``wide_cap`` (the attention backwards): heads of WIDE_HEAD features or more take
    at most WIDE_EDGE_BLOCK edges a step (see there)."""
    fb = next_power_of_2(F)
    hb = max(1, min(next_power_of_2(H), 128 // fb))
    be = max(4, min(32, 4096 // (hb * fb)))
    if num_edges is not None and num_rows:
        average = -(-num_edges // num_rows)
        be = min(be, 4 if average <= SPARSE_DEGREE else next_power_of_2(average))
    if wide_cap and fb >= WIDE_HEAD:  # wide heads: at most WIDE_EDGE_BLOCK edges a step (the attention kernels)
        be = min(be, WIDE_EDGE_BLOCK)
    return be, hb, fb


def _warps(be: int, hb: int, fb: int) -> int:
    """Warps per program of the backward kernels.
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


def _knobs() -> tuple:
    """The backward's tile choices above, as functions: part of its cached setups' key, so that a
    benchmark or test swapping one of them (bench_attention.py's sweeps) gets a setup made with them.
    (The forward's setups are keyed by _forward_knobs.)"""
    return (_blocks, _warps)


def _acc(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _scalars(n_src, num_dst, num_edges, H, F, self_loops, slope, p, seed) -> tuple:
    """The kernels' runtime scalars: self loops, edges, heads, width, slope, seed, dropout threshold, 1 / keep."""
    return (min(n_src, num_dst) if self_loops else 0, num_edges, H, F, float(slope), int(seed),
            int(round(p * (1 << 24))), 1.0 / (1.0 - p))


def _work(rowptr):
    """The row pieces of ``rowptr`` (cached on it) and the partial buffers' row count."""
    return work_list(rowptr, SPLIT_EDGES)


class OnePass(NamedTuple):
    """The one-pass forward's plan for one graph and width (cached on rowptr): the work list of the
    long rows (pieces of at most ``seg`` edges), the short rows in row-group order, the task list,
    and the tile [rows, hb, fb] with its warps."""
    wl: WorkList
    short: torch.Tensor
    tasks: torch.Tensor
    rows: int
    hb: int
    fb: int
    seg: int
    warps: int
    ahead: int  # the loop's (AHEAD, MAXNREG): FORWARD_LOOP's (see _forward_loop) unless a configuration set them
    maxnreg: int
    split: int = 1  # the pair loop's SPLIT (FORWARD_LOOP's 5th element; pair_forward_split.py)


def _one_pass_config(H: int, F: int, pair: bool = False, loop: tuple = (0, 0, 0)) -> dict:
    """Tile of the one-pass forward [rows, HB heads, FB features] of GROUP_TILE elements, 4 warps; rows
    of up to GROUP_MAX_DEGREE edges in row groups, longer rows in pieces of at most FORWARD_SPLIT_EDGES.
    Narrow heads (FB <= 16): 64 columns (256 float32 bytes, the sum's one-pass tile at the same width),
    16 rows. Wide heads: 4 rows of up to 256 columns for GAT, 8 rows of up to 128 for GATv2 and dot
    (``pair``). On an H100 (benchmarks/results/archive/attention-forward_h100_2026-11-23_explore.md,
    device time, arxiv-like): at 8 x 8, 64 columns x 16 rows with 4 warps against 8 warps (fewer
    layout moves in the loop, measured slower) GAT 157 vs 336 us, GATv2 166 vs 184, dot 133 vs 169;
    at 4 x 64, 4 heads x 4 rows / 2 heads x 8 rows / 1 head x 16 rows: GAT 654 / 707 / 763 us,
    GATv2 631 / 562 / 725, dot 519 / 473 / 523; pieces of 256 edges instead of 1024 and row groups
    up to 16 edges instead of 64 were slower everywhere (rechecked in
    benchmarks/results/archive/attention-forward_h100_2026-11-23_final.md). ``loop``: the loop table's
    (AHEAD, MAXNREG, ROWS[, HEADS[, SPLIT]]) for the kernel (_forward_loop); ROWS 0 keeps the rows above, HEADS
    (0 or absent) the heads above (at most H, and only up to 256 columns); SPLIT (0 or absent: 1) the pair loop's
    vectors a thread holds of one head (pair_forward_split.split_for says where it applies)."""
    fb = next_power_of_2(F)
    columns = 64 if fb <= 16 else (128 if pair else 256)
    ahead, maxnreg, rows, heads, split = (*loop, 0, 0)[:5]
    hb = max(1, min(next_power_of_2(H), columns // fb))
    if heads and heads * fb <= 256:  # (the widest tile measured; wider heads keep the default)
        hb = min(heads, next_power_of_2(H))
    seg = FORWARD_SPLIT_EDGES
    return dict(hb=hb, rows=rows or _one_pass_rows(hb, fb), warps=4, seg=seg, short_max=min(GROUP_MAX_DEGREE, seg),
                ahead=ahead, maxnreg=maxnreg, split=split or 1)


def _one_pass_rows(hb: int, fb: int) -> int:
    """Rows of a row group, and lanes of a piece, of the one-pass forward: GROUP_TILE elements, 2 to 16."""
    return max(2, min(16, GROUP_TILE // (hb * fb)))


def _one_pass_plan(rowptr, col, num_src, H, F, itemsize, pair=False, loop=(0, 0, 0)) -> OnePass:
    """The one-pass forward's plan (``_one_pass_config``'s tile) for this graph, cached on rowptr. The
    short rows come sorted by decreasing degree, within windows of consecutive ids where the graph's
    ids carry locality and the features do not fit in L2 (schedule.choose_window: the sum plan's
    rule at the same width); the task list puts each window's long-row pieces before its row groups."""
    cfg = _one_pass_config(H, F, pair, loop)

    def build():
        short_max, seg, rows = cfg["short_max"], cfg["seg"], cfg["rows"]
        window = choose_window(rowptr, col, num_src, H * F, itemsize, rowptr.device)[0]
        wl = work_list(rowptr, seg, short_max)
        short = short_rows(rowptr, short_max, window)
        tasks = task_list(rowptr, short, wl, rows, seg, short_max, window)
        return OnePass(wl, short, tasks, rows, cfg["hb"], next_power_of_2(F), seg, cfg["warps"], cfg["ahead"],
                       cfg["maxnreg"], cfg.get("split", 1))

    return cached("attention-one-pass", (rowptr,), (num_src, H, F, itemsize, tuple(sorted(cfg.items()))), build)


def _forward_knobs() -> tuple:
    """The forward's plan choices (functions and limits of this module) as part of its setups' key:
    a benchmark or test that swaps one (bench_attention.py's sweeps, benchmarks/gpu/attention_forward.py)
    gets a setup made with it, without working the configuration out again on every call."""
    return (_one_pass_config, _one_pass_rows, GROUP_MAX_DEGREE, FORWARD_SPLIT_EDGES, GROUP_TILE, FORWARD_AHEAD,
            tuple(FORWARD_LOOP.items()))


def _forward_loop(F: int, flags: tuple, pair: bool, dtype: torch.dtype) -> tuple:
    """The forward loop's (AHEAD, MAXNREG, ROWS[, HEADS]) for heads of F features, the kernel's ``flags`` and
    the features' dtype: FORWARD_LOOP's entry for the width, the kind of logit and the path (float32 or a half
    type, with or without dropout; float16's own entry where it has one; "float32-edge": the pair kernels'
    [E, H, F] edge features in float32 without dropout; "float32-edge-loop[-dropout]": GAT's [E, H] edge terms
    with the self loops' terms, float32), (0, 0, 0) where it has none (GAT's edge terms without the loops'
    or the loops' without edge terms, the other edge-feature paths, float64, entries not measured)."""
    f = dict(flags)
    edge, loop, drop = f.get("HAS_EDGE"), f.get("HAS_LOOP_TERM"), f.get("DROPOUT")
    gat_edge_loop = not pair and edge and loop and dtype == torch.float32
    if (loop and not gat_edge_loop) or not (dtype == torch.float32 or dtype in HALF_DTYPES):
        return 0, 0, 0
    if edge and not (gat_edge_loop or (pair and dtype == torch.float32 and not drop)):
        return 0, 0, 0
    logit = ("gatv2" if f.get("GATV2") else "dot") if pair else "gat"
    path = ("float32" if dtype == torch.float32 else "half") + ("-dropout" if drop else "")
    if edge:
        path = ("float32-edge-loop" + ("-dropout" if drop else "")) if gat_edge_loop else "float32-edge"
    narrow = next_power_of_2(F) <= 16
    own = FORWARD_LOOP.get((narrow, logit, "float16" + path[4:])) if dtype == torch.float16 else None
    return own or FORWARD_LOOP.get((narrow, logit, path), (0, 0, 0))


def _index_type(n_src: int, num_dst: int, num_edges: int, H: int, FB: int, flags: tuple, pair: bool):
    """The forward's index type: tl.int32 where every row, edge position and element offset the kernel
    forms fits (features and output [N, H, FB] with the tile's FB, edge ids and the self loops' ids E + i,
    GAT's edge terms [E, H]; the pair kernels' edge features [E + N, H, F] keep their int64 rows), else
    tl.int64. Addresses and compares in int32 take half the integer instructions of the loop."""
    f = dict(flags)
    largest = max(n_src, num_dst) * H * FB
    if f.get("HAS_EDGE") and not pair:
        largest = max(largest, num_edges * H)
    return tl.int32 if max(largest, num_edges + num_dst + 1) <= INT32_MAX else tl.int64


def forward_setup(kind: str, kernel, features, rowptr, col, flags: tuple, pair: bool = False) -> ForwardSetup:
    """The forward's plan (_one_pass_plan), grid, constexprs and bound launches for this graph, the
    [N_src, H, F] ``features``' shape and dtype and the kernel's ``flags`` ((name, value) pairs),
    cached on rowptr (``kind``: the cache's name for ``kernel``, GAT's or the pair attention's)."""
    n_src, H, F = features.shape
    dtype = features.dtype

    def build():
        plan = _one_pass_plan(rowptr, col, n_src, H, F, dtype.itemsize, pair, _forward_loop(F, flags, pair, dtype))
        ahead = plan.ahead if FORWARD_AHEAD is None else FORWARD_AHEAD
        maxnreg = plan.maxnreg
        meta = dict(flags, ACC=_acc(dtype), HB=plan.hb, FB=plan.fb, R=plan.rows, SEG=plan.seg, DENSE=F == plan.fb,
                    AHEAD=ahead, IDX=_index_type(n_src, rowptr.shape[0] - 1, col.shape[0], H, plan.fb, flags, pair),
                    num_warps=plan.warps)
        if maxnreg:
            meta["maxnreg"] = maxnreg
        if pair:
            meta["SPLIT"] = split_for(plan.split, F, plan.fb, plan.hb, plan.rows, plan.warps, dtype.itemsize, flags)
        return ForwardSetup(kernel, plan.wl, plan.short, plan.tasks, cdiv(H, plan.hb), meta,
                            dict(ACC=meta["ACC"], BK=32, HB=plan.hb, FB=plan.fb))

    key = (n_src, H, F, dtype, col.dtype, col.shape[0], flags, pair, _forward_knobs())
    return cached(kind, (rowptr,), key, build)


def forward(x, a_src, a_dst, a_edge, a_loop, rowptr, col, t_rowptr, t_col, t_pos, self_loops, slope, p, seed,
            memo=None, heads=None):
    """The op's forward; ``memo``: a one-node route's (attention_launches.node_setup), where its setup is kept;
    ``heads``: x comes as contiguous [N, heads * F] (the route's product, no view to heads made)."""
    n_src, H, F = x.shape if heads is None else (x.shape[0], heads, x.shape[1] // heads)
    num_dst = rowptr.shape[0] - 1
    out = x.new_empty(num_dst, H, F)
    m = x.new_empty(num_dst, H, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
    z = torch.empty_like(m)
    if not (num_dst and H):
        return out, m, z
    has_edge, has_loop = a_edge is not None, a_loop is not None
    if memo is not None and not (has_edge or has_loop):  # (the one-node route's calls)
        setup = node_setup(memo, ("attention-forward", n_src, H, F, x.dtype, bool(self_loops), p > 0),
                           _forward_knobs(), lambda: _forward_setup(x.view(n_src, H, F), rowptr, col, False, False,
                                                                    self_loops, p))
    else:
        setup = _forward_setup(x if heads is None else x.view(n_src, H, F), rowptr, col, has_edge, has_loop,
                               self_loops, p)
    tensors = (x, a_src, a_dst, a_edge if has_edge else x, a_loop if has_loop else x, rowptr, col, out, m, z)
    fast = x.is_cuda and BoundLaunches.enabled() and ALIGN
    setup.run(tensors, _scalars(n_src, num_dst, col.shape[0], H, F, self_loops, slope, p, seed), fast)
    return out, m, z


def _forward_setup(x, rowptr, col, has_edge: bool, has_loop: bool, self_loops, p) -> ForwardSetup:
    flags = (("HAS_EDGE", has_edge), ("HAS_LOOP_TERM", has_loop), ("SELF_LOOPS", bool(self_loops)), ("DROPOUT", p > 0))
    return forward_setup("attention-forward", _forward_one_pass_kernel, x, rowptr, col, flags)


def _fold(part, out, wl, width):
    """out[row] = sum of the row's partials, in piece order, for the split rows (out: [N, width])."""
    if wl.num_partials and out.numel():
        bf = min(128, next_power_of_2(width))
        _combine_kernel[(wl.split_rows.numel() * cdiv(width, bf),)](
            part, part, out, part, wl.seg_ptr, wl.split_rows, wl.seg_ptr, wl.slot, width,
            REDUCE=SUM, ACC64=part.dtype == torch.float64, TRACK=False, BLOCK_K=_COMBINE_K, BLOCK_F=bf, num_warps=4)


def _backward_setup(x, rowptr, t_rowptr, col, t_col, t_pos, flags: tuple, needs: tuple,
                    fold_att: bool = False) -> BackwardSetup:
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
                                                           dict(base, NEED_X=need_x, NEED_SRC=need_src,
                                                                FOLD_ATT=fold_att)))

    key = (n_src, H, F, col.shape[0], x.dtype, col.dtype, t_col.dtype, t_pos.dtype, flags, needs, fold_att, _knobs())
    return cached("attention-backward", (rowptr, t_rowptr), key, build)


def backward(grad_out, out, m, z, x, a_src, a_dst, a_edge, a_loop, rowptr, col, t_rowptr, t_col, t_pos, self_loops,
             slope, p, seed, needs, fold_att=None, memo=None, heads=None):
    """The op's backward. ``fold_att``: optional (att_src, att_dst) [H, F], contiguous, where x is a
    projection h whose terms are a_src = h . att_src and a_dst = h . att_dst over one node set (a
    layer's one-node route; the registered op passes none): the x gradient returned is then h's
    whole gradient, the terms' parts folded in by the transpose pass (_backward_sources_kernel),
    and needs must ask for x's, a_src's and a_dst's. ``memo``: as forward's (the gradients not asked for
    are then one shared empty tensor, which that route drops); ``heads``: as forward's (grad_out
    contiguous, any shape of its size; x's gradient then [N, heads * F])."""
    n_src, H, F = x.shape if heads is None else (x.shape[0], heads, x.shape[1] // heads)
    need_x, need_src, need_dst = bool(needs[0]), bool(needs[1]), bool(needs[2])
    need_edge, need_loop = bool(needs[3]) and a_edge is not None, bool(needs[4]) and a_loop is not None
    if fold_att is not None and not (need_x and need_src and need_dst and n_src == rowptr.shape[0] - 1):
        raise ValueError("fold_att needs x's, a_src's and a_dst's gradients and one node set for both roles")
    node = memo is not None and a_edge is None and a_loop is None  # (the one-node route's calls)
    empty = shared_empty(x) if node else x.new_empty(0)
    g_x = torch.empty_like(x) if need_x else empty
    g_src = torch.empty_like(a_src) if need_src else empty
    g_dst = torch.empty_like(a_dst) if need_dst else empty
    g_edge = torch.zeros_like(a_edge) if need_edge else empty  # skipped self loops keep 0
    g_loop = torch.zeros_like(a_loop) if need_loop else empty
    D = torch.empty_like(m)
    flags = (("HAS_EDGE", a_edge is not None), ("HAS_LOOP_TERM", a_loop is not None), ("SELF_LOOPS", bool(self_loops)),
             ("DROPOUT", p > 0))
    needs_ = (need_x, need_src, need_dst, need_edge, need_loop)
    if node:
        setup = node_setup(memo, ("attention-backward", n_src, H, F, x.dtype, flags, needs_, fold_att is not None),
                           _knobs(), lambda: _backward_setup(x.view(n_src, H, F), rowptr, t_rowptr, col, t_col, t_pos,
                                                             flags, needs_, fold_att is not None))
    else:
        setup = _backward_setup(x if heads is None else x.view(n_src, H, F), rowptr, t_rowptr, col, t_col, t_pos,
                                flags, needs_, fold_att is not None)
    att_s, att_d = fold_att if fold_att is not None else (x, x)
    scalars = _scalars(n_src, rowptr.shape[0] - 1, col.shape[0], H, F, self_loops, slope, p, seed)
    a_edge_, a_loop_ = (a_edge if a_edge is not None else x), (a_loop if a_loop is not None else x)
    fast = x.is_cuda and BoundLaunches.enabled() and ALIGN
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
            g_src if need_src else x, att_s, att_d, g_dst if need_dst else x, wl.seg_row, wl.seg_ptr, wl.slot, p_x, p_src, *scalars),
            setup.sources_launch[1], fast)
        if need_x:
            setup.fold("fold_x", p_x, g_x, wl, H * F, fast)
        if need_src:
            setup.fold("fold_src", p_src, g_src, wl, H, fast)
    return g_x, g_src, g_dst, g_edge, g_loop
