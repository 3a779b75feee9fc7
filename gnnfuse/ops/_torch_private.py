"""The private torch API the op layer reads, each use fenced to the torch versions it was tested on
(outside them the public, slower equivalent runs; tests/test_op_parity.py tests both):

* the eager route's gate (ops/_opdef.py) reads dispatcher state torch exposes only in ``torch._C``;
* the device guards (ops/_opdef.py, triton/_launch.py) read the current GPU with torch's own reader,
  skipping ``torch.cuda.current_device()``'s lazy-init check (a few Python calls, about 0.3 us):
  a guard runs only once a CUDA tensor exists, when CUDA is initialised;
* the eager route's autograd node (ops/_opdef.py) is applied through the C ``apply`` that
  ``torch.autograd.Function.apply`` ends in, skipping that wrapper's Python (about 2 us a call).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

TESTED_TORCH = ((2, 11), (2, 13))  # inclusive (major, minor) range: the GPU hosts' 2.11 to CI's 2.13


def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def tested_torch() -> bool:
    return TESTED_TORCH[0] <= torch_version() <= TESTED_TORCH[1]


def private_gate() -> tuple[Callable, Callable, Callable] | None:
    """The three dispatcher-state readers of the eager route's gate, on the tested torch versions only."""
    if not tested_torch():
        return None
    C = torch._C
    try:
        return C._len_torch_dispatch_stack, C._is_torch_function_mode_enabled, C._functorch.maybe_current_level
    except AttributeError:
        return None


def current_device_reader() -> Callable[[], int]:
    """What the device guards read the current GPU with (the public call off the tested torch)."""
    reader = getattr(torch._C, "_cuda_getDevice", None) if tested_torch() else None
    return reader if reader is not None else torch.cuda.current_device


current_cuda_device = current_device_reader()  # (for a guard: a CUDA tensor is at hand)


def function_apply(function: type) -> Callable:
    """``function.apply`` without ``torch.autograd.Function.apply``'s Python wrapper, on the tested
    torch versions: the wrapper binds default arguments (only for a Function with ``setup_context``),
    asks whether a functorch transform is active and unwraps dead functorch wrappers among the
    arguments, then calls the C ``apply`` returned here (about 2 us of a forward's time on a small
    graph). Only for callers that checked the rest themselves: no functorch transform active and
    only plain tensors among the arguments (the eager route's gate), and a Function without
    ``setup_context``. Elsewhere, the public ``function.apply``."""
    if "setup_context" in vars(function):
        raise TypeError(f"{function.__name__} defines setup_context: use its public apply")
    base = getattr(torch._C, "_FunctionBase", None) if tested_torch() else None
    raw = vars(base).get("apply") if base is not None else None
    return raw.__get__(None, function) if raw is not None else function.apply
