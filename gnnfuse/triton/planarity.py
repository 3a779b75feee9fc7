"""Triton kernels of ``gnnfuse.planarity_nll`` (see gnnfuse/ops/planarity.py for the maths).

One launch covers every bucket: one program per block of ``BLOCK`` planes of one bucket (a
table of blocks gives its planes, plane size n and first index entry), a loop over the n atoms
(n is a runtime value: one compiled kernel serves every plane size, so compiling costs about a
second instead of one specialisation per size with unrolled loops). Per plane, in float64:
centroid, 3x3 covariance, a fixed number of cyclic Jacobi sweeps (branch-free: no host sync, so
the call can be captured in a CUDA graph), the normal of the smallest eigenvalue (zero when
the covariance is not finite), the distances, the NLL, and per (plane, atom) the backward
coefficient (d - mean d) / s^2. The backward is then a pure scatter: it reads the upstream
gradient from device memory and adds g * coef * n_p to the atoms with atomics (GPU results may
differ in the last bits from run to run; the CPU kernels are the deterministic ones).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .._tensor_cache import cached
from ._launch import fast_kernel

BLOCK = 128
# Jacobi policy (one policy, two forms): cyclic sweeps of 3 rotations until the off-diagonal is
# negligible. A unit-scaled 3x3 converges to double precision in 4-5 sweeps (quadratically), and a
# rotation of an exactly diagonal pair is the identity. The C++ kernel (csrc/planarity.cpp) stops
# at convergence, capped at 12 sweeps: a branch is free on a CPU. Here every lane of a block runs
# a fixed 6: a data-dependent loop would make the block wait for its slowest plane and add a
# branch per sweep, while sweeps past convergence move the normal far below double precision
# (an exactly diagonal pair is not rotated at all). Both are tested against
# torch.linalg.eigh on badly scaled planes (tests/test_planarity.py).
SWEEPS = 6
HALF_LOG_2PI = 0.9189385332046727417803297364056176


@triton.jit
def _rotate(app, aqq, apq, arp, arq, v0p, v0q, v1p, v1q, v2p, v2q):
    """One Jacobi rotation zeroing apq (r is the third index); returns the updated entries."""
    # t = tan of the rotation angle = sgn(h) 2apq / (|h| + sqrt(h^2 + 4apq^2)), h = aqq - app, with
    # both terms scaled by their maximum first (no overflow, no underflow, no 0/0).
    h = aqq - app
    p2 = 2.0 * apq
    m = tl.maximum(tl.abs(h), tl.abs(p2))
    nonzero = (apq != 0.0) & (m > 0.0)
    rm = 1.0 / tl.where(nonzero, m, 1.0)
    hn = h * rm
    pn = p2 * rm
    den = tl.abs(hn) + tl.sqrt(hn * hn + pn * pn)
    t = pn / tl.where(nonzero, den, 1.0)
    t = tl.where(h < 0.0, -t, t)
    t = tl.where(nonzero, t, 0.0)
    c = 1.0 / tl.sqrt(t * t + 1.0)
    s = t * c
    tau = s / (1.0 + c)
    app_new = app - t * apq
    aqq_new = aqq + t * apq
    arp_new = arp - s * (arq + tau * arp)
    arq_new = arq + s * (arp - tau * arq)
    v0p_new = v0p - s * (v0q + tau * v0p)
    v0q_new = v0q + s * (v0p - tau * v0q)
    v1p_new = v1p - s * (v1q + tau * v1p)
    v1q_new = v1q + s * (v1p - tau * v1q)
    v2p_new = v2p - s * (v2q + tau * v2p)
    v2q_new = v2q + s * (v2p - tau * v2q)
    return app_new, aqq_new, arp_new, arq_new, v0p_new, v0q_new, v1p_new, v1q_new, v2p_new, v2q_new


@triton.jit
def _atom_position(xyz_ptr, idx_ptr, entry, mask, A):
    """float64 position of the atom at index entry ``entry`` (zero where masked or out of range)."""
    i = tl.load(idx_ptr + entry, mask=mask, other=0).to(tl.int64)
    ok = mask & (i >= 0) & (i < A)
    x = tl.load(xyz_ptr + i * 3, mask=ok, other=0.0).to(tl.float64)
    y = tl.load(xyz_ptr + i * 3 + 1, mask=ok, other=0.0).to(tl.float64)
    z = tl.load(xyz_ptr + i * 3 + 2, mask=ok, other=0.0).to(tl.float64)
    return x, y, z


@triton.jit
def _centroid(xyz_ptr, idx_ptr, entries, mask, A, N, BLOCK_P: tl.constexpr):
    sx = tl.zeros([BLOCK_P], dtype=tl.float64)
    sy = tl.zeros([BLOCK_P], dtype=tl.float64)
    sz = tl.zeros([BLOCK_P], dtype=tl.float64)
    for a in range(N):
        x, y, z = _atom_position(xyz_ptr, idx_ptr, entries + a, mask, A)
        sx += x
        sy += y
        sz += z
    return sx / N, sy / N, sz / N


@triton.jit
def _block_rows(blocks_ptr, BLOCK_P: tl.constexpr):
    """This program's planes (global ids), mask, plane size and first entry (see _layout)."""
    b = tl.program_id(0).to(tl.int64) * 4
    first = tl.load(blocks_ptr + b)
    end = tl.load(blocks_ptr + b + 1)
    N = tl.load(blocks_ptr + b + 2)
    entry0 = tl.load(blocks_ptr + b + 3)
    rows = first + tl.arange(0, BLOCK_P)
    return rows, rows < end, N, entry0 + (rows - first) * N


