"""``gnnfuse.gatv2_attention`` and ``gnnfuse.dot_attention``: fused attention whose logit needs the
full feature vectors of both endpoints (GATv2Conv, TransformerConv), flash-attention style.

For every target row i, head h, over the row's incoming edges k (source j):

    GATv2:      e_k = sum_f att[h,f] * leaky_relu(k[j,h,f] + q[i,h,f] [+ a[k,h,f]])
    dot:        e_k = scale * sum_f q[i,h,f] * (k[j,h,f] [+ a[k,h,f]])    (scale: 1/sqrt(F) by default)
    out[i,h,:] = sum_k softmax_k(e)_h * keep_k,h / (1 - dropout) * (v[j,h,:] [+ a[k,h,:]] (dot only))

GATv2Conv: q = lin_r(x_dst), k = v = lin_l(x_src); TransformerConv: q = query, k = key, v = value.
Optional edge features a [E (+ self loops), H, F] (the projected lin_edge(edge_attr), as PyG
computes them; rows in edge_index order, then one per self loop): the kernels read row perm[k] of a
for CSR position k (E + i for row i's virtual self loop; with E rows alone a loop's edge term is zero,
no row read), so a is never reordered or copied, and write its gradient row by row; no other
[E, H, F] tensor exists. Internally (the layers) a may come in CSR order (row k, the op's perm None).
One op, ``gnnfuse::pair_attention`` (declared with ``OpDef``), serves both (``gatv2`` picks the logit); it shares the GAT
op's machinery: only the per-row softmax max and sum are saved ([N_dst, H]), the backward
recomputes every logit, no [E, H] or [E, H, F] tensor is made; dropout comes from the same
counter-based hash of (seed, edge id, head) (edge ids: CSR positions, E + i for row i's self loop),
and ``add_self_loops`` is PyG's remove + add without copying the graph.

Backward, with g = grad_out, D_i = g_i . out_i, p_k the softmax, c_k = p_k keep_k / (1 - dropout):
    ds_k = p_k (keep_k / (1 - dropout) g_i . v_j - D_i)
    dot:   grad q_i = sum_k ds_k scale k_j,  grad k_j = sum_k ds_k scale q_i
    GATv2: u_k = k_j + q_i [+ a_k], t_k = att * leaky_relu'(u_k);  grad q_i = sum_k ds_k t_k,
           grad k_j = sum_k ds_k t_k,  grad a_k = ds_k t_k,  grad att = sum_k ds_k leaky_relu(u_k)
    dot with edge features: grad q_i = sum_k ds_k scale (k_j + a_k),  grad a_k = ds_k scale q_i + c_k g_i
    grad v_j = sum_k c_k g_i
Row pass (graph rows): D, grad q, grad a, grad att (per-row partials summed afterwards); transpose
pass (source rows): grad k, grad v. The Triton backward of dot-product attention gets ``out``
empty (the forward does not keep it, _keeps_output) and recomputes D from the saved statistics in
a pass of its own before the row pass. Kernels: csrc/pair_attention.cpp (CPU) and
gnnfuse/triton/pair_attention.py (CUDA).
"""
from __future__ import annotations

import math

import torch

from .._build import load_extension
from .._validate import require_floating, require_same_device, require_shape, require_tensor
from ..csr import CSR, transpose_parts_of
from ._library import resolve_backend, triton_kernel
from ._opdef import OpDef
from .attention import dropout_seed, reference_edges, reference_softmax_sum, stats_dtype
from .gather_scatter import _as_csr

# q [N_dst, H, F], k and v [N_src, H, F], att [H, F] (GATv2 only), edge [E (+ loops), H, F] with perm
# (the CSR's; None: edge's rows in CSR order), contiguous, one dtype. Returns out [N_dst, H, F] and the
# softmax's row max and row sum ([N_dst, H], stats_dtype). needs: which of (q, k, v, att, edge) want a
# gradient (the Triton backward takes a sixth entry: v's gradient added into k's, see _kv_sum).
N_SCALARS = 6  # self_loops, gatv2, negative_slope, scale, dropout, seed


def _forward_cpu(q, k, v, att, edge, rowptr, col, perm, t_rowptr, t_col, t_pos, *scalars):
    return tuple(load_extension("attention").pair_forward(q, k, v, att, edge, rowptr, col, perm, *scalars))


