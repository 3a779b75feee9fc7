"""gnnfuse.scatter / segment_csr / segment_coo / scatter_max / scatter_min against torch_scatter's
own tables of cases (its test_scatter, test_segment, test_zero_tensors and test_broadcasting,
restated here) and against torch.scatter_reduce.

Intended differences from torch_scatter, checked below: out-of-range indices raise; ties in
max/min pick the smallest index; integer src runs on torch.scatter_reduce.
"""
import importlib
import itertools
import os

import pytest
import torch

import gnnfuse

S = importlib.import_module("gnnfuse.scatter")  # the module (gnnfuse.scatter itself is the function)

REDUCES = ["sum", "add", "mean", "min", "max", "mul"]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INT_DTYPES = [torch.int64]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the C++ kernels on CPU and the Triton ones in the interpreter; on a GPU machine, Triton on CUDA
INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
BACKENDS = ["triton"] if DEVICE == "cuda" else ["cpu"] + (["triton"] if INTERPRETER else [])

# ---- scatter: (src, index, dim, {reduce: expected}, {arg_reduce: expected}) --------------------
SCATTER_CASES = [
    ([1, 3, 2, 4, 5, 6], [0, 1, 0, 1, 1, 3], -1,
     {"sum": [3, 12, 0, 6], "mul": [2, 60, 1, 6], "mean": [1.5, 4, 0, 6], "min": [1, 3, 0, 6], "max": [2, 5, 0, 6]},
     {"min": [0, 1, 6, 5], "max": [2, 4, 6, 5]}),
    ([[1, 2], [5, 6], [3, 4], [7, 8], [9, 10], [11, 12]], [0, 1, 0, 1, 1, 3], 0,
     {"sum": [[4, 6], [21, 24], [0, 0], [11, 12]], "mul": [[3, 8], [315, 480], [1, 1], [11, 12]],
      "mean": [[2, 3], [7, 8], [0, 0], [11, 12]], "min": [[1, 2], [5, 6], [0, 0], [11, 12]],
      "max": [[3, 4], [9, 10], [0, 0], [11, 12]]},
     {"min": [[0, 0], [1, 1], [6, 6], [5, 5]], "max": [[2, 2], [4, 4], [6, 6], [5, 5]]}),
    ([[1, 5, 3, 7, 9, 11], [2, 4, 8, 6, 10, 12]], [[0, 1, 0, 1, 1, 3], [0, 0, 1, 0, 1, 2]], 1,
     {"sum": [[4, 21, 0, 11], [12, 18, 12, 0]], "mul": [[3, 315, 1, 11], [48, 80, 12, 1]],
      "mean": [[2, 7, 0, 11], [4, 9, 12, 0]], "min": [[1, 5, 0, 11], [2, 8, 12, 0]],
      "max": [[3, 9, 0, 11], [6, 10, 12, 0]]},
     {"min": [[0, 1, 6, 5], [0, 2, 5, 6]], "max": [[2, 4, 6, 5], [3, 4, 5, 6]]}),
    ([[[1, 2], [5, 6], [3, 4]], [[10, 11], [7, 9], [12, 13]]], [[0, 1, 0], [2, 0, 2]], 1,
     {"sum": [[[4, 6], [5, 6], [0, 0]], [[7, 9], [0, 0], [22, 24]]],
      "mul": [[[3, 8], [5, 6], [1, 1]], [[7, 9], [1, 1], [120, 143]]],
      "mean": [[[2, 3], [5, 6], [0, 0]], [[7, 9], [0, 0], [11, 12]]],
      "min": [[[1, 2], [5, 6], [0, 0]], [[7, 9], [0, 0], [10, 11]]],
      "max": [[[3, 4], [5, 6], [0, 0]], [[7, 9], [0, 0], [12, 13]]]},
     {"min": [[[0, 0], [1, 1], [3, 3]], [[1, 1], [3, 3], [0, 0]]],
      "max": [[[2, 2], [1, 1], [3, 3]], [[1, 1], [3, 3], [2, 2]]]}),
    ([[1, 3], [2, 4]], [[0, 0], [0, 0]], 1,
     {"sum": [[4], [6]], "mul": [[3], [8]], "mean": [[2], [3]], "min": [[1], [2]], "max": [[3], [4]]},
     {"min": [[0], [0]], "max": [[1], [1]]}),
    ([[[1, 1], [3, 3]], [[2, 2], [4, 4]]], [[0, 0], [0, 0]], 1,
     {"sum": [[[4, 4]], [[6, 6]]], "mul": [[[3, 3]], [[8, 8]]], "mean": [[[2, 2]], [[3, 3]]],
      "min": [[[1, 1]], [[2, 2]]], "max": [[[3, 3]], [[4, 4]]]},
     {"min": [[[0, 0]], [[0, 0]]], "max": [[[1, 1]], [[1, 1]]]}),
]

