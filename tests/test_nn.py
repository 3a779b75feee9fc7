"""gnnfuse.nn: PyG drop-in layers, fuse(), the mixin, caching and torch.compile.

Every fused layer is compared with the stock torch-geometric layer holding the same weights:
forward, and gradients w.r.t. inputs (x, edge_weight) and every parameter.
"""
from __future__ import annotations

import copy
import shutil
import warnings

import pytest
import torch

pyg = pytest.importorskip("torch_geometric")
import torch_geometric.nn as P  # noqa: E402
from torch_geometric import EdgeIndex  # noqa: E402
from torch_geometric.nn import MessagePassing  # noqa: E402

import gnnfuse  # noqa: E402
import gnnfuse.nn as G  # noqa: E402
from gnnfuse.testing import TwoLayerNet as Net  # noqa: E402
from gnnfuse.testing import data_root, random_graph  # noqa: E402

TOL = {torch.float32: dict(atol=2e-5, rtol=1e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}
N, E, F_IN, F_OUT = 40, 240, 12, 7


def _mlp(f_in, f_out):
    return torch.nn.Sequential(torch.nn.Linear(f_in, 16), torch.nn.ReLU(), torch.nn.Linear(16, f_out))


# name -> (class name, constructor kwargs / builder, uses edge_weight, bipartite allowed)
LAYERS = {
    "gcn": ("GCNConv", dict(), False),
    "gcn_w": ("GCNConv", dict(), True),
    "gcn_improved_w": ("GCNConv", dict(improved=True), True),
    "gcn_improved": ("GCNConv", dict(improved=True), False),
    "gcn_no_loops_w": ("GCNConv", dict(add_self_loops=False), True),
    "gcn_no_norm_w": ("GCNConv", dict(normalize=False), True),
    "gcn_no_bias": ("GCNConv", dict(bias=False), False),
    "sage_mean": ("SAGEConv", dict(), False),
    "sage_sum": ("SAGEConv", dict(aggr="sum"), False),
    "sage_max": ("SAGEConv", dict(aggr="max"), False),
    "sage_min": ("SAGEConv", dict(aggr="min"), False),
    "sage_mul": ("SAGEConv", dict(aggr="mul"), False),
    "sage_project_norm": ("SAGEConv", dict(project=True, normalize=True), False),
    "sage_no_root": ("SAGEConv", dict(root_weight=False), False),
    "gin": ("GINConv", dict(), False),
    "gin_train_eps": ("GINConv", dict(train_eps=True, eps=0.3), False),
    "gin_mean": ("GINConv", dict(aggr="mean"), False),
    "graph": ("GraphConv", dict(), False),
    "graph_w": ("GraphConv", dict(), True),
    "graph_max": ("GraphConv", dict(aggr="max"), False),
    "graph_mean_w": ("GraphConv", dict(aggr="mean"), True),
}


def make_pair(name, dtype, f_in=F_IN, f_out=F_OUT, in_channels=None):
    cls_name, kwargs, _ = LAYERS[name]
    torch.manual_seed(0)
    if cls_name == "GINConv":
        stock = P.GINConv(_mlp(f_in, f_out), **kwargs)
        fused = G.GINConv(_mlp(f_in, f_out), **kwargs)
    else:
        channels = in_channels if in_channels is not None else f_in
        stock = getattr(P, cls_name)(channels, f_out, **kwargs)
        fused = getattr(G, cls_name)(channels, f_out, **kwargs)
    if kwargs.get("train_eps"):
        with torch.no_grad():
            stock.eps.fill_(0.3)
    fused.load_state_dict(stock.state_dict())  # a stock checkpoint loads unchanged
    return stock.to(dtype), fused.to(dtype)


def run(module, x, graph, weight, **kw):
    """Forward + backward of a fixed random projection; returns output and all gradients."""
    module.zero_grad()
    xs = [t.detach().clone().requires_grad_() if t is not None else None for t in (x if isinstance(x, tuple) else (x,))]
    w = weight.detach().clone().requires_grad_() if weight is not None else None
    args = (tuple(xs) if isinstance(x, tuple) else xs[0], graph) + ((w,) if w is not None else ())
    out = module(*args, **kw)
    g = torch.Generator().manual_seed(1)
    out.backward(torch.randn(out.shape, generator=g, dtype=out.dtype))
    grads = {f"x{i}": t.grad for i, t in enumerate(xs) if t is not None}
    if w is not None:
        grads["edge_weight"] = w.grad
    grads.update({n: p.grad for n, p in module.named_parameters()})
    return out, grads


def _close(actual, expected, dtype, msg=None):
    """TOL, with atol scaled by the tensor's largest magnitude: a sum evaluated in another order
    (CSR order, or aggregating after the linear map) is off by ~eps * (sum of |terms|), which
    shows as a large relative error on the entries that cancel."""
    scale = max(1.0, float(expected.detach().abs().max())) if expected.numel() else 1.0
    tol = dict(TOL[dtype], atol=TOL[dtype]["atol"] * scale)
    torch.testing.assert_close(actual, expected, **tol, msg=msg)


def assert_same(stock_res, fused_res, dtype):
    (o1, g1), (o2, g2) = stock_res, fused_res
    _close(o2, o1, dtype)
    assert g1.keys() == g2.keys()
    for k in g1:
        if g1[k] is None:
            assert g2[k] is None or not g2[k].any(), k
        else:
            _close(g2[k], g1[k], dtype, msg=lambda m, k=k: f"grad {k}: {m}")


def graph_as(kind, ei, num_nodes):
    if kind == "edge_index":
        return ei
    if kind == "csr":
        return gnnfuse.CSR.from_edge_index(ei, num_nodes)
    if kind == "EdgeIndex":
        return EdgeIndex(ei, sparse_size=(num_nodes, num_nodes) if isinstance(num_nodes, int) else num_nodes)
    raise AssertionError(kind)


# ---- every layer and aggregation vs stock PyG ------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_matches_pyg(name, dtype):
    stock, fused = make_pair(name, dtype)
    ei = random_graph(N, N, E, seed=3)
    ei[:, :5] = torch.arange(5).repeat(2, 1)  # a few existing self-loops (GCN keeps their weights)
    x = torch.randn(N, F_IN, dtype=dtype)
    w = torch.rand(E, dtype=dtype) + 0.1 if LAYERS[name][2] else None
    expected = run(stock, x, ei, w)
    for kind in ("edge_index", "csr", "EdgeIndex"):
        assert_same(expected, run(fused, x, graph_as(kind, ei, N), w), dtype)


@pytest.mark.parametrize("name", ["sage_mean", "sage_max", "sage_min", "sage_sum", "gin", "graph_w"])
def test_bipartite_matches_pyg(name):
    dtype = torch.float64
    n_src, n_dst = 30, 17
    cls_name = LAYERS[name][0]
    stock, fused = make_pair(name, dtype, in_channels=None if cls_name == "GINConv" else (F_IN, 5), f_in=F_IN)
    ei = random_graph(n_src, n_dst, 150, seed=4)
    x_src = torch.randn(n_src, F_IN, dtype=dtype)
    x_dst = torch.randn(n_dst, F_IN if cls_name == "GINConv" else 5, dtype=dtype)
    w = torch.rand(150, dtype=dtype) if LAYERS[name][2] else None
    expected = run(stock, (x_src, x_dst), ei, w)
    assert_same(expected, run(fused, (x_src, x_dst), ei, w), dtype)
    csr = gnnfuse.CSR.from_edge_index(ei, (n_src, n_dst))
    assert_same(expected, run(fused, (x_src, x_dst), csr, w), dtype)
    # explicit size instead of x_dst's (PyG: size=(num_src, num_dst))
    if cls_name != "GINConv":
        expected = run(stock, (x_src, None), ei, w, size=(n_src, n_dst))
        assert_same(expected, run(fused, (x_src, None), ei, w, size=(n_src, n_dst)), dtype)


@pytest.mark.parametrize("name", ["gcn_w", "sage_max", "graph_w"])
def test_sorted_edge_index_reuses_its_csc(name):
    dtype = torch.float64
    stock, fused = make_pair(name, dtype)
    ei = random_graph(N, N, E, seed=5)
    ei = ei[:, torch.argsort(ei[1] * N + ei[0])]
    eidx = EdgeIndex(ei, sparse_size=(N, N), sort_order="col")
    x = torch.randn(N, F_IN, dtype=dtype)
    w = torch.rand(E, dtype=dtype) if LAYERS[name][2] else None
    assert_same(run(stock, x, eidx, w), run(fused, x, eidx, w), dtype)


def test_empty_graph_and_int32_indices():
    for name in ("gcn", "sage_max", "graph_w", "sage_mul"):
        stock, fused = make_pair(name, torch.float64)
        x = torch.randn(N, F_IN, dtype=torch.float64)
        for ei in (torch.empty(2, 0, dtype=torch.long), random_graph(N, N, E, seed=6, index_dtype=torch.int32)):
            w = torch.rand(ei.shape[1], dtype=torch.float64) if LAYERS[name][2] else None
            assert_same(run(stock, x, ei.long(), w), run(fused, x, ei, w), torch.float64)


# ---- real data ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    root = data_root()
    if root is None or not (root / "planetoid" / "Cora" / "raw").is_dir():
        pytest.skip("Cora not found: needs ../shared/data/planetoid/Cora/raw (or $GNNFUSE_DATA)")
    tmp = tmp_path_factory.mktemp("planetoid")
    shutil.copytree(root / "planetoid" / "Cora", tmp / "Cora")
    from torch_geometric.datasets import Planetoid

    return Planetoid(str(tmp), "Cora")[0]


CORA_CASES = [(n, torch.float32) for n in ("gcn", "gcn_w", "sage_mean", "sage_sum", "sage_max", "sage_min", "gin",
                                           "graph_w")] + [("gcn", torch.float64), ("sage_max", torch.float64)]


@pytest.mark.parametrize("name,dtype", CORA_CASES, ids=[f"{n}-{str(d)[-7:]}" for n, d in CORA_CASES])
def test_cora_matches_pyg(cora, name, dtype):
    stock, fused = make_pair(name, dtype, f_in=cora.num_features, f_out=16)
    # Cora's 0/1 features tie under max/min, where PyG splits the gradient and gnnfuse gives it to one
    # edge (documented); a little noise makes the winners unique.
    x = (cora.x + 0.01 * torch.randn(cora.x.shape, generator=torch.Generator().manual_seed(0))).to(dtype)
    w = torch.rand(cora.edge_index.shape[1], dtype=dtype) if LAYERS[name][2] else None
    expected = run(stock, x, cora.edge_index, w)
    assert_same(expected, run(fused, x, cora.edge_index, w), dtype)
    if name in ("gcn", "sage_max"):
        csr = gnnfuse.CSR.from_edge_index(cora.edge_index, cora.num_nodes)
        assert_same(expected, run(fused, x, csr, w), dtype)


# ---- models and fuse() -------------------------------------------------------------------------------
@pytest.mark.parametrize("conv,kw", [("GCNConv", {}), ("GCNConv", {"cached": True}), ("SAGEConv", {}),
                                     ("SAGEConv", {"aggr": "max"})])
def test_fuse_model_same_predictions(conv, kw):
    torch.manual_seed(0)
    stock = Net(getattr(P, conv), F_IN, 16, 4, **kw)
    ei = random_graph(N, N, E, seed=7)
    x = torch.randn(N, F_IN)
    expected = stock(x, ei)
    model = copy.deepcopy(stock)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing unsupported: no warning
        assert G.fuse(model) is model
    assert model.gnnfuse_fused == ["conv1", "conv2"] and model.gnnfuse_unsupported == []
    assert isinstance(model.conv1, G.FusedMessagePassing) and isinstance(model.conv1, getattr(P, conv))
    assert type(model.conv1) is getattr(G, conv)
    assert list(model.state_dict()) == list(stock.state_dict())
    torch.testing.assert_close(model(x, ei), expected, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(model(x, ei), expected, atol=2e-5, rtol=1e-5)  # again (caches)
    assert repr(model) == repr(stock)
    if not kw.get("aggr") == "max":  # (max: ReLU zeros make ties; PyG splits their gradient, gnnfuse does not)
        model.zero_grad(), stock.zero_grad()
        stock(x, ei).square().sum().backward()
        model(x, ei).square().sum().backward()
        for (n, p1), (_, p2) in zip(stock.named_parameters(), model.named_parameters()):
            torch.testing.assert_close(p2.grad, p1.grad, atol=1e-4, rtol=1e-4, msg=n)


def test_fuse_lists_unsupported_and_converts_generic():
    class MyProp(MessagePassing):  # generic: message x_j * edge_weight
        def forward(self, x, edge_index, edge_weight):
            return self.propagate(edge_index, x=x, edge_weight=edge_weight)

        def message(self, x_j, edge_weight):
            return x_j * edge_weight.view(-1, 1)

    model = torch.nn.ModuleDict({
        "gcn": P.GCNConv(8, 8), "gat": P.SuperGATConv(8, 8), "lstm": P.SAGEConv(8, 8, aggr="lstm"),
        "mine": MyProp(aggr="mean"), "lin": torch.nn.Linear(8, 8),
    })
    with pytest.warns(UserWarning, match="gat: SuperGATConv") as rec:
        G.fuse(model)
    assert "lstm: SAGEConv" in str(rec[0].message)
    assert sorted(model.gnnfuse_fused) == ["gcn", "mine"]
    assert len(model.gnnfuse_unsupported) == 2
    assert isinstance(model["mine"], G.FusedMessagePassing) and type(model["mine"]).__name__ == "MyProp"
    assert type(model["gat"]) is P.SuperGATConv and type(model["lstm"]) is P.SAGEConv
    assert G.fusable(model["gat"])[0] is False and G.fusable(model["mine"]) == (False, "already fused")
    # the generic conversion gives the stock result
    ei = random_graph(N, N, E, seed=8)
    x, w = torch.randn(N, 8), torch.rand(E)
    stock = MyProp(aggr="mean")
    torch.testing.assert_close(model["mine"](x, ei, w), stock(x, ei, w))
    G.fuse(model["gat"], warn=False)  # warn=False: listed only
    assert model["gat"].gnnfuse_unsupported


def test_stock_checkpoint_loads(tmp_path):
    torch.manual_seed(0)
    stock = Net(P.SAGEConv, F_IN, 16, 4)
    torch.save(stock.state_dict(), tmp_path / "ckpt.pt")
    fused = Net(G.SAGEConv, F_IN, 16, 4)
    fused.load_state_dict(torch.load(tmp_path / "ckpt.pt"))  # strict: same keys and shapes
    ei, x = random_graph(N, N, E, seed=9), torch.randn(N, F_IN)
    torch.testing.assert_close(fused(x, ei), stock(x, ei))
    gin_stock, gin_fused = make_pair("gin_train_eps", torch.float32)
    assert gin_fused.state_dict().keys() == gin_stock.state_dict().keys()
    assert {n for n, _ in gin_fused.named_buffers()} == {n for n, _ in gin_stock.named_buffers()}


# ---- the generic mixin ------------------------------------------------------------------------------
class _Counting:
    def __init__(self, monkeypatch):
        import gnnfuse.nn._mixin as mixin

        self.calls = 0
        real = mixin.fused_gather_scatter

        def counted(*a, **k):
            self.calls += 1
            return real(*a, **k)

        monkeypatch.setattr(mixin, "fused_gather_scatter", counted)


def _custom_layers():
    class Weighted(G.FusedMessagePassing, MessagePassing):
        def forward(self, x, edge_index, edge_weight=None):
            return self.propagate(edge_index, x=x, edge_weight=edge_weight)

        def message(self, x_j, edge_weight):
            """Docstrings are fine."""
            return x_j if edge_weight is None else edge_weight.view(-1, 1) * x_j

    class Plain(G.FusedMessagePassing, MessagePassing):  # message inherited: x_j
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

    class Diff(G.FusedMessagePassing, MessagePassing):  # not fusable: falls back
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_i, x_j):
            return x_j - x_i

    class Attr(G.FusedMessagePassing, MessagePassing):  # not fusable: edge features
        def forward(self, x, edge_index, edge_attr):
            return self.propagate(edge_index, x=x, edge_attr=edge_attr)

        def message(self, x_j, edge_attr):
            return (x_j + edge_attr).relu()

    class Updated(G.FusedMessagePassing, MessagePassing):  # fused aggregation, custom update
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x, scale=3.0)

        def update(self, inputs, x, scale):
            return inputs * scale + x

    return Weighted, Plain, Diff, Attr, Updated


