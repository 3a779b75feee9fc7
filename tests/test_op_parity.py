"""Every op x backend x route gives the same result, bitwise on CPU.

Routes: "eager" (the public function in plain eager mode: the eager route of ops/_opdef.py),
"op" (a dispatch mode forces the registered torch.library op), "fenced" (the eager route's gate
switched off, as on an untested torch version: every call takes the registered op), "public_apply"
(the eager route with its autograd node applied through torch.autograd.Function.apply, as on an
untested torch version, instead of the C apply that wrapper ends in) and "compile"
(torch.compile(fullgraph=True) of the public call). Backends: "cpu" (C++), "reference" (plain torch)
and "triton" (under TRITON_INTERPRET=1 on CPU tensors, which the dispatcher cannot route, so all its
routes run the eager route; it is not compiled). On CUDA, kernels with atomics may differ in the last
bits between runs, so there the comparison is to a tight tolerance.
"""
from __future__ import annotations

import os

import pytest
import torch

import gnnfuse
from gnnfuse import reference
from gnnfuse.ops import _opdef, _torch_private
from gnnfuse.ops.coo_to_csr import coo_to_csr
from gnnfuse.testing import random_graph, through_registered_op

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
BACKENDS = ["cpu", "reference", "triton"] if DEVICE == "cpu" else ["reference", "triton"]
ROUTES = ["eager", "op", "fenced", "public_apply", "compile"]
# float64 gradients of the Triton attention kernels differ from the reference by ~1e-9 (not by
# rounding alone): checked to this looser tolerance until that is explained
# The Triton attention kernels take their float hyperparameters (negative_slope, the dot product's scale) as
# Triton float arguments, which are float32: in float64 they agree with the reference to ~1e-7, not rounding.
LOOSER = {("gat_attention", "triton"): 1e-7, ("gatv2_attention", "triton"): 1e-7, ("dot_attention", "triton"): 1e-6}
# (op, backend) pairs torch.compile cannot trace, and why
NOT_COMPILED = {("structured_scatter_add", "reference"): "the reference's bounds check reads the indices on the host"}


def _gather_scatter(reduce, seed=1):
    """``reduce``: a reduction's name, or a list of them (multi-aggregation, one pass)."""
    def make(g, device=DEVICE):
        ei = random_graph(7, 6, 20, seed=seed).to(device)
        return [torch.randn(7, 3, dtype=torch.float64, generator=g).to(device),
                torch.rand(20, dtype=torch.float64, generator=g).to(device)], dict(ei=ei)

    def call(x, w, *, ei, backend):
        return gnnfuse.fused_gather_scatter(x, ei, reduce, edge_weight=w, num_nodes=6, backend=backend)

    return make, call


def _head_gather_scatter(reduce):
    """[E, H] edge weights with x of shape [N, H, F]: the multi-head route of fused_gather_scatter."""
    def make(g, device=DEVICE):
        ei = random_graph(7, 6, 20, seed=7).to(device)
        return [torch.randn(7, 2, 3, dtype=torch.float64, generator=g).to(device),
                torch.rand(20, 2, dtype=torch.float64, generator=g).to(device)], dict(ei=ei)

    def call(x, w, *, ei, backend):
        return gnnfuse.fused_gather_scatter(x, ei, reduce, edge_weight=w, num_nodes=6, backend=backend)

    return make, call


def _planarity():
    def make(g, device=DEVICE):
        xyz = torch.randn(12, 3, dtype=torch.float64, generator=g).to(device)
        idx = [torch.randperm(12, generator=g)[:9].reshape(3, 3).to(device),
               torch.randperm(12, generator=g)[:8].reshape(2, 4).to(device)]
        return [xyz, (torch.rand(3, dtype=torch.float64, generator=g) + 0.5).to(device),
                (torch.rand(2, dtype=torch.float64, generator=g) + 0.5).to(device)], dict(idx=idx)

    def call(xyz, s0, s1, *, idx, backend):
        return gnnfuse.planarity_nll(xyz, [(idx[0], s0), (idx[1], s1)], backend=backend)

    return make, call


