"""Slow, obviously-correct pure-PyTorch versions of every op.

Used by the tests as the ground truth and by ``backend="reference"``. They materialise the
E x F message tensor on purpose: clarity over speed.
"""
from __future__ import annotations

import torch

from ._validate import IndexOutOfRange, device_assert
from .constants import HALF_DTYPES, STD_CUT, STD_FLOOR
from .reductions import TORCH_NAME as _SCATTER_REDUCE


def coo_to_csr(key: torch.Tensor, other: torch.Tensor, num_rows: int, num_other: int,
               out_dtype: torch.dtype | None = None):
    """Stable sort of edges by ``key``: (rowptr, col, perm) in ``out_dtype`` (default: key's dtype).
    Ids are range-checked before they are converted (one host sync on CUDA)."""
    for name, values, limit in (("edge_index[1] (targets)", key, num_rows), ("edge_index[0] (sources)", other, num_other)):
        if values.numel():
            low, high = torch.aminmax(values)
            if int(low) < 0 or int(high) >= limit:
                position = int(torch.nonzero((values < 0) | (values >= limit))[0, 0])
                raise IndexOutOfRange(f"{name} contains node id {int(values[position])} at edge {position}, "
                                      f"outside [0, {limit})")
    dtype = out_dtype or key.dtype
    perm = torch.sort(key, stable=True).indices
    counts = torch.bincount(key.long(), minlength=num_rows)
    rowptr = torch.zeros(num_rows + 1, dtype=torch.long, device=key.device)
    torch.cumsum(counts, 0, out=rowptr[1:])
    return rowptr.to(dtype), other[perm].to(dtype), perm.to(dtype)


def validate_csr(rowptr: torch.Tensor, col: torch.Tensor, perm: torch.Tensor | None, num_src: int) -> None:
    """The structural check of a CSR (see gnnfuse.ops.coo_to_csr.validate_csr) with torch ops."""
    E = col.numel()
    if int(rowptr[0]) != 0:
        raise ValueError(f"CSR.rowptr[0] is {int(rowptr[0])}; it must be 0")
    if int(rowptr[-1]) != E:
        raise ValueError(f"CSR.rowptr[-1] is {int(rowptr[-1])} but CSR.col has {E} entries; "
                         "rowptr must end at the number of edges")
    drops = torch.nonzero(rowptr.diff() < 0)
    if drops.numel():
        r = int(drops[0, 0])
        raise ValueError(f"CSR.rowptr must be non-decreasing; rowptr[{r}] = {int(rowptr[r])} > "
                         f"rowptr[{r + 1}] = {int(rowptr[r + 1])}")
    _require_ids_below("CSR.col", col, num_src, "node id", f"num_src={num_src}")
    if perm is not None:
        validate_perm(perm)


def validate_perm(perm: torch.Tensor) -> None:
    """That ``perm`` is a permutation of ``[0, len(perm))`` (see gnnfuse.ops.coo_to_csr.validate_perm)."""
    E = perm.numel()
    _require_ids_below("CSR.perm", perm, E, "edge id", str(E))
    if E and int(torch.bincount(perm.long(), minlength=E).max()) > 1:
        seen = torch.zeros(E, dtype=torch.bool, device=perm.device)
        for e, v in enumerate(perm.tolist()):  # only on failure: find the first repeat for the message
            if seen[v]:
                raise ValueError(f"CSR.perm is not a permutation: edge id {v} appears more than once "
                                 f"(again at CSR position {e})")
            seen[v] = True


def _require_ids_below(name: str, values: torch.Tensor, limit: int, what: str, bound: str) -> None:
    bad = torch.nonzero((values < 0) | (values >= limit))
    if bad.numel():
        e = int(bad[0, 0])
        raise IndexOutOfRange(f"{name} contains {what} {int(values[e])} at CSR position {e}, outside [0, {bound})")


