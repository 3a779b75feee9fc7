"""``gnnfuse.gat_attention``: fused graph attention (GAT) aggregation, flash-attention style.

For every target row i and head h, over the row's incoming edges k (source j):

    s_k = alpha_src[j,h] + alpha_dst[i,h] (+ alpha_edge[k,h]),   e_k = leaky_relu(s_k)
    out[i,h,:] = sum_k softmax_k(e)_h * keep_k,h / (1 - dropout) * x[j,h,:]

``x`` is the already projected source features [N_src, H, F]; the alpha terms are the per-node
(per-edge) dot products with the attention vectors, computed densely outside (as PyG does). The
kernels save only the per-row max and sum of the softmax ([N_dst, H] each) and recompute every
logit in the backward; no [E, H, F] tensor exists anywhere and no [E, H] tensor either, except
for alpha_edge when given (its copy in CSR order and its gradient).

Dropout is drawn inside the kernels from a counter-based hash of (seed, edge id, head) -- the
same in C++ and Triton (csrc/dropout_hash.h, ``_keep_mask`` below): forward and backward see the
same mask, CPU and GPU agree bit for bit, and no mask is stored. Edge ids are CSR positions; the
self loop of row i (``add_self_loops``) has id E + i.

``add_self_loops=True`` is PyG's ``remove_self_loops`` + ``add_self_loops`` without copying the
graph: edges j == i are skipped and each row i < min(N_src, N_dst) gets one virtual edge from
node i, whose edge term is ``alpha_loop[i]`` (when given).

Ops (declared with ``OpDef``): ``gnnfuse::gat_attention`` (out, row max, row sum) and
``gnnfuse::gat_attention_backward``.
Kernels: csrc/attention.cpp (CPU, OpenMP, deterministic) and gnnfuse/triton/attention.py (CUDA).
"""
from __future__ import annotations

import torch

from .._build import load_extension
from .._validate import require_floating, require_same_device, require_shape, require_tensor
from ..constants import SEED_BOUND
from ..csr import CSR, transpose_parts_of
from ._edge_order import in_csr_order
from ._library import resolve_backend, triton_kernel
from ._opdef import OpDef
from .gather_scatter import _as_csr