def _structured_scatter():
    def make(g, device=DEVICE):
        C, nx, ny, nz, M = 3, 2, 2, 3, 40
        wa = torch.randint(0, 20, (C, nx), generator=g, dtype=torch.int32).to(device)
        wbwc = torch.randint(0, 20, (C, ny, nz), generator=g, dtype=torch.int32).to(device)
        return [torch.randn(C, nx, ny, nz, dtype=torch.float64, generator=g).to(device)], dict(wa=wa, wbwc=wbwc, M=M)

    def call(cube, *, wa, wbwc, M, backend):
        return gnnfuse.structured_scatter_add(cube, wa, wbwc, M, backend=backend)

    return make, call


def _edge_softmax():
    def make(g, device=DEVICE):
        ei = random_graph(6, 6, 18, seed=2).to(device)
        return [torch.randn(18, 2, dtype=torch.float64, generator=g).to(device)], dict(ei=ei)

    def call(logits, *, ei, backend):
        return gnnfuse.edge_softmax(logits, ei, num_nodes=6, backend=backend)

    return make, call


def _attention(kind):
    def make(g, device=DEVICE):
        ei = random_graph(6, 6, 16, seed=3).to(device)
        H, F = 2, 3
        shapes = {"gat": [(6, H, F), (6, H), (6, H)], "gatv2": [(6, H, F), (6, H, F), (H, F)],
                  "dot": [(6, H, F), (6, H, F), (6, H, F)]}[kind]
        return [torch.randn(*shape, dtype=torch.float64, generator=g).to(device) for shape in shapes], dict(ei=ei)

    def call(a, b, c, *, ei, backend):
        if kind == "gat":
            return gnnfuse.gat_attention(a, b, c, ei, backend=backend)
        if kind == "gatv2":
            return gnnfuse.gatv2_attention(a, b, c, ei, backend=backend)
        return gnnfuse.dot_attention(a, b, c, ei, backend=backend)

    return make, call


def _gine(reduce):
    def make(g, device=DEVICE):
        ei = random_graph(7, 6, 20, seed=5).to(device)
        return [torch.randn(7, 3, dtype=torch.float64, generator=g).to(device),
                torch.randn(20, 3, dtype=torch.float64, generator=g).to(device)], dict(ei=ei)

    def call(x, edge_attr, *, ei, backend):
        from gnnfuse.ops.edge_message import gine_aggregate

        return gine_aggregate(x, edge_attr, ei, reduce, num_nodes=6, backend=backend)

    return make, call


OPS = {
    "gather_scatter_sum": _gather_scatter("sum"),
    "gather_scatter_max": _gather_scatter("max"),
    "gather_scatter_mean": _gather_scatter("mean"),
    "gather_scatter_min": _gather_scatter("min"),
    "gather_scatter_mul": _gather_scatter("mul"),
    "multi_aggregate": _gather_scatter(["sum", "mean", "min", "max", "mul", "var", "std"], seed=6),
    "head_gather_scatter_sum": _head_gather_scatter("sum"),
    "head_gather_scatter_mean": _head_gather_scatter("mean"),
    "planarity_nll": _planarity(),
    "structured_scatter_add": _structured_scatter(),
    "edge_softmax": _edge_softmax(),
    "gat_attention": _attention("gat"),
    "gatv2_attention": _attention("gatv2"),
    "dot_attention": _attention("dot"),
    "gine_aggregate_sum": _gine("sum"),
    "gine_aggregate_mean": _gine("mean"),
}


def _run(op: str, backend: str, route: str, monkeypatch):
    make, call = OPS[op]
    inputs, fixed = make(torch.Generator().manual_seed(0))
    inputs = [t.clone().requires_grad_() for t in inputs]
    fn = lambda *args: call(*args, **fixed, backend=backend)  # noqa: E731
    if route == "compile":
        torch._dynamo.reset()
        out = torch.compile(fn, fullgraph=True, backend="aot_eager")(*inputs)
    elif route == "op":
        with through_registered_op():
            out = fn(*inputs)
    else:
        if route == "fenced":
            monkeypatch.setattr(_opdef, "_gate", None)
        if route == "public_apply":
            monkeypatch.setattr(_opdef, "_eager_apply", _opdef._Eager.apply)
        out = fn(*inputs)
    weights = torch.linspace(-1, 2, out.numel(), dtype=out.dtype, device=out.device).reshape(out.shape)
    grads = torch.autograd.grad((out * weights).sum(), inputs)
    return [out.detach(), *grads]


