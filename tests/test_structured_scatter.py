"""gnnfuse.structured_scatter_add: out[wa[c,ix] + wbwc[c,iy,iz]] += density_cube[c,ix,iy,iz]."""
from __future__ import annotations

import os

import pytest
import torch

import gnnfuse
from gnnfuse import reference
from gnnfuse._build import load_extension
from gnnfuse.testing import INDEX_DTYPES, TOLERANCES, VALUE_DTYPES

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
# Triton kernels run on CUDA tensors, or in the interpreter on CPU tensors (conftest sets it).
TRITON_DEVICE = "cuda" if HAS_CUDA else "cpu"
HAS_TRITON_PATH = HAS_CUDA or os.environ.get("TRITON_INTERPRET") == "1"


def make_atoms(C=30, box=(4, 3, 5), grid=(10, 9, 11), *, sort=False, seed=0, dtype=torch.float64,
               index_dtype=torch.int64, device="cpu"):
    """C atoms' boxes at random corners of a periodic grid (boxes wrap around the edges)."""
    g = torch.Generator().manual_seed(seed)
    (nx, ny, nz), (NX, NY, NZ) = box, grid
    x0, y0, z0 = (torch.randint(0, n, (C,), generator=g) for n in grid)
    if sort:
        order = torch.argsort(x0 * NY * NZ + y0 * NZ + z0)
        x0, y0, z0 = x0[order], y0[order], z0[order]
    wa = ((x0[:, None] + torch.arange(nx)) % NX) * NY * NZ
    wy = ((y0[:, None] + torch.arange(ny)) % NY) * NZ
    wz = (z0[:, None] + torch.arange(nz)) % NZ
    wbwc = wy[:, :, None] + wz[:, None, :]
    cube = torch.randn(C, nx, ny, nz, generator=g, dtype=torch.float64).to(dtype)
    return (cube.to(device), wa.to(index_dtype).to(device), wbwc.to(index_dtype).to(device), NX * NY * NZ)


def close(actual, expected, dtype):
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), atol=atol * 10, rtol=rtol * 10)


# ---- correctness ----------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", VALUE_DTYPES)
def test_matches_reference(dtype, index_dtype, device):
    cube, wa, wbwc, M = make_atoms(dtype=dtype, index_dtype=index_dtype, device=device)
    out = gnnfuse.structured_scatter_add(cube, wa, wbwc, M)
    assert out.dtype == dtype and out.shape == (M,) and out.device == cube.device
    expected = reference.structured_scatter_add(cube.double(), wa, wbwc, M)
    close(out, expected, dtype)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", VALUE_DTYPES)
def test_backward_matches_reference(dtype, index_dtype):
    cube, wa, wbwc, M = make_atoms(dtype=dtype, index_dtype=index_dtype)
    grad = torch.randn(M, dtype=torch.float64).to(dtype)
    cube.requires_grad_()
    gnnfuse.structured_scatter_add(cube, wa, wbwc, M).backward(grad)
    assert cube.grad.dtype == dtype
    expected = grad[reference.structured_flat_index(wa, wbwc)].view(cube.shape)
    assert torch.equal(cube.grad, expected)  # a gather: exact


def test_reference_backend_matches():
    cube, wa, wbwc, M = make_atoms()
    out = gnnfuse.structured_scatter_add(cube, wa, wbwc, M, backend="reference")
    close(out, gnnfuse.structured_scatter_add(cube, wa, wbwc, M), torch.float64)


