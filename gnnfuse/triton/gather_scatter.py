"""Triton kernels of ``gnnfuse::gather_scatter`` (forward) and ``gather_scatter_backward``.

This module is the host side ("check, allocate, launch") that gnnfuse/ops/gather_scatter.py calls
(through the torch.library op or its eager route): per-graph setups, cached, for the forward
(_ForwardSetup, here) and the backward (gather_scatter_backward.py, reached as ``backward``), both
planned by the dispatch module's plan builder on the graph each kernel walks, and both launching
through one path (each setup's _launch.BoundLaunches: device guard, then the version-fenced fast
launch or Triton's own). The @triton.jit kernels live in gather_scatter_fwd_kernels.py and
gather_scatter_bwd_kernels.py; tile choice in gather_scatter_dispatch.py, the row schedule in
schedule.py, work lists in work_lists.py.

Forward kernels (see the dispatch module for when each runs):
  * ``_rowgroup_kernel`` (the default "hybrid" plan's short rows): rows of at most short_max
    edges, sorted by degree, ``ROWS`` per program; step j gathers the j-th edge of each row.
    The hybrid plan sends the remaining rows through the CSR kernel below; from 256-byte rows
    (``plan.one_pass``) ``_one_pass_kernel`` runs both as one launch over an id-ordered task list
    (schedule.task_list), so a window's long and short rows share the source rows they read.
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
Backward (no E x F tensor). x's gradient takes one of three routes: for sum/mean, a sum forward
over the cached transpose (the forward's kernels, setup and plan, on the transpose); for max/min,
``_winner_scatter_kernel`` adds each winner's gradient to its source row with relaxed atomics;
under torch.use_deterministic_algorithms(True), and for mul, ``_csr_bwd_x_kernel`` walks the
transpose instead (its own work list: dm = d out / d message; grad_x[j] += dm * w).
``_grad_w_kernel`` is a per-edge dot over features in CSR order; ``_mul_stats_kernel``
precomputes, for reduce="mul", the product of non-zero messages and the zero count per
(row, feature), on the CSR's work list.
"""
from __future__ import annotations

import torch

from .. import config
from .._tensor_cache import cached
from ..constants import HALF_DTYPES
from ..fresh_graph import NoPieces, fresh_plan, fresh_rows, is_fresh
from ..reductions import CODES
from ._grid import cdiv
from ._launch import BoundLaunches
from .gather_scatter_dispatch import Plan, choose, coo_configs, csr_configs, hybrid_configs
from .gather_scatter_fwd_kernels import (
    _COMBINE_K,
    _coo_kernel,
    _combine_kernel,
    _csr_fwd_kernel,
    _one_pass_kernel,
    _rowgroup_kernel,
)
from .schedule import choose_window, short_rows, task_list
from .work_lists import WorkList, expanded_rows, work_list  # noqa: F401  (work_list: also for other Triton ops)
from .work_lists import mean_divisor as _mean_divisor


