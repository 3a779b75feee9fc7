"""Per-edge tensors into CSR order (ops/_edge_order.py): the CUDA scatter route gives index_select's
values and gradients, bit for bit, to any order of derivative; other devices and modes keep index_select."""
from __future__ import annotations

import pytest
import torch

from gnnfuse.ops._edge_order import _ScatterRows, _scatter_indices, in_csr_order


def _case(device, dtype=torch.float64, heads=4, edges=97):
    g = torch.Generator().manual_seed(3)
    perm = torch.randperm(edges, generator=g).int().to(device)
    t = torch.randn(edges, heads, generator=g, dtype=dtype).to(device)
    return t, perm


def test_scatter_rows_is_index_select_with_its_gradients():
    t, perm = _case("cpu")
    inverse, perm64 = _scatter_indices(perm)
    assert torch.equal(_ScatterRows.apply(t, inverse, perm64), t.index_select(0, perm))
    t.requires_grad_()
    f = lambda a: _ScatterRows.apply(a, inverse, perm64)  # noqa: E731
    assert torch.autograd.gradcheck(f, (t,)) and torch.autograd.gradgradcheck(f, (t,))


def test_in_csr_order_keeps_index_select_off_cuda_and_in_deterministic_mode():
    t, perm = _case("cpu")
    assert torch.equal(in_csr_order(t, perm), t.index_select(0, perm))
    assert torch.equal(in_csr_order(t[:, 0], perm), t[:, 0].index_select(0, perm))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the scatter route runs on CUDA")
@pytest.mark.parametrize("deterministic", [False, True])
def test_in_csr_order_on_cuda_matches_index_select(deterministic):
    t, perm = _case("cuda", torch.float32, heads=8, edges=5000)
    t.requires_grad_()
    g = torch.randn_like(t)
    torch.use_deterministic_algorithms(deterministic)
    try:
        got = in_csr_order(t, perm)
        (grad,) = torch.autograd.grad(got, t, g)
    finally:
        torch.use_deterministic_algorithms(False)
    want = t.index_select(0, perm)
    (want_grad,) = torch.autograd.grad(want, t, g)
    assert torch.equal(got, want) and torch.equal(grad, want_grad)
    assert got.grad_fn is not None and (type(got.grad_fn).__name__ == "IndexSelectBackward0") == deterministic
