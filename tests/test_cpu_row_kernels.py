"""The CPU gather-scatter's row kernels, bitwise: the register-tiled rows (with their prefetch
look-ahead split off the edge loop, the narrow tiles' edges walked in chunks on graphs of short
rows, the tail narrower than a vector in one masked vector) fold every output element in CSR
order, one edge after another, whatever the width, the row lengths and the thread count; max/min
with winners (the training path) keep the first winner in CSR order and send each gradient to
it; and the reuse of large output buffers changes nothing but speed."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse import CSR
from gnnfuse._build import load_extension

REDUCTIONS = gnnfuse.REDUCTIONS


def long_and_empty_rows(n: int = 300, seed: int = 0) -> torch.Tensor:
    """Rows of 0 to ~200 edges (past every prefetch look-ahead, 4 to 64 edges), many empty."""
    g = torch.Generator().manual_seed(seed)
    degree = torch.randint(0, 8, (n,), generator=g)
    degree[::7] = 0
    degree[::11] = torch.randint(60, 200, degree[::11].shape, generator=g)
    dst = torch.repeat_interleave(torch.arange(n), degree)
    src = torch.randint(0, n, dst.shape, generator=g)
    return torch.stack([src, dst])


def sequential_fold(x: torch.Tensor, csr: CSR, reduce: str) -> torch.Tensor:
    """out[i] = fold over the row's edges in CSR order, in x's dtype: the k-th edges of all rows
    at once, k = 0, 1, ... (the first edge initialises, mean divides the sum by the count)."""
    rowptr, col = csr.rowptr.long(), csr.col.long()
    degree = rowptr.diff()
    out = torch.zeros(csr.num_dst, x.shape[1], dtype=x.dtype)
    for k in range(int(degree.max()) if degree.numel() else 0):
        rows = (degree > k).nonzero().squeeze(1)
        msg = x[col[rowptr[rows] + k]]
        if k == 0:
            out[rows] = msg
            continue
        acc = out[rows]
        if reduce in ("sum", "mean"):
            out[rows] = acc + msg
        elif reduce == "mul":
            out[rows] = acc * msg
        else:
            better = msg > acc if reduce == "max" else msg < acc
            out[rows] = torch.where(better | msg.isnan(), msg, acc)
    if reduce == "mean":
        full = degree > 0
        out[full] = out[full] / degree[full].unsqueeze(1).to(x.dtype)
    return out


def short_rows(n: int = 300, seed: int = 0) -> torch.Tensor:
    """Rows of 0 to 9 edges and a few of ~20 (fewer than 8 edges a row on average: the narrow
    tiles walk their edges in chunks of 4, the last chunk partly past the row's end)."""
    g = torch.Generator().manual_seed(seed)
    degree = torch.randint(0, 10, (n,), generator=g)
    degree[::13] = 20
    assert degree.sum() <= 8 * n
    dst = torch.repeat_interleave(torch.arange(n), degree)
    src = torch.randint(0, n, dst.shape, generator=g)
    return torch.stack([src, dst])


GRAPHS = {"long_rows": long_and_empty_rows, "short_rows": short_rows}


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_rows_fold_in_csr_order_bitwise(reduce, dtype, graph):
    edge_index = GRAPHS[graph]()
    n = 300
    csr = CSR.from_edge_index(edge_index, n)
    threads = torch.get_num_threads()
    try:
        for F in (3, 4, 16, 32, 40, 100, 128, 264):  # tails narrower than a vector, every tile width
            x = torch.randn(n, F, dtype=dtype, generator=torch.Generator().manual_seed(F))
            if reduce == "mul":
                x = 1 + x / 64
            want = sequential_fold(x, csr, reduce)
            for t in (1, 2):
                torch.set_num_threads(t)
                with torch.no_grad():  # max/min without winners: the register-tiled path
                    got = gnnfuse.fused_gather_scatter(x, csr, reduce)
                assert torch.equal(got, want), (F, t)
    finally:
        torch.set_num_threads(threads)


def sequential_winners(x: torch.Tensor, csr: CSR, reduce: str) -> tuple[torch.Tensor, torch.Tensor]:
    """max/min and the winning CSR position per (row, feature): edge by edge in CSR order, a
    message replaces the best if strictly better or NaN (ties keep the first); -1 in empty rows."""
    rowptr, col = csr.rowptr.long(), csr.col.long()
    degree = rowptr.diff()
    out = torch.zeros(csr.num_dst, x.shape[1], dtype=x.dtype)
    win = torch.full((csr.num_dst, x.shape[1]), -1, dtype=torch.long)
    for k in range(int(degree.max()) if degree.numel() else 0):
        rows = (degree > k).nonzero().squeeze(1)
        pos = rowptr[rows] + k
        msg = x[col[pos]]
        if k == 0:
            take = torch.ones_like(msg, dtype=torch.bool)
        else:
            take = (msg > out[rows] if reduce == "max" else msg < out[rows]) | msg.isnan()
        out[rows] = torch.where(take, msg, out[rows])
        win[rows] = torch.where(take, pos.unsqueeze(1), win[rows])
    return out, win


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_winners_are_the_first_in_csr_order_and_get_the_gradient(reduce, dtype, graph):
    """The forward that keeps winners (register tiles and the scalar tail) gives the one-edge-at-a-
    time result and winners, ties and NaNs included; the backward sends each gradient to its
    winner. Small integers make ties common and every gradient sum exact in any order."""
    edge_index = GRAPHS[graph](seed=5)
    n = 300
    csr = CSR.from_edge_index(edge_index, n)
    t_rowptr, t_col, t_pos = csr.transpose_parts()
    threads = torch.get_num_threads()
    try:
        for F in (3, 16, 40, 64, 100):
            g = torch.Generator().manual_seed(F)
            x = torch.randint(-4, 5, (n, F), generator=g).to(dtype)
            x[torch.rand(n, F, generator=g) < 0.01] = float("nan")
            grad_out = torch.randint(-8, 9, (n, F), generator=g).to(dtype)
            want, want_win = sequential_winners(x, csr, reduce)
            want_grad = torch.zeros_like(x)
            hit = want_win >= 0
            want_grad.index_put_((csr.col.long()[want_win[hit]], hit.nonzero()[:, 1]), grad_out[hit], accumulate=True)
            for t in (1, 2):
                torch.set_num_threads(t)
                out, win = torch.ops.gnnfuse.gather_scatter(x, csr.rowptr, csr.col, None, t_rowptr, t_col, t_pos, reduce)
                assert torch.equal(out.isnan(), want.isnan()), (F, t)
                assert torch.equal(out.nan_to_num(0.5), want.nan_to_num(0.5)), (F, t)
                assert torch.equal(win.long(), want_win), (F, t)
                grad_x, _ = torch.ops.gnnfuse.gather_scatter_backward(grad_out, x, csr.rowptr, csr.col, None, t_rowptr,
                                                                      t_col, t_pos, win, reduce, True, False)
                assert torch.equal(grad_x, want_grad), (F, t)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_winner_mask_backward_adds_in_the_transpose_order_bitwise(reduce, index_dtype):
    """The unweighted float max/min backward (per-edge winner masks, won lanes only, from 32
    features) adds exactly what the weighted path with weights of one adds, in the same order:
    random floats (order-sensitive sums), duplicate edges, ties at zero, NaNs, empty rows, widths
    past one 64-feature block, 1 and 2 threads."""
    edge_index = long_and_empty_rows(seed=9)
    edge_index = torch.cat([edge_index, edge_index[:, :40]], 1)  # duplicate edges
    n = 300
    csr = CSR.from_edge_index(edge_index, n, index_dtype=index_dtype)
    t_rowptr, t_col, t_pos = csr.transpose_parts()
    ones = torch.ones(csr.num_edges)
    threads = torch.get_num_threads()
    try:
        for F in (31, 32, 64, 100, 130):
            g = torch.Generator().manual_seed(F)
            x = torch.randn(n, F, generator=g).relu()  # many ties at 0
            x[torch.rand(n, F, generator=g) < 0.01] = float("nan")
            grad_out = torch.randn(n, F, generator=g)
            _, win = torch.ops.gnnfuse.gather_scatter(x, csr.rowptr, csr.col, None, t_rowptr, t_col, t_pos, reduce)
            grads = []
            for t in (1, 2):
                torch.set_num_threads(t)
                for w in (None, ones):
                    grads.append(torch.ops.gnnfuse.gather_scatter_backward(
                        grad_out, x, csr.rowptr, csr.col, w, t_rowptr, t_col, t_pos, win, reduce, True, False)[0])
            for other in grads[1:]:
                assert torch.equal(grads[0], other), F
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_weighted_rows_and_gradients_same_for_any_thread_count(reduce, graph):
    """With edge weights (the message scale inside the fold) and through the backward (the same
    row kernel over the transpose), 1 and 2 threads give bitwise the same results."""
    edge_index = GRAPHS[graph](seed=1)
    n = 300
    csr = CSR.from_edge_index(edge_index, n)
    w0 = torch.rand(edge_index.shape[1], generator=torch.Generator().manual_seed(1))
    results = []
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            x = torch.randn(n, 100, generator=torch.Generator().manual_seed(2)).requires_grad_()
            w = w0.clone().requires_grad_()
            out = gnnfuse.fused_gather_scatter(x, edge_index, reduce, edge_weight=w)
            results.append([out.detach(), *torch.autograd.grad(out.pow(2).sum(), (x, w))])
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)


