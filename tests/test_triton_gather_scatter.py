"""Triton backend of fused_gather_scatter: every kernel against the pure-torch reference.

Without CUDA these run on tiny CPU tensors in the Triton interpreter (TRITON_INTERPRET=1, set
by conftest.py); with CUDA the same tests run on the GPU, plus opcheck, gradcheck and a
torch.compile(fullgraph=True) check.
"""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

import gnnfuse  # noqa: E402
from gnnfuse import reference  # noqa: E402
from gnnfuse.csr import CSR  # noqa: E402
from gnnfuse.testing import TOLERANCES, random_graph  # noqa: E402
from gnnfuse.triton import gather_scatter as tgs  # noqa: E402
from gnnfuse.triton.gather_scatter_dispatch import choose  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
if not CUDA and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs CUDA or TRITON_INTERPRET=1", allow_module_level=True)
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def _graph(index_dtype=torch.int64, scale=1):
    """Power-law targets with a hub row, several empty rows and one isolated source."""
    n_src, n_dst = 24 * scale, 16 * scale
    ei = random_graph(n_src - 1, n_dst, 70 * scale, power_law=True, seed=3)
    hub = torch.stack([torch.randint(0, n_src - 1, (40 * scale,), generator=torch.Generator().manual_seed(4)),
                       torch.full((40 * scale,), 5)])
    ei = torch.cat([ei, hub], 1)
    ei = ei[:, ei[1] % 7 != 3]  # empty rows
    return CSR.from_edge_index(ei.to(index_dtype).to(DEVICE), (n_src, n_dst))


def _ref(x, csr, reduce, w):
    return reference.gather_scatter(x.double(), csr.col, csr.row(), csr.num_dst, reduce,
                                    None if w is None else w.double())


# small tiles so hub rows are split over several programs and COO blocks cut rows
_TINY = dict(block_e=16, seg=16)


@pytest.mark.parametrize("kernel,reduce", [(k, r) for k in ("csr", "hybrid") for r in ("sum", "mean", "max", "min", "mul")]
                         + [("coo", "sum"), ("coo", "mean"), ("atomic", "sum")])
def test_forward_kernel(kernel, reduce):
    csr = _graph()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(csr.num_src, 20, generator=g).to(DEVICE)
    w = torch.rand(csr.num_edges, generator=g).to(DEVICE) + 0.5
    # hybrid: rows of <= 4 edges to the row-group kernel, 4 rows x 16 features per program (two
    # feature tiles, the second one partly masked); the rest (a split hub) to CSR
    tiles = dict(_TINY, short_max=4, group_rows=4, group_block_f=16) if kernel == "hybrid" else _TINY
    for weight in (None, w):
        plan = tgs.plan_for(x, csr.rowptr, csr.col, reduce, kernel, **tiles)
        out, arg = tgs.forward(x, csr.rowptr, csr.col, weight, reduce, plan=plan)
        torch.testing.assert_close(out.double(), _ref(x, csr, reduce, weight), atol=1e-5, rtol=1e-5)
        if reduce in ("max", "min"):
            ref_arg, _ = _cpu_arg(x, csr, weight, reduce)
            assert torch.equal(arg.cpu(), ref_arg)
            untracked, no_arg = tgs.forward(x, csr.rowptr, csr.col, weight, reduce, track_arg=False, plan=plan)
            assert torch.equal(untracked, out) and no_arg.shape == (0, 0)
        else:
            assert arg.shape == (0, 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_hybrid_all_rows_short_and_dtypes(dtype):
    """short_max above every degree: the row-group kernel alone covers the graph (empty rows too)."""
    csr = _graph()
    x = torch.randn(csr.num_src, 9, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    for reduce in ("sum", "mean", "max"):
        plan = tgs.plan_for(x, csr.rowptr, csr.col, reduce, "hybrid", short_max=10**6, group_rows=8)
        out, _ = tgs.forward(x, csr.rowptr, csr.col, None, reduce, track_arg=False, plan=plan)
        rtol, atol = TOLERANCES[dtype]
        torch.testing.assert_close(out.double(), _ref(x, csr, reduce, None), rtol=rtol, atol=atol)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "mul"])
