"""The ``gnnfuse`` torch.library namespace and backend selection, shared by every op."""
from __future__ import annotations

import os

import torch

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
    require_choice("backend", backend, BACKENDS)
    if backend == "auto":
        backend = require_choice("GNNFUSE_BACKEND (environment)", os.environ.get("GNNFUSE_BACKEND", "auto"), BACKENDS)
    if backend == "auto":
        return "cpu" if device.type == "cpu" else "triton"
    if backend == "cpu" and device.type != "cpu":
        raise ValueError(f"backend='cpu' needs CPU tensors; got tensors on {device}")
    if backend == "triton" and device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)")
    return backend


def forbid_double_backward(backward_op: str, public_name: str) -> None:
    """Registers an autograd rule on ``backward_op`` that raises a clear error: first-order
    gradients (also with create_graph=True) work, differentiating them again does not."""

    def raise_error(ctx, *grads):
        raise RuntimeError(
            f"gnnfuse.{public_name} does not support double backward (differentiating its gradient); "
            "use backend='reference' if you need higher-order derivatives"
        )

    torch.library.register_autograd(backward_op, raise_error, setup_context=lambda ctx, inputs, output: None)