@fast_kernel
@triton.jit
def _forward_kernel(xyz_ptr, idx_ptr, sigma_ptr, blocks_ptr, plane_ptr, coef_ptr, loss_ptr, A,
                    BLOCK_P: tl.constexpr, SWEEPS_: tl.constexpr, HALF_LOG_2PI_: tl.constexpr):
    rows, mask, N, entries = _block_rows(blocks_ptr, BLOCK_P)
    cx, cy, cz = _centroid(xyz_ptr, idx_ptr, entries, mask, A, N, BLOCK_P)
    c00 = tl.zeros([BLOCK_P], dtype=tl.float64)
    c01 = tl.zeros([BLOCK_P], dtype=tl.float64)
    c02 = tl.zeros([BLOCK_P], dtype=tl.float64)
    c11 = tl.zeros([BLOCK_P], dtype=tl.float64)
    c12 = tl.zeros([BLOCK_P], dtype=tl.float64)
    c22 = tl.zeros([BLOCK_P], dtype=tl.float64)
    for a in range(N):
        x, y, z = _atom_position(xyz_ptr, idx_ptr, entries + a, mask, A)
        x, y, z = x - cx, y - cy, z - cz
        c00 += x * x
        c01 += x * y
        c02 += x * z
        c11 += y * y
        c12 += y * z
        c22 += z * z
    c00 = c00 / N
    c01 = c01 / N
    c02 = c02 / N
    c11 = c11 / N
    c12 = c12 / N
    c22 = c22 / N
    # non-finite covariance -> zero normal (x - x == 0 exactly for finite x, NaN otherwise)
    probe = c00 + c01 + c02 + c11 + c12 + c22
    finite = (c00 - c00 == 0.0) & (c01 - c01 == 0.0) & (c02 - c02 == 0.0) & (c11 - c11 == 0.0) \
        & (c12 - c12 == 0.0) & (c22 - c22 == 0.0) & (probe == probe)
    scale = tl.maximum(tl.maximum(tl.abs(c00), tl.abs(c11)), tl.abs(c22))
    scale = tl.maximum(scale, tl.maximum(tl.maximum(tl.abs(c01), tl.abs(c02)), tl.abs(c12)))
    inv = tl.where(finite & (scale > 0.0), 1.0 / tl.where(scale > 0.0, scale, 1.0), 0.0)
    a00 = c00 * inv
    a01 = c01 * inv
    a02 = c02 * inv
    a11 = c11 * inv
    a12 = c12 * inv
    a22 = c22 * inv
    a00 = tl.where(finite, a00, 0.0)
    a01 = tl.where(finite, a01, 0.0)
    a02 = tl.where(finite, a02, 0.0)
    a11 = tl.where(finite, a11, 0.0)
    a12 = tl.where(finite, a12, 0.0)
    a22 = tl.where(finite, a22, 0.0)
    one = tl.full([BLOCK_P], 1.0, tl.float64)
    zero = tl.zeros([BLOCK_P], dtype=tl.float64)
    v00, v01, v02 = one, zero, zero
    v10, v11, v12 = zero, one, zero
    v20, v21, v22 = zero, zero, one
    for _ in range(SWEEPS_):
        # (p, q, r) = (0, 1, 2)
        a00, a11, a02, a12, v00, v01, v10, v11, v20, v21 = _rotate(
            a00, a11, a01, a02, a12, v00, v01, v10, v11, v20, v21)
        a01 = zero
        # (0, 2, 1)
        a00, a22, a01, a12, v00, v02, v10, v12, v20, v22 = _rotate(
            a00, a22, a02, a01, a12, v00, v02, v10, v12, v20, v22)
        a02 = zero
        # (1, 2, 0)
        a11, a22, a01, a02, v01, v02, v11, v12, v21, v22 = _rotate(
            a11, a22, a12, a01, a02, v01, v02, v11, v12, v21, v22)
        a12 = zero
    pick1 = a11 < a00
    lam = tl.where(pick1, a11, a00)
    nx = tl.where(pick1, v01, v00)
    ny = tl.where(pick1, v11, v10)
    nz = tl.where(pick1, v21, v20)
    pick2 = a22 < lam
    nx = tl.where(pick2, v02, nx)
    ny = tl.where(pick2, v12, ny)
    nz = tl.where(pick2, v22, nz)
    norm = tl.sqrt(nx * nx + ny * ny + nz * nz)
    rn = tl.where(finite, 1.0 / norm, 0.0)
    nx = nx * rn
    ny = ny * rn
    nz = nz * rn
    tl.store(plane_ptr + rows * 4, nx, mask=mask)
    tl.store(plane_ptr + rows * 4 + 1, ny, mask=mask)
    tl.store(plane_ptr + rows * 4 + 2, nz, mask=mask)
    sum_d = tl.zeros([BLOCK_P], dtype=tl.float64)
    sq = tl.zeros([BLOCK_P], dtype=tl.float64)
    for a in range(N):
        x, y, z = _atom_position(xyz_ptr, idx_ptr, entries + a, mask, A)
        x, y, z = x - cx, y - cy, z - cz
        d = x * nx + y * ny + z * nz
        tl.store(coef_ptr + entries + a, d, mask=mask)  # d for now; scaled below
        sum_d += d
        sq += d * d
    s = tl.load(sigma_ptr + rows, mask=mask, other=1.0).to(tl.float64)
    inv_s2 = 1.0 / (s * s)
    mean_d = sum_d / N
    for a in range(N):  # coef = (d - mean d) / s^2; each program re-reads only its own stores
        d = tl.load(coef_ptr + entries + a, mask=mask, other=0.0)
        tl.store(coef_ptr + entries + a, (d - mean_d) * inv_s2, mask=mask)
    tl.store(plane_ptr + rows * 4 + 3, sq, mask=mask)
    loss = 0.5 * sq * inv_s2 + N * (tl.log(s) + HALF_LOG_2PI_)
    tl.store(loss_ptr + rows, loss, mask=mask)