# ---- reuse of large output buffers ------------------------------------------------------------
WIDE = 1024  # 8192 x 1024 floats: 32 MiB, the smallest output the cache keeps


def big_graph():
    """A graph whose F=WIDE float output is at the cache's 32 MiB threshold."""
    n = 8192
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, n, (2, 4 * n), generator=g), n


def test_output_buffer_of_a_dead_result_is_reused_with_correct_values():
    ext = load_extension()
    edge_index, n = big_graph()
    csr = CSR.from_edge_index(edge_index, n)
    x = torch.randn(n, WIDE)
    ext.clear_output_cache()
    first = gnnfuse.fused_gather_scatter(x, csr, "sum")
    want = first.clone()
    address = first.data_ptr()
    first.fill_(float("nan"))  # stale contents must not leak into the next result
    del first
    assert ext.output_cache_bytes() == n * WIDE * 4
    again = gnnfuse.fused_gather_scatter(x, csr, "sum")
    assert again.data_ptr() == address and ext.output_cache_bytes() == 0
    assert torch.equal(again, want)
    other = gnnfuse.fused_gather_scatter(x, csr, "sum")  # `again` is alive: a fresh buffer
    assert other.data_ptr() != again.data_ptr() and torch.equal(other, want)


def test_output_buffer_stays_while_a_view_lives_and_resizes_like_any_tensor():
    ext = load_extension()
    edge_index, n = big_graph()
    x = torch.randn(n, WIDE)
    ext.clear_output_cache()
    out = gnnfuse.fused_gather_scatter(x, edge_index, "mean")
    view = out[:10]
    del out
    assert ext.output_cache_bytes() == 0  # the view still uses the buffer
    del view
    assert ext.output_cache_bytes() == n * WIDE * 4
    grown = gnnfuse.fused_gather_scatter(x, edge_index, "mean")
    want = grown.clone()
    grown.resize_(2 * n, WIDE)  # a resizable CPU tensor: moves to the CPU allocator
    assert torch.equal(grown[:n], want)
    del grown
    assert ext.output_cache_bytes() == n * WIDE * 4  # the old buffer went back


