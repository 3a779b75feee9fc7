"""The one-node routes' launch setups kept on the graph's CSR (triton/attention_launches.node_setup) and the
bound launches' fast paths (triton/_launch.py: Triton's C launcher called directly, fenced to the Tritons it
was checked on; the alignment checked at the launch): a changed graph never meets a stale setup, each
dtype and width gets its own, and every path gives the same bits as the plain ones."""
from __future__ import annotations

import pytest
import torch

import gnnfuse
import gnnfuse.nn as G
from gnnfuse import CSR
from gnnfuse import _tensor_cache
from test_attention import N, graph, on
from test_pair_attention_layers import layer_run

LAYERS = {"gat": G.GATConv, "gatv2": G.GATv2Conv, "transformer": G.TransformerConv}
DEV = on("triton")


def _layer(name, dtype=torch.float64, heads=2):
    torch.manual_seed(1)
    layer = LAYERS[name](6, 4, heads=heads, dropout=0.3).to(dtype).to(DEV).train()
    layer.gnnfuse_backend = "triton"
    return layer


def _run(layer, x, ei):
    torch.manual_seed(7)  # the same dropout seed drawn
    return layer_run(layer, x, ei)


def _assert_same(run, ref):
    (out, grads), (ref_out, ref_grads) = run, ref
    assert torch.equal(out, ref_out)
    assert len(grads) == len(ref_grads) and all(torch.equal(g, r) for g, r in zip(grads, ref_grads) if r is not None)


def _node_setups(csr: CSR) -> dict:
    return {k: v for k, v in csr._derived.items() if isinstance(k, tuple)}


def _other_graph(seed=9):
    """A graph of the same node and edge counts as graph(), with other edges."""
    ei = graph()
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, N, (ei.shape[1],), generator=g), ei[1]])


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_node_setups_live_on_the_csr_and_go_with_an_in_place_change(name):
    layer = _layer(name)
    x = torch.randn(N, 6, dtype=torch.float64, device=DEV)
    csr = CSR.from_edge_index(graph().to(DEV), N)
    first = _run(layer, x, csr)
    setups = _node_setups(csr)
    assert len(setups) == 2  # the forward's and the backward's
    _assert_same(_run(layer, x, csr), first)
    assert all(csr._derived[k][1] is v[1] for k, v in setups.items())  # found again, not made again
    other = CSR.from_edge_index(_other_graph().to(DEV), N)
    for mine, theirs in zip((csr.rowptr, csr.col, csr.perm), (other.rowptr, other.col, other.perm)):
        mine.copy_(theirs)  # the same tensors, another graph
    changed = _run(layer, x, csr)
    assert not torch.equal(changed[0], first[0])
    _assert_same(changed, _run(layer, x, CSR.from_edge_index(_other_graph().to(DEV), N)))
    assert all(csr._derived[k][1] is not v[1] for k, v in setups.items() if k in csr._derived)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_an_edge_index_changed_in_place_gets_its_new_graph(name):
    layer = _layer(name)
    x = torch.randn(N, 6, dtype=torch.float64, device=DEV)
    ei = graph().to(DEV)
    first = _run(layer, x, ei)
    ei[0] = _other_graph()[0].to(DEV)
    changed = _run(layer, x, ei)
    assert not torch.equal(changed[0], first[0])
    _assert_same(changed, _run(layer, x, ei.clone()))


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_each_dtype_and_width_gets_its_own_setup(name):
    csr = CSR.from_edge_index(graph().to(DEV), N)
    seen = 0
    for dtype, heads in ((torch.float64, 2), (torch.float32, 2), (torch.float64, 3)):
        layer = _layer(name, dtype, heads)
        x = torch.randn(N, 6, dtype=dtype, device=DEV)
        _assert_same(_run(layer, x, csr), _run(layer, x, CSR.from_edge_index(graph().to(DEV), N)))
        assert len(_node_setups(csr)) == seen + 2
        seen += 2


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_direct_bound_and_plain_launches_agree_bitwise(name, monkeypatch):
    """The layers' step through the bound launches with Triton's C launcher called directly (where
    _launch.DIRECT_TRITON holds), through compiled.run (that fence off), and through Triton's plain
    launch (the fast path off): the same bits. Each run starts from fresh setups (cleared caches, a
    new graph tensor), so each binds its launches anew under its own settings. On the CPU CI (the
    interpreter) every run takes the plain path."""
    from gnnfuse.triton import _launch

    layer = _layer(name, torch.float32)
    x = torch.randn(N, 6, device=DEV)
    runs = []
    for direct, enabled in ((True, True), (False, True), (False, False)):
        with monkeypatch.context() as m:
            m.setattr(_launch, "_DIRECT", _launch._DIRECT and direct)
            m.setattr(_launch, "_ENABLED", _launch._ENABLED and enabled)
            _tensor_cache.clear()
            csr = CSR.from_edge_index(graph().to(DEV), N)
            runs.append(_run(layer, x, csr))
            if direct and enabled and DEV == "cuda" and _launch._DIRECT:  # the path under test was taken
                bound = [b for setup in _node_setups(csr).values() for b in setup[1].launch._bound.values()]
                assert bound and all(b.direct is not None for b in bound)
    for run in runs[1:]:
        _assert_same(run, runs[0])


