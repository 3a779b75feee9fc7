"""The checks of a :class:`gnnfuse.CSR` at the op boundary, and what lets a repeated call skip them.

A CSR's values are checked in two independent parts, each once and again only after a change:

* the *structure*, ``rowptr`` and ``col``, which every op reads: :func:`checked` (``CSR.checked``,
  which ops call first) checks it the first time an op uses the CSR, and afterwards compares one
  stamp of the two tensors (see gnnfuse._tensor_cache: same objects, pointers, shapes, versions and,
  on CPU, fingerprints; about 0.3 us with the C++ stamps). A change also drops the cached
  transpose and expanded rows, which derive from the structure alone.
* ``perm``, which only ops with per-edge inputs read (edge weights, edge softmax, attention and
  edge-feature terms, the transpose's edge ids): ``CSR.perm`` is a property that checks it to be
  a permutation of ``[0, E)`` when it is first read (:func:`checked_perm`), and afterwards compares
  its stamp. An op that never reads it (the unweighted aggregation) never pays for the
  permutation pass, the dearest part of the check.

The types, dtypes, shapes and devices of all three tensors (no values) are checked with either part.
A CSR that gnnfuse builds (``from_edge_index``, ``transpose``, ``to``) is correct by construction:
it is stamped, not checked. :func:`validate` (``CSR.validate``) checks everything on demand.

Under torch.compile no stamp is compared (Python state): a CSR not fully checked eagerly is checked
by device-side assertions inside the graph.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from . import reference
from ._tensor_cache import SAME_OBJECT, cpp_stamp, take
from ._validate import (
    device_assert,
    require_fits_index,
    require_index,
    require_shape,
    require_tensor,
)
from .constants import INDEX_DTYPES, INT32_MAX
from .ops.coo_to_csr import check_perm_and_stamp, check_structure_and_stamp, validate_csr, validate_perm

if TYPE_CHECKING:
    from .csr import CSR

_FIELDS = ("rowptr", "col", "perm")


def checked(csr: CSR) -> CSR:
    """This CSR, its structure checked if it is new to gnnfuse or changed since it was last checked
    (see gnnfuse.csr_checks; ``perm`` is checked when first read); a change also drops the cached
    transpose. Ops call this first."""
    if torch.compiler.is_compiling():
        if not csr._trusted:  # not fully checked eagerly: device-side assertions in the graph
            check_layout(csr)
            reference.assert_valid_csr(csr.rowptr, csr.col, csr.perm, csr.num_src)
        return csr
    s = csr._stamps
    if s is not None and s[0](s[1], csr.rowptr, csr.col):
        return csr
    return check_structure(csr)


def validate(csr: CSR) -> CSR:
    """Full check, on demand (one pass in C++ on CPU; torch ops and a host sync on CUDA): rowptr
    starts at 0, is non-decreasing and ends at len(col); col in ``[0, num_src)``
    (:class:`gnnfuse.IndexOutOfRange` otherwise, quoting the id); perm a permutation of
    ``[0, E)``. Returns the CSR, so ``CSR(...).validate()`` chains."""
    csr._settled()  # a GPU-built CSR's range check, if still pending (gnnfuse.range_check)
    check_structure(csr)
    _check_perm(csr, layout_checked=True)
    csr._trusted = True
    return csr


def check_structure(csr: CSR) -> CSR:
    """Checks the layout and the values of rowptr and col, drops derived state and stamps them."""
    csr._stamps = None
    csr._trusted = False
    csr._derived.clear()
    r, c = csr.rowptr, csr.col
    data = check_structure_and_stamp(r, c, csr._perm, csr.num_src)  # on CPU: all in one C++ call
    if data is False:  # not checked there
        check_layout(csr)
        validate_csr(r, c, None, csr.num_src)
        csr._stamps = stamp(r, c)
    else:
        csr._stamps = _held(cpp_stamp(data), (r, c))
    csr._trusted = csr._perm_stamp is not None  # both parts checked: compiled code need not re-check
    return csr


def checked_perm(csr: CSR) -> torch.Tensor:
    """``csr.perm`` after checking it (``CSR.perm`` calls this when its stamp does not match)."""
    if torch.compiler.is_compiling():
        return csr._perm
    return _check_perm(csr, layout_checked=False)


def _check_perm(csr: CSR, layout_checked: bool) -> torch.Tensor:
    csr._perm_stamp = None
    csr._trusted = False
    p, c = csr._perm, csr.col
    data = check_perm_and_stamp(c, p)  # on CPU: all in one C++ call
    if data is not False:
        csr._perm_stamp = _held(cpp_stamp(data), (p,))
        csr._trusted = csr._stamps is not None
        return p
    if not layout_checked:  # perm may have been replaced: its dtype, shape and device must match col's
        try:
            fine = p.dtype is c.dtype and c.dtype in INDEX_DTYPES and p.shape == c.shape and p.device == c.device
        except AttributeError:
            fine = False
        if not fine:
            check_layout(csr)  # raises, naming what is wrong
    validate_perm(p)
    csr._perm_stamp = stamp(csr._perm)
    csr._trusted = csr._stamps is not None
    return csr._perm


def stamp(*tensors: torch.Tensor) -> tuple | None:
    """A stamp of a CSR's tensors (see gnnfuse._tensor_cache) with what keeps it meaningful: the
    tensors and their storages, held strongly, so that no other tensor or storage can take their
    addresses while the stamp lives. None where nothing can be stamped (inference tensors): the
    part is then checked again on every use."""
    return _held(take(SAME_OBJECT, tensors), tensors)


def _held(s: tuple | None, tensors: tuple[torch.Tensor, ...]) -> tuple | None:
    return None if s is None else (*s, tensors, tuple([t.untyped_storage() for t in tensors]))


def check_layout(csr: CSR) -> None:
    """Types, dtypes, shapes and devices of the three tensors (no values)."""
    r, c, p = csr.rowptr, csr.col, csr._perm
    try:
        fine = (r.dtype is c.dtype is p.dtype and c.dtype in INDEX_DTYPES and r.dim() == 1 and c.dim() == 1
                and p.shape == c.shape and r.shape[0] >= 1 and r.device == c.device == p.device)
    except (AttributeError, TypeError):
        fine = False
    if not fine:
        _explain_layout(csr)
    if c.dtype is torch.int32 and max(c.shape[0], csr.num_src, r.shape[0] - 1) > INT32_MAX:
        require_fits_index("CSR", c.dtype, edges=c.shape[0], nodes=max(csr.num_src, r.shape[0] - 1))  # raises


def _explain_layout(csr: CSR) -> None:
    """Raises the error that names what is wrong with the tensors' layout."""
    for name in _FIELDS:
        t = require_tensor(f"CSR.{name}", getattr(csr, "_perm" if name == "perm" else name))
        require_index(f"CSR.{name}", t)
    rowptr, col, perm = csr.rowptr, csr.col, csr._perm
    if not (rowptr.dtype == col.dtype == perm.dtype):
        raise TypeError("CSR.rowptr, CSR.col and CSR.perm must share one index dtype; got "
                        f"{rowptr.dtype}, {col.dtype}, {perm.dtype}")
    if not (rowptr.device == col.device == perm.device):
        raise ValueError("CSR.rowptr, CSR.col and CSR.perm must be on one device; got "
                         f"{rowptr.device}, {col.device}, {perm.device}")
    if rowptr.dim() != 1 or rowptr.shape[0] < 1:
        require_shape("CSR.rowptr", rowptr, "[num_dst + 1]", False)
    if col.dim() != 1:
        require_shape("CSR.col", col, "[E]", False)
    require_shape("CSR.perm", perm, f"[{col.shape[0]}] like CSR.col", perm.shape == col.shape)


