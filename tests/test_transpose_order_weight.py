"""The backward's edge weights in transpose order (``weight[t_pos]``), cached across calls.

A constant edge weight passed again (GCNConv's cached normalisation) is laid out in transpose order
once, from its second backward on, and the sum/mean x-gradient reads it directly instead of looking
each weight up through t_pos. Checked here: the same gradients bitwise, with and without the copy
and for any thread count; no stale copy after an in-place change of the weight; one [E] tensor of
cache per (weight, graph), dropped with the weight; the Triton backward given the same copy.
"""
from __future__ import annotations

import os

import pytest
import torch

import gnnfuse
from gnnfuse import _tensor_cache, reference
from gnnfuse.csr import CSR
from gnnfuse.graphs import planted_communities
from gnnfuse.ops import gather_scatter as gs
from gnnfuse.testing import random_graph

KIND = "transpose_order_weight"


def _entries():
    return [v for k, v in _tensor_cache._entries.items() if k[0] == KIND]


def _graphs():
    ei, _ = planted_communities(400, 4000, community_size=(20, 60), seed=2)
    return {"power-law": (random_graph(300, 300, 2500, power_law=True, seed=4), 300), "communities": (ei, 400)}


GRAPHS = _graphs()


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_kernel_with_transpose_order_weight_bitwise_equal(graph, reduce, dtype):
    """The C++ backward given weight[t_pos] returns exactly the gradients of the lookup through
    t_pos (x's alone, and x's with the weights'), at 1 and 2 threads, for widths that take every
    register tile and the masked tail; bfloat16 takes the generic kernel."""
    edge_index, n = GRAPHS[graph]
    csr = CSR.from_edge_index(edge_index, n)
    t = csr.transpose_parts()
    g = torch.Generator().manual_seed(3)
    w = torch.rand(csr.num_edges, generator=g, dtype=dtype)
    w_t = w.index_select(0, t[2])
    threads = torch.get_num_threads()
    try:
        for F in (3, 16, 40, 128, 200):
            x = torch.randn(n, F, generator=g, dtype=dtype)
            go = torch.randn(n, F, generator=g, dtype=dtype)
            arg = torch.ops.gnnfuse.gather_scatter(x, csr.rowptr, csr.col, w, *t, reduce)[1]
            for need_w in (False, True):
                results = []
                for threads_now in (1, 2):
                    torch.set_num_threads(threads_now)
                    for tw in (None, w_t):
                        results.append(torch.ops.gnnfuse.gather_scatter_backward(go, x, csr.rowptr, csr.col, w, *t,
                                                                                 arg, reduce, True, need_w, tw))
                for gx, gw in results[1:]:
                    assert torch.equal(gx, results[0][0]) and torch.equal(gw, results[0][1]), (F, need_w)
                assert results[0][1].numel() == (csr.num_edges if need_w else 0)
    finally:
        torch.set_num_threads(threads)


def test_kernel_checks_transpose_order_weight():
    csr = CSR.from_edge_index(random_graph(20, 20, 60, seed=1), 20)
    t = csr.transpose_parts()
    x, go = torch.randn(20, 4), torch.randn(20, 4)
    w = torch.rand(csr.num_edges)
    arg = csr.rowptr.new_empty(0, 0)
    with pytest.raises(RuntimeError, match="t_weight given without weight"):
        torch.ops.gnnfuse.gather_scatter_backward(go, x, csr.rowptr, csr.col, None, *t, arg, "sum", True, False, w)
    with pytest.raises(RuntimeError, match="t_weight must be a contiguous"):
        torch.ops.gnnfuse.gather_scatter_backward(go, x, csr.rowptr, csr.col, w, *t, arg, "sum", True, False,
                                                  w[:-1])
    with pytest.raises(RuntimeError, match="t_weight must be a contiguous"):
        torch.ops.gnnfuse.gather_scatter_backward(go, x, csr.rowptr, csr.col, w, *t, arg, "sum", True, False,
                                                  w.double())


def _grad(x, graph, reduce, w, backend="auto"):
    x = x.detach().requires_grad_()
    out = gnnfuse.fused_gather_scatter(x, graph, reduce, edge_weight=w, backend=backend)
    out.backward(torch.arange(out.numel(), dtype=x.dtype, device=x.device).reshape(out.shape).sin())
    return x.grad


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_cached_from_the_second_backward_same_gradients(reduce):
    """First backward: looked up through t_pos (nothing copied); from the second on: the cached
    copy, one [E] tensor. Every backward gives bitwise the same gradient, equal to the reference."""
    edge_index, n = GRAPHS["communities"]
    csr = CSR.from_edge_index(edge_index, n)
    w = torch.rand(edge_index.shape[1], generator=torch.Generator().manual_seed(1))
    x = torch.randn(n, 24, generator=torch.Generator().manual_seed(2))
    _tensor_cache.clear()
    first = _grad(x, csr, reduce, w)
    assert [e[2] for e in _entries()] == [[None, True]]  # seen once, not copied
    second = _grad(x, csr, reduce, w)
    copies = [e[2][0] for e in _entries()]
    assert len(copies) == 1 and copies[0].shape == (csr.num_edges,)  # O(E) scalars, one copy
    third = _grad(x, csr, reduce, w)
    assert len(_entries()) == 1 and _entries()[0][2][0] is copies[0]  # reused, not rebuilt
    assert torch.equal(first, second) and torch.equal(first, third)
    want = _grad(x, edge_index, reduce, w, backend="reference")
    torch.testing.assert_close(first, want)


