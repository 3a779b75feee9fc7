"""Trust boundaries and caches: hand-built CSR / EdgeIndex validation, int64 ids checked before
narrowing, caches that cannot go stale (version-counter bypasses, derived state), inference_mode,
swap_tensors, dynamic-shape compilation, argument types, and a fuzz of corrupted graphs.

Cases that used to crash the interpreter run in a subprocess, so a regression fails the test
instead of killing the run."""
from __future__ import annotations

import inspect
import re
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import gnnfuse
from gnnfuse import CSR, IndexOutOfRange, config, reference
from gnnfuse.csr import clear_cache
from gnnfuse.testing import random_graph

ROOT = Path(__file__).resolve().parents[1]
TRITON_ON_CPU = config.enabled("TRITON_INTERPRET")


def run_isolated(code: str) -> str:
    """Runs ``code`` in a fresh interpreter; a crash (signal) or an error fails the test."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout


def fresh_ref(x, edge_index, reduce="sum", weight=None, num_dst=None):
    """The op on a brand-new copy of the graph (no cache can be involved)."""
    return gnnfuse.fused_gather_scatter(x, edge_index.clone(), reduce, edge_weight=weight, num_nodes=num_dst,
                                        backend="reference")


# ---- hand-built CSR and EdgeIndex: validated at the boundary ------------------------------------
def test_corrupt_hand_built_csr_and_edge_index_raise_instead_of_crashing():
    out = run_isolated("""
        import torch, gnnfuse
        from gnnfuse import CSR
        ei = torch.tensor([[0, 1, 2, 2, 3], [1, 2, 0, 1, 3]])
        good = CSR.from_edge_index(ei, 4, index_dtype=torch.int64)
        x = torch.randn(4, 8, requires_grad=True)
        cases = {
            "col out of range": (CSR(good.rowptr, torch.tensor([0, 1, 1000000, 2, 3]), good.perm, 4), IndexError),
            "col negative": (CSR(good.rowptr, torch.tensor([0, -7, 1, 2, 3]), good.perm, 4), IndexError),
            "rowptr decreasing": (CSR(torch.tensor([0, 3, 1, 4, 5]), good.col, good.perm, 4), ValueError),
            "rowptr ends beyond col": (CSR(torch.tensor([0, 1, 2, 3, 900]), good.col, good.perm, 4), ValueError),
            "rowptr not starting at 0": (CSR(torch.tensor([2, 2, 3, 4, 5]), good.col, good.perm, 4), ValueError),
            "perm out of range": (CSR(good.rowptr, good.col, torch.tensor([0, 1, 2, 3, 99]), 4), IndexError),
            "perm repeats": (CSR(good.rowptr, good.col, torch.tensor([0, 1, 1, 3, 4]), 4), ValueError),
        }
        for name, (csr, error) in cases.items():
            for backend in ("cpu", "reference"):
                try:
                    out = gnnfuse.fused_gather_scatter(x, csr, "max", edge_weight=torch.rand(5), backend=backend)
                    out.sum().backward()
                except error as exc:
                    assert "CSR." in str(exc), (name, str(exc))
                else:
                    raise AssertionError(f"{name} on {backend} did not raise")
        from torch_geometric import EdgeIndex
        for order in ("row", "col"):
            bad = EdgeIndex(torch.tensor([[0, 1, 900], [1, 2, 0]]), sparse_size=(3, 3)).sort_by(order)[0]
            try:
                gnnfuse.fused_gather_scatter(torch.randn(3, 2), bad)
            except IndexError as exc:
                assert "900" in str(exc), str(exc)
            else:
                raise AssertionError("EdgeIndex with a source beyond x did not raise")
        print("ok")
    """)
    assert out.strip() == "ok"


def test_csr_validation_is_cached_per_object_and_redone_after_a_change():
    csr = CSR.from_edge_index(random_graph(20, 20, 80, seed=1), 20, index_dtype=torch.int64)
    hand = CSR(csr.rowptr.clone(), csr.col.clone(), csr.perm.clone(), 20)
    x = torch.randn(20, 3)
    want = gnnfuse.fused_gather_scatter(x, csr)
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, hand), want)
    stamps = hand._stamps
    gnnfuse.fused_gather_scatter(x, hand)
    assert hand._stamps is stamps  # unchanged: not validated again
    hand.col[3] = 25  # an in-place write: validated again, and it is now out of range
    with pytest.raises(IndexOutOfRange, match="node id 25"):
        gnnfuse.fused_gather_scatter(x, hand)
    hand.col = csr.col.clone()  # a replaced tensor: validated again
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, hand), want)


def test_validate_checks_perm_and_from_scipy():
    csr = CSR.from_edge_index(random_graph(6, 6, 15, seed=2), 6)
    with pytest.raises(ValueError, match="not a permutation"):
        CSR(csr.rowptr, csr.col, torch.zeros_like(csr.perm), 6).validate()
    with pytest.raises(IndexOutOfRange, match="edge id 15"):
        CSR(csr.rowptr, csr.col, torch.full_like(csr.perm, 15), 6).validate()
    with pytest.raises(TypeError, match="one index dtype"):
        CSR(csr.rowptr.long(), csr.col, csr.perm, 6).validate()
    with pytest.raises(TypeError, match="matrix must be a scipy.sparse"):
        CSR.from_scipy(np.eye(3))


@pytest.mark.parametrize("threads", [1, 2])
def test_permutation_check_across_threads(threads):
    """perm is checked with one bitmap per group of edges, OR-ed together: a repeat is found also
    when its two copies fall in different groups (and each group alone looks fine)."""
    E = 2**19 + 5  # two chunks of the parallel check (a chunk is at least 2**18 edges)
    rowptr = torch.tensor([0, E])
    col = torch.zeros(E, dtype=torch.int64)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        shuffled = torch.randperm(E, generator=torch.Generator().manual_seed(0))
        CSR(rowptr, col, shuffled, 1).validate()
        CSR(rowptr, col, torch.arange(E), 1).validate()  # identity: no bitmap at all
        halves = torch.cat([torch.arange(E // 2), torch.arange(E - E // 2)])  # every id of the 1st half twice
        with pytest.raises(ValueError, match=f"edge id 0 appears more than once .*position {E // 2}\\)"):
            CSR(rowptr, col, halves, 1).validate()
        last_missing = shuffled.clone()
        last_missing[last_missing == E - 1] = 0  # the last word of the bitmap is partial
        with pytest.raises(ValueError, match="not a permutation: edge id 0 "):
            CSR(rowptr, col, last_missing, 1).validate()
    finally:
        torch.set_num_threads(before)


def _perm_variants(E: int, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, type | None, str]]:
    """perm tensors of E ids, each with the error its check must raise (None: valid) and the message."""
    g = torch.Generator().manual_seed(E)
    shuffled = torch.randperm(E, generator=g).to(dtype)
    pos = int(torch.randint(0, E, (1,), generator=g))
    identity = torch.arange(E, dtype=dtype)
    out_of_range, negative, repeated, late_swap = shuffled.clone(), identity.clone(), shuffled.clone(), identity.clone()
    out_of_range[pos] = E
    negative[pos] = -1
    first = int(repeated[0])
    repeated[pos if pos else E - 1] = first
    late_swap[[E - 2, E - 1]] = late_swap[[E - 1, E - 2]]  # the identity except for its last two ids
    cases = {"shuffled": (shuffled, None, ""), "identity": (identity, None, ""), "late swap": (late_swap, None, ""),
             "out of range": (out_of_range, IndexOutOfRange, f"edge id {E} at CSR position {pos},"),
             "negative": (negative, IndexOutOfRange, f"edge id -1 at CSR position {pos},"),
             "repeated": (repeated, ValueError, f"edge id {first} appears more than once")}
    if dtype == torch.int64:  # an id that equals a valid one in its low 32 bits
        wide = identity.clone()
        wide[pos] = 2**32 + pos
        cases["beyond 2**32"] = (wide, IndexOutOfRange, f"edge id {2**32 + pos} at")
    return cases


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("E", [2, 63, 64, 65, 1000, 2**19 + 3])
@pytest.mark.parametrize("threads", [1, 2])
def test_permutation_check_proves_every_case(E, dtype, threads):
    """The permutation check is one marking pass over a bitmap (an id outside [0, E) marks a spare
    bit; the identity skips the bitmap): every kind of bad perm raises, naming CSR.perm and the
    offending id, through the first read of ``perm`` and through validate(), whatever the word
    boundaries and the number of chunks (2**19 + 3 edges: two chunks on two threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rowptr, col = torch.tensor([0, E], dtype=dtype), torch.zeros(E, dtype=dtype)
        for name, (perm, error, message) in _perm_variants(E, dtype).items():
            for read in (lambda c: c.perm, lambda c: c.validate()):
                csr = CSR(rowptr, col, perm, 1)
                if error is None:
                    read(csr)
                    assert csr._perm_stamp is not None, name
                    continue
                with pytest.raises(error, match=re.escape(message)) as caught:
                    read(csr)
                assert "CSR.perm" in str(caught.value), name
                assert csr._perm_stamp is None, name  # not marked as checked
    finally:
        torch.set_num_threads(before)


def test_first_use_checks_accept_any_layout_of_plain_tensors():
    """The first-use checks run in one C++ call for plain CPU tensors; strided views, subclasses and
    wrong layouts go through the Python path, which checks them the same way or names the problem."""
    csr = CSR.from_edge_index(random_graph(30, 30, 200, seed=5), 30)
    strided = [torch.stack([t, t], 1)[:, 0] for t in (csr.rowptr, csr.col, csr.perm)]  # non-contiguous views
    assert not strided[1].is_contiguous()
    CSR(*strided, 30).checked().perm  # noqa: B018
    strided[1][7] = 30
    with pytest.raises(IndexOutOfRange, match="CSR.col contains node id 30 at CSR position 7"):
        CSR(*strided, 30).checked()
    strided[1][7] = 0
    strided[2][5] = strided[2][6]
    with pytest.raises(ValueError, match=f"edge id {int(strided[2][6])} appears more than once"):
        CSR(*strided, 30).validate()

    class Sub(torch.Tensor):
        pass

    sub = CSR(csr.rowptr.as_subclass(Sub), csr.col.as_subclass(Sub), csr.perm.as_subclass(Sub), 30)
    sub.checked().perm  # noqa: B018  (checked in Python; subclasses get no stamp)
    bad = CSR(csr.rowptr, csr.col.as_subclass(Sub).clone().fill_(30), csr.perm, 30)
    with pytest.raises(IndexOutOfRange, match="CSR.col contains node id 30"):
        bad.checked()
    with pytest.raises(TypeError, match="CSR.col must be a torch.Tensor"):
        CSR(csr.rowptr, [0, 1], csr.perm, 30).checked()
    with pytest.raises(ValueError, match="int32 but the graph has 2000000000000 nodes"):
        CSR(csr.rowptr, csr.col, csr.perm, 2 * 10**12).checked()


@pytest.fixture(params=["native", "python"])
def stamps(request):
    """Runs a test with the stamps taken in C++ (the graph kernels loaded) and in Python (without)."""
    from gnnfuse import _tensor_cache
    from gnnfuse._build import extension_available

    if request.param == "native":
        if not extension_available():
            pytest.skip("C++ kernels unavailable")
        CSR.from_edge_index(torch.tensor([[0], [0]]), 1)  # a CPU build loads them and their stamps
        assert _tensor_cache._native
        yield request.param
    else:
        with _tensor_cache.python_stamps():
            yield request.param


@pytest.mark.parametrize("field", ["rowptr", "col", "perm"])
@pytest.mark.parametrize("change", ["set_data", "numpy_write", "in_place"])
def test_validated_csr_sees_every_kind_of_change_to_each_tensor(field, change, stamps):
    """The repeated check compares each tensor's object, data pointer, shape, version and
    fingerprint: rowptr and col in checked(), perm when it is read."""
    csr = CSR.from_edge_index(random_graph(20, 20, 300, seed=11), 20, index_dtype=torch.int64)
    hand = CSR(csr.rowptr.clone(), csr.col.clone(), csr.perm.clone(), 20).checked()
    hand.perm  # noqa: B018  (first read: checked and stamped)
    stamps_before, perm_stamp = hand._stamps, hand._perm_stamp
    assert hand.checked()._stamps is stamps_before and hand._perm_stamp is perm_stamp  # unchanged: not re-checked
    t = getattr(hand, field)
    bad = {"rowptr": 301, "col": 99, "perm": 300}[field]
    if change == "set_data":
        replaced = t.clone()
        replaced[-1] = bad
        t.data = replaced  # same tensor object, new memory, version unchanged
    elif change == "numpy_write":
        t.numpy()[-1] = bad  # same memory, version unchanged
    else:
        t[-1] = bad  # an ordinary in-place write: version bumped
    if field == "perm":
        assert hand.checked()._stamps is stamps_before  # perm is not part of the structure's stamp
    with pytest.raises((ValueError, IndexError), match=f"{bad}"):
        hand.checked().perm  # noqa: B018


@pytest.mark.parametrize("field", ["rowptr", "col", "perm"])
def test_validated_csr_sees_a_view_at_the_same_address(field, stamps):
    """``t.data = t.data[:-1]`` keeps the data pointer and the version: the shape tells."""
    csr = CSR.from_edge_index(random_graph(20, 20, 300, seed=11), 20)
    hand = CSR(csr.rowptr.clone(), csr.col.clone(), csr.perm.clone(), 20).checked()
    hand.perm  # noqa: B018
    t = getattr(hand, field)
    t.data = t.data[:-1]
    with pytest.raises(ValueError, match="rowptr|perm"):
        hand.checked().perm  # noqa: B018


def test_perm_is_checked_when_first_read(stamps):
    """An op without per-edge inputs never reads perm, so never pays for (or trips on) its check; an
    op with edge weights reads it, and a broken perm then raises before any kernel runs."""
    good = CSR.from_edge_index(random_graph(10, 10, 40, seed=13), 10)
    broken = CSR(good.rowptr.clone(), good.col.clone(), torch.zeros_like(good.perm), 10)
    x, w = torch.randn(10, 3), torch.rand(40)
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, broken), gnnfuse.fused_gather_scatter(x, good))
    assert broken._stamps is not None and broken._perm_stamp is None  # structure checked, perm never read
    for call in (lambda: broken.perm, lambda: gnnfuse.fused_gather_scatter(x, broken, edge_weight=w),
                 lambda: gnnfuse.edge_softmax(torch.randn(40), broken), broken.validate, broken.transpose,
                 lambda: broken.to(torch.int64)):
        with pytest.raises(ValueError, match="not a permutation"):
            call()
    broken.perm = good.perm.clone()  # a replaced perm is checked at its next read
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, broken, edge_weight=w),
                               gnnfuse.fused_gather_scatter(x, good, edge_weight=w))
    stamp = broken._perm_stamp
    assert stamp is not None and broken.perm is broken.perm and broken._perm_stamp is stamp  # checked once
    broken.perm = torch.arange(39, dtype=good.perm.dtype)  # wrong length: the layout check names it
    with pytest.raises(ValueError, match="CSR.perm must have shape"):
        gnnfuse.fused_gather_scatter(x, broken, edge_weight=w)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_csr_checks_and_stamps(stamps):
    """On CUDA: the structure and perm checks (torch ops), stamps without fingerprints (C++ ones
    once the CPU kernels are loaded, else Python), and changes seen through pointer and version."""
    good = CSR.from_edge_index(random_graph(12, 12, 50, seed=15), 12).to("cuda")
    x, w = torch.randn(12, 3, device="cuda"), torch.rand(50, device="cuda")
    want = gnnfuse.fused_gather_scatter(x, good, edge_weight=w)
    hand = CSR(good.rowptr.clone(), good.col.clone(), good.perm.clone(), 12)
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, hand, edge_weight=w), want)
    stamps_before, perm_stamp = hand._stamps, hand._perm_stamp
    assert stamps_before is not None and perm_stamp is not None
    gnnfuse.fused_gather_scatter(x, hand, edge_weight=w)
    assert hand._stamps is stamps_before and hand._perm_stamp is perm_stamp  # not checked again
    hand.col[3] = 40  # in place: version bumped
    with pytest.raises(IndexOutOfRange, match="node id 40"):
        gnnfuse.fused_gather_scatter(x, hand)
    hand.col = good.col.clone()
    hand.perm = torch.zeros_like(good.perm)  # unweighted calls never read it; weighted ones do
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, hand), gnnfuse.fused_gather_scatter(x, good))
    with pytest.raises(ValueError, match="not a permutation"):
        gnnfuse.fused_gather_scatter(x, hand, edge_weight=w)


