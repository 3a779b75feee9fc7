"""Mini-batch training: the sorted-input CSR, the neighbour sampler's invariants and distribution,
and fused layers on sampled batches against PyG's layers on the same batches."""
import pytest
import torch

pytest.importorskip("torch_geometric")
from torch_geometric.data import Data  # noqa: E402

import gnnfuse  # noqa: E402
from gnnfuse import CSR  # noqa: E402
from gnnfuse.loader import NeighborLoader, NeighborSampler, layer_csrs, layer_sizes  # noqa: E402

N, E = 300, 3000


def graph(seed=0, n=N, e=E):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, n, (2, e), generator=g)
    return Data(edge_index=edge_index, num_nodes=n, x=torch.randn(n, 6, generator=g), y=torch.randint(0, 3, (n,), generator=g))


def samplers(data, fanouts, **kwargs):
    """The C++ kernel, the torch-ops implementation and the GPU's (torch ops with the Triton picks,
    here under the Triton interpreter), all on CPU."""
    cpp = NeighborSampler(data, fanouts, **kwargs)
    assert cpp._ext is not None
    torch_ops = NeighborSampler(data, fanouts, **kwargs)
    torch_ops._ext = None
    triton_picks = NeighborSampler(data, fanouts, **kwargs)
    triton_picks._ext, triton_picks.picks = None, "triton"
    return {"cpp": cpp, "torch": torch_ops, "triton": triton_picks}


# the Triton picks run here on CPU tensors, which needs the interpreter (no GPU: tests/conftest.py sets it)
IMPLS = ["cpp", "torch"] + (["triton"] if not torch.cuda.is_available() else [])


