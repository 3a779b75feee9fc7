"""``gnnfuse.structured_scatter_add``: out[wa[c,ix] + wbwc[c,iy,iz]] += density_cube[c,ix,iy,iz].

The map-building reduction of crystallography / cryo-EM (each atom's small density box added
into a flattened 3-D map). It is a gather-scatter whose edge list is implicit: the flat target
of element (c, ix, iy, iz) is wa[c, ix] + wbwc[c, iy, iz], so no C x nx x ny x nz index tensor
is ever built.

Layers, top to bottom:
  * :func:`structured_scatter_add` - public API: validation, backend choice;
  * ``gnnfuse::structured_scatter_add`` - the torch.library op, with fake and autograd rules;
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
    INT32_MAX,
    IndexOutOfRange,
    require_floating,
    require_index,
    require_node_count,
    require_same_device,
    require_shape,
    require_tensor,
)
from ._library import define, eager_shortcut_ok, resolve_backend

OP = define(
    "structured_scatter_add(Tensor density_cube, Tensor wa, Tensor wbwc, SymInt map_size, bool check_bounds) "
    "-> Tensor"
)
GATHER_OP = define("structured_gather(Tensor grad_out, Tensor wa, Tensor wbwc, SymInt ny, SymInt nz, "
                   "bool check_bounds) -> Tensor")
# The op's contract: density_cube [C, nx, ny, nz] contiguous floating; wa [C, nx] and wbwc
# [C, ny, nz] contiguous, one index dtype. Returns out [map_size] in density_cube's dtype.
# structured_gather: grad_out [map_size] contiguous -> [C, nx, ny, nz] in grad_out's dtype.


def _triton():
    from ..triton import structured_scatter as kernels  # lazy: Triton is only needed on GPU

    return kernels


# ---- kernels --------------------------------------------------------------------------------
def _scatter_cpp(density_cube, wa, wbwc, map_size, check_bounds):
    try:
        return load_extension("density").structured_scatter_forward(density_cube, wa, wbwc, map_size, check_bounds)
    except ValueError as exc:
        raise _as_out_of_range(exc) from None


def _gather_cpp(grad_out, wa, wbwc, check_bounds):
    ny, nz = wbwc.shape[1], wbwc.shape[2]
    try:
        return load_extension("density").structured_gather_forward(grad_out, wa, wbwc, ny, nz, check_bounds)
    except ValueError as exc:
        raise _as_out_of_range(exc) from None


def _as_out_of_range(exc: ValueError) -> ValueError:
    """The kernels' bounds error as gnnfuse.IndexOutOfRange (also a ValueError); others unchanged."""
    return IndexOutOfRange(str(exc)) if "index out of range" in str(exc) else exc


def _scatter_triton(density_cube, wa, wbwc, map_size, check_bounds):
    return _triton().scatter(density_cube, wa, wbwc, map_size, check_bounds)


def _gather_triton(grad_out, wa, wbwc, check_bounds):
    return _triton().gather(grad_out, wa, wbwc, check_bounds)


# (scatter, gather) per backend: "cpu" C++, "triton" CUDA or the interpreter on CPU tensors
KERNELS = {"cpu": (_scatter_cpp, _gather_cpp), "triton": (_scatter_triton, _gather_triton)}
torch.library.impl(OP, "cpu")(_scatter_cpp)
torch.library.impl(OP, "cuda")(_scatter_triton)
torch.library.impl(GATHER_OP, "cpu")(lambda grad_out, wa, wbwc, ny, nz, check: _gather_cpp(grad_out, wa, wbwc, check))
torch.library.impl(GATHER_OP, "cuda")(
    lambda grad_out, wa, wbwc, ny, nz, check: _gather_triton(grad_out, wa, wbwc, check))


# ---- fake (shape) rules for torch.compile ------------------------------------------------------
@torch.library.register_fake(OP)
def _forward_fake(density_cube, wa, wbwc, map_size, check_bounds):
    return density_cube.new_empty(map_size)


@torch.library.register_fake(GATHER_OP)
def _gather_fake(grad_out, wa, wbwc, ny, nz, check_bounds):
    return grad_out.new_empty(wa.shape[0], wa.shape[1], ny, nz)


# ---- autograd: the scatter and the gather are each other's adjoint ---------------------------
def _setup_scatter(ctx, inputs, output):
    density_cube, wa, wbwc, map_size, check_bounds = inputs
    ctx.save_for_backward(wa, wbwc)


def _backward_scatter(ctx, grad_out):
    wa, wbwc = ctx.saved_tensors
    # The forward has checked the bounds already (or the caller waived the check): skip it.
    grad = torch.ops.gnnfuse.structured_gather(grad_out.contiguous(), wa, wbwc, wbwc.shape[1], wbwc.shape[2], False)
    return grad, None, None, None, None


def _setup_gather(ctx, inputs, output):
    grad_out, wa, wbwc, ny, nz, check_bounds = inputs
    ctx.map_size = grad_out.shape[0]
    ctx.save_for_backward(wa, wbwc)


def _backward_gather(ctx, grad_cube):
    wa, wbwc = ctx.saved_tensors
    grad = torch.ops.gnnfuse.structured_scatter_add(grad_cube.contiguous(), wa, wbwc, ctx.map_size, False)
    return grad, None, None, None, None, None


torch.library.register_autograd(OP, _backward_scatter, setup_context=_setup_scatter)
torch.library.register_autograd(GATHER_OP, _backward_gather, setup_context=_setup_gather)


# ---- eager shortcut around the dispatcher (see _library.eager_shortcut_ok) ----------------------
class _EagerStructuredScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, density_cube, wa, wbwc, map_size, check_bounds, backend):
        ctx.save_for_backward(wa, wbwc)
        ctx.backend = backend
        return KERNELS[backend][0](density_cube, wa, wbwc, map_size, check_bounds)

    @staticmethod
    def backward(ctx, grad_out):
        wa, wbwc = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        # bounds were checked by the forward (or waived by the caller)
        if torch.is_grad_enabled():  # create_graph=True: the registered gather op is differentiable
            grad = torch.ops.gnnfuse.structured_gather(grad_out, wa, wbwc, wbwc.shape[1], wbwc.shape[2], False)
        else:
            grad = KERNELS[ctx.backend][1](grad_out, wa, wbwc, False)
        return grad, None, None, None, None, None


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
    interpreted = backend == "triton" and device.type == "cpu"  # TRITON_INTERPRET=1: never through the op
    if interpreted or eager_shortcut_ok(cube):
        if not (cube.requires_grad and torch.is_grad_enabled()):  # no graph to record: the kernel alone
            return KERNELS[backend][0](cube, wa, wbwc, map_size, check_bounds)
        return _EagerStructuredScatter.apply(cube, wa, wbwc, map_size, check_bounds, backend)
    return torch.ops.gnnfuse.structured_scatter_add(cube, wa, wbwc, map_size, check_bounds)
