"""The graph in compressed sparse row form, sorted by target once and reused.

``CSR`` rows are targets (PyG ``edge_index[1]``), columns are sources (``edge_index[0]``);
``perm[p]`` is the original edge id of CSR position ``p``. The transpose (rows = sources),
needed by the backward pass, is built on first use and cached on the object.

Trust: a CSR built by gnnfuse (``from_edge_index``, ``transpose``, ``to``) is correct by
construction; one built by hand (``CSR(rowptr, col, perm, num_src)``) is checked the first time an
op uses it (``rowptr`` and ``col``) and the first time ``perm`` is read (only ops with per-edge
inputs read it). Either way a part is checked again, and the cached transpose dropped, whenever its
tensors have changed since (replaced, written in place, or written around the version counter
where the fingerprint sees it). A repeated call with an unchanged CSR costs one stamp comparison.
See gnnfuse.csr_checks for the details, :meth:`CSR.validate` for the full check on demand.

Passing a raw ``edge_index`` tensor to :func:`gnnfuse.fused_gather_scatter` builds its CSR
once and caches it on that tensor's memory (see :func:`csr_for_edge_index`).
"""
from __future__ import annotations

import torch

from . import csr_checks, range_check
from ._tensor_cache import cached, clear
from ._validate import device_assert, require_fits_index, require_node_count
from .constants import INDEX_DTYPES, INT32_MAX
from .csr_checks import check as _check
from .csr_checks import check_edge_index, check_sorted_by_target
from .fresh_graph import is_fresh, mark_fresh, unchecked_transpose
from .ops.coo_to_csr import coo_to_csr
from .range_check import PENDING as RANGE_CHECKS_PENDING