def test_one_pass_plan_is_bitwise_the_two_launch_one(reduce):
    """The hybrid plan in one launch (row groups and long-row pieces from one id-ordered task list)
    reduces every row with the same code as the two launches: bitwise the same values and winners,
    with windows or without, and right against the reference."""
    csr = _graph(scale=2)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(csr.num_src, 20, generator=g).to(DEVICE)
    w = (torch.rand(csr.num_edges, generator=g) + 0.5).to(DEVICE)
    # rows of <= 4 edges in groups of 4, two feature tiles (the second partly masked); longer rows
    # in pieces of 32 edges (the hub is split: partials + combine), two 16-edge tiles each
    tiles = dict(block_e=16, seg=32, short_max=4, group_rows=4, group_block_f=16, block_f=16)
    for weight in (None, w):
        ref = _ref(x, csr, reduce, weight)
        two = tgs.forward(x, csr.rowptr, csr.col, weight, reduce, plan=tgs.plan_for(
            x, csr.rowptr, csr.col, reduce, "hybrid", window=0, **tiles))
        for window in (0, 8):
            plan = tgs.plan_for(x, csr.rowptr, csr.col, reduce, "hybrid", one_pass=True, window=window, **tiles)
            assert "one launch" in plan.describe()
            one = tgs.forward(x, csr.rowptr, csr.col, weight, reduce, plan=plan)
            torch.testing.assert_close(one[0].double(), ref, atol=1e-5, rtol=1e-5)
            assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


def test_task_list_orders_windows_pieces_first():
    rowptr = torch.tensor([0, 1, 4, 4, 6, 16, 17, 17, 30])  # degrees 1 3 0 2 10 1 0 13
    short = tgs.short_rows(rowptr, 3, 4)  # windows of 4 ids, each by decreasing degree
    assert short.tolist() == [1, 3, 0, 2, 5, 6]
    wl = tgs.work_list(rowptr, 8, 3)  # pieces of <= 8 edges: row 4 (two), row 7 (two)
    tasks = tgs.task_list(rowptr, short, wl, 2, 8, 3, 4)
    # window 0: groups 0 (rows 1 3) and 1 (rows 0 2); window 1: pieces 0-3, then group 2 (rows 5 6)
    assert tasks.tolist() == [0, 1, -1, -2, -3, -4, 2]
    assert tgs.task_list(rowptr, short, wl, 2, 8, 3, 0).tolist() == [-1, -2, -3, -4, 0, 1, 2]


def _cpu_arg(x, csr, weight, reduce):
    c = csr.to("cpu")  # with the transpose, the CPU op records max/min winners too
    return tuple(reversed(torch.ops.gnnfuse.gather_scatter(
        x.cpu(), c.rowptr, c.col, None if weight is None else weight.cpu(), *c.transpose_parts(), reduce)))


@pytest.mark.parametrize("kernel", ["csr", "hybrid"])
def test_max_ties_nan_and_inf_follow_cpu(kernel):
    csr = _graph()
    x = torch.randint(-2, 3, (csr.num_src, 8)).float()
    x[3, 0], x[7, 1], x[9, 2] = float("nan"), float("-inf"), float("inf")
    x = x.to(DEVICE)
    tiles = dict(_TINY, short_max=4, group_rows=4) if kernel == "hybrid" else _TINY
    for reduce in ("max", "min"):
        plan = tgs.plan_for(x, csr.rowptr, csr.col, reduce, kernel, **tiles)
        out, arg = tgs.forward(x, csr.rowptr, csr.col, None, reduce, plan=plan)
        ref_arg, ref_out = _cpu_arg(x, csr, None, reduce)
        assert torch.equal(arg.cpu(), ref_arg)
        torch.testing.assert_close(out.cpu(), ref_out, equal_nan=True)
        untracked, _ = tgs.forward(x, csr.rowptr, csr.col, None, reduce, track_arg=False, plan=plan)
        torch.testing.assert_close(untracked, out, equal_nan=True)


@pytest.mark.parametrize("dtype,index_dtype,kernel", [
    (torch.float16, torch.int32, "csr"), (torch.bfloat16, torch.int64, "coo"),
    (torch.float64, torch.int32, "coo"), (torch.float64, torch.int64, "csr"),
])
def test_dtypes(dtype, index_dtype, kernel):
    csr = _graph(index_dtype)
    x = torch.randn(csr.num_src, 16, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    reduce = "max" if kernel == "csr" else "mean"
    out, _ = tgs.forward(x, csr.rowptr, csr.col, None, reduce,
                         plan=tgs.plan_for(x, csr.rowptr, csr.col, reduce, kernel, **_TINY))
    assert out.dtype == dtype
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), _ref(x, csr, reduce, None), atol=atol, rtol=rtol)


