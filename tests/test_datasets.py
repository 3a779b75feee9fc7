"""gnnfuse.datasets: where data is looked up, and what it says when the data is not there."""
from __future__ import annotations

import shutil
import pytest

from gnnfuse import datasets

pytest.importorskip("torch_geometric")
CORA = datasets.find("Cora")  # wherever this machine has it, found before a test isolates the search


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No $GNNFUSE_DATA, an empty user cache, no development tree."""
    monkeypatch.delenv("GNNFUSE_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(datasets, "__file__", str(tmp_path / "site-packages" / "gnnfuse" / "datasets.py"))
    return tmp_path


def test_search_order_root_env_user_cache_dev_tree(isolated, monkeypatch):
    assert datasets.search_path() == [isolated / "xdg" / "gnnfuse" / "data", isolated / "shared" / "data"]
    monkeypatch.setenv("GNNFUSE_DATA", str(isolated / "env"))
    assert datasets.search_path()[0] == isolated / "env"
    assert datasets.search_path(isolated / "mine") == [isolated / "mine"]  # an explicit root is the only place


def test_missing_dataset_says_what_to_download_and_where(isolated):
    assert datasets.find("Cora") is None and datasets.load_planetoid("Cora") is None
    with pytest.raises(datasets.DatasetNotFoundError) as info:
        datasets.load("Cora")
    message = str(info.value)
    assert "ind.cora.{x,y,tx,ty,allx,ally,graph,test.index}" in message
    assert str(isolated / "xdg" / "gnnfuse" / "data" / "planetoid" / "Cora" / "raw") in message
    with pytest.raises(datasets.DatasetNotFoundError, match="facebook_edges.csv.*musae-facebook"):
        datasets.load("Facebook")
    with pytest.raises(ValueError, match="name must be one of"):
        datasets.load("Reddit")


def test_planetoid_from_the_user_cache_with_a_pyg_transform(isolated):
    if CORA is None:
        pytest.skip("Cora raw files not found ($GNNFUSE_DATA, user cache, ../shared/data)")
    target = datasets.user_data_dir() / "planetoid" / "Cora" / "raw"
    shutil.copytree(CORA, target)
    assert datasets.find("Cora") == target
    from torch_geometric.transforms import NormalizeFeatures

    data = datasets.load("Cora", transform=NormalizeFeatures())
    assert data.num_nodes == 2708 and data.edge_index.shape == (2, 10556)
    assert abs(float(data.x.sum(1).max()) - 1.0) < 1e-5  # rows normalised by the transform
