"""gnnfuse.gat_attention and gnnfuse.nn.GATConv: kernels against the reference and PyG's GATConv,
dropout mask agreement (C++ / Triton / reference), registration (opcheck, gradcheck, compile)."""
from __future__ import annotations

import warnings

import pytest
import torch

import gnnfuse
from gnnfuse import CSR
from gnnfuse._build import load_extension
from gnnfuse.ops.attention import _keep_mask, gat_attention
from gnnfuse.testing import TOLERANCES, assert_compiled_like_eager, random_graph

N, E, H, F = 9, 40, 3, 5
BACKENDS = ["cpu", "triton"]  # triton: CUDA tensors, else the interpreter on CPU tensors (tests/conftest.py)
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def on(backend: str) -> str:
    """The device a backend's tensors live on."""
    return TRITON_DEVICE if backend == "triton" else "cpu"


def graph(index_dtype=torch.int64, num_src=N, num_dst=N, num_edges=E):
    """A random graph with two self loops, a duplicate edge and (num_dst > 2) empty rows."""
    ei = random_graph(num_src, max(num_dst - 2, 1), num_edges, seed=3)
    ei[:, :3] = torch.tensor([[1, 2, 2], [1, 2, 0]])
    ei[:, 3] = ei[:, 4]
    return ei.to(index_dtype)


def inputs(dtype=torch.float64, edge=False, loop=False, num_src=N, num_dst=N, num_edges=E, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_()  # noqa: E731
    return dict(x=make(num_src, H, F), alpha_src=make(num_src, H), alpha_dst=make(num_dst, H),
                alpha_edge=make(num_edges, H) if edge else None, alpha_loop=make(num_dst, H) if loop else None)


def run(ins, ei, backend, **kw):
    """(out, gradients of the inputs), computed on the backend's device, returned on the CPU."""
    dev = on(backend)
    ins = {k: (v.detach().to(dev).requires_grad_() if v is not None else None) for k, v in ins.items()}
    out = gat_attention(ins["x"], ins["alpha_src"], ins["alpha_dst"], ei.to(dev), alpha_edge=ins["alpha_edge"],
                        alpha_loop=ins["alpha_loop"], backend=backend, **kw)
    leaves = [t for t in ins.values() if t is not None]
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=dev).view_as(out)
    return out.cpu(), [g.cpu() for g in torch.autograd.grad((out * weight).sum(), leaves)]


def assert_matches_reference(ins, ei, backend, dtype=torch.float64, **kw):
    out, grads = run(ins, ei, backend, **kw)
    ref_ins = {k: (v.detach().double().requires_grad_() if v is not None else None) for k, v in ins.items()}
    ref_out, ref_grads = run(ref_ins, ei, "reference", **kw)
    atol, rtol = TOLERANCES[dtype]
    if dtype == torch.float64 and backend == "triton":
        atol = rtol = 1e-6  # Triton passes negative_slope and the dropout scale as float32 scalars
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.double(), r, atol=atol * 4, rtol=rtol * 4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("self_loops,edge,loop", [(False, False, False), (False, True, False), (True, False, False),
                                                   (True, True, True)])
@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_matches_reference(backend, self_loops, edge, loop, dropout):
    ins = inputs(edge=edge, loop=loop)
    assert_matches_reference(ins, graph(), backend, add_self_loops=self_loops, dropout=dropout, seed=1234,
                             negative_slope=0.15)


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("self_loops,edge,loop,dropout", [(False, True, False, 0.0), (True, True, True, 0.4)])
def test_triton_splits_hub_rows(monkeypatch, split, self_loops, edge, loop, dropout):
    """Rows longer than SPLIT_EDGES (forced tiny here) run as pieces merged afterwards: forward (the
    online-softmax merge) and both backward passes (target and source hubs) match the reference."""
    from gnnfuse.triton import attention as kernels

    monkeypatch.setattr(kernels, "SPLIT_EDGES", split)
    hub = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 3], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]])
    ei = torch.cat([graph(), hub, hub.flip(0)], 1)  # node 4: an in-hub and an out-hub (with its own loop)
    ins = inputs(edge=edge, loop=loop, num_edges=ei.shape[1])
    csr = CSR.from_edge_index(ei, N)
    assert kernels._work(csr.rowptr).split_rows.numel() > 1  # hub rows are split for real
    assert_matches_reference(ins, csr, "triton", add_self_loops=self_loops, dropout=dropout, seed=99)