# x [N_src, H, F], a_src [N_src, H], a_dst [N_dst, H], a_edge [E, H] in CSR order, a_loop [N_dst, H],
# all contiguous with x's dtype. Returns out [N_dst, H, F] and the softmax's row max and row sum
# ([N_dst, H], see stats_dtype). needs: which of (x, a_src, a_dst, a_edge, a_loop) want a gradient.


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """The kernels' accumulation dtype, also that of the saved row max / row sum."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---- kernels ------------------------------------------------------------------------------------
def _forward_cpu(x, a_src, a_dst, a_edge, a_loop, rowptr, col, t_rowptr, t_col, t_pos, self_loops, slope, p, seed):
    return tuple(load_extension("attention").gat_forward(x, a_src, a_dst, a_edge, a_loop, rowptr, col, self_loops,
                                                         slope, p, seed))


def _backward_cpu(*args):
    return tuple(load_extension("attention").gat_backward(*args))


_forward_triton = triton_kernel("attention", "forward")
_backward_triton = triton_kernel("attention", "backward")


def _forward_fake(x, a_src, a_dst, a_edge, a_loop, rowptr, col, t_rowptr, t_col, t_pos, self_loops, slope, p, seed):
    num_dst, heads = a_dst.shape
    stats = x.new_empty(num_dst, heads, dtype=stats_dtype(x.dtype))
    return x.new_empty(num_dst, heads, x.shape[2]), stats, torch.empty_like(stats)


def _backward_fake(grad_out, out, row_max, row_sum, x, a_src, a_dst, a_edge, a_loop, *rest):
    needs = rest[-1]
    likes = (x, a_src, a_dst, a_edge, a_loop)
    return tuple(torch.empty_like(t) if (need and t is not None) else x.new_empty(0) for need, t in zip(needs, likes))


# ---- autograd: saved state and the backward op ----------------------------------------------------
def _save(ctx, inputs, output):
    x, a_src, a_dst, a_edge, a_loop, rowptr, col, t_rowptr, t_col, t_pos, *scalars = inputs
    ctx.scalars = tuple(scalars)
    return (output[0], output[1], output[2], x, a_src, a_dst, a_edge, a_loop, rowptr, col, t_rowptr, t_col, t_pos)


def _backward(ctx, saved, grad_out, _gm, _gz):
    out, m, z, x, a_src, a_dst, a_edge, a_loop, rowptr, col, t_rowptr, t_col, t_pos = saved
    needs = [bool(n) for n in ctx.needs[:5]]
    if t_rowptr is None:  # op called directly without the transpose: build it now
        t_rowptr, t_col, t_pos = transpose_parts_of(rowptr, col, x.shape[0])
    grads = BACKWARD.from_backward(ctx, grad_out.contiguous(), out, m, z, x, a_src, a_dst, a_edge, a_loop, rowptr, col,
                                   t_rowptr, t_col, t_pos, *ctx.scalars, needs)
    return (*(g if need else None for g, need in zip(grads, needs)), *([None] * 9))


FORWARD = OpDef(
    "gat_attention(Tensor x, Tensor a_src, Tensor a_dst, Tensor? a_edge, Tensor? a_loop, Tensor rowptr, "
    "Tensor col, Tensor? t_rowptr, Tensor? t_col, Tensor? t_pos, bool self_loops, float negative_slope, "
    "float dropout, int seed) -> (Tensor, Tensor, Tensor)",
    kernels={"cpu": _forward_cpu, "triton": _forward_triton}, fake=_forward_fake, save=_save, backward=_backward,
    non_differentiable_outputs=(1, 2))  # row max / sum: beside the autograd node (no zero gradients made for them)
BACKWARD = OpDef(  # its own derivative is not implemented: double backward raises
    "gat_attention_backward(Tensor grad_out, Tensor out, Tensor row_max, Tensor row_sum, Tensor x, Tensor a_src, "
    "Tensor a_dst, Tensor? a_edge, Tensor? a_loop, Tensor rowptr, Tensor col, Tensor t_rowptr, Tensor t_col, "
    "Tensor t_pos, bool self_loops, float negative_slope, float dropout, int seed, bool[] needs) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    kernels={"cpu": _backward_cpu, "triton": _backward_triton}, fake=_backward_fake, public_name="gat_attention")


# ---- pure-PyTorch reference (materialises [E, H, F]: for tests and backend="reference") ----------
_U32 = 0xFFFFFFFF


def _mul32(h: torch.Tensor, c: int) -> torch.Tensor:
    """(h * c) mod 2^32 for int64 tensors holding uint32, without int64 overflow."""
    return (h * (c & 0xFFFF) + (((h * (c >> 16)) & 0xFFFF) << 16)) & _U32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def _keep_mask(seed: int, edge_ids: torch.Tensor, heads: int, p: float) -> torch.Tensor:
    """[len(edge_ids), heads] bool: the kernels' dropout mask (see csrc/dropout_hash.h)."""
    counter = ((edge_ids.long().unsqueeze(1) & _U32) * heads + torch.arange(heads, device=edge_ids.device)) & _U32
    r = _fmix32(_fmix32(counter) ^ (seed & _U32))
    return (r >> 8) >= round(p * (1 << 24))


def reference_edges(csr: CSR, num_src: int, self_loops: bool):
    """(row, col, dropout ids, kept) of the edges the kernels walk: the CSR's edges, and with
    self_loops its own loops dropped (kept: the mask of the CSR edges left) and one loop per row
    i < min(num_src, num_dst) appended (id E + i). kept is None without self loops."""
    row, col = csr.row().long(), csr.col.long()
    ids = torch.arange(csr.num_edges, device=col.device)
    if not self_loops:
        return row, col, ids, None
    kept = col != row
    loops = torch.arange(min(num_src, csr.num_dst), device=col.device)
    return (torch.cat([row[kept], loops]), torch.cat([col[kept], loops]), torch.cat([ids[kept], csr.num_edges + loops]),
            kept)


