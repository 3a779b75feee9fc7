"""fused_gather_scatter on CPU against the pure-PyTorch reference: values, gradients,
registration (opcheck, torch.compile), determinism, fuzzing and real data."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gnnfuse
from gnnfuse import CSR, reference
from gnnfuse.testing import INDEX_DTYPES, TOLERANCES, VALUE_DTYPES, hub_graph, random_graph, through_registered_op

REDUCTIONS = gnnfuse.REDUCTIONS


def special_graph(index_dtype=torch.int64) -> tuple[torch.Tensor, int]:
    """Empty rows, self loops, duplicate edges and a hub row, in a 40-node graph."""
    n = 40
    rand = random_graph(n, n, 120, seed=1)
    rand = rand[:, rand[1] % 5 != 0]  # every 5th target stays empty
    self_loops = torch.tensor([[3, 7, 11], [3, 7, 11]])
    duplicates = torch.tensor([[2, 2, 2], [9, 9, 9]])
    hub = torch.stack([torch.arange(n).repeat(5), torch.full((5 * n,), 13)])
    return torch.cat([rand, self_loops, duplicates, hub], 1).to(index_dtype), n


def expected(x, edge_index, reduce, weight=None, num_dst=None):
    """Reference in float64 (half inputs are upcast exactly), edges in CSR (stable) order."""
    num_dst = x.shape[0] if num_dst is None else num_dst
    order = torch.sort(edge_index[1], stable=True).indices
    w = None if weight is None else weight.double()[order]
    return reference.gather_scatter(x.double(), edge_index[0][order], edge_index[1][order], num_dst, reduce, w)


def features(n, feat, dtype, reduce, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, *feat, generator=g, dtype=torch.float64)
    # products of many factors must stay representable in half precision
    x = 0.8 + 0.4 * x if reduce == "mul" else 4 * x - 2
    return x.to(dtype)


def assert_close(actual, want, dtype):
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(actual.double(), want, atol=atol, rtol=rtol)


# ---- values ---------------------------------------------------------------------------------
@pytest.mark.parametrize("feat", [(), (5,), (2, 3)], ids=["scalar", "F5", "heads2x3"])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", VALUE_DTYPES, ids=str)
@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_matches_reference(reduce, dtype, index_dtype, feat):
    edge_index, n = special_graph(index_dtype)
    csr = CSR.from_edge_index(edge_index, n, index_dtype=index_dtype)  # kernels of this index dtype
    x = features(n, feat, dtype, reduce)
    weight = (0.5 + torch.rand(edge_index.shape[1], generator=torch.Generator().manual_seed(2))).to(dtype)
    for w, graph in ((None, edge_index), (weight, edge_index), (None, csr), (weight, csr)):
        out = gnnfuse.fused_gather_scatter(x, graph, reduce, edge_weight=w)
        assert out.shape == (n, *feat) and out.dtype == dtype
        assert_close(out, expected(x, edge_index, reduce, w), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_register_tile_widths(reduce, dtype):
    """Float/double rows are reduced in register tiles of 8, 4, 2 and 1 vectors plus a scalar
    tail: widths that exercise each combination, forward (with and without weights, with and
    without max/min winners) and the gradients of x and the weights."""
    edge_index, n = special_graph()
    weight = 0.5 + torch.rand(edge_index.shape[1], generator=torch.Generator().manual_seed(2), dtype=dtype)
    for F in (7, 16, 40, 100, 264):
        x = features(n, (F,), dtype, reduce)
        for w in (None, weight):
            with torch.no_grad():  # inference: the register-tiled path also for max/min
                assert_close(gnnfuse.fused_gather_scatter(x, edge_index, reduce, edge_weight=w),
                             expected(x, edge_index, reduce, w), dtype)
        xg, wg = x.clone().requires_grad_(), weight.clone().requires_grad_()
        for w in (None, wg):
            out = gnnfuse.fused_gather_scatter(xg, edge_index, reduce, edge_weight=w)
            g = torch.randn(out.shape, generator=torch.Generator().manual_seed(F), dtype=dtype)
            got = torch.autograd.grad(out, [xg] + ([w] if w is not None else []), g)
            xr = x.double().requires_grad_()
            wr = None if w is None else weight.double().requires_grad_()
            want = torch.autograd.grad(expected(xr, edge_index, reduce, wr), [xr] + ([wr] if wr is not None else []),
                                       g.double())
            for a, b in zip(got, want):
                assert_close(a, b, dtype)


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_table_of_known_values(reduce):
    # targets: 0 <- {1, 2}, 1 <- {}, 2 <- {0, 0, 2}
    edge_index = torch.tensor([[1, 2, 0, 0, 2], [0, 0, 2, 2, 2]])
    x = torch.tensor([[1.0, -4.0], [2.0, 3.0], [-3.0, 5.0]])
    table = {
        "sum": [[-1.0, 8.0], [0, 0], [-1.0, -3.0]],
        "mean": [[-0.5, 4.0], [0, 0], [-1 / 3, -1.0]],
        "max": [[2.0, 5.0], [0, 0], [1.0, 5.0]],
        "min": [[-3.0, 3.0], [0, 0], [-3.0, -4.0]],
        "mul": [[-6.0, 15.0], [0, 0], [-3.0, 80.0]],
    }
    out = gnnfuse.fused_gather_scatter(x, edge_index, reduce)
    torch.testing.assert_close(out, torch.tensor(table[reduce]))


def test_bipartite_and_num_nodes():
    edge_index = torch.tensor([[0, 4, 4], [1, 0, 1]])  # 5 sources, 3 targets (target 2 empty)
    x = torch.randn(5, 4)
    out = gnnfuse.fused_gather_scatter(x, edge_index, "sum", num_nodes=3)
    assert out.shape == (3, 4)
    torch.testing.assert_close(out, torch.stack([x[4], x[0] + x[4], torch.zeros(4)]))
    csr = CSR.from_edge_index(edge_index, num_nodes=(5, 3))
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, csr, "sum"), out)


def test_empty_graph_and_isolated_nodes():
    x = torch.randn(4, 3, requires_grad=True)
    for reduce in REDUCTIONS:
        out = gnnfuse.fused_gather_scatter(x, torch.empty(2, 0, dtype=torch.long), reduce)
        assert torch.equal(out, torch.zeros(4, 3))
        out.sum().backward()
        assert torch.equal(x.grad, torch.zeros(4, 3))
        x.grad = None
    empty = gnnfuse.fused_gather_scatter(torch.randn(0, 3), torch.empty(2, 0, dtype=torch.long))
    assert empty.shape == (0, 3)


def test_non_contiguous_x_and_inputs_untouched():
    edge_index, n = special_graph()
    x = torch.randn(6, n).t()  # [n, 6] with strides (1, n)
    assert not x.is_contiguous()
    w = torch.rand(edge_index.shape[1])
    saved = [t.clone() for t in (x, edge_index, w)]
    out = gnnfuse.fused_gather_scatter(x, edge_index, "max", edge_weight=w)
    torch.testing.assert_close(out.double(), expected(x, edge_index, "max", w))
    for before, after in zip(saved, (x, edge_index, w)):
        assert torch.equal(before, after)


def test_special_values_propagate_like_torch():
    edge_index = torch.tensor([[0, 1, 2], [0, 0, 1]])
    x = torch.tensor([[float("-inf")], [float("nan")], [float("inf")]])
    for reduce in REDUCTIONS:
        out = gnnfuse.fused_gather_scatter(x, edge_index, reduce)
        want = expected(x, edge_index, reduce).float()
        torch.testing.assert_close(out, want, equal_nan=True)


# ---- gradients ------------------------------------------------------------------------------
@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_gradcheck_x_and_weight(reduce):
    edge_index, n = special_graph()
    x = features(n, (3,), torch.float64, reduce).requires_grad_()
    w = (0.5 + torch.rand(edge_index.shape[1], dtype=torch.float64)).requires_grad_()
    torch.autograd.gradcheck(lambda x, w: gnnfuse.fused_gather_scatter(x, edge_index, reduce, edge_weight=w), (x, w))
    torch.autograd.gradcheck(lambda x: gnnfuse.fused_gather_scatter(x, edge_index, reduce), (x,))


@pytest.mark.parametrize("reduce", REDUCTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_gradients_match_reference(reduce, dtype, index_dtype):
    edge_index, n = special_graph()
    graph = CSR.from_edge_index(edge_index, n, index_dtype=index_dtype)
    x = features(n, (2, 3), dtype, reduce).requires_grad_()
    w = (0.5 + torch.rand(edge_index.shape[1])).to(dtype).requires_grad_()
    grad_out = torch.randn(n, 2, 3, dtype=dtype)
    got = torch.autograd.grad(gnnfuse.fused_gather_scatter(x, graph, reduce, edge_weight=w), (x, w), grad_out)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    want = torch.autograd.grad(expected(x64, edge_index, reduce, w64), (x64, w64), grad_out.double())
    for g, r in zip(got, want):
        assert g.dtype == dtype
        assert_close(g, r, dtype)


def test_mul_gradient_with_zero_messages():
    # row 0 has one zero message, row 1 two, row 2 none
    edge_index = torch.tensor([[0, 1, 2, 0, 3, 1, 2], [0, 0, 0, 1, 1, 2, 2]])
    x = torch.tensor([[0.0, 2.0], [3.0, 0.0], [5.0, 7.0], [0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([1.0, 2.0, 0.5, 1.5, 3.0, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    got = torch.autograd.grad(gnnfuse.fused_gather_scatter(x, edge_index, "mul", edge_weight=w).sum(), (x, w))
    want = torch.autograd.grad(expected(x, edge_index, "mul", w).sum(), (x, w))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_ties_send_gradient_to_lowest_csr_position(reduce):
    # target 0 gets three equal messages from edges 1, 2, 4 (in edge order) plus a loser
    edge_index = torch.tensor([[3, 0, 1, 2, 1], [1, 0, 0, 0, 0]])
    x = torch.tensor([[5.0], [5.0], [5.0 if reduce == "max" else -5.0], [0.0]], requires_grad=True)
    x.data[2] = -1.0 if reduce == "max" else 9.0  # source 2 loses
    out = gnnfuse.fused_gather_scatter(x, edge_index, reduce)
    out.sum().backward()
    # first tie in edge order is edge 1 (source 0); the duplicate edge 4 (source 1) gets nothing
    assert x.grad[:, 0].tolist() == [1.0, 0.0, 0.0, 1.0]
    plan = gnnfuse.explain(x, edge_index, reduce)
    assert "lowest CSR position" in plan.notes


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_eager_shortcut_equals_registered_op(reduce):
    """The public function skips the dispatcher in eager mode; a dispatch mode forces the op path.
    Both must give bitwise the same output and gradients."""
    edge_index, n = special_graph()
    x0 = features(n, (3,), torch.float64, reduce)
    w0 = torch.rand(edge_index.shape[1], dtype=torch.float64)
    results = []
    for mode in (None, through_registered_op()):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        if mode is None:
            out = gnnfuse.fused_gather_scatter(x, edge_index, reduce, edge_weight=w)
        else:
            with mode:
                out = gnnfuse.fused_gather_scatter(x, edge_index, reduce, edge_weight=w)
        out.backward(torch.ones_like(out))
        results.append((out.detach(), x.grad, w.grad))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_double_backward_raises_clearly():
    edge_index, n = special_graph()
    x = torch.randn(n, 3, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(gnnfuse.fused_gather_scatter(x, edge_index).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()


# ---- registration ---------------------------------------------------------------------------
@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_opcheck(reduce):
    edge_index, n = special_graph(torch.int32)
    csr = CSR.from_edge_index(edge_index, n)
    x = features(n, (4,), torch.float32, reduce).requires_grad_()
    w = torch.rand(csr.num_edges, requires_grad=True)
    for weight in (None, w):
        args = (x, csr.rowptr, csr.col, weight, *csr.transpose_parts(), reduce)
        torch.library.opcheck(torch.ops.gnnfuse.gather_scatter.default, args)
    torch.library.opcheck(torch.ops.gnnfuse.coo_to_csr.default, (edge_index[1], edge_index[0], n, n))


@pytest.mark.slow
def test_torch_compile_fullgraph():
    edge_index, n = special_graph()
    csr = CSR.from_edge_index(edge_index, n)
    lin = torch.nn.Linear(4, 4, dtype=torch.float64)

    def layer(x, graph, w):
        h = gnnfuse.fused_gather_scatter(lin(x), graph, "mean", edge_weight=w)
        return torch.relu(h) + gnnfuse.fused_gather_scatter(x, graph, "max")

    x = torch.randn(n, 4, dtype=torch.float64, requires_grad=True)
    w = torch.rand(edge_index.shape[1], dtype=torch.float64)
    compiled = torch.compile(layer, fullgraph=True, dynamic=False)
    for graph in (csr, edge_index):
        eager_out = layer(x, graph, w)
        out = compiled(x, graph, w)
        torch.testing.assert_close(out, eager_out)
        torch.testing.assert_close(torch.autograd.grad(out.sum(), x)[0], torch.autograd.grad(eager_out.sum(), x)[0])


# ---- determinism ----------------------------------------------------------------------------
DETERMINISM_SCRIPT = """
import sys, torch, gnnfuse
from gnnfuse.testing import random_graph
ei = random_graph(3000, 3000, 120000, seed=3, power_law=True)
x = torch.randn(3000, 16, generator=torch.Generator().manual_seed(4), requires_grad=True)
w = torch.rand(ei.shape[1], generator=torch.Generator().manual_seed(5), requires_grad=True)
def run():
    outs = []
    for reduce in gnnfuse.REDUCTIONS:
        out = gnnfuse.fused_gather_scatter(x, ei, reduce, edge_weight=w)
        outs += [out.detach(), *torch.autograd.grad(out.pow(2).sum(), (x, w))]
    return outs
