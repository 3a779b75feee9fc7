"""``gnnfuse::coo_to_csr``: stable counting sort of edges by key (the CSR build), and the structural
checks of a CSR built elsewhere (:func:`validate_csr`, :func:`validate_perm`; with the stamp of
what they checked: :func:`check_structure_and_stamp`, :func:`check_perm_and_stamp`)."""
from __future__ import annotations

import torch

from .. import _tensor_cache, config, range_check, reference
from .._build import optional_extension
from .._validate import IndexOutOfRange
from ._opdef import OpDef, use_native_scan

# key/other: [E] ids of one index dtype, range-checked in that dtype; out_dtype: the CSR's index
# dtype (default: key's), so int64 ids are checked before they are narrowed to int32.


def _extension_or_none():
    ext = optional_extension("graph", "kernels unavailable, sorting with torch", stacklevel=4)
    if ext is None:
        return None
    # loaded anyway: the graphs it builds and checks get C++ stamps, per-call settings are read
    # through C's getenv and the ops' eager route scans its arguments in C++ (each ~0.5 us a call less)
    _tensor_cache.use_native(ext)
    config.use_getenv(ext.getenv)
    use_native_scan(ext.scan_args)
    return ext


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


def _coo_to_csr_cuda(key, other, num_rows, num_other, out_dtype=None):
    """The CSR build on the GPU, in device-side torch ops and without a host sync: torch's stable
    radix sort, row pointers by binary search of the sorted keys (bincount would read its maximum
    back to the host). The range check runs on the device, before any narrowing: the ids are sorted
    clamped into range, so the CSR is well formed whatever the input, and whether one was out of
    range stays a device flag, pending on the returned rowptr until the graph's first use reads it
    (gnnfuse.range_check: with a host read that use makes anyway where it can). Then an
    out-of-range id raises, naming the argument and the id, as on CPU. (A device-side assertion
    would report no id and leave the CUDA context unusable.)"""
    dtype = out_dtype or key.dtype
    in_key, in_other, bad = key, other, None
    if key.numel():
        if not num_rows or not num_other:  # every id is out of range: known from the sizes alone
            return reference.coo_to_csr(key, other, num_rows, num_other, out_dtype)  # raises, naming the id
        in_key = key.clamp(0, min(num_rows, torch.iinfo(key.dtype).max) - 1)  # (int32 ids, int64 sizes)
        in_other = other.clamp(0, min(num_other, torch.iinfo(other.dtype).max) - 1)
        bad = (in_key != key).any() | (in_other != other).any()
    sorted_key, perm = torch.sort(in_key, stable=True)
    rows = torch.arange(num_rows + 1, dtype=sorted_key.dtype, device=key.device)
    rowptr = torch.searchsorted(sorted_key, rows).to(dtype)
    if bad is not None:  # (the failure path re-runs the reference build, which names the id)
        range_check.defer(rowptr, bad, lambda: reference.coo_to_csr(key, other, num_rows, num_other, out_dtype))
    return rowptr, in_other[perm].to(dtype), perm.to(dtype)


COO_TO_CSR = OpDef(
    "coo_to_csr(Tensor key, Tensor other, SymInt num_rows, SymInt num_other, ScalarType? out_dtype=None) "
    "-> (Tensor, Tensor, Tensor)",
    kernels={"cpu": _coo_to_csr_cpu, "cuda": _coo_to_csr_cuda}, fake=_coo_to_csr_fake, differentiable=False)


def coo_to_csr(key: torch.Tensor, other: torch.Tensor, num_rows: int, num_other: int,
               out_dtype: torch.dtype | None = None):
    return COO_TO_CSR(key, other, num_rows, num_other, out_dtype)


def validate_csr(rowptr: torch.Tensor, col: torch.Tensor, perm: torch.Tensor | None, num_src: int) -> None:
    """Raises unless rowptr starts at 0, is non-decreasing and ends at len(col), every col lies in
    [0, num_src) and (unless ``perm`` is None) perm is a permutation of [0, len(col)) (shapes and
    dtypes checked by the caller). One pass in C++ on CPU; torch ops elsewhere (a host sync: this
    runs once per CSR object)."""
    ext = _extension_or_none() if rowptr.is_cpu else None
    if ext is None:
        reference.validate_csr(rowptr, col, perm, num_src)
        return
    try:
        ext.validate_csr(rowptr, col, num_src)
        if perm is not None:
            ext.validate_perm(perm)
    except IndexError as exc:
        raise IndexOutOfRange(str(exc)) from None


def validate_perm(perm: torch.Tensor) -> None:
    """Raises unless ``perm`` is a permutation of [0, len(perm)): IndexOutOfRange for an id outside,
    ValueError naming the first repeated one. In C++ on CPU (a bitmap pass, skipped for the
    identity); torch ops elsewhere."""
    ext = _extension_or_none() if perm.is_cpu else None
    if ext is None:
        reference.validate_perm(perm)
        return
    try:
        ext.validate_perm(perm)
    except IndexError as exc:
        raise IndexOutOfRange(str(exc)) from None


# The first-use checks of a hand-built CPU CSR in one C++ call each, with the C++ stamp of what was
# checked (see gnnfuse.csr_checks): the layout tests and stamps cost about 2 us in Python, as much as
# the checks of a Cora-sized graph. Each returns the stamp's data (bytes, or None where the tensors
# cannot be stamped) or False, having checked nothing, where it does not apply: stamps taken in
# Python (the C++ kernels not loaded yet, or gnnfuse._tensor_cache.python_stamps), a tensor not on
# the CPU or of a subclass, or a layout that Python must explain.
def check_structure_and_stamp(rowptr: torch.Tensor, col: torch.Tensor, perm: torch.Tensor, num_src: int):
    """:func:`validate_csr`'s checks of rowptr and col (perm's layout too), and their stamp."""
    ext = _extension_or_none() if _tensor_cache.stamps_in_cpp() else None
    if ext is None:
        return False
    try:
        return ext.check_structure(rowptr, col, perm, num_src)
    except IndexError as exc:
        raise IndexOutOfRange(str(exc)) from None


def check_perm_and_stamp(col: torch.Tensor, perm: torch.Tensor):
    """:func:`validate_perm`'s check of perm (its layout against col's too), and its stamp."""
    ext = _extension_or_none() if _tensor_cache.stamps_in_cpp() else None
    if ext is None:
        return False
    try:
        return ext.check_perm(col, perm)
    except IndexError as exc:
        raise IndexOutOfRange(str(exc)) from None