def test_csr_pickles_without_its_stamps(stamps):
    import copy
    import io
    import pickle

    csr = CSR.from_edge_index(random_graph(10, 10, 30, seed=14), 10)
    x = torch.randn(10, 2)
    want = gnnfuse.fused_gather_scatter(x, csr, edge_weight=torch.ones(30))
    buffer = io.BytesIO()
    torch.save(csr, buffer)
    buffer.seek(0)
    for other in (pickle.loads(pickle.dumps(csr)), torch.load(buffer, weights_only=False)):
        assert other._stamps is None and other._perm_stamp is None and not other._trusted  # checked on first use
        torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, other, edge_weight=torch.ones(30)), want)
    copied = copy.deepcopy(csr)  # the stamps are copied but record the original's memory: checked again
    copied.col[0] = (copied.col[0] + 1) % 10
    assert copied.checked() is copied and not torch.equal(copied.col, csr.col)


def test_stamp_functions_reject_what_they_did_not_stamp(stamps):
    from gnnfuse import _tensor_cache

    a, b = torch.arange(5), torch.arange(600)  # fingerprinted whole / sampled
    same, data = _tensor_cache.take(_tensor_cache.SAME_OBJECT, (a, b))
    assert same(data, a, b)
    if stamps == "native":  # the Python ones take exactly as many tensors as they stamped
        assert not same(data, a)
    assert not same(data, b, a)  # other objects
    assert not same(data, a, b.clone())
    assert not same(data, a, "not a tensor")
    clear_cache()  # the cache: stamps of mode SAME_MEMORY, keyed on data pointer and shape
    first = _tensor_cache.cached("test", (b,), (), object)
    assert _tensor_cache.cached("test", (b.view(600),), (), object) is first  # another tensor, same memory
    for other in (b.view(20, 30), b.view(torch.float64), b[::2], b.clone()):
        assert _tensor_cache.cached("test", (other,), (), object) is not first
    with torch.inference_mode():
        assert _tensor_cache.take(_tensor_cache.SAME_MEMORY, (torch.arange(3),)) is None
        inner = torch.arange(600)
        first = _tensor_cache.cached("test", (inner,), (), object)
        assert _tensor_cache.cached("test", (inner,), (), object) is not first  # not cached


