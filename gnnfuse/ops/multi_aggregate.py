"""Several reductions of the same messages in one pass: ``gnnfuse::multi_aggregate``.

``fused_gather_scatter(x, graph, ["mean", "min", "max", "std"])`` (or :func:`multi_aggregate`)
returns ``[N_dst, len(aggrs) * F]``: columns ``k*F:(k+1)*F`` hold ``aggrs[k]`` (the layout of PyG's
``MultiAggregation(mode="cat")``). Any list of sum, mean, max, min, mul, var, std (and aliases).

Forward: one kernel reads every source row once per edge and keeps every statistic the list needs
(sum, sum of squares, max/min with winners, product): C++ in csrc/multi_aggregate.cpp (CPU: registered
for the op in C++ and bound for the eager route like the sum's, see ops/_opdef.py's CppKernel),
Triton in gnnfuse/triton/multi_aggregate.py (CUDA: statistics per piece of at most 128 edges, then
one fold per row). No E x F tensor.

Backward (``gnnfuse::multi_aggregate_backward``): the gradient of each message is linear in the
message for sum/mean/var/std (dm = c[i] + d[i] * m with per-target c, d); max/min send theirs to the
recorded winner, mul to the product of the other messages. On CPU one C++ pass over the transpose
adds them all up (a gradient that is one row expanded over all rows, as ``out.sum()`` gives, is read
in place); on CUDA (:func:`_gradients`) the sum/mean/var/std part costs one or two passes of
the gather-scatter backward kernels and each max/min/mul one more. No E x F tensor either.
"""
from __future__ import annotations

import functools
import math

import torch

from .. import reference
from ..csr import CSR, transpose_parts_of
from ..reductions import CODES, MULTI, canonical_reduce
from ..reductions import MAX, MEAN, MIN, MUL, STD, SUM, VAR
from ._library import triton_module
from ._opdef import CppKernel, OpDef
from .gather_scatter import BACKWARD as GATHER_SCATTER_BACKWARD
from .gather_scatter import FORWARD as GATHER_SCATTER
from .gather_scatter import _weight_in_csr_order, check_call

_ARG_CODES = (MAX, MIN)


@functools.lru_cache(maxsize=256)  # (every call converts the same few strings: a few us a call on small graphs)
def _codes(aggrs: str) -> tuple[int, ...]:
    """The op takes the reductions as one string, "mean,min,max,std" (an int[] argument would be
    taken for a Tensor[] by the op layer's autograd), the kernels as codes."""
    return tuple(CODES[name] for name in aggrs.split(","))


def _names(aggrs) -> str:
    """The op's string of canonical reduction names (raises, naming "aggrs", on an unknown one),
    cached per list in eager mode (Dynamo would trace through the cache with a warning)."""
    aggrs = tuple(aggrs)
    if not torch.compiler.is_compiling():
        try:
            return _joined_names(aggrs)
        except TypeError:  # an unhashable entry: canonical_reduce names the argument
            pass
    return _joined_names.__wrapped__(aggrs)


@functools.lru_cache(maxsize=256)
def _joined_names(aggrs: tuple) -> str:
    return ",".join(canonical_reduce(a, MULTI, "aggrs") for a in aggrs)


def _num_arg(codes, tracked):
    return sum(c in codes for c in _ARG_CODES) if tracked else 0


# ---- kernels -------------------------------------------------------------------------------------
# CPU: registered in C++ (csrc/multi_aggregate.cpp, TORCH_LIBRARY_IMPL), the same function for the eager route
_FORWARD_CPU = CppKernel("aggregate", "multi_aggregate")
_BACKWARD_CPU = CppKernel("aggregate", "multi_aggregate_backward")


_triton = triton_module("multi_aggregate")


def _forward_triton(x, rowptr, col, weight, t_rowptr, t_col, t_pos, aggrs):
    return _triton().forward(x, rowptr, col, weight, _codes(aggrs), t_rowptr is not None)


