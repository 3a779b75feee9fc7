"""Sort-free Triton route of ``gnnfuse.scatter`` for an index seen once (see gnnfuse/scatter.py).

Sorting an index into a CSR pays off when the index comes back (a GNN's edge index: the sort is
cached), but a one-off index would pay the sort and the kernel plan for a single call. This route
reduces ``x [S, F]`` into ``out [T, F]`` by ``targets [S]`` with atomics, as torch's own
``scatter_reduce`` does, in one pass over ``x``:

  * sum / mean: ``atomic_add`` of each element (mean also counts each target's rows, then divides);
  * max / min: each float becomes an integer that orders like the float (the sign bit flips the
    other bits of a negative number), and ``atomic_max`` / ``atomic_min`` runs on those integers,
    only for keys that beat a plain read of the target first; a NaN is given the extreme key, so
    it wins and sticks, as in the sorted kernels. A target no row reaches keeps the identity key
    and decodes to 0.

Sums are added in whatever order the atomics land, so results may differ in the last bits from
run to run; max/min are exact. ``gnnfuse.scatter`` takes this route only where that is allowed
(not under ``torch.use_deterministic_algorithms(True)``), and only where nothing else is needed
from the sort (no gradient, no argmax, no ``out=``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._grid import cdiv, next_power_of_2
from ._launch import fast_kernel
from ..reductions import CODES
from .reduce_codes import MAX, MEAN

_KEY = {torch.float32: torch.int32, torch.float64: torch.int64}


@triton.jit
def _ordered_key(v, REDUCE: tl.constexpr, IS64: tl.constexpr):
    """An integer that orders like the float ``v`` (NaN: the extreme that max/min picks)."""
    if IS64:
        bits = v.to(tl.int64, bitcast=True)
        key = bits ^ ((bits >> 63) & 0x7FFFFFFFFFFFFFFF)
        top = 0x7FFFFFFFFFFFFFFF
    else:
        bits = v.to(tl.int32, bitcast=True)
        key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
        top = 0x7FFFFFFF
    if REDUCE == MAX:
        key = tl.where(v != v, top, key)
    else:
        key = tl.where(v != v, -top - 1, key)
    return key


@fast_kernel
@triton.jit
def _scatter_kernel(x_ptr, t_ptr, out_ptr, cnt_ptr, S, F, REDUCE: tl.constexpr, IS64: tl.constexpr,
                    SKIP_LOSERS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_F: tl.constexpr):
    """Program (row block, feature tile): each element to its target with an atomic. SKIP_LOSERS
    (max/min): first a plain read of the target; values only move one way under max (min), so a key
    that does not beat what was read cannot win, and most keys of a long row send no atomic."""
    offs_s = tl.program_id(0).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    smask = offs_s < S
    offs_f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    m2 = smask[:, None] & (offs_f < F)[None, :]
    t = tl.load(t_ptr + offs_s, mask=smask, other=0).to(tl.int64)
    v = tl.load(x_ptr + offs_s[:, None] * F + offs_f[None, :], mask=m2, other=0.0)
    dst = out_ptr + t[:, None] * F + offs_f[None, :]
    if REDUCE <= MEAN:
        tl.atomic_add(dst, v, mask=m2, sem="relaxed")
        if REDUCE == MEAN:
            if tl.program_id(1) == 0:
                tl.atomic_add(cnt_ptr + t, tl.full([BLOCK_S], 1.0, v.dtype), mask=smask, sem="relaxed")
    else:
        key = _ordered_key(v, REDUCE, IS64)
        if SKIP_LOSERS:  # a key that cannot win against what is already there needs no atomic
            cur = tl.load(dst, mask=m2, other=0)
            m2 = m2 & ((key > cur) if REDUCE == MAX else (key < cur))
        if REDUCE == MAX:
            tl.atomic_max(dst, key, mask=m2, sem="relaxed")
        else:
            tl.atomic_min(dst, key, mask=m2, sem="relaxed")


@fast_kernel
@triton.jit
def _decode_kernel(key_ptr, out_ptr, n, REDUCE: tl.constexpr, IS64: tl.constexpr, BLOCK: tl.constexpr):
    """The float of each max/min key; 0 where the identity key says no row reached the target."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    key = tl.load(key_ptr + offs, mask=mask, other=0)
    if IS64:
        top = 0x7FFFFFFFFFFFFFFF
        bits = key ^ ((key >> 63) & top)
        val = bits.to(tl.float64, bitcast=True)
    else:
        top = 0x7FFFFFFF
        bits = key ^ ((key >> 31) & top)
        val = bits.to(tl.float32, bitcast=True)
    if REDUCE == MAX:
        empty = key == -top - 1
    else:
        empty = key == top
    tl.store(out_ptr + offs, tl.where(empty, 0.0, val), mask=mask)


def applies(x: torch.Tensor) -> bool:
    """The dtypes this route serves (the integer keys exist for float32 and float64)."""
    return x.dtype in _KEY


def scatter(x: torch.Tensor, targets: torch.Tensor, num_targets: int, reduce: str, *, rows_per_program: int = 0,
            skip_losers: bool = True) -> torch.Tensor:
    """``out [num_targets, F]``: ``reduce`` ("sum" | "mean" | "max" | "min") of the rows of the
    contiguous ``x [S, F]`` by ``targets [S]`` (int32/int64, in range: the caller checks), 0 where empty.
    ``rows_per_program`` (0: 4096 elements a program) and ``skip_losers`` are for tile sweeps."""
    S, F = x.shape
    if reduce not in ("sum", "mean", "max", "min"):
        raise ValueError(f"scatter_atomic: reduce must be sum, mean, max or min; got {reduce!r}")
    code = CODES[reduce]
    is64 = x.dtype == torch.float64
    if reduce in ("sum", "mean"):
        out = torch.zeros(num_targets, F, dtype=x.dtype, device=x.device)
    else:
        info = torch.iinfo(_KEY[x.dtype])
        out = torch.full((num_targets, F), info.min if reduce == "max" else info.max, dtype=_KEY[x.dtype], device=x.device)
    cnt = torch.zeros(num_targets, dtype=x.dtype, device=x.device) if reduce == "mean" else out
    if S and F and num_targets:
        block_f = max(16, min(next_power_of_2(F), 128))
        block_s = rows_per_program or max(1, 4096 // block_f)
        _scatter_kernel[(cdiv(S, block_s), cdiv(F, block_f))](x, targets, out, cnt, S, F, REDUCE=code, IS64=is64,
                                                             SKIP_LOSERS=skip_losers, BLOCK_S=block_s,
                                                             BLOCK_F=block_f, num_warps=4)
    if reduce == "mean":
        return out.div_(cnt.clamp_(min=1).unsqueeze(1))
    if reduce == "sum":
        return out
    values = torch.empty(num_targets, F, dtype=x.dtype, device=x.device)
    n = values.numel()
    if n:
        _decode_kernel[(cdiv(n, 1024),)](out, values, n, REDUCE=code, IS64=is64, BLOCK=1024, num_warps=4)
    return values