def test_from_scipy_drops_stored_zeros_without_touching_the_input():
    scipy_sparse = pytest.importorskip("scipy.sparse")
    m = scipy_sparse.csr_matrix((np.array([1.0, 0.0, 2.0]), np.array([0, 1, 2]), np.array([0, 2, 3])), shape=(2, 3))
    csr = CSR.from_scipy(m)
    assert csr.num_edges == 2 and csr.col.tolist() == [0, 2]
    assert m.nnz == 3  # the caller's matrix keeps its stored zero


def test_fallback_sort_when_the_extension_cannot_build(monkeypatch):
    from gnnfuse import _build

    def broken(*args, **kwargs):
        raise _build.BuildError("simulated: no compiler")

    monkeypatch.setattr(_build, "load_extension", broken)  # what optional_extension loads with
    edge_index = random_graph(9, 9, 30, seed=3)
    with pytest.warns(UserWarning, match="sorting with torch"):
        csr = CSR.from_edge_index(edge_index, 9)
    assert torch.equal(csr.col, reference.coo_to_csr(edge_index[1], edge_index[0], 9, 9, torch.int32)[1])
    with pytest.warns(UserWarning), pytest.raises(IndexOutOfRange, match="node id 12"):
        CSR(csr.rowptr, csr.col.clone().fill_(12), csr.perm, 9).validate()