def _backward_triton(grad_out, x, out, rowptr, col, weight, t_rowptr, t_col, t_pos, arg, aggrs, need_x, need_w):
    kernels = _triton()
    codes = _codes(aggrs)
    if kernels.fast_backward_applies(x, weight, codes, need_w):
        mean = None
        if (VAR in codes or STD in codes) and MEAN not in codes:
            mean = GATHER_SCATTER(x, rowptr, col, None, None, None, None, "mean")[0]
        grad_x = kernels.backward_x(grad_out.contiguous(), out, x, rowptr, col, (t_rowptr, t_col, t_pos), arg, codes,
                                    mean) if need_x else x.new_empty(0)
        return grad_x, x.new_empty(0)
    return _gradients(grad_out, out, x, rowptr, col, weight, (t_rowptr, t_col, t_pos), arg, _codes(aggrs), need_x,
                      need_w and weight is not None)


# ---- fake (shape) rules ------------------------------------------------------------------------------
def _forward_fake(x, rowptr, col, weight, t_rowptr, t_col, t_pos, aggrs):
    num_dst = rowptr.shape[0] - 1
    codes = _codes(aggrs)
    A = _num_arg(codes, t_rowptr is not None)
    arg = rowptr.new_empty((A, num_dst, x.shape[1]) if A else (0, 0, 0))
    return x.new_empty(num_dst, len(codes) * x.shape[1]), arg


def _backward_fake(grad_out, x, out, rowptr, col, weight, t_rowptr, t_col, t_pos, arg, aggrs, need_x, need_w):
    grad_x = torch.empty_like(x) if need_x else x.new_empty(0)
    grad_w = x.new_empty(col.shape[0]) if (need_w and weight is not None) else x.new_empty(0)
    return grad_x, grad_w


# ---- CUDA backward: passes of the gather-scatter backward kernels ------------------------------------
def _gradients(grad_out, out, x, rowptr, col, weight, transpose, arg, codes, need_x, need_w):
    """(grad_x, grad_w) from passes of the Triton gather-scatter backward: dm = c[i] + d[i] m for
    sum/mean/var/std (one or two passes), one pass per max/min (the recorded winner) and for mul."""
    from ..triton.gather_scatter import _mean_divisor

    N, F, K = rowptr.shape[0] - 1, x.shape[1], len(codes)
    g, o = grad_out.reshape(N, K, F), out.reshape(N, K, F)
    deg = _mean_divisor(rowptr, x.dtype)  # [N, 1], cached on the graph
    no_arg = rowptr.new_empty(0, 0)
    c = d = mean = None
    for k, code in enumerate(codes):
        if code in (VAR, STD):
            if mean is None:
                mean = o[:, codes.index(MEAN)] if MEAN in codes else \
                    GATHER_SCATTER(x, rowptr, col, weight, None, None, None, "mean")[0]
            gv = g[:, k] if code == VAR else torch.where(o[:, k] > 0, g[:, k] / (2 * o[:, k]), 0.0)
            c = _plus(c, -2 * gv * mean / deg)  # d var / d m = 2 (m - mean) / deg
            d = _plus(d, 2 * gv / deg)
        elif code == SUM:
            c = _plus(c, g[:, k])
        elif code == MEAN:
            c = _plus(c, g[:, k] / deg)
    grad_x = _linear_x_grad(c, d, x, weight, transpose) if need_x and c is not None else \
        (torch.zeros_like(x) if need_x else x.new_empty(0))
    grad_w = x.new_zeros(col.shape[0]) if need_w else x.new_empty(0)

    def run(go, xx, w, a, reduce, nx, nw):
        return GATHER_SCATTER_BACKWARD.kernels["triton"](go.contiguous(), xx, rowptr, col, w, *transpose, a, reduce,
                                                         nx, nw)

    if need_w and c is not None:  # w's gradient of the linear part: <c[i], x[j]> + w <d[i], x[j]^2>
        grad_w = grad_w + run(c, x, weight, no_arg, "sum", False, True)[1]
        if d is not None:
            grad_w = grad_w + weight * run(d, x * x, weight, no_arg, "sum", False, True)[1]
    slot = 0
    for code in _ARG_CODES:
        if code in codes:
            k = codes.index(code)
            gx, gw = run(g[:, k], x, weight, arg[slot], "max" if code == MAX else "min", need_x, need_w)
            grad_x, grad_w = (grad_x + gx if need_x else grad_x), (grad_w + gw if need_w else grad_w)
            slot += 1
    if MUL in codes:
        gx, gw = run(g[:, codes.index(MUL)], x, weight, no_arg, "mul", need_x, need_w)
        grad_x, grad_w = (grad_x + gx if need_x else grad_x), (grad_w + gw if need_w else grad_w)
    return grad_x, grad_w


