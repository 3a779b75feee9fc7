"""fused_gather_scatter with multi-head edge weights ([E, H] weights, x [N, H, F]): against the
reference on CPU and Triton, gradients, registration (opcheck, compile), determinism, errors."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse import CSR
from gnnfuse.ops import head_gather_scatter as hgs
from gnnfuse.testing import TOLERANCES, outputs_at_thread_counts, random_graph, through_registered_op

N_SRC, N_DST, E, H, F = 9, 8, 40, 3, 5
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def graph(index_dtype=torch.int64, device="cpu"):
    return random_graph(N_SRC, N_DST - 2, E, seed=7).to(index_dtype).to(device)  # 2 empty target rows


def inputs(dtype=torch.float64, device="cpu"):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N_SRC, H, F, generator=g, dtype=torch.float64).to(dtype).to(device).requires_grad_()
    w = torch.rand(E, H, generator=g, dtype=torch.float64).to(dtype).to(device).requires_grad_()
    return x, w


@pytest.mark.parametrize("backend", ["cpu", "triton"])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_matches_reference_with_gradients(backend, reduce):
    dev = DEV if backend == "triton" else "cpu"
    x, w = inputs(device=dev)
    ei = graph(device=dev)
    out = gnnfuse.fused_gather_scatter(x, ei, reduce, edge_weight=w, num_nodes=N_DST, backend=backend)
    ref = gnnfuse.fused_gather_scatter(x, ei, reduce, edge_weight=w, num_nodes=N_DST, backend="reference")
    assert out.shape == (N_DST, H, F)
    torch.testing.assert_close(out, ref)
    assert out[-2:].abs().sum() == 0  # empty rows
    g = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, (x, w), g), torch.autograd.grad(ref, (x, w), g))


def test_each_head_equals_the_one_weight_op():
    x, w = inputs()
    ei = graph()
    out = gnnfuse.fused_gather_scatter(x, ei, "mean", edge_weight=w, num_nodes=N_DST)
    for h in range(H):
        one = gnnfuse.fused_gather_scatter(x[:, h], ei, "mean", edge_weight=w[:, h], num_nodes=N_DST)
        torch.testing.assert_close(out[:, h], one)


def test_hub_rows_split_on_triton(monkeypatch):
    from gnnfuse.triton import attention

    monkeypatch.setattr(attention, "SPLIT_EDGES", 8)  # rows of 9+ edges become several pieces
    dev = DEV
    src = torch.randint(0, N_SRC, (60,))
    dst = torch.cat([torch.zeros(30, dtype=torch.long), torch.randint(0, N_DST, (30,))])
    ei = torch.stack([src, dst]).to(dev)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N_SRC, H, F, generator=g, dtype=torch.float64).to(dev).requires_grad_()
    w = torch.rand(60, H, generator=g, dtype=torch.float64).to(dev).requires_grad_()
    out = gnnfuse.fused_gather_scatter(x, ei, "sum", edge_weight=w, num_nodes=N_DST, backend="triton")
    ref = gnnfuse.fused_gather_scatter(x, ei, "sum", edge_weight=w, num_nodes=N_DST, backend="reference")
    torch.testing.assert_close(out, ref)
    gr = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, (x, w), gr), torch.autograd.grad(ref, (x, w), gr))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_and_int32_csr(dtype):
    x, w = inputs()
    csr = CSR.from_edge_index(graph(torch.int32), (N_SRC, N_DST))
    out = gnnfuse.fused_gather_scatter(x.detach().to(dtype), csr, "sum", edge_weight=w.detach().to(dtype))
    ref = gnnfuse.fused_gather_scatter(x.detach(), graph(), "sum", edge_weight=w.detach(), num_nodes=N_DST,
                                       backend="reference")
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), ref, atol=atol * 4, rtol=rtol)


def test_gradcheck_opcheck_compile_and_registered_route():
    x, w = inputs()
    csr = CSR.from_edge_index(graph(), (N_SRC, N_DST))
    for reduce in ("sum", "mean"):
        assert torch.autograd.gradcheck(
            lambda a, b: gnnfuse.fused_gather_scatter(a, csr, reduce, edge_weight=b), (x, w))
    wc = w.detach().index_select(0, csr.perm)
    t = csr._transpose_parts()
    torch.library.opcheck(torch.ops.gnnfuse.head_gather_scatter.default,
                          (x.detach(), csr.rowptr, csr.col, wc, *t, True))
    torch.library.opcheck(torch.ops.gnnfuse.head_gather_scatter.default,
                          (x.detach(), csr.rowptr, csr.col, wc, None, None, None, False))
    fn = torch.compile(lambda a, b: gnnfuse.fused_gather_scatter(a, csr, "mean", edge_weight=b).square().sum(),
                       fullgraph=True, dynamic=True)
    eager = gnnfuse.fused_gather_scatter(x, csr, "mean", edge_weight=w).square().sum()
    torch.testing.assert_close(fn(x, w), eager)
    torch.testing.assert_close(torch.autograd.grad(fn(x, w), (x, w)), torch.autograd.grad(eager, (x, w)))
    with through_registered_op():
        reg = gnnfuse.fused_gather_scatter(x, csr, "mean", edge_weight=w).square().sum()
    assert torch.equal(reg, eager)


def test_deterministic_across_thread_counts():
    ei = random_graph(300, 200, 6000, seed=2, power_law=True)
    x = torch.randn(300, 4, 16, requires_grad=True)
    w = torch.rand(6000, 4, requires_grad=True)

    def run():
        out = gnnfuse.fused_gather_scatter(x, ei, "sum", edge_weight=w, num_nodes=200)
        return (out, *torch.autograd.grad(out.square().sum(), (x, w)))

    results = outputs_at_thread_counts(run, (1, 2))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_other_reduces_and_errors():
    x, w = inputs()
    ei = graph()
    with pytest.raises(ValueError, match="edge_weight of shape \\[E, H\\] supports reduce 'sum' and 'mean'"):
        gnnfuse.fused_gather_scatter(x, ei, "max", edge_weight=w, num_nodes=N_DST)
    out = gnnfuse.fused_gather_scatter(x, ei, "max", edge_weight=w, num_nodes=N_DST, backend="reference")
    assert out.shape == (N_DST, H, F)
    with pytest.raises(ValueError, match="edge_weight must have shape"):
        gnnfuse.fused_gather_scatter(x, ei, edge_weight=w[:, :2], num_nodes=N_DST)
    with pytest.raises(ValueError, match="edge_weight must have shape \\[E\\] \\(or \\[E, H\\] with x"):
        gnnfuse.fused_gather_scatter(x.reshape(N_SRC, -1), ei, edge_weight=w, num_nodes=N_DST)
    ref = hgs.reference(x, w, ei[0], ei[1], N_DST, "sum")
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, ei, edge_weight=w, num_nodes=N_DST), ref)
