"""Triton kernels of the head-weighted gather-scatter (``fused_gather_scatter`` with [E, H] edge
weights; maths in gnnfuse/ops/head_gather_scatter.py).

    out[r, h, :] = sum_{q in row r} w[pos(q), h] * scale(q) * x[nbr[q], h, :]

One program per (piece of a row, block of HB heads), edges walked in blocks of BE, a tile is
[BE, HB, FB]. Rows are cut into pieces as the attention kernels cut them (attention.py:
SPLIT_EDGES, the gather-scatter's work list); a split row's pieces write partials that the
gather-scatter's combine kernel folds in piece order. No atomics: deterministic. The same kernel
serves the forward (the graph's rows, pos = q, mean: / deg(r)) and x's gradient (the transpose's
rows, pos = t_pos[q], mean: / deg of the other endpoint). The weights' gradient is a row pass
writing each edge's g_i . x_j once.
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from . import attention as gat
from ._grid import cdiv
from .attention_kernels import _head_block, _piece


@triton.jit
def _head_aggregate_kernel(x, w, ptr, nbr, pos, rowptr, out, part_out, seg_row, seg_ptr, slot, H, F,
                           TRANSPOSED: tl.constexpr, MEAN: tl.constexpr, ACC: tl.constexpr, BE: tl.constexpr,
                           HB: tl.constexpr, FB: tl.constexpr, SEG: tl.constexpr):
    r, _k, start, end, stop, part = _piece(seg_row, seg_ptr, slot, ptr, 0, SEG)
    heads, hmask, feats, fmask = _head_block(H, F, HB, FB)
    acc = tl.zeros((HB, FB), ACC)
    for k0 in range(start, stop, BE):
        qs = k0 + tl.arange(0, BE)
        valid = qs < stop
        other = tl.load(nbr + qs, mask=valid, other=0).to(tl.int64)
        if TRANSPOSED:
            k = tl.load(pos + qs, mask=valid, other=0).to(tl.int64)
        else:
            k = qs
        v2 = valid[:, None] & hmask[None, :]
        c = tl.load(w + k[:, None] * H + heads[None, :], mask=v2, other=0).to(ACC)
        if MEAN and TRANSPOSED:  # x's gradient: each edge scaled by its target's 1 / deg
            deg = tl.load(rowptr + other + 1, mask=valid, other=1) - tl.load(rowptr + other, mask=valid, other=0)
            c = c / tl.maximum(deg, 1).to(ACC)[:, None]
        xv = tl.load(x + other[:, None, None] * H * F + heads[None, :, None] * F + feats[None, None, :],
                     mask=v2[:, :, None] & fmask[None, None, :], other=0).to(ACC)
        acc += tl.sum(c[:, :, None] * xv, 0)
    if MEAN and not TRANSPOSED:
        acc = acc / tl.maximum(end - tl.load(ptr + r), 1).to(ACC)
    hf = hmask[:, None] & fmask[None, :]
    offs = heads[:, None] * F + feats[None, :]
    whole = (part + 0 * heads < 0)[:, None]  # the row is one piece ([HB] masks: the interpreter wants arrays)
    tl.store(out + r * H * F + offs, acc.to(out.dtype.element_ty), mask=hf & whole)
    tl.store(part_out + part * H * F + offs, acc, mask=hf & ~whole)


@triton.jit
def _head_weight_grad_kernel(g, x, rowptr, col, gw, seg_row, seg_ptr, slot, H, F, MEAN: tl.constexpr,
                             ACC: tl.constexpr, BE: tl.constexpr, HB: tl.constexpr, FB: tl.constexpr,
                             SEG: tl.constexpr):
    """gw[k, h] = g[i, h, :] . x[col[k], h, :] (/ deg(i) for mean) for the edges k of this piece of row i."""
    i, _k, start, end, stop, _part = _piece(seg_row, seg_ptr, slot, rowptr, 0, SEG)
    heads, hmask, feats, fmask = _head_block(H, F, HB, FB)
    hf = hmask[:, None] & fmask[None, :]
    gi = tl.load(g + i * H * F + heads[:, None] * F + feats[None, :], mask=hf, other=0).to(ACC)
    if MEAN:
        gi = gi / tl.maximum(end - tl.load(rowptr + i), 1).to(ACC)
    for k0 in range(start, stop, BE):
        ks = k0 + tl.arange(0, BE)
        valid = ks < stop
        j = tl.load(col + ks, mask=valid, other=0).to(tl.int64)
        v2 = valid[:, None] & hmask[None, :]
        xv = tl.load(x + j[:, None, None] * H * F + heads[None, :, None] * F + feats[None, None, :],
                     mask=v2[:, :, None] & fmask[None, None, :], other=0).to(ACC)
        d = tl.sum(xv * gi[None, :, :], 2)
        tl.store(gw + ks[:, None] * H + heads[None, :], d.to(gw.dtype.element_ty), mask=v2)


def _aggregate(x, w, ptr, nbr, pos, rowptr, mean, num_rows, transposed):
    H, F = x.shape[1], x.shape[2]
    acc = tl.float64 if x.dtype == torch.float64 else tl.float32
    out = x.new_empty(num_rows, H, F)
    if not (num_rows and H and F):
        return out.zero_()
    be, hb, fb = gat._blocks(H, F, nbr.shape[0], num_rows, False)
    wl = gat._work(ptr)
    parts = x.new_empty(wl.num_partials, H, F, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32) \
        if wl.num_partials else out
    with contextlib.nullcontext() if x.is_cpu else torch.cuda.device(x.device):
        _head_aggregate_kernel[(wl.num_pieces, cdiv(H, hb))](
            x, w, ptr, nbr, pos if pos is not None else nbr, rowptr, out, parts, wl.seg_row, wl.seg_ptr, wl.slot,
            H, F, TRANSPOSED=transposed, MEAN=bool(mean), ACC=acc, BE=be, HB=hb, FB=fb, SEG=gat.SPLIT_EDGES,
            num_warps=gat._warps(be, hb, fb))
        gat._fold(parts, out.view(num_rows, H * F), wl, H * F)
    return out


def forward(x, rowptr, col, w, mean):
    return _aggregate(x, w, rowptr, col, None, rowptr, mean, rowptr.shape[0] - 1, False)


def backward(grad, x, rowptr, col, w, t_rowptr, t_col, t_pos, mean, need_x, need_w):
    grad = grad.contiguous()
    gx = _aggregate(grad, w, t_rowptr, t_col, t_pos, rowptr, mean, x.shape[0], True) if need_x else x.new_empty(0)
    gw = x.new_empty(0)
    if need_w:
        gw = torch.empty_like(w)
        num_dst, H, F = grad.shape
        if num_dst and H and col.shape[0]:
            be, hb, fb = gat._blocks(H, F, col.shape[0], num_dst, False)
            wl = gat._work(rowptr)
            acc = tl.float64 if x.dtype == torch.float64 else tl.float32
            with contextlib.nullcontext() if x.is_cpu else torch.cuda.device(x.device):
                _head_weight_grad_kernel[(wl.num_pieces, cdiv(H, hb))](
                    grad, x, rowptr, col, gw, wl.seg_row, wl.seg_ptr, wl.slot, H, F, MEAN=bool(mean), ACC=acc,
                    BE=be, HB=hb, FB=fb, SEG=gat.SPLIT_EDGES, num_warps=gat._warps(be, hb, fb))
    return gx, gw
