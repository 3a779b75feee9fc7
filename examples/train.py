"""Full-batch node classification with gnnfuse's fused layers, or the same model in stock PyG.

    python examples/train.py                                   # GCN on Cora, gnnfuse, CPU (= make demo)
    python examples/train.py --model sage --dataset Facebook --compare
    python examples/train.py --model gcn --dataset Cora --seeds 5 --compare   # accuracy mean ± std, speed-up
    python examples/train.py --dataset CiteSeer --device cuda --backend pyg
    python examples/train.py --dataset Facebook --reorder auto             # renumber nodes for locality first

Models (2 layers, the hyper-parameters of PyG's examples: lr 0.01, weight decay 5e-4, dropout 0.5,
200 epochs): gcn (hidden 16, cached normalisation), sage (mean aggregation, hidden 64), gin (2-layer
MLPs, hidden 64), gat (PyG's standard GAT: 8 heads x 8 hidden, ELU, dropout 0.6 on features and
attention coefficients, lr 0.005). ``--backend gnnfuse`` builds them from ``gnnfuse.nn``, ``--backend pyg`` from
``torch_geometric.nn``: the same classes, signatures and parameters, only the message passing differs.

Data (never shipped with gnnfuse): Planetoid raw files under ``--root``, else ``$GNNFUSE_DATA``, else
``../shared/data`` when present (``<root>/planetoid/<Name>/raw``), else PyG's normal download.
Facebook Page-Page is read from ``<root>/musae-facebook`` with a seeded stratified 60/20/20 split; its
4,714-dim binary features stay sparse and feed a learned input Linear applied with torch.sparse.mm.
When no data is reachable the script says so and trains on a synthetic graph.

``--reorder METHOD`` renumbers the nodes with ``gnnfuse.transforms.Reorder(METHOD)`` before training
(features, labels and masks move with their nodes; ``data.node_perm`` maps back): the same accuracy,
possibly faster epochs on large graphs. The time it took is printed.

Planetoid features are row-normalised (PyG's ``T.NormalizeFeatures()``, as in its gcn.py).
Reported: test accuracy at the epoch of best validation accuracy (as PyG's gcn.py) and at the last
epoch, the median training-epoch time and its interquartile range (forward + loss + backward + optimizer
step, first epoch excluded and reported apart: it sorts the graph, fills caches and may build the C++
kernels). ``--compare`` trains both backends in turns, epoch by epoch (each with its own RNG stream, so
the runs are those of separate processes), and reports the speed-up as the median and IQR of the
per-epoch time ratios: both sides of a pair ran under the same machine conditions.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HIDDEN = {"gcn": 16, "sage": 64, "gin": 64, "gat": 8}
# PyG's gat.py: 8 heads of 8, ELU, dropout 0.6 (features and attention), lr 0.005
MODEL_DEFAULTS = {"gat": dict(lr=0.005, dropout=0.6)}


# ---- data --------------------------------------------------------------------------------------------
def load_dataset(name: str, root: str | None = None, split_seed: int = 0, quiet: bool = False):
    """(Data, name actually used). Falls back to the synthetic graph, with a message, when data is missing."""
    from gnnfuse.datasets import _cache_dir, find, load_facebook, load_planetoid, missing_message
    from gnnfuse.datasets import synthetic_node_classification

    def say(msg):
        if not quiet:
            print(msg, flush=True)

    if name == "synthetic":
        return synthetic_node_classification(split_seed), "synthetic"
    data = None
    if name == "Facebook":  # each dataset is looked up on its own: one folder may hold Cora but not Facebook
        data = load_facebook(root, seed=split_seed)
        if data is None:
            say(missing_message(name, root) + " Training on a synthetic graph instead.")
    else:
        data = load_planetoid(name, root) if find(name, root) else None
        if data is None:  # PyG's normal route: download the raw files (into --root, else a cache dir)
            from torch_geometric.datasets import Planetoid

            target = Path(root) if root else _cache_dir() / "planetoid-download"
            say(f"{name}: no raw files under --root / $GNNFUSE_DATA / the user cache / ../shared/data; "
                f"trying PyG's download into {target} ...")
            old = socket.getdefaulttimeout()
            socket.setdefaulttimeout(20)
            try:
                data = Planetoid(str(target), name)[0]
            except Exception as exc:  # noqa: BLE001  (offline, blocked, ...)
                say(f"{name} is not reachable ({type(exc).__name__}: {str(exc)[:120]}). "
                    + missing_message(name, root) + " Training on a synthetic graph instead.")
            finally:
                socket.setdefaulttimeout(old)
    if data is None:
        return synthetic_node_classification(split_seed), "synthetic"
    if name in ("Cora", "CiteSeer"):  # row-normalised bag-of-words, as PyG's T.NormalizeFeatures()
        data.x = data.x / data.x.sum(1, keepdim=True).clamp(min=1)
    return data, name


# ---- models ------------------------------------------------------------------------------------------
class SparseLinear(torch.nn.Module):
    """Linear layer for a torch.sparse (CSR/COO) input: x @ W + b with torch.sparse.mm, W learned."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(in_features, out_features))
        self.bias = torch.nn.Parameter(torch.zeros(out_features))
        torch.nn.init.xavier_uniform_(self.weight)

    def forward(self, x):
        return torch.sparse.mm(x, self.weight) + self.bias