# ---- int64 ids: range-checked before any narrowing -----------------------------------------------
BIG_IDS = [2**32 + 1, 2**31, 2**31 + 5, -(2**31) - 3, -1]


@pytest.mark.parametrize("bad", BIG_IDS)
@pytest.mark.parametrize("row", [0, 1], ids=["source", "target"])
def test_large_int64_ids_are_errors_quoting_the_real_id(bad, row):
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    edge_index[row, 1] = bad
    x = torch.randn(3, 2)
    for backend in ("cpu", "reference"):
        with pytest.raises(IndexOutOfRange, match=f"node id {bad} "):
            gnnfuse.fused_gather_scatter(x, edge_index, backend=backend)
    with pytest.raises(IndexOutOfRange, match=f"node id {bad} "):
        CSR.from_edge_index(edge_index, 3)
    with pytest.raises(IndexOutOfRange, match=f"node id {bad} "):
        reference.coo_to_csr(edge_index[1], edge_index[0], 3, 3, torch.int32)


def test_large_int64_ids_in_nn_layers_and_under_compile():
    pytest.importorskip("torch_geometric")
    from gnnfuse.nn import GCNConv, SAGEConv

    edge_index = torch.tensor([[0, 2**32 + 1, 2], [1, 2, 0]])
    x = torch.randn(3, 4)
    for layer in (SAGEConv(4, 2), GCNConv(4, 2)):
        with pytest.raises(IndexError):
            layer(x, edge_index)
    compiled = torch.compile(lambda x, ei: gnnfuse.fused_gather_scatter(x, ei, "sum"), fullgraph=True)
    with pytest.raises(IndexOutOfRange, match="node id 4294967297"):
        compiled(x, edge_index)


def test_nn_layers_raise_gnnfuse_error_quoting_the_id():
    """GCNConv normalises by node id before it aggregates: the bad id is still quoted by gnnfuse's
    error (it used to be torch's IndexError from the degree lookup)."""
    pytest.importorskip("torch_geometric")
    from torch_geometric import EdgeIndex

    from gnnfuse.nn import GCNConv, SAGEConv

    x = torch.randn(3, 4)
    for bad in (7, 2**32 + 1, -5):
        edge_index = torch.tensor([[0, bad, 2], [1, 2, 0]])
        for layer in (SAGEConv(4, 2), GCNConv(4, 2), GCNConv(4, 2, cached=True), GCNConv(4, 2, add_self_loops=False)):
            with pytest.raises(IndexOutOfRange, match=f"node id {bad} "):
                layer(x, edge_index)
    sorted_ei = EdgeIndex(torch.tensor([[0, 1, 9], [1, 2, 2]]), sparse_size=(10, 10)).sort_by("col")[0]
    with pytest.raises(IndexOutOfRange, match="node id 9"):
        GCNConv(4, 2)(x, sorted_ei)


