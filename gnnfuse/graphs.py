"""Seeded synthetic graphs: the one generator module of the tests and the benchmarks.

Every generator returns an ``edge_index`` [2, E] (row 0 = source, row 1 = target, PyG's
convention) built with vectorised torch ops on ``device``; a seed gives the same graph every time
on the same device type (CPU and CUDA random streams differ).

Realistic graphs (their id order carries locality, as in real data):

- :func:`planted_communities`: power-law in-degree with a cap, communities of given sizes,
  a given fraction of edges inside the target's community; ids in community order or scrambled.
- :func:`rmat`: R-MAT / Kronecker (Graph500 parameters by default).
- :func:`mesh`: a 2-D grid, 4-neighbour (road-network-like, degree ~4).

Stress graphs (:func:`uniform_source_graph`): sources uniform at random, so no ordering of the
ids can give cache reuse. ``rfc-uniform``, ``arxiv-like``, ``products-like``, ``reddit-like``
and ``hub-stress`` keep the exact definitions of the earlier benchmark results.

:data:`SUITE` names the benchmark graphs (realistic ones first); :func:`suite_graph` builds one.
:func:`random_graph` and :func:`hub_graph` are the test suite's small graphs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

ORDERS = ("generated", "scrambled")


def _generator(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def scramble(edge_index: torch.Tensor, num_nodes: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Relabels nodes by a random permutation: returns (new edge_index, perm) with node ``old``
    becoming ``perm[old]``."""
    perm = torch.randperm(num_nodes, generator=_generator(seed, edge_index.device), device=edge_index.device)
    return perm.to(edge_index.dtype)[edge_index.long()], perm