class Net(torch.nn.Module):
    """Two message-passing layers (+ a sparse input Linear when the features are a sparse tensor)."""

    def __init__(self, layers, model: str, in_channels: int, hidden: int, classes: int, *, dropout: float = 0.5,
                 sparse_input: bool = False):
        super().__init__()
        self.dropout = dropout
        self.encoder = SparseLinear(in_channels, hidden) if sparse_input else None
        f_in = hidden if sparse_input else in_channels
        if model == "gcn":
            self.conv1 = layers.GCNConv(f_in, hidden, cached=True)
            self.conv2 = layers.GCNConv(hidden, classes, cached=True)
        elif model == "sage":
            self.conv1 = layers.SAGEConv(f_in, hidden)
            self.conv2 = layers.SAGEConv(hidden, classes)
        elif model == "gin":
            def mlp(a, b, c):
                return torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.ReLU(), torch.nn.Linear(b, c))

            self.conv1 = layers.GINConv(mlp(f_in, hidden, hidden))
            self.conv2 = layers.GINConv(mlp(hidden, hidden, classes))
        elif model == "gat":
            self.conv1 = layers.GATConv(f_in, hidden, heads=8, dropout=dropout)
            self.conv2 = layers.GATConv(hidden * 8, classes, heads=1, concat=False, dropout=dropout)
        else:
            raise ValueError(f"unknown model {model!r}")
        self.act = F.elu if model == "gat" else F.relu

    def forward(self, x, edge_index):
        if self.encoder is not None:
            x = F.relu(self.encoder(x))
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = self.act(self.conv1(x, edge_index))
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.conv2(x, edge_index)


def layer_module(backend: str):
    if backend == "gnnfuse":
        import gnnfuse.nn as layers
    elif backend == "pyg":
        import torch_geometric.nn as layers
    else:
        raise ValueError(f"unknown backend {backend!r}")
    return layers


# ---- training ----------------------------------------------------------------------------------------
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _OwnRng:
    """A run's own torch RNG stream: runs stepped in turns (--compare) draw the same dropout masks as
    when each runs alone."""

    def __init__(self, seed: int, device: torch.device):
        self.cuda = device.type == "cuda"
        saved = self._get()
        torch.manual_seed(seed)
        self.state = self._get()
        self._set(saved)

    def _get(self):
        return torch.get_rng_state(), (torch.cuda.get_rng_state() if self.cuda else None)

    def _set(self, state):
        torch.set_rng_state(state[0])
        if self.cuda:
            torch.cuda.set_rng_state(state[1])

    def __enter__(self):
        self.saved = self._get()
        self._set(self.state)

    def __exit__(self, *exc):
        self.state = self._get()
        self._set(self.saved)