def _out_of_range_calls():
    """Every public route that meets an out-of-range id, as (name, call)."""
    x = torch.randn(3, 2)
    bad_ei = torch.tensor([[0, 5, 2], [1, 2, 0]])
    good = CSR.from_edge_index(torch.tensor([[0, 1, 2], [1, 2, 0]]), 3, index_dtype=torch.int64)
    return {
        "raw edge_index (C++)": lambda: gnnfuse.fused_gather_scatter(x, bad_ei, backend="cpu"),
        "raw edge_index (reference)": lambda: gnnfuse.fused_gather_scatter(x, bad_ei, backend="reference"),
        "from_edge_index": lambda: CSR.from_edge_index(bad_ei, 3),
        "hand-built CSR": lambda: gnnfuse.fused_gather_scatter(x, CSR(good.rowptr, torch.tensor([0, 5, 1]),
                                                                      good.perm, 3)),
        "perm out of range": lambda: CSR(good.rowptr, good.col, torch.tensor([0, 1, 7]), 3).validate(),
        "reference validate": lambda: reference.validate_csr(good.rowptr, torch.tensor([0, 5, 1]), good.perm, 3),
    }


@pytest.mark.parametrize("catch", [IndexError, ValueError, IndexOutOfRange])
def test_out_of_range_error_is_caught_as_index_error_and_as_value_error(catch):
    """PyG (and torch) raise IndexError for a bad index, gnnfuse raises ValueError for bad argument
    values: the out-of-range error is both, so code written against either keeps working."""
    assert issubclass(IndexOutOfRange, IndexError) and issubclass(IndexOutOfRange, ValueError)
    assert gnnfuse.IndexOutOfRange is IndexOutOfRange
    for name, call in _out_of_range_calls().items():
        try:
            call()
        except catch as exc:
            assert type(exc) is IndexOutOfRange, (name, type(exc))
            assert any(ch.isdigit() for ch in str(exc)), (name, str(exc))  # quotes the id
        else:
            raise AssertionError(f"{name} did not raise")


# ---- caches that cannot go stale -------------------------------------------------------------------
def _bypass_writes():
    """Ways to change an index tensor's contents without bumping its version counter."""
    def via_data(t):
        t.data[0, 0] = 4
    def via_numpy(t):
        t.numpy()[0, 0] = 4
    def via_dlpack(t):
        torch.from_dlpack(t.__dlpack__())[0, 0] = 4
    def via_storage_alias(t):
        alias = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())
        alias[0, 0] = 4
    def via_set_data(t):
        replaced = t.clone()
        replaced[0, 0] = 4
        t.data = replaced
    def via_last_edge(t):  # the last entry of a large tensor is fingerprinted too
        t.numpy()[1, -1] = 4
    return {f.__name__: f for f in (via_data, via_numpy, via_dlpack, via_storage_alias, via_set_data, via_last_edge)}


@pytest.mark.parametrize("write", list(_bypass_writes()))
@pytest.mark.parametrize("num_edges", [12, 5000], ids=["small", "large"])
def test_edge_index_cache_sees_writes_that_bypass_the_version_counter(write, num_edges, stamps):
    clear_cache()
    edge_index = random_graph(10, 10, num_edges, seed=4)
    edge_index[:, 0] = torch.tensor([1, 2])
    edge_index[:, -1] = torch.tensor([3, 5])
    x = torch.randn(10, 3)
    gnnfuse.fused_gather_scatter(x, edge_index)  # cached
    _bypass_writes()[write](edge_index)
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, edge_index), fresh_ref(x, edge_index))


def test_csr_transpose_follows_in_place_edits(stamps):
    edge_index = random_graph(8, 8, 30, seed=5)
    csr = CSR.from_edge_index(edge_index, 8)
    x = torch.randn(8, 3, requires_grad=True)
    gnnfuse.fused_gather_scatter(x, csr).sum().backward()  # transpose cached
    csr.col[0] = (csr.col[0] + 3) % 8  # in place: the transpose must be rebuilt
    x.grad = None
    gnnfuse.fused_gather_scatter(x, csr, "sum").pow(2).sum().backward()
    new_edge_index = torch.stack([csr.col, csr.row()]).long()[:, csr.perm.argsort()]
    want = torch.autograd.grad(fresh_ref(x, new_edge_index).pow(2).sum(), x)[0]
    torch.testing.assert_close(x.grad, want)
    csr.col.numpy()[0] = (csr.col[0] + 1) % 8  # bypassing the version counter (fingerprinted)
    x.grad = None
    gnnfuse.fused_gather_scatter(x, csr, "sum").pow(2).sum().backward()
    new_edge_index = torch.stack([csr.col, csr.row()]).long()[:, csr.perm.argsort()]
    want = torch.autograd.grad(fresh_ref(x, new_edge_index).pow(2).sum(), x)[0]
    torch.testing.assert_close(x.grad, want)


def test_cached_values_do_not_block_swap_tensors():
    clear_cache()
    edge_index = random_graph(6, 6, 20, seed=6)
    x = torch.randn(6, 2)
    gnnfuse.fused_gather_scatter(x, edge_index)
    other = random_graph(6, 6, 20, seed=7)
    torch.utils.swap_tensors(edge_index, other)  # raised while the cache held a weakref to the tensor
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, edge_index), fresh_ref(x, edge_index))


@pytest.mark.skipif(not TRITON_ON_CPU, reason="needs Triton (interpreter on CPU)")
def test_module_to_with_swap_enabled_after_a_cached_call():
    class Restraint(torch.nn.Module):  # sigmas are parameters: the Triton layout cache holds them
        def __init__(self):
            super().__init__()
            self.sigma = torch.nn.Parameter(torch.full((2,), 0.5))
            self.register_buffer("planes", torch.tensor([[0, 1, 2], [1, 2, 3]]))

        def forward(self, xyz):
            return gnnfuse.planarity_nll(xyz, [(self.planes, self.sigma)], backend="triton")

    module = Restraint()
    module(torch.randn(4, 3))
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        module.to(torch.float64)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    assert module.sigma.dtype == torch.float64
    module(torch.randn(4, 3, dtype=torch.float64))