# fresh graphs (used once: a sampled mini-batch; see gnnfuse.fresh_graph)
def _fresh_setup(rowptr, E, F, dtype, reduce, has_w, tracks) -> _ForwardSetup:
    """The setup of a graph used once: the default plan's row-group tiles for every row (rows longer
    than the plan's short_max included), no work list, no locality statistic, no host sync."""
    plan = fresh_plan(choose(reduce, rowptr.numel() - 1, E, F, dtype, kernel="hybrid"))
    return _ForwardSetup(plan, rowptr, E, F, dtype, reduce, has_w, tracks, rows=fresh_rows(rowptr))


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
    return config.enabled("GNNFUSE_AUTOTUNE")


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
                          warmup=5, rep=25, return_mode="median")
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
                 has_w: bool, tracks: bool, rows: torch.Tensor | None = None):
        # (holds tensors derived from rowptr, never rowptr itself: the cache entry must die with it)
        self.plan = plan
        self.launches = BoundLaunches()
        nft = cdiv(F, plan.block_f)
        acc64 = dtype == torch.float64
        code = CODES[reduce]
        self.atomic = plan.kernel in ("coo", "atomic") and reduce in ("sum", "mean")
        if self.atomic:
            self.rows = expanded_rows(rowptr, E) if E else None
            self.coo_grid = (cdiv(E, plan.block_e) * nft,)
            self.coo_meta = dict(HAS_W=has_w, SEGMENTED=plan.kernel == "coo", ACC64=acc64, BLOCK_E=plan.block_e,
                                 BLOCK_F=plan.block_f, num_warps=plan.num_warps)
            return
        hybrid = plan.kernel == "hybrid"
        self.tasks: torch.Tensor | None = None  # the one-launch plan's task list (set below when it applies)
        self.wl: WorkList  # (or NoPieces, whose counts are 0: then no step reads the lists)
        if rows is not None:  # every row in row groups (a fresh graph): no work list
            self.wl, self.short = NoPieces(), rows  # type: ignore[assignment]
        else:
            self.wl = work_list(rowptr, plan.seg, plan.short_max if hybrid else -1)
            self.short = short_rows(rowptr, plan.short_max, plan.window) if hybrid else None  # type: ignore[assignment]
        if self.short is not None and self.short.numel():
            group_block_f = plan.group_block_f or plan.block_f
            self.rowgroup_grid = (cdiv(self.short.numel(), plan.group_rows), cdiv(F, group_block_f))
            self.rowgroup_meta = dict(REDUCE=code, HAS_W=has_w, ACC64=acc64, TRACK=tracks, ROWS=plan.group_rows,
                                      BLOCK_F=group_block_f, num_warps=plan.group_warps)
        if rows is not None:
            return
        self.csr_grid = (self.wl.num_pieces * nft,)
        self.csr_meta = dict(REDUCE=code, HAS_W=has_w, ACC64=acc64, TRACK=tracks, SEG=plan.seg,
                             BLOCK_E=plan.block_e, BLOCK_F=plan.block_f, num_warps=plan.num_warps)
        if hybrid and plan.one_pass:  # one launch: the long rows' pieces take the row groups' tiles
            group_block_f = plan.group_block_f or plan.block_f
            self.tasks = task_list(rowptr, self.short, self.wl, plan.group_rows, plan.seg, plan.short_max, plan.window)
            self.one_pass_grid = (self.tasks.numel(), cdiv(F, group_block_f))
            self.one_pass_meta = dict(REDUCE=code, HAS_W=has_w, ACC64=acc64, TRACK=tracks, ROWS=plan.group_rows,
                                      SEG=plan.seg, BLOCK_E=plan.block_e, BLOCK_F=group_block_f,
                                      X_EVICT=plan.x_evict, num_warps=plan.group_warps)
        self.combine_grid = (self.wl.split_rows.numel() * nft,)
        self.combine_meta = dict(REDUCE=code, ACC64=acc64, TRACK=tracks, BLOCK_K=_COMBINE_K, BLOCK_F=plan.block_f,
                                 num_warps=4)


def _forward_setup(x, rowptr, col, weight, reduce, tracks, kernel, plan) -> _ForwardSetup:
    """The cached setup of this call (an explicit ``plan`` builds one, uncached; a fresh graph one
    without any host synchronisation, uncached: see gnnfuse.fresh_graph)."""
    F, E, has_w = x.shape[1], col.numel(), weight is not None
    if plan is not None:
        return _ForwardSetup(plan, rowptr, E, F, x.dtype, reduce, has_w, tracks)
    env_kernel = config.get("GNNFUSE_TRITON_KERNEL") or None
    forced = kernel or env_kernel
    tune = autotune_enabled() and x.is_cuda
    if forced in (None, "hybrid") and env_kernel is None and not tune and is_fresh(rowptr):
        return _fresh_setup(rowptr, E, F, x.dtype, reduce, has_w, tracks)
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
        half = x.dtype in HALF_DTYPES
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
    wl = setup.wl
    part = torch.empty(wl.num_partials, F, dtype=_acc_dtype(x.dtype), device=x.device) if wl.num_partials else out
    parg = torch.empty(wl.num_partials, F, dtype=torch.long, device=x.device) if wl.num_partials and tracks else col
    if setup.tasks is not None and setup.tasks.numel():
        launch("one_pass", _one_pass_kernel, setup.one_pass_grid,
               (x, short, short.numel(), setup.tasks, rowptr, col, w, out, arg_p, part, parg, wl.seg_row, wl.seg_ptr,
                wl.slot, F), setup.one_pass_meta, fast)
    elif short is not None and short.numel():
        launch("rowgroup", _rowgroup_kernel, setup.rowgroup_grid,
               (x, short, rowptr, col, w, out, arg_p, short.numel(), F), setup.rowgroup_meta, fast)
    if wl.num_pieces == 0:
        return out, arg
    if setup.tasks is None:
        launch("csr", _csr_fwd_kernel, setup.csr_grid,
               (x, rowptr, col, w, out, arg_p, part, parg, wl.seg_row, wl.seg_ptr, wl.slot, F), setup.csr_meta, fast)
    if wl.split_rows.numel():
        launch("combine", _combine_kernel, setup.combine_grid,
               (part, parg, out, arg_p, rowptr, wl.split_rows, wl.seg_ptr, wl.slot, F), setup.combine_meta, fast)
    return out, arg


def __getattr__(name: str):
    """``backward`` (the op's Triton backward) lives in gather_scatter_backward.py, which builds on this
    module: imported on first use (then kept here, so later lookups are plain attribute reads)."""
    if name == "backward":
        from .gather_scatter_backward import backward

        globals()["backward"] = backward
        return backward
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

