"""One hop's neighbour picks in one Triton kernel (the GPU sampler's hot loop).

Without replacement, Floyd's algorithm draws ``fanout`` distinct positions in [0, degree) in
``fanout`` rounds; as torch ops each round is about eight kernel launches, so a [15, 10, 5] batch
spent ~240 launches (and the host time to issue them) on picks alone. Here one program holds a
block of targets' picks in registers and runs every round, and the sampled sources are gathered in
the same kernel: one launch per hop. Random numbers are Philox draws (``tl.randint``) keyed by a
per-hop seed and the (target, round) position, so the picks do not depend on the launch grid; a
draw ``r`` in [0, j] is ``randint mod (j + 1)`` (bias below (j + 1) / 2**32). The seed is a Python
int, or a one-element device tensor the kernel reads (a captured sampler: the launch then replays
with a new seed each batch; gnnfuse.loader._captured_sampler).

Output layout (the padded [targets x fan-out] of ``_torch_sampling.sample_padded``): ``u[t, s]`` is
the s-th sampled source of target t, or ``N`` (the sink) for a slot past the target's degree, a
padded target (at or past ``count``), or any slot of a target with no in-edges; ``edge[t, s]`` its
CSC position (0 where invalid).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton._grid import cdiv, next_power_of_2

BLOCK_T = 64  # targets per program


@triton.jit(do_not_specialize=["seed"])  # a new seed every batch: no recompile when it happens to be 1 or 16k
def _pick_kernel(frontier_ptr, count_ptr, colptr_ptr, row_ptr, u_ptr, edge_ptr, T, N, seed,
                 FANOUT: tl.constexpr, KP: tl.constexpr, REPLACE: tl.constexpr, HAS_COUNT: tl.constexpr,
                 SEED_IN_MEMORY: tl.constexpr, BLOCK: tl.constexpr):
    if SEED_IN_MEMORY:  # seed is a pointer to the hop's seed (int64, in [1, 2**31 - 1))
        seed = tl.load(seed).to(tl.int32)
    offs_t = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_grid = offs_t < T
    live = in_grid
    if HAS_COUNT:  # a padded frontier: only its first `count` entries are nodes
        live = live & (offs_t < tl.load(count_ptr))
    f = tl.load(frontier_ptr + offs_t, mask=live, other=0).to(tl.int64)
    start = tl.load(colptr_ptr + f, mask=live, other=0).to(tl.int64)
    deg = tl.load(colptr_ptr + f + 1, mask=live, other=0).to(tl.int64) - start
    slots = tl.arange(0, KP)
    draw_at = (offs_t * FANOUT).to(tl.int32)  # Philox counter of the target's first round
    if REPLACE:
        r = tl.randint(seed, draw_at[:, None] + slots[None, :]).to(tl.int64) & 0xFFFFFFFF  # as unsigned
        picks = r % tl.maximum(deg, 1)[:, None]
        valid = (slots[None, :] < FANOUT) & (deg > 0)[:, None]
    else:
        picks = slots[None, :].to(tl.int64) + tl.zeros([BLOCK, KP], tl.int64)  # degree <= fan-out: take all
        big = deg > FANOUT
        for i in tl.static_range(FANOUT):  # Floyd: j = degree - fanout + i; r uniform in [0, j]; r if new, else j
            j = tl.maximum(deg - FANOUT + i, 0)
            r = (tl.randint(seed, draw_at + i).to(tl.int64) & 0xFFFFFFFF) % (j + 1)
            taken = tl.sum(((slots[None, :] < i) & (picks == r[:, None])).to(tl.int32), axis=1) > 0
            new = tl.where(big, tl.where(taken, j, r), i)
            picks = tl.where(slots[None, :] == i, new[:, None], picks)
        valid = (slots[None, :] < FANOUT) & (slots[None, :] < deg[:, None])
    valid = valid & live[:, None]
    edge = tl.where(valid, start[:, None] + picks, 0)
    u = tl.load(row_ptr + edge, mask=valid, other=N).to(tl.int64)
    out = offs_t[:, None] * FANOUT + slots[None, :]
    store = in_grid[:, None] & (slots[None, :] < FANOUT)
    tl.store(u_ptr + out, u, mask=store)
    tl.store(edge_ptr + out, edge, mask=store)


def pick_sources(frontier: torch.Tensor, count: torch.Tensor | None, colptr: torch.Tensor, row: torch.Tensor,
                 fanout: int, replace: bool, seed: int | torch.Tensor,
                 num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(u [T * fanout], edge [T * fanout]) of one hop (see the module docstring); ``count``: a
    one-element device tensor, the number of real entries of ``frontier`` (None: all); ``seed``: an
    int, or a one-element int64 tensor on the device holding it (the same picks)."""
    in_memory = isinstance(seed, torch.Tensor)
    T = frontier.shape[0]
    u = torch.empty(T * fanout, dtype=torch.long, device=frontier.device)
    edge = torch.empty_like(u)
    if T and fanout:
        _pick_kernel[(cdiv(T, BLOCK_T),)](
            frontier, count if count is not None else frontier, colptr, row, u, edge, T, num_nodes, seed,
            FANOUT=fanout, KP=next_power_of_2(fanout), REPLACE=replace, HAS_COUNT=count is not None,
            SEED_IN_MEMORY=in_memory, BLOCK=BLOCK_T, num_warps=4)
    return u, edge
