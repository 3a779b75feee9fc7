"""gnnfuse.nn.aggr modules (in PyG layers and on gnnfuse's fused path) and gnnfuse.nn.PNAConv
against PyG: outputs and every parameter's gradient."""
import copy
import os

import pytest
import torch

pyg = pytest.importorskip("torch_geometric")
import torch_geometric.nn as pyg_nn  # noqa: E402
from torch_geometric.nn import aggr as pyg_aggr  # noqa: E402

import gnnfuse  # noqa: E402
from gnnfuse.nn import aggr  # noqa: E402


# PyG builds a layer class's propagate from a template once, at its first instance, and that
# instance's aggregation decides whether the template fuses: a stock GraphConv first built here with
# an aggregation module would make every later GraphConv in the process take the unfused template.
# Local subclasses keep these tests from changing the classes other test files use.
class StockSAGE(pyg_nn.SAGEConv):
    pass


class StockGraph(pyg_nn.GraphConv):
    pass


class FusedSAGE(gnnfuse.nn.SAGEConv):
    pass


class FusedGraph(gnnfuse.nn.GraphConv):
    pass


def _graph(n=12, e=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    ei[1][ei[1] == n - 1] = 0  # node n-1 has no incoming edge
    return torch.randn(n, 6, generator=g, dtype=torch.float64), ei


def _grads(module):
    return {k: p.grad.clone() for k, p in module.named_parameters() if p.grad is not None}


def _compare(ours, theirs, *inputs):
    out_ours, out_theirs = ours(*inputs), theirs(*inputs)
    torch.testing.assert_close(out_ours, out_theirs)
    go = torch.randn_like(out_ours)
    (out_ours * go).sum().backward()
    (out_theirs * go).sum().backward()
    g_ours, g_theirs = _grads(ours), _grads(theirs)
    assert g_ours.keys() == g_theirs.keys() and g_ours
    for k in g_ours:
        torch.testing.assert_close(g_ours[k], g_theirs[k], msg=k)


CLASSES = [(aggr.SumAggregation, pyg_aggr.SumAggregation), (aggr.MeanAggregation, pyg_aggr.MeanAggregation),
           (aggr.MaxAggregation, pyg_aggr.MaxAggregation), (aggr.MinAggregation, pyg_aggr.MinAggregation),
           (aggr.VarAggregation, pyg_aggr.VarAggregation), (aggr.StdAggregation, pyg_aggr.StdAggregation)]


@pytest.mark.parametrize("ours,theirs", CLASSES, ids=lambda c: c.__name__)
def test_aggregation_modules_in_pyg_layers(ours, theirs):
    x, ei = _graph()
    torch.manual_seed(0)
    conv = StockSAGE(6, 4, aggr=ours()).double()
    ref = copy.deepcopy(conv)
    ref.aggr_module = theirs()
    _compare(conv, ref, x, ei)


@pytest.mark.parametrize("ours,theirs", CLASSES, ids=lambda c: c.__name__)
def test_aggregation_modules_take_the_fused_path(ours, theirs, monkeypatch):
    x, ei = _graph()
    torch.manual_seed(0)
    conv = FusedGraph(6, 4, aggr=ours()).double()
    ref = StockGraph(6, 4, aggr=theirs()).double()
    ref.load_state_dict(conv.state_dict())
    monkeypatch.setattr(type(conv), "message", lambda *a: pytest.fail("messages were built"))
    _compare(conv, ref, x, ei)


def test_multi_aggregation_one_pass_matches_pyg():
    x, ei = _graph()
    names = ["mean", "min", "max", "std", "var", "sum"]
    for conv_cls in (StockSAGE, FusedSAGE):
        torch.manual_seed(0)
        conv = conv_cls(6, 4, aggr=aggr.MultiAggregation(names)).double()
        ref = StockSAGE(6, 4, aggr=pyg_aggr.MultiAggregation(names)).double()
        ref.load_state_dict(conv.state_dict())
        _compare(conv, ref, x, ei)
    assert aggr.MultiAggregation(names).gnnfuse_reduce == names
    assert aggr.MultiAggregation(names, mode="sum").gnnfuse_reduce is None
    assert aggr.reduce_of(pyg_aggr.MultiAggregation(["mean", aggr.MaxAggregation()])) == ["mean", "max"]


def test_semi_grad_is_refused_clearly():
    with pytest.raises(ValueError, match="semi_grad"):
        aggr.StdAggregation(semi_grad=True)


DEG = torch.tensor([1, 3, 4, 2, 1])
PNA_CASES = [
    dict(aggregators=["mean", "min", "max", "std"], scalers=["identity", "amplification", "attenuation"], towers=1),
    dict(aggregators=["sum", "var", "max"], scalers=["identity", "linear", "inverse_linear"], towers=2),
    dict(aggregators=["mean", "min"], scalers=["identity"], towers=3, divide_input=True, train_norm=True),
    dict(aggregators=["mean", "std"], scalers=["identity"], towers=1, pre_layers=2),  # PyG's path
    dict(aggregators=["mean", "max"], scalers=["identity", "amplification"], towers=1, edge_dim=3),  # PyG's path
]


@pytest.mark.parametrize("kwargs", PNA_CASES)
def test_pna_conv_matches_pyg(kwargs):
    x, ei = _graph()
    torch.manual_seed(0)
    conv = gnnfuse.nn.PNAConv(6, 6, deg=DEG, post_layers=2, **kwargs).double()
    ref = pyg_nn.PNAConv(6, 6, deg=DEG, post_layers=2, **kwargs).double()
    ref.load_state_dict(conv.state_dict())
    assert list(conv.state_dict()) == list(ref.state_dict())
    fused = "edge_dim" not in kwargs and "pre_layers" not in kwargs
    assert (conv._fused_aggregators(x, ei, None) is not None) == fused
    inputs = (x, ei) if "edge_dim" not in kwargs else (x, ei, torch.randn(ei.shape[1], 3, dtype=torch.float64))
    _compare(conv, ref, *inputs)


def test_pna_conv_with_csr_and_compile():
    x, ei = _graph()
    x = x.float()
    torch.manual_seed(0)
    conv = gnnfuse.nn.PNAConv(6, 6, ["mean", "min", "max", "std"], ["identity", "amplification"], DEG)
    want = conv(x, ei)
    torch.testing.assert_close(conv(x, gnnfuse.CSR.from_edge_index(ei, num_nodes=12)), want)
    torch.testing.assert_close(torch.compile(conv, fullgraph=True, dynamic=True)(x, ei), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("multi", [["mean", "max", "std"], aggr.MultiAggregation(["sum", "min"]),
                                   pyg_aggr.MultiAggregation(["mean", "var"])], ids=["names", "ours", "pyg"])
def test_fused_layers_take_multi_aggregation_in_one_pass(multi, monkeypatch):
    """A concatenating multi-aggregation (a list of names, ours or PyG's module) runs the fused
    layer's one-pass op, with no message tensor; results and gradients match stock PyG."""
    x, ei = _graph()
    torch.manual_seed(0)
    conv = FusedSAGE(6, 4, aggr=copy.deepcopy(multi)).double()
    ref = StockSAGE(6, 4, aggr=copy.deepcopy(multi)).double()
    ref.load_state_dict(conv.state_dict())
    monkeypatch.setattr(type(conv), "message", lambda *a: pytest.fail("messages were built"))
    _compare(conv, ref, x, ei)
    assert gnnfuse.nn._mixin.fused_reduce(pyg_aggr.MultiAggregation(["mean", "max"], mode="sum")) is None


def _outputs_and_grads(convs, x, ei):
    """Each layer's output and its gradients of x and of every parameter."""
    outs, grads = [], []
    for conv in convs:
        xg = x.clone().requires_grad_()
        out = conv(xg, ei)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        outs.append(out)
        grads.append({"x": xg.grad, **_grads(conv)})
    return outs, grads


def _assert_same(outs, grads):
    torch.testing.assert_close(outs[0], outs[1])
    assert grads[0].keys() == grads[1].keys()
    for k in grads[0]:
        torch.testing.assert_close(grads[0][k], grads[1][k], msg=k)


def _assert_same_outputs_and_grads(conv_a, conv_b, x, ei):
    """Both layers give the same output and the same gradients of x and of every parameter."""
    _assert_same(*_outputs_and_grads((conv_a, conv_b), x, ei))


@pytest.mark.parametrize("divide_input", [False, True])
def test_pna_conv_recomputes_aggregations_in_backward(divide_input, monkeypatch):
    """By default no tower keeps its aggregation for the backward: the forward aggregates each
    tower once without winners (no transpose), the backward once more with them; outputs and the
    gradients of x and every parameter equal those of the layer that keeps its aggregations."""
    from gnnfuse.nn import _pna_projection

    x, ei = _graph()
    torch.manual_seed(0)
    kwargs = dict(aggregators=["mean", "min", "max", "std", "sum"], scalers=["identity", "amplification"], deg=DEG,
                  towers=2, divide_input=divide_input, post_layers=2)
    lean = gnnfuse.nn.PNAConv(6, 6, **kwargs).double()
    keep = copy.deepcopy(lean)
    keep.recompute_aggregations = False
    calls = []
    real = _pna_projection.MULTI_FORWARD

    def spy(*args, **kwargs):
        calls.append(args[4] is not None)  # t_rowptr given: winners tracked
        return real(*args, **kwargs)

    monkeypatch.setattr(_pna_projection, "MULTI_FORWARD", spy)
    outs, grads = _outputs_and_grads((lean, keep), x, ei)
    assert calls == [False, False, True, True]  # lean: 2 untracked, then 2 recomputed with winners; keep: none
    _assert_same(outs, grads)




def test_pna_conv_repeated_aggregator_matches_keep():
    """An aggregator listed twice: its post-layer blocks are summed before the rule (one
    aggregation block); outputs and gradients equal those of the layer that keeps them."""
    x, ei = _graph()
    torch.manual_seed(0)
    lean = gnnfuse.nn.PNAConv(6, 6, ["max", "mean", "max"], ["identity", "linear"], DEG).double()
    keep = copy.deepcopy(lean)
    keep.recompute_aggregations = False
    _assert_same_outputs_and_grads(lean, keep, x, ei)


PROJECTION_NAMES = [("mean", "min", "max", "std"), ("sum", "var", "max"), ("std",), ("min", "mean"),
                    ("sum", "mean", "var", "std"), ("var", "min"), ("sum",)]


def _projection_case(names, seed=1):
    x, ei = _graph(n=9, e=30, seed=seed)
    csr = gnnfuse.CSR.from_edge_index(ei, num_nodes=9)
    g = torch.Generator().manual_seed(seed + 1)
    x_t = torch.randn(9, 5, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(len(names), 4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    return csr, (x_t, b, w)


def _projection(csr, names, backend, chunk):
    from gnnfuse.nn._pna_projection import AggregatedProjection

    deg = csr.in_degree().double()
    return lambda x_t, b, w: AggregatedProjection.apply(x_t, b, w, csr, names, backend, chunk, deg)


@pytest.mark.parametrize("names", PROJECTION_NAMES, ids=",".join)
def test_aggregated_projection_gradcheck(names):
    """The tower's aggregation-times-post-layer rule (its own backward) against the reference
    forward and autograd's numerical derivative in float64, whole and in feature chunks."""
    csr, inputs = _projection_case(names)
    x_t, b, w = inputs
    want = gnnfuse.fused_gather_scatter(x_t @ b.t(), csr, list(names), backend="reference") @ \
        w.reshape(len(names) * 4, 3)
    for chunk in (None, 3):
        fn = _projection(csr, names, "cpu", chunk)
        torch.testing.assert_close(fn(*inputs), want)
        assert torch.autograd.gradcheck(fn, inputs, atol=1e-6, rtol=1e-4)


_CUDA = torch.cuda.is_available()


@pytest.mark.skipif(not _CUDA and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="Triton runs on CUDA or in the interpreter")
@pytest.mark.parametrize("names", [("mean", "min", "max", "std"), ("sum", "var", "max")], ids=",".join)
def test_aggregated_projection_triton_matches_cpu(names):
    """The same rule on the Triton kernels (CUDA, else the interpreter): the C++ kernels' values
    and gradients (gradchecked above); on CUDA a gradcheck of its own (in the interpreter it
    would take minutes)."""
    csr, inputs = _projection_case(names)
    device = "cuda" if _CUDA else "cpu"
    csr_t = csr.to(device)
    inputs_t = [t.detach().to(device).requires_grad_() for t in inputs]
    for chunk in (None, 3):
        want = _projection(csr, names, "cpu", chunk)(*inputs)
        got = _projection(csr_t, names, "triton", chunk)(*inputs_t)
        torch.testing.assert_close(got.cpu(), want)
        for g, w in zip(torch.autograd.grad((got * got).sum(), inputs_t), torch.autograd.grad((want * want).sum(),
                                                                                               inputs)):
            torch.testing.assert_close(g.cpu(), w)
        if _CUDA:
            assert torch.autograd.gradcheck(_projection(csr_t, names, "triton", chunk), inputs_t, atol=1e-6, rtol=1e-4)


@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("kwargs,chunk", [(PNA_CASES[0], None), (PNA_CASES[1], 4)])
def test_pna_conv_matches_pyg_on_cuda(kwargs, chunk):
    x, ei = _graph()
    x, ei = x.cuda(), ei.cuda()
    torch.manual_seed(0)
    conv = gnnfuse.nn.PNAConv(6, 6, deg=DEG, post_layers=2, **kwargs).double().cuda()
    conv.aggregation_chunk_features = chunk
    ref = pyg_nn.PNAConv(6, 6, deg=DEG, post_layers=2, **kwargs).double().cuda()
    ref.load_state_dict(conv.state_dict())
    _compare(conv, ref, x, ei)


def test_pna_conv_feature_chunks_match_whole():
    """Aggregating (and recomputing) features in chunks gives the outputs and gradients of the
    layer that keeps whole aggregations; a bad chunk size is named."""
    x, ei = _graph()
    torch.manual_seed(0)
    kwargs = dict(aggregators=["mean", "min", "max", "std", "sum"], scalers=["identity", "amplification"], deg=DEG,
                  towers=2)
    chunked = gnnfuse.nn.PNAConv(6, 6, **kwargs).double()
    chunked.aggregation_chunk_features = 4  # chunks [0, 4) and [4, 6)
    keep = copy.deepcopy(chunked)
    keep.recompute_aggregations = False
    _assert_same_outputs_and_grads(chunked, keep, x, ei)
    chunked.aggregation_chunk_features = 0
    with pytest.raises(ValueError, match="aggregation_chunk_features"):
        chunked(x.requires_grad_(), ei)