def force_small_row_groups(monkeypatch, csr, heads, width):
    """Row groups of 2 rows (several groups, the last part empty) for rows of at most 6 edges, row
    pieces (in the same launch) for the longer ones (of graph(): 7 rows, 2 of them empty, and 2 rows)."""
    from gnnfuse.triton import attention as kernels

    monkeypatch.setattr(kernels, "GROUP_MAX_DEGREE", 6)
    monkeypatch.setattr(kernels, "_one_pass_rows", lambda *tile: 2)
    plan = kernels._one_pass_plan(csr.rowptr, csr.col, csr.num_src, heads, width, 8)
    assert plan.rows == 2 and plan.short.numel() % 2 == 1 and plan.wl.num_pieces > 0


@pytest.mark.parametrize("self_loops,edge,loop,dropout", [(False, True, False, 0.0), (True, True, True, 0.4)])
def test_triton_row_groups_next_to_pieces(monkeypatch, self_loops, edge, loop, dropout):
    csr = CSR.from_edge_index(graph(), N)
    force_small_row_groups(monkeypatch, csr, H, F)
    assert_matches_reference(inputs(edge=edge, loop=loop), csr, "triton", add_self_loops=self_loops,
                             dropout=dropout, seed=7)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_accumulates_in_float32(backend, dtype):
    assert_matches_reference(inputs(dtype, edge=True), graph(torch.int32), backend, dtype, add_self_loops=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bipartite_empty_rows_isolated_nodes_and_no_edges(backend):
    ei = graph(num_src=N, num_dst=6)  # targets 0..3 get edges, 4 and 5 none; sources beyond 6 never targets
    ei = ei[:, ei[1] < 4]
    ins = inputs(num_src=N, num_dst=6, edge=True, num_edges=ei.shape[1])
    for loops in (False, True):
        assert_matches_reference(ins, ei, backend, add_self_loops=loops, dropout=0.3, seed=5)
    out, _ = run(inputs(num_src=N, num_dst=6), ei[:, :0], backend)
    assert out.abs().sum() == 0  # rows without edges are 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_int32_and_int64_indices_and_csr_agree(backend):
    ins = inputs(edge=True)
    outs = [run(ins, g, backend, add_self_loops=True)[0] for g in
            (graph(torch.int64), graph(torch.int32), CSR.from_edge_index(graph(), N))]
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)
    torch.testing.assert_close(outs[0], outs[2], atol=0, rtol=0)


def test_dropout_mask_is_identical_in_cpp_and_reference():
    ext = load_extension("attention")
    ids = torch.tensor([0, 1, 2, 3, 1000, 2**31 - 1, 2**32 + 7, 5 * 10**9])
    for seed, heads, p in ((0, 1, 0.5), (12345, 8, 0.6), (2**31 - 2, 3, 0.1)):
        mask = _keep_mask(seed, ids, heads, p)
        cpp = torch.tensor([[ext.dropout_keep(seed, int(i), heads, h, p) for h in range(heads)] for i in ids])
        assert torch.equal(mask, cpp)
    big = _keep_mask(7, torch.arange(200000), 1, 0.6)
    assert abs(big.float().mean().item() - 0.4) < 0.01  # kept fraction 1 - p


