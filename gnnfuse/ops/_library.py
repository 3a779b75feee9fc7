"""The ``gnnfuse`` torch.library namespace and backend selection, shared by every op.

Ops are described with :class:`gnnfuse.ops._opdef.OpDef` (registration, autograd and eager route
from one description), which defines them in ``lib``.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from .. import config
from .._validate import require_choice

NAMESPACE = "gnnfuse"
BACKENDS = ("auto", "cpu", "triton", "reference")
lib = torch.library.Library(NAMESPACE, "DEF")  # noqa: TOR901  (every schema is defined through OpDef)


def resolve_backend(backend: str, device: torch.device) -> str:
    """Turns the user's ``backend`` into the one that runs on ``device``.

    ``auto`` means the compiled kernel of the tensors' device; the environment variable
    ``GNNFUSE_BACKEND`` replaces ``auto`` (useful to run a whole program on the reference).
    """
    traced = _is_dynamo_compiling()
    if traced:  # no memo while tracing: Dynamo guards on its contents,
        kind = device.type  # and an eager call filling it later would recompile
    else:
        kind = _device_types.get(device) or _device_types.setdefault(device, device.type)
    if backend == "auto":
        backend = config.get("GNNFUSE_BACKEND", traced=traced)
        if backend == "auto":  # the common case first: one environment lookup, nothing else
            return "cpu" if kind == "cpu" else "triton"
        require_choice("GNNFUSE_BACKEND (environment)", backend, BACKENDS)
    else:
        require_choice("backend", backend, BACKENDS)
    if backend == "cpu" and kind != "cpu":
        raise ValueError(f"backend='cpu' needs CPU tensors; got tensors on {device}")
    if backend == "triton" and kind == "cpu" and not config.enabled("TRITON_INTERPRET", traced=traced):
        raise ValueError("backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)")
    return backend


_is_dynamo_compiling = torch.compiler.is_dynamo_compiling  # (bound once: the attribute walk costs 0.03 us)
_device_types: dict[torch.device, str] = {}  # device.type builds a new string each time (~0.4 us)


def triton_module(module: str) -> Callable:
    """A function returning ``gnnfuse.triton.<module>``, imported on its first call and kept (CPU
    users need no Triton; a function-level import would cost about 1 us on every call). Its
    functions are looked up on every call, so a test may patch them."""
    loaded = None

    def get():
        nonlocal loaded
        if loaded is None:
            loaded = importlib.import_module(f"gnnfuse.triton.{module}")
        return loaded

    return get


def triton_kernel(module: str, function: str) -> Callable:
    """``gnnfuse.triton.<module>.<function>``, imported on its first call: CPU users need no Triton."""
    get = triton_module(module)

    def call(*args):
        return getattr(get(), function)(*args)

    return call
