"""``gnnfuse::coo_to_csr``: stable counting sort of edges by key (the CSR build), and the structural
check of a CSR built elsewhere (:func:`validate_csr`)."""
from __future__ import annotations

import warnings

import torch

from .. import reference
from .._build import BuildError, load_extension
from .._validate import IndexOutOfRange
from ._opdef import OpDef

# key/other: [E] ids of one index dtype, range-checked in that dtype; out_dtype: the CSR's index
# dtype (default: key's), so int64 ids are checked before they are narrowed to int32.


def _extension_or_none():
    try:
        return load_extension()
    except BuildError as exc:
        warnings.warn(f"gnnfuse: C++ kernels unavailable, sorting with torch instead ({exc})", stacklevel=4)
        return None


def _coo_to_csr_cpu(key, other, num_rows, num_other, out_dtype=None):
    ext = _extension_or_none()
    if ext is None:
        return reference.coo_to_csr(key, other, num_rows, num_other, out_dtype)
    try:
        return tuple(ext.coo_to_csr(key, other, num_rows, num_other, out_dtype == torch.int32))
    except IndexError as exc:  # the kernel's range check: raise the class every gnnfuse range error has
        raise IndexOutOfRange(str(exc)) from None


def _coo_to_csr_fake(key, other, num_rows, num_other, out_dtype=None):
    E = key.shape[0]
    dtype = out_dtype or key.dtype
    return key.new_empty(num_rows + 1, dtype=dtype), key.new_empty(E, dtype=dtype), key.new_empty(E, dtype=dtype)


# On GPUs torch's stable radix sort is already fast; construction happens once per graph.
COO_TO_CSR = OpDef(
    "coo_to_csr(Tensor key, Tensor other, SymInt num_rows, SymInt num_other, ScalarType? out_dtype=None) "
    "-> (Tensor, Tensor, Tensor)",
    kernels={"cpu": _coo_to_csr_cpu, "cuda": reference.coo_to_csr}, fake=_coo_to_csr_fake, differentiable=False)


def coo_to_csr(key: torch.Tensor, other: torch.Tensor, num_rows: int, num_other: int,
               out_dtype: torch.dtype | None = None):
    return COO_TO_CSR(key, other, num_rows, num_other, out_dtype)


def validate_csr(rowptr: torch.Tensor, col: torch.Tensor, perm: torch.Tensor, num_src: int) -> None:
    """Raises unless rowptr starts at 0, is non-decreasing and ends at len(col), every col lies in
    [0, num_src) and perm is a permutation of [0, len(col)) (shapes and dtypes checked by the caller).
    One pass in C++ on CPU; torch ops elsewhere (a host sync: this runs once per CSR object)."""
    ext = _extension_or_none() if rowptr.is_cpu else None
    if ext is None:
        reference.validate_csr(rowptr, col, perm, num_src)
        return
    try:
        ext.validate_csr(rowptr, col, perm, num_src)
    except IndexError as exc:
        raise IndexOutOfRange(str(exc)) from None