@pytest.mark.parametrize("aggr", ["sum", "mean", "max", "min", "mul"])
def test_mixin_fused_and_fallback(aggr, monkeypatch):
    Weighted, Plain, Diff, Attr, Updated = _custom_layers()
    assert G.message_form(Weighted) == ("x_j*w?", "x_j", "edge_weight")
    assert G.message_form(Plain) == ("x_j", "x_j", None)
    assert G.message_form(Diff) is None and G.message_form(Attr) is None
    ei = random_graph(N, N, E, seed=10)
    x, w, attr = (torch.randn(N, 6, dtype=torch.float64), torch.rand(E, dtype=torch.float64),
                  torch.randn(E, 6, dtype=torch.float64))
    csr = gnnfuse.CSR.from_edge_index(ei, N)
    counter = _Counting(monkeypatch)
    for cls, args, fused in [(Weighted, (w,), True), (Weighted, (), True), (Plain, (), True), (Diff, (), False),
                             (Attr, (attr,), False), (Updated, (), True)]:
        layer = cls(aggr=aggr)
        stock = type("Stock", (MessagePassing,), {k: v for k, v in cls.__dict__.items()
                                                  if k in ("forward", "message", "update")})(aggr=aggr)
        for graph in (ei, csr):
            before = counter.calls
            xr = x.clone().requires_grad_()
            out = layer(xr, graph, *args)
            out.sum().backward()
            xs = x.clone().requires_grad_()
            ref = stock(xs, ei, *args)
            ref.sum().backward()
            torch.testing.assert_close(out, ref, msg=f"{cls.__name__} {type(graph).__name__}")
            torch.testing.assert_close(xr.grad, xs.grad)
            assert (counter.calls > before) == fused, cls.__name__


