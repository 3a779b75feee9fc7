"""gnnfuse.gatv2_attention and gnnfuse.dot_attention (the gnnfuse::pair_attention op): C++ and Triton
kernels against the reference (outputs and every gradient), hub-row splitting, registration
(opcheck, gradcheck, compile), argument errors."""
from __future__ import annotations

import pytest
import torch

from gnnfuse import CSR
from gnnfuse.ops.pair_attention import dot_attention, gatv2_attention
from gnnfuse.testing import TOLERANCES

from test_attention import BACKENDS, E, N, force_small_row_groups, graph, on

H, F = 3, 4
MODES = ["gatv2", "dot"]
EDGE_MODES = ["gatv2+edge", "dot+edge"]  # with projected edge features [E (+ loops), H, F]
E_ROW_MODES = ["gatv2+edgeE", "dot+edgeE"]  # edge features [E, H, F] alone: the self loops get no edge term
MAX_EDGES = 80  # edge_attr rows made; each call uses the first E (+ self loops)


def inputs(mode, dtype=torch.float64, num_src=N, num_dst=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_()  # noqa: E731
    if mode.startswith("gatv2"):
        ins = dict(x_src=make(num_src, H, F), x_dst=make(num_dst, H, F), att=make(H, F))
    else:
        ins = dict(query=make(num_dst, H, F), key=make(num_src, H, F), value=make(num_src, H, F))
    if "+edge" in mode:
        ins["edge_attr"] = make(MAX_EDGES, H, F)
    return ins


def call(mode, ins, graph_, **kw):
    if "edge_attr" in ins:  # E rows, plus one per self loop (the layers' order)
        first = ins["x_src"] if mode.startswith("gatv2") else ins["key"]
        last = ins["x_dst"] if mode.startswith("gatv2") else ins["query"]
        num_edges = graph_.num_edges if isinstance(graph_, CSR) else graph_.shape[1]
        loops = min(first.shape[0], last.shape[0]) if kw.get("add_self_loops") and not mode.endswith("E") else 0
        kw["edge_attr"] = ins["edge_attr"][:num_edges + loops]
    if mode.startswith("gatv2"):
        return gatv2_attention(ins["x_src"], ins["x_dst"], ins["att"], graph_, negative_slope=0.15, **kw)
    return dot_attention(ins["query"], ins["key"], ins["value"], graph_, **kw)


def run(mode, ins, graph_, backend, **kw):
    dev = on(backend)
    ins = {k: v.detach().to(dev).requires_grad_() for k, v in ins.items()}
    out = call(mode, ins, graph_.to(dev), backend=backend, **kw)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=dev).view_as(out)
    grads = torch.autograd.grad((out * weight).sum(), list(ins.values()))
    return out.cpu(), [g.cpu() for g in grads]


def assert_matches_reference(mode, ins, graph_, backend, dtype=torch.float64, **kw):
    out, grads = run(mode, ins, graph_, backend, **kw)
    ref_out, ref_grads = run(mode, {k: v.detach().double() for k, v in ins.items()}, graph_, "reference", **kw)
    atol, rtol = TOLERANCES[dtype]
    if dtype == torch.float64 and backend == "triton":
        atol = rtol = 1e-6  # Triton passes the slope, scale and dropout scale as float32 scalars
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=rtol)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.double(), r, atol=atol * 4, rtol=rtol * 4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES + EDGE_MODES + E_ROW_MODES)
@pytest.mark.parametrize("self_loops,dropout", [(False, 0.0), (True, 0.0), (True, 0.4)])
def test_matches_reference(backend, mode, self_loops, dropout):
    assert_matches_reference(mode, inputs(mode), graph(), backend, add_self_loops=self_loops, dropout=dropout,
                             seed=321)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES + EDGE_MODES + E_ROW_MODES)
def test_bipartite_empty_rows_and_half_types(backend, mode):
    ei = graph(num_src=N, num_dst=6)
    ei = ei[:, ei[1] < 4]  # rows 4 and 5 empty
    assert_matches_reference(mode, inputs(mode, num_dst=6), ei, backend, add_self_loops=True, dropout=0.2, seed=4)
    for dtype in (torch.float32, torch.bfloat16):
        assert_matches_reference(mode, inputs(mode, dtype), graph(torch.int32), backend, dtype, add_self_loops=True)


@pytest.mark.parametrize("mode", MODES + EDGE_MODES + E_ROW_MODES)
def test_triton_splits_hub_rows(monkeypatch, mode):
    from gnnfuse.triton import attention as kernels
    from gnnfuse.triton import pair_attention

    monkeypatch.setattr(kernels, "SPLIT_EDGES", 2)
    monkeypatch.setattr(pair_attention, "ATT_SLOTS", 3)  # each row-pass program walks many pieces
    hub = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 3], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]])
    csr = CSR.from_edge_index(torch.cat([graph(), hub, hub.flip(0)], 1), N)
    assert kernels._work(csr.rowptr).split_rows.numel() > 1
    assert_matches_reference(mode, inputs(mode), csr, "triton", add_self_loops=True, dropout=0.3, seed=8)


