"""The eager route's C++ kernels bound by csrc/fast_call.h (a METH_FASTCALL binding instead of
pybind11's): the same results bitwise as the same C++ functions through pybind11, and clear errors
for wrong arguments, of the same types pybind11 raised."""
from __future__ import annotations

import pytest
import torch

from gnnfuse.testing import random_graph

_build = pytest.importorskip("gnnfuse._build")
if not _build.extension_available():
    pytest.skip("the C++ graph kernels are not available", allow_module_level=True)

import gnnfuse  # noqa: E402
from gnnfuse.ops import gather_scatter as ops  # noqa: E402

EXT = _build.load_extension()


def _csr_args(reduce: str, weighted: bool, track: bool, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    csr = gnnfuse.CSR.from_edge_index(random_graph(9, 7, 30, seed=4), 9)
    x = torch.randn(9, 5, dtype=dtype, generator=g)
    w = torch.rand(csr.num_edges, dtype=dtype, generator=g) if weighted else None
    t = csr.transpose_parts() if track else (None, None, None)
    return csr, (x, csr.rowptr, csr.col, w, *t, reduce)


def test_the_eager_route_calls_the_fast_binding():
    x = torch.randn(3, 2, requires_grad=True)
    gnnfuse.fused_gather_scatter(x, torch.tensor([[0, 1], [1, 2]]), "sum").sum().backward()  # loads both kernels
    for op, name in ((ops.FORWARD, "gather_scatter"), (ops.BACKWARD, "gather_scatter_backward")):
        kernel = op.kernels["cpu"]
        assert kernel is getattr(EXT, name)
        assert kernel.__self__ == name  # (fast_call.h's functions carry their name for error messages)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "mul"])
@pytest.mark.parametrize("weighted", [False, True])
def test_same_results_as_through_pybind11(reduce, weighted):
    for track in (False, True):
        csr, args = _csr_args(reduce, weighted, track)
        fast, slow = EXT.gather_scatter(*args), EXT.gather_scatter_pybind(*args)
        for a, b in zip(fast, slow):
            assert torch.equal(a, b)
        if not track:
            continue
        x, rowptr, col, w, t_rowptr, t_col, t_pos, _ = args
        grad = torch.randn_like(fast[0])
        back = (grad, x, rowptr, col, w, t_rowptr, t_col, t_pos, fast[1], reduce, True, weighted)
        for a, b in zip(EXT.gather_scatter_backward(*back), EXT.gather_scatter_backward_pybind(*back)):
            assert torch.equal(a, b)


def test_inputs_are_not_modified():
    _, args = _csr_args("max", True, True)
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    EXT.gather_scatter(*args)
    for a, b in zip(args, before):
        assert (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b)


def test_wrong_arguments_raise_type_errors_naming_the_position():
    _, args = _csr_args("sum", False, False)
    with pytest.raises(TypeError, match=r"gather_scatter\(\): argument 0 must be a Tensor, not int"):
        EXT.gather_scatter(1, *args[1:])
    with pytest.raises(TypeError, match=r"argument 3 must be a Tensor or None, not float"):
        EXT.gather_scatter(*args[:3], 1.0, *args[4:])
    with pytest.raises(TypeError, match=r"argument 7 must be a str, not int"):
        EXT.gather_scatter(*args[:7], 3)
    with pytest.raises(TypeError, match=r"takes at most 8 positional arguments \(9 given\)"):
        EXT.gather_scatter(*args, None)
    # a left-out trailing argument is None, which only an optional tensor takes
    with pytest.raises(TypeError, match=r"argument 7 must be a str, not NoneType"):
        EXT.gather_scatter(*args[:7])
    csr, targs = _csr_args("sum", False, True)
    out, arg = EXT.gather_scatter(*targs)
    back = [out, *targs[:7], arg, "sum", True, False]
    back[10] = 1  # an int where a bool belongs
    with pytest.raises(TypeError, match=r"gather_scatter_backward\(\): argument 10 must be a bool, not int"):
        EXT.gather_scatter_backward(*back)


def test_kernel_errors_keep_their_python_types():
    """The kernel's own checks raise what they raised through pybind11 (torch's error translation)."""
    _, args = _csr_args("sum", False, False)
    x = args[0]
    for fn in (EXT.gather_scatter, EXT.gather_scatter_pybind):
        with pytest.raises(RuntimeError, match="x must be a contiguous 2-D tensor"):
            fn(x.t(), *args[1:])
        with pytest.raises(ValueError, match="reduce must be one of"):
            fn(*args[:7], "bogus")
