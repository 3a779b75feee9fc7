"""``gnnfuse.planarity_nll``: Gaussian NLL of the atoms' distances to their best-fit planes.

Layers, top to bottom:
  * :func:`planarity_nll` - public API: validation, dtype handling, backend choice;
  * ``gnnfuse::planarity_nll`` - the op on lists of buckets (``Tensor[]``; described once in
    :data:`FORWARD`, see ops/_opdef.py), with
    fake and autograd rules; it returns the loss plus float64 normals and per-atom coefficients
    (saved for backward, which is then a pure scatter);
  * ``gnnfuse::planarity_nll_backward`` - analytic gradients for the positions (and sigmas).
Kernels: C++ in csrc/planarity.cpp (CPU, deterministic, no atomics), Triton in
gnnfuse/triton/planarity.py (CUDA; also CPU tensors under ``TRITON_INTERPRET=1``).

Maths (per plane p of n atoms, sigma s_p): c_p = centroid; n_p = unit eigenvector of the smallest
eigenvalue of the 3x3 covariance, in float64, detached, from a fused Jacobi solver (zero when the
covariance is not finite); d_pa = (x_pa - c_p) . n_p;
NLL_p = sum_a 0.5 (d_pa / s_p)^2 + n (log s_p + 0.5 log 2 pi); the result is sum_p NLL_p.
"""
from __future__ import annotations

import torch

from .. import reference
from .._build import load_extension
from .._tensor_cache import cached
from .._validate import (
    IndexOutOfRange,
    device_assert,
    require_floating,
    require_index,
    require_same_device,
    require_shape,
    require_tensor,
)
from ..constants import INDEX_DTYPES, VALUE_DTYPES
from ._library import resolve_backend, triton_module
from ._opdef import OpDef

POSITION_DTYPES = (torch.float32, torch.float64)
# The op's signature: xyz [A, 3] contiguous float32/float64; indices[b] [P_b, n_b] contiguous
# int32/int64; sigmas[b] [P_b] contiguous with xyz's dtype. Returns the scalar loss (xyz's dtype)
# and, for the backward (non-differentiable, float64, bucket/plane/atom order):
# planes [sum_b P_b, 4] = (unit normal, sum_a d_pa^2) and coef [sum_b P_b n_b] =
# (d_pa - mean_a d_pa) / s_p^2, so that dNLL/dx_pa = coef_pa * n_p and the backward is a pure
# scatter. The backward returns grad_xyz [A, 3] and grad_sigmas [sum_b P_b] ([0] if not needed).


_triton = triton_module("planarity")


# ---- kernels --------------------------------------------------------------------------------
def _forward_cpp(xyz, indices, sigmas):
    try:
        return tuple(load_extension("planarity").planarity_forward(xyz, indices, sigmas))
    except IndexError as exc:  # the kernel's atom id range check
        raise IndexOutOfRange(str(exc)) from None


def _backward_cpp(grad, xyz, indices, sigmas, planes, coef, need_sigma_grad):
    return tuple(load_extension("planarity").planarity_backward(grad, xyz, indices, sigmas, planes, coef,
                                                               need_sigma_grad))


def _forward_triton(xyz, indices, sigmas):
    return _triton().forward(xyz, indices, sigmas)


def _backward_triton(grad, xyz, indices, sigmas, planes, coef, need_sigma_grad):
    return _triton().backward(grad, xyz, indices, sigmas, planes, coef, need_sigma_grad)


# ---- fake (shape) rules for torch.compile ------------------------------------------------------
def _num_planes(indices):
    return sum(idx.shape[0] for idx in indices)


def _forward_fake(xyz, indices, sigmas):
    entries = sum(idx.shape[0] * idx.shape[1] for idx in indices)
    return (xyz.new_empty(()), xyz.new_empty((_num_planes(indices), 4), dtype=torch.float64),
            xyz.new_empty((entries,), dtype=torch.float64))


