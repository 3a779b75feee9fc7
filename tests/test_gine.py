"""gnnfuse.gine_aggregate (GINEConv's message + aggregation in one kernel) and gnnfuse.nn.GINEConv.

The op against the plain-torch reference (forward and gradients, CPU and Triton in interpreter
mode), gradcheck in float64, opcheck, torch.compile; the layer against PyG's GINEConv with the same
weights (outputs and every gradient), through fuse(), and its PyG-path fallbacks.
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import gnnfuse
from gnnfuse.ops.edge_message import reference
from gnnfuse.testing import random_graph

BACKENDS = ["cpu", "triton"]


def _device(backend):
    """Triton runs on CUDA tensors on a GPU host, in the interpreter on CPU tensors elsewhere (conftest)."""
    return "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"


def _inputs(num_src=9, num_dst=7, num_edges=30, F=5, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = random_graph(num_src, num_dst, num_edges, seed=seed)
    x = torch.randn(num_src, F, generator=g, dtype=dtype)
    ea = torch.randn(num_edges, F, generator=g, dtype=dtype)
    return x, ea, ei


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_reference_with_gradients(backend, reduce, dtype):
    x, ea, ei = (t.to(_device(backend)) for t in _inputs(dtype=dtype))
    csr = gnnfuse.CSR.from_edge_index(ei, (9, 7))
    results = []
    for run in ("fused", "reference"):
        xr, er = x.clone().requires_grad_(), ea.clone().requires_grad_()
        if run == "fused":
            out = gnnfuse.gine_aggregate(xr, er, csr, reduce, backend=backend)
        else:
            out = reference(xr, er, ei[0], ei[1], 7, reduce)
        out.backward(torch.linspace(-1, 1, out.numel(), dtype=dtype, device=out.device).view_as(out))
        results.append((out, xr.grad, er.grad))
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-12, rtol=1e-12)
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_int32_csr_empty_rows_and_edge_only_gradient(backend):
    # the Triton interpreter runs every program in Python: its gradcheck stays tiny (2 features, one reduce)
    x, ea, ei = (t.to(_device(backend)) for t in _inputs(num_edges=12, F=5 if backend == "cpu" else 2))
    csr = gnnfuse.CSR.from_edge_index(ei, (9, 7), index_dtype=torch.int32)
    for reduce in ("sum", "mean") if backend == "cpu" else ("mean",):
        torch.autograd.gradcheck(lambda a, b: gnnfuse.gine_aggregate(a, b, csr, reduce, backend=backend),
                                 (x.clone().requires_grad_(), ea.clone().requires_grad_()))
    er = ea.clone().requires_grad_()  # x without gradient: no transpose is built
    out = gnnfuse.gine_aggregate(x, er, csr, "mean", backend=backend)
    out.sum().backward()
    er2 = ea.clone().requires_grad_()
    reference(x, er2, ei[0], ei[1], 7, "mean").sum().backward()
    torch.testing.assert_close(er.grad, er2.grad)
    empty = gnnfuse.gine_aggregate(x, ea[:0], torch.empty(2, 0, dtype=torch.long, device=x.device), num_nodes=3,
                                   backend=backend)
    assert empty.shape == (3, x.shape[1]) and not empty.any()


def test_opcheck_compile_and_double_backward():
    x, ea, ei = _inputs()
    csr = gnnfuse.CSR.from_edge_index(ei, (9, 7))
    xr, er = x.clone().requires_grad_(), ea.clone().requires_grad_()
    t_rowptr, t_col, t_pos = csr._transpose_parts()
    torch.library.opcheck(torch.ops.gnnfuse.gine_aggregate.default,
                          (xr, er, csr.rowptr, csr.col, csr.perm, t_rowptr, t_col, t_pos, True))
    torch.library.opcheck(torch.ops.gnnfuse.gine_aggregate.default,
                          (x, ea, csr.rowptr, csr.col, csr.perm, None, None, None, False))
    compiled = torch.compile(lambda a, b: gnnfuse.gine_aggregate(a, b, csr).square().sum(), fullgraph=True,
                             dynamic=True)
    torch.testing.assert_close(compiled(xr, er), gnnfuse.gine_aggregate(xr, er, csr).square().sum())
    out = gnnfuse.gine_aggregate(xr, er, csr, backend="cpu")
    (g,) = torch.autograd.grad(out.sum(), xr, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()


def test_errors_name_the_argument():
    x, ea, ei = _inputs()
    with pytest.raises(ValueError, match="edge_attr"):
        gnnfuse.gine_aggregate(x, ea[:, :3], ei)
    with pytest.raises(TypeError, match="edge_attr"):
        gnnfuse.gine_aggregate(x, ea.float(), ei)
    with pytest.raises(ValueError, match="reduce"):
        gnnfuse.gine_aggregate(x, ea, ei, "max")


# ---- the layer ---------------------------------------------------------------------------------------
pyg = pytest.importorskip("torch_geometric")
import torch_geometric.nn as P  # noqa: E402

import gnnfuse.nn as G  # noqa: E402


def _mlp(f_in, f_out):
    return torch.nn.Sequential(torch.nn.Linear(f_in, 16), torch.nn.ReLU(), torch.nn.Linear(16, f_out))


def _pair(**kwargs):
    torch.manual_seed(0)
    stock = P.GINEConv(_mlp(8, 6), **kwargs).double()
    fused = G.GINEConv(_mlp(8, 6), **kwargs).double()
    fused.load_state_dict(stock.state_dict())
    return stock, fused


def _run(module, x, graph, ea, **kw):
    module.zero_grad()
    xs = tuple(t.clone().requires_grad_() if t is not None else None for t in x) if isinstance(x, tuple) \
        else x.clone().requires_grad_()
    er = ea.clone().requires_grad_()
    out = module(xs, graph, er, **kw)
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out))
    leaves = xs if isinstance(xs, tuple) else (xs,)
    grads = [t.grad for t in leaves if t is not None] + [er.grad]
    return out, grads + [p.grad for p in module.parameters()]


@pytest.mark.parametrize("kwargs", [dict(), dict(train_eps=True, eps=0.2), dict(edge_dim=3), dict(aggr="mean")])
def test_layer_matches_pyg(kwargs, monkeypatch):
    import gnnfuse.nn._gine as gine

    calls = []
    real = gine.gine_aggregate
    monkeypatch.setattr(gine, "gine_aggregate", lambda *a, **k: calls.append(1) or real(*a, **k))
    stock, fused = _pair(**kwargs)
    ei = random_graph(10, 10, 40, seed=4)
    x = torch.randn(10, 8, dtype=torch.float64)
    ea = torch.randn(40, kwargs.get("edge_dim", 8), dtype=torch.float64)
    for graph in (ei, gnnfuse.CSR.from_edge_index(ei, 10)):
        got, want = _run(fused, x, graph, ea), _run(stock, x, ei, ea)
        for a, b in zip(got[1], want[1]):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(got[0], want[0])
    assert len(calls) == 2
    x_dst = torch.randn(4, 8, dtype=torch.float64)  # bipartite
    bip = random_graph(10, 4, 20, seed=5)
    got, want = _run(fused, (x, x_dst), bip, ea[:20]), _run(stock, (x, x_dst), bip, ea[:20])
    for a, b in zip([got[0], *got[1]], [want[0], *want[1]]):
        torch.testing.assert_close(a, b)


def test_fuse_converts_and_falls_back_with_a_warning(monkeypatch):
    import gnnfuse.nn._pyg_path as pyg_path

    monkeypatch.setattr(pyg_path, "_warned", set())
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"sum": P.GINEConv(_mlp(8, 6)), "max": P.GINEConv(_mlp(8, 6), aggr="max")})
    stock = copy.deepcopy(model)
    G.fuse(model, warn=False)
    assert type(model["sum"]) is G.GINEConv and type(model["max"]) is G.GINEConv
    ei = random_graph(10, 10, 40, seed=6)
    x, ea = torch.randn(10, 8), torch.randn(40, 8)
    torch.testing.assert_close(model["sum"](x, ei, ea), stock["sum"](x, ei, ea), atol=1e-5, rtol=1e-5)
    with pytest.warns(UserWarning, match="GINEConv: aggregation 'max' is not sum/mean"):
        torch.testing.assert_close(model["max"](x, ei, ea), stock["max"](x, ei, ea))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(model["sum"])
    torch.testing.assert_close(scripted(x, ei, ea), stock["sum"](x, ei, ea), atol=1e-5, rtol=1e-5)


@pytest.mark.filterwarnings("ignore:gnnfuse.nn")
def test_explainer_gets_edge_masks():
    from torch_geometric.explain import Explainer, GNNExplainer

    class Net(torch.nn.Module):
        def __init__(self, conv):
            super().__init__()
            self.conv = conv

        def forward(self, x, edge_index, edge_attr):
            return self.conv(x, edge_index, edge_attr).log_softmax(dim=-1)

    stock, fused = _pair(edge_dim=3)
    ei = random_graph(10, 10, 40, seed=7)
    x, ea = torch.randn(10, 8, dtype=torch.float64), torch.randn(40, 3, dtype=torch.float64)
    masks = []
    for conv in (stock, fused):
        torch.manual_seed(2)
        explainer = Explainer(Net(conv), algorithm=GNNExplainer(epochs=3), explanation_type="model",
                              edge_mask_type="object", model_config=dict(
                                  mode="multiclass_classification", task_level="node", return_type="log_probs"))
        masks.append(explainer(x, ei, edge_attr=ea, index=1).edge_mask)
    torch.testing.assert_close(masks[1], masks[0])
    assert masks[1].abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_accumulate_in_float(dtype):
    x, ea, ei = _inputs(dtype=torch.float32)
    out = gnnfuse.gine_aggregate(x.to(dtype), ea.to(dtype), ei, "mean", num_nodes=7, backend="cpu")
    want = reference(x.to(dtype).float(), ea.to(dtype).float(), ei[0], ei[1], 7, "mean")
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), want, atol=1e-2, rtol=1e-2)


def test_layer_compiles_fullgraph():
    stock, fused = _pair(edge_dim=3)
    ei = random_graph(10, 10, 40, seed=8)
    csr = gnnfuse.CSR.from_edge_index(ei, 10)
    x, ea = torch.randn(10, 8, dtype=torch.float64), torch.randn(40, 3, dtype=torch.float64)
    compiled = torch.compile(fused, fullgraph=True)
    torch.testing.assert_close(compiled(x, csr, ea), stock(x, ei, ea))
