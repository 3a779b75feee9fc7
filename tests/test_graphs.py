"""gnnfuse.graphs: the seeded generators of tests and benchmarks keep their documented properties."""
from __future__ import annotations

import pytest
import torch

from gnnfuse import graphs


def test_planted_communities_is_seeded_and_has_the_documented_properties():
    n, e = 20_000, 200_000
    ei, community = graphs.planted_communities(n, e, community_size=(200, 600), intra_fraction=0.8, max_degree=500,
                                               seed=3)
    again, community_again = graphs.planted_communities(n, e, community_size=(200, 600), intra_fraction=0.8,
                                                        max_degree=500, seed=3)
    assert torch.equal(ei, again) and torch.equal(community, community_again)
    assert not torch.equal(ei, graphs.planted_communities(n, e, community_size=(200, 600), max_degree=500, seed=4)[0])
    assert ei.shape == (2, e) and ei.dtype == torch.int64 and int(ei.min()) >= 0 and int(ei.max()) < n
    deg = torch.bincount(ei[1], minlength=n)
    assert int(deg.max()) <= 500 and int(deg.max()) >= 250  # capped, and a heavy tail reaches the cap region
    assert float(deg.float().std()) > 2 * float(deg.float().mean()) ** 0.5  # far wider than a Poisson law
    sizes = torch.bincount(community)
    assert int(sizes[:-1].min()) >= 200 and int(sizes.max()) <= 600  # the last one takes the remainder
    assert bool((community.diff() >= 0).all())  # "generated": communities are contiguous id ranges
    intra = (community[ei[0]] == community[ei[1]]).float().mean().item()
    assert 0.78 < intra < 0.82  # 0.8 inside + the few outside edges that land in their own community


def test_planted_communities_scrambled_is_a_relabelling():
    kw = dict(community_size=(50, 150), max_degree=100, seed=1)
    ei, community = graphs.planted_communities(3000, 30_000, **kw)
    ei_s, community_s = graphs.planted_communities(3000, 30_000, order="scrambled", **kw)
    assert not bool((community_s.diff() >= 0).all())
    assert torch.equal(torch.bincount(ei[1], minlength=3000).sort().values,
                       torch.bincount(ei_s[1], minlength=3000).sort().values)
    assert (community[ei[0]] == community[ei[1]]).sum() == (community_s[ei_s[0]] == community_s[ei_s[1]]).sum()
    # locality: consecutive ids are neighbours in the generated order only
    gap = (ei[0] - ei[1]).abs().float().mean()
    assert gap < 0.5 * (ei_s[0] - ei_s[1]).abs().float().mean()


def test_pareto_degrees_sum_and_cap():
    g = torch.Generator().manual_seed(0)
    deg = graphs.pareto_degrees(1000, 12_345, max_degree=40, generator=g, device=torch.device("cpu"))
    assert int(deg.sum()) == 12_345 and int(deg.max()) <= 40 and int(deg.min()) >= 0
    with pytest.raises(ValueError, match="max_degree"):
        graphs.pareto_degrees(10, 1000, max_degree=5, generator=g, device=torch.device("cpu"))
    assert graphs.pareto_degrees(0, 0, generator=g, device=torch.device("cpu")).numel() == 0


def test_rmat_and_mesh():
    ei = graphs.rmat(10, 5000, seed=2)
    assert torch.equal(ei, graphs.rmat(10, 5000, seed=2)) and ei.shape == (2, 5000) and int(ei.max()) < 1024
    deg = torch.bincount(ei[1], minlength=1024)
    assert int(deg.max()) > 10 * 5000 / 1024  # skewed
    m = graphs.mesh(5, 7)
    assert m.shape == (2, 2 * (2 * 35 - 5 - 7))
    deg = torch.bincount(m[1], minlength=35)
    assert int(deg.max()) == 4 and int(deg.min()) == 2
    pairs = set(map(tuple, m.t().tolist()))
    assert all((b, a) in pairs for a, b in pairs)  # both directions
    scrambled = graphs.mesh(5, 7, order="scrambled", seed=1)
    assert torch.equal(torch.bincount(scrambled[1], minlength=35).sort().values, deg.sort().values)


# The stress graphs keep the definitions of the earlier benchmark results: fingerprints at scale 0.001.
STRESS_FINGERPRINTS = {
    "rfc-uniform": (10, 200, 34088),
    "arxiv-like": (169, 1166, 3579766),
    "products-like": (2449, 61859, 2902761355),
    "reddit-like": (233, 114616, 518614385),
    "hub-stress": (1000, 2000, 37431011),
}


@pytest.mark.parametrize("name", graphs.STRESS)
def test_stress_graphs_keep_their_definition(name):
    ei, n = graphs.suite_graph(name, scale=0.001)
    assert (n, ei.shape[1], int((ei[0] * 31 + ei[1] * 7).sum())) == STRESS_FINGERPRINTS[name]


@pytest.mark.parametrize("name", graphs.REALISTIC)
@pytest.mark.parametrize("order", graphs.ORDERS)
def test_every_suite_graph_builds_small(name, order):
    ei, n = graphs.suite_graph(name, scale=0.002, order=order, index_dtype=torch.int32)
    assert ei.dtype == torch.int32 and ei.shape[0] == 2 and ei.shape[1] > 0
    assert int(ei.min()) >= 0 and int(ei.max()) < n


def test_suite_registry_lists_realistic_graphs_first_and_rejects_unknown_names():
    names = list(graphs.SUITE)
    assert names[: len(graphs.REALISTIC)] == graphs.REALISTIC
    assert set(graphs.STRESS) == set(names) - set(graphs.REALISTIC)
    with pytest.raises(ValueError, match="unknown suite graph"):
        graphs.suite_graph("nope")
    with pytest.raises(ValueError, match="order"):
        graphs.suite_graph("mesh-arxiv", order="sorted")