def test_mixin_falls_back_for_hooks_explain_and_flow(monkeypatch):
    Weighted = _custom_layers()[0]
    ei, x = random_graph(N, N, E, seed=11), torch.randn(N, 6)
    counter = _Counting(monkeypatch)
    ref = Weighted(aggr="sum")(x, ei)
    layer = Weighted(aggr="sum")
    handle = layer.register_message_forward_hook(lambda mod, inp, out: out * 2)
    torch.testing.assert_close(layer(x, ei), ref * 2)
    handle.remove()
    assert counter.calls == 1  # only the un-hooked reference call was fused
    t2s = Weighted(aggr="sum", flow="target_to_source")
    stock = P.SimpleConv(aggr="sum", combine_root=None, flow="target_to_source")
    torch.testing.assert_close(t2s(x, ei), stock(x, ei))
    torch.testing.assert_close(t2s(x, gnnfuse.CSR.from_edge_index(ei, N)), stock(x, ei))
    assert counter.calls == 1
    layer.decomposed_layers = 2
    torch.testing.assert_close(layer(x, ei), ref)
    assert counter.calls == 1


# ---- aggregating after the linear map (sum/mean layers that narrow) ------------------------------------
def _aggregated_widths(monkeypatch):
    import gnnfuse.nn._mixin as mixin

    monkeypatch.setenv("GNNFUSE_CACHE_CONSTANT_AGGREGATION", "0")  # count every aggregation, none kept
    widths, real = [], mixin.fused_gather_scatter
    monkeypatch.setattr(mixin, "fused_gather_scatter", lambda x, *a, **k: widths.append(x.shape[-1]) or real(x, *a, **k))
    return widths