def assert_valid_csr(rowptr: torch.Tensor, col: torch.Tensor, perm: torch.Tensor, num_src) -> None:
    """The same check as device-side assertions (no host sync; traceable by torch.compile). The
    messages cannot quote values: they would need the sync this avoids."""
    E = col.shape[0]
    device_assert(rowptr[0] == 0, "CSR.rowptr[0] must be 0")
    device_assert(rowptr[-1] == E, "CSR.rowptr must end at len(CSR.col)")
    device_assert((rowptr.diff() >= 0).all(), "CSR.rowptr must be non-decreasing")
    device_assert(((col >= 0) & (col < num_src)).all(), "CSR.col has a node id outside [0, num_src)")
    device_assert(((perm >= 0) & (perm < E)).all(), "CSR.perm has an edge id outside [0, len(col))")
    hits = torch.zeros(E, dtype=torch.int32, device=perm.device).index_add(
        0, perm.long().clamp(0, E - 1), torch.ones_like(perm, dtype=torch.int32))
    device_assert((hits == 1).all(), "CSR.perm is not a permutation of [0, len(col))")


def gather_scatter(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, num_dst: int, reduce: str = "sum",
                   edge_weight: torch.Tensor | None = None) -> torch.Tensor:
    """out[i] = REDUCE_{e: dst[e] == i} w[e] * x[src[e]]; empty rows are 0.

    Edges must be given in CSR order (sorted by ``dst``, stably) for max/min gradients to
    follow gnnfuse's rule: the gradient of each (row, feature) goes to one winning edge, the
    first in CSR order among ties.
    """
    src, dst = src.long(), dst.long()
    feat = x.shape[1:]
    msg = x.reshape(x.shape[0], -1)[src]
    if edge_weight is not None:
        msg = msg * edge_weight.to(x.dtype).unsqueeze(-1)
    work_dtype = torch.float32 if x.dtype in HALF_DTYPES else x.dtype
    msg = msg.to(work_dtype)
    index = dst.unsqueeze(-1).expand_as(msg)
    zeros = msg.new_zeros(num_dst, msg.shape[1])
    if reduce in ("max", "min"):
        best = zeros.scatter_reduce(0, index, msg, _SCATTER_REDUCE[reduce], include_self=False).detach()
        target = best[dst]
        is_best = (msg == target) | (msg.isnan() & target.isnan())
        # first winning edge of each (row, feature) in edge order: running count of winners == 1
        running = torch.cumsum(is_best.long(), 0)
        before_row = running.new_zeros(1, running.shape[1])
        row_start = torch.searchsorted(dst, torch.arange(num_dst, device=dst.device))
        prior = torch.cat([before_row, running])[row_start][dst]
        first = is_best & (running - prior == 1)
        out = zeros.index_add(0, dst, torch.where(first, msg, torch.zeros_like(msg)))
    else:
        out = zeros.scatter_reduce(0, index, msg, _SCATTER_REDUCE[reduce], include_self=False)
    return out.to(x.dtype).reshape(num_dst, *feat)


def multi_aggregate(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, num_dst: int, aggrs: list[str],
                    edge_weight: torch.Tensor | None = None) -> torch.Tensor:
    """[num_dst, len(aggrs) * F]: block k is aggrs[k] of the messages (see gather_scatter);
    var = mean(m^2) - mean(m)^2, std = sqrt(max(var, 1e-5)) set to 0 where <= sqrt(1e-5) (as PyG)."""
    blocks = []
    for name in aggrs:
        if name in ("var", "std"):
            mean = gather_scatter(x, src, dst, num_dst, "mean", edge_weight)
            w2 = None if edge_weight is None else edge_weight.to(x.dtype) ** 2
            var = gather_scatter(x * x, src, dst, num_dst, "mean", w2) - mean * mean
            if name == "std":
                var = var.clamp(min=STD_FLOOR).sqrt()
                var = var.masked_fill(var <= STD_CUT, 0.0)
            blocks.append(var)
        else:
            blocks.append(gather_scatter(x, src, dst, num_dst, name, edge_weight))
    return torch.cat(blocks, dim=1)