def _backward_cpu(*args):
    return tuple(load_extension("attention").pair_backward(*args))


_forward_triton = triton_kernel("pair_attention", "forward")
_backward_triton = triton_kernel("pair_attention", "backward")


def _forward_fake(q, k, v, att, rowptr, col, *rest):
    stats = q.new_empty(q.shape[0], q.shape[1], dtype=stats_dtype(q.dtype))
    return q.new_empty(q.shape[0], q.shape[1], v.shape[2]), stats, torch.empty_like(stats)


def _backward_fake(grad_out, out, row_max, row_sum, q, k, v, att, edge, *rest):
    needs = rest[-1]
    return tuple(torch.empty_like(t) if (need and t is not None) else q.new_empty(0)
                 for need, t in zip(needs, (q, k, v, att, edge)))


def _keeps_output(ctx, q, gatv2: bool) -> bool:
    """Whether the backward needs the op's output. The Triton backward of dot-product attention
    recomputes its per-row term g_i . out_i from the saved row max and sum (one more pass over the
    rows' edges), so ``out`` is not kept: TransformerConv's step then holds one [N, H, F] tensor
    less at its peak, the op's backward. The C++ kernels and GATv2 read it."""
    triton = ctx.backend == "triton" or (ctx.backend is None and q.is_cuda)
    return gatv2 or not triton


def _save(ctx, inputs, output):
    q, k, v, att, edge, rowptr, col, perm, t_rowptr, t_col, t_pos, *scalars = inputs
    ctx.scalars = tuple(scalars)
    ctx.kv_one = k is v  # one tensor in both roles (GATv2): see _kv_sum
    out = output[0] if _keeps_output(ctx, q, scalars[1]) else None
    return (out, output[1], output[2], q, k, v, att, edge, rowptr, col, perm, t_rowptr, t_col, t_pos)


def _backward(ctx, saved, grad_out, _gm, _gz):
    out, m, z, q, k, v, att, edge, rowptr, col, perm, t_rowptr, t_col, t_pos = saved
    needs = [bool(n) for n in ctx.needs[:5]]
    if t_rowptr is None:  # op called directly without the transpose: build it now
        t_rowptr, t_col, t_pos = transpose_parts_of(rowptr, col, k.shape[0])
    if out is None:  # not kept (_keeps_output): an empty tensor tells the kernels to recompute D
        out = q.new_empty(0)
    if _kv_sum(ctx, q, needs):  # k's gradient made as k's + v's, v's left out (autograd would add them)
        needs = [needs[0], True, False, needs[3], needs[4], True]
    grads = BACKWARD.from_backward(ctx, grad_out.contiguous(), out, m, z, q, k, v, att, edge, rowptr, col, perm,
                                   t_rowptr, t_col, t_pos, *ctx.scalars, needs)
    return (*(g if need else None for g, need in zip(grads, needs)), *([None] * (6 + N_SCALARS)))


def _kv_sum(ctx, q, needs) -> bool:
    """Whether the Triton backward adds v's gradient into k's (a sixth ``needs`` entry): where one
    tensor is both (GATv2's source features) and both gradients are wanted, autograd would
    otherwise add two [N, H, F] gradients in a launch of its own. The C++ kernels take five."""
    triton = ctx.backend == "triton" or (ctx.backend is None and q.is_cuda)
    return triton and ctx.kv_one and needs[1] and needs[2]


FORWARD = OpDef(
    "pair_attention(Tensor q, Tensor k, Tensor v, Tensor? att, Tensor? edge, Tensor rowptr, Tensor col, "
    "Tensor? perm, Tensor? t_rowptr, Tensor? t_col, Tensor? t_pos, bool self_loops, bool gatv2, "
    "float negative_slope, float scale, float dropout, int seed) -> (Tensor, Tensor, Tensor)",
    kernels={"cpu": _forward_cpu, "triton": _forward_triton}, fake=_forward_fake, save=_save, backward=_backward,
    non_differentiable_outputs=(1, 2))  # row max / sum: beside the autograd node (no zero gradients made for them)
