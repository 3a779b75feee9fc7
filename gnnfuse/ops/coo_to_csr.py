"""``gnnfuse::coo_to_csr``: stable counting sort of edges by key (the CSR build)."""
from __future__ import annotations

import warnings

import torch

from .. import reference
from .._build import BuildError, load_extension
from ._library import define

OP = define("coo_to_csr(Tensor key, Tensor other, int num_rows, int num_other) -> (Tensor, Tensor, Tensor)")


@torch.library.impl(OP, "cpu")
def _coo_to_csr_cpu(key, other, num_rows, num_other):
    try:
        ext = load_extension()
    except BuildError as exc:
        warnings.warn(f"gnnfuse: C++ kernels unavailable, sorting with torch instead ({exc})", stacklevel=3)
        return reference.coo_to_csr(key, other, num_rows, num_other)
    return tuple(ext.coo_to_csr(key, other, num_rows, num_other))


# On GPUs torch's stable radix sort is already fast; construction happens once per graph.
torch.library.impl(OP, "cuda")(reference.coo_to_csr)


@torch.library.register_fake(OP)
def _coo_to_csr_fake(key, other, num_rows, num_other):
    E = key.shape[0]
    return key.new_empty(num_rows + 1), key.new_empty(E), key.new_empty(E)


def coo_to_csr(key: torch.Tensor, other: torch.Tensor, num_rows: int, num_other: int):
    return torch.ops.gnnfuse.coo_to_csr(key, other, num_rows, num_other)