@pytest.mark.parametrize("route", ROUTES[1:])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", list(OPS))
def test_routes_agree(op, backend, route, monkeypatch):
    if backend == "triton" and DEVICE == "cpu" and not INTERPRETED:
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")
    if backend == "triton" and route == "compile" and DEVICE == "cpu":
        pytest.skip("the Triton interpreter is not traced by torch.compile")
    if route == "compile" and (op, backend) in NOT_COMPILED:
        pytest.skip(NOT_COMPILED[op, backend])
    expected = _run(op, backend, "eager", monkeypatch)
    got = _run(op, backend, route, monkeypatch)
    for a, b in zip(expected, got):
        if DEVICE == "cpu":
            assert torch.equal(a, b), (op, backend, route)
        else:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", list(OPS))
def test_backends_agree(op, monkeypatch):
    """The kernels of every backend against the reference (float64, to rounding)."""
    want = _run(op, "reference", "eager", monkeypatch)
    for backend in BACKENDS:
        if backend == "reference" or (backend == "triton" and DEVICE == "cpu" and not INTERPRETED):
            continue
        tol = LOOSER.get((op, backend), 1e-9)
        for a, b in zip(want, _run(op, backend, "eager", monkeypatch)):
            torch.testing.assert_close(b, a, rtol=tol, atol=tol)


def test_coo_to_csr_routes_agree():
    ei = random_graph(9, 7, 30, seed=4).to(DEVICE)
    eager = coo_to_csr(ei[1], ei[0], 7, 9)
    with through_registered_op():
        op = coo_to_csr(ei[1], ei[0], 7, 9)
    compiled = torch.compile(coo_to_csr, fullgraph=True, backend="aot_eager")(ei[1], ei[0], 7, 9)
    ref = reference.coo_to_csr(ei[1], ei[0], 7, 9, None)
    for parts in (op, compiled, ref):
        for a, b in zip(eager, parts):
            assert torch.equal(a, b)


def test_the_gate_follows_the_tested_torch_range(monkeypatch):
    """Outside the tested torch versions the eager route is off (every call takes the op)."""
    assert _torch_private.private_gate() is not None  # this torch is in the tested range
    monkeypatch.setattr(_torch_private, "TESTED_TORCH", ((1, 0), (1, 99)))
    assert _torch_private.private_gate() is None
    x = torch.randn(3, 2)
    monkeypatch.setattr(_opdef, "_gate", None)
    assert not _opdef.eager_route_ok([x])