def test_equivalent_to_fused_gather_scatter_and_index_add_forward_backward():
    cube, wa, wbwc, M = make_atoms(C=40, dtype=torch.float64)
    flat = reference.structured_flat_index(wa, wbwc)
    grad = torch.randn(M, dtype=torch.float64)

    c1 = cube.clone().requires_grad_()
    out = gnnfuse.structured_scatter_add(c1, wa, wbwc, M)
    out.backward(grad)

    # the same reduction as an explicit graph: edge e = element e, source e -> target flat[e]
    c2 = cube.clone().requires_grad_()
    edge_index = torch.stack([torch.arange(flat.numel()), flat])
    out_fgs = gnnfuse.fused_gather_scatter(c2.reshape(-1, 1), edge_index, "sum", num_nodes=M)
    out_fgs.backward(grad[:, None])

    c3 = cube.clone().requires_grad_()
    out_ia = torch.zeros(M, dtype=torch.float64).index_add(0, flat, c3.reshape(-1))
    out_ia.backward(grad)

    torch.testing.assert_close(out, out_fgs[:, 0], atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(out, out_ia, atol=1e-12, rtol=1e-12)
    assert torch.equal(c1.grad, c2.grad) and torch.equal(c1.grad, c3.grad)


def test_duplicate_indices_inside_one_atom_accumulate():
    # a box wider than the map wraps onto itself: one atom hits the same voxel twice
    cube, wa, wbwc, M = make_atoms(C=5, box=(6, 5, 7), grid=(4, 3, 5))
    out = gnnfuse.structured_scatter_add(cube, wa, wbwc, M)
    close(out, reference.structured_scatter_add(cube, wa, wbwc, M), torch.float64)


@pytest.mark.parametrize("shape", [(0, 4, 3, 5), (3, 0, 3, 5), (3, 4, 0, 5), (3, 4, 3, 0)])
def test_empty_boxes(shape):
    C, nx, ny, nz = shape
    out = gnnfuse.structured_scatter_add(torch.ones(shape), torch.zeros(C, nx, dtype=torch.int32),
                                         torch.zeros(C, ny, nz, dtype=torch.int32), 7)
    assert torch.equal(out, torch.zeros(7))
    assert gnnfuse.structured_scatter_add(torch.ones(shape), torch.zeros(C, nx, dtype=torch.int64),
                                          torch.zeros(C, ny, nz, dtype=torch.int64), 0).shape == (0,)


def test_half_types_accumulate_in_float32():
    # 4096 contributions of 1.0 to one voxel: float16 accumulation would stall at 2048
    cube = torch.ones(4096, 1, 1, 1, dtype=torch.float16)
    out = gnnfuse.structured_scatter_add(cube, torch.zeros(4096, 1, dtype=torch.int32),
                                         torch.zeros(4096, 1, 1, dtype=torch.int32), 3)
    assert out.tolist() == [4096.0, 0.0, 0.0]


def test_inputs_not_modified():
    cube, wa, wbwc, M = make_atoms(dtype=torch.float32, index_dtype=torch.int32)
    copies = [t.clone() for t in (cube, wa, wbwc)]
    gnnfuse.structured_scatter_add(cube, wa, wbwc, M)
    assert all(torch.equal(a, b) for a, b in zip((cube, wa, wbwc), copies))


def test_non_contiguous_inputs():
    cube, wa, wbwc, M = make_atoms()
    cube_t = cube.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    assert not cube_t.is_contiguous()
    assert torch.equal(gnnfuse.structured_scatter_add(cube_t, wa, wbwc, M),
                       gnnfuse.structured_scatter_add(cube, wa, wbwc, M))


# ---- determinism and the partitioned kernel's paths ------------------------------------------------
@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bitwise_deterministic_across_calls_and_thread_counts(dtype, sort, threads):
    # large enough for 4 partitions: atoms inside one, straddling two, and spanning the whole map
    cube, wa, wbwc, M = make_atoms(C=600, box=(6, 6, 6), grid=(40, 36, 44), sort=sort, dtype=dtype,
                                   index_dtype=torch.int32)
    ext = load_extension("density")
    serial = ext.structured_scatter_serial_baseline(cube, wa, wbwc, M)
    for n in (1, 2, 3, 4):
        threads(n)
        for _ in range(2):
            assert torch.equal(gnnfuse.structured_scatter_add(cube, wa, wbwc, M), serial)
    close(serial, reference.structured_scatter_add(cube.double(), wa, wbwc, M), dtype)


def test_benchmark_baselines_match(threads):
    cube, wa, wbwc, M = make_atoms(C=300, box=(5, 5, 5), grid=(30, 30, 30), dtype=torch.float32,
                                   index_dtype=torch.int32)
    ext = load_extension("density")
    threads(3)
    expected = reference.structured_scatter_add(cube.double(), wa, wbwc, M)
    close(ext.structured_scatter_seed_baseline(cube, wa, wbwc, M), expected, torch.float32)
    close(ext.structured_scatter_serial_baseline(cube, wa, wbwc, M), expected, torch.float32)


def test_rows_that_are_not_runs():
    # shuffled (y, z) columns: wbwc rows are not consecutive, the generic scatter path runs
    cube, wa, wbwc, M = make_atoms(C=600, box=(6, 6, 6), grid=(40, 36, 44), sort=True)
    perm = torch.randperm(36, generator=torch.Generator().manual_seed(1))
    wbwc = wbwc.flatten(1)[:, perm].view_as(wbwc).contiguous()
    cube.requires_grad_()
    out = gnnfuse.structured_scatter_add(cube, wa, wbwc, M)
    close(out, reference.structured_scatter_add(cube.detach(), wa, wbwc, M), torch.float64)
    grad = torch.randn(M, dtype=torch.float64)
    out.backward(grad)
    assert torch.equal(cube.grad, grad[reference.structured_flat_index(wa, wbwc)].view(cube.shape))


# ---- autograd, op registration, torch.compile --------------------------------------------------
def test_gradcheck_and_gradgradcheck():
    cube, wa, wbwc, M = make_atoms(C=4, box=(2, 3, 2), grid=(3, 4, 3))
    cube.requires_grad_()
    f = lambda c: gnnfuse.structured_scatter_add(c, wa, wbwc, M)  # noqa: E731
    assert torch.autograd.gradcheck(f, (cube,))
    assert torch.autograd.gradgradcheck(f, (cube,))


def test_no_gradient_to_indices_and_backward_without_grad():
    cube, wa, wbwc, M = make_atoms()
    with torch.no_grad():
        out = gnnfuse.structured_scatter_add(cube.requires_grad_(), wa, wbwc, M)
    assert not out.requires_grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_opcheck(index_dtype, device):
    cube, wa, wbwc, M = make_atoms(C=5, box=(2, 3, 2), grid=(4, 4, 4), index_dtype=index_dtype, device=device)
    torch.library.opcheck(torch.ops.gnnfuse.structured_scatter_add.default,
                          (cube.requires_grad_(), wa, wbwc, M, True))
    grad_out = torch.randn(M, dtype=torch.float64, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.gnnfuse.structured_gather.default, (grad_out, wa, wbwc, 3, 2, True))


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device, dynamic):
    torch._dynamo.reset()
    cube, wa, wbwc, M = make_atoms(dtype=torch.float32, index_dtype=torch.int32, device=device)

    def f(c):
        return (gnnfuse.structured_scatter_add(c * 2, wa, wbwc, M) ** 2).sum()

    compiled = torch.compile(f, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    c1, c2 = cube.clone().requires_grad_(), cube.clone().requires_grad_()
    loss_c, loss_e = compiled(c1), f(c2)
    loss_c.backward()
    loss_e.backward()
    torch.testing.assert_close(loss_c, loss_e)
    torch.testing.assert_close(c1.grad, c2.grad)

    def g(c, buf):  # map_size from a tensor's shape: a SymInt when dynamic
        return gnnfuse.structured_scatter_add(c, wa, wbwc, buf.shape[0]) + buf

    buf = torch.ones(M, device=device)
    torch.testing.assert_close(torch.compile(g, fullgraph=True, dynamic=dynamic, backend="aot_eager")(cube, buf),
                               g(cube, buf))


def test_torch_compile_inductor():
    torch._dynamo.reset()
    cube, wa, wbwc, M = make_atoms(dtype=torch.float32, index_dtype=torch.int32)
    f = lambda c: gnnfuse.structured_scatter_add(c, wa, wbwc, M)  # noqa: E731
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(cube), f(cube))