class CSR:
    """A graph in compressed sparse row form, rows = targets: ``CSR(rowptr, col, perm, num_src)``.

    Build one with :meth:`from_edge_index` or :meth:`from_scipy`, or wrap index tensors you sorted
    yourself: ``rowptr`` [num_dst + 1] (starts at 0, non-decreasing, ends at E), ``col`` [E] (the
    source of each CSR position, in ``[0, num_src)``), ``perm`` [E] (the original edge id of each
    CSR position, a permutation of ``[0, E)``), all of one index dtype (int32 or int64), and
    ``num_src`` the number of source nodes. A hand-built CSR is validated the first time an op
    uses it (``perm`` the first time it is read), and again after any change to its tensors;
    :meth:`validate` checks it all on demand.

    Example::

        csr = gnnfuse.CSR.from_edge_index(edge_index, num_nodes=x.size(0))   # sort once
        out = gnnfuse.fused_gather_scatter(x, csr, "sum")                      # reuse it every call
    """

    def __init__(self, rowptr: torch.Tensor, col: torch.Tensor, perm: torch.Tensor, num_src: int):
        self.rowptr = rowptr
        self.col = col
        self.perm = perm  # sets _perm and _perm_stamp
        self.num_src = require_node_count("num_src", num_src)
        self._derived: dict[str, object] = {}  # "transpose", "row": valid while _stamps matches
        self._stamps: tuple | None = None  # stamp of (rowptr, col) that checked() compares; set when checked or built
        self._trusted = False  # built by gnnfuse or fully checked: compiled code does not re-check it

    def __getstate__(self) -> dict:
        """Pickles the tensors and num_src only: stamps and cached derived state belong to this
        process, so an unpickled CSR is checked like a hand-built one on first use."""
        return {"rowptr": self.rowptr, "col": self.col, "perm": self._perm, "num_src": self.num_src}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["rowptr"], state["col"], state["perm"], state["num_src"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return (f"CSR(num_src={self.num_src}, num_dst={self.num_dst}, num_edges={self.num_edges}, "
                f"index_dtype={self.index_dtype}, device={self.device})")

    @classmethod
    def _built(cls, rowptr: torch.Tensor, col: torch.Tensor, perm: torch.Tensor, num_src: int) -> CSR:
        """A CSR that gnnfuse's own kernels produced: correct by construction, not validated."""
        csr = cls(rowptr, col, perm, num_src)
        csr._trusted = True
        if not torch.compiler.is_compiling():
            csr._stamps, csr._perm_stamp = csr_checks.stamp(rowptr, col), csr_checks.stamp(perm)
        return csr

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_edge_index(cls, edge_index: torch.Tensor, num_nodes: int | tuple[int, int] | None = None, *,
                        index_dtype: torch.dtype | None = None) -> CSR:
        """Sorts ``edge_index`` [2, E] (row 0 = source, row 1 = target) by target, stably.

        ``num_nodes`` is an integer (square graph) or ``(num_src, num_dst)``; when None it is
        ``max(edge_index) + 1`` (one host sync). ``index_dtype`` of the CSR: by default int32
        whenever nodes and edges fit (half the index memory traffic of int64, whatever
        edge_index's dtype), else int64. Ids are range-checked before any narrowing
        (:class:`gnnfuse.IndexOutOfRange`, quoting the id). A PyG ``EdgeIndex`` sorted by row or
        column reuses its cached CSC (and dtype) instead of sorting again, after checking it.
        """
        check_edge_index(edge_index)
        num_src, num_dst = _sizes(edge_index, num_nodes)
        if index_dtype is None:
            reused = _from_pyg_edge_index(edge_index, num_src, num_dst)
            if reused is not None:
                return reused
        index_dtype = _index_dtype(index_dtype, num_src, num_dst, edge_index.shape[1])
        if type(edge_index) is not torch.Tensor:  # plain tensor: no subclass dispatch in the op
            edge_index = edge_index.as_subclass(torch.Tensor)
        if edge_index.dtype == torch.int32 and index_dtype == torch.int64:
            edge_index = edge_index.long()  # widening is safe before the check
        rowptr, col, perm = coo_to_csr(edge_index[1], edge_index[0], num_dst, num_src, index_dtype)
        return cls._built(rowptr, col, perm, num_src)

    @classmethod
    def from_sorted_edge_index(cls, edge_index: torch.Tensor, num_nodes: int | tuple[int, int] | None = None, *,
                               index_dtype: torch.dtype | None = None, fresh: bool = True) -> CSR:
        """From an ``edge_index`` already sorted by target (row 1), as a neighbour sampler emits
        it: O(E) with no sort (rowptr by a binary search per row), and no host sync on CUDA.

        Edge ids stay in the given order (``perm`` is the identity). On CUDA, that the targets
        are non-decreasing and all ids in range is checked by device-side assertions, which report
        at the next synchronisation. On CPU the C++ counting sort (one multithreaded O(E) pass with
        the range checks) is no dearer than a check, so it runs: sorted input keeps its order, and
        unsorted input is simply sorted. ``num_nodes`` and ``index_dtype`` as in
        :meth:`from_edge_index`. ``fresh``: the graph is used once (a sampled batch), so the GPU
        path skips per-graph planning (gnnfuse.fresh_graph); pass False for a graph you reuse.
        """
        check_edge_index(edge_index)
        num_src, num_dst = _sizes(edge_index, num_nodes)
        index_dtype = _index_dtype(index_dtype, num_src, num_dst, edge_index.shape[1])
        plain = edge_index.as_subclass(torch.Tensor) if type(edge_index) is not torch.Tensor else edge_index
        if plain.is_cpu:
            csr = cls.from_edge_index(plain, (num_src, num_dst), index_dtype=index_dtype)
        else:
            src, dst = plain[0], plain[1]
            check_sorted_by_target(src, dst, num_src, num_dst)
            bounds = torch.arange(num_dst + 1, device=dst.device, dtype=dst.dtype)
            rowptr = torch.searchsorted(dst, bounds, out_int32=index_dtype == torch.int32)
            perm = torch.arange(src.shape[0], device=src.device, dtype=index_dtype)
            csr = cls._built(rowptr, src.to(index_dtype), perm, num_src)
            csr._perm_is_identity = True  # hop_prefix need not check it
        if fresh:  # a sampled batch, used once: the GPU path skips per-graph planning
            mark_fresh(csr.rowptr)
        return csr

    def hop_prefix(self, num_dst: int, num_src: int, num_edges: int) -> CSR:
        """The bipartite sub-graph of the first ``num_dst`` rows, their ``num_edges`` edges and the
        first ``num_src`` source nodes, as views (no copy). Valid for a CSR whose first
        ``num_dst`` rows hold exactly ``num_edges`` edges, all from sources below ``num_src``, and
        whose ``perm`` is the identity: a neighbour-sampled batch's CSR from
        :meth:`from_sorted_edge_index`, where a GNN layer's targets, sources and edges are
        prefixes (see :func:`gnnfuse.loader.layer_csrs`). The conditions are checked like
        :meth:`from_sorted_edge_index`'s (device-side on CUDA)."""
        return self.hop_prefixes([(num_dst, num_src, num_edges)])[0]

    def hop_prefixes(self, sizes) -> list[CSR]:
        """:meth:`hop_prefix` for each ``(num_dst, num_src, num_edges)`` of ``sizes``, checked
        together (on CUDA one device-side assertion for all of them). Each is marked fresh (used
        once: see gnnfuse.fresh_graph)."""
        for num_dst, num_src, num_edges in sizes:
            if not (0 <= num_dst <= self.num_dst and 0 <= num_edges <= self.num_edges and num_src >= 0):
                raise ValueError(f"hop_prefix(num_dst={num_dst}, num_src={num_src}, num_edges={num_edges}) does "
                                 f"not fit a CSR with {self.num_dst} rows and {self.num_edges} edges")
        self.checked()
        conds = []  # each prefix's rows end at its num_edges, its sources lie below its num_src, perm identity
        for num_dst, num_src, num_edges in sizes:
            conds.append(self.rowptr[num_dst] == num_edges)
            if num_edges:
                conds.append(self.col[:num_edges].max() < num_src)
                if not getattr(self, "_perm_is_identity", False):
                    perm = self.perm[:num_edges]
                    conds.append((perm == torch.arange(num_edges, device=perm.device, dtype=perm.dtype)).all())
        if conds:
            _check(torch.stack(conds).all(), self.rowptr.is_cpu, "hop_prefix: the first rows do not hold exactly "
                   f"the first edges from sources below num_src, for (num_dst, num_src, num_edges) in {list(sizes)} "
                   "(is this a neighbour-sampled, target-sorted batch?)")
        prefixes = []
        for num_dst, num_src, num_edges in sizes:
            rowptr = self.rowptr[: num_dst + 1]
            prefixes.append(CSR._built(rowptr, self.col[:num_edges], self.perm[:num_edges], num_src))
            mark_fresh(rowptr)  # a layer of a sampled batch: see gnnfuse.fresh_graph
            range_check.inherit(self.rowptr, rowptr)  # (a GPU build's check, if still pending)
        return prefixes

    @classmethod
    def from_scipy(cls, matrix, *, index_dtype: torch.dtype | None = None) -> CSR:
        """From a scipy sparse matrix of shape (num_dst, num_src): a stored nonzero A[i, j] is an
        edge j -> i. Explicitly stored zeros are dropped (a zero is not an edge), on a copy.

        Edge ids follow the storage order of ``matrix.tocsr()`` after that, so its ``.data`` is the
        matching ``edge_weight``. ``index_dtype`` as in :meth:`from_edge_index`.
        """
        if not (hasattr(matrix, "tocsr") and hasattr(matrix, "nnz")):
            raise TypeError(f"matrix must be a scipy.sparse matrix or array; got {type(matrix).__name__}")
        m = matrix.tocsr()
        if m is matrix:
            m = m.copy()  # eliminate_zeros works in place: never modify the caller's matrix
        m.eliminate_zeros()
        index_dtype = _index_dtype(index_dtype, m.shape[1], m.shape[0], m.nnz)
        rowptr = torch.from_numpy(m.indptr).to(index_dtype)
        col = torch.from_numpy(m.indices).to(index_dtype)
        perm = torch.arange(col.numel(), dtype=index_dtype)
        return cls(rowptr, col, perm, int(m.shape[1])).validate()

    def to_scipy(self, edge_weight: torch.Tensor | None = None):
        """scipy.sparse.csr_matrix of shape (num_dst, num_src); ``edge_weight`` in original edge order."""
        import scipy.sparse

        data = torch.ones(self.num_edges) if edge_weight is None else edge_weight.detach()[self.perm.long()]
        return scipy.sparse.csr_matrix(
            (data.cpu().numpy(), self.col.cpu().numpy(), self.rowptr.cpu().numpy()), shape=(self.num_dst, self.num_src)
        )

    # ---- properties ---------------------------------------------------------------------
    @property
    def perm(self) -> torch.Tensor:
        """The original edge id of each CSR position; checked to be a permutation of ``[0, E)``
        when first read, and again after a change (see gnnfuse.csr_checks)."""
        if not torch.compiler.is_compiling():
            s = self._perm_stamp
            if s is None or not s[0](s[1], self._perm):
                return csr_checks.checked_perm(self)
        return self._perm

    @perm.setter
    def perm(self, perm: torch.Tensor) -> None:
        self._perm = perm
        self._perm_stamp: tuple | None = None

    @property
    def num_dst(self) -> int:
        return self.rowptr.shape[0] - 1

    @property
    def num_edges(self) -> int:
        return self.col.shape[0]

    @property
    def device(self) -> torch.device:
        return self.col.device

    @property
    def index_dtype(self) -> torch.dtype:
        return self.col.dtype

    def in_degree(self) -> torch.Tensor:
        return self.rowptr[1:] - self.rowptr[:-1]

    def row(self) -> torch.Tensor:
        """Target of each CSR position (the expanded rowptr), built once."""
        return self.checked()._row()

    def _settled(self) -> CSR:
        """This CSR once the GPU build's range check of its ids was read (gnnfuse.range_check): for
        host code that reads the graph without a kernel of an op (the reference backend, row())."""
        if RANGE_CHECKS_PENDING:
            range_check.resolve(self.rowptr)
        return self

    def to_edge_index(self) -> torch.Tensor:
        """[2, E] edge_index in CSR order (original order: index with ``perm``)."""
        return torch.stack([self.col, self.row()])

    def to(self, *args, **kwargs) -> CSR:
        moved = [t.to(*args, **kwargs) for t in (self.rowptr, self.col, self.perm)]
        if any(t.is_floating_point() for t in moved):
            raise TypeError("CSR.to: index tensors cannot be cast to a floating dtype")
        if moved[1].dtype == torch.int32 and self.col.dtype == torch.int64:
            require_fits_index("CSR.to(torch.int32)", torch.int32, edges=self.num_edges,
                               nodes=max(self.num_src, self.num_dst))
        self.checked()
        if moved[0].is_cpu:  # the copy waited for the device anyway: read a GPU build's pending check now
            self._settled()
        range_check.inherit(self.rowptr, moved[0])
        return CSR._built(moved[0], moved[1], moved[2], self.num_src)

    # ---- transpose ----------------------------------------------------------------------
    def transpose_parts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(t_rowptr [num_src + 1], t_col = targets, t_pos = CSR position), built once."""
        return self.checked()._transpose_parts()

    def transpose(self) -> CSR:
        """The reversed graph as a CSR (rows = sources); its perm keeps original edge ids."""
        t_rowptr, t_col, t_pos = self.transpose_parts()
        return CSR._built(t_rowptr, t_col, self.perm[t_pos.long()], self.num_dst)

    # Derived state, for callers that have just run checked(): cached while the stamps hold.
    def _row(self) -> torch.Tensor:
        row = self._derived.get("row")
        if row is None:
            self._settled()
            row = expand_rowptr(self.rowptr, self.num_edges)
            if self._stamps is not None or torch.compiler.is_compiling():
                self._derived["row"] = row
        return row  # type: ignore[return-value]

    def _transpose_parts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        parts = self._derived.get("transpose")
        if parts is None:
            if self.col.is_cpu or not self._trusted:  # the C++ counting sort checks ids in the same pass
                parts = coo_to_csr(self.col, self._row(), self.num_src, self.num_dst)
            else:  # ids known in range (or, from a GPU build, clamped into it with the check pending):
                parts = unchecked_transpose(self.rowptr, self.col, self.num_src)  # no host read
                range_check.inherit(self.rowptr, parts[0])
            if is_fresh(self.rowptr):
                mark_fresh(parts[0])
            if self._stamps is not None or torch.compiler.is_compiling():
                self._derived["transpose"] = parts
        return parts  # type: ignore[return-value]

    # ---- checks (gnnfuse.csr_checks) ---------------------------------------------------------
    checked = csr_checks.checked
    validate = csr_checks.validate


def expand_rowptr(rowptr: torch.Tensor, num_edges: int) -> torch.Tensor:
    """The row of each CSR position: [0, 0, 1, 3, ...] from rowptr [0, 2, 3, 3, 4, ...]."""
    num_rows = rowptr.shape[0] - 1
    return torch.repeat_interleave(torch.arange(num_rows, device=rowptr.device, dtype=rowptr.dtype),
                                   rowptr[1:] - rowptr[:-1], output_size=num_edges)


def transpose_parts_of(rowptr: torch.Tensor, col: torch.Tensor, num_src: int):
    """The transpose of a CSR given by its parts (for the op's own backward, which has no CSR)."""
    return coo_to_csr(col, expand_rowptr(rowptr, col.shape[0]), num_src, rowptr.shape[0] - 1)


def _index_dtype(requested: torch.dtype | None, num_src: int, num_dst: int, num_edges: int) -> torch.dtype:
    """int32 when everything fits (unless int64 is requested), else int64."""
    if requested is None:
        return torch.int32 if max(num_src, num_dst, num_edges) <= INT32_MAX else torch.int64
    if requested not in INDEX_DTYPES:
        raise TypeError(f"index_dtype must be torch.int32 or torch.int64; got {requested}")
    require_fits_index("index_dtype", requested, edges=num_edges, nodes=max(num_src, num_dst))
    return requested


def _sizes(edge_index: torch.Tensor, num_nodes) -> tuple[int, int]:
    if num_nodes is None:
        n = int(edge_index.max()) + 1 if edge_index.numel() else 0
        num_src = num_dst = n
    elif isinstance(num_nodes, tuple):
        if len(num_nodes) != 2:
            raise ValueError(f"num_nodes must be an int or a (num_src, num_dst) pair; got {num_nodes!r}")
        num_src = require_node_count("num_nodes[0] (num_src)", num_nodes[0])
        num_dst = require_node_count("num_nodes[1] (num_dst)", num_nodes[1])
    else:
        num_src = num_dst = require_node_count("num_nodes", num_nodes)
    require_fits_index("edge_index", edge_index.dtype, edges=edge_index.shape[1], nodes=max(num_src, num_dst))
    return num_src, num_dst


def _from_pyg_edge_index(edge_index: torch.Tensor, num_src: int, num_dst: int) -> CSR | None:
    """Reuses a PyG EdgeIndex's cached CSC (sorted by target) when it has one."""
    if type(edge_index) is torch.Tensor:  # a plain tensor: no need to import PyG (seconds on first use)
        return None
    try:
        from torch_geometric import EdgeIndex
    except ImportError:
        return None
    if not isinstance(edge_index, EdgeIndex) or edge_index.sort_order is None:
        return None
    (colptr, row), perm = edge_index.get_csc()
    if edge_index.sort_order == "col" and not edge_index.is_cpu:  # a sampled batch: no sort, no host sync
        if colptr.numel() != num_dst + 1:
            return CSR.from_sorted_edge_index(edge_index.as_tensor(), (num_src, num_dst))
        return _col_sorted_csr(colptr, row, edge_index.as_tensor()[1], num_src, num_dst)
    if colptr.numel() != num_dst + 1:
        return None  # EdgeIndex's own size disagrees with the requested one: sort ourselves
    colptr, row = colptr.as_subclass(torch.Tensor), row.as_subclass(torch.Tensor)
    if perm is None:
        perm = torch.arange(row.numel(), device=row.device, dtype=row.dtype)
    # the EdgeIndex's data is not validated by PyG unless asked: check it like a hand-built CSR
    return CSR(colptr.to(row.dtype), row, perm.as_subclass(torch.Tensor).to(row.dtype), num_src).checked()


def _col_sorted_csr(colptr: torch.Tensor, row: torch.Tensor, dst: torch.Tensor, num_src: int, num_dst: int) -> CSR:
    """A col-sorted EdgeIndex's CSC as a CSR, checked by device-side assertions (no host sync)."""
    row = row.as_subclass(torch.Tensor)
    check_sorted_by_target(row, dst, num_src, num_dst)
    device_assert(colptr[-1] == row.numel(), "EdgeIndex: its CSC pointer does not end at the edge count")
    perm = torch.arange(row.numel(), device=row.device, dtype=row.dtype)
    return CSR._built(colptr.as_subclass(torch.Tensor).to(row.dtype), row, perm, num_src)


# ---- CSRs built from raw edge_index tensors, cached on the tensor's memory ------------------------
# (see gnnfuse._tensor_cache): the same unchanged `data.edge_index` sorts once, while a copy (e.g.
# `edge_index.to(device)` each step) sorts again: build a CSR yourself for those.
def csr_for_edge_index(edge_index: torch.Tensor, num_src: int, num_dst: int) -> CSR:
    if torch.compiler.is_compiling():  # the cache is Python state; inside a graph just build it
        return CSR.from_edge_index(edge_index, (num_src, num_dst))
    # a PyG EdgeIndex wraps its data (no storage of its own): key the cache on that data
    source = edge_index if type(edge_index) is torch.Tensor else getattr(edge_index, "as_tensor", lambda: edge_index)()
    return cached("csr", (source,), (num_src, num_dst), lambda: CSR.from_edge_index(edge_index, (num_src, num_dst)))


def clear_cache() -> None:
    """Forgets every cached CSR, kernel plan and atom order (all of gnnfuse's tensor-keyed caches)."""
    clear()
