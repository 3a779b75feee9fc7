"""``gnnfuse.fused_gather_scatter``: out[i] = REDUCE_{e: dst[e] == i} w[e] * x[src[e]].

Layers, top to bottom:
  * :func:`fused_gather_scatter` - public API: validation, CSR lookup, backend choice;
  * ``gnnfuse::gather_scatter`` - the op on a CSR (described once in :data:`FORWARD`, see
    ops/_opdef.py), with fake and autograd rules;
  * ``gnnfuse::gather_scatter_backward`` - gradients for x and the edge weights, one op for
    every reduction (its own derivative is not implemented: double backward raises).
Kernels: C++ in csrc/gather_scatter.cpp (CPU), Triton in gnnfuse/triton/gather_scatter.py (CUDA).
No E x F tensor is built, forward or backward.
"""
from __future__ import annotations

import math

import torch

from .. import reference
from .._tensor_cache import cached
from .._validate import (
    require_floating,
    require_node_count,
    require_same_device,
    require_shape,
    require_tensor,
)
from ..constants import VALUE_DTYPES
from ..csr import CSR, check_edge_index, csr_for_edge_index, transpose_parts_of
from ..reductions import ARG as ARG_REDUCTIONS  # reductions whose forward records the winning edge
from ..reductions import ALIASES
from ..reductions import SINGLE as REDUCTIONS
from ..reductions import canonical_reduce
from ._edge_order import in_csr_order
from ._library import resolve_backend, triton_module
from ._opdef import CppKernel, OpDef

_VALUE_DTYPES = frozenset(VALUE_DTYPES)  # (a hash lookup: the tuple compares up to four dtypes)

# The forward op: x [N_src, F] contiguous; rowptr/col the CSR; weight [E] in CSR order with x's
# dtype; t_* the cached transpose, passed exactly when gradients are wanted. Returns out
# [N_dst, F] and arg: for max/min with the transpose given, [N_dst, F] winning CSR positions
# (-1 for empty rows), needed by the backward; otherwise [0, 0] (inference skips tracking).
# The backward op returns the gradients of x and of the edge weights, for every reduction;
# t_weight (optional) is weight[t_pos], the weights in transpose order, which the sum/mean
# x-gradient then reads directly (see _weight_in_transpose_order).


# ---- kernels --------------------------------------------------------------------------------
# CPU: registered in C++ (csrc/gather_scatter.cpp, TORCH_LIBRARY_IMPL), the same function for the eager route
_FORWARD_CPU = CppKernel("graph", "gather_scatter")
_BACKWARD_CPU = CppKernel("graph", "gather_scatter_backward")


_triton = triton_module("gather_scatter")


def _forward_triton(x, rowptr, col, weight, t_rowptr, t_col, t_pos, reduce):
    return _triton().forward(x, rowptr, col, weight, reduce, track_arg=t_rowptr is not None)


def _backward_triton(grad_out, x, rowptr, col, weight, t_rowptr, t_col, t_pos, arg, reduce, need_x_grad, need_w_grad,
                     t_weight=None):
    return _triton().backward(
        grad_out, x, rowptr, col, weight, t_rowptr, t_col, t_pos, arg, reduce, need_x_grad, need_w_grad,
        t_weight=t_weight)


# ---- fake (shape) rules for torch.compile ------------------------------------------------------
def _forward_fake(x, rowptr, col, weight, t_rowptr, t_col, t_pos, reduce):
    num_dst = rowptr.shape[0] - 1
    out = x.new_empty(num_dst, x.shape[1])
    tracks_arg = reduce in ARG_REDUCTIONS and t_rowptr is not None
    arg = rowptr.new_empty((num_dst, x.shape[1]) if tracks_arg else (0, 0))
    return out, arg