def test_backward_gradient_buffers_are_reused_bitwise():
    edge_index, n = big_graph()
    x = torch.randn(n, WIDE, requires_grad=True)
    grads = [torch.autograd.grad(gnnfuse.fused_gather_scatter(x, edge_index, "sum").sum(), x)[0] for _ in range(3)]
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])


def test_cache_size_setting_zero_turns_the_cache_off():
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = ("import torch, gnnfuse\n"
              "from gnnfuse._build import load_extension\n"
              "out = gnnfuse.fused_gather_scatter(torch.randn(8192, 1024), torch.randint(0, 8192, (2, 30000)))\n"
              "del out\n"
              "print(load_extension().output_cache_bytes())\n")
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "GNNFUSE_CPU_OUTPUT_CACHE_MB": "0",
           "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True)
    assert done.stdout.strip().splitlines()[-1] == "0"


def test_bypass_gives_fresh_buffers_and_keeps_the_cached_ones():
    ext = load_extension()
    edge_index, n = big_graph()
    x = torch.randn(n, WIDE)
    ext.clear_output_cache()
    del_me = gnnfuse.fused_gather_scatter(x, edge_index, "sum")
    want = del_me.clone()
    del del_me
    assert ext.output_cache_bytes() == n * WIDE * 4
    previous = ext.output_cache_bypass(True)
    try:
        fresh = gnnfuse.fused_gather_scatter(x, edge_index, "sum")
    finally:
        ext.output_cache_bypass(previous)
    assert ext.output_cache_bytes() == n * WIDE * 4 and torch.equal(fresh, want)
    del fresh
    assert ext.output_cache_bytes() == n * WIDE * 4  # a fresh buffer is not the cache's


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_a_column_rounds_the_same_in_a_vector_tile_and_in_the_scalar_tail(reduce):
    """With edge weights each element is folded as acc + w * x in every part of a row (vector tiles
    and the narrow scalar tail alike), so a feature column's result, and its gradient through the
    transposed row kernel, do not depend on where the column falls in the row."""
    edge_index = long_and_empty_rows(seed=2)
    n = 300
    w = torch.rand(edge_index.shape[1], generator=torch.Generator().manual_seed(3))
    x = torch.randn(n, 35, generator=torch.Generator().manual_seed(4), requires_grad=True)  # 32 + a 3-wide tail
    out = gnnfuse.fused_gather_scatter(x, edge_index, reduce, edge_weight=w)
    (grad,) = torch.autograd.grad(out, x, torch.ones_like(out))
    for j in (0, 17, 33):
        column = x.detach()[:, j:j + 1].clone().requires_grad_()
        alone = gnnfuse.fused_gather_scatter(column, edge_index, reduce, edge_weight=w)
        (grad_alone,) = torch.autograd.grad(alone, column, torch.ones_like(alone))
        assert torch.equal(out.detach()[:, j], alone.detach()[:, 0]), j
        assert torch.equal(grad[:, j], grad_alone[:, 0]), j