@pytest.mark.parametrize("mode", ["gatv2", "dot+edge"])
def test_triton_row_groups_next_to_pieces(monkeypatch, mode):
    csr = CSR.from_edge_index(graph(), N)
    force_small_row_groups(monkeypatch, csr, H, F)
    assert_matches_reference(mode, inputs(mode), csr, "triton", add_self_loops=True, dropout=0.3, seed=8)


def test_cpu_and_triton_agree_on_the_dropout_mask():
    ins = inputs("gatv2", torch.float32)
    outs = [run("gatv2", ins, graph(), b, add_self_loops=True, dropout=0.5, seed=77)[0] for b in BACKENDS]
    torch.testing.assert_close(outs[0], outs[1])


@pytest.mark.parametrize("mode", MODES + EDGE_MODES + E_ROW_MODES)
def test_gradcheck(mode):
    ins = inputs(mode)
    names = list(ins)

    def fn(*tensors):
        return call(mode, dict(zip(names, tensors)), graph(), add_self_loops=True, dropout=0.3, seed=5)

    assert torch.autograd.gradcheck(fn, tuple(ins.values()), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", MODES + EDGE_MODES + E_ROW_MODES)
def test_opcheck(mode):
    ins = inputs(mode, torch.float32)
    csr = CSR.from_edge_index(graph(), N)
    gatv2 = mode.startswith("gatv2")
    if gatv2:
        q, k, v, att = ins["x_dst"], ins["x_src"], ins["x_src"], ins["att"]
    else:
        q, k, v, att = ins["query"], ins["key"], ins["value"], None
    rows = csr.num_edges if mode.endswith("E") else csr.num_edges + N
    edge = ins["edge_attr"][:rows].detach().requires_grad_() if "edge_attr" in ins else None
    perm = csr.perm if edge is not None else None
    args = (q, k, v, att, edge, csr.rowptr, csr.col, perm, *csr.transpose_parts(), True, gatv2, 0.2, 0.5, 0.25, 3)
    torch.library.opcheck(torch.ops.gnnfuse.pair_attention, args)


def test_torch_compile_fullgraph_dynamic():
    ins = inputs("dot", torch.float32)
    csr = CSR.from_edge_index(graph(), N)

    @torch.compile(fullgraph=True, dynamic=True)
    def f(q, k, v):
        return dot_attention(q, k, v, csr, seed=1, dropout=0.1).sum()

    expected = dot_attention(ins["query"], ins["key"], ins["value"], csr, seed=1, dropout=0.1).sum()
    torch.testing.assert_close(f(ins["query"], ins["key"], ins["value"]), expected)


@pytest.mark.parametrize("bad,match", [
    (dict(att=torch.zeros(2, F)), "att"),
    (dict(x_dst=torch.zeros(N, H, F + 1)), "x_dst"),
    (dict(dropout=1.0), "dropout"),
    (dict(seed=-1), "seed"),
])
def test_errors_name_the_argument(bad, match):
    ins = {k: v.detach() for k, v in inputs("gatv2", torch.float32).items()}
    kw = {k: bad.pop(k) for k in ("dropout", "seed") if k in bad}
    ins.update(bad)
    with pytest.raises((ValueError, TypeError), match=match):
        gatv2_attention(ins["x_src"], ins["x_dst"], ins["att"], graph(), **kw)


@pytest.mark.parametrize("mode", MODES + EDGE_MODES + E_ROW_MODES + ["gat"])
def test_eager_route_and_registered_op_agree_bitwise(mode):
    """The OpDef eager route and the registered torch.library op (forced by a dispatch mode) give
    the same outputs and gradients, bit for bit, on the CPU kernels."""
    from gnnfuse.ops.attention import gat_attention
    from gnnfuse.testing import through_registered_op
    from test_attention import inputs as gat_inputs

    def once():
        if mode == "gat":
            ins = {k: v for k, v in gat_inputs(edge=True, loop=True).items()}
            out = gat_attention(ins["x"], ins["alpha_src"], ins["alpha_dst"], graph(), alpha_edge=ins["alpha_edge"],
                                alpha_loop=ins["alpha_loop"], add_self_loops=True, dropout=0.3, seed=2)
        else:
            ins = inputs(mode)
            out = call(mode, ins, graph(), add_self_loops=True, dropout=0.3, seed=2)
        return [out.detach(), *torch.autograd.grad(out.square().sum(), list(ins.values()))]

    eager = once()
    with through_registered_op():
        op = once()
    for a, b in zip(eager, op):
        assert torch.equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", EDGE_MODES)
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_edge_features_without_self_loop_rows(backend, mode, dropout):
    """With self loops, [E, H, F] edge features give the loops no edge term: the kernels read no row
    for them (no zero rows appended) and write no gradient row. Same output and real rows' gradients
    as the [E + loops] form with zero loop rows (to rounding: the C++ loops skip the term)."""
    ins = inputs(mode)
    csr = CSR.from_edge_index(graph(), N)
    ea = ins.pop("edge_attr").detach()[:E]
    padded = torch.cat([ea, ea.new_zeros(N, H, F)])
    got, want = ({**ins, "edge_attr": t} for t in (ea, padded))
    out, grads = run(mode.replace("+edge", "+edgeE"), got, csr, backend, add_self_loops=True, dropout=dropout, seed=6)
    ref_out, ref_grads = run(mode, want, csr, backend, add_self_loops=True, dropout=dropout, seed=6)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-9)
    assert grads[-1].shape == (E, H, F)
    ref_grads[-1] = ref_grads[-1][:E]
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-12, rtol=1e-9)