# ---- segments: (src, sorted index, indptr, {reduce: expected}, {arg_reduce: expected}) ----------
SEGMENT_CASES = [
    ([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 1, 3], [0, 2, 5, 5, 6],
     {"sum": [3, 12, 0, 6], "mean": [1.5, 4, 0, 6], "min": [1, 3, 0, 6], "max": [2, 5, 0, 6]},
     {"min": [0, 2, 6, 5], "max": [1, 4, 6, 5]}),
    ([[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12]], [0, 0, 1, 1, 1, 3], [0, 2, 5, 5, 6],
     {"sum": [[4, 6], [21, 24], [0, 0], [11, 12]], "mean": [[2, 3], [7, 8], [0, 0], [11, 12]],
      "min": [[1, 2], [5, 6], [0, 0], [11, 12]], "max": [[3, 4], [9, 10], [0, 0], [11, 12]]},
     {"min": [[0, 0], [2, 2], [6, 6], [5, 5]], "max": [[1, 1], [4, 4], [6, 6], [5, 5]]}),
    ([[1, 3, 5, 7, 9, 11], [2, 4, 6, 8, 10, 12]], [[0, 0, 1, 1, 1, 3], [0, 0, 0, 1, 1, 2]],
     [[0, 2, 5, 5, 6], [0, 3, 5, 6, 6]],
     {"sum": [[4, 21, 0, 11], [12, 18, 12, 0]], "mean": [[2, 7, 0, 11], [4, 9, 12, 0]],
      "min": [[1, 5, 0, 11], [2, 8, 12, 0]], "max": [[3, 9, 0, 11], [6, 10, 12, 0]]},
     {"min": [[0, 2, 6, 5], [0, 3, 5, 6]], "max": [[1, 4, 6, 5], [2, 4, 5, 6]]}),
    ([[[1, 2], [3, 4], [5, 6]], [[7, 9], [10, 11], [12, 13]]], [[0, 0, 1], [0, 2, 2]], [[0, 2, 3, 3], [0, 1, 1, 3]],
     {"sum": [[[4, 6], [5, 6], [0, 0]], [[7, 9], [0, 0], [22, 24]]],
      "mean": [[[2, 3], [5, 6], [0, 0]], [[7, 9], [0, 0], [11, 12]]],
      "min": [[[1, 2], [5, 6], [0, 0]], [[7, 9], [0, 0], [10, 11]]],
      "max": [[[3, 4], [5, 6], [0, 0]], [[7, 9], [0, 0], [12, 13]]]},
     {"min": [[[0, 0], [2, 2], [3, 3]], [[0, 0], [3, 3], [1, 1]]],
      "max": [[[1, 1], [2, 2], [3, 3]], [[0, 0], [3, 3], [2, 2]]]}),
    ([[1, 3], [2, 4]], [[0, 0], [0, 0]], [[0, 2], [0, 2]],
     {"sum": [[4], [6]], "mean": [[2], [3]], "min": [[1], [2]], "max": [[3], [4]]},
     {"min": [[0], [0]], "max": [[1], [1]]}),
    ([[[1, 1], [3, 3]], [[2, 2], [4, 4]]], [[0, 0], [0, 0]], [[0, 2], [0, 2]],
     {"sum": [[[4, 4]], [[6, 6]]], "mean": [[[2, 2]], [[3, 3]]], "min": [[[1, 1]], [[2, 2]]],
      "max": [[[3, 3]], [[4, 4]]]},
     {"min": [[[0, 0]], [[0, 0]]], "max": [[[1, 1]], [[1, 1]]]}),
]


def _t(values, dtype):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def _canon(reduce):
    return {"add": "sum"}.get(reduce, reduce)


