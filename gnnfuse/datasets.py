"""Offline loaders for the real graphs used by the examples, benchmarks and tests.

Data is never shipped with gnnfuse. It is looked up in ``$GNNFUSE_DATA``, else in
``../shared/data`` next to the source checkout; loaders return None when it is absent so
callers can fall back (with a message) to a synthetic graph.
"""
from __future__ import annotations

import os
import shutil
import warnings
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


def _facebook_folder(root: Path | str | None) -> Path | None:
    """The MUSAE Facebook folder under ``root`` (or ``root`` itself, if it is that folder)."""
    root = Path(root) if root else data_root()
    if root is None:
        return None
    for folder in (root / "musae-facebook", root):
        if (folder / "facebook_edges.csv").is_file() and (folder / "facebook_features.json").is_file():
            return folder
    return None


def load_facebook_edge_index(root: Path | str | None = None) -> tuple[torch.Tensor, int] | None:
    """Facebook Page-Page (MUSAE): undirected edge_index [2, 341,825] and 22,470 nodes, or None."""
    import numpy as np
    from torch_geometric.utils import to_undirected

    folder = _facebook_folder(root)
    if folder is None:
        return None
    edges = np.loadtxt(folder / "facebook_edges.csv", delimiter=",", skiprows=1, dtype=np.int64)
    edge_index = to_undirected(torch.from_numpy(edges).t())
    return edge_index, int(edge_index.max()) + 1


def _stratified_masks(y: torch.Tensor, seed: int, train: float, val: float):
    """Boolean train/val/test masks with the same class proportions in each part (seeded)."""
    g = torch.Generator().manual_seed(seed)
    n = y.numel()
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    for c in torch.unique(y).tolist():
        idx = (y == c).nonzero().flatten()
        idx = idx[torch.randperm(idx.numel(), generator=g)]
        n_train, n_val = round(train * idx.numel()), round(val * idx.numel())
        masks[0][idx[:n_train]] = True
        masks[1][idx[n_train:n_train + n_val]] = True
        masks[2][idx[n_train + n_val:]] = True
    return masks


def load_facebook(root: Path | str | None = None, seed: int = 0, *, train: float = 0.6, val: float = 0.2,
                  sparse_features: bool = True):
    """Facebook Page-Page (MUSAE) as a PyG ``Data`` for node classification, or None without data.

    * ``x``: the real 4,714-dim sparse binary page features, [22,470, 4,714] with 314,583 ones. By
      default a ``torch.sparse_csr`` tensor (3.8 MB); ``sparse_features=False`` gives the dense
      float32 matrix instead (~424 MB). Nothing is projected or truncated: a model should start with
      a linear layer applied with ``torch.sparse.mm`` (see examples/train.py).
    * ``y``: page_type, 4 classes (``data.classes`` holds their names, in id order).
    * ``edge_index``: undirected, 341,825 directed rows (179 self loops kept).
    * ``train_mask`` / ``val_mask`` / ``test_mask``: a random split stratified by class,
      ``train`` / ``val`` / rest of each class, drawn from ``seed`` (same seed, same split).
    """
    import json

    from torch_geometric.data import Data

    folder = _facebook_folder(root)
    if folder is None:
        return None
    import csv

    edge_index, _ = load_facebook_edge_index(folder)

    names: dict[str, int] = {}
    ids, labels = [], []
    with open(folder / "facebook_target.csv", newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):  # page names contain commas: a real CSV reader
            ids.append(int(row["id"]))
            labels.append(names.setdefault(row["page_type"], len(names)))
    n = max(max(ids) + 1, int(edge_index.max()) + 1)
    y = torch.full((n,), -1, dtype=torch.long)
    y[torch.tensor(ids)] = torch.tensor(labels)
    if (y < 0).any():
        raise ValueError(f"{folder / 'facebook_target.csv'}: {(y < 0).sum()} nodes without a label")
    # relabel classes in sorted-name order, so ids do not depend on the file's row order
    order = sorted(names)
    remap = torch.tensor([order.index(k) for k in names])
    y = remap[y]

    features = json.loads((folder / "facebook_features.json").read_text())
    rows = torch.tensor([int(k) for k, v in features.items() for _ in v], dtype=torch.long)
    cols = torch.tensor([j for v in features.values() for j in v], dtype=torch.long)
    dim = int(cols.max()) + 1
    with warnings.catch_warnings():  # torch's notes on sparse invariant checks and CSR being beta
        warnings.filterwarnings("ignore", message="Sparse (invariant checks|CSR tensor support)")
        x = torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.ones(rows.numel()), (n, dim),
                                    check_invariants=True).coalesce()
        x = x.to_sparse_csr() if sparse_features else x.to_dense()

    train_mask, val_mask, test_mask = _stratified_masks(y, seed, train, val)
    data = Data(x=x, y=y, edge_index=edge_index, train_mask=train_mask, val_mask=val_mask, test_mask=test_mask)
    data.num_nodes = n
    data.classes = order
    return data


def synthetic_node_classification(seed: int = 0, *, num_nodes: int = 2708, num_edges: int = 10_000,
                                  num_features: int = 64, num_classes: int = 7, homophily: float = 0.8):
    """A Cora-sized random graph a GNN can learn, with a 30/20/50 random split (seeded). Used when no
    real data is reachable. Features carry a weak, noisy class signal; a fraction ``homophily`` of the
    edges join nodes of the same class (as in citation graphs), so aggregating neighbours helps."""
    from torch_geometric.data import Data

    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, num_classes, (num_nodes,), generator=g)
    x = torch.randn(num_nodes, num_features, generator=g)
    x += torch.nn.functional.one_hot(y % num_features, num_features).float() * 0.5
    src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    by_class = torch.argsort(y)                      # node ids grouped by class
    counts = torch.bincount(y, minlength=num_classes)
    starts = torch.cumsum(counts, 0) - counts
    c = y[src]
    same = by_class[starts[c] + (torch.rand(num_edges, generator=g) * counts[c]).long().clamp_(max=counts[c] - 1)]
    other = torch.randint(0, num_nodes, (num_edges,), generator=g)
    dst = torch.where(torch.rand(num_edges, generator=g) < homophily, same, other)
    u = torch.rand(num_nodes, generator=g)
    return Data(x=x, y=y, edge_index=torch.stack([src, dst]), train_mask=u < 0.3,
                val_mask=(u >= 0.3) & (u < 0.5), test_mask=u >= 0.5)