def _backward_fake(grad_out, x, rowptr, col, weight, t_rowptr, t_col, t_pos, arg, reduce, need_x_grad, need_w_grad,
                   t_weight=None):
    grad_x = torch.empty_like(x) if need_x_grad else x.new_empty(0)
    grad_w = x.new_empty(col.shape[0]) if (need_w_grad and weight is not None) else x.new_empty(0)
    return grad_x, grad_w


# ---- the backward's maths -------------------------------------------------------------------------
def _save(ctx, inputs, output):
    x, rowptr, col, weight, t_rowptr, t_col, t_pos, reduce = inputs
    ctx.reduce = reduce
    return x, rowptr, col, weight, t_rowptr, t_col, t_pos, output[1]


def _backward(ctx, saved, grad_out, _grad_arg):
    x, rowptr, col, weight, t_rowptr, t_col, t_pos, arg = saved
    need_x, need_w = ctx.needs[0], ctx.needs[3]
    if t_rowptr is None:  # op called directly without the transpose: build it (and max/min winners) now
        t_rowptr, t_col, t_pos = transpose_parts_of(rowptr, col, x.shape[0])
        if ctx.reduce in ARG_REDUCTIONS:
            arg = FORWARD.from_backward(ctx, x, rowptr, col, weight, t_rowptr, t_col, t_pos, ctx.reduce)[1]
    t_weight = _weight_in_transpose_order(weight, t_pos) if need_x and not need_w and ctx.reduce in ("sum", "mean") \
        else None
    grad_x, grad_w = BACKWARD.from_backward(ctx, grad_out.contiguous(), x, rowptr, col, weight, t_rowptr, t_col,
                                            t_pos, arg, ctx.reduce, need_x, need_w, t_weight)
    return (grad_x if need_x else None), None, None, (grad_w if need_w else None), None, None, None, None


FORWARD = OpDef(
    "gather_scatter(Tensor x, Tensor rowptr, Tensor col, Tensor? weight, Tensor? t_rowptr, Tensor? t_col, "
    "Tensor? t_pos, str reduce) -> (Tensor, Tensor)",
    kernels={"cpu": _FORWARD_CPU, "triton": _forward_triton}, fake=_forward_fake, save=_save, backward=_backward,
    non_differentiable_outputs=(1,))
# (the winners output is returned on every route: gnnfuse.scatter_max/min return it to the user)
BACKWARD = OpDef(  # its own derivative is not implemented: double backward raises
    "gather_scatter_backward(Tensor grad_out, Tensor x, Tensor rowptr, Tensor col, Tensor? weight, "
    "Tensor t_rowptr, Tensor t_col, Tensor t_pos, Tensor arg, str reduce, bool need_x_grad, "
    "bool need_weight_grad, Tensor? t_weight=None) -> (Tensor, Tensor)",
    kernels={"cpu": _BACKWARD_CPU, "triton": _backward_triton}, fake=_backward_fake,
    public_name="fused_gather_scatter")


