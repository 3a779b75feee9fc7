"""torch_scatter-compatible reductions on gnnfuse's fused kernels: :func:`scatter`,
:func:`segment_csr`, :func:`segment_coo`, ``scatter_<reduce>``, ``segment_<reduce>_csr/_coo``,
:func:`scatter_max` / :func:`scatter_min` with their argmax.

Each call is turned into one segment reduction of a [S, F] matrix into [T, F] rows, i.e. a
gather-scatter whose gather is the identity (source row s is read once, by the one segment that
holds it), and runs on the ``gnnfuse::gather_scatter`` op: OpenMP C++ on CPU, Triton on CUDA,
compile-safe, with the op's gradients. ``segment_csr`` hands ``indptr`` to the kernels as the
CSR's rowptr; ``scatter`` sorts the index once and caches the sort on the index tensor, so a
repeated index (a GNN's edge index) is not sorted again (``segment_coo`` never sorts, its index is
sorted). The *first* call with an index takes a sort-free route instead for sum/mean/max/min of
float32/float64 when nothing needs the sort (no gradient, no argmax, no ``out=``), outside
torch.compile: on the Triton backend, outside ``torch.use_deterministic_algorithms(True)``, an
atomic kernel (gnnfuse/triton/scatter_atomic.py, as torch's ``scatter_reduce`` does; its sums may
differ in the last bits from run to run); on CPU a deterministic C++ kernel in which each thread
owns a range of targets (csrc/scatter_unsorted.cpp; also later calls with outputs <= 2 MB). A second
call with the same index sorts it once and takes the deterministic cached route from then on.

Semantics follow torch_scatter, including the broadcasting of ``index`` against ``src`` and
``out=`` (scatter/segment_coo fold the result into ``out`` in place, segment_csr overwrites it).
Empty segments give 0 (1 for "mul") and, for max/min, the argmax ``src.size(dim)``.
Intended differences:

* ties in max/min: the argmax is the *smallest* index among the tied elements, always, and
  the gradient goes to that element (torch_scatter's CUDA kernels pick any of them);
* an out-of-range index raises an error (checked on the device, no host sync) where
  torch_scatter reads or writes out of bounds;
* ``dim_size=None`` reads ``index.max()`` on the host, as torch_scatter does: under
  torch.compile pass ``dim_size`` (or ``out``) to keep the graph whole;
* integer ``src`` runs on ``torch.scatter_reduce`` (the fused kernels are floating point only).
"""
from __future__ import annotations

import math

import torch

from . import _one_off_scatter as _one_off
from ._tensor_cache import cached
from ._validate import device_assert, require_tensor
from .constants import INDEX_DTYPES, VALUE_DTYPES
from .ops._library import resolve_backend
from .ops.gather_scatter import FORWARD
from .reductions import ARG, SINGLE, TORCH_NAME, canonical_reduce

__all__ = ["scatter", "scatter_sum", "scatter_add", "scatter_mean", "scatter_mul", "scatter_min", "scatter_max",
           "segment_csr", "segment_coo", "segment_sum_csr", "segment_add_csr", "segment_mean_csr", "segment_max_csr",
           "segment_min_csr", "segment_sum_coo", "segment_add_coo", "segment_mean_coo", "segment_max_coo",
           "segment_min_coo"]



# ---- the one segment reduction everything runs on -----------------------------------------------
def _reduce_rows(x, rowptr, col, transpose, reduce, backend):
    """(out [T, F], arg [T, F] source rows of the winners, -1 where empty; [0, 0] unless max/min)."""
    out, arg = FORWARD(x, rowptr, col, None, *transpose, reduce, backend=backend)
    if reduce in ARG and arg.numel():  # CSR position -> source row (col), empty rows stay -1
        arg = torch.where(arg >= 0, col[arg.clamp(min=0)], arg)
    return out, arg


def _reduce_rows_torch(x, targets, num_targets, reduce):
    """The same on torch.scatter_reduce (integer src): out, winners' source rows (-1 where empty)."""
    F = x.shape[1]
    idx = targets.view(-1, 1).expand(-1, F)
    out = x.new_zeros(num_targets, F).scatter_reduce(0, idx, x, TORCH_NAME[reduce], include_self=False)
    arg = x.new_empty(0, 0, dtype=torch.long)
    if reduce in ARG:
        S = x.shape[0]
        rows = torch.arange(S, device=x.device).view(-1, 1).expand(-1, F)
        won = torch.where(x == out.gather(0, idx), rows, S)
        arg = torch.full((num_targets, F), S, dtype=torch.long, device=x.device).scatter_reduce(0, idx, won, "amin")
        arg = torch.where(arg == S, -1, arg)
    return out, arg