# ---- Triton kernels (CUDA, or the interpreter on CPU tensors) -------------------------------------
triton_only = pytest.mark.skipif(not HAS_TRITON_PATH, reason="needs CUDA or TRITON_INTERPRET=1")


@triton_only
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_triton_forward_backward(dtype, index_dtype):
    cube, wa, wbwc, M = make_atoms(C=6, box=(3, 4, 3), grid=(5, 6, 5), dtype=dtype, index_dtype=index_dtype,
                                   device=TRITON_DEVICE)
    cube.requires_grad_()
    out = gnnfuse.structured_scatter_add(cube, wa, wbwc, M, backend="triton")
    assert out.dtype == dtype
    close(out, reference.structured_scatter_add(cube.detach().double(), wa, wbwc, M), dtype)
    grad = torch.randn(M, device=TRITON_DEVICE).to(dtype)
    out.backward(grad)
    assert torch.equal(cube.grad, grad[reference.structured_flat_index(wa, wbwc)].view(cube.shape))


@triton_only
def test_triton_bounds():
    cube, wa, wbwc, M = make_atoms(C=6, box=(3, 4, 3), grid=(5, 6, 5), device=TRITON_DEVICE)
    wa = wa.clone()
    wa[2, 1] = M  # one x-slab past the end
    with pytest.raises(ValueError, match="atom 2"):
        gnnfuse.structured_scatter_add(cube, wa, wbwc, M, backend="triton")
    out = gnnfuse.structured_scatter_add(cube, wa, wbwc, M, backend="triton", check_bounds=False)
    close(out, reference.structured_scatter_add(cube, wa, wbwc, M, check_bounds=False), torch.float64)


