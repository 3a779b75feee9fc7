"""The CPU attention kernels' register-tile paths (float rows with H in 1, 2, 4, 8, 16 and F dividing
or divided by 16: csrc/attention_tiles.h; 4 x 64 walks each row in four tiles, each prefetching its
own lines) against the general kernels, which float64 always takes: GAT, GATv2 and dot-product
attention, forward and every gradient, on rows of 0, 1 and many edges, with and without self loops
and dropout; and the vectorised exp they use against torch.exp."""
from __future__ import annotations

import math

import pytest
import torch

from gnnfuse._build import load_extension
from gnnfuse.csr import csr_for_edge_index, transpose_parts_of
from gnnfuse.testing import outputs_at_thread_counts

pytestmark = pytest.mark.skipif(not __import__("gnnfuse")._build.extension_available("attention"),
                                reason="the C++ attention kernels are not built")

N = 40
SLOPE = 0.2


def ext():
    return load_extension("attention")


def graph(num_nodes=N):
    """Rows of 0 edges (isolated 0 and 1), 1 edge (2), a hub row (3) with a self loop, and random rows."""
    g = torch.Generator().manual_seed(5)
    src = [4, 3] + [int(v) for v in torch.randint(0, num_nodes, (60,), generator=g)] + [3]
    dst = [2, 3] + [3] * 60 + [5]
    rnd_src = torch.randint(0, num_nodes, (150,), generator=g)
    rnd_dst = torch.randint(4, num_nodes, (150,), generator=g)
    ei = torch.stack([torch.tensor(src + rnd_src.tolist()), torch.tensor(dst + rnd_dst.tolist())])
    csr = csr_for_edge_index(ei, num_nodes, num_nodes)
    return csr, transpose_parts_of(csr.rowptr, csr.col, num_nodes)


def both_dtypes(fn):
    """fn(dtype) -> (outputs, grads) in float32 (the tile path) and float64 (the general path)."""
    return fn(torch.float32), fn(torch.float64)


def assert_close(f32, f64):
    for a, b in zip(f32, f64):
        if a.numel() == 0:
            assert b.numel() == 0
            continue
        torch.testing.assert_close(a.double(), b, atol=2e-5 * max(1.0, float(b.abs().max())), rtol=1e-4)


SHAPES = [(8, 8), (1, 16), (2, 8), (4, 4), (16, 1), (2, 32), (1, 64), (4, 2), (16, 2), (8, 16), (4, 64)]


