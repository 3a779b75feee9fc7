"""The CPU attention forwards' row walk (csrc/attention_common.h, CsrRow): rows read in place from the
CSR, a compacted copy for rows with self loops to skip, the prefetch stream across rows and thread
ranges, and the softmax exps on 16-lane vectors of 16 / H edges (odd edge counts leave padded lanes).
Float32 (register tiles where H and F fit, else the general kernels) against float64 (the general
kernels), and the same bits for any thread count."""
from __future__ import annotations

import math

import pytest
import torch

from gnnfuse._build import load_extension
from gnnfuse.csr import csr_for_edge_index, transpose_parts_of
from gnnfuse.testing import outputs_at_thread_counts

pytestmark = pytest.mark.skipif(not __import__("gnnfuse")._build.extension_available("attention"),
                                reason="the C++ attention kernels are not built")

SLOPE = 0.2


def ext():
    return load_extension("attention")


def every_degree_graph(nodes=90, seed=0):
    """Row i has i % 41 edges (0 .. 40: every count of padded lanes for each H), some of them self
    loops (rows divisible by 7), and a hub row of 150 edges (longer than the prefetch distance)."""
    g = torch.Generator().manual_seed(seed)
    src, dst = [], []
    for i in range(nodes):
        deg = i % 41
        src += torch.randint(0, nodes, (deg,), generator=g).tolist()
        dst += [i] * deg
        if i % 7 == 0 and deg:
            src[-1] = i  # a self loop, skipped (and replaced by the virtual loop) with self_loops
    src += torch.randint(0, nodes, (150,), generator=g).tolist()
    dst += [nodes - 1] * 150
    ei = torch.tensor([src, dst])
    csr = csr_for_edge_index(ei, nodes, nodes)
    return csr, transpose_parts_of(csr.rowptr, csr.col, nodes), nodes


def close(a, b):
    torch.testing.assert_close(a.double(), b, atol=2e-5 * max(1.0, float(b.abs().max())), rtol=1e-4)


def gat_run(csr, transpose, nodes, heads, width, self_loops, dropout, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    x, grad = (torch.randn(nodes, heads, width, generator=g, dtype=torch.float64) for _ in range(2))
    a_src, a_dst, a_loop = (torch.randn(nodes, heads, generator=g, dtype=torch.float64) for _ in range(3))
    a_edge = torch.randn(csr.num_edges, heads, generator=g, dtype=torch.float64)
    args = [t.to(dtype) for t in (x, a_src, a_dst, a_edge)] + [a_loop.to(dtype) if self_loops else None]
    scalars = (self_loops, SLOPE, dropout, 5)
    out, m, z = ext().gat_forward(*args, csr.rowptr, csr.col, *scalars)
    grads = ext().gat_backward(grad.to(dtype), out, m, z, *args, csr.rowptr, csr.col, *transpose, *scalars,
                               [True, True, True, True, self_loops])
    return [out, m, z, *grads]


def pair_run(csr, transpose, nodes, heads, width, gatv2, dropout, dtype, seed=2):
    g = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(nodes, heads, width, generator=g, dtype=torch.float64) for _ in range(4))
    att = torch.randn(heads, width, generator=g, dtype=torch.float64)
    args = (q.to(dtype), k.to(dtype), v.to(dtype), att.to(dtype) if gatv2 else None, None, csr.rowptr, csr.col, None)
    scalars = (gatv2, gatv2, SLOPE, 1 / math.sqrt(width), dropout, 5)
    out, m, z = ext().pair_forward(*args, *scalars)
    grads = ext().pair_backward(grad.to(dtype), out, m, z, *args, *transpose, *scalars,
                                [True, True, True, gatv2, False])
    return [out, m, z, *grads]


# tile shapes (H in 1, 2, 4, 8, 16) and shapes the general kernels take (H = 3, 5; F = 12)
SHAPES = [(1, 16), (2, 8), (4, 4), (8, 8), (16, 2), (4, 64), (3, 16), (5, 8), (2, 12)]


@pytest.mark.parametrize("heads,width", SHAPES)
@pytest.mark.parametrize("mode", ["gat", "gatv2", "dot"])
@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_every_row_length_matches_float64(heads, width, mode, dropout):
    csr, transpose, nodes = every_degree_graph()

    def run(dtype):
        if mode == "gat":
            return gat_run(csr, transpose, nodes, heads, width, True, dropout, dtype)
        return pair_run(csr, transpose, nodes, heads, width, mode == "gatv2", dropout, dtype)

    for a, b in zip(run(torch.float32), run(torch.float64)):
        if b.numel():
            close(a, b)


@pytest.mark.parametrize("heads,width", [(8, 8), (4, 64), (1, 16)])
@pytest.mark.parametrize("mode", ["gat", "gatv2", "dot"])
def test_row_walk_same_for_any_thread_count(heads, width, mode):
    """Several thread ranges, each with its own prefetch stream end, on a graph large enough to split."""
    g = torch.Generator().manual_seed(3)
    nodes = 600
    ei = torch.randint(0, nodes, (2, 9000), generator=g)
    ei[0, :40] = ei[1, :40]  # self loops to skip
    csr = csr_for_edge_index(ei, nodes, nodes)
    transpose = transpose_parts_of(csr.rowptr, csr.col, nodes)

    def run():
        if mode == "gat":
            return gat_run(csr, transpose, nodes, heads, width, True, 0.3, torch.float32)
        return pair_run(csr, transpose, nodes, heads, width, mode == "gatv2", 0.3, torch.float32)

    one, two = outputs_at_thread_counts(run)
    for a, b in zip(one, two):
        assert torch.equal(a, b)


def test_rows_without_edges_give_zeros():
    """A graph whose rows are all empty: outputs, row max and row sums are 0 (no virtual loops)."""
    csr = csr_for_edge_index(torch.zeros(2, 0, dtype=torch.long), 5, 5)
    x = torch.randn(5, 8, 8)
    a = torch.randn(5, 8)
    out, m, z = ext().gat_forward(x, a, a, None, None, csr.rowptr, csr.col, False, SLOPE, 0.0, 0)
    assert not out.any() and not m.any() and not z.any()
    out, m, z = ext().pair_forward(x, x, x, None, None, csr.rowptr, csr.col, None, False, False, SLOPE, 0.3, 0.0, 0)
    assert not out.any() and not m.any() and not z.any()