@pytest.mark.parametrize("name", ["sage_mean", "sage_sum", "graph_w", "graph_mean_w", "sage_max"])
def test_linear_first_when_the_layer_narrows(name, monkeypatch):
    widths = _aggregated_widths(monkeypatch)
    stock, fused = make_pair(name, torch.float64, f_in=12, f_out=5)
    ei = random_graph(N, N, E, seed=14)
    ei = ei[:, ei[1] != 0]  # node 0 has no in-edges: its aggregation is empty, so its output is bias + root
    x = torch.randn(N, 12, dtype=torch.float64)
    w = torch.rand(ei.shape[1], dtype=torch.float64) if LAYERS[name][2] else None
    expected = run(stock, x, ei, w)
    assert_same(expected, run(fused, x, ei, w), torch.float64)
    assert widths == ([12] if name == "sage_max" else [5])  # max is not linear: aggregated at the input width
    widths.clear()
    fused.gnnfuse_linear_first = False  # PyG's order of operations
    assert_same(expected, run(fused, x, ei, w), torch.float64)
    assert widths == [12]


def test_linear_first_only_where_it_narrows_and_is_safe(monkeypatch):
    widths = _aggregated_widths(monkeypatch)
    ei, x = random_graph(N, N, E, seed=15), torch.randn(N, 6)
    G.SAGEConv(6, 9)(x, ei)  # widens: aggregate the input
    G.SAGEConv(-1, 3)(x, ei)  # lazy weight: its first call aggregates the input (and materialises lin_l)
    conv = G.SAGEConv(6, 3)
    seen = []
    conv.lin_l.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].shape))
    conv(x, ei)  # a hook on lin_l must see the aggregated input, as in PyG
    assert widths == [6, 6, 6] and seen == [(N, 6)]
    # x without gradient, W with: aggregating x needs no backward pass, x @ W.T does (1 + 1.5 passes)
    widths.clear()
    x12 = torch.randn(N, 12)
    G.SAGEConv(12, 5)(x12, ei)  # 5 * 2.5 > 12 * 1
    G.SAGEConv(12, 4)(x12, ei)  # 4 * 2.5 < 12
    with torch.no_grad():
        G.SAGEConv(12, 11)(x12, ei)  # inference: any narrowing pays
    assert widths == [12, 4, 11]