def test_dropout_reproducible_under_manual_seed_and_backends_agree():
    ins = inputs(torch.float32, edge=True)
    outs = []
    for backend in ("cpu", "triton", "reference"):
        torch.manual_seed(7)
        dev = on(backend)
        outs.append(gat_attention(ins["x"].to(dev), ins["alpha_src"].to(dev), ins["alpha_dst"].to(dev),
                                  graph().to(dev), alpha_edge=ins["alpha_edge"].to(dev), dropout=0.5,
                                  backend=backend).cpu())
    torch.manual_seed(7)
    again = gat_attention(ins["x"], ins["alpha_src"], ins["alpha_dst"], graph(), alpha_edge=ins["alpha_edge"],
                          dropout=0.5)
    assert torch.equal(outs[0], again)
    torch.testing.assert_close(outs[0], outs[1])  # same mask on both kernels (values differ by rounding only)
    torch.testing.assert_close(outs[0], outs[2])
    no_dropout = gat_attention(ins["x"], ins["alpha_src"], ins["alpha_dst"], graph(), alpha_edge=ins["alpha_edge"])
    assert not torch.allclose(outs[0], no_dropout)


def test_gradcheck():
    ins = inputs(edge=True, loop=True)
    ei = graph()
    names = list(ins)

    def fn(*tensors):
        kw = dict(zip(names, tensors))
        return gat_attention(kw["x"], kw["alpha_src"], kw["alpha_dst"], ei, alpha_edge=kw["alpha_edge"],
                             alpha_loop=kw["alpha_loop"], add_self_loops=True, dropout=0.3, seed=11)

    assert torch.autograd.gradcheck(fn, tuple(ins.values()))


def test_opcheck():
    ins = inputs(torch.float32, edge=True, loop=True)
    csr = CSR.from_edge_index(graph(torch.int32), N)
    edge = ins["alpha_edge"].detach()[csr.perm.long()].requires_grad_()
    for transpose in ((None, None, None), csr.transpose_parts()):
        args = (ins["x"], ins["alpha_src"], ins["alpha_dst"], edge, ins["alpha_loop"], csr.rowptr, csr.col,
                *transpose, True, 0.2, 0.25, 99)
        torch.library.opcheck(torch.ops.gnnfuse.gat_attention.default, args)


def test_torch_compile_fullgraph_dynamic():
    csr = CSR.from_edge_index(graph(), N)

    def layer(x, a, b, e):
        return gat_attention(x, a, b, csr, alpha_edge=e, add_self_loops=True, dropout=0.2, seed=3).relu().sum(1)

    ins = inputs(edge=True)
    args = (ins["x"], ins["alpha_src"], ins["alpha_dst"], ins["alpha_edge"])
    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    out, eager = compiled(*args), layer(*args)
    torch.testing.assert_close(out, eager)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), args), torch.autograd.grad(eager.sum(), args))


@pytest.mark.parametrize("bad,match", [
    (dict(x=torch.randn(N, H)), "x must have shape"),
    (dict(alpha_src=torch.randn(N, H + 1)), "alpha_src must have shape"),
    (dict(alpha_dst=torch.randn(N, H, 1)), "alpha_dst must have shape"),
    (dict(alpha_edge=torch.randn(E + 1, H)), "alpha_edge must have shape"),
    (dict(alpha_src=torch.ones(N, H, dtype=torch.long)), "alpha_src must have a floating dtype"),
    (dict(dropout=1.0), "dropout must be"),
    (dict(seed=-1, dropout=0.5), "seed must be"),
    (dict(alpha_loop=torch.randn(N, H)), "add_self_loops=False"),
])
def test_errors_name_the_argument(bad, match):
    kw = dict(x=torch.randn(N, H, F), alpha_src=torch.randn(N, H), alpha_dst=torch.randn(N, H))
    kw.update(bad)
    with pytest.raises((ValueError, TypeError), match=match):
        gat_attention(kw.pop("x"), kw.pop("alpha_src"), kw.pop("alpha_dst"), graph(), **kw)


# ---- the PyG drop-in ---------------------------------------------------------------------------
pyg_nn = pytest.importorskip("torch_geometric.nn")
import gnnfuse.nn as G  # noqa: E402

