"""gnnfuse::multi_aggregate (several reductions in one pass) against the reference: values,
gradients (gradcheck in float64, x and edge weights), opcheck, torch.compile incl. dynamic shapes."""
import itertools
import os

import pytest
import torch

import gnnfuse
from gnnfuse import reference
from gnnfuse.ops.multi_aggregate import multi_aggregate

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the C++ kernels on CPU and the Triton ones in the interpreter; on a GPU machine, Triton on CUDA
INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
BACKENDS = ["triton"] if DEVICE == "cuda" else ["cpu"] + (["triton"] if INTERPRETER else [])
LISTS = [["mean", "min", "max", "std"], ["sum", "var"], ["std"], ["mul", "max", "sum"], ["min", "mean"],
         ["add", "amax", "prod", "var", "std", "mean", "amin"], ["max", "max"]]


def _graph(num_nodes=9, num_edges=30, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, num_nodes, (2, num_edges), generator=g)
    ei[1, :3] = 0  # a row of degree >= 3; node num_nodes - 1 likely empty
    ei[1][ei[1] == num_nodes - 1] = 1
    return ei.to(device)


def _ref(x, ei, aggrs, w=None):
    return gnnfuse.fused_gather_scatter(x, ei, aggrs, edge_weight=w, backend="reference")


@pytest.mark.parametrize("aggrs,backend,weighted", list(itertools.product(LISTS, BACKENDS, [False, True])))
def test_forward_matches_reference(aggrs, backend, weighted):
    ei = _graph()
    x = torch.randn(9, 5, device=DEVICE)
    w = torch.rand(ei.shape[1], device=DEVICE) + 0.5 if weighted else None
    got = gnnfuse.fused_gather_scatter(x, ei, aggrs, edge_weight=w, backend=backend)
    assert got.shape == (9, len(aggrs) * 5)
    torch.testing.assert_close(got, _ref(x, ei, aggrs, w), atol=1e-4, rtol=1e-4)  # var: cancellation
    assert (got[8] == 0).all()  # the empty row


@pytest.mark.parametrize("aggrs,backend", list(itertools.product(LISTS[:6], BACKENDS)))
def test_gradcheck_float64(aggrs, backend):
    ei = _graph(num_nodes=6, num_edges=14, seed=1)
    x = (torch.randn(6, 3, dtype=torch.float64, device=DEVICE) * 2).requires_grad_()
    w = (torch.rand(14, dtype=torch.float64, device=DEVICE) + 0.5).requires_grad_()
    fn = lambda x, w: multi_aggregate(x, ei, aggrs, edge_weight=w, backend=backend)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w))


@pytest.mark.parametrize("aggrs", LISTS[:4])
def test_gradients_match_reference(aggrs):
    # float64 and a fixed seed: std's gradient divides by the row's std, so a float32 draw with two
    # nearly equal neighbours would make the comparison flaky.
    ei = _graph()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(9, 4, generator=g, dtype=torch.float64).to(DEVICE).requires_grad_()
    w = (torch.rand(ei.shape[1], generator=g, dtype=torch.float64) + 0.5).to(DEVICE).requires_grad_()
    go = torch.randn(9, 4 * len(aggrs), generator=g, dtype=torch.float64).to(DEVICE)
    got = torch.autograd.grad((gnnfuse.fused_gather_scatter(x, ei, aggrs, edge_weight=w) * go).sum(), (x, w))
    want = torch.autograd.grad((_ref(x, ei, aggrs, w) * go).sum(), (x, w))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)


def test_half_precision_and_multi_dim_features():
    ei = _graph()
    x = torch.randn(9, 2, 3, device=DEVICE)
    got = gnnfuse.fused_gather_scatter(x.half(), ei, ["mean", "max", "std"])
    torch.testing.assert_close(got.float(), _ref(x, ei, ["mean", "max", "std"]), atol=2e-2, rtol=2e-2)
    assert got.shape == (9, 18)