def training(data, args, backend: str, seed: int, device: torch.device):
    """Trains one model from scratch, yielding after each epoch; returns accuracies and epoch times."""
    from tqdm.auto import tqdm

    rng = _OwnRng(seed, device)
    sparse = data.x.layout != torch.strided
    classes = int(data.y.max()) + 1
    with rng:
        model = Net(layer_module(backend), args.model, data.x.shape[1], args.hidden or HIDDEN[args.model], classes,
                    dropout=args.dropout, sparse_input=sparse).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    x, edge_index, y = data.x, data.edge_index, data.y
    masks = (data.train_mask, data.val_mask, data.test_mask)

    times, best_val, test_at_best = [], -1.0, 0.0
    bar = tqdm(range(1, args.epochs + 1), desc=f"{backend:7s} {args.model} seed {seed}", unit="ep",
               disable=not args.progress, leave=args.seeds == 1, dynamic_ncols=True)
    for _ in bar:
        with rng:
            model.train()
            _sync(device)
            start = time.perf_counter()
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x, edge_index)[masks[0]], y[masks[0]])
            loss.backward()
            optimizer.step()
            _sync(device)
            times.append(time.perf_counter() - start)

            model.eval()
            with torch.no_grad():
                pred = model(x, edge_index).argmax(1)
        train_acc, val_acc, test_acc = ((pred[m] == y[m]).float().mean().item() for m in masks)
        if val_acc > best_val:
            best_val, test_at_best = val_acc, test_acc
        bar.set_postfix(loss=f"{loss.item():.3f}", train=f"{train_acc:.3f}", val=f"{val_acc:.3f}",
                        test=f"{test_acc:.3f}")
        yield
    bar.close()
    steady = [1e3 * t for t in (times[1:] or times)]
    q1, _, q3 = statistics.quantiles(steady, n=4) if len(steady) > 1 else (steady[0],) * 3
    return dict(backend=backend, seed=seed, test_acc=test_at_best, final_test_acc=test_acc, best_val_acc=best_val,
                final_loss=loss.item(), epoch_ms=statistics.mean(steady), epoch_median_ms=statistics.median(steady),
                epoch_iqr_ms=q3 - q1, epoch_times_ms=steady, first_epoch_ms=1e3 * times[0])


def in_turns(runs: list) -> list[dict]:
    """Steps the training generators one epoch at a time, in a rotating order, so that every backend
    sees the same machine conditions (a shared machine's speed drifts); returns their results."""
    results: list = [None] * len(runs)
    live, turn = list(range(len(runs))), 0
    while live:
        k = turn % len(live)
        for i in live[k:] + live[:k]:
            try:
                next(runs[i])
            except StopIteration as done:
                results[i] = done.value
                live.remove(i)
        turn += 1
    return results


def train_once(data, args, backend: str, seed: int, device: torch.device) -> dict:
    """Trains one model from scratch; returns accuracies and epoch times."""
    return in_turns([training(data, args, backend, seed, device)])[0]


def _iqr(values):
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q3 - q1