# ---- caching: one sort per graph, GCN normalisation once with cached=True ---------------------------------
def test_one_sort_per_graph_and_cached_gcn_norm(monkeypatch):
    import gnnfuse.nn._layers as layers
    from gnnfuse import csr as csr_mod

    sorts, norms = [], []
    real_from, real_norm = csr_mod.CSR.from_edge_index.__func__, layers.gcn_norm_weights
    monkeypatch.setattr(csr_mod.CSR, "from_edge_index",
                        classmethod(lambda cls, *a, **k: sorts.append(1) or real_from(cls, *a, **k)))
    monkeypatch.setattr(layers, "gcn_norm_weights", lambda *a, **k: norms.append(1) or real_norm(*a, **k))
    x = torch.randn(N, F_IN)
    for seed, kw, expected_norms in [(12, {}, 6), (13, {"cached": True}, 2)]:
        ei = random_graph(N, N, E, seed=seed)  # a new graph: sorted once, then cached
        sorts.clear(), norms.clear()
        model = Net(G.GCNConv, F_IN, 16, 4, **kw)
        for _ in range(3):  # three epochs, forward + backward
            model(x, ei).sum().backward()
        assert len(sorts) == 1, "the graph must be sorted once for both layers and all epochs"
        assert len(norms) == expected_norms
    sorts.clear()
    sage = Net(G.SAGEConv, F_IN, 16, 4)
    for _ in range(3):
        sage(x, ei).sum().backward()
    assert len(sorts) == 0  # same edge_index object: the GCN run's CSR is reused


