"""Triton kernels of ``gnnfuse.structured_scatter_add`` (forward scatter, backward gather).

One program handles ``BLOCK`` (<= 1024) consecutive elements of one atom's flattened box
(c, ix * ny * nz + iy * nz + iz): it loads the cube values contiguously, forms the flat index
wa[c, ix] + wbwc[c, iy, iz] (both rows stay in L1/L2) and

* forward: ``tl.atomic_add`` s the values into ``out``. Atomics are acceptable here: within one
  atom the flat indices are distinct (no conflicts inside a program), and two atoms only collide
  where their boxes overlap, so contention is low and the atomics run at close to plain-store
  throughput: on an H200 (2026-11-21) a variant with plain stores (wrong sums, for timing only)
  ran no faster, and one with 16-byte vector atomics (red.global.add.v4.f32, 3x fewer atomic
  instructions) ran slower. The cost is the scattered write traffic, not the atomics. The
  price is that float sums are not bitwise reproducible run to run (the order of the additions
  varies); the CPU kernel is deterministic. A deterministic GPU scheme (bin atoms by output
  tile, reduce each tile in atom order) would need a sort and a second pass, which costs more
  than the atomics save for boxes of 8^3-16^3.
  float16/bfloat16 accumulate in a float32 buffer, cast once at the end.
* backward: gathers grad_out at the same flat indices (plain loads, deterministic).

The grid is 1-D and atom-major (all blocks of an atom run next to each other, sharing its index
rows and map region in cache). Atoms run in the caller's order, or, when the map is too large for
the L2 cache, in the order of their first flat index (:func:`atom_order`): the scattered writes
(or reads) of the programs in flight then stay in one region of the map, which L2 holds. Measured
on an H200 (2026-11-21) with random atom order on 256^3-320^3 maps: 1.9-2.4x faster with the
order than without; the order is an argsort of C keys, cached on the wa/wbwc tensor objects, so
a loop that passes the same index tensors sorts once.

Every access is masked to [0, map_size): with ``check_bounds=False`` an out-of-range element is
dropped (forward) or reads 0 (backward), never an out-of-bounds access. With ``check_bounds=True``
the same kernel also records the first atom that has an out-of-range element (an atomic_min
only in programs that have one), and one host sync after the launch raises the error: no
separate reduction kernels. (The sync is inside the op, invisible to torch.compile.) A pass is
remembered on the wa/wbwc tensor objects (with their version counters, like the atom order), so
a loop over the same unchanged index tensors pays the check and its sync once.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .._tensor_cache import cached
from .._validate import IndexOutOfRange
from ..constants import DEFAULT_L2_BYTES, HALF_DTYPES
from ._grid import cdiv, next_power_of_2
from ._launch import fast_kernel

MAX_BLOCK = 1024  # elements per program; small boxes get one program of next_pow2(nx*ny*nz) lanes
NUM_WARPS = 4
# Order the atoms (see the module docstring) only for maps larger than this fraction of the L2
# cache (a map that fits stays cached in any order: measured no gain on a 16 MB map) and for
# calls with enough elements for the order to matter more than its argsort (~70 us on an H200).
ORDER_MAP_L2_FRACTION = 0.5
ORDER_MIN_ELEMENTS = 1 << 22


@triton.jit
def _box_elements(order_ptr, wa_ptr, bc_ptr, map_size, nx, nyz, blocks_per_atom, BLOCK: tl.constexpr,
                  ORDERED: tl.constexpr):
    """This program's atom c and BLOCK offsets e in its box (inside: e < box size nxyz), their flat
    map indices idx = wa[c, ix] + wbwc[c, iy, iz] and ok = inside and idx in [0, map_size)."""
    pid = tl.program_id(0)
    slot = pid // blocks_per_atom
    if ORDERED:
        c = tl.load(order_ptr + slot).to(tl.int64)
    else:
        c = slot.to(tl.int64)
    e = (pid - slot * blocks_per_atom) * BLOCK + tl.arange(0, BLOCK)  # offset in the box: int32 is enough
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
def _scatter_kernel(cube_ptr, wa_ptr, bc_ptr, out_ptr, flag_ptr, order_ptr, map_size, nx, nyz, blocks_per_atom,
                    BLOCK: tl.constexpr, CHECK: tl.constexpr, ORDERED: tl.constexpr):
    c, e, nxyz, inside, idx, ok = _box_elements(order_ptr, wa_ptr, bc_ptr, map_size, nx, nyz, blocks_per_atom,
                                                BLOCK, ORDERED)
    v = tl.load(cube_ptr + c * nxyz + e, mask=inside, other=0.0).to(out_ptr.dtype.element_ty)
    tl.atomic_add(out_ptr + idx, v, mask=ok, sem="relaxed")
    if CHECK:
        _flag_out_of_range(flag_ptr, c, inside & ~ok)


@fast_kernel
@triton.jit
def _gather_kernel(grad_out_ptr, wa_ptr, bc_ptr, grad_cube_ptr, flag_ptr, order_ptr, map_size, nx, nyz,
                   blocks_per_atom, BLOCK: tl.constexpr, CHECK: tl.constexpr, ORDERED: tl.constexpr):
    c, e, nxyz, inside, idx, ok = _box_elements(order_ptr, wa_ptr, bc_ptr, map_size, nx, nyz, blocks_per_atom,
                                                BLOCK, ORDERED)
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
    raise IndexOutOfRange(
        f"{op}: index out of range: atom {c} has flat indices wa[{c}, :] + wbwc[{c}, :, :] spanning "
        f"[{lo}, {hi}], outside [0, map_size={map_size}). Fix wa/wbwc (or map_size); "
        "check_bounds=False drops such elements instead of raising."
    )


def _new_flag(wa: torch.Tensor, check: bool) -> torch.Tensor:
    return torch.full((1,), wa.shape[0], dtype=torch.int32, device=wa.device) if check else wa


def _layout(wa: torch.Tensor, nyz: int) -> tuple[int, int, tuple[int]]:
    """(BLOCK, blocks per atom, 1-D grid) for boxes of nx * nyz elements."""
    nxyz = wa.shape[1] * nyz
    block = max(128, min(MAX_BLOCK, next_power_of_2(max(nxyz, 1))))
    blocks_per_atom = cdiv(nxyz, block)
    return block, blocks_per_atom, (wa.shape[0] * blocks_per_atom,)


def atom_order(wa: torch.Tensor, wbwc: torch.Tensor, map_bytes: int) -> torch.Tensor | None:
    """The order to process atoms in: None (as given) for maps that fit in L2 or small calls, else
    the atoms sorted by the flat index of their box's first element (cached, see the docstring)."""
    elements = wa.shape[0] * wa.shape[1] * wbwc.shape[1] * wbwc.shape[2]
    if elements < ORDER_MIN_ELEMENTS or map_bytes <= ORDER_MAP_L2_FRACTION * _l2_bytes(wa.device):
        return None
    # int32 keys may wrap for out-of-range indices: that only changes the order, never a result
    return cached("atom_order", (wa, wbwc), (), lambda: torch.argsort(wa[:, 0] + wbwc[:, 0, 0]))