GAT_CONFIGS = {
    "default": dict(),
    "heads": dict(heads=3),
    "mean_heads": dict(heads=2, concat=False, negative_slope=0.3),
    "edge_dim_mean_fill": dict(heads=2, edge_dim=3),
    "edge_dim_scalar_fill": dict(heads=2, edge_dim=3, fill_value=0.5),
    "edge_dim_max_fill": dict(heads=2, edge_dim=3, fill_value="max"),
    "edge_dim_no_loops": dict(heads=2, edge_dim=3, add_self_loops=False),
    "residual_no_bias": dict(heads=2, residual=True, bias=False),
}


def gat_pair(in_channels, out_channels, dtype=torch.float64, **kw):
    torch.manual_seed(1)
    stock = pyg_nn.GATConv(in_channels, out_channels, **kw).to(dtype)
    ours = G.GATConv(in_channels, out_channels, **kw).to(dtype)
    ours.load_state_dict(stock.state_dict())
    return stock, ours


def layer_run(layer, x, ei, ea=None):
    out = layer(x, ei, ea)
    inputs = [x] if isinstance(x, torch.Tensor) else list(x)
    leaves = [t for t in inputs if t.requires_grad] + list(layer.parameters())
    return out, torch.autograd.grad((out * out.detach().cos()).sum(), leaves)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", GAT_CONFIGS)
def test_gatconv_matches_pyg(name, backend):
    kw = GAT_CONFIGS[name]
    stock, ours = gat_pair(6, 4, **kw)
    dev = on(backend)
    stock, ours = stock.to(dev), ours.to(dev)
    ours.gnnfuse_backend = backend
    x = torch.randn(N, 6, dtype=torch.float64, device=dev, requires_grad=True)
    ea = torch.randn(E, 3, dtype=torch.float64, device=dev) if "edge_dim" in kw else None
    ei = graph().to(dev)
    (out, grads), (ref, ref_grads) = layer_run(ours, x, ei, ea), layer_run(stock, x, ei, ea)
    tol = dict(atol=1e-8, rtol=1e-8)
    torch.testing.assert_close(out, ref, **tol)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **tol)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("edge_dim,fill", [(3, "mean"), (1, 0.5), (2, "max")])
def test_gatconv_edge_terms_in_csr_order_match_pyg(edge_dim, fill, backend, monkeypatch):
    """GATConv's edge terms go to the op in CSR order: a constant edge_attr's reorder (and its self
    loops' features) cached per graph, picked up again after an in-place change and for another edge
    order; an edge_attr with a gradient reordered on every call (edge_dim 1 < H: the raw features, else
    the [E, H] terms), its gradient PyG's; the same with the cache off (EDGES_IN_CSR_ORDER False)."""
    from gnnfuse.nn import _attention

    stock, ours = gat_pair(6, 4, heads=2, edge_dim=edge_dim, fill_value=fill)
    dev = on(backend)
    stock, ours = stock.to(dev), ours.to(dev)
    ours.gnnfuse_backend = backend
    x = torch.randn(N, 6, dtype=torch.float64, device=dev, requires_grad=True)
    ei = graph().to(dev)
    tol = dict(atol=1e-8, rtol=1e-8)
    for cache in (True, False):
        monkeypatch.setattr(_attention, "EDGES_IN_CSR_ORDER", cache)
        ea = torch.randn(E, edge_dim, dtype=torch.float64, device=dev)
        for case in (lambda: (ei, ea), lambda: (ei, ea.mul_(-0.5)), lambda: (ei.flip(1), ea.flip(0))):
            edge_index, attr = case()  # (the second: ea changed in place after a call)
            (out, grads), (ref, ref_grads) = layer_run(ours, x, edge_index, attr), layer_run(stock, x, edge_index, attr)
            torch.testing.assert_close(out, ref, **tol)
            for g, r in zip(grads, ref_grads):
                torch.testing.assert_close(g, r, **tol)
        ea_grad = ea.clone().requires_grad_()
        out, ref = ours(x, ei, ea_grad), stock(x, ei, ea_grad)
        torch.testing.assert_close(out, ref, **tol)
        weight = out.detach().cos()
        torch.testing.assert_close(torch.autograd.grad((out * weight).sum(), ea_grad)[0],
                                   torch.autograd.grad((ref * weight).sum(), ea_grad)[0], **tol)


