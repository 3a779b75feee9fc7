"""Test-suite set-up. Without a GPU, Triton kernels run in the interpreter on CPU tensors:
TRITON_INTERPRET must be set before any kernel module is imported, hence here."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
