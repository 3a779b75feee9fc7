"""``gnnfuse.nn.fuse(model)``: swap PyG layers for their fused versions, in place."""
from __future__ import annotations

import re
import sys
import warnings

import torch
from torch_geometric.nn.conv import MessagePassing

from . import _attention  # noqa: F401  (adds the attention layers to FUSED_CLASSES)
from . import _gine  # noqa: F401  (adds GINEConv to FUSED_CLASSES)
from ._layers import FUSED_CLASSES
from ._mixin import FusedMessagePassing, message_form, why_not_fused

_GENERIC: dict[type, type] = {}


def _generic_class(cls: type) -> type:
    """``cls`` with the mixin in front; one class per original class, picklable by qualified name."""
    fused = _GENERIC.get(cls)
    if fused is None:
        alias = "Fused_" + re.sub(r"\W", "_", f"{cls.__module__}.{cls.__qualname__}")
        fused = type(cls.__name__, (FusedMessagePassing, cls), {"__module__": __name__, "__qualname__": alias})
        setattr(sys.modules[__name__], alias, fused)
        _GENERIC[cls] = fused
    return fused


def _checks_per_call(cls: type | None) -> bool:
    """Fused layers that check per call (attention layers) instead of through their message form."""
    return getattr(cls, "gnnfuse_checks_per_call", False)


def fusable(module: torch.nn.Module) -> tuple[bool, str]:
    """(can :func:`fuse` convert it, why / what it becomes)."""
    if not isinstance(module, MessagePassing):
        return False, "not a MessagePassing layer"
    if isinstance(module, FusedMessagePassing) or _checks_per_call(type(module)):
        return False, "already fused"
    known = FUSED_CLASSES.get(type(module))
    reason = None if _checks_per_call(known) else why_not_fused(module)
    if reason is not None:
        return False, reason
    return True, f"gnnfuse.nn.{known.__name__}" if known else "generic mixin"


def fuse(model: torch.nn.Module, *, generic: bool = True, warn: bool = True) -> torch.nn.Module:
    """Swaps every supported PyG layer of ``model`` (itself included) to its fused version, in place.

    A layer is converted by changing its class to a subclass that only adds the fused path, so
    parameters, buffers, hooks, state_dict keys and ``repr`` stay as they are. Supported:
    GCNConv, SAGEConv, GINConv and GraphConv, plus (``generic=True``) any other MessagePassing
    layer whose message is ``x_j`` or ``x_j * edge_weight`` with a sum/mean/max/min/mul
    aggregation (it gets :class:`FusedMessagePassing` in front of its class).

    Layers left alone (e.g. GATConv, SAGEConv(aggr="lstm")) are listed, as "name: Class (reason)",
    in ``model.gnnfuse_unsupported`` and in one ``UserWarning`` (``warn=False`` silences it).
    Returns ``model``; ``model.gnnfuse_fused`` lists the converted layers' names.
    """
    fused_names: list[str] = []
    unsupported: list[str] = []
    for name, module in model.named_modules():
        if (not isinstance(module, MessagePassing) or isinstance(module, FusedMessagePassing)
                or _checks_per_call(type(module))):
            continue
        label = name or "<model>"
        known = FUSED_CLASSES.get(type(module))
        if known is None and not generic:
            unsupported.append(f"{label}: {type(module).__name__} (not a built-in fused layer; generic=False)")
            continue
        reason = None if _checks_per_call(known) else why_not_fused(module)
        if reason is not None:
            unsupported.append(f"{label}: {type(module).__name__} ({reason})")
            continue
        module.__class__ = known or _generic_class(type(module))
        # explain / decomposed_layers setters may have bound PyG's propagate on the instance
        module.__dict__.pop("propagate", None)
        if message_form(type(module)) is None and not _checks_per_call(known):  # pragma: no cover (checked above)
            raise AssertionError(type(module))
        fused_names.append(label)
    model.gnnfuse_fused = fused_names  # type: ignore[assignment]  # plain attributes on the model
    model.gnnfuse_unsupported = unsupported  # type: ignore[assignment]
    if unsupported and warn:
        warnings.warn("gnnfuse.nn.fuse: these layers keep PyG's path: " + "; ".join(unsupported), stacklevel=2)
    return model
