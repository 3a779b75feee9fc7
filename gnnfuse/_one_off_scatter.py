"""gnnfuse.scatter's sort-free route for the first call with an index (gnnfuse/scatter.py sorts an
index once and keeps the sort on the index tensor; a one-off index would pay for a sort it never
uses again): an atomic Triton kernel on CUDA (gnnfuse/triton/scatter_atomic.py), a deterministic
owner-computes C++ kernel on CPU (csrc/scatter_unsorted.cpp)."""
from __future__ import annotations

import torch

from ._build import optional_extension
from ._tensor_cache import cached
from ._validate import device_assert
from .constants import INDEX_DTYPES
from .ops._library import resolve_backend
from .reductions import ALIASES

ONE_OFF_REDUCES = ("sum", "mean", "max", "min")  # what the sort-free routes serve
SMALL_OUTPUT_BYTES = 2 << 20  # CPU outputs up to this size always take the sort-free kernel (about the L2)


def one_off_route(src, index, reduce, backend, out_numel: int, routes=("atomic", "unsorted")) -> str | None:
    """The sort-free route this call takes, if any, for sum/mean/max/min of float32/64 outside
    torch.compile: "atomic" on the Triton backend outside deterministic mode
    (gnnfuse/triton/scatter_atomic.py) and "unsorted" on the CPU one (csrc/scatter_unsorted.cpp,
    deterministic), for the first call with this index (a later call sorts it once and keeps the
    sort) -- and on CPU for every call whose output of ``out_numel`` values fits in
    SMALL_OUTPUT_BYTES, where the sort-free kernel's scattered writes stay in cache and it beat the
    cached sorted route (Cora, F=64, 2 threads: 0.07 against 0.14 ms; Facebook's 5.7 MB output:
    6.5 against 5.4 ms). The caller has checked that no gradient, argmax or ``out=`` needs the sort;
    ``routes``: the ones it serves (any other gives None, with no use of the index counted)."""
    if reduce not in ONE_OFF_REDUCES or src.dtype not in (torch.float32, torch.float64):
        return None
    if torch.compiler.is_compiling():
        return None
    backend = resolve_backend(backend, src.device)
    if backend == "triton" and not torch.are_deterministic_algorithms_enabled():
        route = "atomic"
    elif backend == "cpu" and _unsorted_kernel() is not None:
        if out_numel * src.element_size() <= SMALL_OUTPUT_BYTES:
            return "unsorted"
        route = "unsorted"
    else:
        return None
    if route not in routes:  # (a caller that serves only some routes: no use of the index counted)
        return None
    # (an index the cache cannot hold -- an inference tensor, a subclass -- gets a new [0] each call,
    # so it always takes the one-off route: it could never be served from a cached sort either)
    uses = cached("scatter-uses", (index,), (), lambda: [0])
    uses[0] += 1
    return route if uses[0] == 1 else None


def _unsorted_kernel():
    """csrc/scatter_unsorted.cpp's function (kept once loaded), or None where the C++ extension
    cannot be built."""
    global _KERNEL
    if _KERNEL is None:
        ext = optional_extension("scatter", "one-off CPU scatter unavailable, sorting the index", stacklevel=5)
        _KERNEL = None if ext is None else ext.scatter_unsorted
    return _KERNEL


_KERNEL = None


def scatter_one_off(route, x, targets, T, reduce, index, N):
    """[T, F]: the rows of x [S, F] reduced into their targets [S] on ``route``, after the check that
    the caller's ``index`` lies in [0, N) (on the device: no host sync)."""
    if index.numel():
        lo, hi = torch.aminmax(index)
        device_assert((lo >= 0) & (hi < N), "index contains values outside [0, dim_size)")
    if route == "atomic":
        from .triton import scatter_atomic  # lazy: Triton is only needed on GPU

        return scatter_atomic.scatter(x, targets, T, reduce)
    return _unsorted_kernel()(x, targets, T, reduce)


def rows_on_cpu(src, index, dim, dim_size, reduce, backend) -> torch.Tensor | None:
    """The common call, ``scatter(msg [E, F], index [E], 0, dim_size=N)`` of float rows on CPU with
    no gradient, straight to the sort-free kernel where :func:`one_off_route` takes it: the checks and
    reshapes of the general path cost about as long as the kernel on a Cora-sized graph (2 threads:
    50 of 120 us). None when the call is not that one (the general path then handles it, errors
    included)."""
    if not (type(src) is torch.Tensor and type(index) is torch.Tensor and src.dim() == 2 and index.dim() == 1):
        return None
    if dim not in (0, -2) or not isinstance(dim_size, int) or dim_size < 0 or src.requires_grad:
        return None
    if src.device.type != "cpu" or index.device.type != "cpu" or index.shape[0] != src.shape[0]:
        return None
    if index.dtype not in INDEX_DTYPES:
        return None
    reduce = ALIASES.get(reduce, reduce) if isinstance(reduce, str) else None
    route = one_off_route(src, index, reduce, backend, dim_size * src.shape[1], routes=("unsorted",))
    return None if route is None else scatter_one_off(route, src, index, dim_size, reduce, index, dim_size)