def test_errors_name_the_argument():
    x, ei = torch.randn(4, 2), torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="aggrs must be one of"):
        gnnfuse.fused_gather_scatter(x, ei, ["mean", "median"])
    with pytest.raises(ValueError, match="non-empty list"):
        gnnfuse.fused_gather_scatter(x, ei, [])
    with pytest.raises(ValueError, match="reduce must be one of"):
        gnnfuse.fused_gather_scatter(x, ei, "median")


def test_single_var_and_std_names():
    ei, x = _graph(), torch.randn(9, 2, 3, device=DEVICE)
    for name in ("var", "std"):
        got = gnnfuse.fused_gather_scatter(x, ei, name)
        assert got.shape == x.shape
        torch.testing.assert_close(got.reshape(9, 6), _ref(x.reshape(9, 6), ei, [name]))


def test_inputs_not_modified():
    ei = _graph()
    x = torch.randn(9, 3, device=ei.device)
    before = x.clone(), ei.clone()
    gnnfuse.fused_gather_scatter(x.requires_grad_(), ei, ["std", "max"]).sum().backward()
    assert torch.equal(x.detach(), before[0]) and torch.equal(ei, before[1])


@pytest.mark.parametrize("aggrs", [["mean", "min", "max", "std"], ["mul", "var"]])
def test_opcheck(aggrs):
    csr = gnnfuse.CSR.from_edge_index(_graph(), num_nodes=9)
    codes = ",".join(aggrs)
    x = torch.randn(9, 3, dtype=torch.float64, device=DEVICE, requires_grad=True)
    w = torch.rand(csr.num_edges, dtype=torch.float64, device=DEVICE, requires_grad=True)
    for t in (csr.transpose_parts(), (None, None, None)):
        torch.library.opcheck(torch.ops.gnnfuse.multi_aggregate.default, (x, csr.rowptr, csr.col, w, *t, codes))


