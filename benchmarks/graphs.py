"""The seeded synthetic graphs of DESIGN.md's benchmark suite and loaders for the real ones.

Targets are power-law (Zipf: P(rank r) ~ 1/r, hubs at random ids) and sources uniform, unless
the graph says otherwise. The same seed gives the same graph on every device.
"""
from __future__ import annotations

import torch

# name: (nodes, edges, target distribution)
SYNTHETIC = {
    "rfc-uniform": (10_000, 200_000, "uniform"),
    "arxiv-like": (169_343, 1_166_243, "power"),
    "products-like": (2_449_029, 61_859_140, "power"),
    "reddit-like": (232_965, 114_615_892, "power"),
    "hub-stress": (1_000_000, 2_000_000, "hub"),
}


def synthetic_edge_index(name: str, *, scale: float = 1.0, seed: int = 0, device: str | torch.device = "cpu",
                         index_dtype: torch.dtype = torch.int64) -> tuple[torch.Tensor, int]:
    """(edge_index [2, E], num_nodes) of a suite graph; ``scale`` shrinks nodes and edges alike."""
    nodes, edges, kind = SYNTHETIC[name]
    n, e = max(1, round(nodes * scale)), max(1, round(edges * scale))
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    src = torch.randint(0, n, (e,), device=device, generator=g)
    if kind == "uniform":
        dst = torch.randint(0, n, (e,), device=device, generator=g)
    elif kind == "power":
        cdf = torch.cumsum(1.0 / torch.arange(1, n + 1, device=device, dtype=torch.float64), 0)
        u = torch.rand(e, device=device, generator=g, dtype=torch.float64) * cdf[-1]
        rank = torch.searchsorted(cdf, u).clamp_(max=n - 1)
        dst = torch.randperm(n, device=device, generator=g)[rank]
    else:  # hub-stress: 4 rows of 10% of the edges each, the rest thinly over every 10th row
        hubs = torch.randperm(n, device=device, generator=g)[:4]
        dst = torch.randint(0, max(n // 10, 1), (e,), device=device, generator=g) * 10
        per_hub = e // 10
        dst[: 4 * per_hub] = hubs.repeat_interleave(per_hub)
    return torch.stack([src, dst]).to(index_dtype), n


def real_edge_index(name: str) -> tuple[torch.Tensor, int] | None:
    """Cora / CiteSeer / Facebook from the shared data folder, or None when it is absent."""
    from gnnfuse.datasets import load_facebook_edge_index, load_planetoid

    if name == "Facebook":
        return load_facebook_edge_index()
    data = load_planetoid(name)
    return None if data is None else (data.edge_index, data.num_nodes)
