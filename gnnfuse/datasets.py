"""Offline loaders for the real graphs used by the examples, benchmarks and tests.

Data is never shipped with gnnfuse and never downloaded by it. Each dataset is looked up, in order:

1. ``root=`` when given (only there), else
2. ``$GNNFUSE_DATA``,
3. the user data cache, ``$XDG_CACHE_HOME/gnnfuse/data`` or ``~/.cache/gnnfuse/data``,
4. ``../shared/data`` next to a source checkout (the development tree's data folder).

Each of these folders holds ``planetoid/<Name>/raw/ind.<name>.*`` (Cora, CiteSeer, PubMed, as PyG's
``Planetoid`` reads them) and ``musae-facebook/facebook_{edges.csv,features.json,target.csv}``.
Planetoid graphs are read by PyG's own ``Planetoid`` class. PyG's ``FacebookPagePage`` reads a
preprocessed ``facebook.npz`` that the MUSAE release does not contain, so the MUSAE files are read
here directly (with the real sparse features and a seeded stratified split).
``load(name)`` raises ``DatasetNotFoundError`` saying exactly what to download and where to put it;
the older ``load_*`` functions return None instead, so callers can fall back to a synthetic graph.

Example::

    from gnnfuse import datasets
    from torch_geometric.transforms import NormalizeFeatures

    data = datasets.load("Cora", transform=NormalizeFeatures())   # a PyG Data with the public split
"""
from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from . import config

PLANETOID = ("Cora", "CiteSeer", "PubMed")
FACEBOOK_FILES = ("facebook_edges.csv", "facebook_features.json", "facebook_target.csv")


class DatasetNotFoundError(FileNotFoundError):
    """A dataset is in none of the searched folders; the message says what to download and where."""


def user_data_dir() -> Path:
    """The user data cache: ``$XDG_CACHE_HOME/gnnfuse/data``, else ``~/.cache/gnnfuse/data``."""
    xdg = config.get("XDG_CACHE_HOME") if config.is_set("XDG_CACHE_HOME") else None
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "gnnfuse" / "data"


def _cache_dir() -> Path:  # the name older callers use
    return user_data_dir()


def search_path(root: Path | str | None = None) -> list[Path]:
    """The folders searched for data, in order (see the module docstring)."""
    if root:
        return [Path(root)]
    env = config.get("GNNFUSE_DATA")
    dev = Path(__file__).resolve().parents[2] / "shared" / "data"
    return ([Path(env)] if env else []) + [user_data_dir(), dev]


def _planetoid_raw(name: str, base: Path) -> Path | None:
    for raw in (base / "planetoid" / name / "raw", base / name / "raw"):  # or base is the planetoid folder
        if (raw / f"ind.{name.lower()}.graph").is_file():
            return raw
    return None


def _facebook_in(base: Path) -> Path | None:
    for folder in (base / "musae-facebook", base):
        if all((folder / f).is_file() for f in FACEBOOK_FILES):
            return folder
    return None


def find(name: str, root: Path | str | None = None) -> Path | None:
    """The folder holding dataset ``name`` (Planetoid's raw folder, or the MUSAE Facebook folder), or None."""
    for base in search_path(root):
        found = _facebook_in(base) if name == "Facebook" else _planetoid_raw(name, base)
        if found is not None:
            return found
    return None


def data_root() -> Path | None:
    """The first searched folder that holds any known dataset (prefer ``find(name)`` for one dataset)."""
    for base in search_path():
        if _facebook_in(base) or any(_planetoid_raw(name, base) for name in PLANETOID):
            return base
    return None


def missing_message(name: str, root: Path | str | None = None) -> str:
    """What to download, and where to put it, for dataset ``name``."""
    searched = ", ".join(str(p) for p in search_path(root))
    target = Path(root) if root else user_data_dir()
    if name == "Facebook":
        return (f"Facebook Page-Page not found (searched {searched}). Download {', '.join(FACEBOOK_FILES)} "
                "from the MUSAE repository (github.com/benedekrozemberczki/MUSAE, input/edges/facebook_edges.csv, "
                "input/features/facebook.json renamed facebook_features.json, input/target/facebook_target.csv) "
                f"into {target / 'musae-facebook'}, or set GNNFUSE_DATA to a folder holding musae-facebook/.")
    lower = name.lower()
    return (f"{name} not found (searched {searched}). Download ind.{lower}.{{x,y,tx,ty,allx,ally,graph,test.index}} "
            "(the Planetoid split; github.com/kimiyoung/planetoid, data/) into "
            f"{target / 'planetoid' / name / 'raw'}, or set GNNFUSE_DATA to a folder holding planetoid/{name}/raw. "
            f"With network access, torch_geometric.datasets.Planetoid('{target / 'planetoid'}', '{name}') "
            "downloads them there.")


def load(name: str, root: Path | str | None = None, **kwargs: Any):
    """Dataset ``name`` (Cora, CiteSeer, PubMed or Facebook) as a PyG ``Data``; ``kwargs`` go to
    ``load_planetoid`` / ``load_facebook``. Raises ``DatasetNotFoundError`` with what to download."""
    if name == "Facebook":
        data = load_facebook(root, **kwargs)
    elif name in PLANETOID:
        data = load_planetoid(name, root, **kwargs)
    else:
        raise ValueError(f"name must be one of {', '.join(PLANETOID)}, Facebook; got {name!r}")
    if data is None:
        raise DatasetNotFoundError(missing_message(name, root))
    return data


def load_planetoid(name: str, root: Path | str | None = None, transform=None):
    """Cora / CiteSeer / PubMed as a PyG ``Data`` (public split) through PyG's own ``Planetoid``, or
    None without data. ``transform`` (e.g. ``torch_geometric.transforms.NormalizeFeatures()``) is
    applied as PyG applies it. PyG writes a processed copy next to the raw files, so raw files in a
    read-only folder are copied once into the user data cache first."""
    from torch_geometric.datasets import Planetoid

    raw = find(name, root)
    if raw is None:
        return None
    home = user_data_dir() / "planetoid"
    if raw != home / name / "raw":
        shutil.copytree(raw, home / name / "raw", dirs_exist_ok=True)
    return Planetoid(str(home), name, transform=transform)[0]


def _facebook_folder(root: Path | str | None) -> Path | None:
    """The MUSAE Facebook folder: ``root`` or a ``musae-facebook`` folder in it, else the search path."""
    return find("Facebook", root)


def load_facebook_edge_index(root: Path | str | None = None) -> tuple[torch.Tensor, int] | None:
    """Facebook Page-Page (MUSAE): undirected edge_index [2, 341,825] and 22,470 nodes, or None."""
    import csv

    from torch_geometric.utils import to_undirected

    folder = _facebook_folder(root)
    if folder is None:
        return None
    with open(folder / "facebook_edges.csv", newline="", encoding="utf-8") as f:
        rows = csv.reader(f)
        next(rows)  # header: id_1,id_2
        edges = torch.tensor([[int(a), int(b)] for a, b in rows], dtype=torch.long)
    edge_index = to_undirected(edges.t())
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

    import csv

    folder = _facebook_folder(root)
    loaded = load_facebook_edge_index(folder) if folder is not None else None
    if folder is None or loaded is None:
        return None
    edge_index, _ = loaded

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