@pytest.mark.parametrize("reduce,deterministic", [("sum", False), ("mean", False), ("max", False), ("min", False),
                                                   ("mul", False), ("max", True), ("min", True)])
def test_backward_matches_cpu(reduce, deterministic):
    """x and edge_weight gradients through fused_gather_scatter(backend="triton") vs the CPU kernels
    (max/min: x's gradient by atomic winner scatter, or deterministically by the transpose walk)."""
    ei = random_graph(20, 14, 90, power_law=True, seed=7, index_dtype=torch.int32)
    g = torch.Generator().manual_seed(2)
    x0 = torch.randn(20, 6, generator=g, dtype=torch.float64)
    if reduce == "mul":
        x0[[1, 4], :3] = 0.0  # single and double zeros in products
    w0 = torch.rand(ei.shape[1], generator=g, dtype=torch.float64) + 0.5
    grad = torch.randn(14, 6, generator=g, dtype=torch.float64)
    results = []
    torch.use_deterministic_algorithms(deterministic)
    try:
        for backend, dev in (("triton", DEVICE), ("cpu", "cpu")):
            x = x0.to(dev).requires_grad_()
            w = w0.to(dev).requires_grad_()
            out = gnnfuse.fused_gather_scatter(x, ei.to(dev), reduce, edge_weight=w, num_nodes=14, backend=backend)
            results.append([t.cpu() for t in (out, *torch.autograd.grad(out, (x, w), grad.to(dev)))])
    finally:
        torch.use_deterministic_algorithms(False)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("dtype,reduce", [(torch.float16, "mean"), (torch.bfloat16, "max")])
def test_backward_half(dtype, reduce):
    ei = random_graph(20, 14, 90, power_law=True, seed=8)
    x0 = torch.randn(20, 8, generator=torch.Generator().manual_seed(3)).to(dtype)
    grad = torch.randn(14, 8, generator=torch.Generator().manual_seed(4)).to(dtype)
    x = x0.to(DEVICE).requires_grad_()
    out = gnnfuse.fused_gather_scatter(x, ei.to(DEVICE), reduce, num_nodes=14, backend="triton")
    (gx,) = torch.autograd.grad(out, x, grad.to(DEVICE))
    xr = x0.double().requires_grad_()
    ref = gnnfuse.fused_gather_scatter(xr, ei, reduce, num_nodes=14, backend="reference")
    (gr,) = torch.autograd.grad(ref, xr, grad.double())
    assert gx.dtype == dtype
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(gx.double().cpu(), gr, atol=atol, rtol=rtol)


def test_backward_kernels_split_rows():
    """Tiny pieces in the transpose too: grad_x partials are combined in order."""
    csr = _graph()
    t_rowptr, t_col, t_pos = csr.transpose_parts()
    x = torch.randn(csr.num_src, 10, dtype=torch.float64).to(DEVICE)
    go = torch.randn(csr.num_dst, 10, dtype=torch.float64).to(DEVICE)
    plan = tgs.plan_for(x, t_rowptr, t_col, "sum", "csr", block_e=16, seg=16)
    gx, gw = tgs.backward(go, x, csr.rowptr, csr.col, None, t_rowptr, t_col, t_pos,
                          csr.rowptr.new_empty(0, 0), "sum", True, False, plan=plan)
    ref = torch.zeros_like(x).index_add_(0, csr.col.long(), go[csr.row().long()])
    torch.testing.assert_close(gx, ref)
    assert gw.numel() == 0


@pytest.mark.parametrize("reduce", ["mul", "max", "mean"])
def test_backward_split_rows_vs_cpu_op(reduce):
    """Backward launcher with tiny pieces (split rows in both directions) vs the CPU op."""
    csr = _graph()
    c = csr.to("cpu")
    t = c.transpose_parts()
    g = torch.Generator().manual_seed(9)
    x = torch.randn(csr.num_src, 6, generator=g, dtype=torch.float64)
    x[[2, 5], :2] = 0.0
    w = torch.rand(csr.num_edges, generator=g, dtype=torch.float64) + 0.5
    go = torch.randn(csr.num_dst, 6, generator=g, dtype=torch.float64)
    _, arg = torch.ops.gnnfuse.gather_scatter(x, c.rowptr, c.col, w, *t, reduce)
    ref = torch.ops.gnnfuse.gather_scatter_backward(go, x, c.rowptr, c.col, w, *t, arg, reduce, True, True)
    dev = [v.to(DEVICE) for v in (go, x, csr.rowptr, csr.col, w, *csr.transpose_parts(), arg)]
    plan = tgs.plan_for(dev[1], csr.rowptr, csr.col, reduce, "csr", block_e=16, seg=16)
    got = tgs.backward(*dev, reduce, True, True, plan=plan)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.cpu(), b, atol=1e-10, rtol=1e-9)


