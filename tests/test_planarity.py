"""gnnfuse.planarity_nll: against the eager reference (forward, gradients), gradcheck, opcheck,
torch.compile, degenerate and non-finite planes, argument errors, and the Triton kernels
(CUDA, or the interpreter on tiny CPU tensors)."""
from __future__ import annotations

import math
import os

import pytest
import torch

import gnnfuse
from gnnfuse import reference
from gnnfuse.ops.planarity import FORWARD

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# Triton on CPU tensors only runs in the interpreter (set by conftest.py when there is no GPU)
TRITON_ON_CPU = os.environ.get("TRITON_INTERPRET") == "1"
try:
    import triton  # noqa: F401
except ImportError:
    TRITON_ON_CPU = False


def backends_for(device: str) -> list[str]:
    if device == "cuda":
        return ["triton"]
    return ["cpu"] + (["triton"] if TRITON_ON_CPU else [])


def make_planes(num_atoms=60, sizes=(3, 4, 6, 9), planes_per_size=5, *, dtype=torch.float64, index_dtype=torch.int64,
                device="cpu", seed=0, noise=0.05):
    """Near-planar groups: atoms on random planes plus small out-of-plane noise, shared atoms."""
    g = torch.Generator().manual_seed(seed)
    xyz = torch.randn(num_atoms, 3, generator=g, dtype=torch.float64) * 3
    groups = []
    for n in sizes:
        idx = torch.stack([torch.randperm(num_atoms, generator=g)[:n] for _ in range(planes_per_size)])
        sig = 0.1 + torch.rand(planes_per_size, generator=g, dtype=torch.float64)
        groups.append((idx.to(index_dtype).to(device), sig.to(dtype).to(device)))
    # flatten the first bucket's planes a little so the loss has both tiny and large terms
    idx0 = groups[0][0].long().cpu()
    xyz[idx0[0], 2] = noise * xyz[idx0[0], 2]
    return xyz.to(dtype).to(device), groups


def loss_and_grad(fn, xyz, groups, **kw):
    x = xyz.detach().clone().requires_grad_(True)
    loss = fn(x, groups, **kw)
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad


# ---- agreement with the reference ------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_matches_reference(device, dtype, index_dtype):
    xyz, groups = make_planes(dtype=dtype, index_dtype=index_dtype, device=device)
    ref_loss, ref_grad = loss_and_grad(reference.planarity_nll, xyz, groups)
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    for backend in backends_for(device):
        loss, grad = loss_and_grad(gnnfuse.planarity_nll, xyz, groups, backend=backend)
        assert loss.dtype == dtype and loss.shape == () and loss.device == xyz.device
        torch.testing.assert_close(loss, ref_loss, **tol, msg=f"{backend} loss")
        torch.testing.assert_close(grad, ref_grad, **tol, msg=f"{backend} grad")