def _non_contiguous(t):
    return t.transpose(0, 1).contiguous().transpose(0, 1) if t.dim() > 1 else t


@pytest.mark.parametrize("case,reduce,dtype,backend", [
    (c, r, d, b) for c, r, d, b in itertools.product(range(len(SCATTER_CASES)), REDUCES,
                                                     FLOAT_DTYPES + INT_DTYPES, BACKENDS)
    if b == BACKENDS[0] or d == torch.float32])
def test_scatter_table(case, reduce, dtype, backend):
    src, index, dim, expected, args = SCATTER_CASES[case]
    src, index = _t(src, dtype), _t(index, torch.long)
    want = _t(expected[_canon(reduce)], dtype)
    fn = getattr(S, f"scatter_{reduce}")
    for s, i in ((src, index), (_non_contiguous(src), _non_contiguous(index))):
        got = fn(s, i, dim, backend=backend)
        if _canon(reduce) in ("min", "max"):
            got, arg = got
            assert arg.tolist() == args[reduce]
        assert got.dtype == dtype and got.tolist() == want.tolist()
        assert S.scatter(s, i, dim, reduce=reduce, backend=backend).tolist() == want.tolist()


@pytest.mark.parametrize("case,reduce", list(itertools.product(range(len(SCATTER_CASES)), REDUCES)))
def test_scatter_table_backward(case, reduce):
    src, index, dim, _, _ = SCATTER_CASES[case]
    src = _t(src, torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda s: S.scatter(s, _t(index, torch.long), dim, None, None, reduce), (src,))


def _assert_folded_into_minus_two(out, want, reduce):
    """torch_scatter's ``out=`` semantics for scatter and segment_coo: the reduction folds into
    ``out``'s values (all -2 here); ``want`` is the result into zeros (modified for max)."""
    if _canon(reduce) == "sum":
        assert out.tolist() == (want - 2).tolist()
    elif reduce == "min":
        assert (out == -2).all()
    elif reduce == "max":
        want[want == 0] = -2
        assert out.tolist() == want.tolist()
    elif reduce == "mul":  # folded in: -2 times the product (empty segments leave -2)
        assert out.tolist() == (want * -2).tolist()


@pytest.mark.parametrize("case,reduce", list(itertools.product(range(len(SCATTER_CASES)), REDUCES)))
def test_scatter_table_out(case, reduce):
    src, index, dim, expected, _ = SCATTER_CASES[case]
    src, index = _t(src, torch.float32), _t(index, torch.long)
    want = _t(expected[_canon(reduce)], torch.float32)
    out = torch.full_like(want, -2)
    returned = getattr(S, f"scatter_{reduce}")(src, index, dim, out)
    returned = returned[0] if isinstance(returned, tuple) else returned
    assert returned is out
    _assert_folded_into_minus_two(out, want, reduce)


@pytest.mark.parametrize("case,reduce,backend", list(itertools.product(range(len(SEGMENT_CASES)),
                                                                  ["sum", "add", "mean", "min", "max"], BACKENDS)))
def test_segment_table(case, reduce, backend):
    src, index, indptr, expected, args = SEGMENT_CASES[case]
    src, index, indptr = _t(src, torch.float32), _t(index, torch.long), _t(indptr, torch.long)
    want = _t(expected[_canon(reduce)], torch.float32)
    for s, i, p in ((src, index, indptr), tuple(map(_non_contiguous, (src, index, indptr)))):
        for kind, arg in (("coo", i), ("csr", p)):
            got = getattr(S, f"segment_{kind}")(s, arg, reduce=reduce, backend=backend)  # values only, always
            assert got.tolist() == want.tolist(), kind
            if _canon(reduce) in ("min", "max"):  # the per-reduce names add the argmax
                values, where = getattr(S, f"segment_{_canon(reduce)}_{kind}")(s, arg, backend=backend)
                assert values.tolist() == want.tolist() and where.tolist() == args[reduce], kind


@pytest.mark.parametrize("case,reduce",
                         list(itertools.product(range(len(SEGMENT_CASES)), ["sum", "mean", "min", "max"])))
