"""gnnfuse.scatter / segment_csr / segment_coo / scatter_max / scatter_min against torch_scatter
itself, on random cases, where torch_scatter is installed (skipped otherwise: it has no wheel for
every torch and builds from source, see benchmarks/README.md).

tests/test_scatter_api.py restates torch_scatter's own tables; this file checks the same functions
against the real package on inputs those tables do not cover: several shapes and dims, a broadcast
1-D index, empty segments, dim_size beyond the largest index, ``out=``, and the gradients. Values
are random floats, so max/min have no ties and the arg results must agree exactly too (ties are
an intended difference: gnnfuse picks the smallest position).
"""
import importlib

import pytest
import torch

import gnnfuse

torch_scatter = pytest.importorskip("torch_scatter")
S = importlib.import_module("gnnfuse.scatter")  # the module (gnnfuse.scatter itself is the function)

REDUCES = ["sum", "add", "mean", "mul", "min", "max"]
# (src shape, dim, index is 1-D along dim)
SHAPES = [((40,), 0, True), ((40, 5), 0, True), ((3, 40, 4), 1, True), ((6, 30), -1, False), ((4, 30, 2), 1, False)]


def _case(shape, dim, one_d, targets, seed):
    g = torch.Generator().manual_seed(seed)
    src = torch.randn(shape, generator=g, dtype=torch.float64)
    d = dim % len(shape)
    if one_d:
        index = torch.randint(0, targets, (shape[d],), generator=g)
    else:  # full index of src's leading dims up to and including dim (torch_scatter broadcasts the rest)
        index = torch.randint(0, targets, shape[:d + 1], generator=g)
    return src, index


@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("shape,dim,one_d", SHAPES)
@pytest.mark.parametrize("dim_size", [None, 17])
def test_scatter_matches_torch_scatter(reduce, shape, dim, one_d, dim_size):
    src, index = _case(shape, dim, one_d, 12, seed=len(shape) * 7 + (dim_size or 0))
    index_before, src_before = index.clone(), src.clone()
    want = torch_scatter.scatter(src, index, dim, dim_size=dim_size, reduce=reduce)
    got = gnnfuse.scatter(src, index, dim, dim_size=dim_size, reduce=reduce)
    torch.testing.assert_close(got, want)
    assert torch.equal(index, index_before) and torch.equal(src, src_before)  # inputs untouched


@pytest.mark.parametrize("reduce", ["min", "max"])
@pytest.mark.parametrize("shape,dim,one_d", SHAPES)
def test_scatter_arg_matches_torch_scatter(reduce, shape, dim, one_d):
    src, index = _case(shape, dim, one_d, 15, seed=3)  # 15 targets over <= 40 values: empty segments
    want_fn = getattr(torch_scatter, f"scatter_{reduce}")
    got_fn = getattr(S, f"scatter_{reduce}")
    want_values, want_arg = want_fn(src, index, dim, dim_size=18)
    got_values, got_arg = got_fn(src, index, dim, dim_size=18)
    torch.testing.assert_close(got_values, want_values)
    assert torch.equal(got_arg, want_arg)


@pytest.mark.parametrize("reduce", ["sum", "add", "mean", "min", "max"])
def test_segment_csr_and_coo_match_torch_scatter(reduce):
    g = torch.Generator().manual_seed(11)
    src = torch.randn(3, 50, 4, generator=g, dtype=torch.float64)
    counts = torch.tensor([0, 7, 0, 13, 1, 20, 9, 0])  # empty segments at both ends and inside
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]).expand(3, -1)  # segments along dim 1
    index = torch.repeat_interleave(torch.arange(counts.numel()), counts).expand(3, -1)
    size = counts.numel()
    torch.testing.assert_close(S.segment_csr(src, indptr, reduce=reduce), torch_scatter.segment_csr(src, indptr, reduce=reduce))
    torch.testing.assert_close(S.segment_coo(src, index, dim_size=size, reduce=reduce),
                               torch_scatter.segment_coo(src, index, dim_size=size, reduce=reduce))
    pairs = [(f"segment_{reduce}_csr", (src, indptr)), (f"segment_{reduce}_coo", (src, index, None, size))]
    for name, args in pairs:  # the per-reduce names; max/min return (values, argmax) in both
        want, got = getattr(torch_scatter, name)(*args), getattr(S, name)(*args)
        if reduce in ("min", "max"):
            torch.testing.assert_close(got[0], want[0])
            assert torch.equal(got[1], want[1]), name
        else:
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_scatter_out_matches_torch_scatter(reduce):
    src, index = _case((30, 3), 0, True, 8, seed=5)
    out = torch.randn(10, 3, dtype=torch.float64)
    want_out, got_out = out.clone(), out.clone()
    want = torch_scatter.scatter(src, index, 0, out=want_out, reduce=reduce)
    got = gnnfuse.scatter(src, index, 0, out=got_out, reduce=reduce)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_out, want_out)


@pytest.mark.parametrize("reduce", ["sum", "mean", "min", "max"])
def test_scatter_gradient_matches_torch_scatter(reduce):
    src, index = _case((3, 40, 4), 1, True, 12, seed=9)
    grad_out = torch.randn(3, 14, 4, dtype=torch.float64)
    grads = []
    for fn in (torch_scatter.scatter, gnnfuse.scatter):
        leaf = src.clone().requires_grad_()
        fn(leaf, index, 1, dim_size=14, reduce=reduce).backward(grad_out)
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[1], grads[0])
