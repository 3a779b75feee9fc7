"""When and how a fused layer hands a call to PyG's own ``propagate``.

PyG features that live inside its message path (explain masks, ``decomposed_layers``, the
propagate/message/aggregate hooks, forward hooks on ``aggr_module``, methods replaced on the
instance) and graph capture by ``torch.jit.trace`` / ONNX export run PyG's code, exactly as a stock
layer would. Each distinct (layer, reason) is announced once with a ``UserWarning``.
"""
from __future__ import annotations

import copy
import warnings
from typing import Any, Callable

import torch
from torch_geometric.nn.conv import MessagePassing

_HOOK_DICTS = (
    "_propagate_forward_pre_hooks", "_propagate_forward_hooks", "_message_forward_pre_hooks",
    "_message_forward_hooks", "_aggregate_forward_pre_hooks", "_aggregate_forward_hooks",
    "_message_and_aggregate_forward_pre_hooks", "_message_and_aggregate_forward_hooks",
)
# methods PyG's propagate calls; replacing one on the instance changes what the layer computes
_STEPS = ("message", "aggregate", "message_and_aggregate", "update", "explain_message")
_warned: set[tuple[str, str]] = set()
_TRACE = ("torch.jit.trace records PyG's ops (the trace then runs on any graph; for the fused kernels in a "
          "captured graph use torch.compile or torch.export(strict=True))")
_ONNX = "ONNX export records PyG's ops (standard ONNX operators)"


def warn_pyg_path(layer: str, reason: str) -> None:
    """One ``UserWarning`` per (layer class, reason) and process."""
    if (layer, reason) in _warned or torch.compiler.is_compiling():
        return
    _warned.add((layer, reason))
    warnings.warn(f"gnnfuse.nn.{layer}: {reason}; running PyG's propagate (not fused)", stacklevel=3)


def _in_onnx_export() -> bool:
    check = getattr(torch.onnx, "is_in_onnx_export", None)
    return bool(check()) if check is not None else False


def instance_reason(module: MessagePassing) -> str | None:
    """Why this call must run PyG's propagate because of the module's state (None: it need not).
    Runs on every call: plain dict reads first (a few hundred ns), the descriptive work only on a hit."""
    state = module.__dict__
    aggr = state["_modules"].get("aggr_module")
    if (state.get("_explain") or state.get("_decomposed_layers", 1) != 1 or any(state.get(name) for name in _HOOK_DICTS)
            or (aggr is not None and (aggr._forward_hooks or aggr._forward_pre_hooks))
            or any(name in state for name in _STEPS)):
        return _describe_state(module)
    # ONNX export runs under torch.jit tracing (TorchScript exporter) or torch.export (the default
    # exporter), so the eager path never pays for the ONNX check (about 2 us)
    if torch.jit.is_tracing():
        return _ONNX if _in_onnx_export() else _TRACE
    if torch.compiler.is_compiling() and _in_onnx_export():
        return _ONNX
    return None


def _describe_state(module: MessagePassing) -> str:
    if module.explain:
        return "explain mode (the edge mask is applied to PyG's messages)"
    if module.decomposed_layers != 1:
        return f"decomposed_layers={module.decomposed_layers}"
    if any(len(getattr(module, name)) for name in _HOOK_DICTS):
        return "propagate/message/aggregate hooks are registered"
    replaced = [name for name in _STEPS if name in module.__dict__]
    if replaced:
        return f"{', '.join(replaced)} replaced on the instance"
    return "forward hooks on aggr_module"


def _own_class(klass: type) -> bool:
    return klass.__module__.startswith("gnnfuse.")


def _is_template(klass: type, fn: object) -> bool:
    """True for the propagate PyG generated from its jinja template for ``klass``."""
    return klass.__dict__.get("_jinja_propagate") is fn and klass.__dict__.get("_orig_propagate") is not fn


def pyg_propagate(module: MessagePassing, skip: object) -> Callable[..., Any]:
    """The propagate a stock layer of this class would run, ``skip`` (the mixin's) left out.

    PyG's generated template for a parent class serves only when nothing but gnnfuse's classes sit
    above that parent, none of them changes message/aggregate/update, and neither explain mode nor
    decomposition is on (the template supports neither); otherwise the first propagate of the MRO
    that is not a template: the class's own, or ``MessagePassing.propagate``.
    """
    cls = type(module)
    plain = not module.explain and module.decomposed_layers == 1
    own_so_far = True
    for klass in cls.__mro__:
        fn = klass.__dict__.get("propagate")
        if fn is not None and fn is not skip:
            if not _is_template(klass, fn):
                return fn
            if plain and own_so_far and _same_steps(module, klass):
                return fn
        own_so_far = own_so_far and _own_class(klass)
    return MessagePassing.propagate  # pragma: no cover (MessagePassing is in every MRO)


def _same_steps(module: MessagePassing, klass: type) -> bool:
    cls = type(module)
    return all(getattr(cls, name) is getattr(klass, name) and name not in module.__dict__ for name in _STEPS)


def stock_class(cls: type) -> type | None:
    """The PyG class a fused class adds nothing to but gnnfuse's fused path, or None (a user class)."""
    for klass in cls.__mro__:
        if not _own_class(klass):
            user_fused = any(_own_class(base) for base in klass.__mro__)  # a user's class with the mixin
            return None if klass is MessagePassing or user_fused else klass
    return None  # pragma: no cover


def scriptable_stock_copy(module: MessagePassing) -> MessagePassing:
    """For ``torch.jit.script``: a shallow copy as the stock PyG layer (same parameters, shared).

    The fused path (Python-level dispatch, a CSR cache, Triton) has no TorchScript form; the stock
    layer computes the same function, so scripting a fused layer scripts PyG's layer.
    """
    stock = stock_class(type(module))
    if stock is None:
        raise RuntimeError(
            f"torch.jit.script: {type(module).__name__} is a gnnfuse fused layer without a stock PyG class "
            "to script instead; use torch.jit.trace (records PyG's ops), torch.compile or "
            "torch.export(strict=True)")
    clone = copy.copy(module)
    clone.__class__ = stock
    clone.__dict__.pop("propagate", None)
    clone.__dict__.pop("_gnnfuse_cached", None)
    MessagePassing._set_jittable_templates(clone)  # the stock class may never have been instantiated
    return clone
