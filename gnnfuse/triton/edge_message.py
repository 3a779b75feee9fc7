"""Triton kernels of ``gnnfuse.gine_aggregate`` (maths in gnnfuse/ops/edge_message.py).

One program per (target row, block of FB features) in the forward and in the edge_attr gradient,
one per (source row, block of features) for x's gradient over the transpose: every output row is
written by one program, so there are no atomics and results are deterministic. Edges are walked in
blocks of BE; a tile is [BE, FB]. The pre-activation x[src] + edge_attr[e] is recomputed where
needed (``_pre_activation``), never stored.
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from ._grid import cdiv, next_power_of_2


@triton.jit
def _pre_activation(x, ea, src, e, feats, valid, F, ACC: tl.constexpr):
    """[BE, FB] x[src] + edge_attr[e] (0 where not valid)."""
    xs = tl.load(x + src[:, None] * F + feats[None, :], mask=valid, other=0.0).to(ACC)
    es = tl.load(ea + e[:, None] * F + feats[None, :], mask=valid, other=0.0).to(ACC)
    return xs + es


@triton.jit
def _forward_kernel(x, ea, rowptr, col, perm, out, F, MEAN: tl.constexpr, ACC: tl.constexpr,
                    BE: tl.constexpr, FB: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    feats = tl.program_id(1) * FB + tl.arange(0, FB)
    fmask = feats < F
    start = tl.load(rowptr + i).to(tl.int64)
    end = tl.load(rowptr + i + 1).to(tl.int64)
    acc = tl.zeros((FB,), ACC)
    for k0 in range(start, end, BE):
        ks = k0 + tl.arange(0, BE)
        kmask = ks < end
        src = tl.load(col + ks, mask=kmask, other=0).to(tl.int64)
        e = tl.load(perm + ks, mask=kmask, other=0).to(tl.int64)
        pre = _pre_activation(x, ea, src, e, feats, kmask[:, None] & fmask[None, :], F, ACC)
        acc += tl.sum(tl.maximum(pre, 0.0), 0)
    if MEAN:
        acc = acc / tl.maximum(end - start, 1).to(ACC)
    tl.store(out + i * F + feats, acc.to(out.dtype.element_ty), mask=fmask)


@triton.jit
def _grad_edge_kernel(g, x, ea, rowptr, col, perm, grad_ea, F, MEAN: tl.constexpr, ACC: tl.constexpr,
                      BE: tl.constexpr, FB: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    feats = tl.program_id(1) * FB + tl.arange(0, FB)
    fmask = feats < F
    start = tl.load(rowptr + i).to(tl.int64)
    end = tl.load(rowptr + i + 1).to(tl.int64)
    gi = tl.load(g + i * F + feats, mask=fmask, other=0.0).to(ACC)
    if MEAN:
        gi = gi / tl.maximum(end - start, 1).to(ACC)
    for k0 in range(start, end, BE):
        ks = k0 + tl.arange(0, BE)
        kmask = ks < end
        valid = kmask[:, None] & fmask[None, :]
        src = tl.load(col + ks, mask=kmask, other=0).to(tl.int64)
        e = tl.load(perm + ks, mask=kmask, other=0).to(tl.int64)
        pre = _pre_activation(x, ea, src, e, feats, valid, F, ACC)
        grad = tl.where(pre > 0, gi[None, :], 0.0)
        tl.store(grad_ea + e[:, None] * F + feats[None, :], grad.to(grad_ea.dtype.element_ty), mask=valid)


@triton.jit
def _grad_x_kernel(g, x, ea, rowptr, perm, t_rowptr, t_col, t_pos, grad_x, F, MEAN: tl.constexpr,
                   ACC: tl.constexpr, BE: tl.constexpr, FB: tl.constexpr):
    j = tl.program_id(0).to(tl.int64)
    feats = tl.program_id(1) * FB + tl.arange(0, FB)
    fmask = feats < F
    start = tl.load(t_rowptr + j).to(tl.int64)
    end = tl.load(t_rowptr + j + 1).to(tl.int64)
    xj = tl.load(x + j * F + feats, mask=fmask, other=0.0).to(ACC)
    acc = tl.zeros((FB,), ACC)
    for q0 in range(start, end, BE):
        qs = q0 + tl.arange(0, BE)
        qmask = qs < end
        valid = qmask[:, None] & fmask[None, :]
        dst = tl.load(t_col + qs, mask=qmask, other=0).to(tl.int64)
        pos = tl.load(t_pos + qs, mask=qmask, other=0).to(tl.int64)
        e = tl.load(perm + pos, mask=qmask, other=0).to(tl.int64)
        es = tl.load(ea + e[:, None] * F + feats[None, :], mask=valid, other=0.0).to(ACC)
        gd = tl.load(g + dst[:, None] * F + feats[None, :], mask=valid, other=0.0).to(ACC)
        if MEAN:
            deg = tl.load(rowptr + dst + 1, mask=qmask, other=1) - tl.load(rowptr + dst, mask=qmask, other=0)
            gd = gd / tl.maximum(deg, 1).to(ACC)[:, None]
        acc += tl.sum(tl.where((xj[None, :] + es > 0) & valid, gd, 0.0), 0)
    tl.store(grad_x + j * F + feats, acc.to(grad_x.dtype.element_ty), mask=fmask)


def _launch(kernel, rows: int, F: int, dtype: torch.dtype, device: torch.device, *args, mean: bool) -> None:
    if rows == 0 or F == 0:
        return
    fb = min(next_power_of_2(F), 128)
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        kernel[(rows, cdiv(F, fb))](*args, F, MEAN=mean, ACC=tl.float64 if dtype == torch.float64 else tl.float32,
                                     BE=max(8, min(64, 2048 // fb)), FB=fb)


def forward(x, ea, rowptr, col, perm, mean):
    out = torch.empty(rowptr.shape[0] - 1, x.shape[1], dtype=x.dtype, device=x.device)
    _launch(_forward_kernel, out.shape[0], x.shape[1], x.dtype, x.device, x, ea, rowptr, col, perm, out, mean=mean)
    return out


def backward(grad, x, ea, rowptr, col, perm, t_rowptr, t_col, t_pos, mean, need_x, need_edge):
    F = x.shape[1]
    grad_x = torch.zeros_like(x) if need_x else x.new_empty(0)
    grad_ea = torch.zeros_like(ea) if need_edge else x.new_empty(0)
    if need_edge:
        _launch(_grad_edge_kernel, rowptr.shape[0] - 1, F, x.dtype, x.device, grad, x, ea, rowptr, col, perm,
                grad_ea, mean=mean)
    if need_x:
        _launch(_grad_x_kernel, t_rowptr.shape[0] - 1, F, x.dtype, x.device, grad, x, ea, rowptr, perm, t_rowptr,
                t_col, t_pos, grad_x, mean=mean)
    return grad_x, grad_ea