# ---- structured density scatter ----
def structured_flat_index(wa: torch.Tensor, wbwc: torch.Tensor) -> torch.Tensor:
    """The explicit flat indices [C * nx * ny * nz] (int64) of a structured scatter:
    wa[c, ix] + wbwc[c, iy, iz] in density_cube's (c, ix, iy, iz) order."""
    return (wa.long()[:, :, None, None] + wbwc.long()[:, None, :, :]).reshape(-1)


def structured_scatter_add(density_cube: torch.Tensor, wa: torch.Tensor, wbwc: torch.Tensor, map_size: int,
                           check_bounds: bool = True) -> torch.Tensor:
    """out[wa[c, ix] + wbwc[c, iy, iz]] += density_cube[c, ix, iy, iz], out [map_size]; half types
    accumulate in float32. Out-of-range indices raise (check_bounds) or are dropped."""
    flat = structured_flat_index(wa, wbwc)
    values = density_cube.reshape(-1)
    bad = (flat < 0) | (flat >= map_size)
    if flat.numel() and bool(bad.any()):
        if check_bounds:
            raise IndexOutOfRange(f"structured_scatter_add: flat index {int(flat[bad][0])} (wa + wbwc) is outside "
                             f"[0, map_size={map_size})")
        flat, values = flat[~bad], values[~bad]
    work_dtype = torch.float32 if density_cube.dtype in HALF_DTYPES else density_cube.dtype
    out = torch.zeros(map_size, dtype=work_dtype, device=density_cube.device)
    return out.index_add(0, flat, values.to(work_dtype)).to(density_cube.dtype)


# ---- planarity NLL ----
_HALF_LOG_2PI = 0.9189385332046727417803297364056176


def planarity_normals(centred: list[torch.Tensor]) -> torch.Tensor:
    """Unit normals [sum P, 3] (float64, detached) of centred planes [P, n, 3]: the eigenvector of the
    smallest eigenvalue of each 3x3 covariance, from one batched eigh; zero where it is not finite."""
    if not centred:
        return torch.zeros(0, 3, dtype=torch.float64)
    cov = torch.cat([(c.transpose(1, 2) @ c) / c.shape[1] for c in centred]).detach()
    finite = torch.isfinite(cov).all(dim=(1, 2))
    safe = torch.where(finite[:, None, None], cov, torch.zeros_like(cov))
    vectors = torch.linalg.eigh(safe).eigenvectors[..., 0]
    return torch.where(finite[:, None], vectors, torch.zeros_like(vectors))


def planarity_nll(xyz: torch.Tensor, plane_groups) -> torch.Tensor:
    """sum_p [sum_a 0.5 (d_pa/s_p)^2 + n (log s_p + 0.5 log 2 pi)], d_pa = (x_pa - c_p) . n_p.

    Computed in float64 (result cast to xyz's dtype); normals detached; autograd through the rest.
    """
    x = xyz.to(torch.float64)
    centred = []
    for b, (indices, _) in enumerate(plane_groups):
        if indices.numel() and not torch.compiler.is_compiling():
            low, high = torch.aminmax(indices)
            if int(low) < 0 or int(high) >= x.shape[0]:
                bad = int(indices.reshape(-1)[((indices < 0) | (indices >= x.shape[0])).reshape(-1)][0])
                raise IndexOutOfRange(f"planarity_nll: plane_groups[{b}] indices contain atom id {bad}, "
                                      f"outside [0, {x.shape[0]})")
        pts = x[indices.long()]  # [P, n, 3]
        centred.append(pts - pts.mean(dim=1, keepdim=True))
    normals = planarity_normals(centred).to(x.device)
    total = x.new_zeros(())
    start = 0
    for c, (_, sigmas) in zip(centred, plane_groups):
        P, n = c.shape[0], c.shape[1]
        d = (c * normals[start:start + P, None, :]).sum(-1)  # [P, n]
        s = sigmas.to(torch.float64)
        total = total + (0.5 * (d / s[:, None]) ** 2).sum() + n * (torch.log(s) + _HALF_LOG_2PI).sum()
        start += P
    return total.to(xyz.dtype)
