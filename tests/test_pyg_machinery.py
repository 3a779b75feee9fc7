"""gnnfuse.nn under PyG's own machinery: its conv tests' cases, explainers, hooks, decomposition,
TorchScript, ONNX export, and the message spellings the mixin recognises.

Each case runs twice, with gnnfuse's layers swapped in ("swapped": gnnfuse.nn.X built directly) and
after ``fuse(model)`` ("fuse": stock PyG layers converted in place), and compares with a stock PyG
layer holding the same weights. A stock layer of every class is instantiated first, so PyG's
generated propagate templates exist in the process, as in any real program.
"""
from __future__ import annotations

import copy
import io
import warnings
from typing import Union

import pytest
import torch

pyg = pytest.importorskip("torch_geometric")
import torch_geometric.nn as P  # noqa: E402
from torch_geometric import EdgeIndex  # noqa: E402
from torch_geometric.explain import Explainer, GNNExplainer  # noqa: E402
from torch import Tensor  # noqa: E402
from torch_geometric.nn import MessagePassing  # noqa: E402
from torch_geometric.typing import OptPairTensor, OptTensor, Size  # noqa: E402
from torch_geometric.utils import to_torch_csc_tensor  # noqa: E402

import gnnfuse  # noqa: E402
import gnnfuse.nn as G  # noqa: E402
import gnnfuse.nn._mixin as mixin  # noqa: E402
import gnnfuse.nn._pyg_path as pyg_path  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:gnnfuse.nn")  # the one-time "PyG's path" notices

TOL = dict(atol=1e-5, rtol=1e-5)
X = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
EDGE_INDEX = torch.tensor([[0, 0, 0, 1, 2, 3], [1, 2, 3, 0, 0, 0]])  # PyG's tests' 4-node star
BIPARTITE = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])  # 4 sources, 2 targets
VALUE = torch.rand(6, generator=torch.Generator().manual_seed(1))

# stock layers first: PyG generates each class's propagate template on first instantiation
for _make in (lambda: P.GCNConv(4, 4), lambda: P.SAGEConv(4, 4), lambda: P.GraphConv(4, 4),
              lambda: P.GINConv(torch.nn.Linear(4, 4))):
    _make()


def _build(cls_name, *args, **kwargs):
    torch.manual_seed(0)
    if cls_name == "GINConv":
        args = (torch.nn.Sequential(torch.nn.Linear(args[0], 32), torch.nn.ReLU(), torch.nn.Linear(32, args[1])),)
    return getattr(P, cls_name)(*args, **kwargs)


def pair(mode, cls_name, *args, **kwargs):
    """(stock, gnnfuse) layers with the same weights; mode "swapped" or "fuse"."""
    stock = _build(cls_name, *args, **kwargs)
    if mode == "fuse":
        fused = G.fuse(copy.deepcopy(stock), warn=False)
        assert isinstance(fused, G.FusedMessagePassing) or getattr(fused, "gnnfuse_unsupported", None)
    else:
        fused = getattr(G, cls_name)(*((stock.nn,) if cls_name == "GINConv" else args), **kwargs)
        fused.load_state_dict(stock.state_dict())
    return stock, fused


