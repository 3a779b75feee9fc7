"""The majority vote of ``gnnfuse.reorder(method="community-refined")`` on the GPU, one launch per round.

Every target row with in-edges takes the label most of its first ``votes`` in-neighbours (in CSR
order) carry; ties go to the highest label; rows without in-edges keep their own
(gnnfuse/ordering.py, ``refine_blocks``; the same labels as its torch-ops and C++ versions). A
program owns ``BLOCK_R`` rows: it loads each row's first votes, counts every vote's label against
the others in registers (a [BLOCK_R, VOTES, VOTES] comparison) and keeps the best of
``count * labels + label``. In torch ops the same comparison writes and reads a [rows, votes,
votes] tensor per round, about ten times the memory traffic.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._grid import cdiv, next_power_of_2
from ._launch import fast_kernel

BLOCK_R = 32  # rows per program: 32 x 16 x 16 comparisons in registers with 4 warps


@fast_kernel
@triton.jit
def _vote_kernel(rowptr_ptr, col_ptr, label_ptr, out_ptr, n, labels, votes, VOTES: tl.constexpr,
                 BLOCK_R: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < n
    lo = tl.load(rowptr_ptr + rows, mask=rmask, other=0).to(tl.int64)
    hi = tl.load(rowptr_ptr + rows + 1, mask=rmask, other=0).to(tl.int64)
    k = tl.arange(0, VOTES)
    valid = (k[None, :] < tl.minimum(hi - lo, votes)[:, None]) & rmask[:, None]
    src = tl.load(col_ptr + lo[:, None] + k[None, :], mask=valid, other=0)
    lab = tl.load(label_ptr + src, mask=valid, other=-1)
    counts = tl.sum((lab[:, :, None] == lab[:, None, :]).to(tl.int32), axis=2)
    score = tl.where(lab >= 0, counts.to(tl.int64) * labels + lab, -1)
    best = tl.max(score, axis=1)
    own = tl.load(label_ptr + rows, mask=rmask, other=0)
    tl.store(out_ptr + rows, tl.where(best >= 0, best % labels, own), mask=rmask)


def majority_vote(rowptr: torch.Tensor, col: torch.Tensor, label: torch.Tensor, votes: int,
                  labels: int) -> torch.Tensor:
    """One round: ``label`` [rows] int64 (values in ``[0, labels)``) -> the next round's labels."""
    n = label.numel()
    out = torch.empty_like(label)
    if n:
        _vote_kernel[(cdiv(n, BLOCK_R),)](rowptr, col, label, out, n, labels, votes,
                                          VOTES=max(2, next_power_of_2(votes)), BLOCK_R=BLOCK_R, num_warps=4)
    return out
