"""CSR construction (stable counting sort), transpose, caching, scipy/PyG interop."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse import CSR, reference
from gnnfuse.csr import clear_cache, csr_for_edge_index
from gnnfuse.testing import INDEX_DTYPES, random_graph


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("num_edges", [0, 1, 50, 200_000])  # the last is split across threads
def test_matches_stable_sort(index_dtype, num_edges):
    edge_index = random_graph(300, 200, num_edges, seed=num_edges, power_law=True, index_dtype=index_dtype)
    csr = CSR.from_edge_index(edge_index, (300, 200), index_dtype=index_dtype)
    order = torch.sort(edge_index[1], stable=True).indices
    assert csr.rowptr.dtype == csr.col.dtype == csr.perm.dtype == index_dtype
    assert torch.equal(csr.perm.long(), order)
    assert torch.equal(csr.col, edge_index[0][order])
    assert torch.equal(csr.rowptr.diff(), torch.bincount(edge_index[1].long(), minlength=200).to(index_dtype))
    assert torch.equal(csr.row(), edge_index[1][order])
    # the torch fallback (used without a compiler) builds the identical CSR
    ref = reference.coo_to_csr(edge_index[1], edge_index[0], 200, 300)
    for a, b in zip(ref, (csr.rowptr, csr.col, csr.perm)):
        assert torch.equal(a, b)


def test_default_num_nodes_is_max_plus_one_and_indices_compact():
    csr = CSR.from_edge_index(torch.tensor([[0, 5], [2, 1]]))
    assert (csr.num_src, csr.num_dst, csr.num_edges) == (6, 6, 2)
    assert csr.index_dtype == torch.int32  # int64 input, but the graph fits: compact indices
    assert CSR.from_edge_index(torch.tensor([[0], [1]]), 2, index_dtype=torch.int64).index_dtype == torch.int64
    with pytest.raises(TypeError, match="index_dtype"):
        CSR.from_edge_index(torch.tensor([[0], [1]]), 2, index_dtype=torch.int16)


def test_transpose_is_cached_and_correct():
    edge_index = random_graph(30, 20, 100, seed=4)
    csr = CSR.from_edge_index(edge_index, (30, 20))
    t_rowptr, t_col, t_pos = csr.transpose_parts()
    assert csr.transpose_parts()[0] is t_rowptr
    # transpose rows are sources; each entry points back at a CSR position with that source
    assert torch.equal(csr.col[t_pos], torch.repeat_interleave(torch.arange(30), t_rowptr.diff()))
    assert torch.equal(csr.row()[t_pos], t_col)
    source_of = torch.repeat_interleave(torch.arange(30), t_rowptr.diff())
    same_source = source_of[1:] == source_of[:-1]
    assert torch.all(t_pos.diff()[same_source] > 0)  # stable: CSR order kept within a source
    t = csr.transpose()
    assert (t.num_dst, t.num_src) == (30, 20)
    torch.testing.assert_close(
        gnnfuse.fused_gather_scatter(torch.eye(20), t, "sum").sum(), torch.tensor(100.0)
    )


def test_scipy_round_trip():
    scipy_sparse = pytest.importorskip("scipy.sparse")
    edge_index = random_graph(7, 5, 30, seed=6)
    w = torch.rand(30, dtype=torch.float64)
    csr = CSR.from_edge_index(edge_index, (7, 5))
    mat = csr.to_scipy(w)
    dense = torch.zeros(5, 7, dtype=torch.float64).index_put_((edge_index[1], edge_index[0]), w, accumulate=True)
    assert mat.shape == (5, 7)
    torch.testing.assert_close(torch.from_numpy(mat.toarray()), dense)
    back = CSR.from_scipy(scipy_sparse.csr_matrix(mat))
    x = torch.randn(7, 3, dtype=torch.float64)
    out = gnnfuse.fused_gather_scatter(x, back, "sum", edge_weight=torch.from_numpy(mat.data))
    torch.testing.assert_close(out, dense @ x)


def test_from_scipy_rejects_broken_structure():
    scipy_sparse = pytest.importorskip("scipy.sparse")
    mat = scipy_sparse.csr_matrix((torch.ones(2).numpy(), [0, 9], [0, 1, 2]), shape=(2, 3))
    with pytest.raises(ValueError, match="CSR.col"):
        CSR.from_scipy(mat)


def test_pyg_edge_index_reuses_its_csc():
    pyg = pytest.importorskip("torch_geometric")
    edge_index = random_graph(12, 12, 60, seed=8)
    ei = pyg.EdgeIndex(edge_index, sparse_size=(12, 12)).sort_by("col")[0]
    csr = CSR.from_edge_index(ei, 12)
    (colptr, _), _ = ei.get_csc()
    assert csr.rowptr.data_ptr() == colptr.data_ptr()  # no new sort
    x = torch.randn(12, 4)
    torch.testing.assert_close(
        gnnfuse.fused_gather_scatter(x, ei, "mean"), gnnfuse.fused_gather_scatter(x, ei.as_subclass(torch.Tensor), "mean")
    )
    unsorted = pyg.EdgeIndex(edge_index, sparse_size=(12, 12))
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, unsorted, "max"),
                               gnnfuse.fused_gather_scatter(x, edge_index, "max"))


def test_raw_edge_index_is_sorted_once_and_invalidated_by_inplace_change():
    clear_cache()
    edge_index = random_graph(10, 10, 40, seed=9)
    first = csr_for_edge_index(edge_index, 10, 10)
    assert csr_for_edge_index(edge_index, 10, 10) is first
    assert csr_for_edge_index(edge_index, 10, 12) is not first  # other sizes, other entry
    edge_index[0, 0] = (edge_index[0, 0] + 1) % 10  # in-place edit bumps the version counter
    assert csr_for_edge_index(edge_index, 10, 10) is not first
    x = torch.randn(10, 2)
    torch.testing.assert_close(
        gnnfuse.fused_gather_scatter(x, edge_index), gnnfuse.fused_gather_scatter(x, edge_index.clone())
    )


def test_cache_entry_dies_with_its_tensor():
    from gnnfuse import _tensor_cache

    clear_cache()
    edge_index = random_graph(10, 10, 40, seed=10)
    csr_for_edge_index(edge_index, 10, 10)
    assert len(_tensor_cache._entries) == 1
    del edge_index
    assert len(_tensor_cache._entries) == 0


def test_cache_with_two_sources_needs_both_unchanged():
    from gnnfuse._tensor_cache import cached

    clear_cache()
    a, b = torch.zeros(3), torch.ones(3)
    first = cached("test", (a, b), (1,), lambda: object())
    assert cached("test", (a, b), (1,), lambda: object()) is first
    assert cached("test", (a, b), (2,), lambda: object()) is not first
    b.add_(1)  # an in-place change to either source invalidates
    second = cached("test", (a, b), (1,), lambda: object())
    assert second is not first
    assert cached("test", (a, b), (1,), lambda: object()) is second
    del a
    assert not any(k[0] == "test" and k[-1] == 1 for k in _entries_keys())


def _entries_keys():
    from gnnfuse import _tensor_cache

    return list(_tensor_cache._entries)


def test_csr_to_device_dtype_and_validate():
    csr = CSR.from_edge_index(random_graph(5, 5, 12, seed=11), 5)
    wide = csr.to(torch.int64)
    assert wide.col.dtype == torch.int64 and wide.validate() is wide
    with pytest.raises(TypeError, match="floating"):
        csr.to(torch.float32)
    broken = CSR(csr.rowptr.flip(0), csr.col, csr.perm, 5)
    with pytest.raises(ValueError, match="rowptr"):
        broken.validate()