class Counting:
    """Counts fused calls (monkeypatches the mixin's op)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = mixin.fused_gather_scatter

        def counted(*a, **k):
            self.calls += 1
            return real(*a, **k)

        monkeypatch.setattr(mixin, "fused_gather_scatter", counted)


MODES = ["swapped", "fuse"]


# ---- PyG's conv tests' cases ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_gcn_conv_cases(mode):
    stock, fused = pair(mode, "GCNConv", 16, 32)
    assert str(fused) == "GCNConv(16, 32)"
    for args in [(X, EDGE_INDEX), (X, EDGE_INDEX, VALUE)]:
        torch.testing.assert_close(fused(*args), stock(*args), **TOL)
    adj1 = to_torch_csc_tensor(EDGE_INDEX, size=(4, 4))
    adj2 = to_torch_csc_tensor(EDGE_INDEX, VALUE, size=(4, 4))
    torch.testing.assert_close(fused(X, adj1.t()), stock(X, EDGE_INDEX), **TOL)
    torch.testing.assert_close(fused(X, adj2.t()), stock(X, EDGE_INDEX, VALUE), **TOL)
    static = torch.randn(3, 4, 16)  # a batch of feature sets on one static graph
    torch.testing.assert_close(fused(static, EDGE_INDEX), stock(static, EDGE_INDEX), **TOL)
    fused.cached = stock.cached = True
    torch.testing.assert_close(fused(X, EDGE_INDEX), stock(X, EDGE_INDEX), **TOL)
    torch.testing.assert_close(fused(X, EDGE_INDEX), stock(X, EDGE_INDEX), **TOL)


@pytest.mark.parametrize("mode", MODES)
def test_gcn_conv_flow_and_decomposed_layers(mode):
    stock, fused = pair(mode, "GCNConv", 16, 32)
    star = torch.tensor([[0, 0, 0], [1, 2, 3]])
    out = fused(X, star)
    fused.flow = "target_to_source"
    torch.testing.assert_close(fused(X, star.flip(0)), out, **TOL)
    fused.flow = "source_to_target"
    decomposed, stock_decomposed = copy.deepcopy(fused), copy.deepcopy(stock)
    decomposed.decomposed_layers = stock_decomposed.decomposed_layers = 2
    torch.testing.assert_close(decomposed(X, EDGE_INDEX), stock_decomposed(X, EDGE_INDEX), **TOL)
    torch.testing.assert_close(decomposed(X, EDGE_INDEX), fused(X, EDGE_INDEX), **TOL)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kwargs", [dict(aggr="mean"), dict(aggr="sum"), dict(aggr="max"), dict(aggr="min"),
                                    dict(project=True, normalize=True), dict(root_weight=False),
                                    dict(aggr="lstm")])
def test_sage_conv_cases(mode, kwargs):
    stock, fused = pair(mode, "SAGEConv", 16, 32, **kwargs)
    assert str(fused) == str(stock)
    ei = EDGE_INDEX[:, EDGE_INDEX[1].argsort(stable=True)]  # LSTM aggregation needs edges sorted by target
    torch.testing.assert_close(fused(X, ei), stock(X, ei), **TOL)
    torch.testing.assert_close(fused(X, ei, (4, 4)), stock(X, ei, (4, 4)), **TOL)
    adj = to_torch_csc_tensor(ei, size=(4, 4))
    torch.testing.assert_close(fused(X, adj.t()), stock(X, ei), **TOL)
    x1, x2 = torch.randn(4, 8), torch.randn(2, 16)
    stock, fused = pair(mode, "SAGEConv", (8, 16), 32, **kwargs)
    for x in [(x1, x2), (x1, None)]:
        torch.testing.assert_close(fused(x, BIPARTITE, (4, 2)), stock(x, BIPARTITE, (4, 2)), **TOL)


@pytest.mark.parametrize("mode", MODES)
def test_gin_conv_cases(mode):
    stock, fused = pair(mode, "GINConv", 16, 32, train_eps=True)
    assert str(fused) == str(stock)
    torch.testing.assert_close(fused(X, EDGE_INDEX), stock(X, EDGE_INDEX), **TOL)
    torch.testing.assert_close(fused(X, EDGE_INDEX, size=(4, 4)), stock(X, EDGE_INDEX, size=(4, 4)), **TOL)
    x2 = torch.randn(2, 16)
    for x in [(X, x2), (X, None)]:
        torch.testing.assert_close(fused(x, BIPARTITE, (4, 2)), stock(x, BIPARTITE, (4, 2)), **TOL)
    adj = to_torch_csc_tensor(BIPARTITE, size=(4, 2))
    torch.testing.assert_close(fused((X, x2), adj.t()), stock((X, x2), BIPARTITE), **TOL)


@pytest.mark.parametrize("mode", MODES)
def test_graph_conv_cases(mode):
    stock, fused = pair(mode, "GraphConv", 16, 32)
    for args in [(X, EDGE_INDEX), (X, EDGE_INDEX, VALUE)]:
        torch.testing.assert_close(fused(*args), stock(*args), **TOL)
    stock, fused = pair(mode, "GraphConv", (16, 16), 32, aggr="mean")
    x2, value = torch.randn(2, 16), VALUE[:4]
    for args in [((X, x2), BIPARTITE), ((X, x2), BIPARTITE, value), ((X, None), BIPARTITE, value)]:
        torch.testing.assert_close(fused(*args, size=(4, 2)), stock(*args, size=(4, 2)), **TOL)
    eidx = EdgeIndex(BIPARTITE, sparse_size=(4, 2))
    torch.testing.assert_close(fused((X, x2), eidx), stock((X, x2), BIPARTITE, size=(4, 2)), **TOL)


@pytest.mark.parametrize("model_name", ["GCN", "GraphSAGE", "GIN"])
@pytest.mark.parametrize("jk", [None, "cat", "max"])
def test_basic_gnn_after_fuse(model_name, jk):
    torch.manual_seed(0)
    stock = getattr(P.models, model_name)(16, 32, num_layers=3, out_channels=5, jk=jk, dropout=0.0)
    fused = G.fuse(copy.deepcopy(stock), warn=False)
    assert len(fused.gnnfuse_fused) == 3
    xs, xf = X.clone().requires_grad_(), X.clone().requires_grad_()
    out_s, out_f = stock(xs, EDGE_INDEX), fused(xf, EDGE_INDEX)
    torch.testing.assert_close(out_f, out_s, **TOL)
    out_s.square().sum().backward()
    out_f.square().sum().backward()
    torch.testing.assert_close(xf.grad, xs.grad, **TOL)
    for (name, p_s), p_f in zip(stock.named_parameters(), fused.parameters()):
        torch.testing.assert_close(p_f.grad, p_s.grad, **TOL, msg=name)


# ---- a user layer as in PyG's message-passing tests ---------------------------------------------------
class WeightedConv(MessagePassing):
    """x_j * edge_weight with a root term (the shape of PyG's MyConv)."""

    def __init__(self, in_channels, out_channels, aggr="add"):
        super().__init__(aggr=aggr)
        self.lin_l = torch.nn.Linear(in_channels, out_channels)
        self.lin_r = torch.nn.Linear(in_channels, out_channels)

    def forward(self, x: Union[Tensor, OptPairTensor], edge_index: Tensor, edge_weight: OptTensor = None,
                size: Size = None) -> Tensor:
        if isinstance(x, Tensor):
            x = (x, x)
        # propagate_type: (x: OptPairTensor, edge_weight: OptTensor)
        out = self.lin_l(self.propagate(edge_index, x=x, edge_weight=edge_weight, size=size))
        x_r = x[1]
        if x_r is not None:
            out = out + self.lin_r(x_r)
        return out

    def message(self, x_j: Tensor, edge_weight: Tensor) -> Tensor:
        return edge_weight.view(-1, 1) * x_j


def _weighted_pair(aggr="add"):
    torch.manual_seed(0)
    stock = WeightedConv(8, 32, aggr)
    return stock, G.fuse(copy.deepcopy(stock), warn=False)


@pytest.mark.parametrize("aggr", ["add", "sum", "mean", "min", "max", "mul"])
def test_message_passing_aggregations(aggr, monkeypatch):
    stock, fused = _weighted_pair(aggr)
    x, w = torch.randn(4, 8), torch.randn(4)
    counter = Counting(monkeypatch)
    torch.testing.assert_close(fused(x, BIPARTITE, w), stock(x, BIPARTITE, w), **TOL)
    assert counter.calls == 1
    static = torch.randn(3, 4, 8)  # nodes in dim -2 of a 3-D input: PyG's path
    torch.testing.assert_close(fused(static, BIPARTITE, w), stock(static, BIPARTITE, w), **TOL)


def test_message_passing_hooks_fire_as_in_pyg(monkeypatch):
    stock, fused = _weighted_pair()
    x, w = torch.randn(4, 8), torch.randn(4)
    counts = {}

    def counting(tag):
        def hook(module, *args):
            counts[tag] = counts.get(tag, 0) + 1
        return hook

    for conv, tag in [(stock, "stock"), (fused, "fused")]:
        for register in ("propagate_forward_pre", "propagate_forward", "message_forward_pre", "message_forward",
                         "aggregate_forward_pre", "aggregate_forward", "message_and_aggregate_forward_pre",
                         "message_and_aggregate_forward"):
            getattr(conv, f"register_{register}_hook")(counting(tag))
    counter = Counting(monkeypatch)
    torch.testing.assert_close(fused(x, BIPARTITE, w), stock(x, BIPARTITE, w), **TOL)
    assert counts["fused"] == counts["stock"] == 6 and counter.calls == 0

    stock, fused = _weighted_pair()
    base = fused(x, BIPARTITE, w)
    for conv in (stock, fused):
        conv.register_message_forward_hook(lambda module, inputs, out: out + 1.0)
    out = fused(x, BIPARTITE, w)
    assert not torch.allclose(out, base)
    torch.testing.assert_close(out, stock(x, BIPARTITE, w), **TOL)


def test_aggr_module_forward_hooks_fire(monkeypatch):
    stock, fused = pair("fuse", "SAGEConv", 16, 32)
    seen = []
    for conv in (stock, fused):
        conv.aggr_module.register_forward_hook(lambda module, inputs, out: seen.append(1) or out * 2)
    counter = Counting(monkeypatch)
    torch.testing.assert_close(fused(X, EDGE_INDEX), stock(X, EDGE_INDEX), **TOL)
    assert len(seen) == 2 and counter.calls == 0


def test_instance_overrides_run_pyg(monkeypatch):
    stock, fused = _weighted_pair()
    x, w = torch.randn(4, 8), torch.randn(4)
    for conv in (stock, fused):
        conv.message = lambda x_j, edge_weight: edge_weight.view(-1, 1) * x_j * 2.0
    counter = Counting(monkeypatch)
    torch.testing.assert_close(fused(x, BIPARTITE, w), stock(x, BIPARTITE, w), **TOL)
    assert counter.calls == 0


# ---- defects found by running PyG's tests after fuse() ------------------------------------------------
def test_gcn_message_override_and_hook_match_pyg():
    class StockTriple(P.GCNConv):
        def message(self, x_j, edge_weight):
            return edge_weight.view(-1, 1) * x_j * 3.0

    class FusedTriple(G.GCNConv):
        def message(self, x_j, edge_weight):
            return edge_weight.view(-1, 1) * x_j * 3.0

    torch.manual_seed(0)
    stock, fused = StockTriple(16, 8), FusedTriple(16, 8)
    fused.load_state_dict(stock.state_dict())
    torch.testing.assert_close(fused(X, EDGE_INDEX), stock(X, EDGE_INDEX), **TOL)
    stock, fused = pair("swapped", "GCNConv", 16, 8)
    for conv in (stock, fused):
        conv.register_message_forward_hook(lambda module, inputs, out: out * 2.0)
    torch.testing.assert_close(fused(X, EDGE_INDEX, VALUE), stock(X, EDGE_INDEX, VALUE), **TOL)


@pytest.mark.parametrize("cls_name", ["SAGEConv", "GINConv", "GraphConv"])
def test_decomposed_layers_raise_where_pyg_raises(cls_name):
    stock, fused = pair("swapped", cls_name, 16, 8)
    for conv in (stock, fused):
        conv.decomposed_layers = 2
    with pytest.raises(AttributeError) as stock_error:
        stock(X, EDGE_INDEX)
    with pytest.raises(AttributeError) as fused_error:
        fused(X, EDGE_INDEX)
    assert str(fused_error.value) == str(stock_error.value)


class _Net(torch.nn.Module):
    def __init__(self, conv_a, conv_b):
        super().__init__()
        self.conv1, self.conv2 = conv_a, conv_b

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index).log_softmax(dim=-1)