@pytest.mark.skipif(not TRITON_ON_CPU, reason="needs Triton (interpreter on CPU)")
def test_triton_caches_see_writes_that_bypass_the_version_counter():
    wa = torch.tensor([[0, 4], [8, 12]], dtype=torch.int32)
    wbwc = torch.tensor([[[0, 1], [2, 3]], [[0, 1], [2, 3]]], dtype=torch.int32)
    cube = torch.ones(2, 2, 2, 2)
    gnnfuse.structured_scatter_add(cube, wa, wbwc, 16, backend="triton")  # bounds check remembered
    wa.numpy()[1, 1] = 40
    with pytest.raises(IndexOutOfRange, match="atom 1"):
        gnnfuse.structured_scatter_add(cube, wa, wbwc, 16, backend="triton")
    xyz = torch.randn(5, 3)
    planes, sigma = torch.tensor([[0, 1, 2], [1, 2, 3]]), torch.tensor([0.5, 0.7])
    gnnfuse.planarity_nll(xyz, [(planes, sigma)], backend="triton")  # layout cached
    planes.numpy()[0, 0] = 4
    torch.testing.assert_close(gnnfuse.planarity_nll(xyz, [(planes, sigma)], backend="triton"),
                               reference.planarity_nll(xyz, [(planes, sigma)]))


# ---- inference_mode ---------------------------------------------------------------------------------
def test_inference_tensors_work_on_every_path():
    backends = ["cpu", "reference"] + (["triton"] if TRITON_ON_CPU else [])
    with torch.inference_mode():
        edge_index = random_graph(12, 12, 40, seed=8)
        x, w = torch.randn(12, 3), torch.rand(40)
        want = fresh_ref(x, edge_index, "mean", w)
        for backend in backends:
            for _ in range(2):
                out = gnnfuse.fused_gather_scatter(x, edge_index, "mean", edge_weight=w, backend=backend)
                torch.testing.assert_close(out, want)
        csr = CSR.from_edge_index(edge_index, 12)
        torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, csr, "mean", edge_weight=w), want)
        edge_index[1, 0] = (edge_index[1, 0] + 1) % 12  # no version counter: nothing may be served stale
        torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, edge_index, "mean", edge_weight=w),
                                   fresh_ref(x, edge_index, "mean", w))
        xyz = torch.randn(5, 3)
        groups = [(torch.tensor([[0, 1, 2], [1, 3, 4]]), torch.tensor([0.5, 0.7]))]
        cube = torch.rand(2, 2, 2, 2)
        wa = torch.tensor([[0, 4], [8, 12]])
        wbwc = torch.tensor([[[0, 1], [2, 3]], [[0, 1], [2, 3]]])
        for backend in backends:
            torch.testing.assert_close(gnnfuse.planarity_nll(xyz, groups, backend=backend),
                                       reference.planarity_nll(xyz, groups))
            torch.testing.assert_close(gnnfuse.structured_scatter_add(cube, wa, wbwc, 16, backend=backend),
                                       reference.structured_scatter_add(cube, wa, wbwc, 16))


def test_graphs_made_outside_inference_mode_stay_cached_inside_it():
    """Only tensors *created* under inference_mode lack a version counter: a graph made outside the
    block is cached and validated once as usual, also when used inside it. One made inside is
    re-checked on every call (no identity-only cache: an in-place write inside the block could not
    be seen, and a stale sort or skipped check could then crash)."""
    clear_cache()
    edge_index = random_graph(12, 12, 40, seed=10)
    csr = CSR.from_edge_index(edge_index, 12)
    hand = CSR(csr.rowptr.clone(), csr.col.clone(), csr.perm.clone(), 12)
    x = torch.randn(12, 3)
    with torch.inference_mode():
        gnnfuse.fused_gather_scatter(x, hand)
        stamps = hand._stamps
        assert stamps is not None
        gnnfuse.fused_gather_scatter(x, hand)
        assert hand._stamps is stamps  # not validated again
        gnnfuse.fused_gather_scatter(x, edge_index)
        cached_csr = gnnfuse.csr.csr_for_edge_index(edge_index, 12, 12)
        assert gnnfuse.csr.csr_for_edge_index(edge_index, 12, 12) is cached_csr  # sorted once
        inner = CSR(csr.rowptr.clone(), csr.col.clone(), csr.perm.clone(), 12)  # inference tensors
        gnnfuse.fused_gather_scatter(x, inner, edge_weight=torch.rand(40))
        assert inner._stamps is None and inner._perm_stamp is None  # nothing to compare: re-checked on every use
        inner.col[0] = 40  # an in-place write inside the block is still caught
        with pytest.raises(IndexOutOfRange, match="node id 40"):
            gnnfuse.fused_gather_scatter(x, inner)


def test_inference_tensors_in_nn_layers():
    pytest.importorskip("torch_geometric")
    import torch_geometric.nn as pyg_nn

    from gnnfuse.nn import GCNConv, SAGEConv

    torch.manual_seed(0)
    for fused, stock in ((SAGEConv(4, 3), pyg_nn.SAGEConv(4, 3)), (GCNConv(4, 3, cached=True), pyg_nn.GCNConv(4, 3))):
        stock.load_state_dict(fused.state_dict())
        with torch.inference_mode():
            edge_index = random_graph(10, 10, 30, seed=9)
            x = torch.randn(10, 4)
            for _ in range(2):
                torch.testing.assert_close(fused(x, edge_index), stock(x, edge_index), atol=1e-5, rtol=1e-5)


# ---- dynamic shapes: one compiled graph for every batch size ---------------------------------------
class _TwoLayers(torch.nn.Module):
    def __init__(self, weighted: bool):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.weighted = weighted

    def forward(self, x, edge_index, edge_weight=None):
        h = gnnfuse.fused_gather_scatter(x, edge_index, "sum", edge_weight=edge_weight).relu()
        return gnnfuse.fused_gather_scatter(self.lin(h), edge_index, "mean")


