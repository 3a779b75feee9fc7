"""Host side of ``gnnfuse::gather_scatter_backward`` on the GPU (the kernels, and when each runs, are
described in gather_scatter.py's docstring): a cached per-graph setup, planned like the forward's
and launched through the same path (a setup's _launch.BoundLaunches)."""
from __future__ import annotations

import torch

from .._tensor_cache import cached
from ..reductions import CODES, MUL, SUM
from . import gather_scatter as fwd
from ._grid import cdiv, next_power_of_2
from ._launch import BoundLaunches
from .gather_scatter_bwd_kernels import _csr_bwd_x_kernel, _grad_w_kernel, _mul_stats_kernel, _winner_scatter_kernel
from .gather_scatter_dispatch import Plan, choose
from .gather_scatter_fwd_kernels import _COMBINE_K, _combine_kernel
from .work_lists import WorkList, expanded_rows, mean_divisor, work_list


def _sum_mean_x_grad(grad_out, x, rowptr, weight, t_rowptr, t_col, t_pos, reduce, plan, t_weight=None) -> torch.Tensor:
    """x's gradient for sum/mean: grad_x[j] = sum over the edges e leaving j of w[e] * g[target(e)],
    with g = grad_out (sum) or grad_out / in-degree (mean). That is a sum gather-scatter over the
    cached transpose, so it runs the forward's kernels and plan: row groups for the short rows,
    which most rows of a power-law graph's transpose are (the CSR kernel alone spends a whole
    edge tile on each). Atomic-free and deterministic; [N_dst, F] and [E] temporaries only.
    ``t_weight``: the weights already in transpose order (cached by the op layer), which spares
    the gather of the weights through t_pos (one kernel launch and ~5 E-sized reads and writes)."""
    g = grad_out
    if reduce == "mean":  # scaled in the accumulation dtype, as the forward divides
        acc = fwd._acc_dtype(x.dtype)
        g = grad_out.to(acc) / mean_divisor(rowptr, acc)
    if weight is not None and t_weight is None:
        t_weight = weight.index_select(0, t_pos)  # transpose order
    w_t = None if weight is None else t_weight.to(g.dtype)
    out, _ = fwd._forward(g, t_rowptr, t_col, w_t, "sum", False, "hybrid", plan)
    nt = t_rowptr.numel() - 1
    if nt == x.shape[0] and out.dtype == x.dtype:
        return out
    grad_x = torch.zeros_like(x)
    grad_x[:nt] = out
    return grad_x


# routes of x's gradient (see gather_scatter.py's docstring)
_TRANSPOSE_SUM, _WINNERS, _TRANSPOSE_WALK = "sum forward over the transpose", "winner scatter", "transpose walk"