@pytest.mark.parametrize("heads,width", SHAPES)
@pytest.mark.parametrize("self_loops", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_gat_tiles_match_general_kernels(heads, width, self_loops, dropout):
    csr, transpose = graph()
    g = torch.Generator().manual_seed(heads * 100 + width)
    x, grad = torch.randn(N, heads, width, generator=g, dtype=torch.float64), torch.randn(N, heads, width, generator=g,
                                                                                           dtype=torch.float64)
    a_src, a_dst = torch.randn(N, heads, generator=g, dtype=torch.float64), torch.randn(N, heads, generator=g,
                                                                                        dtype=torch.float64)
    a_edge = torch.randn(csr.num_edges, heads, generator=g, dtype=torch.float64)
    a_loop = torch.randn(N, heads, generator=g, dtype=torch.float64)

    def run(dtype):
        args = [t.to(dtype) for t in (x, a_src, a_dst)] + [a_edge.to(dtype), a_loop.to(dtype) if self_loops else None]
        scalars = (self_loops, SLOPE, dropout, 11)
        out, m, z = ext().gat_forward(*args, csr.rowptr, csr.col, *scalars)
        needs = [True, True, True, True, self_loops]
        grads = ext().gat_backward(grad.to(dtype), out, m, z, *args, csr.rowptr, csr.col, *transpose, *scalars, needs)
        return [out, m, z, *grads]

    f32, f64 = both_dtypes(run)
    assert_close(f32, f64)
    assert torch.equal(f32[0], run(torch.float32)[0])  # deterministic


@pytest.mark.parametrize("heads,width", SHAPES)
@pytest.mark.parametrize("mode", ["gatv2", "dot"])
@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_pair_tiles_match_general_kernels(heads, width, mode, dropout):
    csr, transpose = graph()
    g = torch.Generator().manual_seed(heads * 100 + width + 1)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    q, k, v, grad = make(N, heads, width), make(N, heads, width), make(N, heads, width), make(N, heads, width)
    att = make(heads, width)
    gatv2 = mode == "gatv2"

    def run(dtype):
        args = (q.to(dtype), k.to(dtype), v.to(dtype), att.to(dtype) if gatv2 else None, None, csr.rowptr, csr.col,
                None)
        scalars = (gatv2, gatv2, SLOPE, 1 / math.sqrt(width), dropout, 11)
        out, m, z = ext().pair_forward(*args, *scalars)
        grads = ext().pair_backward(grad.to(dtype), out, m, z, *args, *transpose, *scalars, [True, True, True, gatv2,
                                                                                             False])
        return [out, m, z, *grads]

    f32, f64 = both_dtypes(run)
    assert_close(f32, f64)


@pytest.mark.parametrize("mode", ["gatv2", "dot"])
def test_pair_logits_8x8_sum_in_the_tile_tree(mode):
    """At 8 heads x 8 the forward folds two edges' logits together (pair_logits_8x8); the backward
    recomputes them one edge at a time (head_dots). Both must add each head's 8 terms in the same
    tree, ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7)), or the gradients use other logits than
    the forward: the saved row max is that tree's max, bit for bit (float32 ops are exact in torch)."""
    csr, _ = graph()
    g = torch.Generator().manual_seed(7)
    q, k, att = torch.randn(N, 8, 8, generator=g), torch.randn(N, 8, 8, generator=g), torch.randn(8, 8, generator=g)
    gatv2, scale = mode == "gatv2", 1 / math.sqrt(8)
    _, m, z = ext().pair_forward(q, k, k, att if gatv2 else None, None, csr.rowptr, csr.col, None, gatv2, gatv2,
                                 SLOPE, scale, 0.0, 0)
    want = torch.zeros(N, 8)
    for i in range(N):
        sources = [int(j) for j in csr.col[csr.rowptr[i]:csr.rowptr[i + 1]] if not (gatv2 and int(j) == i)]
        sources += [i] if gatv2 else []  # GATv2's virtual self loop
        if not sources:
            continue
        if gatv2:
            u = q[i] + k[sources]
            t = att * torch.where(u > 0, u, u * SLOPE)
        else:
            t = q[i] * k[sources]
        s = ((t[..., 0] + t[..., 4]) + (t[..., 2] + t[..., 6])) + ((t[..., 1] + t[..., 5]) + (t[..., 3] + t[..., 7]))
        want[i] = (s if gatv2 else s * scale).max(0).values
    assert (z > 0).all() if gatv2 else (z[:2] == 0).all()  # dot: rows 0 and 1 have no edges (m = 0)
    assert torch.equal(m, want)


@pytest.mark.parametrize("mode", ["gat", "gatv2", "dot"])
def test_tiles_same_for_any_thread_count(mode):
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 400, (2, 6000), generator=g)
    csr = csr_for_edge_index(ei, 400, 400)
    transpose = transpose_parts_of(csr.rowptr, csr.col, 400)
    x, q, grad = (torch.randn(400, 8, 8, generator=g) for _ in range(3))
    a = torch.randn(400, 8, generator=g)

    def run():
        if mode == "gat":
            out, m, z = ext().gat_forward(x, a, a, None, None, csr.rowptr, csr.col, True, SLOPE, 0.3, 3)
            return [out, *ext().gat_backward(grad, out, m, z, x, a, a, None, None, csr.rowptr, csr.col, *transpose,
                                             True, SLOPE, 0.3, 3, [True, True, True, False, False])]
        gatv2 = mode == "gatv2"
        args = (q, x, x, x[0] if gatv2 else None, None, csr.rowptr, csr.col, None)
        scalars = (gatv2, gatv2, SLOPE, 0.35, 0.3, 3)
        out, m, z = ext().pair_forward(*args, *scalars)
        return [out, *ext().pair_backward(grad, out, m, z, *args, *transpose, *scalars, [True, True, True, gatv2,
                                                                                         False])]

    one, two = outputs_at_thread_counts(run)
    for a_, b_ in zip(one, two):
        assert torch.equal(a_, b_)


def test_vectorised_exp_against_torch_exp():
    """exp_vec (the tile kernels' exp, on 16-lane vectors) on the softmax's range [-87.3, 0] and its edge
    cases: within 2.5e-7 relative of float64's exp on a dense sweep of the floats there (every 61st bit
    pattern, 18M of them; all 1.1e9 measured 1.15e-7 at most), exp(0) = 1, exp(-inf) = 0, NaN stays NaN."""
    lowest = torch.tensor([-87.3]).view(torch.int32).item() & 0xFFFFFFFF  # bit patterns 0x80000000 (-0) .. -87.3
    bits = torch.arange(0x80000000, lowest + 1, 61, dtype=torch.int64)
    bits = torch.cat([bits, torch.full((16 - len(bits) % 16,), lowest)])  # 16 lanes a vector
    grid = (bits - 2**32).to(torch.int32).view(torch.float32)
    special = torch.tensor([-1e-30, -1e-8, 0.0, -0.5, -86.99, -1e-3, -0.1, -1.0, -2.0, -10.0, -20.0, -40.0, -60.0,
                            -80.0, -87.3, -0.6931472])
    for xs in (grid, special, torch.linspace(-87.3, 0.0, 100_000)):
        got = ext().exp_vec16(xs.contiguous())
        want = torch.exp(xs.double())
        rel = ((got.double() - want).abs() / want).max()
        assert rel <= 2.5e-7, rel
    edge = torch.tensor([-float("inf"), -1e4, -104.0, -88.0, -87.5, float("nan"), 1.0, 10.0, 88.0, 1e4, 0.0, -0.0,
                         -87.31, -1.0, 2.0, 0.5])
    out = ext().exp_vec16(edge)
    assert torch.equal(out[[0, 1, 2, 3, 4, 12]], torch.zeros(6))  # below -87.3 (and -inf): 0, as the softmax needs
    assert torch.isnan(out[5])
    torch.testing.assert_close(out[6:8].double(), torch.exp(edge[6:8].double()), rtol=1e-6, atol=0)
    assert torch.isfinite(out[8:10]).all()  # large positive arguments are clamped at 88, never inf or NaN
    assert out[10] == 1.0 and out[11] == 1.0