def _linear_x_grad(c, d, x, weight, transpose):
    """x's gradient of the linear part dm = c[i] + d[i] m: grad_x[j] = sum_e w c[i] + x[j] sum_e w^2 d[i]
    over the edges e = (j -> i), as sum passes of the gather-scatter forward over the transpose.
    Unweighted, c and d ride in one pass of width 2F (the transpose's indices are read once)."""
    from ..triton.gather_scatter import infer

    t_rowptr, t_col, t_pos = transpose
    F = x.shape[1]
    w_t = None if weight is None else weight.index_select(0, t_pos)
    if d is None:
        gx = infer(c.contiguous(), t_rowptr, t_col, w_t, "sum")
    elif weight is None:
        both = infer(torch.cat([c, d], dim=1), t_rowptr, t_col, None, "sum")
        gx = both[:, :F] + x[:both.shape[0]] * both[:, F:]
    else:
        gx = infer(c.contiguous(), t_rowptr, t_col, w_t, "sum") + \
            x[:t_rowptr.numel() - 1] * infer(d.contiguous(), t_rowptr, t_col, w_t * w_t, "sum")
    if gx.shape[0] == x.shape[0]:
        return gx.to(x.dtype)
    grad_x = torch.zeros_like(x)
    grad_x[:gx.shape[0]] = gx
    return grad_x


def _plus(acc, term):
    return term if acc is None else acc + term


# ---- autograd --------------------------------------------------------------------------------------
def _save(ctx, inputs, output):
    x, rowptr, col, weight, t_rowptr, t_col, t_pos, aggrs = inputs
    ctx.aggrs, ctx.codes = aggrs, _codes(aggrs)
    ctx.mark_non_differentiable(output[1])
    return x, rowptr, col, weight, t_rowptr, t_col, t_pos, output[0], output[1]


def _backward(ctx, saved, grad_out, _grad_arg):
    x, rowptr, col, weight, t_rowptr, t_col, t_pos, out, arg = saved
    need_x, need_w = ctx.needs[0], ctx.needs[3]
    if t_rowptr is None:  # called directly without the transpose: build it (and the winners) now
        t_rowptr, t_col, t_pos = transpose_parts_of(rowptr, col, x.shape[0])
        if any(c in ctx.codes for c in _ARG_CODES):
            arg = FORWARD.from_backward(ctx, x, rowptr, col, weight, t_rowptr, t_col, t_pos, ctx.aggrs)[1]
    aggrs, grad_out, out = _fold_repeats(ctx.aggrs, grad_out, out, x.shape[1])
    grad_x, grad_w = BACKWARD.from_backward(ctx, _grad_rows(grad_out, ctx.backend), x, out, rowptr, col, weight,
                                            t_rowptr, t_col, t_pos, arg, aggrs, need_x, need_w)
    return (grad_x if need_x else None), None, None, (grad_w if need_w else None), None, None, None, None


def _grad_rows(grad_out: torch.Tensor, backend: str | None) -> torch.Tensor:
    """grad_out as the backward kernels take it: contiguous or, for the C++ kernel, one row expanded
    over all rows (the gradient of ``out.sum()`` or ``out.mean()`` arrives expanded from a scalar),
    which it reads in place instead of a [N, K*F] copy (Cora, 4F=256: ~0.4 ms of a 1.5 ms step)."""
    if grad_out.is_contiguous():
        return grad_out
    if backend != "triton" and grad_out.is_cpu and grad_out.dim() == 2 and grad_out.stride(0) == 0:
        return grad_out[:1].contiguous().expand(grad_out.shape)
    return grad_out.contiguous()


@functools.lru_cache(maxsize=256)
def _unique(aggrs: str) -> tuple[list[str], list[str]]:
    names = aggrs.split(",")
    return names, list(dict.fromkeys(names))


def _fold_repeats(aggrs: str, grad_out, out, F: int):
    """A reduction listed twice gets the sum of its blocks' gradients, once: the backward kernels
    (and the winners, recorded once per reduction) see each reduction once."""
    names, unique = _unique(aggrs)
    if len(unique) == len(names):
        return aggrs, grad_out, out
    N = grad_out.shape[0]
    slots = torch.tensor([unique.index(n) for n in names], device=grad_out.device)
    folded = grad_out.new_zeros(N, len(unique), F).index_add_(1, slots, grad_out.reshape(N, len(names), F))
    firsts = torch.tensor([names.index(n) for n in unique], device=out.device)
    out = out.reshape(N, len(names), F).index_select(1, firsts).reshape(N, len(unique) * F)
    return ",".join(unique), folded.reshape(N, len(unique) * F), out


