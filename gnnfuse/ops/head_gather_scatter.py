"""``fused_gather_scatter`` with multi-head edge weights: x [N_src, H, F], edge_weight [E, H].

    out[i, h, :] = REDUCE_{e: dst[e] == i} edge_weight[e, h] * x[src[e], h, :],   REDUCE = sum or mean

(attention with precomputed coefficients, e.g. the output of :func:`gnnfuse.edge_softmax`). One
op, ``gnnfuse::head_gather_scatter`` (declared with ``OpDef``): one pass per target row, the
weights put in CSR order by one [E, H] gather, no
[E, H, F] tensor forward or backward. Backward: x's gradient is the same kernel over the graph's
cached transpose (row-parallel, no atomics); the weights' gradient g_i . x_j is written once per
edge by its target row's pass. Deterministic on both backends. max/min/mul with [E, H] weights
raise a ValueError naming edge_weight (no fused kernel: ``backend="reference"`` computes
them, materialising the messages). Kernels: csrc/edge_softmax.cpp (CPU),
gnnfuse/triton/head_gather_scatter.py (CUDA).
"""
from __future__ import annotations

import torch

from .._build import load_extension
from .._validate import require_floating, require_same_device, require_shape, require_tensor
from ..csr import CSR, transpose_parts_of
from ._library import resolve_backend, triton_kernel
from ..reductions import canonical_reduce
from ._opdef import OpDef

REDUCTIONS = ("sum", "mean")
_forward_triton = triton_kernel("head_gather_scatter", "forward")
_backward_triton = triton_kernel("head_gather_scatter", "backward")


def _forward_cpu(x, rowptr, col, weight, t_rowptr, t_col, t_pos, mean):
    return load_extension("attention").head_gather_scatter(x, rowptr, col, weight, mean)


def _backward_cpu(*args):
    return tuple(load_extension("attention").head_gather_scatter_backward(*args))


def _save(ctx, inputs, output):
    x, rowptr, col, weight, t_rowptr, t_col, t_pos, mean = inputs
    ctx.mean = mean
    return x, rowptr, col, weight, t_rowptr, t_col, t_pos


def _backward(ctx, saved, grad):
    x, rowptr, col, weight, t_rowptr, t_col, t_pos = saved
    need_x, need_w = ctx.needs[0], ctx.needs[3]
    if t_rowptr is None:  # op called directly without the transpose: build it now
        t_rowptr, t_col, t_pos = transpose_parts_of(rowptr, col, x.shape[0])
    gx, gw = BACKWARD.from_backward(ctx, grad.contiguous(), x, rowptr, col, weight, t_rowptr, t_col, t_pos,
                                    ctx.mean, need_x, need_w)
    return (gx if need_x else None), None, None, (gw if need_w else None), None, None, None, None


def _forward_fake(x, rowptr, col, weight, t_rowptr, t_col, t_pos, mean):
    return x.new_empty(rowptr.shape[0] - 1, x.shape[1], x.shape[2])


def _backward_fake(grad, x, rowptr, col, weight, t_rowptr, t_col, t_pos, mean, need_x, need_w):
    return (torch.empty_like(x) if need_x else x.new_empty(0)), (torch.empty_like(weight) if need_w else x.new_empty(0))


FORWARD = OpDef(
    "head_gather_scatter(Tensor x, Tensor rowptr, Tensor col, Tensor weight, Tensor? t_rowptr, Tensor? t_col, "
    "Tensor? t_pos, bool mean) -> Tensor",
    kernels={"cpu": _forward_cpu, "triton": lambda x, rowptr, col, w, tr, tc, tp, mean: _forward_triton(
        x, rowptr, col, w, mean)},
    fake=_forward_fake, save=_save, backward=_backward)
BACKWARD = OpDef(  # its own derivative is not implemented: double backward raises
    "head_gather_scatter_backward(Tensor grad, Tensor x, Tensor rowptr, Tensor col, Tensor weight, Tensor t_rowptr, "
    "Tensor t_col, Tensor t_pos, bool mean, bool need_x, bool need_weight) -> (Tensor, Tensor)",
    kernels={"cpu": _backward_cpu, "triton": _backward_triton}, fake=_backward_fake,
    public_name="fused_gather_scatter (with [E, H] edge weights)")


def reference(x: torch.Tensor, weight: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, num_dst: int,
              reduce: str) -> torch.Tensor:
    """Plain torch (materialises the [E, H, F] messages; autograd by torch). weight in edge order."""
    msg = weight.to(x.dtype).unsqueeze(-1) * x.index_select(0, src.long())
    if reduce not in REDUCTIONS:  # max / min / mul: empty rows give 0
        name = {"max": "amax", "min": "amin", "mul": "prod"}[reduce]
        index = dst.long().view(-1, 1, 1).expand_as(msg)
        return x.new_zeros(num_dst, *x.shape[1:]).scatter_reduce(0, index, msg, name, include_self=False)
    out = x.new_zeros(num_dst, *x.shape[1:]).index_add(0, dst.long(), msg)
    if reduce == "mean":
        deg = torch.bincount(dst.long(), minlength=num_dst).clamp(min=1).to(x.dtype)
        out = out / deg.view(-1, 1, 1)
    return out


def head_gather_scatter(x: torch.Tensor, graph: torch.Tensor | CSR, reduce: str, edge_weight: torch.Tensor,
                        num_nodes: int | None, backend: str) -> torch.Tensor:
    """The [E, H]-weight route of :func:`gnnfuse.fused_gather_scatter` (same arguments)."""
    x = require_tensor("x", x)
    require_floating("x", x)
    require_floating("edge_weight", edge_weight)
    if x.dim() != 3:
        raise ValueError(f"edge_weight must have shape [E] (or [E, H] with x of shape [N_src, H, F]); got "
                         f"edge_weight {tuple(edge_weight.shape)} with x {tuple(x.shape)}")
    reduce = canonical_reduce(reduce)
    backend = resolve_backend(backend, x.device)
    if reduce not in REDUCTIONS and backend != "reference":
        raise ValueError(f"edge_weight of shape [E, H] supports reduce 'sum' and 'mean' (max, min and mul only "
                         f"with backend='reference'); got {reduce!r}")
    csr = _as_csr(graph, x, num_nodes)
    require_shape("edge_weight", edge_weight, f"[E, H] = [{csr.num_edges}, {x.shape[1]}]",
                  tuple(edge_weight.shape) == (csr.num_edges, x.shape[1]))
    require_same_device(x=x, edge_weight=edge_weight, edge_index=csr.col)
    if x.shape[0] < csr.num_src:
        raise ValueError(f"x has {x.shape[0]} rows but the graph has {csr.num_src} source nodes")
    if backend == "reference":
        order = torch.argsort(csr.perm.long())
        return reference(x, edge_weight, csr.col[order], csr.row()[order], csr.num_dst, reduce)
    weight = edge_weight.to(x.dtype).index_select(0, csr.perm).contiguous()  # [E, H] in CSR order
    wants_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    transpose = csr._transpose_parts() if wants_grad else (None, None, None)
    return FORWARD(x.contiguous(), csr.rowptr, csr.col, weight, *transpose, reduce == "mean", backend=backend)


from .gather_scatter import _as_csr  # noqa: E402  (gather_scatter routes [E, H] weights here)