def test_cached_gcn_is_reset_and_honours_stock_cache():
    ei, x = random_graph(N, N, E, seed=13), torch.randn(N, F_IN)
    conv = G.GCNConv(F_IN, 4, cached=True)
    out = conv(x, ei)
    assert conv._gnnfuse_cached is not None and conv._cached_edge_index is None
    conv.reset_parameters()
    assert conv._gnnfuse_cached is None
    stock = P.GCNConv(F_IN, 4, cached=True)
    expected = stock(x, ei)
    G.fuse(stock)  # stock cache (normalised edge_index + weights) filled before fuse is used as is
    torch.testing.assert_close(stock(x, ei), expected)
    assert out.shape == expected.shape


def test_cached_gcn_norm_is_put_in_csr_order_once(monkeypatch):
    """The cached normalisation is gathered into CSR order on the first call only; outputs and
    gradients equal the uncached layer's."""
    from gnnfuse.ops import gather_scatter as gs

    ei, x = random_graph(N, N, E, seed=16), torch.randn(N, F_IN)
    gathers = []
    real = torch.Tensor.index_select
    monkeypatch.setattr(torch.Tensor, "index_select",
                        lambda t, dim, idx: gathers.append(t.shape) or real(t, dim, idx))
    cached, plain = Net(G.GCNConv, F_IN, 16, 4, cached=True), Net(G.GCNConv, F_IN, 16, 4)
    plain.load_state_dict(cached.state_dict())
    for epoch in range(3):
        gathers.clear()
        xs = [x.clone().requires_grad_() for _ in range(2)]
        outs = [m(xi, ei) for m, xi in zip((cached, plain), xs)]
        grads = [torch.autograd.grad(o.pow(2).sum(), [xi, *m.parameters()]) for o, xi, m in zip(outs, xs,
                                                                                                (cached, plain))]
        torch.testing.assert_close(outs[0], outs[1])
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b)
        if epoch:  # the cached layers gather nothing of size E (but for the transpose-order copy of their
            # weights, made once by their second backward); the uncached ones once per layer
            assert sum(1 for shape in gathers if shape == (E,)) == (4 if epoch == 1 else 2)
    # the cache follows the weight tensor: an in-place change or a weight that wants grad is gathered anew
    csr, w = gnnfuse.CSR.from_edge_index(ei, N), torch.rand(E)
    first = gs._weight_in_csr_order(w, csr, torch.float32)
    assert gs._weight_in_csr_order(w, csr, torch.float32) is first
    w.mul_(2)
    again = gs._weight_in_csr_order(w, csr, torch.float32)
    assert again is not first and torch.equal(again, 2 * first)
    wg = w.clone().requires_grad_()
    assert gs._weight_in_csr_order(wg, csr, torch.float32) is not gs._weight_in_csr_order(wg, csr, torch.float32)


