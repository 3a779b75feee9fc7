"""The benchmark suite's graphs: the synthetic ones come from :mod:`gnnfuse.graphs` (the one generator
module of tests and benchmarks, re-exported here), plus loaders for the real ones."""
from __future__ import annotations

import torch

from gnnfuse.graphs import REALISTIC, STRESS, SUITE, mesh, planted_communities, rmat, scramble, suite_graph  # noqa: F401

SYNTHETIC = SUITE  # the earlier name of the registry


def synthetic_edge_index(name: str, *, scale: float = 1.0, seed: int = 0, device: str | torch.device = "cpu",
                         index_dtype: torch.dtype = torch.int64, order: str = "generated") -> tuple[torch.Tensor, int]:
    """(edge_index [2, E], num_nodes) of a suite graph (:func:`gnnfuse.graphs.suite_graph`)."""
    return suite_graph(name, scale=scale, seed=seed, device=device, index_dtype=index_dtype, order=order)


def real_edge_index(name: str) -> tuple[torch.Tensor, int] | None:
    """Cora / CiteSeer / Facebook from the shared data folder, or None when it is absent."""
    from gnnfuse.datasets import load_facebook_edge_index, load_planetoid

    if name == "Facebook":
        return load_facebook_edge_index()
    data = load_planetoid(name)
    return None if data is None else (data.edge_index, data.num_nodes)
