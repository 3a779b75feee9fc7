"""``gnnfuse.structured_scatter_add``: out[wa[c,ix] + wbwc[c,iy,iz]] += density_cube[c,ix,iy,iz].

The map-building reduction of crystallography / cryo-EM (each atom's small density box added
into a flattened 3-D map). It is a gather-scatter whose edge list is implicit: the flat target
of element (c, ix, iy, iz) is wa[c, ix] + wbwc[c, iy, iz], so no C x nx x ny x nz index tensor
is ever built.

Layers, top to bottom:
  * :func:`structured_scatter_add` - public API: validation, backend choice;
  * ``gnnfuse::structured_scatter_add`` - the op (described once in :data:`SCATTER`, see
    ops/_opdef.py), with fake and autograd rules;
    its gradient w.r.t. density_cube is
  * ``gnnfuse::structured_gather`` - grad_cube[c,ix,iy,iz] = grad_out[wa[c,ix] + wbwc[c,iy,iz]]
    (whose own gradient is the scatter again, so double backward works).
Kernels: C++ in csrc/density_scatter.cpp (CPU: partitioned, deterministic, no atomics) and
Triton in gnnfuse/triton/structured_scatter.py (CUDA: atomics forward, gather backward).
"""
from __future__ import annotations


import torch

from .. import reference
from .._build import load_extension
from .._validate import (
    IndexOutOfRange,
    require_floating,
    require_index,
    require_node_count,
    require_same_device,
    require_shape,
    require_tensor,
)
from ..constants import INT32_MAX
from ._library import resolve_backend, triton_module
from ._opdef import OpDef

# The scatter's contract: density_cube [C, nx, ny, nz] contiguous floating; wa [C, nx] and wbwc
# [C, ny, nz] contiguous, one index dtype. Returns out [map_size] in density_cube's dtype.
# structured_gather: grad_out [map_size] contiguous -> [C, nx, ny, nz] in grad_out's dtype.


_triton = triton_module("structured_scatter")


# ---- kernels --------------------------------------------------------------------------------
def _scatter_cpp(density_cube, wa, wbwc, map_size, check_bounds):
    try:
        return load_extension("density").structured_scatter_forward(density_cube, wa, wbwc, map_size, check_bounds)
    except ValueError as exc:
        raise _as_out_of_range(exc) from None


def _gather_cpp(grad_out, wa, wbwc, ny, nz, check_bounds):
    try:
        return load_extension("density").structured_gather_forward(grad_out, wa, wbwc, ny, nz, check_bounds)
    except ValueError as exc:
        raise _as_out_of_range(exc) from None


def _as_out_of_range(exc: ValueError) -> ValueError:
    """The kernels' bounds error as gnnfuse.IndexOutOfRange (also a ValueError); others unchanged."""
    return IndexOutOfRange(str(exc)) if "index out of range" in str(exc) else exc


def _scatter_triton(density_cube, wa, wbwc, map_size, check_bounds):
    return _triton().scatter(density_cube, wa, wbwc, map_size, check_bounds)


def _gather_triton(grad_out, wa, wbwc, ny, nz, check_bounds):
    return _triton().gather(grad_out, wa, wbwc, check_bounds)


# ---- autograd: the scatter and the gather are each other's adjoint ---------------------------
# (the forward has checked the bounds already, or the caller waived the check: the adjoint skips it)
def _save_scatter(ctx, inputs, output):
    return inputs[1], inputs[2]  # wa, wbwc


def _backward_scatter(ctx, saved, grad_out):
    wa, wbwc = saved
    grad = GATHER.from_backward(ctx, grad_out.contiguous(), wa, wbwc, wbwc.shape[1], wbwc.shape[2], False)
    return grad, None, None, None, None


def _save_gather(ctx, inputs, output):
    ctx.map_size = inputs[0].shape[0]
    return inputs[1], inputs[2]


def _backward_gather(ctx, saved, grad_cube):
    wa, wbwc = saved
    grad = SCATTER.from_backward(ctx, grad_cube.contiguous(), wa, wbwc, ctx.map_size, False)
    return grad, None, None, None, None, None


SCATTER = OpDef(
    "structured_scatter_add(Tensor density_cube, Tensor wa, Tensor wbwc, SymInt map_size, bool check_bounds) "
    "-> Tensor",
    kernels={"cpu": _scatter_cpp, "triton": _scatter_triton},
    fake=lambda density_cube, wa, wbwc, map_size, check_bounds: density_cube.new_empty(map_size),
    save=_save_scatter, backward=_backward_scatter)
GATHER = OpDef(
    "structured_gather(Tensor grad_out, Tensor wa, Tensor wbwc, SymInt ny, SymInt nz, bool check_bounds) -> Tensor",
    kernels={"cpu": _gather_cpp, "triton": _gather_triton},
    fake=lambda grad_out, wa, wbwc, ny, nz, check_bounds: grad_out.new_empty(wa.shape[0], wa.shape[1], ny, nz),
    save=_save_gather, backward=_backward_gather)