def test_compile_fullgraph_dynamic():
    aggrs = ["mean", "min", "max", "std"]

    def f(x, ei):
        return gnnfuse.fused_gather_scatter(x, ei, aggrs)

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    torch.manual_seed(0)
    for n in (9, 12):
        ei = _graph(num_nodes=n, device="cpu")
        # float64: std's gradient divides by a small deviation, float32 rounding would need loose tolerances
        x = torch.randn(n, 4, dtype=torch.float64, requires_grad=True)
        got = compiled(x, ei)
        torch.testing.assert_close(got, f(x, ei))
        (gx,) = torch.autograd.grad(got.sum(), x)
        (rx,) = torch.autograd.grad(_ref(x, ei, aggrs).sum(), x)
        torch.testing.assert_close(gx, rx, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_hub_rows_longer_than_a_piece(backend):
    """A row of 300 edges (the Triton kernel cuts rows into pieces of 128) with tied maxima across
    pieces: values, the winners' gradients and empty rows."""
    n, hub = 6, 300
    src = torch.arange(hub) % n
    ei = torch.stack([torch.cat([src, torch.tensor([1, 2])]), torch.cat([torch.zeros(hub, dtype=torch.long),
                                                                          torch.tensor([3, 3])])]).to(DEVICE)
    x = torch.randn(n, 5, dtype=torch.float64, device=DEVICE)
    x[4] = 10.0  # the max of row 0, reached by 50 edges spread over every piece
    aggrs = ["mean", "min", "max", "std", "sum"]
    x.requires_grad_()
    got = gnnfuse.fused_gather_scatter(x, ei, aggrs, backend=backend)
    want = _ref(x, ei, aggrs)
    torch.testing.assert_close(got, want)
    go = torch.randn_like(got)
    torch.testing.assert_close(torch.autograd.grad((got * go).sum(), x)[0], torch.autograd.grad((want * go).sum(), x)[0])


@pytest.mark.skipif("triton" not in BACKENDS, reason="Triton runs on CUDA or in the interpreter")
def test_triton_split_rows_match_one_pass():
    """The Triton forward with a plan forcing every path: row groups (rows <= 4 edges), pieces of
    16 edges (a hub of 60 split in 4, folded in order), ties across pieces: values and winners
    equal those of the unsplit plan, values equal the reference; the one-launch plan (task list)
    gives the two-launch result bitwise."""
    from dataclasses import replace

    from gnnfuse.reductions import CODES
    from gnnfuse.triton import gather_scatter as gs
    from gnnfuse.triton import multi_aggregate as kernels

    g = torch.Generator().manual_seed(3)
    ei = torch.randint(0, 12, (2, 100), generator=g)
    ei[1, :60] = 0
    csr = gnnfuse.CSR.from_edge_index(ei.to(DEVICE), num_nodes=12)
    x = torch.randint(-2, 3, (12, 3), generator=g).to(DEVICE, torch.float64)  # many ties
    w = torch.rand(csr.num_edges, generator=g, dtype=torch.float64).to(DEVICE) + 0.5
    aggrs = ["mean", "min", "max", "std", "mul"]
    codes = [CODES[a] for a in aggrs]
    base = gs.plan_for(x, csr.rowptr, csr.col, "sum", "hybrid")
    for weight in (None, w):
        whole = kernels.forward(x, csr.rowptr, csr.col, weight, codes, True)
        split = kernels.forward(x, csr.rowptr, csr.col, weight, codes, True,
                                replace(base, seg=16, block_e=16, short_max=4))
        torch.testing.assert_close(split[0], whole[0])
        assert torch.equal(split[1], whole[1])
        # the same plan in one launch (task list, windows of 4 ids): bitwise the two launches' result
        one = kernels.forward(x, csr.rowptr, csr.col, weight, codes, True,
                              replace(base, seg=16, block_e=16, short_max=4, one_pass=True, window=4))
        assert torch.equal(one[0], split[0]) and torch.equal(one[1], split[1])
        ref = reference.multi_aggregate(x, csr.col, csr._row(), 12, aggrs, weight)
        torch.testing.assert_close(split[0], ref)


@pytest.mark.skipif("triton" not in BACKENDS, reason="Triton runs on CUDA or in the interpreter")
def test_triton_hub_of_many_pieces():
    """A hub row cut into 44 pieces of 16 edges, more than the combine pass folds per step (32):
    ties across its tiles and a NaN keep the earliest winner (the unsplit plan's), values match the
    reference, with and without winners tracked."""
    from dataclasses import replace

    from gnnfuse.reductions import CODES
    from gnnfuse.triton import gather_scatter as gs
    from gnnfuse.triton import multi_aggregate as kernels

    g = torch.Generator().manual_seed(4)
    ei = torch.randint(0, 12, (2, 800), generator=g)
    ei[1, :700] = 0
    csr = gnnfuse.CSR.from_edge_index(ei.to(DEVICE), num_nodes=12)
    x = torch.randint(-2, 3, (12, 3), generator=g).to(DEVICE, torch.float64)  # many ties
    aggrs = ["mean", "min", "max", "std", "mul", "sum"]
    codes = [CODES[a] for a in aggrs]
    plan = replace(gs.plan_for(x, csr.rowptr, csr.col, "sum", "hybrid"), seg=16, block_e=16, short_max=4)
    ref = reference.multi_aggregate(x, csr.col, csr._row(), 12, aggrs)
    for track in (False, True):
        whole = kernels.forward(x, csr.rowptr, csr.col, None, codes, track)
        split = kernels.forward(x, csr.rowptr, csr.col, None, codes, track, plan)
        torch.testing.assert_close(split[0], ref)
        assert torch.equal(split[1], whole[1])
    x[int(csr.col[400]), 1] = float("nan")  # in the hub's second tile of pieces
    split = kernels.forward(x, csr.rowptr, csr.col, None, [CODES["max"], CODES["min"]], True, plan)
    torch.testing.assert_close(split[0], reference.multi_aggregate(x, csr.col, csr._row(), 12, ["max", "min"]),
                               equal_nan=True)
    assert torch.equal(split[1], kernels.forward(x, csr.rowptr, csr.col, None, [CODES["max"], CODES["min"]], True)[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_degree_output(backend):
    ei = _graph()
    x = torch.randn(9, 3, device=DEVICE, requires_grad=True)
    out, deg = multi_aggregate(x, ei, ["sum", "max"], edge_weight=torch.rand(ei.shape[1], device=DEVICE),
                               backend=backend, return_degree=True)
    assert out.shape == (9, 6) and deg.dtype == x.dtype and not deg.requires_grad
    torch.testing.assert_close(deg, torch.bincount(ei[1], minlength=9).to(x.dtype))


@pytest.mark.parametrize("aggrs", [["mean", "min", "max", "std"], ["var"], ["std", "sum", "amin"], ["max"],
                                   ["max", "max", "mean"]])
@pytest.mark.parametrize("backend", BACKENDS)
def test_unweighted_x_gradient(aggrs, backend):
    """x alone needs a gradient, no weights: the Triton backward's one-pass route (coefficients,
    one transpose pass, winners), and var/std without mean (the mean is computed for them)."""
    ei = _graph(num_nodes=7, num_edges=20, seed=2)
    x = torch.randn(7, 3, dtype=torch.float64, device=DEVICE, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: multi_aggregate(x, ei, aggrs, backend=backend), (x,))
    go = torch.randn(7, 3 * len(aggrs), dtype=torch.float64, device=DEVICE)
    got = torch.autograd.grad((multi_aggregate(x, ei, aggrs, backend=backend) * go).sum(), x)[0]
    want = torch.autograd.grad((_ref(x, ei, aggrs) * go).sum(), x)[0]
    torch.testing.assert_close(got, want)


@pytest.mark.skipif(DEVICE != "cpu", reason="the C++ register tiles")
@pytest.mark.parametrize("width,dtype", [(37, torch.float32), (80, torch.float32), (21, torch.float64)])
def test_cpu_register_tiles_match_reference(width, dtype):
    # widths that use every tile (4, 2, 1 vectors and the masked tail); winners match the
    # single-reduction max/min kernels'; a NaN message takes the exact path; the gradient of x
    ei = _graph(num_nodes=40, num_edges=300, seed=5)
    x = torch.randn(40, width, dtype=dtype)
    aggrs = ["mean", "min", "max", "std", "sum", "var"]
    got = gnnfuse.fused_gather_scatter(x, ei, aggrs)
    torch.testing.assert_close(got, _ref(x, ei, aggrs), atol=1e-4, rtol=1e-4)
    xn = x.clone()
    xn[int(ei[0, 5]), 3] = float("nan")
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(xn, ei, ["max", "min"]), _ref(xn, ei, ["max", "min"]),
                               equal_nan=True)
    xg = x.clone().requires_grad_()
    go = torch.randn(40, len(aggrs) * width, dtype=dtype)
    got = torch.autograd.grad((gnnfuse.fused_gather_scatter(xg, ei, aggrs) * go).sum(), xg)[0]
    want = torch.autograd.grad((_ref(xg, ei, aggrs) * go).sum(), xg)[0]
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
    again = torch.autograd.grad((gnnfuse.fused_gather_scatter(xg, ei, aggrs) * go).sum(), xg)[0]
    assert torch.equal(got, again)  # deterministic


def _rows_graph():
    """Rows of every kind: empty (0, 5), single-edge (1, 2), a long row (3: 12 edges) and short ones."""
    src = torch.tensor([4, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 6, 6, 2, 5])
    dst = torch.tensor([1, 2] + [3] * 12 + [4, 4, 6, 7])
    return torch.stack([src, dst])


@pytest.mark.skipif(DEVICE != "cpu", reason="the C++ kernels")
@pytest.mark.parametrize("width,dtype", [(3, torch.float32), (16, torch.float32), (21, torch.float64),
                                         (64, torch.float32)])
def test_cpu_rows_ties_and_infinities(width, dtype):
    """Empty and single-edge rows, ties (integer features: the first edge wins, as the reference's
    gradient says), +-inf messages (max/min and mean keep them; var/std of an inf are NaN as in the
    reference), widths that do not fill a vector; values, winners' gradients and determinism."""
    ei = _rows_graph()
    g = torch.Generator().manual_seed(7)
    x = torch.randint(-2, 3, (8, width), generator=g).to(dtype)
    aggrs = ["mean", "min", "max", "std", "sum", "var"]
    got = gnnfuse.fused_gather_scatter(x, ei, aggrs)
    torch.testing.assert_close(got, _ref(x, ei, aggrs))
    assert (got[0] == 0).all() and (got[5] == 0).all()
    xg = x.clone().requires_grad_()
    go = torch.randn(8, len(aggrs) * width, generator=g, dtype=dtype)
    grad = torch.autograd.grad((gnnfuse.fused_gather_scatter(xg, ei, ["max", "min", "mean"]) * go[:, :3 * width]).sum(),
                               xg)[0]
    want = torch.autograd.grad((_ref(xg, ei, ["max", "min", "mean"]) * go[:, :3 * width]).sum(), xg)[0]
    torch.testing.assert_close(grad, want)
    xi = x.clone()
    xi[3, 0], xi[6, width - 1] = float("inf"), float("-inf")
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(xi, ei, aggrs), _ref(xi, ei, aggrs), equal_nan=True)


@pytest.mark.skipif(DEVICE != "cpu", reason="the C++ kernels")
def test_cpu_broadcast_gradient_read_in_place():
    """The gradient of out.sum() / out.mean() arrives as one row expanded over all rows: the C++
    backward reads it in place; same gradient as from a contiguous copy, and as the reference."""
    ei = _graph()
    x = torch.randn(9, 5, dtype=torch.float64, requires_grad=True)
    aggrs = ["mean", "min", "max", "std"]
    for loss in (lambda o: o.sum(), lambda o: o.mean(), lambda o: (o * torch.arange(20.0, dtype=o.dtype)).sum()):
        got = torch.autograd.grad(loss(gnnfuse.fused_gather_scatter(x, ei, aggrs)), x)[0]
        want = torch.autograd.grad(loss(_ref(x, ei, aggrs)), x)[0]
        torch.testing.assert_close(got, want)
    csr = gnnfuse.CSR.from_edge_index(ei, num_nodes=9)
    out, arg = torch.ops.gnnfuse.multi_aggregate(x.detach(), csr.rowptr, csr.col, None, *csr.transpose_parts(),
                                                 "mean,min,max,std")
    row = torch.randn(1, 20, dtype=torch.float64)
    args = (x.detach(), out, csr.rowptr, csr.col, None, *csr.transpose_parts(), arg, "mean,min,max,std", True, False)
    expanded = torch.ops.gnnfuse.multi_aggregate_backward(row.expand(9, 20), *args)[0]
    assert torch.equal(expanded, torch.ops.gnnfuse.multi_aggregate_backward(row.expand(9, 20).contiguous(), *args)[0])


@pytest.mark.skipif(DEVICE != "cpu", reason="the C++ kernels")
def test_cpu_registered_op_equals_eager_route():
    """The C++ kernel registered for CPU (what compiled graphs and direct torch.ops calls run) and the
    eager route's binding of it give the same outputs bitwise; an unknown name in aggrs raises."""
    from gnnfuse.ops.multi_aggregate import FORWARD

    csr = gnnfuse.CSR.from_edge_index(_graph(), num_nodes=9)
    x = torch.randn(9, 20)
    for t in (csr.transpose_parts(), (None, None, None)):
        a = torch.ops.gnnfuse.multi_aggregate(x, csr.rowptr, csr.col, None, *t, "mean,min,max,std")
        b = FORWARD(x, csr.rowptr, csr.col, None, *t, "mean,min,max,std", backend="cpu")
        assert all(torch.equal(u, v) for u, v in zip(a, b))
    with pytest.raises(ValueError, match="median"):
        torch.ops.gnnfuse.multi_aggregate(x, csr.rowptr, csr.col, None, None, None, None, "mean,median")


@pytest.mark.slow
@pytest.mark.skipif(DEVICE != "cpu", reason="the C++ kernels")
def test_cpu_large_output_streamed():
    """An output of >= 16 MB with whole-vector rows is written with non-temporal stores: values and
    winners (through the gradient) against the reference."""
    n, width = 4200, 256  # [n, 4 * 256] float32: 17 MB
    ei = _graph(num_nodes=n, num_edges=3 * n, seed=9)
    x = torch.randn(n, width, requires_grad=True)
    aggrs = ["mean", "min", "max", "var"]  # (std's 0 cut at sqrt(1e-5) is a float32 coin toss on single-edge rows)
    got = gnnfuse.fused_gather_scatter(x, ei, aggrs)
    torch.testing.assert_close(got, _ref(x, ei, aggrs), atol=1e-4, rtol=1e-4)
    go = torch.randn_like(got)
    torch.testing.assert_close(torch.autograd.grad((got * go).sum(), x)[0],
                               torch.autograd.grad((_ref(x, ei, aggrs) * go).sum(), x)[0], atol=1e-3, rtol=1e-3)


@pytest.mark.skipif(DEVICE != "cpu", reason="the C++ kernels")
def test_cpu_prefetched_sources_match_reference_for_any_thread_count():
    """Sources past 2 MB are prefetched by the one-pass forward (with and without winners, weighted
    or not) and the winners' source rows by the backward: values and gradients against the
    reference, bitwise the same on 1 and 2 threads."""
    n, width = 2100, 256  # x: 2.2 MB float32
    ei = _graph(num_nodes=n, num_edges=4 * n, seed=11)
    w = torch.rand(ei.shape[1], generator=torch.Generator().manual_seed(5))
    aggrs = ["mean", "min", "max", "std", "sum"]
    threads = torch.get_num_threads()
    results = []
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            x = torch.randn(n, width, generator=torch.Generator().manual_seed(3)).requires_grad_()
            out = gnnfuse.fused_gather_scatter(x, ei, aggrs, edge_weight=w)
            go = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
            results.append((out.detach(), torch.autograd.grad((out * go).sum(), x)[0],
                            gnnfuse.fused_gather_scatter(x.detach(), ei, aggrs)))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*results))
    out, _, plain = results[0]
    torch.testing.assert_close(out, _ref(x.detach(), ei, aggrs, w), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(plain, _ref(x.detach(), ei, aggrs), atol=1e-4, rtol=1e-4)
    # the gradient against the reference in float64 (std's 1 / std amplifies float32 rounding)
    x64 = x.detach().double().requires_grad_()
    w64, go64 = w.double(), go.double()
    got = torch.autograd.grad((gnnfuse.fused_gather_scatter(x64, ei, aggrs, edge_weight=w64) * go64).sum(), x64)[0]
    torch.testing.assert_close(got, torch.autograd.grad((_ref(x64, ei, aggrs, w64) * go64).sum(), x64)[0])


@pytest.mark.skipif(DEVICE != "cpu", reason="the C++ kernels")
def test_cpu_output_writes_only_control():
    """The benchmarks' control (the forward's output stores alone) fills its output and checks it."""
    from gnnfuse._build import load_extension

    csr = gnnfuse.CSR.from_edge_index(_graph(), num_nodes=9)
    out = torch.zeros(9, 32)
    load_extension("aggregate").output_writes_only(out, csr.rowptr.to(torch.int32))
    assert (out == 1).all()
    with pytest.raises(RuntimeError, match="output_writes_only"):
        load_extension("aggregate").output_writes_only(torch.zeros(9, 5), csr.rowptr.to(torch.int32))