# ---- torch.compile ---------------------------------------------------------------------------------
@pytest.mark.parametrize("conv,kw", [("GCNConv", {}), ("SAGEConv", {}), ("SAGEConv", {"aggr": "max"})])
@pytest.mark.parametrize("graph_kind", ["csr", "edge_index"])
def test_compile_fullgraph(conv, kw, graph_kind):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net(getattr(G, conv), F_IN, 16, 4, **kw)
    ei, x = random_graph(N, N, E, seed=14), torch.randn(N, F_IN)
    graph = graph_as(graph_kind, ei, N)
    expected = model(x, ei)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # graph capture + autograd, no codegen
    out = compiled(x, graph)
    torch.testing.assert_close(out, expected)
    out.sum().backward()


@pytest.mark.slow
def test_compile_fullgraph_inductor():
    torch._dynamo.reset()
    model = Net(G.GCNConv, F_IN, 16, 4)
    ei, x = random_graph(N, N, E, seed=15), torch.randn(N, F_IN)
    csr = gnnfuse.CSR.from_edge_index(ei, N)
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x, csr), model(x, ei))


# ---- PyG's own tests for these layers (test/nn/conv/test_*_conv.py), key assertions re-implemented -------
def _pyg_inputs():
    x = torch.randn(4, 16)
    edge_index = torch.tensor([[0, 0, 0, 1, 2, 3], [1, 2, 3, 0, 0, 0]])
    value = torch.rand(edge_index.size(1))
    return x, edge_index, value


BIPARTITE_EDGE_INDEX = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])  # PyG's tests: 4 sources, 2 targets


def test_pyg_gcn_conv():
    x, edge_index, value = _pyg_inputs()
    conv = G.GCNConv(16, 32)
    assert str(conv) == "GCNConv(16, 32)"
    out1 = conv(x, edge_index)
    assert out1.size() == (4, 32)
    out2 = conv(x, edge_index, value)
    assert out2.size() == (4, 32)
    from torch_geometric.utils import to_torch_coo_tensor

    adj = to_torch_coo_tensor(edge_index, size=(4, 4))  # torch.sparse input runs PyG's spmm path
    torch.testing.assert_close(conv(x, adj.t()), out1, atol=1e-6, rtol=1e-5)
    adj = to_torch_coo_tensor(edge_index, value, size=(4, 4))
    torch.testing.assert_close(conv(x, adj.t()), out2, atol=1e-6, rtol=1e-5)
    conv.cached = True
    conv(x, edge_index)
    assert conv._gnnfuse_cached is not None
    torch.testing.assert_close(conv(x, edge_index), out1, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="does not support bipartite"):
        conv((x, x), edge_index)
    with pytest.raises(ValueError, match="does not support adding self-loops"):
        G.GCNConv(16, 32, normalize=False, add_self_loops=True)


def test_pyg_gcn_conv_with_decomposed_layers_and_norm():
    x, edge_index, _ = _pyg_inputs()
    conv = G.GCNConv(16, 32)
    decomposed = copy.deepcopy(conv)
    decomposed.decomposed_layers = 2
    torch.testing.assert_close(decomposed(x, edge_index), conv(x, edge_index), atol=1e-6, rtol=1e-5)
    # gcn_norm equivalence incl. a node without neighbours and an existing self-loop
    ei = torch.tensor([[0, 1, 1, 2], [1, 0, 1, 1]])
    w = torch.tensor([1.0, 2.0, 3.0, 4.0])
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    ei2, w2 = gcn_norm(ei, w, 4)
    dense = torch.zeros(4, 4).index_put_((ei2[1], ei2[0]), w2, accumulate=True)
    norm, loop = G.gcn_norm_weights(ei, w, 4)
    mine = torch.zeros(4, 4).index_put_((ei[1], ei[0]), norm, accumulate=True) + torch.diag(loop)
    torch.testing.assert_close(mine, dense)


