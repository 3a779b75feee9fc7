"""gnnfuse.scatter's sort-free route for the first call with an index (gnnfuse/scatter.py sorts an
index once and keeps the sort on the index tensor; a one-off index would pay for a sort it never
uses again): an atomic Triton kernel on CUDA (gnnfuse/triton/scatter_atomic.py), a deterministic
owner-computes C++ kernel on CPU (csrc/scatter_unsorted.cpp)."""
from __future__ import annotations

import torch

from ._build import optional_extension
from ._tensor_cache import cached
from .ops._library import resolve_backend

ONE_OFF_REDUCES = ("sum", "mean", "max", "min")  # what the sort-free routes serve
SMALL_OUTPUT_BYTES = 2 << 20  # CPU outputs up to this size always take the sort-free kernel (about the L2)


def one_off_route(src, index, reduce, backend, out_numel: int) -> str | None:
    """The sort-free route this call takes, if any, for sum/mean/max/min of float32/64 outside
    torch.compile: "atomic" on the Triton backend outside deterministic mode
    (gnnfuse/triton/scatter_atomic.py) and "unsorted" on the CPU one (csrc/scatter_unsorted.cpp,
    deterministic), for the first call with this index (a later call sorts it once and keeps the
    sort) -- and on CPU for every call whose output of ``out_numel`` values fits in
    SMALL_OUTPUT_BYTES, where the sort-free kernel's scattered writes stay in cache and it beat the
    cached sorted route (Cora, F=64, 2 threads: 0.07 against 0.14 ms; Facebook's 5.7 MB output:
    6.5 against 5.4 ms). The caller has checked that no gradient, argmax or ``out=`` needs the sort."""
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
    # (an index the cache cannot hold -- an inference tensor, a subclass -- gets a new [0] each call,
    # so it always takes the one-off route: it could never be served from a cached sort either)
    uses = cached("scatter-uses", (index,), (), lambda: [0])
    uses[0] += 1
    return route if uses[0] == 1 else None


def _unsorted_kernel():
    """csrc/scatter_unsorted.cpp's function, or None where the C++ extension cannot be built."""
    ext = optional_extension("scatter", "one-off CPU scatter unavailable, sorting the index", stacklevel=5)
    return None if ext is None else ext.scatter_unsorted


def scatter_one_off(route, x, targets, T, reduce):
    """[T, F]: the rows of x [S, F] reduced into their targets [S] on ``route``."""
    if route == "atomic":
        from .triton import scatter_atomic  # lazy: Triton is only needed on GPU

        return scatter_atomic.scatter(x, targets, T, reduce)
    return _unsorted_kernel()(x, targets, T, reduce)