@functools.lru_cache(maxsize=None)
def _l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 0  # the interpreter on CPU tensors: no L2 (ORDER_MIN_ELEMENTS alone decides)
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", DEFAULT_L2_BYTES))


def scatter(density_cube: torch.Tensor, wa: torch.Tensor, wbwc: torch.Tensor, map_size: int,
            check: bool = True) -> torch.Tensor:
    """out [map_size] = structured scatter-add of contiguous density_cube [C, nx, ny, nz]."""
    half = density_cube.dtype in HALF_DTYPES
    out = torch.zeros(map_size, dtype=torch.float32 if half else density_cube.dtype, device=density_cube.device)
    if density_cube.numel():
        _launch(_scatter_kernel, "structured_scatter_add", density_cube, out, wa, wbwc, out, check)
    return out.to(density_cube.dtype) if half else out


def gather(grad_out: torch.Tensor, wa: torch.Tensor, wbwc: torch.Tensor, check: bool = True) -> torch.Tensor:
    """grad_cube [C, nx, ny, nz] = grad_out[wa[c, ix] + wbwc[c, iy, iz]] for contiguous 1-D grad_out."""
    C, nx = wa.shape
    grad_cube = torch.empty((C, nx, *wbwc.shape[1:]), dtype=grad_out.dtype, device=grad_out.device)
    if grad_cube.numel():
        _launch(_gather_kernel, "structured_gather", grad_out, grad_cube, wa, wbwc, grad_out, check)
    return grad_cube


def _launch(kernel, op: str, src: torch.Tensor, dst: torch.Tensor, wa: torch.Tensor, wbwc: torch.Tensor,
            density_map: torch.Tensor, check: bool) -> None:
    """Runs the scatter or gather kernel over every atom's box: 1-D grid, atom order for large maps,
    and the in-kernel bounds check unless these wa/wbwc were already checked against the map size.
    density_map is the 1-D map (the scatter's dst, the gather's src)."""
    map_size = density_map.shape[0]
    checked = _bounds_checked(wa, wbwc, map_size) if check else None
    check = checked is not None and not checked[0]
    flag = _new_flag(wa, check)
    nyz = wbwc.shape[1] * wbwc.shape[2]
    block, blocks_per_atom, grid = _layout(wa, nyz)
    order = atom_order(wa, wbwc, map_size * density_map.element_size())
    kernel[grid](src, wa, wbwc, dst, flag, wa if order is None else order, map_size, wa.shape[1], nyz,
                 blocks_per_atom, BLOCK=block, CHECK=check, ORDERED=order is not None, num_warps=NUM_WARPS)
    if checked is not None and check:
        _raise_if_flagged(op, flag, wa, wbwc, map_size)
        checked[0] = True


def _bounds_checked(wa: torch.Tensor, wbwc: torch.Tensor, map_size: int) -> list[bool]:
    """[True] once these wa/wbwc passed the bounds check against map_size, unchanged since (as
    gnnfuse._tensor_cache defines it): a loop over the same index tensors syncs for the check once."""
    return cached("bounds_checked", (wa, wbwc), (map_size,), lambda: [False])
