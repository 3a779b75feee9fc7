"""Triton kernels of ``gnnfuse.edge_softmax`` (ops/edge_softmax.py): one program per target row of the
CSR, edge order through its ``perm``. Forward: the row's online max and sum, then the normalised
weights. Backward: grad = p * (g - sum_row(p * g)), per row as well (no transpose, no atomics).
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from ._grid import next_power_of_2
from .attention_kernels import NEG_INF


@triton.jit
def _edge_softmax_kernel(logits, rowptr, perm, out, H, ACC: tl.constexpr, BE: tl.constexpr, HB: tl.constexpr):
    """One program per target row: online max and sum, then the normalised weights (edge order via perm)."""
    i = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, HB)
    hmask = heads < H
    start = tl.load(rowptr + i).to(tl.int64)
    end = tl.load(rowptr + i + 1).to(tl.int64)
    m = tl.full((HB,), NEG_INF, ACC)
    z = tl.zeros((HB,), ACC)
    for k0 in range(start, end, BE):
        ks = k0 + tl.arange(0, BE)
        v2 = (ks < end)[:, None] & hmask[None, :]
        e = tl.load(perm + ks, mask=ks < end, other=0).to(tl.int64)
        s = tl.load(logits + e[:, None] * H + heads[None, :], mask=v2, other=NEG_INF).to(ACC)
        m_new = tl.maximum(m, tl.max(s, 0))
        m_safe = tl.where(m_new == NEG_INF, 0.0, m_new)
        z = z * tl.exp(m - m_safe) + tl.sum(tl.exp(s - m_safe[None, :]), 0)
        m = m_new
    z = tl.where(z > 0, z, 1.0)
    m = tl.where(m == NEG_INF, 0.0, m)  # padded heads
    for k0 in range(start, end, BE):
        ks = k0 + tl.arange(0, BE)
        v2 = (ks < end)[:, None] & hmask[None, :]
        e = tl.load(perm + ks, mask=ks < end, other=0).to(tl.int64)
        offs = e[:, None] * H + heads[None, :]
        s = tl.load(logits + offs, mask=v2, other=NEG_INF).to(ACC)
        tl.store(out + offs, (tl.exp(s - m[None, :]) / z[None, :]).to(out.dtype.element_ty), mask=v2)


@triton.jit
def _edge_softmax_backward_kernel(g, p, rowptr, perm, grad, H, ACC: tl.constexpr, BE: tl.constexpr,
                                  HB: tl.constexpr):
    """grad = p * (g - sum_row(p * g)), one program per target row."""
    i = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, HB)
    hmask = heads < H
    start = tl.load(rowptr + i).to(tl.int64)
    end = tl.load(rowptr + i + 1).to(tl.int64)
    acc = tl.zeros((HB,), ACC)
    for k0 in range(start, end, BE):
        ks = k0 + tl.arange(0, BE)
        v2 = (ks < end)[:, None] & hmask[None, :]
        offs = tl.load(perm + ks, mask=ks < end, other=0).to(tl.int64)[:, None] * H + heads[None, :]
        acc += tl.sum(tl.load(p + offs, mask=v2, other=0).to(ACC) * tl.load(g + offs, mask=v2, other=0).to(ACC), 0)
    for k0 in range(start, end, BE):
        ks = k0 + tl.arange(0, BE)
        v2 = (ks < end)[:, None] & hmask[None, :]
        offs = tl.load(perm + ks, mask=ks < end, other=0).to(tl.int64)[:, None] * H + heads[None, :]
        pv = tl.load(p + offs, mask=v2, other=0).to(ACC)
        gv = tl.load(g + offs, mask=v2, other=0).to(ACC)
        tl.store(grad + offs, (pv * (gv - acc[None, :])).to(grad.dtype.element_ty), mask=v2)


def _softmax_launch(kernel, tensors, rowptr, H, dtype, device):
    num_rows = rowptr.shape[0] - 1
    hb = next_power_of_2(H)
    if num_rows and H:
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            kernel[(num_rows,)](*tensors, H, ACC=tl.float64 if dtype == torch.float64 else tl.float32,
                                BE=max(8, min(128, 1024 // hb)), HB=hb)


def edge_softmax(logits, rowptr, perm):
    out = torch.zeros_like(logits)
    _softmax_launch(_edge_softmax_kernel, (logits, rowptr, perm, out), rowptr, logits.shape[1], logits.dtype,
                    logits.device)
    return out


def edge_softmax_backward(grad, out, rowptr, perm):
    result = torch.zeros_like(out)
    _softmax_launch(_edge_softmax_backward_kernel, (grad.contiguous(), out, rowptr, perm, result), rowptr,
                    out.shape[1], out.dtype, out.device)
    return result
