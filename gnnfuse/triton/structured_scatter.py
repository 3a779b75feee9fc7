"""Triton kernels of ``gnnfuse.structured_scatter_add`` (forward scatter, backward gather).

One program handles ``BLOCK`` (<= 1024) consecutive elements of one atom's flattened box
(c, ix * ny * nz + iy * nz + iz): it loads the cube values contiguously, forms the flat index
wa[c, ix] + wbwc[c, iy, iz] (both rows stay in L1/L2) and

* forward: ``tl.atomic_add`` s the values into ``out``. Atomics are acceptable here: within one
  atom the flat indices are distinct (no conflicts inside a program), and two atoms only collide
  where their boxes overlap, so contention is low and the atomics run at close to plain-store
  throughput on H100-class GPUs. The price is that float sums are not bitwise reproducible
  run to run (the order of the additions varies); the CPU kernel is deterministic. A
  deterministic GPU scheme (bin atoms by output tile, reduce each tile in atom order) would
  need a sort and a second pass, which costs more than the atomics save for boxes of 8^3-16^3.
  float16/bfloat16 accumulate in a float32 buffer, cast once at the end.
* backward: gathers grad_out at the same flat indices (plain loads, deterministic).

Every access is masked to [0, map_size): with ``check_bounds=False`` an out-of-range element is
dropped (forward) or reads 0 (backward), never an out-of-bounds access. With ``check_bounds=True``
the same kernel also records the first atom that has an out-of-range element (an atomic_min
only in programs that have one), and one host sync after the launch raises the error: no
separate reduction kernels. (The sync is inside the op, invisible to torch.compile.)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import fast_kernel

MAX_BLOCK = 1024  # elements per program; small boxes get one program of next_pow2(nx*ny*nz) lanes
NUM_WARPS = 4


@triton.jit
def _box_elements(wa_ptr, bc_ptr, map_size, nx, nyz, BLOCK: tl.constexpr):
    """This program's atom c and BLOCK offsets e in its box (inside: e < box size nxyz), their flat
    map indices idx = wa[c, ix] + wbwc[c, iy, iz] and ok = inside and idx in [0, map_size)."""
    c = tl.program_id(0).to(tl.int64)
    e = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # offset inside the atom's box: int32 is enough
    nxyz = nx * nyz
    inside = e < nxyz
    ix = e // nyz
    j = e - ix * nyz
    a = tl.load(wa_ptr + c * nx + ix, mask=inside, other=0).to(tl.int64)
    b = tl.load(bc_ptr + c * nyz + j, mask=inside, other=0).to(tl.int64)
    idx = a + b
    return c, e, nxyz, inside, idx, inside & (idx >= 0) & (idx < map_size)


@fast_kernel
@triton.jit
def _scatter_kernel(cube_ptr, wa_ptr, bc_ptr, out_ptr, flag_ptr, map_size, nx, nyz, BLOCK: tl.constexpr,
                    CHECK: tl.constexpr):
    c, e, nxyz, inside, idx, ok = _box_elements(wa_ptr, bc_ptr, map_size, nx, nyz, BLOCK)
    v = tl.load(cube_ptr + c * nxyz + e, mask=inside, other=0.0).to(out_ptr.dtype.element_ty)
    tl.atomic_add(out_ptr + idx, v, mask=ok, sem="relaxed")
    if CHECK:
        _flag_out_of_range(flag_ptr, c, inside & ~ok)


@fast_kernel
@triton.jit
def _gather_kernel(grad_out_ptr, wa_ptr, bc_ptr, grad_cube_ptr, flag_ptr, map_size, nx, nyz, BLOCK: tl.constexpr,
                   CHECK: tl.constexpr):
    c, e, nxyz, inside, idx, ok = _box_elements(wa_ptr, bc_ptr, map_size, nx, nyz, BLOCK)
    g = tl.load(grad_out_ptr + idx, mask=ok, other=0.0)
    tl.store(grad_cube_ptr + c * nxyz + e, g, mask=inside)
    if CHECK:
        _flag_out_of_range(flag_ptr, c, inside & ~ok)


@triton.jit
def _flag_out_of_range(flag_ptr, c, bad):
    """flag = lowest atom with an out-of-range element (one atomic only in a program that has one)."""
    nbad = tl.sum(bad.to(tl.int32), axis=0)
    tl.atomic_min(flag_ptr, c, mask=nbad > 0)


def _raise_if_flagged(op: str, flag: torch.Tensor, wa: torch.Tensor, wbwc: torch.Tensor, map_size: int) -> None:
    """One host sync after the kernel: the flag holds the first bad atom, or C when all are in range.
    (Bad elements were masked: nothing was written or read out of bounds; the result is discarded.)"""
    c = int(flag.item())
    if c >= wa.shape[0]:
        return
    bc = wbwc[c].reshape(-1)
    lo = int(wa[c].amin()) + int(bc.amin())
    hi = int(wa[c].amax()) + int(bc.amax())
    raise ValueError(
        f"{op}: index out of range: atom {c} has flat indices wa[{c}, :] + wbwc[{c}, :, :] spanning "
        f"[{lo}, {hi}], outside [0, map_size={map_size}). Fix wa/wbwc (or map_size); "
        "check_bounds=False drops such elements instead of raising."
    )


def _new_flag(wa: torch.Tensor, check: bool) -> torch.Tensor:
    return torch.full((1,), wa.shape[0], dtype=torch.int32, device=wa.device) if check else wa


def _block(nxyz: int) -> int:
    return max(128, min(MAX_BLOCK, triton.next_power_of_2(max(nxyz, 1))))


def _grid(wa: torch.Tensor, nyz: int, block: int) -> tuple[int, int]:
    return (wa.shape[0], triton.cdiv(wa.shape[1] * nyz, block))


def scatter(density_cube: torch.Tensor, wa: torch.Tensor, wbwc: torch.Tensor, map_size: int,
            check: bool = True) -> torch.Tensor:
    """out [map_size] = structured scatter-add of contiguous density_cube [C, nx, ny, nz]."""
    half = density_cube.dtype in (torch.float16, torch.bfloat16)
    out = torch.zeros(map_size, dtype=torch.float32 if half else density_cube.dtype, device=density_cube.device)
    nyz = wbwc.shape[1] * wbwc.shape[2]
    if density_cube.numel():
        flag = _new_flag(wa, check)
        block = _block(wa.shape[1] * nyz)
        _scatter_kernel[_grid(wa, nyz, block)](density_cube, wa, wbwc, out, flag, map_size, wa.shape[1], nyz,
                                               BLOCK=block, CHECK=check, num_warps=NUM_WARPS)
        if check:
            _raise_if_flagged("structured_scatter_add", flag, wa, wbwc, map_size)
    return out.to(density_cube.dtype) if half else out


def gather(grad_out: torch.Tensor, wa: torch.Tensor, wbwc: torch.Tensor, check: bool = True) -> torch.Tensor:
    """grad_cube [C, nx, ny, nz] = grad_out[wa[c, ix] + wbwc[c, iy, iz]] for contiguous 1-D grad_out."""
    map_size = grad_out.shape[0]
    C, nx = wa.shape
    ny, nz = wbwc.shape[1], wbwc.shape[2]
    grad_cube = torch.empty((C, nx, ny, nz), dtype=grad_out.dtype, device=grad_out.device)
    if grad_cube.numel():
        flag = _new_flag(wa, check)
        block = _block(nx * ny * nz)
        _gather_kernel[_grid(wa, ny * nz, block)](grad_out, wa, wbwc, grad_cube, flag, map_size, nx, ny * nz,
                                                  BLOCK=block, CHECK=check, num_warps=NUM_WARPS)
        if check:
            _raise_if_flagged("structured_gather", flag, wa, wbwc, map_size)
    return grad_cube