def test_the_node_apply_follows_the_tested_torch_range(monkeypatch):
    """The eager route applies its autograd node through the C apply on the tested torch versions
    only (elsewhere torch.autograd.Function.apply); a Function with setup_context is refused."""
    if _torch_private.tested_torch():
        assert _opdef._eager_apply != _opdef._Eager.apply
        assert _opdef._eager_apply.__self__ is _opdef._Eager
    monkeypatch.setattr(_torch_private, "TESTED_TORCH", ((1, 0), (1, 99)))
    assert _torch_private.function_apply(_opdef._Eager) == _opdef._Eager.apply

    class WithSetup(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return x

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

    with pytest.raises(TypeError, match="setup_context"):
        _torch_private.function_apply(WithSetup)


def test_the_device_guards_reader_follows_the_tested_torch_range(monkeypatch):
    """The device guards read the current GPU through torch's private reader only on the tested
    torch versions (elsewhere torch.cuda.current_device); on a GPU both give the same device."""
    if _torch_private.tested_torch():
        private = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
        assert _torch_private.current_device_reader() is private is _torch_private.current_cuda_device
    monkeypatch.setattr(_torch_private, "TESTED_TORCH", ((1, 0), (1, 99)))
    assert _torch_private.current_device_reader() is torch.cuda.current_device
    if torch.cuda.is_available():
        torch.empty(1, device="cuda")  # (the guards run once a CUDA tensor exists)
        for device in range(torch.cuda.device_count()):
            with torch.cuda.device(device):
                assert _torch_private.current_cuda_device() == torch.cuda.current_device() == device


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("op", list(OPS))
def test_tensors_on_a_non_current_gpu(op, monkeypatch):
    """Every Triton launch runs under a device guard: tensors on GPU 1 while GPU 0 is current give
    GPU 0's results."""
    make, call = OPS[op]
    results = []
    for device in ("cuda:0", "cuda:1"):
        inputs, fixed = make(torch.Generator().manual_seed(0), device)
        inputs = [t.clone().requires_grad_() for t in inputs]
        with torch.cuda.device(0):
            out = call(*inputs, **fixed, backend="triton")
            grads = torch.autograd.grad(out.sum(), inputs)
        assert out.device == torch.device(device)
        results.append([t.cpu() for t in (out.detach(), *grads)])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_fast_triton_launch_is_fenced_by_version():
    """gnnfuse/triton/_launch.py reads Triton internals only on the Triton versions it was tested on."""
    pytest.importorskip("triton")
    from gnnfuse.triton import _launch

    low, high = _launch.TESTED_TRITON
    assert _launch.tested_triton(f"{low[0]}.{low[1]}.0") and _launch.tested_triton(f"{high[0]}.{high[1]}.1")
    assert not _launch.tested_triton(f"{low[0]}.{low[1] - 1}.0")
    assert not _launch.tested_triton(f"{high[0]}.{high[1] + 1}.0") and not _launch.tested_triton("4.0.0")
    assert not _launch.tested_triton("nightly")
    if not _launch.tested_triton():
        assert not _launch._ENABLED and not _launch.BoundLaunches.usable()


def test_triton_pin_covers_the_fast_launch_fence():
    """pyproject pins Triton to the tested versions, and the fast launch's fence lies inside the pin."""
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11+)

    from packaging.requirements import Requirement

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    pins = {str(Requirement(r).specifier) for name in ("triton", "gpu") for r in extras[name]}
    assert len(pins) == 1, pins
    pin = Requirement("triton" + pins.pop()).specifier
    assert "3.6.0" in pin and "3.9.0" in pin and "3.5.0" not in pin and "3.10.0" not in pin  # tested: 3.6, 3.9
    pytest.importorskip("triton")
    from gnnfuse.triton import _launch

    low, high = _launch.TESTED_TRITON
    assert f"{low[0]}.{low[1]}.0" in pin and f"{high[0]}.{high[1]}.99" in pin


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_gpu_csr_build_matches_the_reference(index_dtype):
    """The CUDA CSR build (device-side sort and binary search; written in torch ops, so it runs on
    any device) gives the reference's (rowptr, col, perm), with nothing left pending for valid ids."""
    from gnnfuse import range_check
    from gnnfuse.ops.coo_to_csr import _coo_to_csr_cuda

    g = torch.Generator().manual_seed(5)
    for n, e in [(7, 30), (1, 0), (40, 300)]:
        key = torch.randint(0, n, (e,), generator=g, dtype=index_dtype).to(DEVICE)
        other = torch.randint(0, n + 3, (e,), generator=g, dtype=index_dtype).to(DEVICE)
        for out_dtype in (None, torch.int32):
            got = _coo_to_csr_cuda(key, other, n, n + 3, out_dtype)
            want = reference.coo_to_csr(key, other, n, n + 3, out_dtype)
            assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(got, want))
            range_check.resolve(got[0])  # valid ids: the pending check settles without an error
    assert not range_check.PENDING