def test_no_stale_copy_after_in_place_change():
    """An in-place change of the edge weight after the copy was made is seen by the next backward
    (the CSR-order copy is rebuilt, and the transpose-order copy is keyed on it), also through the
    op with a CSR-order weight of the caller's, changed in place between backwards."""
    edge_index, n = GRAPHS["power-law"]
    csr = CSR.from_edge_index(edge_index, n)
    w = torch.rand(edge_index.shape[1], generator=torch.Generator().manual_seed(5))
    x = torch.randn(n, 16, generator=torch.Generator().manual_seed(6))
    for _ in range(3):
        _grad(x, csr, "sum", w)
    assert _entries() and _entries()[-1][2][0] is not None
    with torch.no_grad():
        w.mul_(2.0).add_(0.25)
    got = _grad(x, csr, "sum", w)
    torch.testing.assert_close(got, _grad(x, edge_index, "sum", w, backend="reference"))
    for _ in range(2):  # once more with the rebuilt copies
        assert torch.equal(_grad(x, csr, "sum", w), got)

    # the op itself, with the caller's CSR-order weight
    t = csr.transpose_parts()
    w_csr = torch.rand(csr.num_edges, generator=torch.Generator().manual_seed(7))

    def op_grad():
        xr = x.detach().requires_grad_()
        torch.ops.gnnfuse.gather_scatter(xr, csr.rowptr, csr.col, w_csr, *t, "sum")[0].sum().backward()
        return xr.grad

    for _ in range(3):
        op_grad()
    w_csr[5:40] = -3.0  # (a plain tensor: an in-place write bumps its version)
    xr = x.detach().requires_grad_()
    want = torch.autograd.grad(reference.gather_scatter(xr, csr.col, csr._row(), csr.num_dst, "sum", w_csr).sum(),
                               xr)[0]
    torch.testing.assert_close(op_grad(), want)


def test_copy_dropped_with_the_weight_and_not_made_for_fresh_weights():
    """The copy lives as long as the weight it was made from; a weight made afresh on every call
    (GCNConv without cached=True) is never copied."""
    edge_index, n = GRAPHS["power-law"]
    csr = CSR.from_edge_index(edge_index, n)
    x = torch.randn(n, 8)
    _tensor_cache.clear()
    w = torch.rand(edge_index.shape[1])
    for _ in range(3):
        _grad(x, csr, "sum", w)
    assert len(_entries()) == 1
    del w
    assert not _entries()
    for _ in range(3):
        _grad(x, csr, "sum", torch.rand(edge_index.shape[1]))
    assert all(e[2][0] is None for e in _entries())


def test_not_used_when_the_weight_needs_a_gradient():
    edge_index, n = GRAPHS["power-law"]
    csr = CSR.from_edge_index(edge_index, n)
    x = torch.randn(n, 8, requires_grad=True)
    w = torch.rand(edge_index.shape[1], requires_grad=True)
    _tensor_cache.clear()
    for _ in range(3):
        gnnfuse.fused_gather_scatter(x, csr, "sum", edge_weight=w).sum().backward()
    assert not _entries()


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_gradcheck_float64_constant_weight(reduce):
    """gradcheck calls the backward many times with the same constant weight: the cached copy."""
    edge_index = random_graph(12, 10, 40, power_law=True, seed=8)
    csr = CSR.from_edge_index(edge_index, (12, 10))
    w = torch.rand(edge_index.shape[1], dtype=torch.float64) + 0.5
    x = torch.randn(12, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: gnnfuse.fused_gather_scatter(x, csr, reduce, edge_weight=w), (x,))
    assert _entries()


def test_opcheck_with_transpose_order_weight():
    csr = CSR.from_edge_index(random_graph(20, 20, 60, seed=2), 20)
    t = csr.transpose_parts()
    w = torch.rand(csr.num_edges)
    args = (torch.randn(20, 6), torch.randn(20, 6), csr.rowptr, csr.col, w, *t, csr.rowptr.new_empty(0, 0), "sum",
            True, False, w.index_select(0, t[2]))
    torch.library.opcheck(torch.ops.gnnfuse.gather_scatter_backward.default, args)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                    reason="needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_triton_backward_given_transpose_order_weight(reduce, monkeypatch):
    """The Triton backward takes the same copy and then skips its own gather through t_pos (one
    launch and an E-sized gather per call): the same gradient bitwise; and through the public call,
    with the cache in play, no gather of the weights from the third backward on."""
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    from gnnfuse.triton import gather_scatter as tgs

    csr = CSR.from_edge_index(random_graph(30, 20, 90, power_law=True, seed=3).to(device), (30, 20))
    t = csr.transpose_parts()
    w = torch.rand(csr.num_edges, dtype=torch.float64, device=device)
    x = torch.randn(30, 7, dtype=torch.float64, device=device)
    go = torch.randn(20, 7, dtype=torch.float64, device=device)
    arg = csr.rowptr.new_empty(0, 0)
    a = tgs.backward(go, x, csr.rowptr, csr.col, w, *t, arg, reduce, True, False)[0]
    b = tgs.backward(go, x, csr.rowptr, csr.col, w, *t, arg, reduce, True, False, t_weight=w.index_select(0, t[2]))[0]
    assert torch.equal(a, b)
    gathers = []
    real = torch.Tensor.index_select
    monkeypatch.setattr(torch.Tensor, "index_select", lambda t, dim, idx: gathers.append(t.shape) or real(t, dim, idx))
    grads = []
    for _ in range(3):
        gathers.clear()
        grads.append(_grad(x, csr, reduce, w, backend="triton"))
    assert gathers.count((csr.num_edges,)) == 0  # the forward's CSR-order copy and this copy: both cached
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])
    want = _grad(x.cpu(), csr.to("cpu"), reduce, w.cpu(), backend="reference")
    torch.testing.assert_close(grads[0].cpu(), want)