def _backward_fake(grad, xyz, indices, sigmas, planes, coef, need_sigma_grad):
    grad_sigma = xyz.new_empty(_num_planes(indices)) if need_sigma_grad else xyz.new_empty(0)
    return torch.empty_like(xyz), grad_sigma


# ---- the backward's maths -------------------------------------------------------------------------
def _save(ctx, inputs, output):
    xyz, indices, sigmas = inputs
    ctx.mark_non_differentiable(output[1], output[2])
    return xyz, output[1], output[2], indices, sigmas


def _backward(ctx, saved, grad_loss, _grad_planes, _grad_coef):
    xyz, planes, coef, indices, sigmas = saved
    need_xyz, _, need_sigma = ctx.needs
    grad_xyz, grad_sigma = BACKWARD.from_backward(ctx, grad_loss, xyz, indices, sigmas, planes, coef, need_sigma)
    grad_sigmas = list(torch.split(grad_sigma, [s.shape[0] for s in sigmas])) if need_sigma else None
    return (grad_xyz if need_xyz else None), None, grad_sigmas


FORWARD = OpDef("planarity_nll(Tensor xyz, Tensor[] indices, Tensor[] sigmas) -> (Tensor, Tensor, Tensor)",
                kernels={"cpu": _forward_cpp, "triton": _forward_triton}, fake=_forward_fake, save=_save,
                backward=_backward, backward_only_outputs=(1, 2))
BACKWARD = OpDef(  # its own derivative is not implemented: double backward raises
    "planarity_nll_backward(Tensor grad, Tensor xyz, Tensor[] indices, Tensor[] sigmas, Tensor planes, "
    "Tensor coef, bool need_sigma_grad) -> (Tensor, Tensor)",
    kernels={"cpu": _backward_cpp, "triton": _backward_triton}, fake=_backward_fake, public_name="planarity_nll")


# ---- public API ---------------------------------------------------------------------------------
def planarity_nll(xyz: torch.Tensor, plane_groups, *, backend: str = "auto") -> torch.Tensor:
    """Planarity restraint: sum over planes of the Gaussian NLL of the atoms' out-of-plane distances.

    Args:
        xyz: [A, 3] atom positions, float32 or float64 (differentiable).
        plane_groups: list of buckets ``(indices, sigmas)``, one per plane size n: ``indices``
            [P, n] int32/int64 atom ids, ``sigmas`` [P] positive floats (cast to xyz's dtype;
            differentiable too). An empty list gives 0.
        backend: "auto" | "cpu" | "triton" | "reference" (env ``GNNFUSE_BACKEND`` replaces "auto").

    Returns:
        A 0-dim tensor with xyz's dtype and device:
        sum_p [sum_a 0.5 (d_pa / s_p)^2 + n (log s_p + 0.5 log 2 pi)], d_pa = (x_pa - c_p) . n_p.

    The normals are float64 and carry no gradient. A plane whose covariance is not finite (NaN/Inf
    or overflowing positions) gets a zero normal: no error, no host sync. Gradients are analytic;
    on CPU they are deterministic (no atomics). Atom ids are range-checked on CPU (IndexError);
    on CUDA an out-of-range id reads as a zero position (no check, which would need a sync).
    A sigma <= 0 raises ValueError on CPU (a device-side assertion on CUDA).
    """
    xyz = require_tensor("xyz", xyz)
    require_floating("xyz", xyz, POSITION_DTYPES)
    require_shape("xyz", xyz, "[A, 3]", xyz.dim() == 2 and xyz.shape[1] == 3)
    indices, sigmas = _check_groups(xyz, plane_groups)
    device = xyz.device
    if any(t.device != device for t in indices) or any(t.device != device for t in sigmas):
        require_same_device(xyz=xyz, **{f"plane_groups[{b}]": i for b, i in enumerate(indices)},
                            **{f"plane_groups[{b}] sigmas": s for b, s in enumerate(sigmas)})  # raises
    backend = resolve_backend(backend, device)
    _check_sigmas_positive(sigmas)
    if backend == "reference":
        return reference.planarity_nll(xyz, list(zip(indices, sigmas)))
    # (attribute checks first: most calls need no conversion, and each no-op .to()/.contiguous() costs)
    indices = [i if i.is_contiguous() else i.contiguous() for i in indices]
    sigmas = [s if s.dtype == xyz.dtype and s.is_contiguous() else s.to(xyz.dtype).contiguous() for s in sigmas]
    return FORWARD(xyz.contiguous(), indices, sigmas, backend=backend)[0]