def test_direct_launch_is_fenced_inside_the_fast_launch():
    """The direct C-launcher call (private launcher ABI) is fenced to its own checked Tritons, inside the
    fast launch's fence, and is off wherever the fast launch is."""
    from gnnfuse.triton import _launch

    low, high = _launch.DIRECT_TRITON
    assert _launch.TESTED_TRITON[0] <= low <= high <= _launch.TESTED_TRITON[1]
    assert _launch.tested_triton(f"{low[0]}.{low[1]}.0", _launch.DIRECT_TRITON)
    assert not _launch.tested_triton(f"{low[0]}.{low[1] - 1}.0", _launch.DIRECT_TRITON)
    assert not _launch.tested_triton(f"{high[0]}.{high[1] + 1}.0", _launch.DIRECT_TRITON)
    assert not _launch._DIRECT or _launch._ENABLED


def test_direct_launch_only_for_what_it_knows():
    """Anything but a compiled kernel of the checked Triton's CUDA launcher gets no direct call."""
    from types import SimpleNamespace

    from gnnfuse.triton import _launch

    assert _launch._direct_launch(SimpleNamespace()) is None
    assert _launch._direct_launch(SimpleNamespace(run=SimpleNamespace(global_scratch_size=0))) is None
    if not _launch.tested_triton(tested=_launch.DIRECT_TRITON):
        assert not _launch._DIRECT


@pytest.mark.parametrize("kind", ["gat", "dot"])
def test_misaligned_inputs_take_the_plain_launch_with_the_same_bits(kind):
    """A tensor off 16-byte alignment (a view at an odd offset) is found at the bound launch, which
    then hands the call to Triton's own path (compiled for it): the same numbers as an aligned copy."""
    g = torch.Generator().manual_seed(3)
    ei = graph().to(DEV)
    base = torch.randn(N * 2 * 4 + 1, generator=g).to(DEV)
    h = base[1:].view(N, 2, 4)  # 4 bytes off
    a = torch.randn(N, 2, generator=g).to(DEV)
    results = []
    for t in (h, h.clone()):
        for _ in range(2):  # the second call: a bound launch
            if kind == "gat":
                out = gnnfuse.gat_attention(t, a, a, ei, add_self_loops=True)
            else:
                out = gnnfuse.dot_attention(t, t, t, ei)
            results.append(out)
    assert all(torch.equal(r, results[0]) for r in results[1:])


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_without_a_memo_the_routes_give_the_same_bits(name, monkeypatch):
    """Where a CSR holds no stamps of its tensors (inference tensors on CUDA), node_memo gives None and the
    routes look their setups up in the setup cache, q / k / v and h still as [N, H*C]: the same results,
    and nothing kept on the CSR."""
    from gnnfuse.nn import _gat_node, _pair_node

    layer = _layer(name)
    x = torch.randn(N, 6, dtype=torch.float64, device=DEV)
    ref = _run(layer, x, CSR.from_edge_index(graph().to(DEV), N))
    monkeypatch.setattr(_gat_node, "node_memo", lambda csr: None)
    monkeypatch.setattr(_pair_node, "node_memo", lambda csr: None)
    csr = CSR.from_edge_index(graph().to(DEV), N)
    _assert_same(_run(layer, x, csr), ref)
    assert not _node_setups(csr)