def test_formula_by_hand():
    """A saddle of 4 atoms whose best-fit normal is exactly z: NLL = 4 [0.5 (h/s)^2 + log s + 0.5 log 2 pi]."""
    h, s = 0.1, 0.2
    xyz = torch.tensor([[0, 0, h], [3, 0, -h], [0, 3, -h], [3, 3, h]], dtype=torch.float64, requires_grad=True)
    loss = gnnfuse.planarity_nll(xyz, [(torch.tensor([[0, 1, 2, 3]]), torch.tensor([s], dtype=torch.float64))])
    expected = 4 * (0.5 * (h / s) ** 2 + math.log(s) + 0.5 * math.log(2 * math.pi))
    assert abs(float(loss.detach()) - expected) < 1e-12
    loss.backward()
    expected_grad = torch.zeros(4, 3, dtype=torch.float64)
    expected_grad[:, 2] = torch.tensor([h, -h, -h, h]) / s**2
    torch.testing.assert_close(xyz.grad, expected_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_sigma_gradient(device):
    xyz, groups = make_planes(device=device)
    for backend in backends_for(device):
        grads = []
        for fn, kw in ((reference.planarity_nll, {}), (gnnfuse.planarity_nll, {"backend": backend})):
            x = xyz.clone().requires_grad_(True)
            sig = [s.clone().requires_grad_(True) for _, s in groups]
            loss = fn(x, [(i, s) for (i, _), s in zip(groups, sig)], **kw)
            grads.append(torch.autograd.grad(loss, [x, *sig]))
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_gradcheck_float64():
    xyz, groups = make_planes(num_atoms=20, sizes=(3, 5), planes_per_size=3)
    x = xyz.clone().requires_grad_(True)
    sig = [s.clone().requires_grad_(True) for _, s in groups]

    def fn(x, *sig):
        return gnnfuse.planarity_nll(x, [(i, s) for (i, _), s in zip(groups, sig)], backend="cpu")

    # The normal is detached, but sum_a d_pa^2 is minimised by the eigenvector (envelope theorem):
    # the fixed-normal gradient is the true one, so finite differences of the whole loss agree.
    assert torch.autograd.gradcheck(fn, (x, *sig), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_opcheck():
    xyz, groups = make_planes(num_atoms=20, sizes=(3, 5), planes_per_size=3)
    x = xyz.clone().requires_grad_(True)
    idx = [i for i, _ in groups]
    sig = [s.clone().requires_grad_(True) for _, s in groups]
    torch.library.opcheck(torch.ops.gnnfuse.planarity_nll.default, (x, idx, sig))


def test_compile_fullgraph():
    xyz, groups = make_planes(num_atoms=30, dtype=torch.float32)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(x, groups):
        return gnnfuse.planarity_nll(x, groups) * 2.0

    x = xyz.clone().requires_grad_(True)
    loss = step(x, groups)
    loss.backward()
    ref_loss, ref_grad = loss_and_grad(reference.planarity_nll, xyz, groups)
    torch.testing.assert_close(loss.detach(), 2 * ref_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, 2 * ref_grad, rtol=1e-5, atol=1e-5)


# ---- degenerate and non-finite planes ------------------------------------------------------------
def degenerate_groups(dtype=torch.float64):
    t = torch.linspace(0, 1, 5, dtype=torch.float64)
    line = torch.stack([t, 2 * t, -t], 1) * 7 + torch.tensor([1.0, 2, 3], dtype=torch.float64)
    near_line = line + 1e-9 * torch.randn(5, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    coincident = torch.full((4, 3), 2.5, dtype=torch.float64)
    near_coincident = coincident + 1e-12 * torch.randn(4, 3, generator=torch.Generator().manual_seed(2),
                                                       dtype=torch.float64)
    two_atoms = torch.tensor([[0.0, 0, 0], [1, 1, 1]], dtype=torch.float64)
    isotropic = torch.tensor([[1.0, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]],
                             dtype=torch.float64)  # covariance = I/3: triple eigenvalue
    parts = [line, near_line, coincident, near_coincident, two_atoms, isotropic]
    xyz = torch.cat(parts).to(dtype)
    groups, start = [], 0
    for p in parts:
        groups.append((torch.arange(start, start + len(p)).unsqueeze(0), torch.tensor([0.3], dtype=dtype)))
        start += len(p)
    return xyz, groups


@pytest.mark.parametrize("device", DEVICES)
def test_degenerate_planes_agree_with_eigh(device):
    xyz, groups = degenerate_groups()
    xyz = xyz.to(device)
    groups = [(i.to(device), s.to(device)) for i, s in groups]
    for b in range(len(groups)):
        ref_loss, ref_grad = loss_and_grad(reference.planarity_nll, xyz, groups[b:b + 1])
        for backend in backends_for(device):
            loss, grad = loss_and_grad(gnnfuse.planarity_nll, xyz, groups[b:b + 1], backend=backend)
            assert torch.isfinite(loss) and torch.isfinite(grad).all(), (b, backend)
            assert abs(float(loss) - float(ref_loss)) <= 1e-6 * abs(float(ref_loss)), (b, backend, loss, ref_loss)
            # the normal is ill-defined in these planes, but the distances are ~0: tiny gradients
            assert float(grad.abs().max()) < 1e-5 + 2 * float(ref_grad.abs().max()), (b, backend)


@pytest.mark.parametrize("device", DEVICES)
def test_jacobi_normals_match_eigh(device):
    """Random and badly scaled covariances: the normal equals eigh's up to sign."""
    g = torch.Generator().manual_seed(3)
    xyz = torch.randn(400, 3, generator=g, dtype=torch.float64)
    xyz = xyz * torch.tensor([1e3, 1.0, 1e-4], dtype=torch.float64)  # very flat planes
    idx = torch.randperm(400, generator=g).reshape(50, 8)
    sig = torch.full((50,), 0.5, dtype=torch.float64)
    for backend in backends_for(device):
        x, i, s = xyz.to(device), idx.to(device), sig.to(device)
        _, planes, _ = FORWARD(x, [i], [s], backend=backend)
        pts = x[i]
        c = pts - pts.mean(1, keepdim=True)
        ref = reference.planarity_normals([c])
        cos = (planes[:, :3] * ref).sum(1).abs()
        torch.testing.assert_close(cos, torch.ones_like(cos), rtol=0, atol=1e-9)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy overflow warnings from the Triton interpreter
@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_planes(device):
    xyz, groups = make_planes(num_atoms=40, sizes=(4,), planes_per_size=3, device=device)
    idx = groups[0][0]
    # plane 0: huge but finite positions (the covariance overflows); plane 1: NaN; plane 2: fine
    huge = xyz.clone()
    huge[idx[0]] = torch.tensor([[1e200, 0, 0], [0, 1e200, 0], [0, 0, 1e200], [1e200, 1e200, 0]],
                                dtype=torch.float64, device=device)
    for backend in backends_for(device):
        loss, grad = loss_and_grad(gnnfuse.planarity_nll, huge, groups, backend=backend)
        ref_loss, ref_grad = loss_and_grad(reference.planarity_nll, huge, groups)
        assert torch.isfinite(loss), backend
        torch.testing.assert_close(loss, ref_loss)
        assert torch.isfinite(grad).all()
        only0 = set(idx[0].tolist()) - set(idx[1:].flatten().tolist())
        assert grad[sorted(only0)].abs().max() == 0  # zero normal: no pull from that plane
        torch.testing.assert_close(grad, ref_grad)
        nan = xyz.clone()
        nan[idx[1, 0], 1] = float("nan")
        loss = gnnfuse.planarity_nll(nan, groups, backend=backend)  # no exception; NaN allowed
        assert loss.shape == ()
        inf = xyz.clone()
        inf[idx[1, 0], 0] = float("inf")
        gnnfuse.planarity_nll(inf.requires_grad_(True), groups, backend=backend).backward()


def test_cpu_backward_deterministic():
    xyz, groups = make_planes(num_atoms=3000, sizes=(4, 7, 12), planes_per_size=600, dtype=torch.float32, seed=5)
    grads = [loss_and_grad(gnnfuse.planarity_nll, xyz, groups)[1] for _ in range(3)]
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        grads.append(loss_and_grad(gnnfuse.planarity_nll, xyz, groups)[1])
    finally:
        torch.set_num_threads(old)
    for g in grads[1:]:
        assert torch.equal(g, grads[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_capture_forward_and_backward():
    """No host sync on the hot path: forward + backward capture in a CUDA graph and replay on new positions."""
    xyz, groups = make_planes(device="cuda", dtype=torch.float32)
    x = xyz.clone().requires_grad_(True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (Triton compiles) off the capture
        for _ in range(2):
            x.grad = None
            gnnfuse.planarity_nll(x, groups).backward()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = gnnfuse.planarity_nll(x, groups)
        loss.backward()
    moved = xyz + 0.3 * torch.randn_like(xyz)
    with torch.no_grad():
        x.copy_(moved)
    graph.replay()
    torch.cuda.synchronize()
    want_loss, want_grad = loss_and_grad(gnnfuse.planarity_nll, moved, groups)
    torch.testing.assert_close(loss.detach(), want_loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(x.grad, want_grad, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not (TRITON_ON_CPU or torch.cuda.is_available()), reason="needs CUDA or TRITON_INTERPRET=1")
def test_triton_layout_cache_sees_in_place_changes():
    """The Triton path caches the flattened plane layout per index/sigma tensor: an in-place edit
    (a new version) must not reuse the stale copy."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    xyz, groups = make_planes(device=device)
    first = gnnfuse.planarity_nll(xyz, groups, backend="triton")
    assert torch.equal(gnnfuse.planarity_nll(xyz, groups, backend="triton"), first)
    idx, sig = groups[1]
    idx[0] = torch.flip(idx[0], [0]).roll(1)
    idx[2, 0] = (idx[2, 0] + 1) % xyz.shape[0]
    sig.mul_(2)
    want = reference.planarity_nll(xyz, groups)
    torch.testing.assert_close(gnnfuse.planarity_nll(xyz, groups, backend="triton"), want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("device", DEVICES)
def test_eager_shortcut_equals_registered_op(device):
    """The public function skips the dispatcher in eager mode; a dispatch mode forces the op path."""
    from gnnfuse.testing import through_registered_op

    xyz, groups = make_planes(device=device)
    for backend in backends_for(device):
        results = []
        for mode in (None, through_registered_op()):
            x = xyz.clone().requires_grad_(True)
            sig = groups[1][1].clone().requires_grad_(True)
            gr = [groups[0], (groups[1][0], sig)] + groups[2:]
            if mode is None:
                loss = gnnfuse.planarity_nll(x, gr, backend=backend)
            else:
                with mode:
                    loss = gnnfuse.planarity_nll(x, gr, backend=backend)
            loss.backward()
            results.append((loss.detach(), x.grad, sig.grad))
        for a, b in zip(*results):
            if device == "cpu":
                assert torch.equal(a, b)
            else:  # GPU atomics: last bits may differ
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# ---- shapes, empty inputs, errors ------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_empty(device, dtype):
    xyz = torch.randn(5, 3, dtype=dtype, device=device, requires_grad=True)
    for backend in backends_for(device) + ["reference"]:
        loss = gnnfuse.planarity_nll(xyz, [], backend=backend)
        assert loss.dtype == dtype and loss.device == xyz.device and float(loss.detach()) == 0
        empty_bucket = [(torch.empty(0, 4, dtype=torch.long, device=device), torch.empty(0, dtype=dtype, device=device))]
        loss = gnnfuse.planarity_nll(xyz, empty_bucket, backend=backend)
        (g,) = torch.autograd.grad(loss, xyz)
        assert float(loss.detach()) == 0 and torch.equal(g, torch.zeros_like(xyz))


def test_bad_inputs_name_the_argument():
    xyz, groups = make_planes(num_atoms=20, sizes=(4,), planes_per_size=2)
    idx, sig = groups[0]
    before = (xyz.clone(), idx.clone(), sig.clone())
    cases = [
        (lambda: gnnfuse.planarity_nll(xyz.numpy(), groups), TypeError, "xyz"),
        (lambda: gnnfuse.planarity_nll(xyz.half(), groups), TypeError, "xyz"),
        (lambda: gnnfuse.planarity_nll(xyz[:, :2], groups), ValueError, "xyz"),
        (lambda: gnnfuse.planarity_nll(xyz, (idx, sig)), TypeError, "plane_groups[0]"),
        (lambda: gnnfuse.planarity_nll(xyz, groups[0]), TypeError, "plane_groups[0]"),
        (lambda: gnnfuse.planarity_nll(xyz, "planes"), TypeError, "plane_groups"),
        (lambda: gnnfuse.planarity_nll(xyz, [(idx.float(), sig)]), TypeError, "plane_groups[0] indices"),
        (lambda: gnnfuse.planarity_nll(xyz, [(idx[0], sig)]), ValueError, "plane_groups[0] indices"),
        (lambda: gnnfuse.planarity_nll(xyz, [(idx[:, :0], sig)]), ValueError, "plane_groups[0] indices"),
        (lambda: gnnfuse.planarity_nll(xyz, [(idx, sig[:1])]), ValueError, "plane_groups[0] sigmas"),
        (lambda: gnnfuse.planarity_nll(xyz, [(idx, sig.long())]), TypeError, "plane_groups[0] sigmas"),
        (lambda: gnnfuse.planarity_nll(xyz, [(idx, sig), (idx + 100, sig)]), IndexError, "plane_groups[1]"),
        (lambda: gnnfuse.planarity_nll(xyz, [(idx - 100, sig)]), IndexError, "plane_groups[0]"),
        (lambda: gnnfuse.planarity_nll(xyz, groups, backend="gpu"), ValueError, "backend"),
    ]
    for fn, exc, name in cases:
        with pytest.raises(exc, match=name.replace("[", r"\[").replace("]", r"\]")):
            fn()
    assert torch.equal(before[0], xyz) and torch.equal(before[1], idx) and torch.equal(before[2], sig)


def test_inputs_not_modified_and_non_contiguous():
    xyz, groups = make_planes(num_atoms=30, dtype=torch.float32)
    wide = torch.randn(30, 6)
    wide[:, ::2] = xyz
    strided = wide[:, ::2]  # non-contiguous view
    saved = wide.clone()
    ref = reference.planarity_nll(xyz, groups)
    torch.testing.assert_close(gnnfuse.planarity_nll(strided, groups), ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(wide, saved)


def test_double_backward_raises():
    xyz, groups = make_planes(num_atoms=20, sizes=(4,), planes_per_size=2)
    x = xyz.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(gnnfuse.planarity_nll(x, groups), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()