def test_segment_table_backward_and_out(case, reduce):
    src, index, indptr, expected, _ = SEGMENT_CASES[case]
    index, indptr = _t(index, torch.long), _t(indptr, torch.long)
    s = _t(src, torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda s: S.segment_coo(s, index, None, None, reduce), (s,))
    assert torch.autograd.gradcheck(lambda s: S.segment_csr(s, indptr, None, reduce), (s,))
    want = _t(expected[reduce], torch.float32)
    out = torch.full_like(want, -2)
    S.segment_csr(_t(src, torch.float32), indptr, out, reduce=reduce)  # overwrites
    assert out.tolist() == want.tolist()
    out.fill_(-2)
    S.segment_coo(_t(src, torch.float32), index, out, reduce=reduce)  # folds in, as scatter does
    _assert_folded_into_minus_two(out, want, reduce)


@pytest.mark.parametrize("reduce,dtype", list(itertools.product(["sum", "mean", "min", "max", "mul"],
                                                           [torch.float32, torch.float64])))
def test_zero_elements(reduce, dtype):
    x = torch.randn(0, 0, 0, 16, dtype=dtype, device=DEVICE, requires_grad=True)
    index = torch.tensor([], dtype=torch.long, device=DEVICE)
    for out in (S.scatter(x, index, dim=0, dim_size=0, reduce=reduce),
                S.segment_coo(x, index, dim_size=0, reduce=reduce),
                S.segment_csr(x, index, reduce=reduce)):
        out.backward(torch.randn_like(out))
        assert out.size() == (0, 0, 0, 16)


@pytest.mark.parametrize("reduce", ["sum", "mean", "min", "max", "mul"])
def test_broadcasting(reduce):
    B, C, H, W = 4, 3, 8, 8
    src = torch.randn(B, C, H, W, device=DEVICE)
    for index in (torch.randint(0, H, (H,), device=DEVICE), torch.randint(0, H, (B, 1, H, W), device=DEVICE)):
        out = S.scatter(src, index, dim=2, dim_size=H, reduce=reduce)
        assert out.size() == (B, C, H, W)
        full = index.view(1, 1, H, 1) if index.dim() == 1 else index
        want = torch.zeros_like(src).scatter_reduce(2, full.expand_as(src), src, {"sum": "sum", "mean": "mean",
                                                    "min": "amin", "max": "amax", "mul": "prod"}[reduce],
                                                    include_self=False)
        if reduce == "mul":
            counts = torch.zeros_like(src).scatter_add(2, full.expand_as(src), torch.ones_like(src))
            want = torch.where(counts == 0, 1.0, want)
        torch.testing.assert_close(out, want)


# ---- beyond torch_scatter's tables ---------------------------------------------------------------
@pytest.mark.parametrize("reduce,backend", list(itertools.product(["sum", "mean", "min", "max", "mul"], BACKENDS)))
def test_random_against_scatter_reduce(reduce, backend):
    g = torch.Generator().manual_seed(0)
    src = torch.randn(50, 5, generator=g).to(DEVICE)
    index = torch.randint(0, 12, (50,), generator=g).to(DEVICE)
    got = S.scatter(src, index, 0, dim_size=15, reduce=reduce, backend=backend)
    want = S.scatter(src, index, 0, dim_size=15, reduce=reduce, backend="reference")
    torch.testing.assert_close(got, want)


def test_ties_pick_smallest_index_and_take_the_gradient():
    src = torch.tensor([2.0, 5.0, 5.0, 1.0, 1.0], dtype=torch.float64, requires_grad=True)
    index = torch.tensor([0, 0, 0, 1, 1])
    values, arg = S.scatter_max(src, index)
    assert arg.tolist() == [1, 3]
    values.sum().backward()
    assert src.grad.tolist() == [0, 1, 0, 1, 0]
    assert S.scatter_min(src.detach(), index)[1].tolist() == [0, 3]


def test_errors_name_the_argument():
    src = torch.randn(4, 2)
    with pytest.raises(ValueError, match="reduce must be one of"):
        S.scatter(src, torch.zeros(4, dtype=torch.long), 0, reduce="median")
    with pytest.raises(TypeError, match="index must be an int32 or int64"):
        S.scatter(src, torch.zeros(4), 0)
    with pytest.raises(RuntimeError, match="outside"):
        S.scatter(src, torch.tensor([0, 1, 5, 1]), 0, dim_size=3)
    with pytest.raises(IndexError, match="dim=3"):
        S.scatter(src, torch.zeros(4, dtype=torch.long), 3)