# ---- checks of edge_index input --------------------------------------------------------------------
def check_edge_index(edge_index: object) -> torch.Tensor:
    edge_index = require_tensor("edge_index", edge_index)
    require_index("edge_index", edge_index)
    require_shape("edge_index", edge_index, "[2, E]", edge_index.dim() == 2 and edge_index.shape[0] == 2)
    return edge_index


def check_sorted_by_target(src: torch.Tensor, dst: torch.Tensor, num_src: int, num_dst: int) -> None:
    """Targets non-decreasing and all ids in range, as device-side assertions (no host sync)."""
    if not dst.numel():
        return
    device_assert(~(dst[1:] < dst[:-1]).any(), "edge_index is not sorted by target")
    device_assert((dst[0] >= 0) & (dst[-1] < num_dst), "edge_index[1] (targets) has a node id outside [0, num_dst)")
    device_assert(((src >= 0) & (src < num_src)).all(), "edge_index[0] (sources) has a node id outside [0, num_src)")


def check(ok: torch.Tensor, on_cpu: bool, message: str) -> None:
    """Raises ValueError(message) unless ``ok`` (a one-element bool tensor): at once on CPU, as a
    device-side assertion elsewhere."""
    if on_cpu:
        if not bool(ok):
            raise ValueError(message)
    else:
        device_assert(ok, message)