@triton_only
def test_triton_atom_order_for_large_maps(monkeypatch):
    """Atoms processed in the order of their first flat index (the path for maps larger than L2):
    same results, the bounds error still names the lowest bad atom, the order is cached on wa/wbwc."""
    from gnnfuse.triton import structured_scatter as triton_kernels

    monkeypatch.setattr(triton_kernels, "ORDER_MIN_ELEMENTS", 0)
    monkeypatch.setattr(triton_kernels, "ORDER_MAP_L2_FRACTION", 0.0)
    cube, wa, wbwc, M = make_atoms(C=9, box=(3, 4, 3), grid=(5, 6, 5), device=TRITON_DEVICE)
    order = triton_kernels.atom_order(wa, wbwc, M * 8)
    assert sorted(order.tolist()) == list(range(9)) and not torch.equal(order.cpu(), torch.arange(9))
    assert triton_kernels.atom_order(wa, wbwc, M * 8) is order  # cached on the tensor objects
    cube.requires_grad_()
    out = gnnfuse.structured_scatter_add(cube, wa, wbwc, M, backend="triton")
    close(out, reference.structured_scatter_add(cube.detach(), wa, wbwc, M), torch.float64)
    grad = torch.randn(M, dtype=torch.float64, device=TRITON_DEVICE)
    out.backward(grad)
    assert torch.equal(cube.grad, grad[reference.structured_flat_index(wa, wbwc)].view(cube.shape))
    wa = wa.clone()
    wa[[6, 2], 1] = M
    with pytest.raises(ValueError, match="atom 2 "):
        gnnfuse.structured_scatter_add(cube, wa, wbwc, M, backend="triton")
    before = triton_kernels.atom_order(wa, wbwc, M * 8)
    wa[0, 0] = 0  # an in-place change invalidates the cached order
    assert triton_kernels.atom_order(wa, wbwc, M * 8) is not before