def test_edge_feature_rows_checked():
    ins = {k: v.detach() for k, v in inputs("dot+edge").items()}
    with pytest.raises(ValueError, match="edge_attr must have shape"):
        dot_attention(ins["query"], ins["key"], ins["value"], graph(), edge_attr=ins["edge_attr"][:E + 1])


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
@pytest.mark.parametrize("mode", EDGE_MODES + E_ROW_MODES)
def test_edge_features_in_csr_order(backend, mode):
    """The layers' internal form (ops.pair_attention._run(csr_edges=True)): edge rows already in CSR
    order (edge[perm], then the loops' rows) give the same output bit for bit, and the edge gradient
    in CSR order (the edge_index order's, permuted)."""
    from gnnfuse.ops import pair_attention as ops

    ins = inputs(mode, torch.float32)
    csr = CSR.from_edge_index(graph(), N)
    base = run(mode, ins, csr, backend, add_self_loops=True, dropout=0.3, seed=9)
    rows = E if mode.endswith("E") else E + N
    ea = ins["edge_attr"].detach()[:rows]
    in_csr = torch.cat([ea[:E][csr.perm.long()], ea[E:]])
    dev = on(backend) if backend != "reference" else "cpu"
    t = {k: v.detach().to(dev).requires_grad_() for k, v in ins.items()}
    t["edge_attr"] = in_csr.to(dev).requires_grad_()
    gatv2 = mode.startswith("gatv2")
    q, k, v = (t["x_dst"], t["x_src"], t["x_src"]) if gatv2 else (t["query"], t["key"], t["value"])
    out = ops._run(q, k, v, t.get("att"), t["edge_attr"], csr.to(dev), gatv2, 0.15, 0.5 if gatv2 else F ** -0.5,
                   0.3, 9, True, backend, csr_edges=True)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=dev).view_as(out)
    grads = [g.cpu() for g in torch.autograd.grad((out * weight).sum(), list(t.values()))]
    assert torch.equal(out.cpu(), base[0])
    want = base[1][-1][:rows]  # (the gradient of all MAX_EDGES rows made)
    want = torch.cat([want[:E][csr.perm.long()], want[E:]])
    for g, r in zip(grads, base[1][:-1] + [want]):
        torch.testing.assert_close(g, r, atol=0, rtol=0) if backend != "reference" else \
            torch.testing.assert_close(g, r)


@pytest.mark.parametrize("mode", MODES + ["dot+edge"])
def test_triton_backward_loads_and_tiles_agree(monkeypatch, mode):
    """The Triton backward's 16-byte loads (BACKWARD_DENSE) and edge-block cap (BACKWARD_EDGE_BLOCK,
    triton/pair_attention.py) give the previous kernels' gradients to rounding (the sums over
    features and edges in another order), and the same bits run to run."""
    from gnnfuse.triton import pair_attention

    ins = inputs(mode, torch.float32)
    runs = {}
    for dense, cap in ((False, None), (True, None), (True, 2), (True, 2)):
        monkeypatch.setattr(pair_attention, "BACKWARD_DENSE", dense)
        monkeypatch.setattr(pair_attention, "BACKWARD_EDGE_BLOCK", cap)
        runs.setdefault((dense, cap), []).append(run(mode, ins, graph(), "triton", add_self_loops=True, dropout=0.3,
                                                     seed=8)[1])
    ref = runs.pop((False, None))[0]
    first, again = runs.pop((True, 2))
    assert all(torch.equal(g, r) for g, r in zip(first, again))
    for grads in (first, runs.pop((True, None))[0]):
        for g, r in zip(grads, ref):
            torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", EDGE_MODES)
def test_edge_gradient_rows_all_written(backend, mode):
    """Without self loops the edge gradient comes from an uninitialised tensor (every row is written):
    with torch filling new memory with NaN, no NaN may be left; with self loops the graph's own loops
    (skipped) keep zero rows."""
    ins = inputs(mode)
    ei = torch.cat([graph(), torch.tensor([[2, 5], [2, 5]])], 1)  # two self loops of the graph's own
    prev = torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        for loops in (False, True):
            grads = run(mode, ins, ei, backend, add_self_loops=loops)[1]
            g_edge = grads[-1][:ei.shape[1]]
            assert not g_edge.isnan().any()
            if loops:
                csr = CSR.from_edge_index(ei, N)
                own = (ei[0] == ei[1]).nonzero().flatten()
                assert (g_edge[own] == 0).all() and csr.num_edges == ei.shape[1]
    finally:
        torch.use_deterministic_algorithms(prev[0])
        torch.utils.deterministic.fill_uninitialized_memory = prev[1]
