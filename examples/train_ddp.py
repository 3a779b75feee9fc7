"""Mini-batch GraphSAGE on sampled neighbourhoods, data-parallel over GPUs (or CPU processes).

    torchrun --nproc-per-node 2 examples/train_ddp.py --scale 1.0 --out results/ddp     # 2 GPUs, NCCL
    torchrun --nproc-per-node 2 examples/train_ddp.py --cuda-graph --prefetch           # the step replayed
    python examples/train_ddp.py --nproc 2 --device cpu --scale 0.002 --epochs 1          # 2 CPU processes, gloo
    python examples/train_ddp.py --dataset Facebook --nproc 1 --device cuda --epochs 5    # a real graph
    python examples/train_ddp.py --backend pyg ...                                        # stock PyG layers

One process per GPU (``torchrun``, or ``--nproc N`` to spawn them here), torch.distributed's
``DistributedDataParallel``: NCCL on GPUs, gloo on CPU. Several hosts: launch ``torchrun --nnodes H
--nproc-per-node G --rdzv-backend c10d --rdzv-endpoint HOST:PORT`` on each; nothing here assumes one host
except the default ``--device cuda:LOCAL_RANK`` placement.

Data: the products-scale realistic graph of :mod:`gnnfuse.graphs` (``community-products``: planted
communities, 2.45M nodes, 61.9M edges at ``--scale 1``) as a node-classification task (47 classes =
community id mod 47; 100 features = the class's centroid plus Gaussian noise, so the graph helps),
or a real graph (``--dataset Cora|CiteSeer|PubMed|Facebook`` from :mod:`gnnfuse.datasets`).

Where the graph lives: every rank holds its own copy of the graph (by target, int32: 4 bytes per
edge) and of the features on its GPU, and samples there (``gnnfuse.loader.NeighborSampler`` on the
device). With ``--device cpu`` and ``--nproc``, the processes share one copy in host shared memory
(torch.multiprocessing passes the tensors by handle) and sample with the C++ sampler.

Schedule: each epoch, one permutation of the training nodes (the same on every rank, from --seed
and the epoch) cut into global batches of ``--batch-size`` seeds; rank r takes its r-th share of
each. The loss is the mean over a rank's seeds and DDP averages gradients over ranks, so N ranks
follow the schedule of one process with the same global batch. Each layer is bipartite: it computes
only the nodes the next layer reads (``gnnfuse.loader.layer_csrs``).

Throughput (the default): nothing waits for the device inside a step except the sampler's one
read of the hop sizes, DDP overlaps its all-reduce with the backward, and losses stay on the device
until the epoch ends. ``--prefetch`` samples the next batches in a background thread on a side CUDA
stream (on an H200 it gained nothing: the step is bound by host time, which the GIL serialises). ``--split`` instead times each
phase with the device synchronised between phases (slower overall): sampling, feature gather,
graph prep (the per-layer CSRs), forward (with the loss), backward, all-reduce (a DDP
communication hook runs each bucket's all-reduce synchronously; ``--overlap`` keeps DDP's overlap
and reports backward + all-reduce together) and optimizer.
``--cuda-graph`` (CUDA): each batch is padded to fixed per-hop sizes and the whole step -- graph
prep, forward, loss, backward with DDP's all-reduce, optimizer -- is captured once as a CUDA graph
and replayed (gnnfuse.loader.CapturedStep; the first 11 steps run eagerly, as DDP under capture
asks, and a batch that outgrows the sizes grows them and is captured again). The host then issues
one replay per step instead of some hundred launches, so sampling in a thread (``--prefetch``)
can overlap it. Same batches and losses as without (up to GEMM rounding; dropout draws differ).
Warm-up and capture run on the stream DDP was built on (PyTorch's recipe for capturing a whole DDP
step). ``--sampler-graph`` replays the sampler's hops from a CUDA graph too
(gnnfuse.loader.CapturedSampler; the same batches): its ~100 launches per batch were the critical
path at 512 seeds per GPU. ``--timeline`` records each rank's step split without syncs (host clocks,
CUDA events; see :class:`Timeline`). ``--sampler-graph`` is on by default with ``--cuda-graph``.
Reported by rank 0 (JSON and markdown under ``--out``): seeds/s, epoch time, the split, test accuracy
after the fixed number of epochs (test seeds sampled like training ones, shared out over ranks),
peak GPU memory per rank. Rank 0 saves a checkpoint (``--checkpoint``).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

if __name__ in ("__main__", "__mp_main__"):  # run from a checkout without installing (spawned ranks too)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gnnfuse import config  # noqa: E402  (torchrun's variables are declared there; after the path set-up)

PHASES = ("sampling", "gather", "graph_prep", "forward", "backward", "allreduce", "optimizer")


# ---- the task -------------------------------------------------------------------------------------
def realistic_task(scale: float, seed: int = 0, device="cpu", num_classes: int = 47, num_features: int = 100,
                   noise: float = 8.0, train_fraction: float = 0.08) -> dict:
    """community-products (gnnfuse.graphs.SUITE) at ``scale`` as node classification."""
    from gnnfuse import graphs

    spec = graphs.SUITE["community-products"]
    n, e = max(64, round(spec.nodes * scale)), max(256, round(spec.edges * scale))
    lo, hi = spec.params["community_size"]
    size = (lo, hi) if n >= 4 * hi else (max(1, n // 16), max(1, n // 8))
    edge_index, community = graphs.planted_communities(n, e, community_size=size, seed=seed, device=device,
                                                       max_degree=max(spec.params["max_degree"], -(-e // n)))
    g = torch.Generator(device).manual_seed(seed + 1)
    y = community % num_classes
    centroids = torch.randn(num_classes, num_features, generator=g, device=device)
    x = centroids[y] + noise * torch.randn(n, num_features, generator=g, device=device)
    order = torch.randperm(n, generator=g, device=device)
    n_train = max(1, int(train_fraction * n))
    return dict(name=f"community-products@{scale:g}", edge_index=edge_index, num_nodes=n, x=x, y=y,
                train=order[:n_train].sort().values, test=order[n_train:].sort().values, num_classes=num_classes)


def dataset_task(name: str, seed: int = 0) -> dict:
    from gnnfuse import datasets

    data = datasets.load_facebook(seed=seed, sparse_features=False) if name == "Facebook" \
        else datasets.load_planetoid(name)
    if data is None:
        raise SystemExit(datasets.missing_message(name))
    return dict(name=name, edge_index=data.edge_index, num_nodes=data.num_nodes, x=data.x.float(), y=data.y,
                train=data.train_mask.nonzero().view(-1), test=data.test_mask.nonzero().view(-1),
                num_classes=int(data.y.max()) + 1)


# ---- the model ------------------------------------------------------------------------------------
class SAGE(torch.nn.Module):
    """GraphSAGE (mean) over bipartite layers: layer l maps the nodes of hops 0..L-l to those of hops 0..L-l-1."""

    def __init__(self, backend: str, dims: list[int], dropout: float):
        super().__init__()
        if backend == "gnnfuse":
            from gnnfuse.nn import SAGEConv
        else:
            from torch_geometric.nn import SAGEConv
        self.convs = torch.nn.ModuleList(SAGEConv(a, b, aggr="mean") for a, b in zip(dims, dims[1:]))
        self.dropout = dropout

    def forward(self, x, graphs, sizes):
        for i, (conv, graph, (num_dst, num_src, _)) in enumerate(zip(self.convs, graphs, sizes)):
            x = conv((x, x[:num_dst]), graph, size=(num_src, num_dst))
            if i < len(self.convs) - 1:
                x = F.dropout(x.relu(), self.dropout, self.training)
        return x


def layer_graphs(backend: str, out, device) -> tuple[list, list]:
    """Per-layer graphs of a sampled batch: gnnfuse CSRs (views of one O(E) build, no sort), or plain
    edge_index prefixes for stock PyG (which needs no preparation)."""
    edge_index = torch.stack([out.row, out.col]).to(device, non_blocking=True)
    return graphs_of(backend, edge_index, out.num_sampled_nodes, out.num_sampled_edges)


def graphs_of(backend: str, edge_index, num_sampled_nodes, num_sampled_edges) -> tuple[list, list]:
    from gnnfuse.loader import layer_csrs, layer_sizes

    sizes = layer_sizes(num_sampled_nodes, num_sampled_edges)
    if backend == "gnnfuse":
        return layer_csrs(edge_index=edge_index, num_sampled_nodes=num_sampled_nodes,  # transposes: with gradients
                          num_sampled_edges=num_sampled_edges, transposes=True), sizes
    return [edge_index[:, :num_edges] for _, _, num_edges in sizes], sizes


def captured_step(ddp, optimizer, backend: str, x, warmup: int, stream):
    """The whole training step on padded batches, captured as a CUDA graph and replayed
    (gnnfuse.loader.CapturedStep): graph prep, forward, loss over the real seeds, backward with
    DDP's all-reduce, optimizer. Warm-up and capture on ``stream``, the one DDP was built on."""
    from gnnfuse.loader import CapturedStep

    def step(xb, yb, edge_index, nodes, edges):
        optimizer.zero_grad(set_to_none=True)
        graphs, sizes = graphs_of(backend, edge_index, nodes, edges)
        loss = F.cross_entropy(ddp(xb, graphs, sizes), yb)  # padded seed slots carry label -100: skipped
        loss.backward()
        optimizer.step()
        return loss.detach()

    return CapturedStep(step, x, warmup=warmup, stream=stream)


