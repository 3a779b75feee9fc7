"""The locality-aware row schedule of the Triton gather-scatter (gnnfuse/triton/schedule.py):
the dispatch's statistic picks windows on id-local graphs and the global degree order otherwise,
and the windowed schedule gives bitwise the same result as the global one (each row is reduced
in CSR order by one program, whichever order the rows run in); so does the one-launch plan's
cache hint on the gathered rows."""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

import gnnfuse  # noqa: E402
from gnnfuse import reference  # noqa: E402
from gnnfuse.csr import CSR  # noqa: E402
from gnnfuse.graphs import planted_communities  # noqa: E402
from gnnfuse.triton import gather_scatter as tgs  # noqa: E402
from gnnfuse.triton import schedule  # noqa: E402
from gnnfuse.triton.gather_scatter_dispatch import choose  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
if not CUDA and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs CUDA or TRITON_INTERPRET=1", allow_module_level=True)


def _community_csr(n, e, order, seed=0):
    ei, _ = planted_communities(n, e, community_size=(n // 12, n // 6), max_degree=max(8, e // n * 4),
                                order=order, seed=seed)
    return CSR.from_edge_index(ei.to(DEVICE), n)


def test_short_rows_windowed_order():
    rowptr = torch.tensor([0, 1, 4, 4, 6, 7, 10, 10, 11])  # degrees 1 3 0 2 1 3 0 1
    assert schedule.short_rows(rowptr, 2).tolist() == [3, 0, 4, 7, 2, 6]  # global: degree desc, stable
    # windows of 4 ids: rows 0-3, then 4-7, each by decreasing degree
    assert schedule.short_rows(rowptr, 2, 4).tolist() == [3, 0, 2, 4, 7, 6]


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_windowed_schedule_is_bitwise_the_global_one(reduce):
    csr = _community_csr(96, 700, "generated")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(csr.num_src, 20, generator=g).to(DEVICE)
    w = (torch.rand(csr.num_edges, generator=g) + 0.5).to(DEVICE)
    for weight in (None, w):
        outs = []
        for window in (0, 8, 40):
            plan = tgs.plan_for(x, csr.rowptr, csr.col, reduce, "hybrid", block_e=16, seg=16, short_max=8,
                                group_rows=4, group_block_f=16, window=window)
            assert plan.window == window and (f"windows of {window}" in plan.describe()) == (window > 0)
            out, arg = tgs.forward(x, csr.rowptr, csr.col, weight, reduce, plan=plan)
            outs.append((out, arg))
        ref = reference.gather_scatter(x.double(), csr.col, csr.row(), csr.num_dst, reduce,
                                       None if weight is None else weight.double())
        torch.testing.assert_close(outs[0][0].double(), ref, atol=1e-5, rtol=1e-5)
        for out, arg in outs[1:]:
            assert torch.equal(out, outs[0][0]) and torch.equal(arg, outs[0][1])


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_eviction_hint_is_bitwise_neutral(reduce):
    """The one-launch plan's cache hint on the x gathers changes where rows are kept, not what is
    summed: bitwise the same values and winners with every hint."""
    csr = _community_csr(96, 700, "generated")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(csr.num_src, 20, generator=g).to(DEVICE)
    w = (torch.rand(csr.num_edges, generator=g) + 0.5).to(DEVICE)
    tiles = dict(block_e=16, seg=16, short_max=8, group_rows=4, group_block_f=16, window=8, one_pass=True)
    for weight in (None, w):
        base = tgs.forward(x, csr.rowptr, csr.col, weight, reduce, plan=tgs.plan_for(
            x, csr.rowptr, csr.col, reduce, "hybrid", **tiles))
        for hint in ("evict_last", "evict_first"):
            plan = tgs.plan_for(x, csr.rowptr, csr.col, reduce, "hybrid", x_evict=hint, **tiles)
            assert f"x rows gathered {hint}" in plan.describe()
            out, arg = tgs.forward(x, csr.rowptr, csr.col, weight, reduce, plan=plan)
            assert torch.equal(out, base[0]) and torch.equal(arg, base[1])


def test_dispatch_measures_locality(monkeypatch):
    """With an L2 far smaller than x, community order gets windows and scrambled ids do not."""
    monkeypatch.setattr(schedule, "l2_cache_bytes", lambda device: 16 * 1024)
    monkeypatch.setattr(schedule, "WINDOW_ROWS", 128)
    F = 16
    for order, windowed in (("generated", True), ("scrambled", False)):
        csr = _community_csr(3000, 30000, order)
        window, why = schedule.choose_window(csr.rowptr, csr.col, csr.num_src, F, 4, torch.device(DEVICE))
        assert (window == 128) == windowed and (window == 0) != windowed, why
        assert "locality" in why
    # x that fits in L2: no windows, whatever the order
    monkeypatch.setattr(schedule, "l2_cache_bytes", lambda device: 2**30)
    window, why = schedule.choose_window(csr.rowptr, csr.col, csr.num_src, F, 4, torch.device(DEVICE))
    assert window == 0 and "fits in L2" in why


def test_plan_for_and_explain_report_the_schedule(monkeypatch):
    monkeypatch.setattr(schedule, "l2_cache_bytes", lambda device: 16 * 1024)
    monkeypatch.setattr(schedule, "WINDOW_ROWS", 128)
    csr = _community_csr(3000, 30000, "generated")
    x = torch.randn(csr.num_src, 16).to(DEVICE)
    plan = tgs.plan_for(x, csr.rowptr, csr.col, "sum")
    assert plan.kernel == "hybrid" and plan.window == 128 and "locality" in plan.reason
    assert "windows of 128 consecutive ids" in plan.describe()
    out = gnnfuse.fused_gather_scatter(x, csr, "sum", backend="triton") if CUDA else tgs.infer(
        x, csr.rowptr, csr.col, None, "sum")
    torch.testing.assert_close(out.double(), reference.gather_scatter(x.double(), csr.col, csr.row(), csr.num_dst,
                                                                      "sum"), atol=1e-4, rtol=1e-5)
    if CUDA:
        report = gnnfuse.explain(x, csr, "sum", backend="triton")
        assert "locality" in report.kernel and "windows of 128" in report.kernel


def test_one_launch_plan_gathers_x_rows_evict_last():
    """From 256-byte rows the default (one launch) hints its x gathers evict_last; narrower rows
    take the two-launch plan, which has no hints."""
    wide, narrow = choose("sum", 1000, 30000, 64, torch.float32), choose("sum", 1000, 30000, 32, torch.float32)
    assert wide.one_pass and wide.x_evict == "evict_last" and "x rows gathered evict_last" in wide.describe()
    assert not narrow.one_pass and "gathered" not in narrow.describe()