def reference_softmax_sum(e, row, col, ids, values, num_dst: int, p: float, seed: int, dtype: torch.dtype,
                          edge_values=None):
    """sum over row i's edges of softmax_i(e) (* the kernels' dropout) * (values[col] [+ edge_values]),
    [N_dst, H, F]."""
    heads = e.shape[1]
    row_max = torch.full((num_dst, heads), float("-inf"), dtype=e.dtype, device=e.device)
    row_max = row_max.scatter_reduce(0, row.unsqueeze(1).expand_as(e), e, "amax").detach()
    w = torch.exp(e - row_max[row])
    coef = w / torch.zeros_like(row_max).index_add(0, row, w)[row]
    if p > 0:
        coef = coef * _keep_mask(seed, ids, heads, p) / (1 - p)
    vals = values.to(e.dtype)[col]
    msg = coef.unsqueeze(-1) * (vals if edge_values is None else vals + edge_values)
    return torch.zeros(num_dst, heads, values.shape[2], dtype=e.dtype, device=e.device).index_add(0, row, msg).to(dtype)


def reference(x, a_src, a_dst, a_edge, a_loop, csr: CSR, self_loops: bool, slope: float, p: float, seed: int):
    """The op's maths with plain torch ops and autograd (a_edge in CSR order)."""
    row, col, ids, kept = reference_edges(csr, x.shape[0], self_loops)
    num_dst, heads = a_dst.shape
    term = a_edge
    if self_loops and (a_edge is not None or a_loop is not None):
        loops = row.numel() - int(kept.sum())
        edge_part = a_edge[kept] if a_edge is not None else a_src.new_zeros(int(kept.sum()), heads)
        loop_part = a_loop[:loops] if a_loop is not None else a_src.new_zeros(loops, heads)
        term = torch.cat([edge_part, loop_part])
    work = stats_dtype(x.dtype)
    s = a_src.to(work)[col] + a_dst.to(work)[row]
    if term is not None:
        s = s + term.to(work)
    e = torch.nn.functional.leaky_relu(s, slope)
    return reference_softmax_sum(e, row, col, ids, x, num_dst, p, seed, x.dtype)