def _segment_reduce(x, rowptr, col, transpose, targets, num_targets, reduce, backend):
    """Dispatches one [S, F] -> [T, F] reduction; returns (out, arg as source rows, counts)."""
    counts = rowptr[1:] - rowptr[:-1]
    if x.dtype not in VALUE_DTYPES:
        out, arg = _reduce_rows_torch(x, targets, num_targets, reduce)
    else:
        backend = resolve_backend(backend, x.device)
        if backend == "reference":
            out, arg = _reduce_rows_torch(x, targets, num_targets, reduce)
        else:
            out, arg = _reduce_rows(x.contiguous(), rowptr, col, transpose, reduce, backend)
    if reduce == "mul":  # torch_scatter's empty product is 1
        out = torch.where((counts == 0).view(-1, 1), torch.ones_like(out), out)
    return out, arg, counts


def _wants_transpose(src, reduce, want_arg) -> bool:
    """The kernels need the transpose for gradients and to record max/min winners."""
    return (reduce in ARG and want_arg) or (torch.is_grad_enabled() and src.requires_grad)


def _sorted_segments(targets, num_targets, presorted, need_transpose=True):
    """CSR of the flat ``targets`` (one per source row), its transpose (None's unless
    ``need_transpose``), and the range check."""
    S = targets.shape[0]
    positions = torch.arange(S, device=targets.device)
    if presorted:
        ordered, perm = targets, positions
    else:
        ordered, perm = torch.sort(targets, stable=True)  # stable: ties keep index order
    bounds = torch.arange(num_targets + 1, device=targets.device)
    rowptr = torch.searchsorted(ordered, bounds)  # rowptr[k] = #targets < k: no data-dependent shape
    # (a fixed message: formatting sizes would specialise a compiled graph on them)
    device_assert((rowptr[0] == 0) & (rowptr[-1] == S),
                  "index contains values outside [0, dim_size), or segment_coo's index is not sorted")
    if not need_transpose:
        return rowptr, perm, (None, None, None)
    inverse = positions if presorted else torch.empty_like(perm).scatter_(0, perm, positions)
    transpose = (torch.arange(S + 1, device=targets.device), targets, inverse)
    return rowptr, perm, transpose


# ---- shapes: torch_scatter's broadcasting ---------------------------------------------------------
def _normalise_dim(dim: int, ndim: int, name: str = "dim") -> int:
    if not -ndim <= dim < max(ndim, 1):
        raise IndexError(f"{name}={dim} is out of range for a tensor with {ndim} dimensions")
    return dim + ndim if dim < 0 else dim


def _broadcast_index(index: torch.Tensor, src: torch.Tensor, dim: int) -> torch.Tensor:
    """torch_scatter's rule: a 1-D index lines up with ``dim``; missing trailing dims are added."""
    if index.dim() == 1:
        index = index.view((1,) * dim + (-1,))
    while index.dim() < src.dim():
        index = index.unsqueeze(-1)
    return index


def _check(src, index, reduce):
    require_tensor("src", src)
    require_tensor("index", index)
    if index.dtype not in INDEX_DTYPES:
        raise TypeError(f"index must be an int32 or int64 tensor; got {index.dtype}")
    if index.device != src.device:
        raise ValueError(f"src and index must be on one device; got src on {src.device}, index on {index.device}")
    return canonical_reduce(reduce, SINGLE)


