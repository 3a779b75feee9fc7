"""One PNA tower's aggregation times its post-layer blocks, with a backward that keeps the working
set small: :class:`AggregatedProjection`.

The tower computes ``p = multi_aggregate(x_t B^T, aggregators) @ W`` ([N, S*Fo]), where W holds
the first post-layer's blocks of every aggregator for every scaler. Differentiated by autograd,
the backward would hold at once the recomputed aggregation [N, K*F] with its max/min winners, the
aggregation's gradient [N, K*F] (grad_p W^T), the reduction backward's coefficients and their
sums over the transpose: about 16 [N, F] arrays for K = 4. This rule needs at most 8 at any
moment (K = 4: mean, min, max, std), the same kernels' passes, and never forms the aggregation's
gradient:

1. recompute y = x_t B^T and the aggregation with winners (y, aggregation, winners: 7 arrays);
   W's gradient is aggregation^T grad_p; y is dropped;
2. the per-target coefficients of the linear reductions (sum, mean, var, std), ``c`` and ``d``
   with d(message) = c[i] + d[i] m, are formed from grad_p times those blocks of W
   (one [N, 2F] matmul) and the aggregation's mean and std blocks, in place; the aggregation is
   dropped;
3. y again (one small matmul), max's and min's gradients (grad_p times their blocks) sent to their
   winners by the multi-aggregation backward op; the winners are dropped;
4. one sum pass over the transpose carries [c | d] to the sources: grad_y += c_sum + y * d_sum;
   then B's and x_t's gradients.

With feature chunks (``chunk``) every step works on a chunk of F at a time (the reductions are per
feature), in the forward too. The forward keeps nothing but its inputs.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..csr import CSR
from ..ops.gather_scatter import FORWARD as GATHER_SCATTER
from ..ops.multi_aggregate import BACKWARD as MULTI_BACKWARD
from ..ops.multi_aggregate import FORWARD as MULTI_FORWARD

__all__ = ["AggregatedProjection", "feature_chunks", "fold_repeated"]

_LINEAR = ("sum", "mean", "var", "std")
_WINNERS = ("max", "min")


class AggregatedProjection(torch.autograd.Function):
    """``apply(x_t, b, w, csr, names, backend, chunk, deg)`` -> ``p`` [N, P] =
    sum_k multi_aggregate(x_t @ b.T, names)[:, block k] @ w[k]  (see the module docstring).

    x_t [N, F_in]; b [F, F_in]; w [K, F, P] (one block per name; names distinct, see
    :func:`fold_repeated`); csr the validated graph (N source and target rows); names from sum,
    mean, max, min, var, std; backend "cpu" or "triton"; chunk features per pass (None: all);
    deg [N] the in-degrees in x_t's dtype. Differentiable once in x_t, b and w."""

    @staticmethod
    def forward(ctx, x_t, b, w, csr: CSR, names: tuple, backend: str, chunk, deg):
        ctx.csr, ctx.names, ctx.backend, ctx.chunk = csr, names, backend, chunk
        ctx.save_for_backward(x_t, b, w, deg)
        p = None
        aggrs = ",".join(names)
        for f0, f1 in feature_chunks(b.shape[0], chunk):
            # autograd is off in here: no winners, no transpose
            agg = MULTI_FORWARD(x_t @ b[f0:f1].t(), csr.rowptr, csr.col, None, None, None, None, aggrs,
                                backend=backend)[0]
            q = agg @ w[:, f0:f1].reshape(-1, w.shape[2])
            del agg
            p = q if p is None else p.add_(q)
        return p

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_p):
        x_t, b, w, deg = ctx.saved_tensors
        need_x, need_b, need_w = ctx.needs_input_grad[:3]
        grad_p = grad_p.contiguous()
        inv_deg = deg.clamp(min=1).reciprocal().unsqueeze(1)  # [N, 1]; empty rows are never read
        grad_x = torch.zeros_like(x_t) if need_x else None
        grad_b = torch.zeros_like(b) if need_b else None
        grad_w = torch.zeros_like(w) if need_w else None
        for f0, f1 in feature_chunks(b.shape[0], ctx.chunk):
            grad_y = _chunk_backward(ctx, x_t, b[f0:f1], w[:, f0:f1], grad_p, inv_deg,
                                     grad_w[:, f0:f1] if need_w else None)
            if need_b:
                grad_b[f0:f1] = grad_y.t() @ x_t
            if need_x:
                grad_x.addmm_(grad_y, b[f0:f1])
        return grad_x, grad_b, grad_w, None, None, None, None, None


