"""The private torch API the op layer reads, each use fenced to the torch versions it was tested on
(outside them the public, slower equivalent runs; tests/test_op_parity.py tests both):

* the eager route's gate (ops/_opdef.py) reads dispatcher state torch exposes only in ``torch._C``;
* the device guards (ops/_opdef.py, triton/_launch.py) read the current GPU with torch's own reader,
  skipping ``torch.cuda.current_device()``'s lazy-init check (a few Python calls, about 0.3 us):
  a guard runs only once a CUDA tensor exists, when CUDA is initialised.
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