class _BackwardSetup:
    """Everything a backward call needs besides its tensors, for one graph (rowptr and its
    transpose) and one (F, dtypes, reduce, weighted or not, gradients wanted, deterministic or
    not): x's gradient route, plans, work lists, grids and constexprs, and the bound launches
    (the forward's launch path, see _ForwardSetup). Each walk is planned by the forward's plan
    builder on the graph it walks: the transpose walk on the transpose, the mul statistics and the
    weight gradient on the CSR itself (an explicit ``plan`` gives every step its tiles)."""

    def __init__(self, rowptr: torch.Tensor, t_rowptr: torch.Tensor, E: int, F: int, dtype: torch.dtype, reduce: str,
                 has_w: bool, need_x: bool, want_w: bool, deterministic: bool, plan: Plan | None):
        self.launches = BoundLaunches()
        code, acc64 = CODES[reduce], dtype == torch.float64
        n, nt = rowptr.numel() - 1, t_rowptr.numel() - 1
        own = plan or choose(reduce, n, E, F, dtype, deterministic=True, kernel="hybrid")  # the CSR's plan
        self.route = None
        if need_x:
            self.route = _TRANSPOSE_SUM if reduce in ("sum", "mean") else \
                _WINNERS if reduce in ("max", "min") and not deterministic else _TRANSPOSE_WALK
        if reduce == "mul":  # product of the non-zero messages and zero count per (row, feature)
            self.stats_wl, nft = work_list(rowptr, own.seg), cdiv(F, own.block_f)
            self.stats_grid = (self.stats_wl.num_pieces * nft,)
            self.stats_meta = dict(HAS_W=has_w, ACC64=acc64, SEG=own.seg, BLOCK_E=own.block_e, BLOCK_F=own.block_f,
                                   num_warps=own.num_warps)
            self.stats_fold_grid = (self.stats_wl.split_rows.numel() * nft,)
            self.stats_fold_meta = {c: _fold_meta(c, acc64, own.block_f) for c in (MUL, SUM)}
        if self.route == _WINNERS:
            rows, block_f = 16, min(max(16, next_power_of_2(F)), 64)
            self.winner_grid = (cdiv(n, rows), cdiv(F, block_f))
            self.winner_meta = dict(HAS_W=has_w, ACC64=acc64, ROWS=rows, BLOCK_F=block_f, num_warps=4)
        if self.route == _TRANSPOSE_WALK:
            walk = plan or choose(reduce, nt, E, F, dtype, deterministic=True, kernel="hybrid")
            self.walk_wl, nft = work_list(t_rowptr, walk.seg), cdiv(F, walk.block_f)
            self.walk_grid = (self.walk_wl.num_pieces * nft,)
            self.walk_meta = dict(REDUCE=code, HAS_W=has_w, ACC64=acc64, SEG=walk.seg, BLOCK_E=walk.block_e,
                                  BLOCK_F=walk.block_f, num_warps=walk.num_warps)
            self.walk_fold_grid = (self.walk_wl.split_rows.numel() * nft,)
            self.walk_fold_meta = _fold_meta(SUM, acc64, walk.block_f)
        if want_w:
            self.rows = expanded_rows(rowptr, E)
            block_e, block_f = 32, min(own.block_f, 128)
            self.grad_w_grid = (cdiv(E, block_e),)
            self.grad_w_meta = dict(REDUCE=code, ACC64=acc64, BLOCK_E=block_e, BLOCK_F=block_f,
                                    num_warps=max(1, block_e * block_f // 1024))


def _fold_meta(code: int, acc64: bool, block_f: int) -> dict:
    return dict(REDUCE=code, ACC64=acc64, TRACK=False, BLOCK_K=_COMBINE_K, BLOCK_F=block_f, num_warps=4)


def _fold(launch, step: str, wl: WorkList, part, dst, rowptr, F: int, grid, meta, fast: bool) -> None:
    """_combine_kernel on value partials (TRACK=False never reads its winner pointers: they get
    ``part`` and ``rowptr``): folds the split rows' partials into ``dst``."""
    if grid[0]:
        launch(step, _combine_kernel, grid, (part, part, dst, rowptr, rowptr, wl.split_rows, wl.seg_ptr, wl.slot, F),
               meta, fast)


def backward(grad_out, x, rowptr, col, weight, t_rowptr, t_col, t_pos, arg, reduce, need_x_grad, need_w_grad,
             *, plan: Plan | None = None, t_weight: torch.Tensor | None = None):
    """(grad_x, grad_w) per the op's contract; empty tensors for gradients not asked for.
    ``t_weight``: optional ``weight[t_pos]`` (sum/mean x-gradient only)."""
    fwd._check(x, rowptr, col, weight)
    n, F, E = rowptr.numel() - 1, x.shape[1], col.numel()
    grad_out = grad_out.contiguous()
    want_w = need_w_grad and weight is not None
    grad_x = x.new_empty(0)
    grad_w = x.new_empty(E) if want_w else x.new_empty(0)
    if n == 0 or F == 0 or E == 0:
        return (torch.zeros_like(x) if need_x_grad else grad_x), (grad_w.zero_() if want_w else grad_w)
    if reduce in ("sum", "mean") and not want_w:  # (the hot case: the transpose's forward setup is all it needs)
        if need_x_grad:
            grad_x = _sum_mean_x_grad(grad_out, x, rowptr, weight, t_rowptr, t_col, t_pos, reduce, plan, t_weight)
        return grad_x, grad_w
    deterministic = torch.are_deterministic_algorithms_enabled()
    key = (E, F, x.dtype, grad_out.dtype, reduce, weight is not None, need_x_grad, want_w, deterministic)

    def build():
        return _BackwardSetup(rowptr, t_rowptr, E, F, x.dtype, reduce, weight is not None, need_x_grad, want_w,
                              deterministic, plan)

    setup = build() if plan is not None else cached("backward", (rowptr, t_rowptr), key, build)
    launch = setup.launches
    w = weight if weight is not None else x  # dummy pointers: HAS_W False, or a route that ignores them
    arg_p = arg if arg.numel() else rowptr
    fast = x.is_cuda and launch.usable(grad_out, x, w, col, t_col, t_pos, arg_p)
    acc = fwd._acc_dtype(x.dtype)
    prod = zc = x
    if reduce == "mul":
        prod = torch.empty(n, F, dtype=acc, device=x.device)
        zc = torch.empty(n, F, dtype=torch.int32, device=x.device)
        wl = setup.stats_wl
        pprod = pzc = prod  # partials (float; counts are exact below 2**24) only if rows are split
        if wl.num_partials:
            pprod = torch.empty(wl.num_partials, F, dtype=acc, device=x.device)
            pzc = torch.empty(wl.num_partials, F, dtype=torch.float32, device=x.device)
        launch("mul_stats", _mul_stats_kernel, setup.stats_grid,
               (x, rowptr, col, w, prod, zc, pprod, pzc, wl.seg_row, wl.seg_ptr, wl.slot, F), setup.stats_meta, fast)
        for step, part, dst, code in (("fold_prod", pprod, prod, MUL), ("fold_zeros", pzc, zc, SUM)):
            _fold(launch, step, wl, part, dst, rowptr, F, setup.stats_fold_grid, setup.stats_fold_meta[code], fast)
    if setup.route == _TRANSPOSE_SUM:
        grad_x = _sum_mean_x_grad(grad_out, x, rowptr, weight, t_rowptr, t_col, t_pos, reduce, plan, t_weight)
    elif setup.route == _WINNERS:  # each winner's gradient added to its source row (gather_scatter.py's docstring)
        grad_x = torch.zeros(x.shape, dtype=acc, device=x.device)
        launch("winners", _winner_scatter_kernel, setup.winner_grid, (grad_out, arg, col, w, grad_x, n, F),
               setup.winner_meta, fast)
        grad_x = grad_x.to(x.dtype)
    elif setup.route == _TRANSPOSE_WALK:  # mul, or max/min atomic-free: walk the transpose
        grad_x = torch.empty_like(x)
        nt = t_rowptr.numel() - 1
        if nt < x.shape[0]:
            grad_x[nt:].zero_()
        wl = setup.walk_wl
        part = torch.empty(wl.num_partials, F, dtype=acc, device=x.device) if wl.num_partials else x
        launch("walk", _csr_bwd_x_kernel, setup.walk_grid,
               (grad_out, x, rowptr, w, t_rowptr, t_col, t_pos, arg_p, prod, zc, grad_x, part, wl.seg_row,
                wl.seg_ptr, wl.slot, F), setup.walk_meta, fast)
        _fold(launch, "fold_walk", wl, part, grad_x, t_rowptr, F, setup.walk_fold_grid, setup.walk_fold_meta, fast)
    if want_w:
        launch("grad_w", _grad_w_kernel, setup.grad_w_grid,
               (grad_out, x, rowptr, setup.rows, col, w, arg_p, prod, zc, grad_w, E, F), setup.grad_w_meta, fast)
    return grad_x, grad_w