@triton_only
def test_triton_bounds_check_runs_once_per_unchanged_index_tensors(monkeypatch):
    from gnnfuse.triton import structured_scatter as triton_kernels

    syncs = []
    real = triton_kernels._raise_if_flagged
    monkeypatch.setattr(triton_kernels, "_raise_if_flagged", lambda *a: (syncs.append(a[0]), real(*a)))
    cube, wa, wbwc, M = make_atoms(C=5, box=(3, 4, 3), grid=(5, 6, 5), device=TRITON_DEVICE)
    for _ in range(3):
        gnnfuse.structured_scatter_add(cube, wa, wbwc, M, backend="triton")
    assert len(syncs) == 1
    gnnfuse.structured_scatter_add(cube, wa, wbwc, M - 1, backend="triton", check_bounds=False)
    with pytest.raises(ValueError, match="outside"):  # another map size is checked again
        gnnfuse.structured_scatter_add(cube, wa, wbwc, M - 7, backend="triton")
    wa[3, 0] = M  # an in-place change: checked again, and caught
    with pytest.raises(ValueError, match="atom 3 "):
        gnnfuse.structured_scatter_add(cube, wa, wbwc, M, backend="triton")
    with pytest.raises(ValueError, match="atom 3 "):  # a failed check is not remembered as a pass
        gnnfuse.structured_scatter_add(cube, wa, wbwc, M, backend="triton")
    assert len(syncs) == 4


# ---- bounds ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["cpu", "reference", pytest.param("triton", marks=triton_only)])
@pytest.mark.parametrize("where", ["negative", "past_end"])
def test_out_of_range_index_is_an_error(where, backend):
    device = TRITON_DEVICE if backend == "triton" else "cpu"
    cube, wa, wbwc, M = make_atoms(index_dtype=torch.int32, device=device)
    wbwc = wbwc.clone()
    wbwc[7, 1, 2] = -1 - wa[7].min() if where == "negative" else M - wa[7].max()
    with pytest.raises(ValueError, match="outside \\[0, map_size"):
        gnnfuse.structured_scatter_add(cube, wa, wbwc, M, backend=backend)
    # check_bounds=False: the element is dropped, never written out of bounds
    out = gnnfuse.structured_scatter_add(cube, wa, wbwc, M, check_bounds=False, backend=backend)
    close(out, reference.structured_scatter_add(cube, wa, wbwc, M, check_bounds=False), torch.float64)


@pytest.mark.parametrize("backend", ["cpu", pytest.param("triton", marks=triton_only)])
def test_out_of_range_message_names_the_atom_and_map_size(backend):
    cube, wa, wbwc, M = make_atoms(device=TRITON_DEVICE if backend == "triton" else "cpu")
    wa = wa.clone()
    wa[11, 0] = M
    wa[20, 1] = -5  # a later bad atom: the message names the first
    with pytest.raises(ValueError, match=r"atom 11 .*wa\[11, :\] \+ wbwc\[11, :, :\].*map_size=990"):
        gnnfuse.structured_scatter_add(cube, wa, wbwc, M, backend=backend)


def test_gather_op_bounds():
    cube, wa, wbwc, M = make_atoms()
    with pytest.raises(ValueError, match="structured_gather: index out of range"):
        torch.ops.gnnfuse.structured_gather(torch.zeros(M - 1, dtype=torch.float64), wa, wbwc, 3, 5, True)
    g = torch.ops.gnnfuse.structured_gather(torch.ones(M - 1, dtype=torch.float64), wa, wbwc, 3, 5, False)
    flat = reference.structured_flat_index(wa, wbwc).view(cube.shape)
    assert torch.equal(g, (flat < M - 1).double())
    if HAS_TRITON_PATH:
        from gnnfuse.triton import structured_scatter as triton_kernels

        wa, wbwc = wa.to(TRITON_DEVICE), wbwc.to(TRITON_DEVICE)
        with pytest.raises(ValueError, match="structured_gather: index out of range"):
            triton_kernels.gather(torch.zeros(M - 1, dtype=torch.float64, device=TRITON_DEVICE), wa, wbwc, True)
        ones = torch.ones(M - 1, dtype=torch.float64, device=TRITON_DEVICE)
        assert torch.equal(triton_kernels.gather(ones, wa, wbwc, False).cpu(), g)