first, second = run(), run()
assert all(torch.equal(a, b) for a, b in zip(first, second)), "repeated calls differ"
torch.save([torch.get_num_threads()] + first, sys.argv[1])
"""


@pytest.mark.slow
def test_bitwise_identical_across_runs_and_thread_counts(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "det.py"
    script.write_text(DETERMINISM_SCRIPT)
    results = []
    for threads in ("1", "2"):
        path = tmp_path / f"out{threads}.pt"
        repo = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "OMP_NUM_THREADS": threads, "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", "")}
        subprocess.run([sys.executable, str(script), str(path)], env=env, check=True)
        results.append(torch.load(path))
    assert results[0][0] == 1 and results[-1][0] == 2
    for other in results[1:]:
        for a, b in zip(results[0][1:], other[1:]):
            assert torch.equal(a, b)


# ---- fuzzing --------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    num_src=st.integers(1, 12),
    num_dst=st.integers(1, 12),
    num_edges=st.integers(0, 40),
    feat=st.integers(1, 5),
    reduce=st.sampled_from(REDUCTIONS),
    weighted=st.booleans(),
    index_dtype=st.sampled_from(INDEX_DTYPES),
    seed=st.integers(0, 2**16),
)
def test_fuzz_against_reference(num_src, num_dst, num_edges, feat, reduce, weighted, index_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.stack(
        [torch.randint(0, num_src, (num_edges,), generator=g), torch.randint(0, num_dst, (num_edges,), generator=g)]
    ).to(index_dtype)
    x = torch.randn(num_src, feat, generator=g, dtype=torch.float64)
    w = torch.rand(num_edges, generator=g, dtype=torch.float64) if weighted else None
    out = gnnfuse.fused_gather_scatter(x, edge_index, reduce, edge_weight=w, num_nodes=num_dst)
    torch.testing.assert_close(out, expected(x, edge_index, reduce, w, num_dst))


# ---- bad input ------------------------------------------------------------------------------
BAD_INPUTS = {
    "edge_index not [2, E]": (lambda x, ei: dict(edge_index_or_csr=ei[:1]), ValueError, "edge_index must have shape"),
    "edge_index 3-D": (lambda x, ei: dict(edge_index_or_csr=ei[None]), ValueError, "edge_index must have shape"),
    "edge_index float": (lambda x, ei: dict(edge_index_or_csr=ei.float()), TypeError, "edge_index must be an int32"),
    "edge_index int16": (lambda x, ei: dict(edge_index_or_csr=ei.short()), TypeError, "edge_index must be an int32"),
    "negative source": (lambda x, ei: dict(edge_index_or_csr=_with(ei, 0, -1)), ValueError, r"edge_index\[0\]"),
    "negative target": (lambda x, ei: dict(edge_index_or_csr=_with(ei, 1, -3)), ValueError, r"edge_index\[1\]"),
    "source beyond x": (lambda x, ei: dict(edge_index_or_csr=_with(ei, 0, 40)), ValueError, "x must have more rows"),
    "target >= num_nodes": (lambda x, ei: dict(num_nodes=10), ValueError, "num_nodes"),
    "negative num_nodes": (lambda x, ei: dict(num_nodes=-1), ValueError, "num_nodes must be a non-negative"),
    "weight wrong length": (lambda x, ei: dict(edge_weight=torch.rand(3)), ValueError, "edge_weight must have shape"),
    "weight integer": (lambda x, ei: dict(edge_weight=torch.ones(ei.shape[1], dtype=torch.long)), TypeError,
                       "edge_weight must have a floating dtype"),
    "weight 2-D": (lambda x, ei: dict(edge_weight=torch.rand(ei.shape[1], 1)), ValueError, "edge_weight must have"),
    "unknown reduce": (lambda x, ei: dict(reduce="median"), ValueError, "reduce must be one of"),
    "unknown backend": (lambda x, ei: dict(backend="gpu"), ValueError, "backend must be one of"),
    "x integer": (lambda x, ei: dict(x=x.long()), TypeError, "x must have a floating dtype"),
    "x 0-d": (lambda x, ei: dict(x=x[0, 0]), ValueError, r"x must have shape \[N, \*feat\]"),
    "x not a tensor": (lambda x, ei: dict(x=x.tolist()), TypeError, "x must be a torch.Tensor"),
    "graph not a tensor": (lambda x, ei: dict(edge_index_or_csr=ei.tolist()), TypeError, "edge_index_or_csr"),
    "x on meta device": (lambda x, ei: dict(x=x.to("meta")), ValueError, "one device"),
    "weight on meta device": (lambda x, ei: dict(edge_weight=torch.rand(ei.shape[1], device="meta")), ValueError,
                              "one device"),
    "csr fewer sources than x rows need": (lambda x, ei: dict(x=x[:5], edge_index_or_csr=CSR.from_edge_index(ei)),
                                           ValueError, "x has 5 rows"),
    "csr with other num_nodes": (lambda x, ei: dict(edge_index_or_csr=CSR.from_edge_index(ei), num_nodes=7),
                                 ValueError, "disagrees"),
    "cpu backend on meta": (lambda x, ei: dict(x=x.to("meta"), edge_index_or_csr=ei.to("meta"), backend="cpu"),
                            ValueError, "backend='cpu' needs CPU"),
}


def _with(edge_index, row, value):
    bad = edge_index.clone()
    bad[row, 5] = value
    return bad


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_is_rejected_clearly(case):
    edge_index, n = special_graph()
    x = torch.randn(n, 3)
    make, error, message = BAD_INPUTS[case]
    kwargs = dict(x=x, edge_index_or_csr=edge_index, reduce="sum")
    kwargs.update(make(x, edge_index))
    saved = {k: v.clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.device.type != "meta"}
    with pytest.raises(error, match=message):
        gnnfuse.fused_gather_scatter(kwargs.pop("x"), kwargs.pop("edge_index_or_csr"), **kwargs)
    for k, v in saved.items():
        assert torch.equal(kwargs.get(k, v), v)


def test_int32_index_limits():
    from gnnfuse._validate import require_fits_index

    with pytest.raises(ValueError, match="use int64"):
        require_fits_index("edge_index", torch.int32, edges=2**31)
    with pytest.raises(ValueError, match="use int64"):
        CSR.from_edge_index(torch.zeros(2, 1, dtype=torch.int32), num_nodes=2**31)
    require_fits_index("edge_index", torch.int64, edges=2**40, nodes=2**40)  # int64 is fine


def test_backend_environment_override(monkeypatch):
    edge_index, n = special_graph()
    x = torch.randn(n, 2)
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    assert gnnfuse.explain(x, edge_index).backend == "reference"
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, edge_index, "min"),
                               gnnfuse.fused_gather_scatter(x, edge_index, "min", backend="cpu"))
    monkeypatch.setenv("GNNFUSE_BACKEND", "fastest")
    with pytest.raises(ValueError, match="GNNFUSE_BACKEND"):
        gnnfuse.fused_gather_scatter(x, edge_index)


def test_explain_reports_kernel_and_guarantees():
    edge_index, n = special_graph(torch.int32)
    plan = gnnfuse.explain(torch.randn(n, 2, dtype=torch.bfloat16), edge_index, "sum")
    assert plan.backend == "cpu" and plan.deterministic
    assert plan.accumulate_dtype == torch.float32 and plan.index_dtype == torch.int32
    assert "row-parallel" in str(plan)
    # the kernels are named by importable objects, not by source paths
    assert "gnnfuse._build.load_extension('graph').gather_scatter_forward" in plan.kernel
    from gnnfuse import _build, reference

    assert hasattr(_build.load_extension("graph"), "gather_scatter_forward") and callable(reference.gather_scatter)


def test_hub_rows_match_reference():
    edge_index = hub_graph(3000, hub_degree=40000)
    x = torch.randn(3000, 8, dtype=torch.float64)
    for reduce in ("sum", "max", "mean"):
        torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, edge_index, reduce), expected(x, edge_index, reduce))
