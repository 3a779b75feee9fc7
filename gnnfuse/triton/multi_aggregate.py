"""Triton forward of ``gnnfuse::multi_aggregate`` (see gnnfuse/ops/multi_aggregate.py): the host side.

The kernels (gnnfuse/triton/multi_aggregate_kernels.py) follow the gather-scatter forward's hybrid
plan and reuse its per-graph pieces, cached on the rowptr tensor: the plan of a "sum" pass
(tiles, short-row limit, row order), the degree-sorted short rows and the work list that cuts
longer rows into pieces, and the id-ordered task list that runs both in one launch. Short rows go
to the row-group kernel, the others to the CSR kernel (both in one launch where the sum plan runs
one and the graph has long rows), split (hub) rows through a second, ordered pass. Tiles are the
multi kernels' own (:func:`multi_tiles`); the setup of a graph is cached (:class:`_MultiSetup`).
Every statistic the list needs stays in registers, so the pass reads each source row once, as one
sum pass does.

Backward (:func:`backward_x`, the common case: x's gradient, no edge weights, float32/64, each
reduction once, no "mul", non-deterministic algorithms allowed; the op module runs the general
gather-scatter passes otherwise): one kernel forms the per-target coefficients of the linear part
(sum/mean/var/std), one sum pass over the transpose carries them to the sources, one
element-wise multiply-add, and one kernel adds max's and min's gradients to their winners'
sources with atomics (the order of those additions varies from run to run).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton

from ..reductions import CODES, MAX, MEAN, MIN, MUL, STD, SUM, VAR
from .._tensor_cache import cached
from ..fresh_graph import is_fresh
from ._launch import BoundLaunches
from .gather_scatter import _forward_setup, _mean_divisor, autotune_enabled, infer, plan_for
from .gather_scatter_dispatch import Plan
from .gather_scatter_fwd_kernels import _COMBINE_K
from .multi_aggregate_bwd_kernels import _coefficients_kernel, _winners_grad_kernel
from .multi_aggregate_kernels import (
    NSTAT,
    _multi_combine_kernel,
    _multi_csr_kernel,
    _multi_one_pass_kernel,
    _multi_rowgroup_kernel,
)


def _meta(unique: list[int], num_arg: int, has_w: bool, acc64: bool) -> dict:
    """The constexprs every kernel shares: which statistics to keep and where each reduction goes."""
    at = {code: unique.index(code) if code in unique else -1 for code in CODES.values()}
    return dict(ACC64=acc64, TRACK=num_arg > 0, HAS_W=has_w,
                NEED_S=any(c in unique for c in (SUM, MEAN, VAR, STD)), NEED_Q=VAR in unique or STD in unique,
                NEED_MAX=MAX in unique, NEED_MIN=MIN in unique, NEED_MUL=MUL in unique, K=len(unique),
                SUM_AT=at[SUM], MEAN_AT=at[MEAN], MAX_AT=at[MAX], MIN_AT=at[MIN], MUL_AT=at[MUL], VAR_AT=at[VAR],
                STD_AT=at[STD], MIN_SLOT=1 if MAX in unique else 0)


@dataclass(frozen=True)
class Tuning:
    """What the multi kernels do beyond the "sum" plan they reuse (benchmarks/bench_aggregation_variants.py
    times the alternatives against a sum pass). The hints and the register cap leave results bitwise the
    same; retile, seg and combine_pieces change the summation order (within rounding; winners unchanged).

    retile: the multi kernels' own tiles from WIDE_ROW_BYTES (:func:`multi_tiles`), else the sum plan's.
    x_evict / out_evict: cache eviction hints of the gathered x rows and of the output stores
    ("", "evict_last", "evict_first").
    max_registers: a register cap per thread (Triton's ``maxnreg``; 0: the compiler's choice).
    seg: the longest piece of a long row (0: the sum plan's); combine_pieces: pieces of a split row
    the combine pass folds per step (a power of two).

    On an H100 (benchmarks/results/aggregation-variants_h100_2026-11-23.md, four reductions, F = 32-128,
    six graphs) no hint or register cap beat the defaults: evict_first stores were within noise,
    evict_last gathers 3-8% slower on the suite graphs (two more registers, one program fewer per SM).
    On an H200 (aggregation-variants_h200_2026-11-23_combine.md) pieces of 512 edges were slower on
    arxiv-like, and one piece per combine step (the earlier kernel) 1.2-1.44x slower on graphs with hubs."""

    retile: bool = True
    x_evict: str = ""
    out_evict: str = ""
    max_registers: int = 0
    seg: int = 0
    combine_pieces: int = _COMBINE_K


DEFAULT_TUNING = Tuning()


def forward(x: torch.Tensor, rowptr: torch.Tensor, col: torch.Tensor, weight: torch.Tensor | None,
            codes: list[int], track_arg: bool, plan: Plan | None = None,
            tuning: Tuning | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [N, K*F], arg [A, N, F] or [0, 0, 0]) as the C++ kernel. ``plan`` overrides the
    gather-scatter plan (tests force hub splitting with a small ``seg``), ``tuning`` the kernels'
    settings (default: DEFAULT_TUNING)."""
    num_rows, F = rowptr.shape[0] - 1, x.shape[1]
    unique = list(dict.fromkeys(codes))  # a repeated reduction is computed once, copied after
    num_arg = ((MAX in unique) + (MIN in unique)) if track_arg else 0
    out = x.new_empty(num_rows, len(unique) * F)
    arg = rowptr.new_empty((num_arg, num_rows, F) if num_arg else (0, 0, 0))
    if num_rows and F:
        _launch(x, rowptr, col, weight, out, arg, unique, num_arg, plan, tuning or DEFAULT_TUNING)
    else:  # nothing to launch: no rows, or no features
        out.zero_()
        arg.fill_(-1)
    if len(unique) != len(codes):
        pick = torch.tensor([unique.index(c) for c in codes], device=x.device)
        out = out.view(num_rows, len(unique), F).index_select(1, pick).reshape(num_rows, len(codes) * F)
    return out, arg


# Row bytes from which the multi kernels take tiles of their own (float32 F > 32). Their statistics
# (sum, sum of squares, max, min, plus int32 winners when tracked) need 150-230 registers a thread
# in the sum plan's one-launch tiles ([16, 64] row groups and [32, 64] pieces at 4 warps; Triton 3.9
# for sm_90, cuobjdump): 2-3 programs per SM. With 8 warps and 16-edge pieces, 76 (92 tracked). On an
# H200 (benchmarks/results/aggregation-plans_h200_2026-11-23.md, kernel time / one sum pass, F=64):
# 3.18x -> 2.84x (arxiv-like) and 2.50x -> 1.57x (products-like); tracking winners 6.51x -> 4.36x
# and 5.55x -> 2.54x.
WIDE_ROW_BYTES = 128


def multi_tiles(plan: Plan, F: int, itemsize: int) -> Plan:
    """The sum plan's schedule (rows, pieces, task list, windows) with tiles for the heavier
    multi-aggregation kernels: 8 warps per row group and at most 16 edges per long-row tile from
    WIDE_ROW_BYTES-byte rows (the one-launch kernel runs both with the row groups' warps)."""
    if F * itemsize <= WIDE_ROW_BYTES:
        return plan
    return Plan(**{**plan.__dict__, "group_warps": 8, "block_e": min(plan.block_e, 16),
                   "num_warps": max(plan.num_warps, 4)})


class _MultiSetup:
    """What a forward call needs besides its tensors, for one graph and one (F, dtype, reductions,
    weighted, tracked) case: the "sum" pass's setup (plan, work list, short rows, task list; see
    gather_scatter._ForwardSetup), this op's grids and constexprs and the bound launches. Cached on
    the graph (see _multi_setup), so a repeated call does no planning in Python."""

    def __init__(self, base, F: int, unique: list[int], num_arg: int, has_w: bool, acc64: bool, itemsize: int,
                 retile: bool, tuning: Tuning):
        plan = multi_tiles(base.plan, F, itemsize) if retile and tuning.retile else base.plan
        self.plan, self.short, self.wl = plan, base.short, base.wl
        # the one-launch task list only where there are long rows to run next to the row groups: with
        # none (products-like, every row <= short_max) the row-group kernel alone was as fast untracked
        # and 1.2x faster tracking winners (H200, benchmarks/results/aggregation-plans_h200_2026-11-23.md)
        self.tasks = base.tasks if self.wl.num_pieces else None
        self.launches = BoundLaunches()
        meta = dict(_meta(unique, num_arg, has_w, acc64), OUT_EVICT=tuning.out_evict)
        options = dict(maxnreg=tuning.max_registers) if tuning.max_registers else {}
        group_block_f = plan.group_block_f or plan.block_f
        nft = triton.cdiv(F, plan.block_f)
        if self.short is not None and self.short.numel():
            self.rowgroup_grid = (triton.cdiv(self.short.numel(), plan.group_rows), triton.cdiv(F, group_block_f))
            self.rowgroup_meta = dict(meta, ROWS=plan.group_rows, BLOCK_F=group_block_f, X_EVICT=tuning.x_evict,
                                      num_warps=plan.group_warps, **options)
        if self.tasks is not None:  # one launch: the long rows' pieces take the row groups' tiles
            self.one_pass_grid = (self.tasks.numel(), triton.cdiv(F, group_block_f))
            self.one_pass_meta = dict(meta, ROWS=plan.group_rows, SEG=plan.seg, BLOCK_E=plan.block_e,
                                      BLOCK_F=group_block_f, X_EVICT=tuning.x_evict, num_warps=plan.group_warps,
                                      **options)
        self.csr_grid = (self.wl.num_pieces * nft,)
        self.csr_meta = dict(meta, SEG=plan.seg, BLOCK_E=plan.block_e, BLOCK_F=plan.block_f, X_EVICT=tuning.x_evict,
                             num_warps=plan.num_warps, **options)
        combine = dict(meta)
        del combine["HAS_W"]
        split = getattr(self.wl, "split_rows", None)
        self.num_split = 0 if split is None else split.numel()
        self.combine_grid = (self.num_split * nft,)
        self.combine_meta = dict(combine, BLOCK_K=tuning.combine_pieces, BLOCK_F=plan.block_f, num_warps=4)


def _multi_setup(x, rowptr, col, weight, unique, num_arg, plan, tuning) -> _MultiSetup:
    """The setup of this call: cached on rowptr (keyed like the sum pass's, plus the reductions);
    built afresh for an explicit ``plan`` and for a graph used once (gnnfuse.fresh_graph: every row
    in row groups, no host synchronisation)."""
    F, has_w, acc64 = x.shape[1], weight is not None, x.dtype == torch.float64
    fresh = is_fresh(rowptr)

    def build():
        p = plan
        if p is None and tuning.seg and not fresh:  # the sum plan with other pieces (own work and task lists)
            p = replace(plan_for(x, rowptr, col, "sum", "hybrid"), seg=tuning.seg)
        base = _forward_setup(x, rowptr, col, weight, "sum", False, "hybrid", p)
        return _MultiSetup(base, F, unique, num_arg, has_w, acc64, x.element_size(), plan is None, tuning)

    if plan is not None or fresh:
        return build()
    key = (F, x.dtype, tuple(unique), has_w, num_arg, col.numel(), torch.are_deterministic_algorithms_enabled(),
           autotune_enabled() and x.is_cuda, tuning)
    return cached("multi-forward", (rowptr,), key, build)


def _launch(x, rowptr, col, weight, out, arg, unique, num_arg, plan, tuning):
    F = x.shape[1]
    num_rows = rowptr.shape[0] - 1
    setup = _multi_setup(x, rowptr, col, weight, unique, num_arg, plan, tuning)
    w = weight if weight is not None else x  # dummy pointer when HAS_W is False
    arg_p = arg if num_arg else col
    launch = setup.launches
    fast = x.is_cuda and launch.usable(x, col, w, out, arg_p)
    short, wl = setup.short, setup.wl
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    part = torch.empty(wl.num_partials, NSTAT, F, dtype=acc, device=x.device) if wl.num_partials else out
    parg = torch.empty(wl.num_partials, 2, F, dtype=torch.long, device=x.device) if wl.num_partials and num_arg \
        else col
    if setup.tasks is not None and setup.tasks.numel():
        launch("one_pass", _multi_one_pass_kernel, setup.one_pass_grid,
               (x, short, short.numel(), setup.tasks, rowptr, col, w, out, arg_p, part, parg, wl.seg_row, wl.seg_ptr,
                wl.slot, num_rows, F), setup.one_pass_meta, fast)
    elif short is not None and short.numel():
        launch("rowgroup", _multi_rowgroup_kernel, setup.rowgroup_grid,
               (x, short, rowptr, col, w, out, arg_p, short.numel(), num_rows, F), setup.rowgroup_meta, fast)
    if wl.num_pieces == 0:
        return
    if setup.tasks is None:
        launch("csr", _multi_csr_kernel, setup.csr_grid,
               (x, rowptr, col, w, out, arg_p, part, parg, wl.seg_row, wl.seg_ptr, wl.slot, num_rows, F),
               setup.csr_meta, fast)
    if setup.num_split:
        launch("combine", _multi_combine_kernel, setup.combine_grid,
               (part, parg, out, arg_p, rowptr, wl.split_rows, wl.seg_ptr, wl.slot, num_rows, F), setup.combine_meta,
               fast)


def fast_backward_applies(x, weight, codes, need_w) -> bool:
    return (x.dtype in (torch.float32, torch.float64) and weight is None and not need_w and MUL not in codes
            and len(set(codes)) == len(codes) and not torch.are_deterministic_algorithms_enabled())


def backward_x(grad_out, out, x, rowptr, col, transpose, arg, codes, mean=None) -> torch.Tensor:
    """x's gradient (see the module docstring for when this applies); ``mean``: [N, F] row means
    when var/std are asked for without "mean" (the op module computes them)."""
    t_rowptr, t_col, _ = transpose
    N, F, K = rowptr.shape[0] - 1, x.shape[1], len(codes)
    at = {code: codes.index(code) if code in codes else -1 for code in CODES.values()}
    has_c = any(at[c] >= 0 for c in (SUM, MEAN, VAR, STD))
    has_d = at[VAR] >= 0 or at[STD] >= 0
    rows, block_f = 16, min(max(16, triton.next_power_of_2(F)), 64)
    grid = (triton.cdiv(N, rows), triton.cdiv(F, block_f))
    if has_c and N:
        cd = torch.empty(N, 2 * F if has_d else F, dtype=x.dtype, device=x.device)
        _coefficients_kernel[grid](grad_out, out, mean if mean is not None else out, _mean_divisor(rowptr, x.dtype),
                                   cd, N, F, K=K, SUM_AT=at[SUM], MEAN_AT=at[MEAN], VAR_AT=at[VAR], STD_AT=at[STD],
                                   HAS_D=has_d, ROWS=rows, BLOCK_F=block_f, num_warps=4)
        moved = infer(cd, t_rowptr, t_col, None, "sum")  # [N_src', W]: the coefficients summed per source
        part = torch.addcmul(moved[:, :F], x[:moved.shape[0]], moved[:, F:]) if has_d else moved
        if part.shape[0] == x.shape[0]:
            grad_x = part
        else:
            grad_x = torch.zeros_like(x)
            grad_x[:part.shape[0]] = part
    else:
        grad_x = torch.zeros_like(x)
    if (at[MAX] >= 0 or at[MIN] >= 0) and N:
        _winners_grad_kernel[grid](grad_out, arg, col, grad_x, N, F, K=K, MAX_AT=at[MAX], MIN_AT=at[MIN],
                                   MIN_SLOT=1 if at[MAX] >= 0 else 0, ROWS=rows, BLOCK_F=block_f, num_warps=4)
    return grad_x