# ---- one rank -------------------------------------------------------------------------------------
class Clock:
    """Wall time per phase, the device synchronised at each boundary (``on``), or nothing at all."""

    def __init__(self, device, on: bool = True):
        self.cuda = device.type == "cuda"
        self.on = on
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.t = time.perf_counter()

    def lap(self, phase: str) -> None:
        if not self.on:
            return
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.totals[phase] += now - self.t
        self.t = now


def timed_allreduce_hook(clock: Clock):
    """DDP comm hook: average each gradient bucket now (synchronously), adding the time to the clock."""
    def hook(state, bucket):
        if clock.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        buffer = bucket.buffer().div_(dist.get_world_size())
        dist.all_reduce(buffer)
        if clock.cuda:
            torch.cuda.synchronize()
        clock.totals["allreduce"] += time.perf_counter() - start
        fut = torch.futures.Future()
        fut.set_result(buffer)
        return fut
    return hook


class Timeline:
    """Per-step timings of the captured step's loop without synchronising anything: host clocks
    around each part of the main thread's work, CUDA events on the main stream around the input
    loading and the replay, and the sampler's own (host seconds, events) from :class:`Prefetcher`.
    Read once the epoch is over and the device synchronised: :meth:`medians` (ms per step).
    ``off``: records nothing."""

    def __init__(self, on: bool):
        self.on = on
        self.steps: list[tuple] = []
        self._t = time.perf_counter()

    def start_epoch(self) -> None:
        self.steps = []
        self._t = time.perf_counter()

    def mark(self) -> tuple[float, torch.cuda.Event | None]:
        if not self.on:
            return 0.0, None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return time.perf_counter(), event

    def step(self, marks: list, sampling) -> None:
        if self.on:
            self.steps.append((self._t, marks, sampling))
            self._t = time.perf_counter()

    def medians(self) -> dict:
        """Median ms per step: waiting for the next batch (host), loading it (host / device),
        replaying the step (host / device, which includes DDP's all-reduce and so any wait for the
        other ranks), the main stream idle between steps, and sampling (host / device) in the thread."""
        if not self.steps:
            return {}
        rows = []
        previous_end = None
        for before, ((t0, e0), (t1, e1), (t2, e2)), sampling in self.steps:
            row = dict(wait_host=t0 - before, load_host=t1 - t0, replay_host=t2 - t1,
                       load_device=e0.elapsed_time(e1) / 1e3, replay_device=e1.elapsed_time(e2) / 1e3)
            if previous_end is not None:
                row["main_stream_idle"] = previous_end.elapsed_time(e0) / 1e3
            if sampling is not None:
                row["sample_host"] = sampling[0]
                if len(sampling) == 3:
                    row["sample_device"] = sampling[1].elapsed_time(sampling[2]) / 1e3
            rows.append(row)
            previous_end = e2
        keys = {k for row in rows for k in row}
        return {k: 1000 * statistics.median(row[k] for row in rows if k in row) for k in sorted(keys)}