def _explain(model, x, edge_index):
    torch.manual_seed(7)
    explainer = Explainer(model, algorithm=GNNExplainer(epochs=5), explanation_type="model",
                          node_mask_type="attributes", edge_mask_type="object",
                          model_config=dict(mode="multiclass_classification", task_level="node",
                                            return_type="log_probs"))
    return explainer(x, edge_index, index=1)


@pytest.mark.parametrize("convs", [("GCNConv", "SAGEConv"), ("GINConv", "GraphConv")])
@pytest.mark.parametrize("mode", MODES)
def test_explainer_gets_edge_masks_and_layers_return_to_the_fused_path(convs, mode, monkeypatch):
    G.GCNConv(4, 4), G.SAGEConv(4, 4)  # fused classes instantiated too (their own templates exist)
    x = torch.randn(6, 16)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 2], [1, 2, 3, 4, 5, 0, 3, 5]])
    s1, f1 = pair(mode, convs[0], 16, 16)
    s2, f2 = pair(mode, convs[1], 16, 3)
    stock, fused = _Net(s1, s2), _Net(f1, f2)
    expected = _explain(stock, x, edge_index)
    got = _explain(fused, x, edge_index)
    assert got.edge_mask.abs().sum() > 0
    torch.testing.assert_close(got.edge_mask, expected.edge_mask, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.node_mask, expected.node_mask, atol=1e-4, rtol=1e-4)
    counter = Counting(monkeypatch)  # clear_masks ran: back on the fused path
    torch.testing.assert_close(fused(x, edge_index), stock(x, edge_index), **TOL)
    assert counter.calls == 2