def test_inputs_not_modified():
    src = torch.randn(6, 3)
    index = torch.tensor([2, 0, 1, 0, 2, 2])
    before = src.clone(), index.clone()
    for reduce in ("sum", "max"):
        S.scatter(src, index, 0, reduce=reduce)
        S.segment_csr(src, torch.tensor([0, 2, 6]), reduce=reduce)
    assert torch.equal(src, before[0]) and torch.equal(index, before[1])


@pytest.mark.parametrize("reduce", ["sum", "max"])
def test_compile_fullgraph_dynamic(reduce):
    def f(src, index, indptr):
        a = S.scatter(src, index, 0, dim_size=7, reduce=reduce)
        b = S.segment_csr(src, indptr, reduce=reduce)
        return a, b

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for E in (9, 13):
        src = torch.randn(E, 4, requires_grad=True)
        index = torch.randint(0, 7, (E,))
        indptr = torch.tensor([0, 3, 3, E])
        got, want = compiled(src, index, indptr), f(src, index, indptr)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
        sum(g.sum() for g in got).backward()
        assert src.grad is not None


def test_exported_at_top_level():
    assert gnnfuse.scatter is S.scatter and gnnfuse.segment_csr is S.segment_csr


def test_segment_functions_return_values_like_torch_scatter():
    """segment_csr/segment_coo return a tensor for max/min too (torch_scatter's segment_csr does);
    the per-reduce names segment_max_csr etc. return (values, argmax) and sum/add/mean a tensor."""
    src = torch.tensor([[1.0], [4.0], [2.0], [3.0]])
    indptr, index = torch.tensor([0, 2, 2, 4]), torch.tensor([0, 0, 2, 2])
    for reduce in ("max", "min"):
        assert isinstance(S.segment_csr(src, indptr, reduce=reduce), torch.Tensor)
        assert isinstance(S.segment_coo(src, index, reduce=reduce), torch.Tensor)
    values, arg = S.segment_max_csr(src, indptr)
    assert values.flatten().tolist() == [4.0, 0.0, 3.0] and arg.flatten().tolist() == [1, 4, 3]
    values, arg = S.segment_min_coo(src, index, dim_size=3)
    assert values.flatten().tolist() == [1.0, 0.0, 2.0] and arg.flatten().tolist() == [0, 4, 2]
    for name in ("sum", "add", "mean"):
        for kind, idx in (("csr", indptr), ("coo", index)):
            got = getattr(S, f"segment_{name}_{kind}")(src, idx)
            assert torch.equal(got, getattr(S, f"segment_{kind}")(src, idx, reduce=name))


def test_repeated_index_is_sorted_once_and_a_write_invalidates(monkeypatch):
    """scatter caches the sort of its index on the index tensor: a second call with the same index
    sorts nothing; an in-place write to the index (or another dim_size) builds a new one."""
    index = torch.tensor([2, 0, 1, 0, 2, 2], device=DEVICE)
    src = torch.randn(6, 3, device=DEVICE)
    # count scatter's own sorts (the GPU kernel plan sorts rows by degree with torch.sort as well)
    scatter_module = importlib.import_module("gnnfuse.scatter")
    one_off = importlib.import_module("gnnfuse._one_off_scatter")  # the sorted route, on every backend
    monkeypatch.setattr(one_off, "one_off_route", lambda *a: None)
    monkeypatch.setattr(one_off, "rows_on_cpu", lambda *a: None)
    sorts = []
    real_sort = scatter_module._sorted_segments
    monkeypatch.setattr(scatter_module, "_sorted_segments", lambda *a, **k: sorts.append(1) or real_sort(*a, **k))
    first = gnnfuse.scatter(src, index, 0, dim_size=3, reduce="sum")
    second = gnnfuse.scatter(src * 2, index, 0, dim_size=3, reduce="sum")
    assert len(sorts) == 1
    torch.testing.assert_close(second, 2 * first)
    index[0] = 1  # in place: the cached sort must not be served
    got = gnnfuse.scatter(src, index, 0, dim_size=3, reduce="sum")
    torch.testing.assert_close(got, torch.zeros(3, 3, device=DEVICE).index_add_(0, index, src))
    assert len(sorts) == 2
    gnnfuse.scatter(src, index, 0, dim_size=4, reduce="sum")
    assert len(sorts) == 3