@fast_kernel
@triton.jit
def _backward_kernel(grad_ptr, idx_ptr, sigma_ptr, blocks_ptr, plane_ptr, coef_ptr, gxyz_ptr, gsigma_ptr, A,
                     BLOCK_P: tl.constexpr, NEED_SIGMA: tl.constexpr):
    rows, mask, N, entries = _block_rows(blocks_ptr, BLOCK_P)
    g = tl.load(grad_ptr).to(tl.float64)  # upstream gradient: read on the device, no host sync
    nx = tl.load(plane_ptr + rows * 4, mask=mask, other=0.0)
    ny = tl.load(plane_ptr + rows * 4 + 1, mask=mask, other=0.0)
    nz = tl.load(plane_ptr + rows * 4 + 2, mask=mask, other=0.0)
    if NEED_SIGMA:
        s = tl.load(sigma_ptr + rows, mask=mask, other=1.0).to(tl.float64)
        sq = tl.load(plane_ptr + rows * 4 + 3, mask=mask, other=0.0)
        gs = g * (N / s - sq / (s * s * s))
        tl.store(gsigma_ptr + rows, gs.to(gsigma_ptr.dtype.element_ty), mask=mask)
    out_ty = gxyz_ptr.dtype.element_ty
    for a in range(N):
        i = tl.load(idx_ptr + entries + a, mask=mask, other=0).to(tl.int64)
        ok = mask & (i >= 0) & (i < A)
        f = g * tl.load(coef_ptr + entries + a, mask=mask, other=0.0)
        tl.atomic_add(gxyz_ptr + i * 3, (f * nx).to(out_ty), mask=ok, sem="relaxed")
        tl.atomic_add(gxyz_ptr + i * 3 + 1, (f * ny).to(out_ty), mask=ok, sem="relaxed")
        tl.atomic_add(gxyz_ptr + i * 3 + 2, (f * nz).to(out_ty), mask=ok, sem="relaxed")


