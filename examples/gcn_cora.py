"""Minimal demo (`make demo`): a 2-layer GCN trained on Cora with gnnfuse's fused layers, on CPU.

    python examples/gcn_cora.py [--epochs 200] [--root DIR]

Cora is read offline from --root, $GNNFUSE_DATA or ../shared/data (Planetoid raw files). Without
data it says so and trains on a synthetic graph instead, so the demo always runs.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import gnnfuse
from gnnfuse.datasets import load_planetoid
from gnnfuse.nn import GCNConv


class GCN(torch.nn.Module):
    def __init__(self, in_channels: int, hidden: int, classes: int):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden, cached=True)
        self.conv2 = GCNConv(hidden, classes, cached=True)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.5, training=self.training)
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


def synthetic_data(seed: int = 0):
    """A Cora-sized graph whose labels depend on neighbourhoods, so a GCN can learn them."""
    from torch_geometric.data import Data

    from gnnfuse.testing import random_graph

    g = torch.Generator().manual_seed(seed)
    n, classes = 2708, 7
    y = torch.randint(0, classes, (n,), generator=g)
    x = torch.randn(n, 64, generator=g) + torch.nn.functional.one_hot(y, 64).float() * 0.5
    edge_index = random_graph(n, n, 10_000, seed=seed)
    mask = torch.rand(n, generator=g)
    return Data(x=x, y=y, edge_index=edge_index, train_mask=mask < 0.3, val_mask=(mask >= 0.3) & (mask < 0.5),
                test_mask=mask >= 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--root", default=None, help="data root holding planetoid/Cora/raw")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    data = load_planetoid("Cora", args.root)
    if data is None:
        print("Cora not found (set --root or GNNFUSE_DATA to a folder with planetoid/Cora/raw); "
              "training on a synthetic graph instead.")
        data = synthetic_data(args.seed)
        name = "synthetic"
    else:
        name = "Cora"
    print(f"{name}: {data.num_nodes} nodes, {data.edge_index.shape[1]} edges, {data.x.shape[1]} features; "
          f"backend: {gnnfuse.explain(data.x, data.edge_index).backend}")

    model = GCN(data.x.shape[1], 16, int(data.y.max()) + 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    times = []
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        model.train()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data.x, data.edge_index)[data.train_mask], data.y[data.train_mask])
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
        if epoch % 20 == 0 or epoch == args.epochs:
            model.eval()
            with torch.no_grad():
                pred = model(data.x, data.edge_index).argmax(1)
            val = (pred[data.val_mask] == data.y[data.val_mask]).float().mean()
            print(f"epoch {epoch:4d}  loss {loss.item():.4f}  val acc {val:.3f}")
    model.eval()
    with torch.no_grad():
        pred = model(data.x, data.edge_index).argmax(1)
    test = (pred[data.test_mask] == data.y[data.test_mask]).float().mean()
    steady = sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0]
    print(f"test accuracy {test:.3f}; median epoch {steady * 1e3:.2f} ms (fwd+bwd, {torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