def test_dispatch_and_explain():
    for reduce in ("sum", "mean", "max", "min", "mul"):
        plan = choose(reduce, 1000, 3000, 32, torch.float32)
        assert plan.kernel == "hybrid" and plan.deterministic and plan.short_max > 0
    wide = choose("sum", 1000, 30000, 256, torch.float32)  # one launch, 256-byte tiles, 4 warps, 32-edge pieces
    assert (wide.one_pass, wide.block_e, wide.block_f, wide.group_block_f, wide.group_warps) == (True, 32, 64, 64, 4)
    assert choose("sum", 1000, 30000, 64, torch.float32).one_pass  # from 256-byte rows up
    narrow = choose("sum", 1000, 30000, 32, torch.float32)  # two launches; long rows: 128-byte tiles, 4 warps
    assert not narrow.one_pass
    assert (narrow.block_e, narrow.block_f, narrow.num_warps, narrow.group_block_f) == (16, 32, 4, 32)
    assert choose("sum", 1000, 30000, 256, torch.float32, kernel="csr").block_f == 256  # CSR alone: wide tiles
    assert choose("sum", 1000, 3000, 32, torch.float32, kernel="coo").kernel == "coo"
    assert choose("max", 1000, 3000, 32, torch.float32, kernel="coo").kernel == "hybrid"  # coo is sum/mean only
    assert choose("sum", 1000, 3000, 32, torch.float32, deterministic=True, kernel="coo").kernel == "hybrid"
    assert choose("sum", 1000, 3000, 32, torch.float32, kernel="csr").kernel == "csr"
    torch.use_deterministic_algorithms(True)
    try:
        assert choose("sum", 1000, 3000, 32, torch.float32).deterministic
    finally:
        torch.use_deterministic_algorithms(False)
    csr = _graph()
    x = torch.randn(csr.num_src, 8, device=DEVICE)
    plan = gnnfuse.explain(x, csr, "sum", backend="triton")
    assert plan.backend == "triton" and "BLOCK_F" in plan.kernel


def test_multidim_features_and_empty_graph():
    csr = _graph()
    x = torch.randn(csr.num_src, 2, 3, device=DEVICE)
    out = gnnfuse.fused_gather_scatter(x, csr, "sum", backend="triton")
    ref = gnnfuse.fused_gather_scatter(x.cpu(), csr.to("cpu"), "sum", backend="reference")
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)
    empty = CSR.from_edge_index(torch.empty(2, 0, dtype=torch.long, device=DEVICE), (4, 3))
    out = gnnfuse.fused_gather_scatter(torch.randn(4, 5, device=DEVICE), empty, "max", backend="triton")
    assert out.shape == (3, 5) and not out.any()


# ---- CUDA only ---------------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "mul"])
def test_cuda_auto_vs_reference(dtype, reduce):
    ei = random_graph(3000, 2000, 40000, power_law=True, seed=11).cuda()
    x = torch.randn(3000, 72, device="cuda").to(dtype)
    if reduce == "mul":
        x = 1 + 0.01 * x
    out = gnnfuse.fused_gather_scatter(x, ei, reduce, num_nodes=2000)
    ref = gnnfuse.fused_gather_scatter(x.double(), ei, reduce, num_nodes=2000, backend="reference")
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), ref, atol=atol * 4, rtol=rtol * 4)


@needs_cuda
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "mul"])
def test_cuda_opcheck_and_gradcheck(reduce):
    csr = _graph(scale=2)
    t = csr.transpose_parts()
    x = torch.randn(csr.num_src, 5, device="cuda", dtype=torch.float64, requires_grad=True)
    w = (torch.rand(csr.num_edges, device="cuda", dtype=torch.float64) + 0.5).requires_grad_()
    torch.library.opcheck(torch.ops.gnnfuse.gather_scatter, (x, csr.rowptr, csr.col, w, *t, reduce))
    # max/min: x's gradient adds winners with atomics, in any order (last-bit differences between runs)
    nondet_tol = 1e-12 if reduce in ("max", "min") else 0.0
    torch.autograd.gradcheck(lambda a, b: gnnfuse.fused_gather_scatter(a, csr, reduce, edge_weight=b), (x, w),
                             nondet_tol=nondet_tol)