# ---- launch layout: every bucket in one launch -------------------------------------------------
# The kernels take all buckets at once (flat indices, flat sigmas, a table of plane blocks), so a
# call costs one forward and one backward launch whatever the number of plane sizes. The layout
# is cached: a refinement loop calls with the same plane tensors every step (only xyz moves), and a
# cache hit does no host-to-device copy (so warmed-up calls can be captured in a CUDA graph).
def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat of the flattened tensors, cached on the tensor objects (gnnfuse._tensor_cache)."""
    return cached("planarity_flat", tuple(tensors), (), lambda: torch.cat([t.reshape(-1) for t in tensors]))


def _blocks(indices: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """[num_blocks, 4] int64 rows (first plane, end plane, n, first entry): BLOCK planes of one bucket each."""
    return _blocks_for(tuple((int(i.shape[0]), int(i.shape[1])) for i in indices), device)


@functools.lru_cache(maxsize=8)
def _blocks_for(shapes: tuple[tuple[int, int], ...], device: torch.device) -> torch.Tensor:
    rows, plane, entry = [], 0, 0
    for P, n in shapes:
        for first in range(plane, plane + P, BLOCK):
            rows.append((first, min(first + BLOCK, plane + P), n, entry + (first - plane) * n))
        plane += P
        entry += P * n
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, 4).to(device)


def forward(xyz: torch.Tensor, indices: list[torch.Tensor], sigmas: list[torch.Tensor]):
    """(loss [] in xyz's dtype, planes [sum P, 4] float64, coef [sum P*n] float64): see ops/planarity.py."""
    total = sum(int(i.shape[0]) for i in indices)
    entries = sum(int(i.shape[0]) * int(i.shape[1]) for i in indices)
    planes = xyz.new_empty((total, 4), dtype=torch.float64)
    coef = xyz.new_empty(entries, dtype=torch.float64)
    per_plane = xyz.new_zeros(total, dtype=torch.float64)
    if total:
        blocks = _blocks(indices, xyz.device)
        _forward_kernel[(blocks.shape[0],)](xyz, _flat(indices), _flat(sigmas), blocks, planes, coef, per_plane,
                                            xyz.shape[0], BLOCK_P=BLOCK, SWEEPS_=SWEEPS, HALF_LOG_2PI_=HALF_LOG_2PI)
    return per_plane.sum().to(xyz.dtype), planes, coef


def backward(grad: torch.Tensor, xyz: torch.Tensor, indices: list[torch.Tensor], sigmas: list[torch.Tensor],
             planes: torch.Tensor, coef: torch.Tensor, need_sigma_grad: bool):
    """(grad_xyz [A, 3], grad_sigma [sum P] or [0]), both in xyz's dtype."""
    total = int(planes.shape[0])
    grad = grad.reshape(1).contiguous()
    grad_xyz = torch.zeros_like(xyz)
    grad_sigma = xyz.new_empty(total if need_sigma_grad else 0)
    if total:
        blocks = _blocks(indices, xyz.device)
        _backward_kernel[(blocks.shape[0],)](grad, _flat(indices), _flat(sigmas), blocks, planes, coef, grad_xyz,
                                             grad_sigma, xyz.shape[0], BLOCK_P=BLOCK, NEED_SIGMA=need_sigma_grad)
    return grad_xyz, grad_sigma
