"""gnnfuse.nn.GATv2Conv and gnnfuse.nn.TransformerConv against PyG's layers: outputs and the gradients
of the input and every parameter, bipartite inputs, dropout (the kernels' mask, via the reference),
fallbacks, fuse() with state_dict, torch.compile."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch_geometric.nn as pyg_nn

import gnnfuse.nn as G
from gnnfuse import CSR
from gnnfuse.testing import assert_compiled_like_eager
from test_attention import BACKENDS, E, N, graph, on


def layer_run(layer, x, ei, ea=None):
    """(out, gradients of the inputs and every parameter; None for an unused one, e.g. lin_skip
    under root_weight=False)."""
    out = layer(x, ei, ea)
    inputs = ([x] if isinstance(x, torch.Tensor) else list(x)) + ([ea] if ea is not None else [])
    leaves = [t for t in inputs if t.requires_grad] + list(layer.parameters())
    return out, torch.autograd.grad((out * out.detach().cos()).sum(), leaves, allow_unused=True)

CONFIGS = {
    "gatv2-default": (pyg_nn.GATv2Conv, G.GATv2Conv, dict(heads=2)),
    "gatv2-mean-noloops-shared": (pyg_nn.GATv2Conv, G.GATv2Conv,
                                  dict(heads=3, concat=False, add_self_loops=False, share_weights=True,
                                       negative_slope=0.1)),
    "gatv2-residual-nobias": (pyg_nn.GATv2Conv, G.GATv2Conv, dict(heads=2, residual=True, bias=False)),
    "transformer-default": (pyg_nn.TransformerConv, G.TransformerConv, dict(heads=2)),
    "transformer-beta-mean": (pyg_nn.TransformerConv, G.TransformerConv, dict(heads=3, beta=True, concat=False)),
    "transformer-noroot": (pyg_nn.TransformerConv, G.TransformerConv, dict(heads=2, root_weight=False)),
    # edge features (edge_dim = 3): PyG's self-loop fill rules, keys and values with the edge term
    "gatv2-edge": (pyg_nn.GATv2Conv, G.GATv2Conv, dict(heads=2, edge_dim=3)),  # fill_value="mean"
    "gatv2-edge-fill-const": (pyg_nn.GATv2Conv, G.GATv2Conv, dict(heads=2, edge_dim=3, fill_value=0.5)),
    "gatv2-edge-fill-max-shared": (pyg_nn.GATv2Conv, G.GATv2Conv,
                                   dict(heads=3, edge_dim=3, fill_value="max", share_weights=True, concat=False)),
    "gatv2-edge-noloops": (pyg_nn.GATv2Conv, G.GATv2Conv, dict(heads=2, edge_dim=3, add_self_loops=False)),
    "transformer-edge": (pyg_nn.TransformerConv, G.TransformerConv, dict(heads=2, edge_dim=3)),
    "transformer-edge-beta-mean": (pyg_nn.TransformerConv, G.TransformerConv,
                                   dict(heads=3, edge_dim=3, beta=True, concat=False)),
}


def make_pair(name, in_channels, out_channels=4, dtype=torch.float64, **extra):
    pyg_cls, our_cls, kw = CONFIGS[name]
    torch.manual_seed(1)
    stock = pyg_cls(in_channels, out_channels, **kw, **extra).to(dtype)
    ours = our_cls(in_channels, out_channels, **kw, **extra).to(dtype)
    ours.load_state_dict(stock.state_dict())
    return stock, ours


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", CONFIGS)
def test_matches_pyg(name, backend):
    if backend == "triton" and not name.endswith(("default", "edge")):
        pytest.skip("the interpreter is slow: Triton runs the default configurations")
    stock, ours = make_pair(name, 6)
    dev = on(backend)
    stock, ours = stock.to(dev), ours.to(dev)
    ours.gnnfuse_backend = backend
    x = torch.randn(N, 6, dtype=torch.float64, device=dev, requires_grad=True)
    ei = graph().to(dev)
    ea = torch.randn(E, 3, dtype=torch.float64, device=dev, requires_grad=True) if "edge" in name else None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fused path, no fallback
        out, grads = layer_run(ours, x, ei, ea)
    ref, ref_grads = layer_run(stock, x, ei, ea)
    tol = dict(atol=1e-8, rtol=1e-8) if backend == "cpu" else dict(atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out, ref, **tol)
    assert [g is None for g in grads] == [r is None for r in ref_grads]
    for g, r in zip(grads, ref_grads):
        if r is not None:
            torch.testing.assert_close(g, r, **tol)


@pytest.mark.parametrize("name", ["gatv2-default", "transformer-beta-mean", "gatv2-edge", "transformer-edge"])
def test_bipartite_matches_pyg(name):
    stock, ours = make_pair(name, (5, 6))
    xs = torch.randn(10, 5, dtype=torch.float64, requires_grad=True)
    xd = torch.randn(7, 6, dtype=torch.float64, requires_grad=True)
    ei = torch.stack([torch.randint(0, 10, (30,)), torch.randint(0, 5, (30,))])  # targets 5, 6 without edges
    ea = torch.randn(30, 3, dtype=torch.float64, requires_grad=True) if "edge" in name else None
    (out, grads), (ref, ref_grads) = layer_run(ours, (xs, xd), ei, ea), layer_run(stock, (xs, xd), ei, ea)
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("name", ["gatv2-default", "transformer-default", "gatv2-edge", "transformer-edge"])
def test_dropout_matches_reference_with_the_same_mask(name):
    _, ours = make_pair(name, 6, dropout=0.5)
    ours.train()
    x = torch.randn(N, 6, dtype=torch.float64, requires_grad=True)
    ea = torch.randn(E, 3, dtype=torch.float64, requires_grad=True) if "edge" in name else None
    results = []
    for backend in ("cpu", "reference"):
        ours.gnnfuse_backend = backend
        torch.manual_seed(21)
        results.append(layer_run(ours, x, graph(), ea))
    torch.testing.assert_close(results[0][0], results[1][0])
    for g, r in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(g, r)


def test_fallbacks_warn_once_naming_the_argument_and_match():
    stock, ours = make_pair("transformer-default", 6)
    x, ea = torch.randn(N, 6, dtype=torch.float64), torch.randn(E, 3, dtype=torch.float64)
    with pytest.warns(UserWarning, match="return_attention_weights"):
        out, (_, alpha) = ours(x, graph(), return_attention_weights=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours(x, graph(), return_attention_weights=True)  # second time: silent
    ref, (_, ref_alpha) = stock(x, graph(), return_attention_weights=True)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(alpha, ref_alpha)
    stock, ours = make_pair("gatv2-default", 6)
    with pytest.warns(UserWarning, match="edge_dim is not set"), pytest.raises(AssertionError):
        ours(x, graph(), ea)  # PyG's own forward rejects edge features without lin_edge
    stock, ours = make_pair("gatv2-edge", 6)
    with pytest.warns(UserWarning, match="return_attention_weights"):
        out, (_, alpha) = ours(x, graph(), return_attention_weights=True)
    ref, (_, ref_alpha) = stock(x, graph(), return_attention_weights=True)
    torch.testing.assert_close(alpha, ref_alpha)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # warned once above
        out, (_, alpha) = ours(x, graph(), ea, return_attention_weights=True)
    ref, (_, ref_alpha) = stock(x, graph(), ea, return_attention_weights=True)
    torch.testing.assert_close(alpha, ref_alpha)


def test_fuse_converts_and_keeps_state_dict():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"a": pyg_nn.GATv2Conv(6, 4, heads=2), "b": pyg_nn.TransformerConv(8, 3)})
    keys = model.state_dict().keys()
    x = torch.randn(N, 6)
    before = model["b"](model["a"](x, graph()), graph())
    G.fuse(model)
    assert sorted(model.gnnfuse_fused) == ["a", "b"]
    assert type(model["a"]) is G.GATv2Conv and type(model["b"]) is G.TransformerConv
    assert model.state_dict().keys() == keys
    torch.testing.assert_close(model["b"](model["a"](x, graph()), graph()), before)


def test_compiles_fullgraph():
    csr = CSR.from_edge_index(graph(), N)
    for name in ("gatv2-default", "transformer-default"):
        _, conv = make_pair(name, 6, dtype=torch.float32)
        conv.eval()
        x = torch.randn(N, 6, requires_grad=True)
        out, eager = torch.compile(conv, fullgraph=True)(x, csr), conv(x, csr)
        torch.testing.assert_close(out, eager)
        torch.testing.assert_close(torch.autograd.grad(out.sum(), x)[0], torch.autograd.grad(eager.sum(), x)[0])


@pytest.mark.filterwarnings("ignore:gnnfuse.nn")
@pytest.mark.parametrize("pyg_cls,our_cls", [(pyg_nn.GATConv, G.GATConv), (pyg_nn.GATv2Conv, G.GATv2Conv),
                                             (pyg_nn.TransformerConv, G.TransformerConv)])
def test_explainer_gets_edge_masks_after_a_stock_layer(pyg_cls, our_cls):
    """A stock layer of the same class built first must not leave the fused class with PyG's
    generated propagate template (no explain support): GNNExplainer gets the same edge mask."""
    from torch_geometric.explain import Explainer, GNNExplainer

    class Net(torch.nn.Module):
        def __init__(self, conv):
            super().__init__()
            self.conv = conv

        def forward(self, x, edge_index):
            return self.conv(x, edge_index).log_softmax(dim=-1)

    torch.manual_seed(1)
    stock = pyg_cls(6, 4, heads=2).double()
    ours = our_cls(6, 4, heads=2).double()
    ours.load_state_dict(stock.state_dict())
    x, ei = torch.randn(N, 6, dtype=torch.float64), graph()
    masks = []
    for conv in (stock, ours):
        torch.manual_seed(2)
        explainer = Explainer(Net(conv), algorithm=GNNExplainer(epochs=3), explanation_type="model",
                              edge_mask_type="object", model_config=dict(
                                  mode="multiclass_classification", task_level="node", return_type="log_probs"))
        masks.append(explainer(x, ei, index=1).edge_mask)
    torch.testing.assert_close(masks[1], masks[0])
    assert masks[1].abs().sum() > 0


@pytest.mark.parametrize("name,extra", [("gatv2-default", {}), ("transformer-default", {}),
                                        ("gatv2-default", dict(bias=False)), ("transformer-beta-mean", {})])
@pytest.mark.parametrize("x_grad", [False, True])
def test_one_node_route_matches_the_default_route(name, extra, x_grad, monkeypatch):
    """The layers' one-node route (nn/_pair_node.py: the query/key/value linears and the fused
    attention under one autograd node, Triton eager) gives the same output and gradients, bit for
    bit, as the default route (PyG's linears through autograd + the attention op), dropout included;
    x's gradient up to the order in which its terms (query, key, value, skip) are added."""
    from gnnfuse.nn import _pair_attention, _pair_node

    dev = on("triton")
    _, ours = make_pair(name, 6, dropout=0.3, **extra)
    ours = ours.to(dev).train()
    ours.gnnfuse_backend = "triton"
    x = torch.randn(N, 6, dtype=torch.float64, device=dev, requires_grad=x_grad)
    ei = graph().to(dev)
    linears = (ours.lin_r, ours.lin_l, None) if name.startswith("gatv2") else \
        (ours.lin_query, ours.lin_key, ours.lin_value)
    assert _pair_node.applies(ours, x, x, linears, getattr(ours, "att", None))
    runs = []
    for one_node in (True, False):
        if not one_node:
            monkeypatch.setattr(_pair_attention, "node_applies", lambda *args: False)
        torch.manual_seed(7)
        runs.append(layer_run(ours, x, ei))
    (out, grads), (ref, ref_grads) = runs
    assert torch.equal(out, ref)
    assert [g is None for g in grads] == [r is None for r in ref_grads]
    if x_grad:
        torch.testing.assert_close(grads[0], ref_grads[0], atol=1e-13, rtol=1e-13)
        grads, ref_grads = grads[1:], ref_grads[1:]
    assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads) if r is not None)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["gatv2-edge", "gatv2-edge-fill-const", "transformer-edge"])