def _scatter_impl(src, index, dim, out, dim_size, reduce, backend, presorted=False, want_arg=True):
    """Returns (result in src's layout with dim -> N, argmax along dim or None). ``want_arg=False``
    (plain ``scatter``): max/min record no winners unless a gradient or ``out=`` needs them."""
    reduce = _check(src, index, reduce)
    want_arg = want_arg or out is not None
    dim = _normalise_dim(dim, src.dim())
    index, given = _broadcast_index(index, src, dim), index  # (uses of an index are counted on the given one)
    if index.dim() != src.dim():
        raise ValueError(f"index must have at most src's {src.dim()} dimensions; got {index.dim()}")
    shape = list(src.shape)
    E = shape[dim]
    if dim_size is None:
        dim_size = out.shape[dim] if out is not None else (int(index.max()) + 1 if index.numel() else 0)
    N = dim_size
    outer, inner = math.prod(shape[:dim]), math.prod(shape[dim + 1:])
    rows_share_index = all(s == 1 for s in index.shape[dim + 1:])  # one target per source row of F = inner
    F = inner if rows_share_index else 1
    T = outer * N * (inner if F == 1 else 1)
    need_transpose = _wants_transpose(src, reduce, want_arg)

    def flat_targets():
        """The target row of every row of the flat [S, F] view of src."""
        idx = index.expand(shape[:dim + 1] + list(index.shape[dim + 1:])).long()
        blocks = torch.arange(outer, device=src.device).view(-1, 1) * N
        if rows_share_index:
            return (blocks + idx.reshape(outer, E)).reshape(-1)
        # the index differs along the trailing dims: every element is its own row
        idx = idx.expand(shape).reshape(outer, E, inner)
        return ((blocks.view(-1, 1, 1) + idx) * inner + torch.arange(inner, device=src.device)).reshape(-1)

    def segments():
        """(targets, rowptr, perm, transpose): the flat targets and their sort, the costly part."""
        targets = flat_targets()
        return (targets, *_sorted_segments(targets, T, presorted and rows_share_index, need_transpose))

    x = src.reshape(outer * E * (inner if F == 1 else 1), F)
    out_shape = shape[:dim] + [N] + shape[dim + 1:]
    route = None if out is not None or need_transpose else _one_off.one_off_route(src, given, reduce, backend, T * F)
    if route is not None:
        # (the common case, dim 0: the index itself, int32 or int64, with no copy)
        one_row_each = rows_share_index and outer == 1 and index.numel() == E
        targets = index.reshape(-1) if one_row_each else flat_targets()
        return _one_off.scatter_one_off(route, x.contiguous(), targets, T, reduce, index, N).reshape(out_shape), None

    # A repeated index (a GNN's edge index, layer after layer) is sorted once: the segments are
    # cached on the index tensor's memory like a graph's CSR (gnnfuse._tensor_cache: a write to the
    # index invalidates them). Never while Dynamo traces (a cache hit would be baked into the graph).
    if torch.compiler.is_compiling():
        targets, rowptr, perm, transpose = segments()
    else:
        targets, rowptr, perm, transpose = cached(
            "scatter", (index,), (tuple(shape), dim, N, presorted, need_transpose), segments)
    res, arg, counts = _segment_reduce(x, rowptr, perm, transpose, targets, T, reduce, backend)
    res = res.reshape(out_shape)
    if reduce in ARG and want_arg:  # source row -> position along dim; empty -> E
        pos = (arg // inner) % E if F == 1 else arg % max(E, 1)
        arg = torch.where(arg >= 0, pos, E).reshape(out_shape)
    else:
        arg = None
    if out is None:
        return res, arg
    counts_shape = out_shape if F == 1 else out_shape[:dim + 1] + [1] * (len(shape) - dim - 1)
    return _fold_into(out, res, arg, counts.reshape(counts_shape), reduce, E)


def _fold_into(out, res, arg, counts, reduce, E):
    """torch_scatter's ``out=``: the result folded into out's values, in place."""
    if out.shape != res.shape:
        raise ValueError(f"out must have shape {tuple(res.shape)}; got {tuple(out.shape)}")
    nonempty = counts > 0
    if reduce == "sum":
        out.add_(res)
    elif reduce == "mul":
        out.mul_(res)
    elif reduce == "mean":  # torch_scatter: (out + sum) / max(count, 1)
        total = out + res * counts.to(res.dtype)
        out.copy_(total / counts.clamp(min=1).to(res.dtype) if out.is_floating_point()
                  else total // counts.clamp(min=1))
    else:
        better = (res > out) if reduce == "max" else (res < out)
        take = nonempty & better
        out.copy_(torch.where(take, res, out))
        arg = torch.where(take, arg, E)
    return out, arg

# ---- public API ----------------------------------------------------------------------------------
def scatter(src: torch.Tensor, index: torch.Tensor, dim: int = -1, out: torch.Tensor | None = None,
            dim_size: int | None = None, reduce: str = "sum", *, backend: str = "auto") -> torch.Tensor:
    """Reduces all values of ``src`` that share an ``index`` (along ``dim``), like torch_scatter.

    ``reduce``: "sum" | "add" | "mean" | "mul" | "prod" | "max" | "amax" | "min" | "amin".
    ``index`` is broadcast against ``src`` as torch_scatter does (a 1-D index runs along ``dim``).
    Returns ``src``'s shape with ``dim`` of size ``dim_size`` (default ``index.max() + 1``).
    ``backend``: as for :func:`gnnfuse.fused_gather_scatter` (gnnfuse only).

    Example::

        out = gnnfuse.scatter(x, batch, dim=0, reduce="mean")   # [num_graphs, F] graph readout
    """
    fast = None if out is not None else _one_off.rows_on_cpu(src, index, dim, dim_size, reduce, backend)
    return _scatter_impl(src, index, dim, out, dim_size, reduce, backend, want_arg=False)[0] if fast is None else fast


def scatter_sum(src, index, dim=-1, out=None, dim_size=None, *, backend="auto"):
    return scatter(src, index, dim, out, dim_size, "sum", backend=backend)


scatter_add = scatter_sum


def scatter_mean(src, index, dim=-1, out=None, dim_size=None, *, backend="auto"):
    return scatter(src, index, dim, out, dim_size, "mean", backend=backend)


def scatter_mul(src, index, dim=-1, out=None, dim_size=None, *, backend="auto"):
    return scatter(src, index, dim, out, dim_size, "mul", backend=backend)


def scatter_max(src, index, dim=-1, out=None, dim_size=None, *, backend="auto"):
    """(values, argmax): argmax is the position along ``dim`` of the winning element (the smallest
    among ties); empty segments give value 0 and argmax ``src.size(dim)``."""
    return _scatter_impl(src, index, dim, out, dim_size, "max", backend)


def scatter_min(src, index, dim=-1, out=None, dim_size=None, *, backend="auto"):
    """(values, argmin), as :func:`scatter_max`."""
    return _scatter_impl(src, index, dim, out, dim_size, "min", backend)


def segment_coo(src: torch.Tensor, index: torch.Tensor, out: torch.Tensor | None = None,
                dim_size: int | None = None, reduce: str = "sum", *, backend: str = "auto") -> torch.Tensor:
    """torch_scatter's ``segment_coo``: ``index`` is sorted and runs along ``dim = index.dim() - 1``
    (its leading dims match ``src``'s). No sort is done. Returns the values for every reduce, as
    torch_scatter does; ``segment_max_coo`` / ``segment_min_coo`` also return the argmax."""
    return _values(_segment_coo(src, index, out, dim_size, reduce, backend))


def _segment_coo(src, index, out, dim_size, reduce, backend):
    require_tensor("index", index)
    dim = index.dim() - 1
    if index.dim() > src.dim() or tuple(index.shape[:-1]) != tuple(src.shape[:dim]):
        index = index.expand(tuple(src.shape[:index.dim()]))
    if dim_size is None and out is None and index.numel():
        dim_size = int(index.max()) + 1
    if dim_size is None and out is None:
        dim_size = 0  # an empty index
    res, arg = _scatter_impl(src, index, dim, out, dim_size, reduce, backend, presorted=True)
    return (res, arg) if arg is not None else res


def segment_csr(src: torch.Tensor, indptr: torch.Tensor, out: torch.Tensor | None = None, reduce: str = "sum", *,
                backend: str = "auto") -> torch.Tensor:
    """torch_scatter's ``segment_csr``: segment k of ``src`` along ``dim = indptr.dim() - 1`` is
    ``[indptr[..., k], indptr[..., k + 1])``; ``indptr`` goes to the kernels as the CSR's rowptr
    (no sort, no index built). ``out`` is overwritten. Returns the values for every reduce, as
    torch_scatter does; ``segment_max_csr`` / ``segment_min_csr`` also return the argmax."""
    return _values(_segment_csr(src, indptr, out, reduce, backend))


def _segment_csr(src, indptr, out, reduce, backend):
    reduce = _check(src, indptr, reduce)
    dim = max(indptr.dim() - 1, 0)
    shape = list(src.shape)
    if indptr.dim() > src.dim():
        raise ValueError(f"indptr must have at most src's {src.dim()} dimensions; got {indptr.dim()}")
    N = max(indptr.shape[-1] - 1, 0) if indptr.dim() else 0
    E = shape[dim]
    outer, inner = math.prod(shape[:dim]), math.prod(shape[dim + 1:])
    out_shape = shape[:dim] + [N] + shape[dim + 1:]
    if N == 0 or E == 0 or src.numel() == 0:  # nothing to reduce: 0 (1 for mul), still differentiable
        res = src.narrow(dim, 0, 0)
        if N:
            res = res.sum(dim, keepdim=True).expand(out_shape) + (1 if reduce == "mul" else 0)
        arg = torch.full(out_shape, E, dtype=torch.long, device=src.device) if reduce in ARG else None
        return _written(out, res, arg)
    ptr = indptr.expand(shape[:dim] + [indptr.shape[-1]]).reshape(outer, -1).long()
    # flat rowptr: per block o an empty-or-leftover row before, the N segments offset by o*E, and a
    # final row to the end, so that the rows tile [0, outer*E) exactly (the extra rows are dropped)
    device_assert(((ptr[:, 1:] >= ptr[:, :-1]).all() & (ptr[:, 0] >= 0).all() & (ptr[:, -1] <= E).all()),
                  "indptr must be non-decreasing, within [0, src.size(indptr.dim() - 1)]")
    offsets = torch.arange(outer, device=src.device).view(-1, 1) * E
    rowptr = torch.cat([ptr.new_zeros(1), (ptr + offsets).reshape(-1), ptr.new_full((1,), outer * E)])
    S = outer * E
    positions = torch.arange(S, device=src.device)
    rows = rowptr.shape[0] - 1
    row_of = None
    transpose: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | tuple[None, None, None] = (None, None, None)
    backend = resolve_backend(backend, src.device)
    if _wants_transpose(src, reduce, True) or src.dtype not in VALUE_DTYPES or backend == "reference":
        row_of = torch.searchsorted(rowptr, positions, right=True) - 1  # every position lies in one row
        transpose = (torch.arange(S + 1, device=src.device), row_of, positions)
    x = src.reshape(S, inner)
    res, arg, _ = _segment_reduce(x, rowptr, positions, transpose, row_of, rows, reduce, backend)
    keep = (torch.arange(outer, device=src.device).view(-1, 1) * (N + 1) + 1 + torch.arange(N, device=src.device))
    keep = keep.reshape(-1)
    res = res.index_select(0, keep).reshape(out_shape)
    if reduce in ARG:
        arg = arg.index_select(0, keep)
        arg = torch.where(arg >= 0, arg % E, E).reshape(out_shape)
    else:
        arg = None
    return _written(out, res, arg)


def _written(out, res, arg):
    if out is not None:
        if out.shape != res.shape:
            raise ValueError(f"out must have shape {tuple(res.shape)}; got {tuple(out.shape)}")
        out.copy_(res)
        res = out
    return (res, arg) if arg is not None else res


def _values(result):
    """The values of a (values, argmax) pair, or the result itself."""
    return result[0] if isinstance(result, tuple) else result


# ---- torch_scatter's per-reduce segment names: sum/add/mean return values, max/min (values, arg) --

def segment_sum_csr(src, indptr, out=None, *, backend="auto"):
    return segment_csr(src, indptr, out, "sum", backend=backend)


def segment_mean_csr(src, indptr, out=None, *, backend="auto"):
    return segment_csr(src, indptr, out, "mean", backend=backend)


def segment_max_csr(src, indptr, out=None, *, backend="auto"):
    return _segment_csr(src, indptr, out, "max", backend)


def segment_min_csr(src, indptr, out=None, *, backend="auto"):
    return _segment_csr(src, indptr, out, "min", backend)


def segment_sum_coo(src, index, out=None, dim_size=None, *, backend="auto"):
    return segment_coo(src, index, out, dim_size, "sum", backend=backend)


def segment_mean_coo(src, index, out=None, dim_size=None, *, backend="auto"):
    return segment_coo(src, index, out, dim_size, "mean", backend=backend)


def segment_max_coo(src, index, out=None, dim_size=None, *, backend="auto"):
    return _segment_coo(src, index, out, dim_size, "max", backend)


def segment_min_coo(src, index, out=None, dim_size=None, *, backend="auto"):
    return _segment_coo(src, index, out, dim_size, "min", backend)


segment_add_csr, segment_add_coo = segment_sum_csr, segment_sum_coo