# ---- public API ---------------------------------------------------------------------------------
def gat_attention(
    x: torch.Tensor,
    alpha_src: torch.Tensor,
    alpha_dst: torch.Tensor,
    edge_index_or_csr: torch.Tensor | CSR,
    *,
    alpha_edge: torch.Tensor | None = None,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    seed: int | None = None,
    add_self_loops: bool = False,
    alpha_loop: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """GAT's attention-weighted aggregation, fused: ``out [N_dst, H, F]`` (see the module doc).

    Args:
        x: [N_src, H, F] projected source features (float16, bfloat16, float32, float64).
        alpha_src: [N_src, H] source terms; alpha_dst: [N_dst, H] target terms (N_dst = the
            number of target nodes).
        edge_index_or_csr: edge_index [2, E] (row 0 source, row 1 target) or a :class:`gnnfuse.CSR`.
        alpha_edge: optional [E, H] edge terms, in edge_index order.
        negative_slope: leaky_relu's slope. dropout: probability of dropping an attention
            coefficient (after the softmax; kept ones are scaled by 1 / (1 - dropout)).
        seed: dropout's seed (int in [0, 2**31)); None draws one from torch's default generator,
            so ``torch.manual_seed`` makes runs reproducible.
        add_self_loops: PyG's remove-then-add self loops, without copying the graph.
        alpha_loop: optional [N_dst, H] edge terms of the added self loops.
        backend: "auto" | "cpu" | "triton" | "reference".

    Half types accumulate in float32. Rows without edges give 0.

    Example::

        # one GAT layer's aggregation (gnnfuse.nn.GATConv does this for you)
        h = lin(x).view(-1, H, F)                                     # [N, H, F]
        a_src, a_dst = (h * att_src).sum(-1), (h * att_dst).sum(-1)   # [N, H] each
        out = gnnfuse.gat_attention(h, a_src, a_dst, edge_index, add_self_loops=True, dropout=0.6)
    """
    return _run(x, alpha_src, alpha_dst, edge_index_or_csr, alpha_edge, alpha_loop, negative_slope, dropout, seed,
                add_self_loops, backend)


def _run(x, alpha_src, alpha_dst, graph, alpha_edge, alpha_loop, negative_slope, dropout, seed, add_self_loops,
         backend, csr_edges: bool = False) -> torch.Tensor:
    """gat_attention's checks, then the op (or the reference). alpha_edge [E, H]: rows in edge_index
    order, put in CSR order here (a copy; its gradient reordered back), or with ``csr_edges`` (the
    layer, nn/_attention.py, which keeps a constant edge_attr in CSR order) already in CSR order."""
    x = require_tensor("x", x)
    require_floating("x", x)
    require_shape("x", x, "[N_src, H, F]", x.dim() == 3)
    n_src, heads, _ = x.shape
    alpha_src = _alpha("alpha_src", alpha_src, x, lambda t: t.shape == (n_src, heads),
                       lambda: f"[N_src, H] = [{n_src}, {heads}]")
    alpha_dst = _alpha("alpha_dst", alpha_dst, x, lambda t: t.dim() == 2 and t.shape[1] == heads,
                       lambda: f"[N_dst, {heads}]")
    num_dst = alpha_dst.shape[0]
    csr, seed = checked_graph(x, num_dst, graph, negative_slope, dropout, seed)
    if alpha_edge is not None:
        alpha_edge = _alpha("alpha_edge", alpha_edge, x, lambda t: t.shape == (csr.num_edges, heads),
                            lambda: f"[E, H] = [{csr.num_edges}, {heads}]")
        if not csr_edges:
            alpha_edge = in_csr_order(alpha_edge, csr.perm)
    if alpha_loop is not None:
        alpha_loop = _alpha("alpha_loop", alpha_loop, x, lambda t: t.shape == (num_dst, heads),
                            lambda: f"[N_dst, H] = [{num_dst}, {heads}]")
        if not add_self_loops:
            raise ValueError("alpha_loop is given but add_self_loops=False")
    require_same_device(x=x, alpha_src=alpha_src, alpha_dst=alpha_dst, alpha_edge=alpha_edge, alpha_loop=alpha_loop,
                        edge_index=csr.col)
    backend = resolve_backend(backend, x.device)
    scalars = (bool(add_self_loops), float(negative_slope), float(dropout), seed)
    x = x.contiguous()
    if backend == "reference":
        return reference(x, alpha_src, alpha_dst, alpha_edge, alpha_loop, csr, *scalars)
    tensors = (x, alpha_src, alpha_dst, alpha_edge, alpha_loop)
    wants_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    transpose = csr.transpose_parts() if wants_grad else (None, None, None)
    return FORWARD(*tensors, csr.rowptr, csr.col, *transpose, *scalars, backend=backend)[0]


def checked_graph(x, num_dst: int, edge_index_or_csr, negative_slope, dropout, seed) -> tuple[CSR, int]:
    """gat_attention's checks of everything but its tensors: the graph as a CSR (N_src = x's rows,
    N_dst = ``num_dst``), the slope, the dropout and the seed (drawn from torch's default generator
    when None and dropout > 0). Returns (csr, seed). Shared with the layers' one-node routes
    (nn/_gat_node.py, nn/_pair_node.py)."""
    csr = _as_csr(edge_index_or_csr, x, num_dst)
    if csr.num_src > x.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows but the graph has {csr.num_src} source nodes")
    if not isinstance(negative_slope, (int, float)):
        raise TypeError(f"negative_slope must be a float; got {type(negative_slope).__name__}")
    return csr, dropout_seed(dropout, seed)


def dropout_seed(dropout, seed) -> int:
    """The checked dropout probability's seed: ``seed`` itself, or one drawn from torch's default
    generator when None and dropout > 0 (0 without dropout). Shared with pair_attention's checks."""
    if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be a float in [0, 1); got {dropout!r}")
    if seed is None:
        return int(torch.randint(0, SEED_BOUND - 1, ())) if dropout > 0 else 0
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_BOUND:
        raise ValueError(f"seed must be an int in [0, 2**31); got {seed!r}")
    return seed


def _alpha(name, t, x, shape_ok, expected):
    """The checked term, in x's dtype, contiguous (``expected()``: its shape, for the error only)."""
    t = require_tensor(name, t)
    require_floating(name, t)
    if not shape_ok(t):
        require_shape(name, t, expected(), False)
    return t.to(x.dtype).contiguous()