BACKWARD = OpDef(  # its own derivative is not implemented: double backward raises
    "pair_attention_backward(Tensor grad_out, Tensor out, Tensor row_max, Tensor row_sum, Tensor q, Tensor k, "
    "Tensor v, Tensor? att, Tensor? edge, Tensor rowptr, Tensor col, Tensor? perm, Tensor t_rowptr, Tensor t_col, "
    "Tensor t_pos, bool self_loops, bool gatv2, float negative_slope, float scale, float dropout, int seed, "
    "bool[] needs) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    kernels={"cpu": _backward_cpu, "triton": _backward_triton}, fake=_backward_fake,
    public_name="gatv2_attention / dot_attention")


def reference(q, k, v, att, edge, csr: CSR, self_loops: bool, gatv2: bool, slope: float, scale: float, p: float,
              seed: int, edge_perm: bool = True):
    """The op's maths with plain torch ops and autograd (materialises [E, H, F]: tests, backend='reference').
    edge_perm: the edge features' rows are in edge_index order (else in CSR order, see _run)."""
    row, col, ids, _ = reference_edges(csr, k.shape[0], self_loops)
    work = stats_dtype(q.dtype)
    qi, kj = q.to(work)[row], k.to(work)[col]
    ek = None
    if edge is not None:  # row of each walked edge: perm[k] (or k) for CSR position k, E + i for a loop
        real = ids < csr.num_edges
        erow = ids.clone()
        if edge_perm:
            erow[real] = csr.perm.long()[ids[real]]
        rows = edge.to(work)
        if rows.shape[0] == csr.num_edges:  # no self loops' rows: their edge terms are zero
            rows = torch.cat([rows, rows.new_zeros(csr.num_dst, *rows.shape[1:])])
        ek = rows[erow]
    if gatv2:
        u = kj + qi if ek is None else kj + qi + ek
        e = (torch.nn.functional.leaky_relu(u, slope) * att.to(work)).sum(-1)
        return reference_softmax_sum(e, row, col, ids, v, q.shape[0], p, seed, v.dtype)
    e = (qi * (kj if ek is None else kj + ek)).sum(-1) * scale
    return reference_softmax_sum(e, row, col, ids, v, q.shape[0], p, seed, v.dtype, edge_values=ek)


def _run(q, k, v, att, edge, graph, gatv2, slope, scale, dropout, seed, add_self_loops, backend, csr_edges=False):
    """Checks shared by both public functions (arguments named as the caller knows them), then the
    op (or the reference). Edge features [E (+ loops), H, F]: rows in edge_index order, or with
    ``csr_edges`` (the layers, nn/_pair_attention.py, when they reorder the raw edge_attr) in CSR
    order (row k for CSR position k), the self loops' rows last either way; with E rows alone the
    self loops' edge terms are zero (the kernels read and write no row for them)."""
    q_name, v_name = ("x_dst", "x_src") if gatv2 else ("query", "value")
    require_shape(v_name, v, "[N_src, H, F]", v.dim() == 3)
    n_src, heads, width = k.shape
    if not (q.dim() == 3 and q.shape[1:] == (heads, width)):
        require_shape(q_name, q, f"[N_dst, {heads}, {width}]", False)
    if v.shape != k.shape:
        require_shape(v_name, v, f"[{n_src}, {heads}, {width}] (the key's shape)", False)
    csr = _as_csr(graph, k, q.shape[0])
    if csr.num_src > n_src:
        raise ValueError(f"the sources have {n_src} rows but the graph has {csr.num_src} source nodes")
    seed = dropout_seed(dropout, seed)
    num_loops = min(n_src, csr.num_dst) if add_self_loops else 0
    if edge is not None:
        edge = _features("edge_attr", edge)
        if not (edge.dim() == 3 and edge.shape[1:] == (heads, width)
                and edge.shape[0] in (csr.num_edges, csr.num_edges + num_loops)):
            rows = f"[E, {heads}, {width}] or [E + {num_loops}, {heads}, {width}] (self loops last)" if num_loops \
                else f"[E, {heads}, {width}]"
            require_shape("edge_attr", edge, rows.replace("E", str(csr.num_edges)), False)
    require_same_device(q=q, k=k, v=v, att=att, edge_attr=edge, edge_index=csr.col)
    backend = resolve_backend(backend, k.device)
    scalars = (bool(add_self_loops), bool(gatv2), float(slope), float(scale), float(dropout), seed)
    q, k, v = (t.to(k.dtype).contiguous() for t in (q, k, v))
    att = att.to(k.dtype).contiguous() if att is not None else None
    if edge is not None:
        edge = edge.to(k.dtype).contiguous()
    if backend == "reference":
        return reference(q, k, v, att, edge, csr, *scalars, edge_perm=not csr_edges)
    wants_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, att, edge))
    transpose = csr.transpose_parts() if wants_grad else (None, None, None)
    perm = csr.perm if edge is not None and not csr_edges else None  # no perm: rows in CSR order
    return FORWARD(q, k, v, att, edge, csr.rowptr, csr.col, perm, *transpose, *scalars, backend=backend)[0]