class Prefetcher:
    """Samples upcoming batches in a background thread on its own CUDA stream while the main thread
    runs the current step: the sampler's host work (kernel launches, its one read of the hop sizes)
    overlaps the step's, and its kernels the step's kernels. In line on CPU or when ``on`` is False.
    Each batch's tensors are recorded on the main stream, so the allocator keeps them until it is done.
    The stream has high priority: the sampler's small kernels are on the host's critical path (it
    waits for the hop sizes), the step's large ones are not. With ``timed``, each batch comes with
    (host seconds of its sampling, CUDA events before and after it on the sampler's stream)."""

    def __init__(self, sample, device, on: bool = True, depth: int = 2, timed: bool = False):
        self.sample, self.device, self.depth, self.timed = sample, device, depth, timed
        self.on = on and device.type == "cuda"

    def _sample_timed(self, sample, seeds, stream=None):
        if not self.timed:
            return sample(seeds), None
        start = time.perf_counter()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if self.device.type == "cuda" else []
        if events:
            events[0].record(stream)
        out = sample(seeds)
        if events:
            events[1].record(stream)
        return out, (time.perf_counter() - start, *events)

    def __call__(self, seed_batches, sample=None):
        """Yields (seeds, batch, timing or None) for each of ``seed_batches``; ``sample``: instead of
        the sampler given at construction."""
        sample = sample or self.sample
        if not self.on:
            yield from ((seeds, *self._sample_timed(sample, seeds)) for seeds in seed_batches)
            return
        import queue
        import threading

        main = torch.cuda.current_stream(self.device)
        made = torch.cuda.Event()
        made.record(main)  # the seeds are the main stream's
        ready: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()

        def work():
            try:
                torch.cuda.set_device(self.device)
                stream = torch.cuda.Stream(self.device, priority=-1)  # high (lower is higher)
                stream.wait_event(made)
                with torch.cuda.stream(stream):
                    for seeds in seed_batches:
                        if stop.is_set():
                            return
                        out, timing = self._sample_timed(sample, seeds, stream)
                        done = torch.cuda.Event()
                        done.record(stream)
                        ready.put((seeds, out, done, timing))
                ready.put(None)
            except BaseException as exc:  # noqa: BLE001  (handed to the main thread, raised there)
                ready.put(exc)

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        try:
            while (item := ready.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                seeds, out, done, timing = item
                main.wait_event(done)
                for t in (out.node, out.row, out.col, out.edge):
                    t.record_stream(main)
                yield seeds, out, timing
        finally:
            stop.set()
            while thread.is_alive():  # unblock a producer waiting on a full queue
                try:
                    ready.get_nowait()
                except queue.Empty:
                    thread.join(0.01)


def worker(rank: int, world: int, args, task: dict | None) -> dict | None:
    from torch.nn.parallel import DistributedDataParallel

    from gnnfuse.loader import NeighborSampler

    cuda = args.device.startswith("cuda")
    local_rank = int(config.get("LOCAL_RANK") or rank)
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    graphed = args.cuda_graph and cuda
    if cuda:
        torch.cuda.set_device(device)
    if graphed:  # NCCL inside a captured graph: torch.cuda.graphs' DDP notes ask for this before init
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            **({"device_id": device} if cuda else {}))
    try:
        if task is None:
            task = build_task(args, device)
        x, y = task["x"].to(device), task["y"].to(device)
        sampler = NeighborSampler(task["edge_index"].to(device), args.fanouts, num_nodes=task["num_nodes"],
                                  seed=args.seed * 1000 + rank, device=device)
        torch.manual_seed(args.seed)  # identical initial weights on every rank (DDP also broadcasts them)
        dims = [x.shape[1]] + [args.hidden] * (len(args.fanouts) - 1) + [task["num_classes"]]
        model = SAGE(args.backend, dims, args.dropout).to(device)
        if graphed:  # built on a side stream, as torch.cuda.graphs' DDP notes ask
            side = torch.cuda.Stream(device)
            with torch.cuda.stream(side):
                ddp = DistributedDataParallel(model, device_ids=[local_rank])
            torch.cuda.current_stream(device).wait_stream(side)
        else:
            ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
        clock = Clock(device, on=args.split)
        if args.split and not args.overlap:
            ddp.register_comm_hook(None, timed_allreduce_hook(clock))
        timeline = Timeline(on=args.timeline and graphed)
        prefetch = Prefetcher(sampler.sample, device, on=args.prefetch and not args.split, timed=timeline.on)
        # fused: one launch per step; capturable: its step count stays on the device (a captured step)
        optimizer = torch.optim.Adam(ddp.parameters(), lr=args.lr, fused=cuda, capturable=graphed)
        graph_step = captured_step(ddp, optimizer, args.backend, x, warmup=11, stream=side) if graphed else None
        train = task["train"].to(device)
        per_rank = args.batch_size // world
        sampler_graph = None
        if cuda and (args.sampler_graph in ("on", "alternate") or (args.sampler_graph == "auto" and graphed)):
            # the hops replayed from a CUDA graph (same batches)
            from gnnfuse.loader import CapturedSampler

            sampler_graph = CapturedSampler(sampler, per_rank)
        epochs, losses = [], []
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        for epoch in range(args.epochs):
            order = train[torch.randperm(train.numel(), generator=torch.Generator().manual_seed(args.seed + epoch))
                          .to(device)]
            steps = order.numel() // args.batch_size
            if args.max_steps:
                steps = min(steps, args.max_steps)
            clock.totals = dict.fromkeys(PHASES, 0.0)
            ddp.train()
            epoch_losses = []
            # "alternate": the captured sampler in epoch 0 (its capture with the step's) and even epochs
            graph_sampling = sampler_graph is not None and (args.sampler_graph != "alternate" or epoch % 2 == 0)
            sample = sampler_graph.sample if graph_sampling else sampler.sample
            if cuda:
                torch.cuda.synchronize(device)
            start = clock.t = time.perf_counter()
            timeline.start_epoch()
            batches = (order[step * args.batch_size + rank * per_rank:][:per_rank] for step in range(steps))
            for seeds, out, sampling in prefetch(batches, sample):
                if graph_step is not None:  # padded, copied into the static inputs, replayed
                    marks = [timeline.mark()]
                    edge_index = torch.stack([out.row, out.col])
                    graph_step.load(out.node, edge_index, out.num_sampled_nodes, out.num_sampled_edges, y[seeds])
                    marks.append(timeline.mark())
                    epoch_losses.append(graph_step.run())
                    marks.append(timeline.mark())
                    timeline.step(marks, sampling)
                    continue
                clock.lap("sampling")
                xb, yb = x[out.node], y[seeds]
                clock.lap("gather")
                graphs, sizes = layer_graphs(args.backend, out, device)
                clock.lap("graph_prep")
                loss = F.cross_entropy(ddp(xb, graphs, sizes), yb)
                clock.lap("forward")
                optimizer.zero_grad(set_to_none=True)
                before = clock.totals["allreduce"]
                loss.backward()
                clock.lap("backward")
                clock.totals["backward"] -= clock.totals["allreduce"] - before  # the hook's share
                optimizer.step()
                clock.lap("optimizer")
                epoch_losses.append(loss.detach())  # read back once per epoch
                clock.t = time.perf_counter()
            if cuda:
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - start
            if epoch_losses:
                mean_losses = torch.stack(epoch_losses)
                dist.all_reduce(mean_losses)
                losses += (mean_losses / world).tolist()
            timelines = [None] * world
            if timeline.on:
                dist.all_gather_object(timelines, timeline.medians())  # per rank
            epochs.append(dict(epoch=epoch, steps=steps, seconds=seconds,
                               seeds_per_s=steps * args.batch_size / seconds,
                               sampler="graph" if graph_sampling and sampler_graph.capture else "eager",
                               split_ms={k: 1000 * v / max(steps, 1) for k, v in clock.totals.items()}
                               if args.split else {},
                               timeline_ms_per_rank=timelines if timeline.on else []))
        accuracy = evaluate(ddp.module, sampler, x, y, task["test"].to(device), args, rank, world, device)
        memory = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
        memories = [None] * world
        dist.all_gather_object(memories, memory)
        if rank == 0 and args.checkpoint:
            torch.save(ddp.module.state_dict(), args.checkpoint)
        # Teardown in a fixed order. Drain the process group's queue, then free DDP (its reducer,
        # any Python comm hook) while the process group is still registered and idle, then drain
        # again: gloo's worker threads free the last collectives' tensors (which needs the GIL), and
        # freeing the reducer after destroy_process_group() -- at this frame's exit -- made it the
        # group's last owner, so its destructor joined those threads holding the GIL (a deadlock
        # seen in CI).
        dist.barrier()
        prefetched = prefetch.on
        captures = graph_step.captures if graph_step is not None else None
        sampler_captures = sampler_graph.captures if sampler_graph is not None else None
        del ddp, optimizer, prefetch, graph_step, sampler_graph
        gc.collect()
        dist.barrier()
        if rank != 0:
            return None
        return dict(graph=task["name"], num_nodes=task["num_nodes"], num_edges=int(task["edge_index"].shape[1]),
                    world_size=world, backend=args.backend, device=args.device,
                    gpu=torch.cuda.get_device_name(device) if cuda else None, fanouts=args.fanouts,
                    global_batch=args.batch_size, epochs=epochs, losses=losses, test_accuracy=accuracy,
                    peak_memory_gib_per_rank=memories, overlap=args.overlap or not args.split,
                    timing="split (synchronised phases)" if args.split else
                    ("throughput" + (", sampling prefetched in a thread on a side stream" if prefetched else "")
                     + (f", step captured as a CUDA graph (padded batches; {captures} captures)"
                        if captures is not None else "")
                     + (f", sampler hops replayed from a CUDA graph ({args.sampler_graph}; "
                        f"{sampler_captures} captures)" if sampler_captures is not None else "")),
                    torch=torch.__version__,
                    date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    finally:
        dist.destroy_process_group()


@torch.no_grad()
def evaluate(model, sampler, x, y, test, args, rank, world, device) -> float:
    model.eval()
    test = test[: args.eval_nodes] if args.eval_nodes else test
    correct = torch.zeros(2, device=device)
    for seeds in test[rank::world].split(args.batch_size):
        out = sampler.sample(seeds)
        graphs, sizes = layer_graphs(args.backend, out, device)
        pred = model(x[out.node], graphs, sizes).argmax(-1)
        correct += torch.stack([(pred == y[seeds]).sum(), torch.tensor(seeds.numel(), device=device)]).float()
    dist.all_reduce(correct)
    return float(correct[0] / correct[1])


# ---- launch ---------------------------------------------------------------------------------------
def build_task(args, device="cpu") -> dict:
    if args.dataset:
        return dataset_task(args.dataset, args.seed)
    return realistic_task(args.scale, args.seed, device=device, noise=args.noise)


def _spawned(rank, world, args, task_file, port, result_file):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    task = torch.load(task_file, mmap=True) if task_file else None  # one copy, in the shared page cache
    result = worker(rank, world, args, task)
    if result is not None:  # rank 0: hand the result to the launching process through a file
        Path(result_file).write_text(json.dumps(result))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", choices=["Cora", "CiteSeer", "PubMed", "Facebook"], help="a real graph instead")
    ap.add_argument("--scale", type=float, default=1.0, help="of the products-scale realistic graph")
    ap.add_argument("--noise", type=float, default=8.0, help="feature noise of the realistic task (harder: larger)")
    ap.add_argument("--nproc", type=int, default=1, help="processes to spawn when not under torchrun")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--backend", choices=["gnnfuse", "pyg"], default="gnnfuse")
    ap.add_argument("--fanouts", type=lambda s: [int(k) for k in s.split(",")], default=[15, 10, 5])
    ap.add_argument("--batch-size", type=int, default=1024, help="global: seeds per step over all ranks")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=0, help="per epoch (0: the whole training set)")
    ap.add_argument("--eval-nodes", type=int, default=20_000, help="test nodes evaluated (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--split", action="store_true", help="time each phase, synchronising the device between them")
    ap.add_argument("--overlap", action="store_true", help="with --split: keep DDP's all-reduce overlap")
    ap.add_argument("--prefetch", action="store_true", help="sample the next batches in a background thread")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="CUDA: pad each batch to fixed per-hop sizes and replay the captured training step")
    ap.add_argument("--sampler-graph", choices=["auto", "off", "on", "alternate"], default="auto",
                    help="CUDA: replay the sampler's hops from a CUDA graph (gnnfuse.loader.CapturedSampler); "
                         "alternate: in epoch 0 and even epochs, eager sampling in odd ones (both in one run); "
                         "auto: on with --cuda-graph")
    ap.add_argument("--timeline", action="store_true",
                    help="with --cuda-graph: per-rank per-step timings without syncs (host clocks, CUDA events)")
    ap.add_argument("--checkpoint", help="rank 0 saves the model's state_dict here")
    ap.add_argument("--out", help="directory for the JSON and markdown results")
    args = ap.parse_args(argv)
    if args.batch_size % max(args.nproc, int(config.get("WORLD_SIZE") or 1)):
        ap.error("--batch-size must be a multiple of the number of processes")
    if args.cuda_graph and args.split:
        ap.error("--cuda-graph replays the whole step at once: it has no phases to --split")
    return args


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    if config.is_set("WORLD_SIZE"):  # under torchrun: this process is one rank
        result = worker(int(config.get("RANK")), int(config.get("WORLD_SIZE")), args, None)
    else:
        import tempfile

        import torch.multiprocessing as mp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.TemporaryDirectory(dir=shm) as tmp:
            # CPU: the graph is built once here and memory-mapped by every rank (one copy in shared
            # memory); GPU: each rank builds it on its own device
            task_file = ""
            if not args.device.startswith("cuda"):
                task_file = str(Path(tmp) / "task.pt")
                torch.save(build_task(args), task_file)
            result_file = Path(tmp) / "result.json"
            mp.start_processes(_spawned, args=(args.nproc, args, task_file, port, str(result_file)),
                               nprocs=args.nproc, start_method="spawn")
            result = json.loads(result_file.read_text())
    if result is not None:
        report(result, args.out)
    return result