# ---- realistic --------------------------------------------------------------------------------------
def pareto_degrees(num_nodes: int, num_edges: int, *, alpha: float = 1.5, max_degree: int | None = None,
                   generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Integer in-degrees (int64, summing exactly to ``num_edges``) drawn from a Pareto law with tail
    index ``alpha`` (P(deg > d) ~ d^-alpha), scaled to the mean, capped at ``max_degree``."""
    if num_nodes == 0:
        return torch.zeros(0, dtype=torch.int64, device=device)
    u = torch.rand(num_nodes, generator=generator, device=device, dtype=torch.float64)
    w = (1.0 - u).pow(-1.0 / alpha)  # Pareto(1, alpha)
    cap = float(max_degree) if max_degree else math.inf
    if cap * num_nodes < num_edges:
        raise ValueError(f"max_degree={max_degree} cannot hold {num_edges} edges on {num_nodes} nodes")
    expected = w * (num_edges / w.sum())
    for _ in range(50):  # capping removes mass: rescale the uncapped nodes until the sum is num_edges
        expected = expected.clamp_(max=cap)
        free = expected < cap
        short = num_edges - float(expected.sum())
        if short <= 1e-6 * max(num_edges, 1) or not bool(free.any()):
            break
        expected[free] *= 1.0 + short / float(expected[free].sum())
    expected *= num_edges / float(expected.sum())
    # systematic rounding: every degree is floor or ceil of its expectation and the total is exact
    offset = torch.rand((), generator=generator, device=device, dtype=torch.float64)
    edges_before = torch.floor(torch.cumsum(expected, 0) + offset).long()
    deg = torch.diff(edges_before, prepend=torch.floor(offset).long().view(1))
    deg.clamp_(min=0, max=max_degree)  # float rounding may overshoot the cap by one
    short = num_edges - int(deg.sum())  # and the total by a few: fix them on the first nodes that can take it
    if short > 0:
        deg[torch.nonzero(deg < cap).view(-1)[:short]] += 1
    elif short < 0:
        deg[torch.nonzero(deg > 0).view(-1)[:-short]] -= 1
    return deg


def community_sizes(num_nodes: int, community_size: int | tuple[int, int], *, generator: torch.Generator,
                    device: torch.device) -> torch.Tensor:
    """Sizes (int64, summing to ``num_nodes``): a fixed size, or uniform in ``[lo, hi]``."""
    lo, hi = (community_size, community_size) if isinstance(community_size, int) else community_size
    if not 1 <= lo <= hi:
        raise ValueError(f"community_size must be >= 1 (or a (lo, hi) range); got {community_size!r}")
    count = num_nodes // lo + 1
    sizes = torch.randint(lo, hi + 1, (count,), generator=generator, device=device)
    ends = torch.cumsum(sizes, 0).clamp_(max=num_nodes)
    ends = ends[: int((ends < num_nodes).sum()) + 1] if num_nodes else ends[:0]
    return torch.diff(ends, prepend=ends.new_zeros(1))


def planted_communities(num_nodes: int, num_edges: int, *, community_size: int | tuple[int, int] = (1000, 3000),
                        intra_fraction: float = 0.8, alpha: float = 1.5, max_degree: int | None = 20_000,
                        order: str = "generated", seed: int = 0, device: str | torch.device = "cpu",
                        index_dtype: torch.dtype = torch.int64) -> tuple[torch.Tensor, torch.Tensor]:
    """A power-law graph with planted communities: returns ``(edge_index, community)``,
    ``community[node]`` being each node's community id.

    In-degrees follow :func:`pareto_degrees` (tail ``alpha``, cap ``max_degree``). Each edge's source
    lies in its target's community with probability ``intra_fraction`` and anywhere otherwise, drawn
    with probability proportional to a per-node weight uniform in [0.5, 1.5) (out-degrees are therefore
    near-Poisson, not heavy-tailed). Communities are contiguous id ranges when ``order`` is
    ``"generated"``; ``"scrambled"`` relabels the nodes at random. Duplicate edges and self loops
    occur as in any random graph.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}; got {order!r}")
    if not 0.0 <= intra_fraction <= 1.0:
        raise ValueError(f"intra_fraction must be in [0, 1]; got {intra_fraction}")
    device = torch.device(device)
    g = _generator(seed, device)
    sizes = community_sizes(num_nodes, community_size, generator=g, device=device)
    community = torch.repeat_interleave(torch.arange(sizes.numel(), device=device), sizes, output_size=num_nodes)
    deg = pareto_degrees(num_nodes, num_edges, alpha=alpha, max_degree=max_degree, generator=g, device=device)
    dst = torch.repeat_interleave(torch.arange(num_nodes, device=device), deg, output_size=num_edges)
    del deg
    # sources by inverse-CDF over the node weights: an interval of the cumulative weights per edge,
    # the target's community's for intra edges, the whole graph's otherwise
    weight = torch.rand(num_nodes, generator=g, device=device, dtype=torch.float64).add_(0.5)  # jitter, no zeros
    cum = torch.cumsum(weight, 0)
    del weight
    starts = torch.cumsum(sizes, 0) - sizes
    lo = torch.cat([cum.new_zeros(1), cum])[starts]  # cumulative weight before each community
    hi = cum[starts + sizes - 1]
    c = community[dst]
    inside = torch.rand(num_edges, generator=g, device=device) < intra_fraction
    a = torch.where(inside, lo[c], 0.0)
    b = torch.where(inside, hi[c], cum[-1] if num_nodes else 0.0)
    del c, inside
    u = torch.rand(num_edges, generator=g, device=device, dtype=torch.float64)
    src = torch.searchsorted(cum, a.add_(u.mul_(b.sub_(a))), right=True).clamp_(max=max(num_nodes - 1, 0))
    del a, b, u, cum
    edge_index = torch.stack([src, dst])
    del src, dst
    # edges in random order, as a loaded dataset would have them (the CSR build's sort does the work)
    edge_index = edge_index[:, torch.randperm(num_edges, generator=g, device=device)]
    if order == "scrambled":
        edge_index, perm = scramble(edge_index, num_nodes, seed=seed + 1)
        community = torch.empty_like(community).scatter_(0, perm, community)
    return edge_index.to(index_dtype), community


def rmat(scale: int, num_edges: int, *, probs: tuple[float, float, float, float] = (0.57, 0.19, 0.19, 0.05),
         order: str = "generated", seed: int = 0, device: str | torch.device = "cpu",
         index_dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """R-MAT (recursive Kronecker) graph on ``2**scale`` nodes: each edge picks a quadrant of the
    adjacency matrix ``scale`` times with ``probs`` = (a, b, c, d) (Graph500's by default)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}; got {order!r}")
    a, b, c, _ = probs
    device = torch.device(device)
    g = _generator(seed, device)
    src = torch.zeros(num_edges, dtype=torch.int64, device=device)
    dst = torch.zeros_like(src)
    for level in range(scale):
        r = torch.rand(num_edges, generator=g, device=device)
        bit = 1 << (scale - 1 - level)
        src += (r >= a + b).long() * bit
        dst += (((r >= a) & (r < a + b)) | (r >= a + b + c)).long() * bit
    edge_index = torch.stack([src, dst])
    if order == "scrambled":
        edge_index, _ = scramble(edge_index, 1 << scale, seed=seed + 1)
    return edge_index.to(index_dtype)


def mesh(rows: int, cols: int, *, order: str = "generated", seed: int = 0, device: str | torch.device = "cpu",
         index_dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """2-D grid, node ``r * cols + c``, edges both ways between 4-neighbours (degree 2 to 4)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}; got {order!r}")
    device = torch.device(device)
    ids = torch.arange(rows * cols, device=device).view(rows, cols)
    right = torch.stack([ids[:, :-1].reshape(-1), ids[:, 1:].reshape(-1)])
    down = torch.stack([ids[:-1, :].reshape(-1), ids[1:, :].reshape(-1)])
    one_way = torch.cat([right, down], 1)
    edge_index = torch.cat([one_way, one_way.flip(0)], 1)
    if order == "scrambled":
        edge_index, _ = scramble(edge_index, rows * cols, seed=seed)
    return edge_index.to(index_dtype)