def _features(name: str, t) -> torch.Tensor:
    t = require_tensor(name, t)
    require_floating(name, t)
    return t


def gatv2_attention(x_src: torch.Tensor, x_dst: torch.Tensor, att: torch.Tensor, edge_index_or_csr, *,
                    edge_attr: torch.Tensor | None = None, negative_slope: float = 0.2, dropout: float = 0.0,
                    seed: int | None = None, add_self_loops: bool = False, backend: str = "auto") -> torch.Tensor:
    """GATv2's attention-weighted aggregation, fused: ``out [N_dst, H, F]`` (see the module doc).

    Args:
        x_src: [N_src, H, F] projected source features (lin_l(x)); also the aggregated values.
        x_dst: [N_dst, H, F] projected target features (lin_r(x)).
        att: [H, F] (or [1, H, F]) attention vector.
        edge_attr: optional projected edge features [E, H, F] in edge_index order, added inside the
            leaky_relu (PyG's lin_edge(edge_attr)); with add_self_loops, [E + min(N_src, N_dst), H, F]
            gives the self loops' terms last (PyG's add_self_loops order), [E, H, F] gives them none.
        edge_index_or_csr, negative_slope, dropout, seed, add_self_loops, backend: as in
            :func:`gnnfuse.gat_attention`.

    Example::

        xl, xr = lin_l(x).view(-1, H, F), lin_r(x).view(-1, H, F)
        out = gnnfuse.gatv2_attention(xl, xr, att, edge_index, add_self_loops=True)   # [N, H, F]
    """
    x_src, x_dst, att = _features("x_src", x_src), _features("x_dst", x_dst), _features("att", att)
    require_shape("x_src", x_src, "[N_src, H, F]", x_src.dim() == 3)
    att = att.reshape(att.shape[-2:]) if att.dim() == 3 and att.shape[0] == 1 else att
    if att.shape != x_src.shape[1:]:
        require_shape("att", att, f"[H, F] = {list(x_src.shape[1:])}", False)
    if not isinstance(negative_slope, (int, float)):
        raise TypeError(f"negative_slope must be a float; got {type(negative_slope).__name__}")
    return _run(x_dst, x_src, x_src, att, edge_attr, edge_index_or_csr, True, negative_slope, 1.0, dropout, seed,
                add_self_loops, backend)


def dot_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, edge_index_or_csr, *,
                  edge_attr: torch.Tensor | None = None, scale: float | None = None, dropout: float = 0.0,
                  seed: int | None = None, add_self_loops: bool = False, backend: str = "auto") -> torch.Tensor:
    """Graph transformer attention (TransformerConv's), fused: ``out [N_dst, H, F]``.

    Args:
        query: [N_dst, H, F]; key and value: [N_src, H, F].
        edge_attr: optional projected edge features [E, H, F] in edge_index order, added to the keys
            and the values (TransformerConv's lin_edge(edge_attr)); with add_self_loops as in
            :func:`gatv2_attention`.
        scale: logit scale, default 1/sqrt(F).
        edge_index_or_csr, dropout, seed, add_self_loops, backend: as in :func:`gnnfuse.gat_attention`.

    Example::

        q, k, v = (lin(x).view(-1, H, F) for lin in (lin_query, lin_key, lin_value))
        out = gnnfuse.dot_attention(q, k, v, edge_index)                               # [N, H, F]
    """
    query, key, value = _features("query", query), _features("key", key), _features("value", value)
    require_shape("key", key, "[N_src, H, F]", key.dim() == 3)
    if scale is None:
        scale = 1.0 / math.sqrt(key.shape[2]) if key.shape[2] else 1.0
    if not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float; got {type(scale).__name__}")
    return _run(query, key, value, None, edge_attr, edge_index_or_csr, False, 0.0, scale, dropout, seed,
                add_self_loops, backend)