# ---- public API ---------------------------------------------------------------------------------
def structured_scatter_add(
    density_cube: torch.Tensor,
    wa: torch.Tensor,
    wbwc: torch.Tensor,
    map_size: int,
    *,
    check_bounds: bool = True,
    backend: str = "auto",
) -> torch.Tensor:
    """Adds every atom's density box into a flattened map: the structured scatter-add

        out[wa[c, ix] + wbwc[c, iy, iz]] += density_cube[c, ix, iy, iz]

    Args:
        density_cube: [C, nx, ny, nz] density values of C atoms' boxes (float32, float64,
            float16, bfloat16). Differentiable: the gradient is the structured gather
            grad_cube[c, ix, iy, iz] = grad_out[wa[c, ix] + wbwc[c, iy, iz]].
        wa: [C, nx] flat-index part of each box x-slab (e.g. ((x0 + ix) % NX) * NY * NZ).
        wbwc: [C, ny, nz] flat-index part of each (y, z) column (e.g. ((y0+iy) % NY) * NZ +
            (z0+iz) % NZ). wa and wbwc must share one dtype: int32 (fast, half the index
            bandwidth) or int64 (needed when map_size > 2**31 - 1). No gradient.
        map_size: length of the output map (e.g. NX * NY * NZ).
        check_bounds: every flat index must lie in [0, map_size). True (default) checks it and
            raises ValueError naming the first bad atom: on CPU from the per-atom min/max of wa
            and wbwc rows (free), on GPU inside the scatter kernel (one host sync after it; a
            pass is remembered on the wa/wbwc tensors while they are unchanged, as
            gnnfuse._tensor_cache defines it, so a loop over the same index tensors syncs once).
            False skips the check on the caller's guarantee; out-of-range elements are then
            dropped (never written out of bounds).
        backend: "auto" | "cpu" | "triton" | "reference" (env ``GNNFUSE_BACKEND`` replaces "auto").

    Returns:
        out [map_size] in density_cube's dtype (float16/bfloat16 accumulate in float32). On CPU
        the result is bitwise reproducible for any thread count (each output range is owned by
        one thread, atoms added in order); the GPU forward uses atomics, so float sums may
        differ in the last bits from run to run. Inputs are never modified.

    Speed: on CPU, sort atoms by their 1-D centre (e.g. by wa[:, 0] + wbwc[:, 0, 0]) for
    near-linear thread scaling: each thread then skips most atoms and adds the rest with no
    per-element check. On GPU, maps larger than half the L2 cache are built with the atoms in
    that order whatever order they come in (an argsort, cached on the wa/wbwc tensor objects):
    pass the same index tensors each call where the atoms have not moved.
    """
    density_cube = require_tensor("density_cube", density_cube)
    wa = require_tensor("wa", wa)
    wbwc = require_tensor("wbwc", wbwc)
    require_floating("density_cube", density_cube)
    require_index("wa", wa)
    require_index("wbwc", wbwc)
    if wa.dtype != wbwc.dtype:
        raise TypeError(f"wa and wbwc must have the same index dtype; got wa {wa.dtype}, wbwc {wbwc.dtype} "
                        "(use int64 for both if the map has more than 2**31 - 1 voxels, else int32)")
    require_shape("density_cube", density_cube, "[C, nx, ny, nz]", density_cube.dim() == 4)
    C, nx, ny, nz = density_cube.shape
    if wa.shape != (C, nx) or wbwc.shape != (C, ny, nz):  # the messages are built only on failure
        require_shape("wa", wa, f"[C, nx] = [{C}, {nx}] (from density_cube)", wa.shape == (C, nx))
        require_shape("wbwc", wbwc, f"[C, ny, nz] = [{C}, {ny}, {nz}] (from density_cube)", False)
    map_size = require_node_count("map_size", map_size)  # any integer type; a SymInt under compile
    if wa.dtype == torch.int32 and map_size > INT32_MAX:
        raise ValueError(f"map_size={map_size} exceeds 2**31 - 1, which int32 wa/wbwc cannot address; "
                         "pass wa and wbwc as int64")
    if not isinstance(check_bounds, bool):
        raise TypeError(f"check_bounds must be a bool; got {type(check_bounds).__name__}")
    device = density_cube.device
    if wa.device != device or wbwc.device != device:
        require_same_device(density_cube=density_cube, wa=wa, wbwc=wbwc)  # raises, naming them
    backend = resolve_backend(backend, device)

    if backend == "reference":
        return reference.structured_scatter_add(density_cube, wa, wbwc, map_size, check_bounds)
    cube, wa, wbwc = density_cube.contiguous(), wa.contiguous(), wbwc.contiguous()
    return SCATTER(cube, wa, wbwc, map_size, check_bounds, backend=backend)