def _check_groups(xyz: torch.Tensor, plane_groups) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    if not isinstance(plane_groups, (list, tuple)):
        raise TypeError(f"plane_groups must be a list of (indices, sigmas) pairs; got {type(plane_groups).__name__}")
    indices, sigmas = [], []
    for b, group in enumerate(plane_groups):
        # the common case in a few attribute reads (this runs on every refinement step); a bad
        # group goes through the named checks, which raise with the precise message
        if not _group_ok(group):
            _raise_for_group(b, group)
        indices.append(group[0])
        sigmas.append(group[1])
    return indices, sigmas


def _check_sigmas_positive(sigmas: list[torch.Tensor]) -> None:
    """A sigma <= 0 (or NaN) would give a NaN or infinite loss silently. On CPU: ValueError naming
    the bucket and plane. On CUDA and while tracing: a device-side assertion (no host sync). A
    pass is remembered on the unchanged sigma tensors (gnnfuse._tensor_cache): constant sigmas,
    the usual case, are checked once, not on every refinement step."""
    compiling = torch.compiler.is_compiling()
    for b, s in enumerate(sigmas):
        if s.numel() == 0:
            continue
        if compiling:
            device_assert((s > 0).all(), "planarity_nll: every sigma must be positive")
        else:
            cached("sigmas_positive", (s,), (b,), lambda b=b, s=s: _require_positive(b, s))  # type: ignore[misc]


def _require_positive(b: int, s: torch.Tensor) -> bool:
    if not s.is_cpu:
        device_assert((s > 0).all(), "planarity_nll: every sigma must be positive")
        return True
    positive = s.detach() > 0
    if not bool(positive.all()):
        p = int(torch.nonzero(~positive)[0, 0])
        raise ValueError(f"plane_groups[{b}] sigmas must be positive; sigma[{p}] = {float(s[p])}")
    return True


def _group_ok(group) -> bool:
    if not isinstance(group, (list, tuple)) or len(group) != 2:
        return False
    idx, sig = group
    return (isinstance(idx, torch.Tensor) and isinstance(sig, torch.Tensor) and idx.dtype in INDEX_DTYPES
            and idx.dim() == 2 and idx.shape[1] >= 1 and sig.dtype in VALUE_DTYPES
            and sig.shape == (idx.shape[0],))


def _raise_for_group(b: int, group) -> None:
    if not isinstance(group, (list, tuple)) or len(group) != 2:
        raise TypeError(f"plane_groups[{b}] must be a pair (indices [P, n], sigmas [P]); got {type(group).__name__}")
    idx = require_tensor(f"plane_groups[{b}] indices", group[0])
    sig = require_tensor(f"plane_groups[{b}] sigmas", group[1])
    require_index(f"plane_groups[{b}] indices", idx)
    require_shape(f"plane_groups[{b}] indices", idx, "[P, n] with n >= 1", idx.dim() == 2 and idx.shape[1] >= 1)
    require_floating(f"plane_groups[{b}] sigmas", sig)
    require_shape(f"plane_groups[{b}] sigmas", sig, f"[P] = [{idx.shape[0]}]", sig.shape == (idx.shape[0],))
    raise AssertionError("unreachable: _group_ok and the named checks disagree")


__all__ = ["planarity_nll"]
