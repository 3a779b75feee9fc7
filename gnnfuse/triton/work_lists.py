"""Per-graph index lists of the Triton gather-scatter kernels (no Triton import), cached on rowptr:
the work list that splits rows into pieces, each CSR position's target row, and mean's divisor.
The forward and backward setups (gather_scatter.py) build them for the graph they walk: the CSR
itself, or its transpose for x's gradient."""
from __future__ import annotations

import torch

from .. import range_check
from .._tensor_cache import cached


class WorkList:
    """Rows split into pieces of at most ``seg`` edges.

    seg_row[s]: row of piece s; seg_ptr[r]: first piece of row r; slot[r]: first partial slot
    of row r if it is split (more than one piece), else -1; split_rows: the split rows.
    With ``short_max`` >= 0, rows of at most that many edges get no piece (the hybrid plan's
    row-group kernel covers them, empty rows included).
    """

    def __init__(self, rowptr: torch.Tensor, seg: int, short_max: int = -1):
        n = rowptr.numel() - 1
        dev = rowptr.device
        deg = (rowptr[1:] - rowptr[:-1]).long()
        pieces = ((deg + seg - 1) // seg).clamp_(min=1)
        if short_max >= 0:
            pieces = torch.where(deg <= short_max, 0, pieces)
        self.seg_ptr = torch.zeros(n + 1, dtype=torch.long, device=dev)
        torch.cumsum(pieces, 0, out=self.seg_ptr[1:])
        split = pieces > 1
        split_pieces = torch.where(split, pieces, 0)
        slot_end = torch.cumsum(split_pieces, 0)
        self.slot = torch.where(split, slot_end - split_pieces, -1)
        self.split_rows = torch.nonzero(split).flatten()
        sizes = [self.seg_ptr[-1], slot_end[-1] if n else self.seg_ptr[-1] * 0]
        bad = range_check.flag(rowptr)  # a fresh build's range check is read with them (no sync of its own)
        totals = torch.stack(sizes if bad is None else [*sizes, bad.long()]).tolist()  # 1 sync
        if bad is not None:
            range_check.settle(rowptr, bool(totals[2]))  # raises for an out-of-range id, before any launch
        self.num_pieces, self.num_partials = int(totals[0]), int(totals[1])
        self.seg_row = torch.repeat_interleave(torch.arange(n, device=dev), pieces, output_size=self.num_pieces)


def work_list(rowptr: torch.Tensor, seg: int, short_max: int = -1) -> WorkList:
    return cached("work", (rowptr,), (seg, short_max), lambda: WorkList(rowptr, seg, short_max))


def expanded_rows(rowptr: torch.Tensor, num_edges: int) -> torch.Tensor:
    """Target of each CSR position (what CSR.row() holds), cached on rowptr."""
    def build():
        n = rowptr.numel() - 1
        deg = rowptr[1:] - rowptr[:-1]
        return torch.repeat_interleave(torch.arange(n, device=rowptr.device, dtype=rowptr.dtype), deg,
                                       output_size=num_edges)
    return cached("rows", (rowptr,), (num_edges,), build)


def mean_divisor(rowptr: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[N_dst, 1] in-degrees clamped to 1 (empty rows stay 0), cached on rowptr: one kernel per mean."""
    return cached("degree", (rowptr,), (dtype,),
                  lambda: (rowptr[1:] - rowptr[:-1]).clamp(min=1).unsqueeze(1).to(dtype))