def _chunk_backward(ctx, x_t, b, w, grad_p, inv_deg, grad_w):
    """y's gradient [N, Fc] for one chunk of features (b [Fc, F_in], w [K, Fc, P]); fills grad_w
    [K, Fc, P] (a view of the whole gradient) on the way. Steps as in the module docstring."""
    csr, names, backend = ctx.csr, ctx.names, ctx.backend
    t_rowptr, t_col, t_pos = csr._transpose_parts()
    N, Fc = x_t.shape[0], b.shape[0]
    block = {name: k for k, name in enumerate(names)}
    linear = [n for n in _LINEAR if n in block]
    winners = [n for n in _WINNERS if n in block]
    quadratic = "var" in block or "std" in block
    # the recomputed aggregation: the names in the given order, plus the mean where var/std need it
    order = list(names) + (["mean"] if quadratic and "mean" not in block else [])
    at = {name: k for k, name in enumerate(order)}
    transpose = (t_rowptr, t_col, t_pos) if winners else (None, None, None)  # winners only where needed
    agg, arg = MULTI_FORWARD(x_t @ b.t(), csr.rowptr, csr.col, None, *transpose, ",".join(order), backend=backend)
    A = agg.view(N, len(order), Fc)
    if grad_w is not None:
        grad_w.copy_((agg.t() @ grad_p).view(len(order), Fc, -1)[:len(names)])
    cd = _coefficients(A, at, block, w, grad_p, inv_deg) if linear else None
    del agg, A
    y = x_t @ b.t()  # again (dropped above): the winners op wants it, and d multiplies it
    grad_y = None
    if winners:
        w_win = torch.cat([w[block[n]] for n in winners]).t()  # [P, len(winners) * Fc]
        g_win = grad_p @ w_win
        # (only the linear reductions read the op's `out`: any tensor of its shape serves)
        grad_y = MULTI_BACKWARD(g_win, y, g_win, csr.rowptr, csr.col, None, t_rowptr, t_col, t_pos, arg,
                                ",".join(winners), True, False, backend=backend)[0]
        del g_win
    del arg
    if cd is not None:
        moved = GATHER_SCATTER(cd, t_rowptr, t_col, None, None, None, None, "sum", backend=backend)[0]
        del cd
        rows = moved.shape[0]  # the transpose's source rows (x_t may have more, without edges)
        if grad_y is None:
            part = torch.addcmul(moved[:, :Fc], y[:rows], moved[:, Fc:]) if quadratic else moved
            grad_y = part if rows == N else torch.cat([part, part.new_zeros(N - rows, Fc)])
        else:  # in place: no third [N, Fc] array
            grad_y[:rows].add_(moved[:, :Fc])
            if quadratic:
                grad_y[:rows].addcmul_(y[:rows], moved[:, Fc:])
    if grad_y is None:  # (no reductions: not a case the layer builds)
        grad_y = torch.zeros_like(y)
    return grad_y


def _coefficients(A, at, block, w, grad_p, inv_deg):
    """[c | d] ([N, 2Fc], or c alone [N, Fc] without var/std), contiguous: the message gradient
    of the linear reductions is c[i] + d[i] m. Built from one matmul (grad_p times the blocks of
    the c and d sources of w) and in-place updates; A [N, K', Fc] is the recomputed aggregation
    (its std block is overwritten: only W's gradient, already taken, read it)."""
    Fc = A.shape[2]
    c_src = "mean" if "mean" in block else ("sum" if "sum" in block else None)
    d_src = "std" if "std" in block else ("var" if "var" in block else None)
    cols = [w[block[c_src]] if c_src else torch.zeros_like(w[0])] + ([w[block[d_src]]] if d_src else [])
    cd = grad_p @ torch.cat(cols).t()  # [g_c | g_d]
    c = cd[:, :Fc]
    if c_src == "mean" and d_src:
        cd.mul_(inv_deg)  # mean's c and every d carry 1 / deg: one pass
    elif c_src == "mean":
        c.mul_(inv_deg)
    if c_src == "mean" and "sum" in block:
        c.addmm_(grad_p, w[block["sum"]].t())
    if not d_src:
        return cd
    d = cd[:, Fc:]
    if not c_src == "mean":
        d.mul_(inv_deg)
    for name in ("std", "var"):
        if name not in block:
            continue
        if name == d_src:
            term = d
        else:  # both var and std: the second one's term separately
            term = (grad_p @ w[block[name]].t()).mul_(inv_deg)
        if name == "std":  # d std / d m = (d var / d m) / (2 std) where std > 0, else 0
            inv_std = A[:, at["std"]]
            inv_std.reciprocal_().nan_to_num_(posinf=0.0)
            term.mul_(inv_std)
        else:  # d var / d m = 2 (m - mean) / deg
            term.mul_(2)
        if term is not d:
            d.add_(term)
    c.addcmul_(d, A[:, at["mean"]], value=-1)  # the -mean of (m - mean)
    return cd


def fold_repeated(names, w):
    """(distinct names, w with the blocks of a repeated name summed): the blocks of a name listed
    twice multiply the same aggregation. w [K, F, P]; differentiable."""
    unique = list(dict.fromkeys(names))
    if len(unique) == len(names):
        return tuple(names), w
    index = torch.tensor([unique.index(n) for n in names], device=w.device)
    return tuple(unique), w.new_zeros(len(unique), *w.shape[1:]).index_add(0, index, w)


def feature_chunks(F: int, chunk: int | None) -> list[tuple[int, int]]:
    """[f0, f1) ranges of at most ``chunk`` features covering [0, F) (one range when None)."""
    if chunk is None or chunk >= F:
        return [(0, F)]
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"aggregation_chunk_features must be a positive int or None; got {chunk!r}")
    return [(f0, min(f0 + chunk, F)) for f0 in range(0, F, chunk)]