def test_hetero_explainer_after_fuse():
    from torch_geometric.data import HeteroData
    from torch_geometric.explain import Explainer as Ex

    data = HeteroData()
    data["paper"].x, data["author"].x = torch.randn(6, 8), torch.randn(4, 8)
    data["paper", "cites", "paper"].edge_index = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    data["author", "writes", "paper"].edge_index = torch.tensor([[0, 1, 2, 3, 0], [0, 1, 2, 3, 5]])
    data["paper", "rev_writes", "author"].edge_index = data["author", "writes", "paper"].edge_index.flip(0)

    class Homo(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = P.SAGEConv((-1, -1), 8), P.GraphConv((-1, -1), 3)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    class PaperHead(torch.nn.Module):  # explainers take one node type's output
        def __init__(self, hetero):
            super().__init__()
            self.hetero = hetero

        def forward(self, x_dict, edge_index_dict):
            return self.hetero(x_dict, edge_index_dict)["paper"]

    torch.manual_seed(0)
    stock = PaperHead(P.to_hetero(Homo(), data.metadata(), aggr="sum"))
    stock(data.x_dict, data.edge_index_dict)  # materialise the lazy weights
    fused = G.fuse(copy.deepcopy(stock), warn=False)
    assert len(fused.gnnfuse_fused) == 6
    masks = []
    for model in (stock, fused):
        torch.manual_seed(3)
        explainer = Ex(model, algorithm=GNNExplainer(epochs=3), explanation_type="model",
                       node_mask_type="attributes", edge_mask_type="object",
                       model_config=dict(mode="multiclass_classification", task_level="node", return_type="raw"))
        explanation = explainer(data.x_dict, data.edge_index_dict, index=torch.tensor([1]))
        masks.append(explanation.edge_mask_dict)
    for key, mask in masks[0].items():
        torch.testing.assert_close(masks[1][key], mask, atol=1e-4, rtol=1e-4)
    assert sum(float(m.abs().sum()) for m in masks[1].values()) > 0


@pytest.mark.parametrize("mode", MODES)
def test_jit_trace_records_pyg_ops(mode):
    stock, fused = pair(mode, "GCNConv", 16, 8)
    model, ref = _Net(fused, pair(mode, "SAGEConv", 8, 3)[1]), None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(model, (X, EDGE_INDEX))
    other = torch.tensor([[0, 1, 3], [1, 2, 2]])  # a different graph: nothing of the first is frozen
    for ei in (EDGE_INDEX, other):
        ref = model(X, ei)
        torch.testing.assert_close(traced(X, ei), ref, **TOL)
    assert "gnnfuse::" not in str(traced.inlined_graph)  # no gnnfuse op recorded


def test_jit_script_scripts_the_stock_layer():
    for cls_name in ("GCNConv", "SAGEConv", "GINConv", "GraphConv"):
        stock, fused = pair("swapped", cls_name, 16, 8)
        scripted = torch.jit.script(fused)
        torch.testing.assert_close(scripted(X, EDGE_INDEX), fused(X, EDGE_INDEX), **TOL)
        assert type(fused).__module__.startswith("gnnfuse")  # the module itself is unchanged
    _, fused = _weighted_pair()
    scripted = torch.jit.script(fused)  # a generic fuse() conversion scripts the user's stock class
    x, w = torch.randn(4, 8), torch.randn(4)
    torch.testing.assert_close(scripted(x, BIPARTITE, w, None), fused(x, BIPARTITE, w), **TOL)

    torch.manual_seed(0)
    model = G.fuse(P.models.GraphSAGE(16, 32, num_layers=2, out_channels=5), warn=False)
    scripted = torch.jit.script(model)  # submodules are prepared too
    torch.testing.assert_close(scripted(X, EDGE_INDEX), model(X, EDGE_INDEX), **TOL)

    class Mine(G.FusedMessagePassing, MessagePassing):
        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

    with pytest.raises(RuntimeError, match="torch.jit.trace"):
        torch.jit.script(Mine())


@pytest.mark.parametrize("dynamo", [False, True])
def test_onnx_export_records_standard_ops(dynamo):
    onnx = pytest.importorskip("onnx")
    if dynamo:
        pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model = G.fuse(_Net(P.GCNConv(16, 8), P.SAGEConv(8, 3)), warn=False)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            program = torch.onnx.export(model, (X, EDGE_INDEX), dynamo=True, verbose=False)
            proto = program.model_proto
        else:
            torch.onnx.export(model, (X, EDGE_INDEX), buffer, dynamo=False)
            proto = onnx.load_from_string(buffer.getvalue())
    assert not [n.op_type for n in proto.graph.node if "gnnfuse" in n.domain or "gnnfuse" in n.op_type]
    try:
        from onnx.reference import ReferenceEvaluator
        result = ReferenceEvaluator(proto).run(None, {proto.graph.input[0].name: X.numpy(),
                                                      proto.graph.input[1].name: EDGE_INDEX.numpy()})
    except Exception as e:  # noqa: BLE001  (the pure-Python evaluator lacks some operators)
        pytest.skip(f"onnx.reference could not run the model: {e}")
    torch.testing.assert_close(torch.from_numpy(result[0]), model(X, EDGE_INDEX), **TOL)


# ---- message spellings and the one-time warning ------------------------------------------------------
def _layer_with(source: str) -> type:
    """A MessagePassing class whose message has this body (its source registered for inspect)."""
    import linecache

    code = f"def message(self, x_j, edge_weight):\n{source}"
    filename = f"<message {abs(hash(source))}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    namespace = {"torch": torch}
    exec(compile(code, filename, "exec"), namespace)  # noqa: S102
    return type("Spelled", (MessagePassing,), {"message": namespace["message"]})


SPELLINGS = {
    "    return x_j * edge_weight.unsqueeze(-1)\n": "x_j*w",
    "    return x_j * edge_weight.view(-1, 1)\n": "x_j*w",
    "    return edge_weight.unsqueeze(1) * x_j\n": "x_j*w",
    "    return x_j.mul(edge_weight.view(-1, 1))\n": "x_j*w",
    "    return edge_weight.reshape(-1, 1).mul(x_j)\n": "x_j*w",
    "    return torch.mul(x_j, edge_weight[:, None])\n": "x_j*w",
    "    return x_j * edge_weight[..., None]\n": "x_j*w",
    "    w = edge_weight.view(-1, 1)\n    return x_j * w\n": "x_j*w",
    "    out = x_j * edge_weight.unsqueeze(dim=-1)\n    return out\n": "x_j*w",
    "    if edge_weight is None:\n        return x_j\n    return x_j * edge_weight.view(-1, 1)\n": "x_j*w?",
    "    if edge_weight is not None:\n        x_j = x_j.mul(edge_weight.unsqueeze(-1))\n    return x_j\n": "x_j*w?",
    "    if edge_weight is not None:\n        x_j = x_j * 2\n    return x_j\n": None,
    "    if edge_weight is None:\n        edge_weight = 1.0\n    return x_j * edge_weight.view(-1, 1)\n": None,
    "    return x_j if edge_weight is None else x_j * edge_weight.view(-1, 1).to(x_j.dtype)\n": "x_j*w?",
    "    return x_j * edge_weight\n": None,  # a 1-D weight against [E, F]: not a column
    "    return x_j * edge_weight.view(1, -1)\n": None,
    "    return x_j + edge_weight.view(-1, 1)\n": None,
    "    return (x_j * edge_weight.view(-1, 1)).relu()\n": None,
    "    X = 2\n    return x_j * X\n": None,  # a local named like the placeholder stays a local
}


@pytest.mark.parametrize("source", list(SPELLINGS))
def test_message_spellings(source):
    kind = SPELLINGS[source]
    form = G.message_form(_layer_with(source))
    assert (form[0] if form else None) == kind


def test_recognised_spelling_runs_fused_and_matches(monkeypatch):
    source = "    w = edge_weight.unsqueeze(-1)\n    return x_j.mul(w)\n"
    spelled = _layer_with(source)
    forward = lambda self, x, ei, w: self.propagate(ei, x=x, edge_weight=w)  # noqa: E731
    layer_cls = type("SpelledConv", (spelled,), {"forward": forward})
    stock = layer_cls(aggr="mean")
    fused = G.fuse(copy.deepcopy(stock), warn=False)
    x, w = torch.randn(4, 8), torch.rand(6)
    counter = Counting(monkeypatch)
    torch.testing.assert_close(fused(x, EDGE_INDEX, w), stock(x, EDGE_INDEX, w), **TOL)
    assert counter.calls == 1


@pytest.mark.filterwarnings("default")
def test_warns_once_naming_layer_and_reason(monkeypatch):
    monkeypatch.setattr(pyg_path, "_warned", set())
    _, fused = _weighted_pair()
    x, w = torch.randn(4, 8), torch.randn(4)
    handle = fused.aggr_module.register_forward_pre_hook(lambda module, inputs: None)
    with pytest.warns(UserWarning, match=r"gnnfuse.nn.WeightedConv: forward hooks on aggr_module; running PyG's"):
        fused(x, BIPARTITE, w)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fused(x, BIPARTITE, w)  # the same (layer, reason) again: silent
    handle.remove()
    adj = to_torch_csc_tensor(BIPARTITE, w, size=(4, 4))
    with pytest.warns(UserWarning, match="WeightedConv: a torch.sparse adjacency"):
        fused(x, adj.t(), w)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fused(x, BIPARTITE, w)  # fused: no warning
        fused(x, gnnfuse.CSR.from_edge_index(BIPARTITE, 4), w)
