"""The graph in compressed sparse row form, sorted by target once and reused.

``CSR`` rows are targets (PyG ``edge_index[1]``), columns are sources (``edge_index[0]``);
``perm[p]`` is the original edge id of CSR position ``p``. The transpose (rows = sources),
needed by the backward pass, is built on first use and cached on the object.

Passing a raw ``edge_index`` tensor to :func:`gnnfuse.fused_gather_scatter` builds its CSR
once and caches it keyed on that tensor object (see :func:`csr_for_edge_index`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ._tensor_cache import cached, clear
from ._validate import INDEX_DTYPES, INT32_MAX, require_fits_index, require_index, require_node_count, require_shape, require_tensor
from .ops.coo_to_csr import coo_to_csr


@dataclass(eq=False)
class CSR:
    rowptr: torch.Tensor  # [num_dst + 1]
    col: torch.Tensor  # [E] source of each CSR position
    perm: torch.Tensor  # [E] original edge id of each CSR position
    num_src: int  # number of source nodes (columns)
    _transpose: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)
    _row: torch.Tensor | None = field(default=None, repr=False)

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_edge_index(cls, edge_index: torch.Tensor, num_nodes: int | tuple[int, int] | None = None, *,
                        index_dtype: torch.dtype | None = None) -> CSR:
        """Sorts ``edge_index`` [2, E] (row 0 = source, row 1 = target) by target, stably.

        ``num_nodes`` is an int (square graph) or ``(num_src, num_dst)``; when None it is
        ``max(edge_index) + 1`` (one host sync). ``index_dtype`` of the CSR: by default int32
        whenever nodes and edges fit (half the index memory traffic of int64, whatever
        edge_index's dtype), else int64. A PyG ``EdgeIndex`` sorted by row or column reuses its
        cached CSC (and dtype) instead of sorting again.
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
        edge_index = edge_index.to(index_dtype)
        rowptr, col, perm = coo_to_csr(edge_index[1], edge_index[0], num_dst, num_src)
        return cls(rowptr, col, perm, num_src)

    @classmethod
    def from_scipy(cls, matrix, *, index_dtype: torch.dtype | None = None) -> CSR:
        """From a scipy sparse matrix of shape (num_dst, num_src): A[i, j] != 0 is an edge j -> i.

        Edge ids follow ``matrix.tocsr()``'s storage order, so its ``.data`` is the matching
        ``edge_weight``. ``index_dtype`` as in :meth:`from_edge_index`.
        """
        m = matrix.tocsr()
        index_dtype = _index_dtype(index_dtype, m.shape[1], m.shape[0], m.nnz)
        rowptr = torch.from_numpy(m.indptr).to(index_dtype)
        col = torch.from_numpy(m.indices).to(index_dtype)
        perm = torch.arange(col.numel(), dtype=index_dtype)
        csr = cls(rowptr, col, perm, int(m.shape[1]))
        csr.validate()
        return csr

    def to_scipy(self, edge_weight: torch.Tensor | None = None):
        """scipy.sparse.csr_matrix of shape (num_dst, num_src); ``edge_weight`` in original edge order."""
        import scipy.sparse

        data = torch.ones(self.num_edges) if edge_weight is None else edge_weight.detach()[self.perm.long()]
        return scipy.sparse.csr_matrix(
            (data.cpu().numpy(), self.col.cpu().numpy(), self.rowptr.cpu().numpy()), shape=(self.num_dst, self.num_src)
        )

    # ---- properties ---------------------------------------------------------------------
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
        if self._row is None:
            self._row = torch.repeat_interleave(
                torch.arange(self.num_dst, device=self.device, dtype=self.index_dtype), self.in_degree(),
                output_size=self.num_edges,
            )
        return self._row

    def to_edge_index(self) -> torch.Tensor:
        """[2, E] edge_index in CSR order (original order: index with ``perm``)."""
        return torch.stack([self.col, self.row()])

    def to(self, *args, **kwargs) -> CSR:
        moved = [t.to(*args, **kwargs) for t in (self.rowptr, self.col, self.perm)]
        if any(t.is_floating_point() for t in moved):
            raise TypeError("CSR.to: index tensors cannot be cast to a floating dtype")
        return CSR(*moved, self.num_src)

    # ---- transpose ----------------------------------------------------------------------
    def transpose_parts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(t_rowptr [num_src + 1], t_col = targets, t_pos = CSR position), built once."""
        if self._transpose is None:
            self._transpose = coo_to_csr(self.col, self.row(), self.num_src, self.num_dst)
        return self._transpose

    def transpose(self) -> CSR:
        """The reversed graph as a CSR (rows = sources); its perm keeps original edge ids."""
        t_rowptr, t_col, t_pos = self.transpose_parts()
        return CSR(t_rowptr, t_col, self.perm[t_pos.long()], self.num_dst)

    # ---- checks -------------------------------------------------------------------------
    def validate(self) -> CSR:
        """Full structural check of a user-supplied CSR (host sync; not for hot paths)."""
        for name in ("rowptr", "col", "perm"):
            require_index(f"CSR.{name}", getattr(self, name))
        if len({self.rowptr.dtype, self.col.dtype, self.perm.dtype}) != 1:
            raise TypeError("CSR.rowptr, CSR.col and CSR.perm must share one index dtype")
        require_shape("CSR.rowptr", self.rowptr, "[num_dst + 1]", self.rowptr.dim() == 1 and self.rowptr.numel() >= 1)
        require_shape("CSR.perm", self.perm, f"[{self.num_edges}] like CSR.col", self.perm.shape == self.col.shape)
        if int(self.rowptr[0]) != 0 or int(self.rowptr[-1]) != self.num_edges or bool((self.rowptr.diff() < 0).any()):
            raise ValueError("CSR.rowptr must start at 0, be non-decreasing and end at len(col)")
        if self.num_edges and (int(self.col.min()) < 0 or int(self.col.max()) >= self.num_src):
            raise ValueError(f"CSR.col has entries outside [0, num_src={self.num_src})")
        return self


def check_edge_index(edge_index: object) -> torch.Tensor:
    edge_index = require_tensor("edge_index", edge_index)
    require_index("edge_index", edge_index)
    require_shape("edge_index", edge_index, "[2, E]", edge_index.dim() == 2 and edge_index.shape[0] == 2)
    return edge_index


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
    try:
        from torch_geometric import EdgeIndex
    except ImportError:
        return None
    if not isinstance(edge_index, EdgeIndex) or edge_index.sort_order is None:
        return None
    (colptr, row), perm = edge_index.get_csc()
    if colptr.numel() != num_dst + 1:
        return None  # EdgeIndex's own size disagrees with the requested one: sort ourselves
    colptr, row = colptr.as_subclass(torch.Tensor), row.as_subclass(torch.Tensor)
    if perm is None:
        perm = torch.arange(row.numel(), device=row.device, dtype=row.dtype)
    return CSR(colptr.to(row.dtype), row, perm.as_subclass(torch.Tensor).to(row.dtype), num_src)


# ---- CSRs built from raw edge_index tensors, cached on the tensor object ------------------------
# (see gnnfuse._tensor_cache): the same `data.edge_index` object sorts once, while a copy (e.g.
# `edge_index.to(device)` each step) sorts again: build a CSR yourself for those.
def csr_for_edge_index(edge_index: torch.Tensor, num_src: int, num_dst: int) -> CSR:
    if torch.compiler.is_compiling():  # the cache is Python state; inside a graph just build it
        return CSR.from_edge_index(edge_index, (num_src, num_dst))
    return cached("csr", (edge_index,), (num_src, num_dst),
                  lambda: CSR.from_edge_index(edge_index, (num_src, num_dst)))


def clear_cache() -> None:
    """Forgets every cached CSR, kernel plan and atom order (all of gnnfuse's tensor-keyed caches)."""
    clear()