def _mean_std(values):
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gcn", choices=["gcn", "sage", "gin", "gat"])
    p.add_argument("--dataset", default="Cora", choices=["Cora", "CiteSeer", "Facebook", "synthetic"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--backend", default="gnnfuse", choices=["gnnfuse", "pyg"])
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--seeds", type=int, default=1, help="train K times (seeds 0..K-1): mean ± std test accuracy")
    p.add_argument("--compare", action="store_true", help="also train the same model in stock PyG; print the speed-up")
    p.add_argument("--root", default=None, help="data root (planetoid/<Name>/raw, musae-facebook/)")
    p.add_argument("--hidden", type=int, default=None, help="hidden width (default: gcn 16, sage 64, gin 64)")
    p.add_argument("--lr", type=float, default=None, help="default 0.01 (gat: 0.005)")
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--dropout", type=float, default=None, help="default 0.5 (gat: 0.6)")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the Facebook / synthetic random split")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--reorder", default="none",
                   choices=["none", "auto", "identity", "degree", "rcm", "metis", "community"],
                   help="renumber the nodes with gnnfuse.transforms.Reorder(METHOD) before training")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no tqdm bars")
    args = p.parse_args(argv)
    for key, value in dict(dict(lr=0.01, dropout=0.5), **MODEL_DEFAULTS.get(args.model, {})).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    if args.threads:
        torch.set_num_threads(args.threads)

    data, name = load_dataset(args.dataset, args.root, args.split_seed)
    data = data.to(device)
    if args.reorder != "none":
        from gnnfuse.transforms import Reorder

        start = time.perf_counter()
        data = Reorder(args.reorder)(data)
        print(f"reordered the nodes ({args.reorder}) in {time.perf_counter() - start:.2f} s", flush=True)
    sparse = data.x.layout != torch.strided
    feat = f"{data.x.shape[1]} {'sparse ' if sparse else ''}features"
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{name}: {data.num_nodes} nodes, {data.edge_index.shape[1]} edges, {feat}, {int(data.y.max()) + 1} classes; "
          f"split {int(data.train_mask.sum())}/{int(data.val_mask.sum())}/{int(data.test_mask.sum())}; "
          f"{args.model.upper()} on {where}", flush=True)

    backends = [args.backend] + (["pyg" if args.backend == "gnnfuse" else "gnnfuse"] if args.compare else [])
    runs = {b: [] for b in backends}
    for seed in range(args.seeds):  # backends trained in turns, epoch by epoch (see in_turns)
        for b, result in zip(backends, in_turns([training(data, args, b, seed, device) for b in backends])):
            runs[b].append(result)

    print()
    print(f"{'backend':8s} {'test acc (best val)':>22s} {'test acc (last)':>18s} {'epoch ms (median, IQR)':>24s} "
          f"{'first epoch ms':>15s}")
    summary = {}
    for b, rs in runs.items():
        acc, acc_sd = _mean_std([100 * r["test_acc"] for r in rs])
        last, last_sd = _mean_std([100 * r["final_test_acc"] for r in rs])
        ms = statistics.mean(r["epoch_ms"] for r in rs)
        epochs = [t for r in rs for t in r["epoch_times_ms"]]
        median, iqr = statistics.median(epochs), _iqr(epochs)
        first = statistics.mean(r["first_epoch_ms"] for r in rs)
        summary[b] = dict(test_acc=acc, test_acc_std=acc_sd, final_test_acc=last, final_test_acc_std=last_sd,
                          epoch_ms=ms, epoch_median_ms=median, epoch_iqr_ms=iqr, first_epoch_ms=first, runs=rs)
        pm = f" ± {acc_sd:.1f}" if len(rs) > 1 else ""
        pm_last = f" ± {last_sd:.1f}" if len(rs) > 1 else ""
        print(f"{b:8s} {f'{acc:.1f}{pm} %':>22s} {f'{last:.1f}{pm_last} %':>18s} {f'{median:.2f} (IQR {iqr:.2f})':>24s} "
              f"{first:15.1f}")
    if args.seeds > 1:
        print(f"({args.seeds} seeds: mean ± sample std)")
    if args.compare:
        # epochs ran in turns, so epoch i of both backends saw the same conditions: ratios of pairs
        ratios = [p / g for rp, rg in zip(runs["pyg"], runs["gnnfuse"])
                  for p, g in zip(rp["epoch_times_ms"], rg["epoch_times_ms"])]
        speedup = statistics.median(ratios)
        q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (speedup,) * 3
        summary.update(speedup=speedup, speedup_q1=q1, speedup_q3=q3)
        print(f"speed-up of gnnfuse over stock PyG (training epoch, backends in turns): median {speedup:.2f}x, "
              f"IQR {q1:.2f}-{q3:.2f}x over {len(ratios)} epoch pairs")
    summary["dataset"] = name
    return summary


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(0 if main() else 1)