class _PygLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from gnnfuse.nn import GCNConv, GraphConv, SAGEConv

        self.a, self.b, self.c = GraphConv(4, 8), SAGEConv(8, 3), GCNConv(3, 3)

    def forward(self, x, edge_index, edge_weight=None):
        return self.c(self.b(self.a(x, edge_index, edge_weight).relu(), edge_index), edge_index, edge_weight)


@pytest.mark.parametrize("weighted,layers", [(False, "op"), (True, "op"), (True, "nn")],
                         ids=["edge_index", "edge_weight", "nn-layers"])
def test_dynamic_compile_survives_differently_sized_batches(weighted, layers):
    from torch._dynamo.utils import counters

    if layers == "nn":
        pytest.importorskip("torch_geometric")
    torch._dynamo.reset()
    counters.clear()
    model = _TwoLayers(weighted) if layers == "op" else _PygLayers()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    g = torch.Generator().manual_seed(0)
    for i in range(int(config.get("GNNFUSE_DYNAMIC_BATCHES"))):
        n, e = 7 + 3 * i + i % 4, 15 + 5 * i + (i * 7) % 11  # every batch has another N and E
        edge_index = torch.randint(0, n, (2, e), generator=g)
        x = torch.randn(n, 4, generator=g, requires_grad=True)
        w = torch.rand(e, generator=g) if weighted else None
        out = compiled(x, edge_index, w)
        out.sum().backward()
        torch.testing.assert_close(out, model(x, edge_index, w), atol=1e-5, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] <= 2  # the first graph and at most one recompile


# ---- argument types ------------------------------------------------------------------------------
def test_argument_types_are_named_or_accepted():
    edge_index = random_graph(5, 5, 9, seed=10)
    x = torch.randn(5, 2)
    with pytest.raises(TypeError, match="edge_weight must be a torch.Tensor"):
        gnnfuse.fused_gather_scatter(x, edge_index, edge_weight=[1.0] * 9)
    want = gnnfuse.fused_gather_scatter(x, edge_index, num_nodes=5)
    for count in (np.int64(5), np.int32(5), torch.tensor(5)):
        torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, edge_index, num_nodes=count), want)
    assert CSR.from_edge_index(edge_index, np.int64(5)).num_dst == 5
    with pytest.raises(TypeError, match="num_nodes"):
        gnnfuse.fused_gather_scatter(x, edge_index, num_nodes=5.0)
    with pytest.raises(TypeError, match="num_nodes"):
        gnnfuse.fused_gather_scatter(x, edge_index, num_nodes=True)


def test_test_helpers_use_the_ops_dtypes():
    from gnnfuse import _validate, testing

    assert testing.INDEX_DTYPES is _validate.INDEX_DTYPES
    assert set(testing.VALUE_DTYPES) == set(_validate.VALUE_DTYPES)


def test_explain_rejects_what_the_op_rejects_and_reports_the_dtype_that_runs():
    edge_index = random_graph(5, 5, 9, seed=11)  # int64; its CSR is int32
    x = torch.randn(5, 2)
    assert gnnfuse.explain(x, edge_index).index_dtype == torch.int32
    bad = edge_index.clone()
    bad[0, 0] = 2**32
    for args, kwargs, error in (
        ((x, bad), {}, IndexOutOfRange),
        ((x.long(), edge_index), {}, TypeError),
        ((x, edge_index), {"edge_weight": torch.rand(3)}, ValueError),
        ((x[:2], CSR.from_edge_index(edge_index, 5)), {}, ValueError),
    ):
        with pytest.raises(error):
            gnnfuse.fused_gather_scatter(*args, **kwargs)
        with pytest.raises(error):
            gnnfuse.explain(*args, **kwargs)


@pytest.mark.parametrize("sigma", [0.0, -0.5, float("nan")])
def test_planarity_rejects_non_positive_sigma(sigma):
    xyz = torch.randn(5, 3)
    groups = [(torch.tensor([[0, 1, 2], [1, 3, 4]]), torch.tensor([0.5, sigma]))]
    for backend in ["cpu", "reference"] + (["triton"] if TRITON_ON_CPU else []):
        with pytest.raises(ValueError, match=r"sigmas must be positive; sigma\[1\]"):
            gnnfuse.planarity_nll(xyz, groups, backend=backend)


def test_planarity_sigma_check_is_redone_after_an_in_place_change():
    xyz = torch.randn(5, 3)
    sigma = torch.tensor([0.5, 0.7])
    groups = [(torch.tensor([[0, 1, 2], [1, 3, 4]]), sigma)]
    gnnfuse.planarity_nll(xyz, groups)  # the pass is remembered on the unchanged tensor
    sigma[0] = -1.0
    with pytest.raises(ValueError, match=r"sigma\[0\] = -1.0"):
        gnnfuse.planarity_nll(xyz, groups)


def test_csr_help_shows_only_public_arguments():
    params = list(inspect.signature(CSR).parameters)
    assert params == ["rowptr", "col", "perm", "num_src"]
    assert "validated" in CSR.__doc__
    assert not any(name.startswith("_") for name in params)


