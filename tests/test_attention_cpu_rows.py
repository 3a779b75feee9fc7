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


def csr_rows_keyed(ei, num_src, num_dst, dtype):
    """The CSR of edge_index ei with index type dtype, and each CSR position's edge as dst * num_src + src."""
    csr = csr_for_edge_index(ei, num_src, num_dst)
    rows = torch.repeat_interleave(torch.arange(num_dst), csr.rowptr.diff())
    return csr.rowptr.to(dtype), csr.col.to(dtype), rows * num_src + csr.col.long()


@pytest.mark.parametrize("heads,width", [(8, 8), (4, 64)])
@pytest.mark.parametrize("index", [torch.int64, torch.int32])
@pytest.mark.parametrize("terms", ["none", "edge", "edge+loop"])
@pytest.mark.parametrize("sizes", [(300, 300), (200, 300), (300, 200)])
def test_rows_in_one_loop_match_the_general_rows_bit_for_bit(heads, width, index, terms, sizes):
    """At 8 x 8 and 4 x 64 the float forward walks a thread's rows in one loop (gat_rows_8x8 /
    gat_rows_4x64) and hands a row with an edge to itself to skip to the general row path. The same
    graph with such an edge in every third row (general path there) and without (one loop): the same
    out, m and z bit for bit, with and without edge and loop terms, with rows past N_src (no virtual
    loop; sizes are (N_src, N_dst)), empty rows and every row length mod 4."""
    num_src, num_dst = sizes
    g = torch.Generator().manual_seed(4)
    deg = torch.arange(num_dst) % 13  # 0 .. 12 edges a row
    dst = torch.repeat_interleave(torch.arange(num_dst), deg)
    src = torch.randint(0, num_src, (len(dst),), generator=g)
    key = torch.unique(dst * num_src + src)
    key = key[key // num_src != key % num_src]  # no self edges, no duplicates
    ei = torch.stack([key % num_src, key // num_src])
    own = torch.arange(0, min(num_src, num_dst), 3)
    ei_self = torch.cat([ei, torch.stack([own, own])], 1)  # every third row: an edge to itself (skipped)
    x = torch.randn(num_src, heads, width, generator=g)
    a_src, a_dst = torch.randn(num_src, heads, generator=g) * 2, torch.randn(num_dst, heads, generator=g) * 2
    edge_value = dict(zip(key.tolist(), torch.randn(len(key), heads, generator=g)))
    a_loop = torch.randn(num_dst, heads, generator=g) if terms == "edge+loop" else None
    results = []
    for edges in (ei, ei_self):
        rowptr, col, keys = csr_rows_keyed(edges, num_src, num_dst, index)
        a_edge = None
        if terms != "none":  # each real edge's term at its CSR position (a skipped edge's is unused)
            a_edge = torch.stack([edge_value.get(k, torch.full((heads,), float("nan"))) for k in keys.tolist()])
        results.append(ext().gat_forward(x, a_src, a_dst, a_edge, a_loop, rowptr, col, True, SLOPE, 0.0, 5))
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("heads,width", [(8, 8), (4, 64)])
@pytest.mark.parametrize("index", [torch.int64, torch.int32])
@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_rows_in_one_loop_with_edge_terms_and_int32_match_float64(heads, width, index, dropout):
    """The one-loop rows (with edges to themselves to skip, so some rows take the general path
    between them) with edge and loop terms, dropout and int32 indices, against the float64 kernels."""
    csr, transpose, nodes = every_degree_graph()
    csr32 = type("C", (), {"rowptr": csr.rowptr.to(index), "col": csr.col.to(index), "num_edges": csr.num_edges})
    g = torch.Generator().manual_seed(6)
    x, a_src, a_dst, a_loop = (torch.randn(*s, generator=g, dtype=torch.float64)
                               for s in ((nodes, heads, width), (nodes, heads), (nodes, heads), (nodes, heads)))
    a_edge = torch.randn(csr.num_edges, heads, generator=g, dtype=torch.float64)

    def run(dtype):
        args = [t.to(dtype) for t in (x, a_src, a_dst, a_edge, a_loop)]
        return ext().gat_forward(*args, csr32.rowptr, csr32.col, True, SLOPE, dropout, 9)

    for a, b in zip(run(torch.float32), run(torch.float64)):
        close(a, b)
