"""The launches of the Triton attention kernels (GAT: attention.py, GATv2 / dot: pair_attention.py),
bound once per graph and configuration.

On a small graph an attention call is mostly host time: working out the plan (work list, row
groups, tiles), the grids and constexprs, and Triton's specialisation of some twenty arguments per
launch cost more than the kernel runs. All of that is the same call after call for one graph
(rowptr), shape, dtype and set of flags, so attention.py and pair_attention.py build it once into
a setup, cached on rowptr (and on t_rowptr for the backward) with ``_tensor_cache.cached``, and
launch through the setup's ``BoundLaunches`` (_launch.py: the compiled kernel, grid and constexprs
kept per step; a call checks only the varying tensors' alignment). The plan itself, the tiles and
warps are attention.py's choices; this module only keeps and runs what they decided.
"""
from __future__ import annotations

import torch

from ..reductions import SUM
from ._grid import cdiv, next_power_of_2
from ._launch import BoundLaunches
from .attention_kernels import _merge_pieces_kernel
from .gather_scatter_fwd_kernels import _COMBINE_K, _combine_kernel


class Launches:
    """One setup's bound launches (by step name) and the fold of its split rows' partials."""

    def __init__(self):
        self.launch = BoundLaunches()

    def fold(self, step: str, part, out, wl, width: int, fast: bool) -> None:
        """out[row] = sum of the row's partials, in piece order, for the split rows (out: [N, width])."""
        if wl.num_partials and out.numel():
            bf = min(128, next_power_of_2(width))
            self.launch(step, _combine_kernel, (wl.split_rows.numel() * cdiv(width, bf),),
                        (part, part, out, part, wl.seg_ptr, wl.split_rows, wl.seg_ptr, wl.slot, width),
                        dict(REDUCE=SUM, ACC64=part.dtype == torch.float64, TRACK=False, BLOCK_K=_COMBINE_K,
                             BLOCK_F=bf, num_warps=4), fast)


class ForwardSetup(Launches):
    """A forward's plan for one graph and configuration: ``kernel`` (the one-pass forward) runs the
    ``tasks`` (row groups of the ``short`` rows and the work list ``wl``'s pieces of the long ones)
    with the constexprs ``meta``, ``heads`` programs per task (blocks of heads); the merge of split
    rows takes ``merge``'s constexprs."""

    def __init__(self, kernel, wl, short, tasks, heads: int, meta: dict, merge: dict):
        super().__init__()
        self.kernel, self.wl, self.short, self.tasks, self.meta = kernel, wl, short, tasks, meta
        self.grid = (tasks.numel(), heads)
        self.merge = ((wl.split_rows.numel(), heads), merge)

    def run(self, tensors: tuple, scalars: tuple, fast: bool) -> None:
        """The forward's launches. ``tensors``: the kernel's leading arguments, ending in out, m, z;
        ``scalars``: its trailing runtime scalars; ``fast``: BoundLaunches.usable's answer."""
        wl, parts = self.wl, self.wl.num_partials
        out, m, z = tensors[-3:]
        H, F = out.shape[1], out.shape[2]
        p_acc = m.new_empty(parts, H, F) if parts else m  # (m's dtype: the accumulation's)
        p_m = m.new_empty(parts, H) if parts else m
        p_z = torch.empty_like(p_m) if parts else m
        self.launch("one_pass", self.kernel, self.grid, (*tensors, self.short, self.short.numel(), self.tasks,
                                                         wl.seg_row, wl.seg_ptr, wl.slot, p_acc, p_m, p_z, *scalars),
                    self.meta, fast)
        if parts:
            self.launch("merge", _merge_pieces_kernel, self.merge[0],
                        (p_acc, p_m, p_z, out, m, z, wl.split_rows, wl.seg_ptr, wl.slot, H, F), self.merge[1], fast)


class BackwardSetup(Launches):
    """A backward's plan for one graph and configuration: the row pass over ``rows`` (the graph's
    work list, None: no pass) and the transpose pass over ``sources`` (t_rowptr's, None: no pass),
    each with its launch's (grid, constexprs); ``extra``: further launches by name."""

    def __init__(self, rows, rows_launch, sources, sources_launch, **extra):
        super().__init__()
        self.rows, self.rows_launch = rows, rows_launch
        self.sources, self.sources_launch = sources, sources_launch
        self.extra = extra


def node_setup(memo: dict, key: tuple, knobs: tuple, build):
    """A one-node route's setup (nn/_gat_node.py, nn/_pair_node.py) kept in ``memo``, the CSR's own dict
    of derived state (``CSR._derived``: cleared whenever the CSR's tensors are found changed, and never
    kept for tensors without stamps), by a key of the call's shapes, dtype and flags: found again without
    the setup cache's stamp check of rowptr and its longer key. ``knobs``: the module settings the setup
    was made with (the setup cache's key has them too); a setup made with others is made again."""
    hit = memo.get(key)
    if hit is None or hit[0] != knobs:
        hit = memo[key] = (knobs, build())
    return hit[1]


_EMPTY: dict = {}  # (device, dtype) -> an empty tensor (shared_empty)


def shared_empty(like: torch.Tensor) -> torch.Tensor:
    """One empty tensor of ``like``'s device and dtype, shared: the one-node routes' marker for the
    gradients they did not ask for (they drop them) and for dot attention's output not kept for the
    backward (nn/_pair_node.py), one allocation less each."""
    key = (like.device, like.dtype)
    empty = _EMPTY.get(key)
    if empty is None:
        empty = _EMPTY[key] = like.new_empty(0)
    return empty
