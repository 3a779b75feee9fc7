"""The CUDA CSR build's range check, settled without a host sync of its own where it can be.

The build (gnnfuse.ops.coo_to_csr on CUDA) sorts ids clamped into range, so what it returns is a
well-formed CSR whatever the input (no later kernel reads out of bounds), and leaves whether any id
was out of range as a one-element flag on the device, *pending* on the rowptr it returned. No host
read: building a graph does not wait for the GPU. The flag is read

* with the host read the graph's first use makes anyway: the Triton work list (triton/work_lists.py),
  which every non-fresh Triton setup builds before its first launch, reads it with its own sizes;
* at the latest when an op's GPU kernel returns (ops._opdef's device guard), before its result
  does, and when host code reads the graph's rows (``CSR.row()``, the reference backend) or checks it
  (``CSR.validate()``): one read of the flag, once per graph.

An out-of-range id then raises :class:`gnnfuse.IndexOutOfRange` naming the argument and the id (the
message comes from the reference build, re-run on the kept inputs on that failure path only).
"""
from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from ._validate import IndexOutOfRange

class _Check:
    """One build's pending check: its device flag, what raises the error, and the ids of the
    tensors it is pending on (the rowptr, and those of graphs derived from it)."""

    __slots__ = ("bad", "raise_error", "keys")

    def __init__(self, bad: torch.Tensor, raise_error: Callable[[], None]):
        self.bad, self.raise_error, self.keys = bad, raise_error, []


# id(tensor) -> (weak reference to it, its check); empty as a rule (hot paths test it first)
PENDING: dict[int, tuple[weakref.ref, _Check]] = {}


def _add(t: torch.Tensor, check: _Check) -> None:
    key = id(t)
    check.keys.append(key)
    PENDING[key] = (weakref.ref(t, lambda _, key=key: PENDING.pop(key, None)), check)


def _check_of(t: torch.Tensor) -> _Check | None:
    entry = PENDING.get(id(t)) if PENDING else None
    return entry[1] if entry is not None and entry[0]() is t else None


def defer(rowptr: torch.Tensor, bad: torch.Tensor, raise_error: Callable[[], None]) -> None:
    """Marks ``rowptr``'s graph as range-checked by ``bad`` (true: some id was out of range; then
    ``raise_error()`` raises)."""
    _add(rowptr, _Check(bad, raise_error))


def inherit(source: torch.Tensor, derived: torch.Tensor) -> None:
    """A graph derived from ``source``'s (its transpose, a prefix, a copy) shares its pending check:
    reading it for either settles both."""
    check = _check_of(source)
    if check is not None:
        _add(derived, check)


def flag(rowptr: torch.Tensor) -> torch.Tensor | None:
    """The pending flag of this rowptr (to read with other numbers), or None."""
    check = _check_of(rowptr)
    return None if check is None else check.bad


def settle(rowptr: torch.Tensor, bad: bool) -> None:
    """Records the read value of the flag: raises if it was set; the check is done either way."""
    check = _check_of(rowptr)
    if check is None:
        return
    for key in check.keys:
        PENDING.pop(key, None)
    if bad:
        check.raise_error()  # raises, naming the id
        raise IndexOutOfRange("the CSR build was given a node id out of range")  # (not reached)


def resolve(*tensors: object) -> None:
    """Settles the pending check of every rowptr among ``tensors`` (one host read each)."""
    if not PENDING:  # the usual case: nothing pending
        return
    for t in tensors:
        if isinstance(t, torch.Tensor):
            bad = flag(t)
            if bad is not None:
                settle(t, bool(bad))