# ---- fuzz: corrupted hand-built graphs raise clearly or match the reference ------------------------
FUZZ = """
import random, torch, gnnfuse
from gnnfuse import CSR, reference
from gnnfuse.testing import random_graph
from torch_geometric import EdgeIndex

ERRORS = (ValueError, IndexError, TypeError)

def corrupt(rng, t, limit):
    t = t.clone()
    if t.numel() == 0:
        return t
    kind = rng.randrange(6)
    i = rng.randrange(t.numel())
    flat = t.view(-1)
    if kind == 0: flat[i] = limit + rng.randrange(3)
    elif kind == 1: flat[i] = -1 - rng.randrange(3)
    elif kind == 2: flat[i] = rng.choice([2**31 - 1, 2**31, -2**31]) if t.dtype == torch.int64 else 2**31 - 1
    elif kind == 3: flat[i] = flat[rng.randrange(t.numel())]
    elif kind == 4: return t.flip(0)
    else: flat[i] = rng.randrange(max(limit, 1))
    return t

def expected(x, csr, reduce, w):
    row = torch.repeat_interleave(torch.arange(csr.num_dst), (csr.rowptr[1:] - csr.rowptr[:-1]).long())
    wc = None if w is None else w[csr.perm.long()]
    return reference.gather_scatter(x.double(), csr.col.long(), row, csr.num_dst, reduce, wc)

rng = random.Random(SEED)
outcomes = {"raised": 0, "matched": 0}
for trial in range(TRIALS):
    n_src, n_dst, e = rng.randrange(1, 12), rng.randrange(1, 12), rng.randrange(0, 40)
    dtype = rng.choice([torch.int32, torch.int64])
    edge_index = torch.stack([torch.randint(0, n_src, (e,)), torch.randint(0, n_dst, (e,))])
    good = CSR.from_edge_index(edge_index, (n_src, n_dst), index_dtype=dtype)
    parts = [good.rowptr, good.col, good.perm]
    which = rng.randrange(4)
    if which < 3:
        parts[which] = corrupt(rng, parts[which], [e, n_src, e][which])
    num_src = n_src if which < 3 else rng.randrange(0, n_src + 1)
    csr = CSR(*parts, num_src)
    reduce = rng.choice(gnnfuse.REDUCTIONS)
    x = torch.randn(max(num_src, 1), 3, dtype=torch.float64, requires_grad=True)
    w = torch.rand(e, dtype=torch.float64) if rng.random() < 0.5 else None
    backend = rng.choice(["cpu", "reference"])
    try:
        out = gnnfuse.fused_gather_scatter(x, csr, reduce, edge_weight=w, backend=backend)
        out.sum().backward()
    except ERRORS as exc:
        assert str(exc), "an error without a message"
        outcomes["raised"] += 1
        continue
    torch.testing.assert_close(out, expected(x, csr, reduce, w).to(out.dtype))
    outcomes["matched"] += 1
    # the same graph as a PyG EdgeIndex, corrupted by a source id beyond x
    ei = EdgeIndex(edge_index.clone(), sparse_size=(n_src, n_dst)).sort_by("col")[0]
    if e and rng.random() < 0.5:
        raw = ei.as_subclass(torch.Tensor).clone()
        raw[0, rng.randrange(e)] = n_src + rng.randrange(1, 5)
        ei = EdgeIndex(raw, sparse_size=(n_src + 5, n_dst)).sort_by("col")[0]
    try:
        gnnfuse.fused_gather_scatter(torch.randn(n_src, 2), ei, num_nodes=n_dst)
    except ERRORS:
        outcomes["raised"] += 1
print(outcomes)
"""


def test_fuzz_corrupted_hand_built_graphs():
    pytest.importorskip("torch_geometric")
    out = run_isolated(FUZZ.replace("SEED", "1234").replace("TRIALS", "300"))
    assert "raised" in out and "matched" in out


def test_pyg_edge_index_is_cached_on_its_data():
    pyg = pytest.importorskip("torch_geometric")
    from gnnfuse import _tensor_cache

    clear_cache()
    data = random_graph(12, 12, 60, seed=12)
    ei = pyg.EdgeIndex(data, sparse_size=(12, 12)).sort_by("col")[0]
    x = torch.randn(12, 3)
    first = gnnfuse.fused_gather_scatter(x, ei)
    assert len(_tensor_cache._entries) == 1  # keyed on the wrapped data (the wrapper has no storage)
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, ei), first)
    assert len(_tensor_cache._entries) == 1


def test_hand_built_csr_is_checked_inside_a_compiled_graph():
    edge_index = torch.tensor([[0, 1, 2, 2, 3], [1, 2, 0, 1, 3]])
    good = CSR.from_edge_index(edge_index, 4, index_dtype=torch.int64)
    compiled = torch.compile(lambda x, csr: gnnfuse.fused_gather_scatter(x, csr, "sum"), fullgraph=True)
    x = torch.randn(4, 3, requires_grad=True)
    hand = CSR(good.rowptr.clone(), good.col.clone(), good.perm.clone(), 4)  # never validated eagerly
    out = compiled(x, hand)
    out.sum().backward()
    torch.testing.assert_close(out, gnnfuse.fused_gather_scatter(x, good))
    bad = CSR(good.rowptr.clone(), torch.tensor([0, 1, 99, 2, 3]), good.perm.clone(), 4)
    with pytest.raises(RuntimeError, match="CSR.col has a node id outside"):  # a device-side assertion
        compiled(x, bad)
    # structure checked eagerly by an unweighted call, perm never read: not trusted, so compiled
    # code that reads perm still checks it
    half = CSR(good.rowptr.clone(), good.col.clone(), torch.zeros_like(good.perm), 4)
    gnnfuse.fused_gather_scatter(x, half)
    weighted = torch.compile(lambda x, csr, w: gnnfuse.fused_gather_scatter(x, csr, "sum", edge_weight=w),
                             fullgraph=True)
    with pytest.raises(RuntimeError, match="CSR.perm is not a permutation"):
        weighted(x, half, torch.rand(5))


# ---- device-side assertions: torch's private async assert inside its version fence, a plain check outside
@pytest.mark.parametrize("fenced_out", [False, True])
def test_device_assert_both_paths(monkeypatch, fenced_out):
    from gnnfuse import _validate

    if fenced_out:
        monkeypatch.setattr(_validate, "_ASSERT_ASYNC", None)
    _validate.device_assert(torch.tensor(True), "fine")
    with pytest.raises((RuntimeError, ValueError), match="must be positive"):
        _validate.device_assert(torch.tensor(False), "sigma must be positive")
    # the hand-built CSR check that compiled graphs use goes through it too
    from gnnfuse import reference

    with pytest.raises((RuntimeError, ValueError), match="rowptr"):
        reference.assert_valid_csr(torch.tensor([0, 2, 1]), torch.tensor([0, 1]), torch.tensor([0, 1]), 2)