# ---- public API ---------------------------------------------------------------------------------
def fused_gather_scatter(
    x: torch.Tensor,
    edge_index_or_csr: torch.Tensor | CSR,
    reduce: str | list[str] = "sum",
    *,
    edge_weight: torch.Tensor | None = None,
    num_nodes: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Gathers source rows of ``x`` along edges and reduces them into target rows.

    Args:
        x: [N_src, *feat] node features (float16, bfloat16, float32, float64).
        edge_index_or_csr: PyG ``edge_index`` [2, E] (row 0 source, row 1 target; int32 or
            int64), a PyG ``EdgeIndex``, or a :class:`gnnfuse.CSR`. A raw tensor is sorted
            once and cached on its memory (see gnnfuse._tensor_cache); a hand-built CSR is
            validated on first use. Out-of-range ids raise :class:`gnnfuse.IndexOutOfRange`.
        reduce: "sum" | "mean" | "max" | "min" | "mul" (aliases "add", "amax", "amin", "prod"; see
            gnnfuse.reductions), "var" or "std" (as PyG's VarAggregation and StdAggregation).
            Empty target rows give 0. A list of these names computes them all in one pass and
            returns [N_dst, len(reduce) * F], block k = reduce[k] (gnnfuse.ops.multi_aggregate).
        edge_weight: optional [E] weights in edge_index order, cast to x's dtype; differentiable.
            [E, H] weights with x [N_src, H, F] weight each head (sum/mean; see
            gnnfuse.ops.head_gather_scatter).
        num_nodes: number of target nodes, any integer type (default: ``x.size(0)``, or the CSR's
            row count).
        backend: "auto" | "cpu" | "triton" | "reference" (env ``GNNFUSE_BACKEND`` replaces "auto").

    Returns:
        [N_dst, *feat]. Half types accumulate in float32. max/min send each (row, feature)'s
        gradient to one winning edge: the lowest CSR position (= first in edge order) among ties.

    Example::

        edge_index = torch.tensor([[0, 1, 2], [1, 2, 1]])      # sources, targets
        x = torch.randn(3, 16, requires_grad=True)
        out = gnnfuse.fused_gather_scatter(x, edge_index, "mean")  # [3, 16]; row 1 = (x[0] + x[2]) / 2
        out.sum().backward()
    """
    if not isinstance(reduce, str) or reduce in ("var", "std"):  # (var/std exist only as multi-aggregations)
        out = _multi_aggregate(x, edge_index_or_csr, [reduce] if isinstance(reduce, str) else reduce,
                               edge_weight=edge_weight, num_nodes=num_nodes, backend=backend)
        return out.reshape(out.shape[0], *x.shape[1:]) if isinstance(reduce, str) else out
    if edge_weight is not None and isinstance(edge_weight, torch.Tensor) and edge_weight.dim() == 2:  # multi-head
        return _head_gather_scatter(x, edge_index_or_csr, reduce, edge_weight, num_nodes, backend)
    # (this runs on every call: on small graphs each Python call in it is a visible share of the time)
    reduce = ALIASES.get(reduce, reduce)  # (check_call validates it)
    csr, backend = check_call(x, edge_index_or_csr, reduce, edge_weight, num_nodes, backend)
    weight = None if edge_weight is None else _weight_in_csr_order(edge_weight, csr, x.dtype)
    flat = x.dim() == 2  # the common case skips two reshapes (a few us a call on small graphs)
    x2 = x.contiguous() if flat else x.reshape(x.shape[0], math.prod(x.shape[1:])).contiguous()
    if backend == "reference":
        out = reference.gather_scatter(x2, csr.col, csr._row(), csr.num_dst, reduce, weight)
    elif torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)):
        out = FORWARD(x2, csr.rowptr, csr.col, weight, *csr._transpose_parts(), reduce, backend=backend)[0]
    else:  # no gradient wanted: no transpose (and no max/min winners kept)
        out = FORWARD(x2, csr.rowptr, csr.col, weight, None, None, None, reduce, backend=backend)[0]
    return out if flat else out.reshape(csr.num_dst, *x.shape[1:])


def check_call(x: torch.Tensor, graph: torch.Tensor | CSR, reduce: str, edge_weight: torch.Tensor | None,
               num_nodes: int | None, backend: str) -> tuple[CSR, str]:
    """Every check of a :func:`fused_gather_scatter` call (shared with :func:`gnnfuse.explain`):
    returns the call's validated CSR (a raw edge_index sorted, or taken from the cache) and the
    backend that runs. Messages are formatted only on failure (see gnnfuse._validate); the common
    case costs one test per argument."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _VALUE_DTYPES or x.dim() < 1:
        require_tensor("x", x)
        require_floating("x", x)
        require_shape("x", x, "[N, *feat]", False)
    if type(reduce) is not str or reduce not in REDUCTIONS:
        canonical_reduce(reduce)  # raises unless an alias
    if edge_weight is not None:
        require_tensor("edge_weight", edge_weight)
        require_floating("edge_weight", edge_weight)
    if num_nodes is None and isinstance(graph, CSR):  # the common case, without a call
        csr = graph.checked()  # validated once per object and again after a change to its tensors
    else:
        csr = _as_csr(graph, x, num_nodes)
    device = x.device
    if csr.col.device != device or (edge_weight is not None and edge_weight.device != device):
        require_same_device(x=x, edge_index=csr.col, edge_weight=edge_weight)  # raises, naming them
    backend = resolve_backend(backend, device)
    if x.shape[0] < csr.num_src:
        raise ValueError(f"x has {x.shape[0]} rows but the graph has {csr.num_src} source nodes")
    if edge_weight is not None and edge_weight.shape != (csr.num_edges,):
        require_shape("edge_weight", edge_weight, f"[E] = [{csr.num_edges}]", False)
    return csr, backend


def _as_csr(graph: torch.Tensor | CSR, x: torch.Tensor, num_nodes: int | None) -> CSR:
    if isinstance(graph, CSR):
        csr = graph.checked()  # validated once per object and again after a change to its tensors
        if num_nodes is not None and require_node_count("num_nodes", num_nodes) != csr.num_dst:
            raise ValueError(f"num_nodes={num_nodes} disagrees with the CSR's {csr.num_dst} target rows")
        return csr
    if not isinstance(graph, torch.Tensor):
        raise TypeError(f"edge_index_or_csr must be an edge_index tensor or a gnnfuse.CSR; got {type(graph).__name__}")
    check_edge_index(graph)
    if graph.device != x.device:
        require_same_device(x=x, edge_index=graph)  # raises, naming them
    num_dst = x.shape[0] if num_nodes is None else require_node_count("num_nodes", num_nodes)
    return csr_for_edge_index(graph, x.shape[0], num_dst)


def _weight_in_csr_order(edge_weight: torch.Tensor | None, csr: CSR, dtype: torch.dtype) -> torch.Tensor | None:
    """The (validated) edge weights in CSR order, cast to x's dtype."""
    if edge_weight is None:
        return None
    if edge_weight.requires_grad or torch.compiler.is_compiling():
        return in_csr_order(edge_weight.to(dtype), csr.perm)
    # a constant weight passed again (GCNConv's cached normalisation, a fixed edge_weight) is put in
    # CSR order once per (weight, graph) and reused, not gathered on every call
    return cached("csr_order_weight", (edge_weight, csr.perm), (dtype,),
                  lambda: edge_weight.to(dtype).index_select(0, csr.perm))


def _weight_in_transpose_order(weight: torch.Tensor | None, t_pos: torch.Tensor) -> torch.Tensor | None:
    """The CSR-order weights laid out in transpose order, ``weight[t_pos]``, for the backward's
    x-gradient, or None: the kernels then look each edge's weight up through ``t_pos``.

    Only a constant weight passed again (GCNConv's cached normalisation, a fixed edge_weight)
    gets the copy: it is cached per (weight, transpose) like the forward's CSR-order copy, so an
    in-place change of the weight (or a new weight) never meets a stale copy, and it holds E
    scalars. It is made on the second backward that meets the same weight: a weight made afresh
    on every call (GCNConv without ``cached=True``) would pay the permutation on every call, which
    costs about what reading it in order saves."""
    if weight is None or weight.requires_grad or torch.compiler.is_compiling():
        return None
    slot = cached("transpose_order_weight", (weight, t_pos), (), lambda: [None, False])  # [the copy, seen once]
    if slot[0] is None:
        if not slot[1]:
            slot[1] = True  # the first backward with this weight: looked up through t_pos
            return None
        slot[0] = weight.index_select(0, t_pos)
    return slot[0]


from .head_gather_scatter import head_gather_scatter as _head_gather_scatter  # noqa: E402  (builds on this module)
from .multi_aggregate import multi_aggregate as _multi_aggregate  # noqa: E402  (it builds on this module)