# ---- CSR from a target-sorted edge_index ----------------------------------------------------------
def test_from_sorted_edge_index_matches_the_sorting_build():
    ei = graph().edge_index
    ei = ei[:, torch.argsort(ei[1], stable=True)]
    a, b = CSR.from_sorted_edge_index(ei, (N, N)), CSR.from_edge_index(ei, (N, N))
    for name in ("rowptr", "col", "perm"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    bipartite = CSR.from_sorted_edge_index(ei[:, ei[1] < 40], (N, 40))
    assert bipartite.num_dst == 40 and bipartite.num_src == N and bipartite.num_edges == int((ei[1] < 40).sum())


def test_from_sorted_edge_index_on_cpu_sorts_unsorted_input_and_checks_ranges():
    ei = torch.tensor([[0, 1, 2], [1, 0, 2]])
    csr = CSR.from_sorted_edge_index(ei, 3)  # CPU: the counting sort runs anyway, so this is still right
    assert csr.rowptr.tolist() == [0, 1, 2, 3] and csr.perm.tolist() == [1, 0, 2]
    with pytest.raises(gnnfuse.IndexOutOfRange, match="sources"):
        CSR.from_sorted_edge_index(torch.tensor([[0, 5], [0, 1]]), (3, 3))
    with pytest.raises(gnnfuse.IndexOutOfRange, match="targets"):
        CSR.from_sorted_edge_index(torch.tensor([[0, 1], [0, 3]]), (3, 3))
    assert CSR.from_sorted_edge_index(torch.empty(2, 0, dtype=torch.long), (3, 2)).rowptr.tolist() == [0, 0, 0]


def test_sorted_edge_index_is_not_modified_and_edge_index_type_is_reused():
    from torch_geometric import EdgeIndex

    ei = torch.tensor([[2, 0, 1, 2], [0, 1, 1, 2]])
    before = ei.clone()
    x = torch.randn(3, 4, requires_grad=True)
    wrapped = EdgeIndex(ei, sparse_size=(3, 3), sort_order="col")
    out = gnnfuse.fused_gather_scatter(x, wrapped, "mean")
    ref = gnnfuse.fused_gather_scatter(x, ei, "mean", backend="reference")
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    assert torch.equal(ei, before)


# ---- the sampler ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fanouts", [[4, 3, 2], [4, 3, -1]], ids=["padded", "all-neighbours"])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("impl", IMPLS)
def test_sampler_invariants(impl, replace, fanouts):
    if replace and -1 in fanouts:
        pytest.skip("fan-out -1 takes every neighbour: nothing to replace")
    data = graph()
    sampler = samplers(data, fanouts, replace=replace, seed=3)[impl]
    seeds = torch.randperm(N)[:20]
    out = sampler.sample(seeds)
    node, row, col, edge = out.node, out.row, out.col, out.edge
    assert torch.equal(node[:20], seeds)
    assert node.unique().numel() == node.numel()  # non-disjoint: each node once
    assert sum(out.num_sampled_nodes) == node.numel() and sum(out.num_sampled_edges) == row.numel()
    assert (col[1:] >= col[:-1]).all()  # target-sorted as a whole
    ei = data.edge_index
    original = sampler.edge_permutation[edge]  # every sampled edge exists, with its original id
    assert torch.equal(ei[0][original], node[row]) and torch.equal(ei[1][original], node[col])
    in_degree = torch.bincount(ei[1], minlength=N)
    start = 0
    begin, end = 0, out.num_sampled_nodes[0]
    for hop, (fanout, count) in enumerate(zip(fanouts, out.num_sampled_edges)):
        hop_col, hop_edge = col[start:start + count], edge[start:start + count]
        assert ((hop_col >= begin) & (hop_col < end)).all()  # hop k targets = nodes hop k - 1 added
        per_target = torch.bincount(hop_col - begin, minlength=end - begin)
        degree = in_degree[node[begin:end]]
        if fanout < 0:
            expected = degree
        elif replace:
            expected = torch.where(degree > 0, fanout, 0)
        else:
            expected = degree.clamp(max=fanout)
        assert torch.equal(per_target, expected)
        if not replace:  # no edge twice
            assert hop_edge.unique().numel() == hop_edge.numel()
        # the sources of hop k are known nodes or the nodes hop k adds
        assert (row[start:start + count] < end + out.num_sampled_nodes[hop + 1]).all()
        start += count
        begin, end = end, end + out.num_sampled_nodes[hop + 1]


@pytest.mark.parametrize("impl", IMPLS)
def test_sampler_is_reproducible(impl):
    data = graph()
    seeds = torch.arange(30)
    a = samplers(data, [5, 5], seed=7)[impl]
    b = samplers(data, [5, 5], seed=7)[impl]
    c = samplers(data, [5, 5], seed=8)[impl]
    first = [a.sample(seeds) for _ in range(2)]
    second = [b.sample(seeds) for _ in range(2)]
    for x, y in zip(first, second):
        assert torch.equal(x.node, y.node) and torch.equal(x.row, y.row) and torch.equal(x.edge, y.edge)
    assert not torch.equal(first[0].edge, first[1].edge)  # successive batches differ
    assert not torch.equal(first[0].edge, c.sample(seeds).edge)


def test_cpp_sampler_does_not_depend_on_thread_count():
    data = graph(n=3000, e=60_000)
    seeds = torch.arange(0, 3000, 7)
    outs = []
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            outs.append(NeighborSampler(data, [10, 10], seed=1).sample(seeds))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0].node, outs[1].node) and torch.equal(outs[0].row, outs[1].row)


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("impl", IMPLS)
def test_sampler_is_uniform(impl, replace):
    """A star: node 0 has 10 in-neighbours; fan-out 3, 4000 draws: each neighbour is taken with
    probability 0.3 (without replacement) or 3 / 10 per draw slot on average (with)."""
    ei = torch.stack([torch.arange(1, 11), torch.zeros(10, dtype=torch.long)])
    sampler = samplers(Data(edge_index=ei, num_nodes=11), [3], replace=replace, seed=0)[impl]
    counts = torch.zeros(11)
    draws = 4000
    calls = 1 if impl == "triton" else draws  # (the interpreter: one call with node 0 as seed 4000 times)
    seeds = torch.zeros(draws // calls, dtype=torch.long)
    for _ in range(calls):
        out = sampler.sample(seeds)
        counts.index_add_(0, out.node[out.row], torch.ones(out.row.numel()))
    freq = counts[1:] / draws
    assert (freq - 0.3).abs().max() < 0.04, freq  # about 5 standard deviations


def test_disjoint_sampling():
    data = graph()
    sampler = NeighborSampler(data, [4, 3], disjoint=True, seed=0)
    seeds = torch.tensor([5, 5, 17])  # a repeated seed gets its own tree
    out = sampler.sample(seeds)
    assert torch.equal(out.batch[:3], torch.arange(3))
    assert (out.batch[out.row] == out.batch[out.col]).all()  # no edge between trees
    pairs = out.batch * N + out.node
    assert pairs.unique().numel() == pairs.numel()  # each (tree, node) once
    assert (out.col[1:] >= out.col[:-1]).all()
    original = sampler.edge_permutation[out.edge]
    assert torch.equal(data.edge_index[0][original], out.node[out.row])
    assert torch.equal(data.edge_index[1][original], out.node[out.col])


def test_sampler_rejects_bad_arguments():
    data = graph()
    with pytest.raises(NotImplementedError, match="subgraph_type"):
        NeighborSampler(data, [2], subgraph_type="induced")
    with pytest.raises(ValueError, match="num_neighbors"):
        NeighborSampler(data, [-2])
    with pytest.raises(ValueError, match="seed nodes"):
        NeighborSampler(data, [2]).sample(torch.tensor([N]))


def test_loader_covers_every_seed_once_per_epoch():
    data = graph()
    train = torch.arange(0, N, 3)
    loader = NeighborLoader(data, [3, 2], input_nodes=train, batch_size=32, shuffle=True, seed=0)
    seen = torch.cat([b.n_id[:b.batch_size] for b in loader])
    assert torch.equal(seen.sort().values, train)
    batch = next(iter(loader))
    from torch_geometric import EdgeIndex
    assert isinstance(batch.edge_index, EdgeIndex) and batch.edge_index.sort_order == "col"
    torch.testing.assert_close(batch.x, data.x[batch.n_id])


# ---- layers on sampled batches ----------------------------------------------------------------------
def test_layer_sizes_follow_the_hops():
    assert layer_sizes([2, 5, 9], [6, 12]) == [(7, 16, 18), (2, 7, 6)]


@pytest.mark.parametrize("aggr", ["mean", "max", "sum"])
def test_sage_on_sampled_batches_matches_pyg(aggr):
    from torch_geometric.nn import SAGEConv as PygSAGE

    from gnnfuse.nn import SAGEConv

    data = graph()
    loader = NeighborLoader(data, [4, 3], batch_size=24, seed=1, shuffle=True, as_edge_index=False)
    batch = next(iter(loader))
    torch.manual_seed(0)
    ours = torch.nn.ModuleList([SAGEConv(6, 8, aggr=aggr), SAGEConv(8, 3, aggr=aggr)])
    theirs = torch.nn.ModuleList([PygSAGE(6, 8, aggr=aggr), PygSAGE(8, 3, aggr=aggr)])
    theirs.load_state_dict(ours.state_dict())

    def run(model, graphs, sizes):
        x = batch.x
        for conv, g, (num_dst, num_src, _) in zip(model, graphs, sizes):
            x = conv((x, x[:num_dst]), g, size=(num_src, num_dst)).relu()
        return x

    sizes = layer_sizes(batch.num_sampled_nodes, batch.num_sampled_edges)
    csrs = layer_csrs(batch)
    plain = [batch.edge_index[:, :num_edges] for _, _, num_edges in sizes]
    out_ours, out_theirs = run(ours, csrs, sizes), run(theirs, plain, sizes)
    assert out_ours.shape == (24, 3)
    torch.testing.assert_close(out_ours, out_theirs)
    out_ours.square().sum().backward()
    out_theirs.square().sum().backward()
    for p, q in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert csrs[1]._derived.get("transpose") is not None  # the second layer's input needs a gradient
    assert csrs[0]._derived.get("transpose") is None  # the first layer's (raw features) does not


def test_trim_to_layer_with_sorted_edge_index_takes_the_fused_path(monkeypatch):
    from torch_geometric.nn import SAGEConv as PygSAGE
    from torch_geometric.utils import trim_to_layer

    from gnnfuse import csr as csr_module
    from gnnfuse.nn import SAGEConv

    data = graph()
    batch = next(iter(NeighborLoader(data, [4, 3], batch_size=16, seed=2)))
    torch.manual_seed(0)
    ours = torch.nn.ModuleList([SAGEConv(6, 8), SAGEConv(8, 3)])
    theirs = torch.nn.ModuleList([PygSAGE(6, 8), PygSAGE(8, 3)])
    theirs.load_state_dict(ours.state_dict())
    from gnnfuse.ops.coo_to_csr import coo_to_csr as real
    sorts = []
    monkeypatch.setattr(csr_module, "coo_to_csr", lambda *a, **k: sorts.append(1) or real(*a, **k))

    def run(model, edge_index):
        x = batch.x
        for layer, conv in enumerate(model):
            x, edge_index, _ = trim_to_layer(layer, batch.num_sampled_nodes, batch.num_sampled_edges, x, edge_index)
            x = conv(x, edge_index)
        return x[:16]

    with torch.no_grad():  # (with gradients, the second layer's transpose is a sort by source)
        out = run(ours, batch.edge_index)
    assert not sorts  # sorted by target already: no sort by target
    ref = run(theirs, batch.edge_index.as_tensor())
    torch.testing.assert_close(out, ref)


# ---- the DDP example ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_ddp_example_two_gloo_processes_match_one(tmp_path):
    """2 CPU processes (gloo, launched as torchrun would: RANK / WORLD_SIZE / MASTER_* in the
    environment) follow the loss curve of 1 process over the same global batches: full
    neighbourhoods (fan-out -1) and no dropout make each seed's prediction independent of how the
    batch is shared out, so only the summation order differs."""
    import json
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    losses = {}
    for world in (1, 2):
        out = tmp_path / str(world)
        cmd = [sys.executable, str(root / "examples" / "train_ddp.py"), "--device", "cpu", "--scale", "0.0005",
               "--fanouts=-1,-1", "--hidden", "16", "--dropout", "0", "--batch-size", "32", "--epochs", "1",
               "--max-steps", "3", "--eval-nodes", "64", "--split", "--out", str(out)]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ranks = []
        for rank in range(world):
            env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       PYTHONFAULTHANDLER="1")  # a rank stopped with SIGABRT writes every thread's stack
            log = open(tmp_path / f"rank{rank}_of_{world}.log", "w")
            ranks.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        deadline = time.monotonic() + 150
        try:
            while time.monotonic() < deadline and any(proc.poll() is None for proc, _ in ranks):
                time.sleep(0.2)
        finally:
            for proc, log in ranks:  # a rank still running (a hang) is stopped: its log shows where
                if proc.poll() is None:
                    proc.send_signal(signal.SIGABRT)
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
                log.close()
        rcs = [proc.returncode for proc, _ in ranks]
        for rank, rc in enumerate(rcs):
            assert rc == 0, f"rank {rank} of {world}: exit {rc}\n" + Path(ranks[rank][1].name).read_text()[-3000:]
        result = json.loads((out / f"ddp_gnnfuse_{world}x.json").read_text())
        assert result["world_size"] == world and len(result["losses"]) == 3
        assert set(result["epochs"][0]["split_ms"]) >= {"sampling", "gather", "graph_prep", "forward", "backward",
                                                         "allreduce", "optimizer"}
        losses[world] = result["losses"]
    torch.testing.assert_close(torch.tensor(losses[2]), torch.tensor(losses[1]), rtol=1e-4, atol=1e-5)