@pytest.mark.skipif("triton" not in BACKENDS, reason="Triton runs on CUDA or in the interpreter")
@pytest.mark.parametrize("reduce,dtype", list(itertools.product(["sum", "add", "mean", "max", "min"],
                                                                 [torch.float32, torch.float64])))
def test_one_off_index_takes_the_atomic_route(reduce, dtype, monkeypatch):
    """A first call with an index runs the sort-free atomic kernel (NaN wins and sticks, +-inf, -0,
    empty targets give 0), equal to the sorted route that a second call with the same index takes;
    deterministic mode, a gradient or an argmax keep the sorted route."""
    from gnnfuse.triton import scatter_atomic

    calls = []
    real = scatter_atomic.scatter
    monkeypatch.setattr(scatter_atomic, "scatter", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(1)
    src = torch.randn(40, 5, generator=g, dtype=dtype)
    src[3, 0], src[7, 1], src[9, 2], src[11, 3] = float("nan"), float("inf"), -float("inf"), -0.0
    src = src.to(DEVICE)
    index = torch.randint(0, 9, (40,), generator=g).to(DEVICE)  # targets 9..10 empty
    first = S.scatter(src, index, 0, dim_size=11, reduce=reduce, backend="triton")
    assert len(calls) == 1
    second = S.scatter(src, index, 0, dim_size=11, reduce=reduce, backend="triton")  # now sorted and cached
    assert len(calls) == 1
    torch.testing.assert_close(first, second, equal_nan=True)
    assert (first[9:] == 0).all()
    clean = src.nan_to_num(posinf=3.0, neginf=-3.0)
    torch.testing.assert_close(S.scatter(clean, index.clone(), 0, dim_size=11, reduce=reduce, backend="triton"),
                               S.scatter(clean, index, 0, dim_size=11, reduce=reduce, backend="reference"))
    torch.testing.assert_close(S.scatter(clean, index.int(), 0, dim_size=11, reduce=reduce, backend="triton"),
                               S.scatter(clean, index, 0, dim_size=11, reduce=reduce, backend="reference"))
    assert len(calls) == 3
    torch.use_deterministic_algorithms(True)
    try:
        S.scatter(src, index.clone(), 0, dim_size=11, reduce=reduce, backend="triton")
    finally:
        torch.use_deterministic_algorithms(False)
    S.scatter(src.clone().requires_grad_(), index.clone(), 0, dim_size=11, reduce=reduce, backend="triton")
    if reduce in ("max", "min"):
        S.scatter_max(src, index.clone(), 0, dim_size=11, backend="triton")
    assert len(calls) == 3


@pytest.mark.skipif(DEVICE == "cuda", reason="the C++ kernels run on CPU")
@pytest.mark.parametrize("reduce,dtype", list(itertools.product(["sum", "add", "mean", "max", "min"],
                                                                 [torch.float32, torch.float64])))
def test_one_off_index_takes_the_unsorted_route_on_cpu(reduce, dtype, monkeypatch):
    """On CPU a first call with an index runs the sort-free C++ kernel (NaN wins and sticks, +-inf,
    empty targets give 0), equal to the sorted route a second call takes and to the reference, the
    same for any thread count; a gradient or an argmax keep the sorted route."""
    one_off = importlib.import_module("gnnfuse._one_off_scatter")
    calls = []
    real = one_off._unsorted_kernel()
    monkeypatch.setattr(one_off, "_unsorted_kernel", lambda: (lambda *a: calls.append(1) or real(*a)))
    monkeypatch.setattr(one_off, "SMALL_OUTPUT_BYTES", 0)  # (small outputs take it on every call: below)
    g = torch.Generator().manual_seed(2)
    src = torch.randn(300, 5, generator=g, dtype=dtype)
    src[3, 0], src[7, 1], src[9, 2], src[11, 3] = float("nan"), float("inf"), -float("inf"), -0.0
    index = torch.randint(0, 9, (300,), generator=g)  # targets 9..10 empty
    index[200:] = torch.randint(0, 3, (100,), generator=g)  # skewed counts: uneven owner ranges
    before = src.clone(), index.clone()
    first = S.scatter(src, index, 0, dim_size=11, reduce=reduce, backend="cpu")
    assert len(calls) == 1
    second = S.scatter(src, index, 0, dim_size=11, reduce=reduce, backend="cpu")  # now sorted and cached
    assert len(calls) == 1
    torch.testing.assert_close(first, second, equal_nan=True, rtol=0, atol=0)  # the same bits as the sorted route
    assert (first[9:] == 0).all()
    assert torch.equal(index, before[1]) and torch.equal(src.nan_to_num(), before[0].nan_to_num())
    clean = src.nan_to_num(posinf=3.0, neginf=-3.0)
    want = S.scatter(clean, index, 0, dim_size=11, reduce=reduce, backend="reference")
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            for idx in (index.clone(), index.int()):
                got = S.scatter(clean, idx, 0, dim_size=11, reduce=reduce, backend="cpu")
                torch.testing.assert_close(got, want)
                if n == 1:
                    reference_bits = got
                assert torch.equal(got, reference_bits)  # the same bits for any thread count
    finally:
        torch.set_num_threads(threads)
    assert len(calls) == 7
    S.scatter(src.clone().requires_grad_(), index.clone(), 0, dim_size=11, reduce=reduce, backend="cpu")
    if reduce in ("max", "min"):
        S.scatter_max(src, index.clone(), 0, dim_size=11, backend="cpu")
    assert len(calls) == 7


@pytest.mark.skipif(DEVICE == "cuda", reason="the C++ kernels run on CPU")
def test_small_cpu_outputs_always_take_the_unsorted_route(monkeypatch):
    """A CPU output of at most SMALL_OUTPUT_BYTES is scattered without a sort on every call (no sort
    kept on the index); a larger one only on the first call with its index."""
    one_off = importlib.import_module("gnnfuse._one_off_scatter")
    calls = []
    real = one_off._unsorted_kernel()
    monkeypatch.setattr(one_off, "_unsorted_kernel", lambda: (lambda *a: calls.append(1) or real(*a)))
    src, index = torch.randn(50, 4), torch.randint(0, 10, (50,))
    want = torch.zeros(10, 4).index_add_(0, index, src)
    for _ in range(3):
        torch.testing.assert_close(S.scatter(src, index, 0, dim_size=10, backend="cpu"), want)
    assert len(calls) == 3
    monkeypatch.setattr(one_off, "SMALL_OUTPUT_BYTES", 10 * 4 * 4 - 1)  # one byte short of the output
    index = index.clone()
    for _ in range(3):
        torch.testing.assert_close(S.scatter(src, index, 0, dim_size=10, backend="cpu"), want)
    assert len(calls) == 4


@pytest.mark.skipif(DEVICE == "cuda", reason="the C++ kernels run on CPU")
def test_one_off_unsorted_kernel_checks_its_arguments():
    kernel = importlib.import_module("gnnfuse._one_off_scatter")._unsorted_kernel()
    with pytest.raises(IndexError, match="outside"):
        kernel(torch.randn(4, 2), torch.tensor([0, 1, 5, 1]), 3, "sum")
    with pytest.raises(ValueError, match="reduce"):
        kernel(torch.randn(4, 2), torch.tensor([0, 1, 2, 1]), 3, "mul")
    with pytest.raises(ValueError, match="targets"):
        kernel(torch.randn(4, 2), torch.tensor([0, 1, 2]), 3, "sum")
    with pytest.raises(ValueError, match="float32 or float64"):
        kernel(torch.randn(4, 2).half(), torch.tensor([0, 1, 2, 1]), 3, "sum")
    with pytest.raises(RuntimeError, match="outside"):  # through the public function: checked first
        S.scatter(torch.randn(4, 2), torch.tensor([0, 1, 5, 1]), 0, dim_size=3, backend="cpu")


@pytest.mark.skipif(DEVICE == "cuda" or not INTERPRETER, reason="a device-side assert would poison the CUDA context")
def test_one_off_atomic_route_checks_the_range():
    with pytest.raises(RuntimeError, match="outside"):
        S.scatter(torch.randn(4, 2), torch.tensor([0, 1, 5, 1]), 0, dim_size=3, backend="triton")
    with pytest.raises(RuntimeError, match="outside"):
        S.scatter(torch.randn(4, 2), torch.tensor([0, -1, 2, 1]), 0, dim_size=3, backend="triton")