def test_edge_features_in_csr_order_match_edge_order(name, backend, monkeypatch):
    """The layers' edge features in CSR order (EDGES_IN_CSR_ORDER: the raw edge_attr reordered, cached
    when constant) against the edge_index order: the same outputs and gradients; a constant edge_attr
    changed in place after a call is picked up (the cache's stamp), as is another graph."""
    from gnnfuse.nn import _attention

    dev = on(backend)
    _, ours = make_pair(name, 6, dtype=torch.float32)
    ours = ours.to(dev)
    ours.gnnfuse_backend = backend
    x = torch.randn(N, 6, device=dev, requires_grad=True)
    ei = graph().to(dev)
    results = {}
    for csr_order in (False, True):
        monkeypatch.setattr(_attention, "EDGES_IN_CSR_ORDER", csr_order)
        ea = torch.randn(E, 3, generator=torch.Generator().manual_seed(3)).to(dev)  # constant: cached
        first = layer_run(ours, x, ei, ea)
        with torch.no_grad():
            ea.mul_(-0.5)  # an in-place change after the first call
        changed = layer_run(ours, x, ei, ea)
        flipped = layer_run(ours, x, ei.flip(1), ea.flip(0))  # same graph, other edge order
        ea_grad = ea.clone().requires_grad_()
        results[csr_order] = [first, changed, flipped, layer_run(ours, x, ei, ea_grad)]
    for (out, grads), (ref, ref_grads) in zip(results[True], results[False]):
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        for g, r in zip(grads, ref_grads):
            if r is not None:
                torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(results[True][0][0], results[True][1][0])


def test_edge_features_compile_fullgraph():
    csr = CSR.from_edge_index(graph(), N)
    for name in ("gatv2-edge", "transformer-edge"):
        _, conv = make_pair(name, 6, dtype=torch.float32)
        conv.eval()
        assert_compiled_like_eager(conv, torch.randn(N, 6, requires_grad=True), csr, E, 3)