# ---- stress: uniform sources ----------------------------------------------------------------------
def uniform_source_graph(num_nodes: int, num_edges: int, targets: str, *, seed: int = 0,
                         device: str | torch.device = "cpu") -> torch.Tensor:
    """Sources uniform; targets ``"uniform"``, ``"power"`` (Zipf, P(rank r) ~ 1/r, hubs at random ids)
    or ``"hub"`` (4 rows with 10% of the edges each, the rest thinly over every 10th row)."""
    n, e = num_nodes, num_edges
    device = torch.device(device)
    g = _generator(seed, device)
    src = torch.randint(0, n, (e,), device=device, generator=g)
    if targets == "uniform":
        dst = torch.randint(0, n, (e,), device=device, generator=g)
    elif targets == "power":
        cdf = torch.cumsum(1.0 / torch.arange(1, n + 1, device=device, dtype=torch.float64), 0)
        u = torch.rand(e, device=device, generator=g, dtype=torch.float64) * cdf[-1]
        rank = torch.searchsorted(cdf, u).clamp_(max=n - 1)
        del cdf, u
        dst = torch.randperm(n, device=device, generator=g)[rank]
    elif targets == "hub":
        hubs = torch.randperm(n, device=device, generator=g)[:4]
        dst = torch.randint(0, max(n // 10, 1), (e,), device=device, generator=g) * 10
        per_hub = e // 10
        dst[: 4 * per_hub] = hubs.repeat_interleave(per_hub)
    else:
        raise ValueError(f"targets must be 'uniform', 'power' or 'hub'; got {targets!r}")
    return torch.stack([src, dst])


# ---- the benchmark suite ----------------------------------------------------------------------------
@dataclass(frozen=True)
class SuiteGraph:
    kind: str  # "community", "rmat", "mesh" (realistic) or "uniform", "power", "hub" (stress)
    nodes: int  # rmat: 2**scale; mesh: rows * cols
    edges: int  # mesh: derived from the shape
    params: dict = field(default_factory=dict)
    note: str = ""

    @property
    def stress(self) -> bool:
        return self.kind in ("uniform", "power", "hub")


SUITE: dict[str, SuiteGraph] = {
    # realistic: community structure / recursive structure / mesh; id order carries locality
    "community-arxiv": SuiteGraph("community", 169_343, 1_166_243, dict(community_size=(500, 1500), max_degree=13_000),
                                  "planted communities at ogbn-arxiv scale, 80% intra, in-degree cap 13K"),
    "community-products": SuiteGraph("community", 2_449_029, 61_859_140,
                                     dict(community_size=(1000, 3000), max_degree=20_000),
                                     "planted communities at ogbn-products scale, 80% intra, in-degree cap 20K"),
    "community-1m": SuiteGraph("community", 1_000_000, 16_000_000, dict(community_size=(1000, 3000), max_degree=10_000),
                               "CPU-sized planted communities: F=128 float32 features are 512 MB"),
    "rmat-arxiv": SuiteGraph("rmat", 1 << 17, 1_166_243, dict(scale=17), "R-MAT, Graph500 parameters"),
    "rmat-products": SuiteGraph("rmat", 1 << 21, 61_859_140, dict(scale=21), "R-MAT, Graph500 parameters"),
    "mesh-arxiv": SuiteGraph("mesh", 412 * 412, 4 * 412 * 411, dict(rows=412, cols=412), "2-D grid, road-network-like"),
    "mesh-products": SuiteGraph("mesh", 1565 * 1565, 4 * 1565 * 1564, dict(rows=1565, cols=1565),
                                "2-D grid, road-network-like"),
    # stress: uniform sources, no locality to recover (the definitions of the earlier results)
    "rfc-uniform": SuiteGraph("uniform", 10_000, 200_000, note="stress: uniform sources and targets"),
    "arxiv-like": SuiteGraph("power", 169_343, 1_166_243, note="stress: uniform sources, Zipf targets"),
    "products-like": SuiteGraph("power", 2_449_029, 61_859_140, note="stress: uniform sources, Zipf targets"),
    "reddit-like": SuiteGraph("power", 232_965, 114_615_892, note="stress: uniform sources, Zipf targets"),
    "hub-stress": SuiteGraph("hub", 1_000_000, 2_000_000, note="stress: 4 hub rows with 10% of the edges each"),
}
REALISTIC = [name for name, spec in SUITE.items() if not spec.stress]
STRESS = [name for name, spec in SUITE.items() if spec.stress]


def suite_graph(name: str, *, scale: float = 1.0, order: str = "generated", seed: int = 0,
                device: str | torch.device = "cpu", index_dtype: torch.dtype = torch.int64) -> tuple[torch.Tensor, int]:
    """``(edge_index, num_nodes)`` of a :data:`SUITE` graph. ``scale`` shrinks nodes and edges alike
    (an R-MAT loses ``round(log2(1/scale))`` levels, a mesh ``sqrt(scale)`` of each side);
    ``order="scrambled"`` relabels the nodes at random (a stress graph's ids are random already)."""
    if name not in SUITE:
        raise ValueError(f"unknown suite graph {name!r}; known: {', '.join(SUITE)}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}; got {order!r}")
    spec = SUITE[name]
    n, e = max(1, round(spec.nodes * scale)), max(1, round(spec.edges * scale))
    if spec.kind == "community":
        params = dict(spec.params)
        lo, hi = params["community_size"]
        if n < hi * 4:  # tiny scales: keep several communities
            params["community_size"] = (max(1, n // 16), max(1, n // 8))
        params["max_degree"] = max(params["max_degree"], -(-e // n))
        edge_index, _ = planted_communities(n, e, order=order, seed=seed, device=device, **params)
        return edge_index.to(index_dtype), n
    if spec.kind == "rmat":
        s = max(1, spec.params["scale"] - round(math.log2(1 / scale)))
        return rmat(s, e, order=order, seed=seed, device=device, index_dtype=index_dtype), 1 << s
    if spec.kind == "mesh":
        side = max(2, round(spec.params["rows"] * math.sqrt(scale)))
        return mesh(side, side, order=order, seed=seed, device=device, index_dtype=index_dtype), side * side
    edge_index = uniform_source_graph(n, e, spec.kind, seed=seed, device=device)
    if order == "scrambled":
        edge_index, _ = scramble(edge_index, n, seed=seed + 1)
    return edge_index.to(index_dtype), n


# ---- the test suite's small graphs ------------------------------------------------------------------
def random_graph(num_src: int, num_dst: int, num_edges: int, *, seed: int = 0, power_law: bool = False,
                 index_dtype: torch.dtype = torch.int64, device: str | torch.device = "cpu") -> torch.Tensor:
    """edge_index [2, E] with uniform sources and uniform or Zipf-like (power-law) targets
    (bipartite when ``num_src != num_dst``); generated on the CPU, then moved."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, max(num_src, 1), (num_edges,), generator=g)
    if power_law and num_dst > 0 and num_edges > 0:
        ranks = torch.arange(1, num_dst + 1, dtype=torch.float64)
        dst = torch.multinomial(1.0 / ranks, num_edges, replacement=True, generator=g)
        dst = torch.randperm(num_dst, generator=g)[dst]  # hubs at random ids, not at 0
    else:
        dst = torch.randint(0, max(num_dst, 1), (num_edges,), generator=g)
    return torch.stack([src, dst]).to(index_dtype).to(device)


def hub_graph(num_nodes: int, hub_degree: int, num_hubs: int = 2, *, seed: int = 0) -> torch.Tensor:
    """A few targets with hub_degree in-edges each; every other target is empty."""
    g = torch.Generator().manual_seed(seed)
    dst = torch.arange(num_hubs).repeat_interleave(hub_degree) * (num_nodes // max(num_hubs, 1))
    src = torch.randint(0, num_nodes, (dst.numel(),), generator=g)
    return torch.stack([src, dst])