@needs_cuda
def test_cuda_compile_fullgraph_and_deterministic():
    ei = random_graph(500, 400, 5000, power_law=True, seed=5).cuda()
    x = torch.randn(500, 32, device="cuda", requires_grad=True)
    fn = torch.compile(lambda a: gnnfuse.fused_gather_scatter(a, ei, "mean", num_nodes=400).relu().sum(),
                       fullgraph=True)
    loss = fn(x)
    loss.backward()
    ref_x = x.detach().clone().requires_grad_()
    gnnfuse.fused_gather_scatter(ref_x, ei, "mean", num_nodes=400, backend="reference").relu().sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad, atol=1e-5, rtol=1e-5)
    torch.use_deterministic_algorithms(True)
    try:
        a = gnnfuse.fused_gather_scatter(x.detach(), ei, "sum", num_nodes=400)
        b = gnnfuse.fused_gather_scatter(x.detach(), ei, "sum", num_nodes=400)
        assert torch.equal(a, b)
    finally:
        torch.use_deterministic_algorithms(False)


# ---- the fast launch path (gnnfuse/triton/_launch.py) -------------------------------------------------
def test_launch_key_separates_what_triton_specialises_on():
    from gnnfuse.triton._launch import _spec

    base = torch.zeros(64)
    assert _spec(base) != _spec(base[1:])  # 16-byte alignment of a pointer
    assert _spec(base) != _spec(base.double())
    assert len({_spec(v) for v in (1, 2, 16, 2**31, 2**63)}) == 5  # ==1, %16, int32 / int64 / uint64 range
    assert _spec(True) != _spec(1) and _spec(None) != _spec(0)


def test_grid_helpers_match_triton():
    import triton

    from gnnfuse.triton._grid import cdiv, next_power_of_2

    assert all(next_power_of_2(n) == triton.next_power_of_2(n) for n in range(1, 2100))
    assert all(cdiv(a, b) == triton.cdiv(a, b) for a in range(0, 70) for b in range(1, 17))


def test_launch_hooks_turn_the_fast_path_off():
    import triton

    from gnnfuse.triton._launch import _hooks_set

    chain = getattr(getattr(triton, "knobs", None), "runtime", None)
    if chain is None or not hasattr(chain.launch_enter_hook, "add"):
        pytest.skip("this Triton has no launch hook chain")
    assert not _hooks_set()  # an empty chain is no hook

    def hook(*_):
        return None

    chain.launch_enter_hook.add(hook)
    try:
        assert _hooks_set()
    finally:
        chain.launch_enter_hook.remove(hook)


@needs_cuda
def test_fast_launch_matches_the_jit_launch():
    from gnnfuse.triton._launch import tested_triton

    if not tested_triton():
        pytest.skip("the fast launch path is off on this Triton version (see gnnfuse/triton/_launch.py)")
    kernel = tgs._rowgroup_kernel
    csr = _graph(scale=4)
    for offset in (0, 1):  # an unaligned x is another specialisation: compiled and cached apart
        x = torch.randn(csr.num_src * 40 + 1, device="cuda")[offset:offset + csr.num_src * 40].view(-1, 40)
        short = tgs.short_rows(csr.rowptr, 64)
        outs = []
        for launch in (kernel.kernel, kernel, kernel):  # plain JIT, first fast call (binds), cached call
            out = torch.zeros(csr.num_dst, 40, device="cuda")
            launch[(triton_cdiv(short.numel(), 16), 1)](x, short, csr.rowptr, csr.col, x, out, out, short.numel(), 40,
                                                         REDUCE=0, HAS_W=False, ACC64=False, TRACK=False, ROWS=16,
                                                         BLOCK_F=64, num_warps=4)
            outs.append(out)
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    assert len(kernel._compiled) >= 2