def report(result: dict, out: str | None) -> None:
    last = result["epochs"][-1]
    lines = [f"# DDP mini-batch SAGE: {result['graph']}, {result['world_size']} x {result['gpu'] or 'CPU'}",
             "", f"{result['date']}, torch {result['torch']}, backend {result['backend']}, fan-outs "
             f"{result['fanouts']}, global batch {result['global_batch']}; timing: {result['timing']}", "",
             "| epoch | sampler | steps | seconds | seeds/s |", "|---|---|---|---|---|"]
    lines += [f"| {e['epoch']} | {e.get('sampler', 'eager')} | {e['steps']} | {e['seconds']:.2f} "
              f"| {e['seeds_per_s']:.0f} |" for e in result["epochs"]]
    timed = [e for e in result["epochs"] if e.get("timeline_ms_per_rank")]
    if timed:
        keys = sorted({k for e in timed for r in e["timeline_ms_per_rank"] for k in r})
        lines += ["", "Per-step timeline, median ms (no syncs; device = CUDA events; replay includes DDP's "
                  "all-reduce):", "", "| epoch | rank | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
        lines += [f"| {e['epoch']} | {rank} | " + " | ".join(f"{r[k]:.3f}" if k in r else "" for k in keys) + " |"
                  for e in timed for rank, r in enumerate(e["timeline_ms_per_rank"])]
    if last["split_ms"]:
        lines += ["", "Step split (ms, last epoch): " + ", ".join(f"{k} {v:.2f}" for k, v in last["split_ms"].items())]
    lines += ["", f"Test accuracy after {len(result['epochs'])} epochs of {last['steps']} steps: "
              f"{result['test_accuracy']:.4f}",
              f"Peak GPU memory per rank (GiB): {result['peak_memory_gib_per_rank']}"]
    text = "\n".join(lines)
    print(text, flush=True)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        stem = f"ddp_{result['backend']}_{result['world_size']}x"
        (Path(out) / f"{stem}.json").write_text(json.dumps(result, indent=1))
        (Path(out) / f"{stem}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