def _bad_gpu_built_csr(index_dtype=torch.int64):
    """A CSR from the GPU build (on CPU tensors without a GPU) of an edge_index with source id 9 of 7 nodes."""
    from gnnfuse.ops.coo_to_csr import _coo_to_csr_cuda

    ei = random_graph(7, 6, 20, seed=1).to(index_dtype).to(DEVICE)
    ei[0, 5] = 9
    return gnnfuse.CSR._built(*_coo_to_csr_cuda(ei[1], ei[0], 6, 7), 7), ei


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_gpu_csr_build_defers_its_range_check_to_the_graphs_first_use(index_dtype):
    """The build reads nothing back: an out-of-range id leaves a well-formed (clamped) CSR with a
    pending device flag, which raises IndexOutOfRange naming the id when first read."""
    from gnnfuse import range_check
    from gnnfuse.fresh_graph import unchecked_transpose
    from gnnfuse.ops.coo_to_csr import _coo_to_csr_cuda

    csr, ei = _bad_gpu_built_csr(index_dtype)
    assert range_check.flag(csr.rowptr) is not None and bool(range_check.flag(csr.rowptr))
    assert int(csr.rowptr[-1]) == 20 and int(csr.col.max()) < 7  # in bounds for every kernel
    t_rowptr = unchecked_transpose(csr.rowptr, csr.col, 7)[0]  # (the CUDA transpose of a gnnfuse-built CSR)
    range_check.inherit(csr.rowptr, t_rowptr)  # a derived graph shares the pending check
    assert range_check.flag(t_rowptr) is range_check.flag(csr.rowptr)
    with pytest.raises(gnnfuse.IndexOutOfRange, match=r"edge_index\[0\] \(sources\) contains node id 9"):
        csr.validate()
    assert range_check.flag(csr.rowptr) is None and range_check.flag(t_rowptr) is None  # read once, for both
    bad = torch.tensor([0, 9], dtype=index_dtype, device=DEVICE)
    with pytest.raises(gnnfuse.IndexOutOfRange, match=r"edge_index\[1\] \(targets\) contains node id 0"):
        _coo_to_csr_cuda(bad, bad, 0, 10)  # no rows: every id is out of range, known from the sizes
    with pytest.raises(gnnfuse.IndexOutOfRange, match="node id 9"):
        range_check.resolve(_coo_to_csr_cuda(bad, bad, 5, 10)[0])
    assert not range_check.PENDING