def test_gatconv_recomputes_its_projection_in_the_backward(monkeypatch):
    """The fused op's saved projection is made again from x in the backward (not kept from the
    forward), and the result still matches PyG."""
    from gnnfuse.nn import _attention, _recompute

    monkeypatch.setattr(_recompute, "MIN_BYTES", 0)  # (a projection this small is otherwise kept)
    stock, ours = gat_pair(6, 4, heads=2)
    calls = []
    real = _attention.F.linear

    def counting_linear(*args):
        calls.append(args[1].shape)
        return real(*args)

    monkeypatch.setattr(_attention.F, "linear", counting_linear)
    x = torch.randn(N, 6, dtype=torch.float64, requires_grad=True)
    out = ours(x, graph())
    forward_calls = len(calls)
    grads = torch.autograd.grad((out * out.detach().cos()).sum(), [x, *ours.parameters()])
    assert calls[forward_calls:] == [ours.lin.weight.shape]  # the projection, made again in the backward
    monkeypatch.undo()
    ref, ref_grads = layer_run(stock, x, graph())
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_gatconv_keeps_its_projection_where_versions_cannot_be_read(monkeypatch):
    """The fallback when tensors' version counters are unavailable: nothing is recomputed."""
    from gnnfuse.nn import _attention, _recompute

    monkeypatch.setattr(_recompute, "_versions", lambda tensors: None)
    monkeypatch.setattr(_recompute, "MIN_BYTES", 0)
    stock, ours = gat_pair(6, 4, heads=2)
    calls = []
    real = _attention.F.linear
    monkeypatch.setattr(_attention.F, "linear", lambda *a: calls.append(a[1].shape) or real(*a))
    x = torch.randn(N, 6, dtype=torch.float64, requires_grad=True)
    out = ours(x, graph())
    forward_calls = len(calls)
    grads = torch.autograd.grad(out.sum(), [x, *ours.parameters()])
    assert len(calls) == forward_calls  # the backward used the kept projection
    monkeypatch.undo()
    ref = stock(x, graph())
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, torch.autograd.grad(ref.sum(), [x, *stock.parameters()])):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("recomputed", [False, True])
def test_gatconv_projection_modified_in_place_before_backward_raises(recomputed, monkeypatch):
    from gnnfuse.nn import _recompute

    if recomputed:
        monkeypatch.setattr(_recompute, "MIN_BYTES", 0)
    _, ours = gat_pair(6, 4, heads=2)
    x = torch.randn(N, 6, dtype=torch.float64)
    out = ours(x, graph())
    with torch.no_grad():
        ours.lin.weight.mul_(2)  # e.g. an optimizer step before the backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


@pytest.mark.parametrize("loops", [False, True])
def test_gatconv_bipartite_matches_pyg(loops):
    stock, ours = gat_pair((5, 6), 4, heads=2, add_self_loops=loops)
    xs = torch.randn(10, 5, dtype=torch.float64, requires_grad=True)
    xd = torch.randn(7, 6, dtype=torch.float64, requires_grad=True)
    ei = torch.stack([torch.randint(0, 10, (30,)), torch.randint(0, 5, (30,))])
    (out, grads), (ref, ref_grads) = layer_run(ours, (xs, xd), ei), layer_run(stock, (xs, xd), ei)
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_gatconv_dropout_matches_reference_with_the_same_mask():
    _, ours = gat_pair(6, 4, heads=2, edge_dim=3, dropout=0.6)
    ours.train()
    x, ea = torch.randn(N, 6, dtype=torch.float64, requires_grad=True), torch.randn(E, 3, dtype=torch.float64)
    results = []
    for backend in ("cpu", "reference"):
        ours.gnnfuse_backend = backend
        torch.manual_seed(21)
        results.append(layer_run(ours, x, graph(), ea))
    torch.testing.assert_close(results[0][0], results[1][0])
    for g, r in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(g, r)
    ours.eval()
    stock, _ = gat_pair(6, 4, heads=2, edge_dim=3, dropout=0.6)
    stock.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(x, graph(), ea), stock.eval()(x, graph(), ea))  # eval: no dropout


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gatconv_half_types(dtype):
    stock, ours = gat_pair(6, 4, torch.float32, heads=2)
    x = torch.randn(N, 6)
    ours.to(dtype)
    torch.testing.assert_close(ours(x.to(dtype), graph()).float(), stock(x, graph()), atol=5e-2, rtol=5e-2)


