"""The ``gnnfuse`` torch.library namespace and backend selection, shared by every op.

Ops are described with :class:`gnnfuse.ops._opdef.OpDef` (registration, autograd and eager route
from one description). ``define`` and ``forbid_double_backward`` remain for ops registered by hand.
"""
from __future__ import annotations

import torch

from .. import config
from .._validate import require_choice

NAMESPACE = "gnnfuse"
BACKENDS = ("auto", "cpu", "triton", "reference")
lib = torch.library.Library(NAMESPACE, "DEF")  # noqa: TOR901  (schemas are defined once, here)


def define(schema: str) -> str:
    """Defines ``gnnfuse::<schema>`` and returns its qualified name."""
    lib.define(schema)
    return f"{NAMESPACE}::{schema.split('(', 1)[0]}"


def resolve_backend(backend: str, device: torch.device) -> str:
    """Turns the user's ``backend`` into the one that runs on ``device``.

    ``auto`` means the compiled kernel of the tensors' device; the environment variable
    ``GNNFUSE_BACKEND`` replaces ``auto`` (useful to run a whole program on the reference).
    """
    if torch.compiler.is_compiling():  # no memo while tracing: Dynamo guards on its contents,
        kind = device.type  # and an eager call filling it later would recompile
    else:
        kind = _device_types.get(device) or _device_types.setdefault(device, device.type)
    if backend == "auto":
        backend = config.get("GNNFUSE_BACKEND")
        if backend == "auto":  # the common case first: one environment lookup, nothing else
            return "cpu" if kind == "cpu" else "triton"
        require_choice("GNNFUSE_BACKEND (environment)", backend, BACKENDS)
    else:
        require_choice("backend", backend, BACKENDS)
    if backend == "cpu" and kind != "cpu":
        raise ValueError(f"backend='cpu' needs CPU tensors; got tensors on {device}")
    if backend == "triton" and kind == "cpu" and not config.enabled("TRITON_INTERPRET"):
        raise ValueError("backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)")
    return backend


_device_types: dict[torch.device, str] = {}  # device.type builds a new string each time (~0.4 us)


def forbid_double_backward(backward_op: str, public_name: str) -> None:
    """Registers an autograd rule on ``backward_op`` that raises a clear error: first-order
    gradients (also with create_graph=True) work, differentiating them again does not."""

    def raise_error(ctx, *grads):
        raise RuntimeError(
            f"gnnfuse.{public_name} does not support double backward (differentiating its gradient); "
            "use backend='reference' if you need higher-order derivatives"
        )

    torch.library.register_autograd(backward_op, raise_error, setup_context=lambda ctx, inputs, output: None)
