"""gnnfuse.reorder / gnnfuse.ordering, gnnfuse.locality_stats and gnnfuse.transforms.Reorder:
valid permutations on edge cases, attributes kept aligned, the same model results after un-permuting."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse import CSR, graphs
from gnnfuse.ordering import METHODS, choose_method, inverse, relabel, unpermute
from gnnfuse.testing import random_graph

try:
    import pymetis  # noqa: F401

    HAS_METIS = True
except ImportError:
    HAS_METIS = False

METHOD_PARAMS = [m if m != "metis" else pytest.param(m, marks=pytest.mark.skipif(not HAS_METIS, reason="no pymetis"))
                 for m in METHODS]


def _is_perm(perm, n):
    return perm.dtype == torch.int64 and perm.shape == (n,) and torch.equal(perm.sort().values, torch.arange(n))


def _edge_cases():
    loops = torch.tensor([[0, 1, 2, 2, 5], [0, 1, 2, 3, 5]])  # self loops, node 4 isolated, 5 only a loop
    return {
        "empty": (torch.empty(2, 0, dtype=torch.long), 0),
        "no_edges": (torch.empty(2, 0, dtype=torch.long), 7),
        "isolated_and_loops": (loops, 8),
        "int32_power_law": (random_graph(300, 300, 2000, seed=1, power_law=True, index_dtype=torch.int32), 300),
        "duplicates": (torch.tensor([[1, 1, 1, 0], [0, 0, 0, 1]]), 3),
    }


@pytest.mark.parametrize("method", METHOD_PARAMS)
@pytest.mark.parametrize("case", list(_edge_cases()))
def test_reorder_returns_a_permutation(method, case):
    ei, n = _edge_cases()[case]
    before = ei.clone()
    perm = gnnfuse.reorder(ei, n, method)
    assert _is_perm(perm, n)
    assert torch.equal(ei, before)  # input not modified
    if case == "isolated_and_loops" and method != "metis":
        assert _is_perm(gnnfuse.reorder(ei, None, method), 6)  # num_nodes from max id + 1


def test_convention_and_helpers():
    ei = random_graph(50, 50, 300, seed=2)
    perm = gnnfuse.reorder(ei, 50, "degree")
    inv = inverse(perm)
    assert torch.equal(perm[inv], torch.arange(50)) and torch.equal(inv[perm], torch.arange(50))
    new = relabel(ei, perm)
    assert new.dtype == ei.dtype and torch.equal(perm[new], ei)  # edge k joins the same nodes
    x = torch.randn(50, 3)
    assert torch.equal(unpermute(x[perm], perm), x)
    deg = torch.bincount(ei.flatten(), minlength=50)
    assert bool((deg[perm].diff() <= 0).all())  # "degree": highest first


def test_bipartite_and_bad_arguments_are_refused():
    ei = random_graph(5, 8, 20, seed=3)
    with pytest.raises(ValueError, match="bipartite"):
        gnnfuse.reorder(ei, (5, 8))
    assert _is_perm(gnnfuse.reorder(ei, (8, 8), "rcm"), 8)  # a square pair is one node set
    with pytest.raises(ValueError, match="method"):
        gnnfuse.reorder(ei, 8, "random")
    with pytest.raises(ValueError, match="num_nodes"):
        gnnfuse.reorder(ei, 4)
    with pytest.raises((TypeError, ValueError), match="edge_index"):
        gnnfuse.reorder(ei.float(), 8)


def test_metis_without_pymetis_names_the_extra(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pymetis(name, *args, **kwargs):
        if name == "pymetis":
            raise ImportError("no pymetis")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pymetis)
    with pytest.raises(ImportError, match=r"gnnfuse\[reorder\]"):
        gnnfuse.reorder(random_graph(2000, 2000, 8000, seed=4), 2000, "metis")


def test_community_recovers_planted_communities():
    kw = dict(community_size=(100, 300), max_degree=2000, seed=0)
    truth, _ = graphs.planted_communities(20_000, 300_000, **kw)
    ei, _ = graphs.planted_communities(20_000, 300_000, order="scrambled", **kw)
    n, w = 20_000, 1024

    def stats(edge_index):
        return gnnfuse.locality_stats(CSR.from_edge_index(edge_index, n), window_edges=w)

    perm = gnnfuse.reorder(ei, n, "community", seed=1)
    assert torch.equal(perm, gnnfuse.reorder(ei, n, "community", seed=1))  # seeded
    scrambled, ordered, best = stats(ei), stats(relabel(ei, perm)), stats(truth)
    assert scrambled.distinct_fraction > 0.85 and best.distinct_fraction < 0.6
    # most of the way from the scrambled ids to the true community order
    recovered = (scrambled.distinct_fraction - ordered.distinct_fraction) / (scrambled.distinct_fraction
                                                                             - best.distinct_fraction)
    assert recovered > 0.7, (scrambled, ordered, best)
    assert ordered.log_gap < scrambled.log_gap


def test_auto_rule():
    small = random_graph(1000, 1000, 5000, seed=5)
    assert torch.equal(gnnfuse.reorder(small, 1000), torch.arange(1000))  # small: identity
    ei, n = graphs.suite_graph("community-1m", scale=0.1)  # 100K nodes in community order: already local
    assert choose_method(CSR.from_edge_index(ei, n)) == "identity"
    ei, n = graphs.suite_graph("community-1m", scale=0.1, order="scrambled")
    assert choose_method(CSR.from_edge_index(ei, n)) == "community-refined"  # on CPU and GPU alike


def test_refined_community_order_is_more_local():
    kw = dict(community_size=(300, 600), max_degree=2000, seed=2)
    ei, _ = graphs.planted_communities(30_000, 450_000, order="scrambled", **kw)
    n = 30_000

    def distinct(method):
        perm = gnnfuse.reorder(ei, n, method, seed=3)
        assert _is_perm(perm, n)
        return gnnfuse.locality_stats(CSR.from_edge_index(relabel(ei, perm), n), window_edges=4096).distinct_fraction

    refined = distinct("community-refined")
    assert refined < distinct("community")
    assert refined == distinct("community-refined")  # deterministic


def test_locality_stats():
    stats = gnnfuse.locality_stats(CSR.from_edge_index(graphs.mesh(100, 100), 10_000), window_edges=1024)
    assert stats.distinct_fraction < 0.5 and stats.log_gap < 0.4 and stats.windows > 0
    rand = gnnfuse.locality_stats(CSR.from_edge_index(random_graph(10_000, 10_000, 40_000, seed=6), 10_000),
                                  window_edges=1024)
    assert rand.distinct_fraction == pytest.approx(rand.random_fraction, abs=0.03) and rand.log_gap > 0.8
    assert "distinct rows/edge" in str(rand) and rand.reuse == pytest.approx(1 - rand.distinct_fraction)
    empty = gnnfuse.locality_stats(CSR.from_edge_index(torch.empty(2, 0, dtype=torch.long), 3))
    assert empty.windows == 0
    assert "locality: distinct rows/edge" in gnnfuse.explain(torch.randn(10_000, 4), graphs.mesh(100, 100)).notes
    bip = gnnfuse.locality_stats(CSR.from_edge_index(random_graph(30, 20, 100, seed=7), (30, 20)))
    assert bip.log_gap is None


# ---- the same results after un-permuting --------------------------------------------------------------
@pytest.mark.parametrize("reduce", gnnfuse.REDUCTIONS)
def test_fused_gather_scatter_commutes_with_reorder(reduce):
    ei = random_graph(200, 200, 1500, seed=8, power_law=True)
    x = torch.randn(200, 5, dtype=torch.float64, requires_grad=True)
    w = torch.rand(1500, dtype=torch.float64, requires_grad=True)
    perm = gnnfuse.reorder(ei, 200, "rcm")
    out = gnnfuse.fused_gather_scatter(x, ei, reduce, edge_weight=w)
    out_new = gnnfuse.fused_gather_scatter(x[perm], relabel(ei, perm), reduce, edge_weight=w)
    torch.testing.assert_close(unpermute(out_new, perm), out)
    g = torch.randn(200, 5, dtype=torch.float64)
    gx, gw = torch.autograd.grad(out, (x, w), g)
    gx2, gw2 = torch.autograd.grad(out_new, (x, w), g[perm])
    torch.testing.assert_close(gx2, gx)
    torch.testing.assert_close(gw2, gw)


def _data(n=120, e=700):
    from torch_geometric.data import Data

    ei = random_graph(n, n, e, seed=9, power_law=True)
    g = torch.Generator().manual_seed(10)
    return Data(x=torch.randn(n, 6, generator=g), edge_index=ei, edge_attr=torch.randn(e, 3, generator=g),
                edge_weight=torch.rand(e, generator=g), y=torch.randint(0, 4, (n,), generator=g),
                train_mask=torch.rand(n, generator=g) < 0.5, pos=torch.randn(n, 2, generator=g),
                batch=torch.zeros(n, dtype=torch.long), edge_label_index=torch.tensor([[0, 5], [7, 119]]),
                title="g", num_nodes=n)


def test_transform_keeps_every_attribute_aligned():
    pytest.importorskip("torch_geometric")
    from gnnfuse.transforms import Reorder

    data = _data()
    before = data.clone()
    new = Reorder("rcm")(data)
    assert torch.equal(data.x, before.x) and torch.equal(data.edge_index, before.edge_index)  # input unchanged
    perm = new.node_perm
    assert _is_perm(perm, data.num_nodes) and not torch.equal(perm, torch.arange(data.num_nodes))
    for key in ("x", "y", "train_mask", "pos", "batch"):
        assert torch.equal(new[key], data[key][perm]), key
    # edge k joins the same (original) nodes and keeps its attributes
    assert torch.equal(perm[new.edge_index], data.edge_index) and torch.equal(perm[new.edge_label_index],
                                                                                 data.edge_label_index)
    assert torch.equal(new.edge_attr, data.edge_attr) and torch.equal(new.edge_weight, data.edge_weight)
    assert new.title == "g" and new.num_nodes == data.num_nodes
    # a second reorder composes: node_perm still maps new ids to the original ones
    twice = Reorder("degree")(new)
    assert torch.equal(twice.x, data.x[twice.node_perm]) and torch.equal(twice.node_perm[twice.edge_index],
                                                                          data.edge_index)


def test_transform_sparse_features_and_refusals():
    pytest.importorskip("torch_geometric")
    from torch_geometric.data import Data

    from gnnfuse.transforms import Reorder

    data = _data()
    data.x = data.x.to_sparse_csr()
    new = Reorder("degree")(data)
    assert new.x.layout == torch.sparse_csr and torch.equal(new.x.to_dense(), data.x.to_dense()[new.node_perm])
    data.adj = torch.eye(data.num_nodes).to_sparse()
    with pytest.raises(ValueError, match="adj"):
        Reorder("degree")(data)
    with pytest.raises(ValueError, match="edge_index"):
        Reorder()(Data(x=torch.randn(3, 2)))


@pytest.mark.parametrize("conv,kw,weighted", [("GCNConv", {}, True), ("GCNConv", {"cached": True}, False),
                                              ("SAGEConv", {}, False), ("SAGEConv", {"aggr": "max"}, False),
                                              ("GINConv", {}, False), ("GraphConv", {}, True),
                                              ("GraphConv", {"aggr": "mean"}, False)])
def test_layers_give_the_same_results_after_unpermuting(conv, kw, weighted):
    pytest.importorskip("torch_geometric")
    import gnnfuse.nn as G
    from gnnfuse.transforms import Reorder

    data = _data()
    new = Reorder("community")(data)

    def make():
        torch.manual_seed(0)
        if conv == "GINConv":
            return G.GINConv(torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 5)), **kw)
        return getattr(G, conv)(6, 5, **kw)

    def run(d):
        model = make()
        x = d.x.clone().requires_grad_()
        args = (x, d.edge_index) + ((d.edge_weight,) if weighted else ())
        out = model(*args)
        grads = torch.autograd.grad(out.pow(2).sum(), [x, *model.parameters()])
        return out, grads

    out, grads = run(data)
    out_new, grads_new = run(new)
    torch.testing.assert_close(unpermute(out_new, new.node_perm), out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(unpermute(grads_new[0], new.node_perm), grads[0], atol=1e-5, rtol=1e-5)
    for a, b in zip(grads_new[1:], grads[1:]):  # parameter gradients: sums over nodes, any order
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def _vote_by_hand(csr, label, votes, labels):
    """Row r's first ``votes`` in-neighbours (CSR order), most common label, highest on ties; rows
    without in-edges keep theirs."""
    rowptr, col, out = csr.rowptr.tolist(), csr.col.cpu().long(), label.clone()
    for r in range(csr.num_dst):
        lo, hi = rowptr[r], min(rowptr[r + 1], rowptr[r] + votes)
        if lo < hi:
            counts = torch.bincount(label[col[lo:hi]], minlength=labels)
            out[r] = int((counts == counts.max()).nonzero().max())
    return out


def _vote_case(labels, device="cpu", index_dtype=None):
    """A power-law graph with rows without in-edges, and labels in [labels - 7, labels)."""
    ei = random_graph(400, 400, 3000, seed=11, power_law=True)
    csr = CSR.from_edge_index(ei.to(device), 400, index_dtype=index_dtype)
    label = torch.randint(0, 7, (400,), generator=torch.Generator().manual_seed(12)) + (labels - 7)
    assert bool((csr.in_degree() == 0).any())  # rows that keep their label
    return csr, label


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("votes", [1, 3, 16])
@pytest.mark.parametrize("labels", [7, 2**27])  # int32 scores, and int64 ones (votes * labels past int32)
def test_majority_vote_torch_cpp_and_by_hand(index_dtype, votes, labels):
    """The refinement's vote: the torch ops (CPU fallback) and the C++ pass (CPU) give the labels
    counted by hand, with ties to the highest label, only a row's first ``votes`` in-edges counted,
    rows without in-edges kept."""
    from gnnfuse.ordering import _reorder_extension, _vote_torch

    csr, label = _vote_case(labels, index_dtype=index_dtype)
    expected = _vote_by_hand(csr, label - (labels - 7), votes, 7) + (labels - 7)
    assert torch.equal(_vote_torch(csr, votes, labels)(label), expected)
    ext = _reorder_extension()
    if ext is not None:
        assert torch.equal(ext.majority_vote(csr.rowptr, csr.col, label, votes), expected)
        with pytest.raises(RuntimeError, match="max_votes"):
            ext.majority_vote(csr.rowptr, csr.col, label, 65)


def test_first_in_edges():
    """Each row's first k in-neighbours (CSR order), the padding ids in the free slots."""
    from gnnfuse.ordering import _first_in_edges

    csr = CSR.from_edge_index(random_graph(300, 300, 2500, seed=15, power_law=True), 300)
    src = _first_in_edges(csr, 5)
    rowptr = csr.rowptr.tolist()
    for r in range(300):
        own = csr.col[rowptr[r]:min(rowptr[r + 1], rowptr[r] + 5)].long()
        assert torch.equal(src[r, :own.numel()].long(), own)
        assert torch.equal(src[r, own.numel():].long(), 300 + torch.arange(own.numel(), 5))


@pytest.mark.parametrize("votes", [1, 5, 16])
def test_majority_vote_triton_matches_by_hand(votes):
    """The GPU vote kernel (under TRITON_INTERPRET=1 in CI) gives the labels counted by hand, int32
    and int64 CSRs, labels past the int32 score range too."""
    pytest.importorskip("triton")
    from gnnfuse.triton.vote import majority_vote

    device = "cuda" if torch.cuda.is_available() else "cpu"
    for index_dtype in (torch.int32, torch.int64):
        for labels in (7, 2**28):
            csr, label = _vote_case(labels, device=device, index_dtype=index_dtype)
            expected = _vote_by_hand(csr, label - (labels - 7), votes, 7) + (labels - 7)
            assert torch.equal(majority_vote(csr.rowptr, csr.col, label.to(device), votes, labels).cpu(), expected)