@pytest.mark.parametrize("aggr", ["mean", "sum", "max", "min"])
def test_pyg_sage_conv(aggr):
    x, edge_index, _ = _pyg_inputs()
    conv = G.SAGEConv(16, 32, aggr=aggr)
    assert str(conv) == f"SAGEConv(16, 32, aggr={aggr})"
    out = conv(x, edge_index)
    assert out.size() == (4, 32)
    torch.testing.assert_close(conv(x, edge_index, size=(4, 4)), out)
    x1, x2 = torch.randn(4, 8), torch.randn(2, 16)
    conv = G.SAGEConv((8, 16), 32, aggr=aggr)
    assert str(conv) == f"SAGEConv((8, 16), 32, aggr={aggr})"
    edge_index = BIPARTITE_EDGE_INDEX
    out1 = conv((x1, x2), edge_index, (4, 2))
    assert out1.size() == (2, 32)
    out2 = conv((x1, None), edge_index, (4, 2))
    assert out2.size() == (2, 32)
    stock = P.SAGEConv((8, 16), 32, aggr=aggr)
    stock.load_state_dict(conv.state_dict())
    torch.testing.assert_close(out1, stock((x1, x2), edge_index, (4, 2)))
    torch.testing.assert_close(out2, stock((x1, None), edge_index, (4, 2)))


def test_pyg_sage_conv_unfused_aggr_runs_pyg():
    x, edge_index, _ = _pyg_inputs()
    torch.manual_seed(0)
    conv = G.SAGEConv(16, 32, aggr=["mean", "max"])  # multi-aggregation: PyG's path
    stock = P.SAGEConv(16, 32, aggr=["mean", "max"])
    stock.load_state_dict(conv.state_dict())
    torch.testing.assert_close(conv(x, edge_index), stock(x, edge_index))
    torch.testing.assert_close(conv(x, gnnfuse.CSR.from_edge_index(edge_index, 4)), stock(x, edge_index))


def test_pyg_gin_conv():
    x1, edge_index, _ = _pyg_inputs()
    x2 = torch.randn(2, 16)
    nn = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
    conv = G.GINConv(nn, train_eps=True)
    assert str(conv) == ("GINConv(nn=Sequential(\n  (0): Linear(in_features=16, out_features=32, bias=True)\n"
                         "  (1): ReLU()\n  (2): Linear(in_features=32, out_features=32, bias=True)\n))")
    out = conv(x1, edge_index)
    assert out.size() == (4, 32)
    torch.testing.assert_close(conv(x1, edge_index, size=(4, 4)), out)
    edge_index = BIPARTITE_EDGE_INDEX
    out1 = conv((x1, x2), edge_index, (4, 2))
    assert out1.size() == (2, 32)
    out2 = conv((x1, None), edge_index, (4, 2))
    assert out2.size() == (2, 32)


def test_pyg_graph_conv():
    x1, edge_index, value = _pyg_inputs()
    x2 = torch.randn(2, 16)
    conv = G.GraphConv(16, 32)
    assert str(conv) == "GraphConv(16, 32)"
    out1 = conv(x1, edge_index)
    assert out1.size() == (4, 32)
    out2 = conv(x1, edge_index, value)
    assert out2.size() == (4, 32)
    conv = G.GraphConv((16, 16), 32)
    edge_index, value = BIPARTITE_EDGE_INDEX, value[:4]
    assert str(conv) == "GraphConv((16, 16), 32)"
    out3 = conv((x1, x2), edge_index, size=(4, 2))
    assert out3.size() == (2, 32)
    out4 = conv((x1, x2), edge_index, value, size=(4, 2))
    assert out4.size() == (2, 32)
    eidx = EdgeIndex(edge_index, sparse_size=(4, 2))
    torch.testing.assert_close(conv((x1, x2), eidx), out3, atol=1e-6, rtol=1e-5)