def test_map_size_too_small_for_atoms_with_drop():
    cube, wa, wbwc, M = make_atoms()
    out = gnnfuse.structured_scatter_add(cube, wa, wbwc, 0, check_bounds=False)
    assert out.shape == (0,)


# ---- argument validation ----------------------------------------------------------------------------
def _args(**overrides):
    cube, wa, wbwc, M = make_atoms(C=3, dtype=torch.float32, index_dtype=torch.int32)
    args = {"density_cube": cube, "wa": wa, "wbwc": wbwc, "map_size": M}
    args.update(overrides)
    return args


def _call(kwargs, **options):
    return gnnfuse.structured_scatter_add(kwargs.pop("density_cube"), kwargs.pop("wa"), kwargs.pop("wbwc"),
                                          kwargs.pop("map_size"), **options)


BAD_INPUTS = [
    ({"density_cube": [1.0]}, TypeError, "density_cube must be a torch.Tensor"),
    ({"wa": None}, TypeError, "wa must be a torch.Tensor"),
    ({"wbwc": 3}, TypeError, "wbwc must be a torch.Tensor"),
    ({"density_cube": torch.ones(3, 4, 3, 5, dtype=torch.int64)}, TypeError, "density_cube must have a floating"),
    ({"wa": torch.zeros(3, 4)}, TypeError, "wa must be an int32 or int64"),
    ({"wbwc": torch.zeros(3, 3, 5, dtype=torch.int16)}, TypeError, "wbwc must be an int32 or int64"),
    ({"wa": torch.zeros(3, 4, dtype=torch.int64)}, TypeError, "wa and wbwc must have the same index dtype"),
    ({"density_cube": torch.ones(3, 4, 15)}, ValueError, r"density_cube must have shape \[C, nx, ny, nz\]"),
    ({"wa": torch.zeros(2, 4, dtype=torch.int32)}, ValueError, r"wa must have shape \[C, nx\] = \[3, 4\]"),
    ({"wa": torch.zeros(3, 4, 1, dtype=torch.int32)}, ValueError, r"wa must have shape"),
    ({"wbwc": torch.zeros(3, 5, 3, dtype=torch.int32)}, ValueError, r"wbwc must have shape \[C, ny, nz\] = \[3, 3, 5\]"),
    ({"wbwc": torch.zeros(3, 15, dtype=torch.int32)}, ValueError, r"wbwc must have shape"),
    ({"map_size": -1}, ValueError, "map_size must be a non-negative int"),
    ({"map_size": 10.0}, TypeError, "map_size must be a non-negative int"),
    ({"map_size": True}, TypeError, "map_size must be a non-negative int"),
    ({"map_size": 2**31}, ValueError, "pass wa and wbwc as int64"),
    ({"wa": torch.zeros(3, 4, dtype=torch.int32, device="meta")}, ValueError, "one device"),
]


@pytest.mark.parametrize("overrides, error, message", BAD_INPUTS)
def test_bad_inputs(overrides, error, message):
    with pytest.raises(error, match=message):
        _call(_args(**overrides))


def test_bad_options():
    with pytest.raises(ValueError, match="backend must be one of"):
        _call(_args(), backend="gpu")
    with pytest.raises(TypeError, match="check_bounds must be a bool"):
        _call(_args(), check_bounds=1)
    if not HAS_CUDA:
        with pytest.raises(ValueError, match="needs CUDA"):
            os.environ.pop("TRITON_INTERPRET", None)
            try:
                _call(_args(), backend="triton")
            finally:
                os.environ["TRITON_INTERPRET"] = "1"


def test_int64_indices_allow_huge_map_size_check():
    # int64 passes validation for map_size > 2**31 - 1 (the map itself would be too big to allocate here)
    cube, wa, wbwc, M = make_atoms(C=2, index_dtype=torch.int64)
    out = gnnfuse.structured_scatter_add(cube.to("meta"), wa.to("meta"), wbwc.to("meta"), 2**31 + 5)
    assert out.shape == (2**31 + 5,) and out.device.type == "meta"
