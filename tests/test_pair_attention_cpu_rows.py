"""The CPU pair forward's one-loop rows at 8 heads x 8 and 4 x 64 (csrc/pair_rows.h, pair_rows_8x8,
pair_rows_4x64): a
thread's rows in one loop, pipelined by rows (row i + 1's logits before row i's sums), rows with an
edge to itself to skip handed to the general path. GATv2 and the dot product with and without self
loops, square and bipartite graphs, int32 and int64 indices, dropout: against float64 (the general
kernels), the same bits for any thread count, and a row on the general path bit for bit the row the
loop gives once its edge to itself is removed."""
from __future__ import annotations

import math

import pytest
import torch

from gnnfuse._build import load_extension
from gnnfuse.csr import csr_for_edge_index
from gnnfuse.testing import outputs_at_thread_counts

pytestmark = pytest.mark.skipif(not __import__("gnnfuse")._build.extension_available("attention"),
                                reason="the C++ attention kernels are not built")

SLOPE = 0.2


def ext():
    return load_extension("attention")


def edges_with_self_rows(num_src, num_dst, num_edges, self_rows, seed=0):
    """Random edges plus an edge j -> j for each row in self_rows: the first and last rows, two
    consecutive rows (the pipelined loop meets one while another row is still open) and one alone."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.stack([torch.randint(0, num_src, (num_edges,), generator=g),
                      torch.randint(0, num_dst, (num_edges,), generator=g)])
    loops = torch.tensor([r for r in self_rows if r < min(num_src, num_dst)], dtype=torch.long)
    return torch.cat([ei, torch.stack([loops, loops])], 1)


def forward(csr, num_src, num_dst, gatv2, self_loops, dropout, dtype, index=torch.int64, seed=1, shape=(8, 8)):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(num_dst, *shape, generator=g, dtype=torch.float64)
    k, v = (torch.randn(num_src, *shape, generator=g, dtype=torch.float64) for _ in range(2))
    att = torch.randn(*shape, generator=g, dtype=torch.float64)
    return ext().pair_forward(q.to(dtype), k.to(dtype), v.to(dtype), att.to(dtype) if gatv2 else None, None,
                              csr.rowptr.to(index), csr.col.to(index), None, self_loops, gatv2, SLOPE,
                              1 / math.sqrt(shape[1]), dropout, 9)


SIZES = [(120, 120), (80, 120), (120, 80)]  # square; more targets than sources (rows without a loop); fewer
SHAPES = [(8, 8), (4, 64)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("num_src,num_dst", SIZES)
@pytest.mark.parametrize("mode", ["gatv2", "dot"])
@pytest.mark.parametrize("self_loops", [True, False])
@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_rows_match_float64(shape, num_src, num_dst, mode, self_loops, dropout):
    ei = edges_with_self_rows(num_src, num_dst, 700, [0, 7, 8, 30, num_dst - 1])
    csr = csr_for_edge_index(ei, num_src, num_dst)
    got = forward(csr, num_src, num_dst, mode == "gatv2", self_loops, dropout, torch.float32, torch.int32, shape=shape)
    want = forward(csr, num_src, num_dst, mode == "gatv2", self_loops, dropout, torch.float64, shape=shape)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, atol=2e-5 * max(1.0, float(b.abs().max())), rtol=1e-4)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["gatv2", "dot"])
@pytest.mark.parametrize("self_loops", [True, False])
def test_rows_same_for_any_thread_count(shape, mode, self_loops):
    ei = edges_with_self_rows(500, 500, 7000, [0, 3, 4, 5, 250, 251, 499])
    csr = csr_for_edge_index(ei, 500, 500)
    one, two = outputs_at_thread_counts(
        lambda: forward(csr, 500, 500, mode == "gatv2", self_loops, 0.3, torch.float32, shape=shape))
    for a, b in zip(one, two):
        assert torch.equal(a, b)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["gatv2", "dot"])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
def test_row_on_general_path_same_bits(shape, mode, index):
    """With self loops, a row with an edge to itself leaves the loop for the general path (csr_row's
    compacted copy); it and every other row must come out as the loop computes them without that edge."""
    self_rows = [0, 7, 8, 30, 119]
    with_self = edges_with_self_rows(120, 120, 700, self_rows)
    without = with_self[:, with_self[0] != with_self[1]]
    outs = [forward(csr_for_edge_index(ei, 120, 120), 120, 120, mode == "gatv2", True, 0.0, torch.float32, index,
                    shape=shape) for ei in (with_self, without)]
    for a, b in zip(*outs):
        assert torch.equal(a, b)
