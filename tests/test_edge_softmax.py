"""gnnfuse.edge_softmax against PyG's softmax and the reference; registration and gradients."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
from gnnfuse import CSR
from gnnfuse.testing import TOLERANCES, random_graph

N, E, H = 10, 50, 3


def graph(index_dtype=torch.int64):
    return random_graph(N, N - 2, E, seed=4).to(index_dtype)  # targets N-2, N-1: empty rows


@pytest.mark.parametrize("backend", ["cpu", "triton", "reference"])
@pytest.mark.parametrize("shape", [(E,), (E, H)])
def test_matches_pyg_softmax_with_gradients(backend, shape):
    from torch_geometric.utils import softmax

    dev = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    logits = torch.randn(*shape, dtype=torch.float64, device=dev, requires_grad=True)
    ei = graph().to(dev)
    out = gnnfuse.edge_softmax(logits, ei, num_nodes=N, backend=backend)
    ref = softmax(logits, ei[1], num_nodes=N)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, logits, g)[0], torch.autograd.grad(ref, logits, g)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_and_int32_csr(dtype):
    logits = torch.randn(E, H, dtype=torch.float64)
    csr = CSR.from_edge_index(graph(torch.int32), N)
    out = gnnfuse.edge_softmax(logits.to(dtype), csr)
    ref = gnnfuse.edge_softmax(logits, graph(), num_nodes=N, backend="reference")
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)


def test_gradcheck_opcheck_and_compile():
    logits = torch.randn(E, H, dtype=torch.float64, requires_grad=True)
    csr = CSR.from_edge_index(graph(), N)
    assert torch.autograd.gradcheck(lambda t: gnnfuse.edge_softmax(t, csr), (logits,))
    torch.library.opcheck(torch.ops.gnnfuse.edge_softmax.default, (logits, csr.rowptr, csr.perm))
    compiled = torch.compile(lambda t: gnnfuse.edge_softmax(t, csr).square().sum(), fullgraph=True, dynamic=True)
    torch.testing.assert_close(compiled(logits), gnnfuse.edge_softmax(logits, csr).square().sum())


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="logits must have shape"):
        gnnfuse.edge_softmax(torch.randn(E + 1, H), graph(), num_nodes=N)
    with pytest.raises(TypeError, match="logits must have a floating dtype"):
        gnnfuse.edge_softmax(torch.ones(E, dtype=torch.long), graph(), num_nodes=N)
