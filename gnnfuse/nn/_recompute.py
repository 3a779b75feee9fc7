"""Recompute a layer's projection in the backward instead of keeping it alive from the forward.

A fused attention op saves its projected input (e.g. GATConv's ``h = lin(x)``, [N, H * C]) for
its backward. The layer's input ``x`` is kept anyway (the projection's weight gradient needs it),
and ``lin(x)`` is one small matrix product, so keeping ``h`` too costs a whole [N, H * C] tensor
through the rest of the forward and the start of the backward -- where a training step's peak
memory usually is (the loss and the next layers' backward) -- for no speed. Inside
``recompute(...)``, a tensor saved for the backward that *is* the projection (same memory, shape
and strides) is stored as a recipe instead, and made again (without gradient tracking) when the
backward unpacks it. Uses only public autograd API (``torch.autograd.graph.saved_tensors_hooks``).

Only a projection of at least ``MIN_BYTES`` is recomputed: a smaller one is kept. Recomputing
costs a launch and, on a GPU host, tens of microseconds of Python a training step (saved-tensor
hooks on every tensor the op saves, the recipe's checks), which on a small graph -- whose step is
bound by the host, not the device -- is a larger share of the step than the few MB it frees
(benchmarks/results/attention-profile_*).

If the projection's inputs or weights are modified in place between the forward and the backward,
the recomputed tensor would differ from the one the forward used: the unpack raises instead, as
autograd does for a modified saved tensor. That check reads the tensors' version counters
(``Tensor._version``, the counter autograd's own check uses); where a torch build lacks it, nothing
is recomputed (the projection is kept, as without this module). Under ``torch.compile`` tracing
nothing is recomputed either (the hooks are not entered): the compiler decides what to keep.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch import Tensor


MIN_BYTES = 16 << 20  # projections below this size are kept, not recomputed (see the module doc)


def _versions(tensors: tuple[Tensor, ...]) -> tuple[int, ...] | None:
    """The tensors' in-place modification counters, None where this torch has none to read."""
    versions = tuple(getattr(t, "_version", None) for t in tensors)
    return None if None in versions else versions


class _Recipe:
    """How to make one saved projection again, and the versions of what it was made from."""

    def __init__(self, make: Callable[[], Tensor], sources: tuple[Tensor, ...], versions: tuple[int, ...]):
        self.make, self.sources, self.versions = make, sources, versions

    def __call__(self) -> Tensor:
        if _versions(self.sources) != self.versions:
            raise RuntimeError("gnnfuse.nn: an input or weight of an attention layer's projection was modified by an "
                               "inplace operation between the forward and the backward; the projection, recomputed "
                               "in the backward, would differ from the forward's")
        with torch.no_grad():
            return self.make()


def _identity(t: Tensor) -> tuple:
    """What tells a tensor's memory and view apart, without holding a reference to it (the hooks
    live as long as the saved tensors: a reference would keep the projection alive)."""
    return t.data_ptr(), t.shape, t.stride(), t.dtype, t.device


def recompute(projection: Tensor, make: Callable[[], Tensor], sources: tuple[Tensor, ...]):
    """Context manager: within it, a tensor saved for the backward that is ``projection`` (of at
    least MIN_BYTES) is kept as ``make`` (called under no_grad in the backward; must return the same
    values) instead. ``sources``: the tensors ``make`` reads (input, weight, bias), whose in-place
    modification makes the backward raise."""
    if torch.compiler.is_compiling() or projection.numel() * projection.element_size() < MIN_BYTES:
        return contextlib.nullcontext()  # (compiling first: a size test would guard on the shape)
    versions = _versions(sources)
    if versions is None:
        return contextlib.nullcontext()
    recipe, target = _Recipe(make, sources, versions), _identity(projection)

    def pack(t: Tensor):  # called while the forward runs, when the projection is alive
        return recipe if _identity(t) == target else t

    def unpack(packed):
        return packed() if isinstance(packed, _Recipe) else packed

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)