# x [N_src, F] contiguous; rowptr/col the CSR; weight [E] in CSR order; t_* the transpose, given exactly
# when gradients are wanted (then max/min record winners); aggrs the canonical names joined by ",". Returns out [N_dst, K*F] and arg: the winning
# CSR positions [A, N_dst, F] of max (first) and min, -1 for empty rows, or [0, 0, 0] when not tracked.
FORWARD = OpDef(
    "multi_aggregate(Tensor x, Tensor rowptr, Tensor col, Tensor? weight, Tensor? t_rowptr, Tensor? t_col, "
    "Tensor? t_pos, str aggrs) -> (Tensor, Tensor)",
    kernels={"cpu": _FORWARD_CPU, "triton": _forward_triton}, fake=_forward_fake, save=_save, backward=_backward,
    backward_only_outputs=(1,))  # the eager route keeps arg off its autograd node: no zero gradient of it
BACKWARD = OpDef(  # its own derivative is not implemented: double backward raises
    "multi_aggregate_backward(Tensor grad_out, Tensor x, Tensor out, Tensor rowptr, Tensor col, Tensor? weight, "
    "Tensor t_rowptr, Tensor t_col, Tensor t_pos, Tensor arg, str aggrs, bool need_x_grad, "
    "bool need_weight_grad) -> (Tensor, Tensor)",
    kernels={"cpu": _BACKWARD_CPU, "triton": _backward_triton}, fake=_backward_fake,
    public_name="fused_gather_scatter (several reductions)")


# ---- public API ----------------------------------------------------------------------------------
def multi_aggregate(x: torch.Tensor, edge_index_or_csr: torch.Tensor | CSR, aggrs, *,
                    edge_weight: torch.Tensor | None = None, num_nodes: int | None = None,
                    backend: str = "auto", return_degree: bool = False):
    """Several reductions of the messages ``w[e] * x[src[e]]`` in one pass over the edges.

    Args:
        x, edge_index_or_csr, edge_weight, num_nodes, backend: as :func:`gnnfuse.fused_gather_scatter`.
        aggrs: a list of "sum" | "mean" | "max" | "min" | "mul" | "var" | "std" (aliases "add",
            "amax", "amin", "prod"). var is mean(m^2) - mean(m)^2; std is sqrt(max(var, 1e-5)),
            0 where that is <= sqrt(1e-5) (PyG's VarAggregation and StdAggregation).
        return_degree: also return each target's in-degree (edges, not weights) as [N_dst] in x's
            dtype, not differentiable: what PNA's degree scalers need, read off the CSR's rowptr
            (no pass over the edges).

    Returns:
        [N_dst, len(aggrs) * F] (x of [N, *feat] is flattened to F features): columns
        ``k*F:(k+1)*F`` are ``aggrs[k]``. Empty target rows give 0 for every reduction.
        With ``return_degree``: (that, degree).

    Example::

        out = gnnfuse.fused_gather_scatter(x, edge_index, ["mean", "min", "max", "std"])  # [N, 4F]
        mean, low, high, std = out.split(x.size(1), dim=1)
    """
    if isinstance(aggrs, str) or not len(aggrs):
        raise ValueError(f"aggrs must be a non-empty list of reduce names; got {aggrs!r}")
    names = _names(aggrs)
    csr, backend = check_call(x, edge_index_or_csr, "sum", edge_weight, num_nodes, backend)
    weight = _weight_in_csr_order(edge_weight, csr, x.dtype)
    x2 = x.contiguous() if x.dim() == 2 else x.reshape(x.shape[0], math.prod(x.shape[1:])).contiguous()
    if backend == "reference":
        out = reference.multi_aggregate(x2, csr.col, csr._row(), csr.num_dst, names.split(","), weight)
    else:
        wants_grad = torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad))
        transpose = csr._transpose_parts() if wants_grad else (None, None, None)
        out = FORWARD(x2, csr.rowptr, csr.col, weight, *transpose, names, backend=backend)[0]
    return (out, csr.in_degree().to(x.dtype)) if return_degree else out
