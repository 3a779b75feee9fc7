"""Argument checks shared by every op. They look only at shapes, dtypes and devices (never at
index values, which would need a host sync and break torch.compile); value checks live in
the kernels. Messages are built only when a check fails: formatting a size inside a traced
function would specialise the compiled graph on it."""
from __future__ import annotations

import operator
from collections.abc import Sequence

import torch

from .constants import INDEX_DTYPES, INT32_MAX, VALUE_DTYPES  # noqa: F401  (still importable from here)


class IndexOutOfRange(IndexError, ValueError):
    """An index (node id, edge id, atom id) outside its valid range. It is both an ``IndexError``
    (what PyG and torch raise for a bad index) and a ``ValueError`` (what gnnfuse raises for bad
    argument values), so either ``except`` catches it."""


def _describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


def require_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def require_floating(name: str, t: torch.Tensor, allowed: Sequence[torch.dtype] = VALUE_DTYPES) -> None:
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{name} must have a floating dtype ({names}); got {_describe(t)}")


def require_index(name: str, t: torch.Tensor) -> None:
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be an int32 or int64 tensor; got {_describe(t)}")


def require_shape(name: str, t: torch.Tensor, expected: str, ok: bool) -> None:
    if not ok:
        raise ValueError(f"{name} must have shape {expected}; got {_describe(t)}")


def require_same_device(**tensors: torch.Tensor | None) -> torch.device:
    present = {k: v for k, v in tensors.items() if v is not None}
    devices = {v.device for v in present.values()}
    if len(devices) > 1:
        listing = ", ".join(f"{k} on {v.device}" for k, v in present.items())
        raise ValueError(f"all tensors must be on one device; got {listing}")
    return next(iter(devices))


def require_choice(name: str, value: object, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value  # type: ignore[return-value]


def require_fits_index(name: str, dtype: torch.dtype, **counts: int) -> None:
    """int32 indices can address at most 2**31 - 1 nodes and edges."""
    if dtype != torch.int32:
        return
    for what, n in counts.items():
        if n > INT32_MAX:
            raise ValueError(f"{name} is int32 but the graph has {n} {what} (> 2**31 - 1); use int64 indices")


def require_node_count(name: str, value: object) -> int:
    """A non-negative integer: any integral type (Python int, numpy integer, a 0-dim integer tensor
    via ``__index__``) or a SymInt under torch.compile; bool is rejected."""
    if type(value) is int and value >= 0:  # the common case, first
        return value
    if isinstance(value, torch.SymInt):
        return value  # type: ignore[return-value]
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a non-negative int; got {value!r}")
    try:
        count = operator.index(value)  # type: ignore[arg-type]  # TypeError handled below
    except TypeError:
        raise TypeError(f"{name} must be a non-negative int; got {type(value).__name__} {value!r}") from None
    if count < 0:
        raise ValueError(f"{name} must be a non-negative int; got {value!r}")
    return count


# torch._assert_async checks a tensor condition on the device, without a host sync, and torch.compile
# traces it. It is private, so it is used only on the torch versions it is known to work on here
# (2.6 up to the 2.x line); elsewhere the check syncs and raises a ValueError (same condition, same
# message), which also works under torch.compile, with a graph break instead of fullgraph.
_TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
_ASSERT_ASYNC = getattr(torch, "_assert_async", None) if (2, 6) <= _TORCH_VERSION < (3, 0) else None


def device_assert(condition: torch.Tensor, message: str) -> None:
    """Raises (on the device when it can, so without a host sync) unless ``condition`` (a one-element
    bool tensor) is true."""
    if _ASSERT_ASYNC is not None:
        _ASSERT_ASYNC(condition, message)
    elif not bool(condition):
        raise ValueError(message)