# ---- CUDA (run on a GPU host) ---------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_sampler_and_fused_sage_on_sampled_batch():
    from torch_geometric.nn import SAGEConv as PygSAGE

    from gnnfuse.nn import SAGEConv

    data = graph(n=5000, e=80_000)
    sampler = NeighborSampler(data.edge_index.cuda(), [6, 4], num_nodes=5000, seed=0, device="cuda")
    seeds = torch.randperm(5000)[:128].cuda()
    out = sampler.sample(seeds)
    assert sampler.picks == "auto"  # the Triton picks ran (no fallback to torch ops)
    assert out.node.is_cuda and torch.equal(out.node[:128], seeds)
    assert (out.col[1:] >= out.col[:-1]).all() and out.node.unique().numel() == out.node.numel()
    original = sampler.edge_permutation[out.edge]
    ei = data.edge_index.cuda()
    assert torch.equal(ei[0][original], out.node[out.row]) and torch.equal(ei[1][original], out.node[out.col])
    x = data.x.cuda()[out.node]
    sizes = layer_sizes(out.num_sampled_nodes, out.num_sampled_edges)
    edge_index = torch.stack([out.row, out.col])
    torch.manual_seed(0)
    ours = torch.nn.ModuleList([SAGEConv(6, 16), SAGEConv(16, 3)]).cuda()
    theirs = torch.nn.ModuleList([PygSAGE(6, 16), PygSAGE(16, 3)]).cuda()
    theirs.load_state_dict(ours.state_dict())
    results = []
    for model in (ours, theirs, ours):
        for p in model.parameters():
            p.grad = None
        # the fused step on a sampled batch (the fresh-graph route) never waits for the device: graph prep,
        # forward and backward under CUDA's sync check (after a first step, so that Triton has compiled)
        check = model is ours and len(results) == 2
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error" if check else "default")
        try:
            graphs = (layer_csrs(edge_index=edge_index, num_sampled_nodes=out.num_sampled_nodes,
                                 num_sampled_edges=out.num_sampled_edges) if model is ours
                      else [edge_index[:, :e] for _, _, e in sizes])
            h = x
            for conv, g, (d, s, _) in zip(model, graphs, sizes):
                h = conv((h, h[:d]), g, size=(s, d)).relu()
            h.square().sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        results.append((h, [p.grad for p in model.parameters()]))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-4, atol=1e-4)
    for a, b in zip([results[0][0], *results[0][1]], [results[2][0], *results[2][1]]):
        assert torch.equal(a, b)  # the fresh route is atomic-free: the same bits step after step
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_hop_prefix_rejects_a_prefix_that_is_not_one():
    ei = torch.tensor([[1, 2, 0, 2], [0, 0, 1, 2]])
    csr = CSR.from_sorted_edge_index(ei, 3)
    assert csr.hop_prefix(2, 3, 3).num_edges == 3
    with pytest.raises(ValueError, match="hop_prefix"):
        csr.hop_prefix(1, 3, 3)  # row 0 holds 2 edges, not 3
    with pytest.raises(ValueError, match="hop_prefix"):
        csr.hop_prefix(1, 2, 2)  # a source (2) beyond num_src
    with pytest.raises(ValueError, match="hop_prefix"):
        CSR.from_edge_index(torch.tensor([[1, 0], [1, 0]]), 2).hop_prefix(1, 2, 1)  # perm not the identity