def test_gatconv_fallback_warns_once_and_matches():
    stock, ours = gat_pair(6, 4, heads=2)
    x = torch.randn(N, 6, dtype=torch.float64)
    with pytest.warns(UserWarning, match="return_attention_weights"):
        out, (ei, alpha) = ours(x, graph(), return_attention_weights=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours(x, graph(), return_attention_weights=True)  # second time: silent
    ref, (_, ref_alpha) = stock(x, graph(), return_attention_weights=True)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(alpha, ref_alpha)


def test_fuse_converts_gatconv_and_keeps_state_dict():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"a": pyg_nn.GATConv(6, 4, heads=2), "b": pyg_nn.GATConv(8, 3)})
    keys = model.state_dict().keys()
    x = torch.randn(N, 6)
    before = model["b"](model["a"](x, graph()), graph())
    G.fuse(model)
    assert sorted(model.gnnfuse_fused) == ["a", "b"] and type(model["a"]) is G.GATConv
    assert model.state_dict().keys() == keys
    torch.testing.assert_close(model["b"](model["a"](x, graph()), graph()), before)
    assert G.fusable(model["a"]) == (False, "already fused")
    assert gnnfuse.nn.fuse(model).gnnfuse_fused == []


def test_gatconv_compiles_fullgraph():
    csr = CSR.from_edge_index(graph(), N)
    _, conv = gat_pair(6, 4, torch.float32, heads=2, edge_dim=3)
    conv.eval()  # training mode with dropout draws its seed with a host read (a graph break)
    assert_compiled_like_eager(conv, torch.randn(N, 6, requires_grad=True), csr, E, 3)


@pytest.mark.parametrize("in_channels", [-1, (-1, -1)])
def test_gatconv_lazy_projection_matches_pyg(in_channels):
    """Lazy projections take their width from the first call; the target side's projection is
    never applied to x_dst (only its folded attention vector is), so the fold initialises it."""
    torch.manual_seed(1)
    stock, ours = pyg_nn.GATConv(in_channels, 4, heads=2), G.GATConv(in_channels, 4, heads=2)
    if isinstance(in_channels, int):
        x = torch.randn(N, 6)
    else:
        x = (torch.randn(N, 6), torch.randn(N, 5))
    stock(x, graph())  # initialises the stock layer's parameters
    ours(x, graph())
    ours.load_state_dict(stock.state_dict())
    torch.testing.assert_close(ours(x, graph()), stock(x, graph()))


