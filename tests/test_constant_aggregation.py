"""A layer's aggregation of a constant input (gnnfuse.nn._mixin.constant_result) and GCNConv's
aggregate-first order: kept from the second call, recomputed whenever anything it depends on
changes, never for inputs that need a gradient, and the same numbers as computing it every time
(and, for GCN, as stock PyG up to rounding)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("torch_geometric")
import torch_geometric.nn as P  # noqa: E402

import gnnfuse.nn as G  # noqa: E402
from gnnfuse.testing import TwoLayerNet as Net  # noqa: E402
from gnnfuse.testing import random_graph  # noqa: E402

N, E = 50, 300


@pytest.fixture
def calls(monkeypatch):
    """The input widths of every fused aggregation the layers run."""
    import gnnfuse.nn._mixin as mixin

    seen, real = [], mixin.fused_gather_scatter
    monkeypatch.setattr(mixin, "fused_gather_scatter", lambda x, *a, **k: seen.append(x.shape[-1]) or real(x, *a, **k))
    return seen


def test_kept_from_the_second_call_and_recomputed_on_any_change(calls):
    ei, x = random_graph(N, N, E, seed=1), torch.randn(N, 12)
    conv = G.SAGEConv(12, 16, aggr="max")
    outs = [conv(x, ei) for _ in range(3)]
    assert calls == [12, 12]  # the first call computes, the second computes and keeps, the third reuses
    assert torch.equal(outs[0], outs[2])
    x.mul_(2)  # an in-place change of the input
    torch.testing.assert_close(conv(x, ei), _stock_sage(conv)(x, ei))
    assert calls == [12, 12, 12]
    calls.clear()
    for _ in range(2):
        conv(x, ei)
    assert calls == [12]  # kept again from the second call with the changed input
    ei2 = ei.clone()  # another graph tensor: its own entry
    conv(x, ei2)
    assert calls == [12, 12]


def _stock_sage(conv):
    stock = P.SAGEConv(12, 16, aggr="max")
    stock.load_state_dict(conv.state_dict())
    return stock


def test_a_returned_tensor_changed_in_place_is_recomputed():
    from gnnfuse.nn._mixin import constant_result

    x = torch.randn(N, 4)
    count = []

    def compute():
        count.append(1)
        return x * 3

    first = [constant_result("test", (x,), (), compute) for _ in range(2)][1]
    assert constant_result("test", (x,), (), compute) is first and len(count) == 2
    first.add_(1)  # the caller changed the kept result
    again = constant_result("test", (x,), (), compute)
    assert again is not first and torch.equal(again, x * 3) and len(count) == 3


def test_never_kept_for_inputs_with_gradient_or_when_turned_off(calls, monkeypatch):
    ei = random_graph(N, N, E, seed=2)
    conv = G.SAGEConv(12, 16, aggr="max")
    x = torch.randn(N, 12, requires_grad=True)
    for _ in range(3):
        conv(x, ei).sum().backward()
    assert calls == [12, 12, 12]
    calls.clear()
    monkeypatch.setenv("GNNFUSE_CACHE_CONSTANT_AGGREGATION", "0")
    x = torch.randn(N, 12)
    for _ in range(3):
        conv(x, ei)
    assert calls == [12, 12, 12]
    calls.clear()
    monkeypatch.setenv("GNNFUSE_CACHE_CONSTANT_AGGREGATION", "1")
    w = torch.rand(E, requires_grad=True)  # a weight that wants a gradient: never constant
    gconv = G.GraphConv(12, 16, aggr="max")
    for _ in range(3):
        gconv(x, ei, w)
    assert calls == [12, 12, 12]


@pytest.mark.parametrize("conv,kw", [("GCNConv", {"cached": True}), ("GCNConv", {}), ("SAGEConv", {}),
                                     ("SAGEConv", {"aggr": "max"}), ("GINConv", None)])
def test_training_with_kept_aggregations_equals_computing_them_every_epoch(conv, kw, monkeypatch):
    """Three epochs of a 2-layer model on raw features: outputs and every gradient bitwise the same
    with the kept first-layer aggregation as with GNNFUSE_CACHE_CONSTANT_AGGREGATION=0."""
    ei, x = random_graph(N, N, E, seed=3), torch.randn(N, 12)
    results = []
    for flag in ("1", "0"):
        monkeypatch.setenv("GNNFUSE_CACHE_CONSTANT_AGGREGATION", flag)
        torch.manual_seed(0)
        if kw is None:
            model = Net(lambda i, o: G.GINConv(torch.nn.Linear(i, o)), 12, 16, 4)
        else:
            model = Net(getattr(G, conv), 12, 16, 4, **kw)
        run = []
        for _ in range(3):
            model.zero_grad()
            out = model(x, ei)
            out.pow(2).sum().backward()
            run.append([out.detach(), *[p.grad.clone() for p in model.parameters()]])
        results.append(run)
    for a, b in zip(*results):
        for u, v in zip(a, b):
            assert torch.equal(u, v)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("kw", [{}, {"cached": True}, {"improved": True}, {"add_self_loops": False}])
def test_gcn_aggregates_first_where_it_moves_fewer_features(kw, weighted, calls):
    """A first layer (raw x, no gradient) aggregates x (12 wide) rather than x @ W.T (8 wide, which
    would need a backward pass too): the same outputs and parameter gradients as stock PyG."""
    ei, x = random_graph(N, N, E, seed=4), torch.randn(N, 12, dtype=torch.float64)
    w = torch.rand(E, dtype=torch.float64) if weighted else None
    stock = P.GCNConv(12, 8, **kw).double()
    fused = G.GCNConv(12, 8, **kw).double()
    fused.load_state_dict(stock.state_dict())
    for _ in range(3):  # the third call uses the kept propagated input
        outs = [m(x, ei, w) for m in (stock, fused)]
        torch.testing.assert_close(outs[1], outs[0], atol=1e-10, rtol=1e-10)
        grads = [torch.autograd.grad(o.pow(2).sum(), list(m.parameters())) for o, m in zip(outs, (stock, fused))]
        for a, b in zip(*grads):
            torch.testing.assert_close(b, a, atol=1e-10, rtol=1e-10)
    # kept with cached=True; without it the normalisation is a new tensor every call, so is the result
    assert calls == ([12, 12] if kw.get("cached") else [12, 12, 12])
    calls.clear()
    fused.gnnfuse_aggregate_first = False  # PyG's order: lin first, aggregated every call
    fused(x, ei, w)
    assert calls == [8]
    calls.clear()
    fused.gnnfuse_aggregate_first = True
    fused(x.clone().requires_grad_(), ei, w)  # x needs a gradient: 12 * 2.5 > 8 * 2.5, lin first
    assert calls == [8]


def test_gcn_widening_layer_with_input_gradient_aggregates_first(calls):
    ei, x = random_graph(N, N, E, seed=5), torch.randn(N, 4, dtype=torch.float64, requires_grad=True)
    stock, fused = P.GCNConv(4, 9).double(), G.GCNConv(4, 9).double()
    fused.load_state_dict(stock.state_dict())
    outs = [m(x, ei) for m in (stock, fused)]
    torch.testing.assert_close(outs[1], outs[0])
    ga, gb = (torch.autograd.grad(o.pow(2).sum(), [x, *m.parameters()]) for o, m in zip(outs, (stock, fused)))
    for a, b in zip(ga, gb):
        torch.testing.assert_close(b, a)
    assert calls == [4]  # the x-wide aggregation (its backward runs through autograd)
