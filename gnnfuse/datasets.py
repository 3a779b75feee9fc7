"""Offline loaders for the real graphs used by the examples, benchmarks and tests.

Data is never shipped with gnnfuse. It is looked up in ``$GNNFUSE_DATA``, else in
``../shared/data`` next to the source checkout; loaders return None when it is absent so
callers can fall back (with a message) to a synthetic graph.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch


def data_root() -> Path | None:
    """Directory holding planetoid/ and musae-facebook/: $GNNFUSE_DATA, else ../shared/data."""
    env = os.environ.get("GNNFUSE_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "data")
    for path in candidates:
        if path.is_dir():
            return path
    return None


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gnnfuse" / "data"


def load_planetoid(name: str, root: Path | str | None = None):
    """Cora / CiteSeer / PubMed as a PyG ``Data`` (public split), or None without data.

    The raw files are read from ``<root>/planetoid/<name>/raw``; PyG writes its processed
    copy, so they are copied once into a writable cache first.
    """
    from torch_geometric.datasets import Planetoid

    root = Path(root) if root else data_root()
    if root is None:
        return None
    raw = root / "planetoid" / name / "raw"
    if not raw.is_dir():
        raw = root / name / "raw"  # a root that is the planetoid folder itself
        if not raw.is_dir():
            return None
    cache = _cache_dir() / "planetoid"
    if not (cache / name / "raw").is_dir():
        shutil.copytree(raw, cache / name / "raw", dirs_exist_ok=True)
    return Planetoid(str(cache), name)[0]


def load_facebook_edge_index(root: Path | str | None = None) -> tuple[torch.Tensor, int] | None:
    """Facebook Page-Page (MUSAE): undirected edge_index [2, 341,825] and 22,470 nodes, or None."""
    import numpy as np
    from torch_geometric.utils import to_undirected

    root = Path(root) if root else data_root()
    path = None if root is None else root / "musae-facebook" / "facebook_edges.csv"
    if path is None or not path.is_file():
        return None
    edges = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.int64)
    edge_index = to_undirected(torch.from_numpy(edges).t())
    return edge_index, int(edge_index.max()) + 1