def test_gatconv_keeps_a_small_projection(monkeypatch):
    """A projection under _recompute.MIN_BYTES is kept for the backward, not made again (a small
    graph's step is host-bound: the recompute's launch and hooks cost more than the memory saves)."""
    from gnnfuse.nn import _attention

    stock, ours = gat_pair(6, 4, heads=2)
    calls = []
    real = _attention.F.linear
    monkeypatch.setattr(_attention.F, "linear", lambda *a: calls.append(a[1].shape) or real(*a))
    x = torch.randn(N, 6, dtype=torch.float64, requires_grad=True)
    out = ours(x, graph())
    forward_calls = len(calls)
    grads = torch.autograd.grad(out.sum(), [x, *ours.parameters()])
    assert len(calls) == forward_calls
    monkeypatch.undo()
    ref = stock(x, graph())
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, torch.autograd.grad(ref.sum(), [x, *stock.parameters()])):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("x_grad,extra", [(False, {}), (True, {}), (True, dict(concat=False, bias=False))])
def test_gatconv_one_node_route_matches_the_two_node_route(x_grad, extra, monkeypatch):
    """GATConv's one-node route (nn/_gat_node.py: projection, attention terms, fused attention and
    the bias under one autograd node, Triton eager) gives the same output and gradients as the
    default route (GATProjection + the attention op), dropout included (the same seed is drawn), to
    rounding (its products are grouped otherwise)."""
    from gnnfuse.nn import _attention, _gat_node

    dev = on("triton")
    _, ours = gat_pair(6, 4, heads=2, dropout=0.4, **extra)  # (the bias inside the node with concatenated heads)
    ours = ours.to(dev).train()
    ours.gnnfuse_backend = "triton"
    x = torch.randn(N, 6, dtype=torch.float64, device=dev, requires_grad=x_grad)
    ei = graph().to(dev)
    assert _gat_node.applies(ours, x, ours.lin.weight)
    runs = []
    for one_node in (True, False):
        if not one_node:
            monkeypatch.setattr(_attention, "node_applies", lambda *args: False)
        torch.manual_seed(7)
        runs.append(layer_run(ours, x, ei))
    (out, grads), (ref, ref_grads) = runs
    torch.testing.assert_close(out, ref, atol=1e-13, rtol=1e-13)
    assert len(grads) == len(ref_grads)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-13, rtol=1e-13)


def test_gatconv_one_node_route_applies_only_where_it_may():
    """Not without a gradient, not off the Triton backend, not for a projection of MIN_BYTES or more."""
    from gnnfuse.nn import _gat_node, _recompute

    _, ours = gat_pair(6, 4, heads=2)
    dev = on("triton")
    ours = ours.to(dev)
    x = torch.randn(N, 6, dtype=torch.float64, device=dev)
    ours.gnnfuse_backend = "triton"
    assert _gat_node.applies(ours, x, ours.lin.weight)
    with torch.no_grad():
        assert not _gat_node.applies(ours, x, ours.lin.weight)
    ours.gnnfuse_backend = "cpu" if dev == "cpu" else "triton"
    if dev == "cpu":
        assert not _gat_node.applies(ours, x, ours.lin.weight)
    ours.gnnfuse_backend = "triton"
    big = torch.empty(_recompute.MIN_BYTES // (8 * ours.lin.weight.shape[0]) + 1, 6, dtype=torch.float64, device=dev)
    assert not _gat_node.applies(ours, big, ours.lin.weight)


def test_backward_fold_att_needs_every_gradient_and_one_node_set():
    """The Triton backward's ``fold_att`` (the GATConv node's: the terms' gradients folded into the
    projection's) is refused where it cannot hold: without x's, a_src's and a_dst's gradients or
    with two node sets (checked before any launch)."""
    from gnnfuse.triton import attention as kernels

    n, heads, width = 4, 2, 3
    x, g = torch.randn(n, heads, width), torch.randn(n, heads, width)
    a, m = torch.randn(n, heads), torch.zeros(n, heads)
    att = torch.randn(heads, width)
    rowptr, col = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2])  # 3 targets, 4 sources
    with pytest.raises(ValueError, match="fold_att"):
        kernels.backward(g, x, m, m, x, a, a[:3], None, None, rowptr, col, rowptr, col, col, True, 0.2, 0.0, 0,
                         [True, True, True, False, False], (att, att))
    with pytest.raises(ValueError, match="fold_att"):
        kernels.backward(g, x, m, m, x, a, a, None, None, torch.tensor([0, 1, 2, 3, 4]), torch.arange(4),
                         torch.tensor([0, 1, 2, 3, 4]), torch.arange(4), torch.arange(4), True, 0.2, 0.0, 0,
                         [True, False, True, False, False], (att, att))