def triton_cdiv(a, b):
    return -(-a // b)


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_cached_setup_rebinds_nothing_wrong(reduce):
    """Repeated public calls on one graph reuse its cached forward setup and, on CUDA, its bound
    kernels (gnnfuse/triton/_launch.py BoundLaunches); an unaligned x or another width, dtype or
    weights must still give the reference's numbers."""
    csr = _graph(scale=8 if CUDA else 1)
    w = torch.rand(csr.num_edges, device=DEVICE) + 0.5
    for width, dtype, weight, offset in [(40, torch.float32, None, 0), (40, torch.float32, None, 1),
                                         (40, torch.float32, w, 0), (40, torch.float64, None, 0),
                                         (7, torch.float32, None, 1), (40, torch.float32, None, 0)]:
        base = torch.randn(csr.num_src * width + 1, device=DEVICE, dtype=dtype)
        x = base[offset:offset + csr.num_src * width].view(-1, width)
        weight = None if weight is None else weight.to(dtype)
        expected = _ref(x, csr, reduce, None if weight is None else weight[csr.perm])
        for _ in range(3):  # the first call binds, the next ones take the bound launches
            out = gnnfuse.fused_gather_scatter(x, csr, reduce, edge_weight=weight, backend="triton")
            torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def _forward_backward(csr, x, weight, reduce, grad):
    """The public call's output and the gradients of x and the weights."""
    x = x.clone().requires_grad_()
    weight = weight.clone().requires_grad_()
    out = gnnfuse.fused_gather_scatter(x, csr, reduce, edge_weight=weight, backend="triton")
    return (out.detach(), *torch.autograd.grad(out, (x, weight), grad))


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "mul"])
def test_fast_and_plain_launch_paths_agree_bitwise(reduce, monkeypatch):
    """Forward and backward through the one launch path (gnnfuse/triton/_launch.py), bitwise the
    same with the fast path (bound launches of the cached forward and backward setups, which the
    first call binds and the next ones reuse) and with Triton's plain launch, for an aligned and an
    unaligned x. max/min run under deterministic algorithms (their default x-gradient adds winners
    with atomics, in any order). On CUDA with a tested Triton both paths run; under the interpreter
    (the CPU CI) and off the tested Triton versions both are the plain path: the fast one needs a
    GPU (it calls Triton's compiled launcher)."""
    from gnnfuse.triton import _launch

    csr = _graph(scale=4 if CUDA else 1)
    g = torch.Generator().manual_seed(2)
    width = 40 if CUDA else 20  # (the interpreter: both paths are the plain one; keep it tiny)
    base = torch.randn(csr.num_src * width + 1, generator=g, dtype=torch.float64)
    base = (1 + 0.05 * base if reduce == "mul" else base).to(DEVICE)
    weight = (torch.rand(csr.num_edges, generator=g, dtype=torch.float64) + 0.5).to(DEVICE)
    grad = torch.randn(csr.num_dst, width, generator=g, dtype=torch.float64).to(DEVICE)
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(reduce in ("max", "min") or deterministic)
    try:
        for offset in (0, 1) if CUDA else (0,):  # an unaligned x takes FastKernel's path, not the bound one
            x = base[offset:offset + csr.num_src * width].view(-1, width)
            runs = [_forward_backward(csr, x, weight, reduce, grad) for _ in range(3 if CUDA else 1)]  # binds, bound
            with monkeypatch.context() as m:
                m.setattr(_launch, "_ENABLED", False)
                assert not _launch.BoundLaunches.usable(x)
                runs.append(_forward_backward(csr, x, weight, reduce, grad))
            for run in runs[1:]:
                assert all(torch.equal(a, b) for a, b in zip(runs[0], run))
        expected = _ref(x, csr, reduce, weight[csr.perm])
        torch.testing.assert_close(runs[0][0], expected.to(DEVICE), atol=1e-10, rtol=1e-9)
    finally:
        torch.use_deterministic_algorithms(deterministic)


def test_reduce_codes_are_named_and_shared():
    """The kernels test named compile-time codes (gnnfuse/triton/reduce_codes.py), whose values are
    the one table's (gnnfuse/reductions.py; csrc/reduce_codes.h is checked in test_reductions.py),
    never a literal integer."""
    import inspect
    from pathlib import Path
    import re

    from gnnfuse import reductions
    from gnnfuse.triton import gather_scatter_bwd_kernels, gather_scatter_fwd_kernels, reduce_codes

    assert {name.lower(): getattr(reduce_codes, name).value for name in
            ("SUM", "MEAN", "MAX", "MIN", "MUL", "VAR", "STD")} == reductions.CODES
    for module in (gather_scatter_fwd_kernels, gather_scatter_bwd_kernels):
        assert not re.findall(r"REDUCE\s*(?:==|!=|<=|>=|<|>)\s*\d", inspect.getsource(module)), module.__name__
    # every Triton module, including those not imported here (read as text: no GPU-only import)
    for path in Path(reduce_codes.__file__).parent.glob("*.py"):
        assert not re.findall(r"REDUCE\s*(?:==|!=|<=|>=|<|>)\s*\d", path.read_text()), path.name