def test_device_paths_of_the_sorted_build_checked_on_cpu_tensors():
    """The CUDA-only code (device-side assertions, binary-search rowptr) run on CPU tensors."""
    from gnnfuse import csr as csr_module
    from torch_geometric import EdgeIndex

    ei = torch.tensor([[2, 0, 1, 2], [0, 1, 1, 2]])
    wrapped = EdgeIndex(ei, sparse_size=(3, 3), sort_order="col")
    (colptr, row), _ = wrapped.get_csc()
    csr = csr_module._col_sorted_csr(colptr, row, ei[1], 3, 3)
    ref = CSR.from_edge_index(ei, 3)
    assert csr.rowptr.tolist() == ref.rowptr.tolist() and csr.col.tolist() == ref.col.tolist()
    with pytest.raises(RuntimeError, match="not sorted"):
        csr_module.check_sorted_by_target(ei[0], ei[1].flip(0), 3, 3)
    with pytest.raises(RuntimeError, match="sources"):
        csr_module.check_sorted_by_target(ei[0] + 5, ei[1], 3, 3)


# ---- the fresh-graph route (graphs used once: no per-graph planning, no host sync) -----------------
@pytest.mark.parametrize("order", ["degree", "id"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_fresh_graph_route_matches_the_reference(monkeypatch, order, reduce):
    """Every layer of a sampled batch (and, for sum/mean, its transpose in the backward) takes the
    fresh route under the Triton interpreter, and matches the reference, forward and backward; a
    hub row far longer than the planner's short rows included."""
    from gnnfuse.fresh_graph import is_fresh
    from gnnfuse import fresh_graph
    from gnnfuse.triton import gather_scatter as tgs

    monkeypatch.setattr(fresh_graph, "FRESH_ROW_ORDER", order)
    taken = []
    real = tgs._fresh_setup
    monkeypatch.setattr(tgs, "_fresh_setup", lambda rowptr, *a: taken.append(rowptr.numel() - 1) or real(rowptr, *a))
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # (on CPU tensors: the interpreter)
    data = graph(n=60, e=500)
    out = NeighborSampler(data.edge_index.to(dev), [4, 3], num_nodes=60, seed=0, device=dev).sample(torch.arange(6))
    csrs = layer_csrs(edge_index=torch.stack([out.row, out.col]), num_sampled_nodes=out.num_sampled_nodes,
                      num_sampled_edges=out.num_sampled_edges)
    hub = torch.stack([torch.arange(90) % 30, torch.zeros(90, dtype=torch.long)])  # row 0: 90 edges
    csrs.append(CSR.from_sorted_edge_index(torch.cat([hub, torch.tensor([[3], [1]])], 1).to(dev), (30, 2)))
    g = torch.Generator().manual_seed(0)
    for csr in csrs:
        assert is_fresh(csr.rowptr)
        x = torch.randn(csr.num_src, 5, generator=g, dtype=torch.float64).to(dev).requires_grad_()
        grad = torch.randn(csr.num_dst, 5, generator=g, dtype=torch.float64).to(dev)
        results = []
        for backend in ("triton", "reference"):
            y = gnnfuse.fused_gather_scatter(x, csr, reduce, backend=backend)
            results.append((y, torch.autograd.grad(y, x, grad)[0]))
        torch.testing.assert_close(results[0][0], results[1][0])
        torch.testing.assert_close(results[0][1], results[1][1])
    per_layer = 2 if reduce in ("sum", "mean") else 1  # forward, and the backward over the transpose
    assert len(taken) == per_layer * len(csrs)


def test_graphs_built_to_be_reused_are_not_fresh_and_the_unchecked_transpose_matches():
    from gnnfuse.fresh_graph import is_fresh, unchecked_transpose
    from gnnfuse.ops.coo_to_csr import coo_to_csr

    csr = CSR.from_edge_index(graph().edge_index, N)
    assert not is_fresh(csr.rowptr)
    ei = torch.tensor([[1, 2, 0, 2], [0, 0, 1, 2]])
    assert not is_fresh(CSR.from_sorted_edge_index(ei, 3, fresh=False).rowptr)
    assert is_fresh(CSR.from_sorted_edge_index(ei, 3).rowptr)
    for dtype in (torch.int32, torch.int64):
        c = CSR.from_edge_index(graph(1).edge_index, (N, 40 + N), index_dtype=dtype)
        got, want = unchecked_transpose(c.rowptr, c.col, N), coo_to_csr(c.col, c.row(), N, 40 + N)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a, b)


# ---- padded batches and the captured step ----------------------------------------------------------
def _sage_step(model, optimizer, dropout=0.0):
    """One training step of a bipartite SAGE stack on a sampled batch (what CapturedStep replays)."""
    import torch.nn.functional as F

    def step(x, y, edge_index, nodes, edges):
        optimizer.zero_grad(set_to_none=True)
        graphs = layer_csrs(edge_index=edge_index, num_sampled_nodes=nodes, num_sampled_edges=edges)
        h = x
        for i, (conv, g, (d, s, _)) in enumerate(zip(model, graphs, layer_sizes(nodes, edges))):
            h = conv((h, h[:d]), g, size=(s, d))
            if i < len(model) - 1:
                h = F.dropout(h.relu(), dropout, model.training)
        loss = F.cross_entropy(h, y)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


def _sage_pair(dev, width=6):
    from gnnfuse.nn import SAGEConv

    torch.manual_seed(0)
    models = [torch.nn.ModuleList([SAGEConv(width, 16), SAGEConv(16, 16), SAGEConv(16, 3)]).to(dev) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    optims = [torch.optim.Adam(m.parameters(), lr=0.01, capturable=dev != "cpu") for m in models]
    return models, optims


def _compare_padded_with_plain(dev, capture, steps=5, margin=0.0):
    """Steps on plain batches against the same steps through CapturedStep (padded, captured or not):
    the same losses and parameters step after step. margin=0 makes later batches outgrow the first's
    capacities, so the capacities grow (and, captured, the step is captured again)."""
    from gnnfuse.loader import CapturedStep, HopPadding

    data = graph(n=400, e=4000)
    x, y = data.x.to(dev), data.y.to(dev)
    sampler = NeighborSampler(data.edge_index.to(dev), [4, 3, 2], num_nodes=400, seed=0, device=dev)
    (plain, padded), (opt_plain, opt_padded) = _sage_pair(dev)
    captured = CapturedStep(_sage_step(padded, opt_padded), x, capture=capture, warmup=2,
                            padding=HopPadding(margin=margin, granule=8))
    step = _sage_step(plain, opt_plain)
    g = torch.Generator().manual_seed(1)
    for i in range(steps):
        seeds = torch.randperm(400, generator=g)[: 24 + 4 * min(i, 3)].to(dev)  # growing batches, then steady
        out = sampler.sample(seeds)
        edge_index = torch.stack([out.row, out.col])
        want = step(x[out.node], y[seeds], edge_index, out.num_sampled_nodes, out.num_sampled_edges)
        got = captured(out.node, edge_index, out.num_sampled_nodes, out.num_sampled_edges, y[seeds])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for a, b in zip(padded.parameters(), plain.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    return captured


def test_padded_batches_train_like_plain_ones():
    captured = _compare_padded_with_plain("cpu", capture=False)
    assert captured.captures == 0 and captured.padding.node_caps[0] > 24  # grew with the batches
    ei = torch.tensor([[1, 2, 3, 3], [0, 0, 1, 2]])  # 1 seed; hop 1: nodes 1, 2 (3 edges); hop 2: node 3
    from gnnfuse.loader import HopPadding

    p = HopPadding(margin=0.0, granule=4)
    assert not p.fits([1, 2, 1], [2, 2])
    p.grow([1, 2, 1], [2, 2])
    assert p.node_caps == [4, 4, 4] and p.edge_caps == [4, 4]
    ei = torch.tensor([[1, 2, 3, 3], [0, 0, 1, 2]])
    padded_ei, node = p.pad(ei, torch.tensor([10, 11, 12, 13]), [1, 2, 1], [2, 2])
    # hop 1 edges (to the seed block 0..3): real, then padding from hop 1's dummy slots 6, 7 spread over the
    # seed block's dummy slots 1..3; hop 2 (to block 4..7): real, then from dummy slots 9, 10 to 6, 7
    assert padded_ei.tolist() == [[4, 5, 6, 7, 8, 8, 9, 10], [0, 0, 1, 2, 4, 5, 6, 7]]
    assert node.tolist() == [10, 0, 0, 0, 11, 12, 0, 0, 13, 0, 0, 0]
    with pytest.raises(ValueError, match="does not fit"):
        p.pad(ei, torch.arange(4), [1, 4, 1], [2, 2])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_step_replays_the_eager_step_on_cuda():
    captured = _compare_padded_with_plain("cuda", capture=True, steps=10)
    assert captured.captures >= 1 and captured.capture  # captured (and not fallen back to eager)


def test_sampled_layer_csrs_kernel_matches_the_cpu_build_and_checks_everything():
    """The GPU's four-launch build of a batch's layer CSRs (one Triton check kernel; without a GPU on
    CPU tensors under the interpreter): the same CSRs as the CPU path, and every kind of bad batch
    caught (checked on CPU only: a failed device-side assertion ends the CUDA context)."""
    from gnnfuse.loader._triton_batch import sampled_layer_csrs

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    data = graph(n=200, e=2000)
    out = NeighborSampler(data, [4, 3, 2], seed=0).sample(torch.arange(10))
    ei = torch.stack([out.row, out.col])
    sizes = layer_sizes(out.num_sampled_nodes, out.num_sampled_edges)
    n = sum(out.num_sampled_nodes)
    want = layer_csrs(edge_index=ei, num_sampled_nodes=out.num_sampled_nodes, num_sampled_edges=out.num_sampled_edges)
    got = sampled_layer_csrs(ei.to(dev), n, sizes, torch.int32)
    for a, b in zip(got, want):
        assert (a.num_src, a.num_dst, a.num_edges) == (b.num_src, b.num_dst, b.num_edges)
        for t, u in ((a.rowptr, b.rowptr), (a.col, b.col), (a.perm, b.perm)):
            assert t.dtype == torch.int32 and torch.equal(t.cpu(), u.to(torch.int32))
    if dev == "cuda":
        return
    d1, s1, e1 = sizes[-1]
    bad = {"unsorted": ei.flip(1), "source out of range": ei + torch.tensor([[n], [0]]),
           "not a prefix": ei}
    for name, edges in bad.items():
        layers = sizes if name != "not a prefix" else [*sizes[:-1], (d1, s1, e1 - 1)]
        with pytest.raises(RuntimeError, match="not a target-sorted sampled batch"):
            sampled_layer_csrs(edges, n, layers, torch.int64)
    with pytest.raises(RuntimeError, match="not a target-sorted sampled batch"):  # a source beyond its layer's bound
        sampled_layer_csrs(ei, n, [*sizes[:-1], (d1, s1 - 1, e1)], torch.int64)


def test_nested_transposes_match_each_layers_own():
    """The transposes of a batch's layers from one sort (the GPU build, here under the interpreter)
    are each layer's own transpose, bit for bit; layer_csrs(transposes=True) builds them up front."""
    from gnnfuse.loader._triton_batch import sampled_layer_csrs

    data = graph(n=200, e=2000)
    out = NeighborSampler(data, [4, 3, 2], seed=1).sample(torch.arange(12))
    ei = torch.stack([out.row, out.col])
    sizes = layer_sizes(out.num_sampled_nodes, out.num_sampled_edges)
    want = layer_csrs(edge_index=ei, num_sampled_nodes=out.num_sampled_nodes, num_sampled_edges=out.num_sampled_edges)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for dtype in (torch.int32, torch.int64):
        got = sampled_layer_csrs(ei.to(dev), sum(out.num_sampled_nodes), sizes, dtype, transposes=[0, 1, 2])
        for a, b in zip(got, want):
            assert "transpose" in a._derived
            for t, u in zip(a.transpose_parts(), b.transpose_parts()):
                assert t.dtype == dtype and torch.equal(t.cpu(), u.to(dtype))
    eager = layer_csrs(edge_index=ei, num_sampled_nodes=out.num_sampled_nodes, num_sampled_edges=out.num_sampled_edges,
                       transposes=True)
    assert ["transpose" in c._derived for c in eager] == [False, True, True]


def test_padding_kernels_match_the_torch_ops():
    """HopPadding's GPU path (two Triton kernels; without a GPU under the interpreter) writes the same
    padded batch as its CPU path (torch ops), and the padded batch is a valid target-sorted batch."""
    from gnnfuse.loader import HopPadding
    from gnnfuse.loader._triton_batch import pad_batch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    data = graph(n=200, e=2000)
    out = NeighborSampler(data, [4, 3, 2], seed=2).sample(torch.arange(10))
    ei = torch.stack([out.row, out.col])
    p = HopPadding(margin=0.3, granule=8)
    p.grow(out.num_sampled_nodes, out.num_sampled_edges)
    want_ei, want_node = p.pad(ei, out.node, out.num_sampled_nodes, out.num_sampled_edges)
    got_ei, got_node = torch.empty_like(want_ei, device=dev), torch.empty_like(want_node, device=dev)
    edge_table, node_table = p._tables(list(out.num_sampled_nodes), list(out.num_sampled_edges))
    pad_batch(ei.to(dev), out.node.to(dev), edge_table, node_table, got_ei, got_node)
    assert torch.equal(got_ei.cpu(), want_ei) and torch.equal(got_node.cpu(), want_node)
    nodes, edges = p.padded_sizes()
    layers = layer_csrs(edge_index=want_ei, num_sampled_nodes=nodes, num_sampled_edges=edges)  # checks the layout
    assert [c.num_edges for c in layers] == [s[2] for s in layer_sizes(nodes, edges)]
    assert max(int(c.in_degree().max()) for c in layers) <= 4 + 3  # padding spread: no hub rows


# ---- the captured sampler and the captured step's dropout ---------------------------------------------
def test_sampler_hops_with_the_seed_on_the_device_draw_the_same_batches():
    """What CapturedSampler replays -- the hops with the picks' seed read from a device tensor (here on
    CPU tensors under the interpreter, or on the GPU) -- draws the eager sampler's batch for that call."""
    from gnnfuse.loader import CapturedSampler
    from gnnfuse.loader._torch_sampling import finish_padded

    if torch.cuda.is_available():
        dev = "cuda"
    else:
        dev = "cpu"
    data = graph(n=400, e=5000)
    kwargs = dict(num_nodes=400, seed=5, device=dev)
    eager = NeighborSampler(data.edge_index.to(dev), [4, 3], **kwargs)
    static = NeighborSampler(data.edge_index.to(dev), [4, 3], **kwargs)
    for s in (eager, static):
        s._ext, s.picks = None, "triton"
    wrapped = CapturedSampler(static, 16, capture=False)
    seeds = torch.randperm(400, generator=torch.Generator().manual_seed(0))[:16].to(dev)
    for call in (1, 2):
        want = eager.sample(seeds)
        wrapped._seeds, wrapped._call = seeds.clone(), torch.tensor(call, device=dev)
        wrapped._hops_from_static()
        node, row, col, edge, nodes, edges = finish_padded(wrapped._hops, wrapped._sizes.tolist(), static._local)
        assert nodes == want.num_sampled_nodes and edges == want.num_sampled_edges
        for a, b in ((node, want.node), (row, want.row), (col, want.col), (edge, want.edge)):
            assert torch.equal(a, b)
    assert (static._local == -1).all()  # scratch map left as it came
    assert wrapped.sample(seeds).node.shape[0] > 16  # capture=False: the eager sampler


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_sampler_replays_the_eager_batches_on_cuda():
    from gnnfuse.loader import CapturedSampler

    data = graph(n=3000, e=60_000)
    eager = NeighborSampler(data.edge_index.cuda(), [6, 4, 2], num_nodes=3000, seed=3, device="cuda")
    captured = CapturedSampler(NeighborSampler(data.edge_index.cuda(), [6, 4, 2], num_nodes=3000, seed=3,
                                               device="cuda"), 64)
    g = torch.Generator().manual_seed(0)
    for size in (64, 64, 64, 40, 64):  # a batch of another size samples eagerly, in turn
        seeds = torch.randperm(3000, generator=g)[:size].cuda()
        want, got = eager.sample(seeds), captured.sample(seeds)
        assert got.num_sampled_nodes == want.num_sampled_nodes and got.num_sampled_edges == want.num_sampled_edges
        for a, b in ((got.node, want.node), (got.row, want.row), (got.col, want.col), (got.edge, want.edge)):
            assert torch.equal(a, b)
    assert captured.capture and captured.captures == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_step_draws_new_dropout_masks_each_replay():
    """A replayed step draws fresh dropout masks (the graph advances the CUDA generator's offset):
    with the parameters frozen (lr 0), replays of one batch give different losses with dropout and
    equal ones without."""
    from gnnfuse.loader import CapturedStep, HopPadding

    data = graph(n=400, e=4000)
    x, y = data.x.cuda(), data.y.cuda()
    out = NeighborSampler(data.edge_index.cuda(), [4, 3, 2], num_nodes=400, seed=0, device="cuda").sample(
        torch.arange(32, device="cuda"))
    edge_index = torch.stack([out.row, out.col])
    for dropout in (0.5, 0.0):
        (model, _), (optimizer, _) = _sage_pair("cuda")
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        step = CapturedStep(_sage_step(model, optimizer, dropout=dropout), x, warmup=2, padding=HopPadding())
        losses = [float(step(out.node, edge_index, out.num_sampled_nodes, out.num_sampled_edges, y[:32]))
                  for _ in range(6)]
        assert step.captures == 1
        replays = losses[2:]  # the capture's own run and three replays
        if dropout:
            assert len(set(replays)) == len(replays), losses
        else:
            assert max(replays) - min(replays) < 1e-5 * abs(replays[0]), losses