def test_a_pending_range_check_is_read_with_the_work_lists_sizes():
    """The Triton setup's one host read (the work list's sizes) takes the pending flag along."""
    from gnnfuse import range_check
    from gnnfuse.ops.coo_to_csr import _coo_to_csr_cuda
    from gnnfuse.triton.work_lists import WorkList

    csr, _ = _bad_gpu_built_csr()
    with pytest.raises(gnnfuse.IndexOutOfRange, match="node id 9"):
        WorkList(csr.rowptr, 4)
    assert not range_check.PENDING
    ei = random_graph(7, 6, 20, seed=1).to(DEVICE)
    rowptr = _coo_to_csr_cuda(ei[1], ei[0], 6, 7)[0]
    assert WorkList(rowptr, 4).num_pieces == int(((rowptr[1:] - rowptr[:-1] + 3) // 4).clamp(min=1).sum())
    assert not range_check.PENDING


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("kernel", ["hybrid", "coo"])
def test_an_op_on_a_gpu_built_csr_with_a_bad_id_raises(backend, kernel, monkeypatch):
    """An op's first use of a GPU-built CSR reads its pending range check before it returns: with the
    Triton setup's own read (hybrid plan), after the kernels where the route reads nothing back (the
    atomic plan), on the host for the reference backend."""
    from gnnfuse import range_check

    if backend == "triton" and DEVICE == "cpu" and not INTERPRETED:
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")
    if backend == "reference" and kernel == "coo":
        pytest.skip("one reference case")
    monkeypatch.setenv("GNNFUSE_TRITON_KERNEL", kernel)
    csr, _ = _bad_gpu_built_csr()
    x = torch.randn(7, 3, device=DEVICE)
    with pytest.raises(gnnfuse.IndexOutOfRange, match="node id 9"):
        gnnfuse.fused_gather_scatter(x, csr, "sum", backend=backend)
    assert not range_check.PENDING


_FRESH_PROCESS = """
import torch, gnnfuse
from gnnfuse import _build, reference
from gnnfuse.ops import gather_scatter as gs
x = torch.randn(7, 3, dtype=torch.float64)
rowptr, col = torch.tensor([0, 0, 2, 3, 4, 4, 4, 4]), torch.tensor([0, 6, 1, 2])  # by hand: no CSR build,
row = torch.tensor([1, 1, 2, 3])                                                   # which loads the extension
assert "graph" not in _build._modules  # nothing loaded the kernels yet
assert gs.FORWARD.kernels["cpu"] == gs.FORWARD._first_cpp_call
out = torch.ops.gnnfuse.gather_scatter(x, rowptr, col, None, None, None, None, "sum")[0]
assert torch.equal(out, reference.gather_scatter(x, col, row, 7, "sum", None))
assert "graph" in _build._modules  # the loader ran ...
assert gs.FORWARD.kernels["cpu"] != gs.FORWARD._first_cpp_call  # ... and gave the eager route the C++ function
print("ok")
"""


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU kernels")
def test_cpp_registered_kernel_loads_on_first_dispatch():
    """gather_scatter's CPU kernels are registered in C++ when their extension loads: a first call
    through the dispatcher, before any eager call, finds the Python loader, which loads the extension
    and dispatches again (to the C++ kernel)."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout's gnnfuse
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-c", _FRESH_PROCESS], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-2000:]


def test_a_missing_cpp_kernel_raises_instead_of_recursing():
    """An op whose extension loads without registering its CPU kernel fails with a message."""
    op = _opdef.OpDef("_test_missing_cpp_kernel(Tensor x) -> Tensor",
                      kernels={"cpu": _opdef.CppKernel("graph", "gather_scatter_forward")},
                      fake=lambda x: torch.empty_like(x))
    with pytest.raises(RuntimeError, match="registered no CPU kernel"):
        op.overload(torch.zeros(2))


def test_the_native_argument_scan_matches_the_python_loop(monkeypatch):
    """The eager route's argument scan runs in C++ once the graph kernels are loaded; it decides as
    the Python loop does: the registered op for a tensor subclass or a tensor on another device,
    else the eager route with the positions of the tensors that require grad."""
    from gnnfuse._build import extension_available, load_extension

    if not extension_available():
        pytest.skip("C++ kernels unavailable")
    native = load_extension().scan_args

    class Sub(torch.Tensor):
        pass

    t, w = torch.ones(2), torch.ones(2, requires_grad=True)
    cases = [(), (None, None), (t, None, "sum", 3, 1.5), (t, w, None, w), (torch.nn.Parameter(torch.ones(1)), t),
             (t, t.as_subclass(Sub)), (torch.ones(1, device="meta"), t), [t, w], (w.detach().requires_grad_(),)]
    monkeypatch.setattr(_opdef, "_scan_args", None)
    in_python = [_opdef._scan(values) for values in cases]
    monkeypatch.setattr(_opdef, "_scan_args", native)
    assert [_opdef._scan(values) for values in cases] == in_python
    assert [r[0] for r in in_python] == [True, True, True, True, True, False, False, True, True]
    assert in_python[3][1] == (1, 3) and in_python[7][1] == (1,)


def test_settings_read_through_getenv_follow_os_environ(monkeypatch):
    """Once the graph kernels are loaded, settings are read with C's getenv: os.environ writes (which
    go through putenv/unsetenv) are seen at the next read, as with os.environ.get."""
    from gnnfuse import config
    from gnnfuse._build import extension_available, load_extension
    from gnnfuse.ops._library import resolve_backend

    if not extension_available():
        pytest.skip("C++ kernels unavailable")
    monkeypatch.setattr(config, "_getenv", load_extension().getenv)
    cpu = torch.device("cpu")
    monkeypatch.delenv("GNNFUSE_BACKEND", raising=False)
    assert resolve_backend("auto", cpu) == "cpu" and config.get("GNNFUSE_BACKEND") == "auto"
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    assert resolve_backend("auto", cpu) == "reference"
    monkeypatch.setenv("GNNFUSE_BACKEND", "")
    assert config.get("GNNFUSE_BACKEND") == "" and not config.is_set("GNNFUSE_BACKEND")
    monkeypatch.delenv("GNNFUSE_BACKEND")
    assert config.get("GNNFUSE_BACKEND") == "auto"
    monkeypatch.setenv("GNNFUSE_DATA", "/tmp/d\u00e9j\u00e0")  # decoded as os.environ decodes it
    assert config.get("GNNFUSE_DATA") == os.environ["GNNFUSE_DATA"]
