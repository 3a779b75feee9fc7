"""The pair forward's SPLIT loop (gnnfuse/triton/pair_forward_split.py; FORWARD_LOOP's fifth element): GATv2 and
the dot product with dropout and self loops give the 3D loop's results (close; on an H100 most of these shapes and
the 4 x 64 half-type entry's row groups kept the bits, see pair_forward_split.py), match the reference with row
groups and split rows, and the loop runs only where split_for says it applies.
Tiny graphs: in the interpreter on CPU, compiled on a GPU machine."""
from __future__ import annotations

import pytest
import torch

import test_attention as gat
import test_pair_attention as pair
from test_attention_forward import force, hub_graph

from gnnfuse.triton import attention as kernels
from gnnfuse.triton import pair_attention as pair_kernels
from gnnfuse.triton.pair_forward_split import split_for

DEVICE = gat.TRITON_DEVICE

GROUPS = dict(rows=8, seg=64, short_max=64, warps=1)  # every row in a row group
PIECES = dict(rows=8, seg=3, short_max=2, warps=1)  # row groups, whole-row pieces and split rows


def _forward(mode, ins, csr, dropout=0.3, slope=0.2):
    if mode == "gatv2":  # the values are the keys (one gather for both)
        q, k, v, att = ins["x_dst"], ins["x_src"], ins["x_src"], ins["att"]
    else:
        q, k, v, att = ins["query"], ins["key"], ins["value"], None
    flags = pair_kernels._flags(k, v, True, mode == "gatv2", dropout, None, None, csr.num_edges)
    split = kernels.forward_setup("split-test", None, k, csr.rowptr, csr.col, flags, pair=True).meta["SPLIT"]
    out = pair_kernels.forward(q, k, v, att, None, csr.rowptr, csr.col, None, *csr.transpose_parts(), True,
                               mode == "gatv2", slope, 0.35, dropout, 7)
    return split, out


@pytest.mark.parametrize("mode", ["gatv2", "dot"])
@pytest.mark.parametrize("width,dtype", [(8, torch.float32), (16, torch.float32), (16, torch.bfloat16)])
@pytest.mark.parametrize("cfg", [GROUPS, PIECES])
def test_split_loop_gives_the_3d_loop_results(monkeypatch, mode, width, dtype, cfg):
    monkeypatch.setattr(pair, "F", width)
    csr = hub_graph().to(DEVICE)
    ins = {k: v.detach().to(dtype).to(DEVICE) for k, v in pair.inputs(mode).items()}
    got = {}
    for split in (1, 2):
        force(monkeypatch, **cfg, split=split)
        got[split] = _forward(mode, ins, csr)
    assert got[1][0] == 1 and got[2][0] == 2  # the SPLIT loop ran
    for name, a, b in zip(("out", "row max", "row sum"), got[1][1], got[2][1]):
        # close, not equal: the interpreter's sums take numpy's order, and on an H100 float32 GATv2 at 16 features
        # differed in the last bit (the compiler fuses another product of a thread's sum into an FMA); bfloat16
        # outputs round once more
        tol = dict(atol=2e-6, rtol=2e-5) if dtype == torch.float32 or name != "out" else dict(atol=8e-3, rtol=8e-3)
        torch.testing.assert_close(a.float(), b.float(), **tol, msg=name)


@pytest.mark.parametrize("slope", [0.0, -0.5, 1.0, 2.5])
def test_split_gatv2_logit_holds_for_any_slope(monkeypatch, slope):
    """_logit5's GATv2 form (slope (a . k) + (1 - slope) (a . max(k, -q)) + a . q) against the 3D loop's
    a . leaky_relu(k + q), slopes of either sign and above 1 included."""
    monkeypatch.setattr(pair, "F", 8)
    csr = hub_graph().to(DEVICE)
    ins = {k: v.detach().float().to(DEVICE) for k, v in pair.inputs("gatv2").items()}
    got = {}
    for split in (1, 2):
        force(monkeypatch, **GROUPS, split=split)
        got[split] = _forward("gatv2", ins, csr, dropout=0.0, slope=slope)
    assert got[2][0] == 2
    for name, a, b in zip(("out", "row max", "row sum"), got[1][1], got[2][1]):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=2e-5, msg=name)


@pytest.mark.parametrize("mode", ["gatv2", "dot"])
@pytest.mark.parametrize("cfg", [GROUPS, PIECES])
def test_split_loop_matches_reference(monkeypatch, mode, cfg):
    monkeypatch.setattr(pair, "F", 8)  # float64 compute in float32 features: 16-byte vectors of 4, T = 1
    force(monkeypatch, **cfg, split=2)
    assert _forward(mode, {k: v.detach().float().to(DEVICE) for k, v in pair.inputs(mode).items()},
                    hub_graph().to(DEVICE))[0] == 2
    pair.assert_matches_reference(mode, {k: v.detach().float() for k, v in pair.inputs(mode).items()}, hub_graph(),
                                  "triton", dtype=torch.float32, add_self_loops=True, dropout=0.3, seed=8)


@pytest.mark.parametrize("mode", ["gatv2", "dot"])
@pytest.mark.parametrize("width,dtype,split", [(64, torch.bfloat16, 2), (32, torch.float32, 2), (24, torch.bfloat16, 1)])
def test_wide_loop_table_entries_match_reference(monkeypatch, mode, width, dtype, split):
    """The wide pair paths' FORWARD_LOOP entries as the launch takes them (nothing forced), with dropout: the SPLIT
    loop at power-of-two widths, and at a wide width that is not one (24 features: no 16-byte loads) the 3D loop
    with the entry's rows (the half-type dot's 16), outputs and gradients against the float64 reference."""
    monkeypatch.setattr(pair, "F", width)
    ins, csr = pair.inputs(mode, dtype), hub_graph()
    k, on_device = (ins["x_src"] if mode == "gatv2" else ins["key"]).detach().to(DEVICE), csr.to(DEVICE)
    flags = pair_kernels._flags(k, k, True, mode == "gatv2", 0.3, None, None, csr.num_edges)
    setup = kernels.forward_setup("wide-table", None, k, on_device.rowptr, on_device.col, flags, pair=True)
    assert setup.meta["SPLIT"] == split
    pair.assert_matches_reference(mode, ins, csr, "triton", dtype, add_self_loops=True, dropout=0.3, seed=5)


def test_split_for_applies_only_where_the_loop_fits():
    plain = (("HAS_EDGE", False),)
    assert split_for(2, 64, 64, 4, 8, 4, 2, plain) == 2  # wide GATv2, half types: 4 threads x 8 rows x 4 heads
    assert split_for(2, 64, 64, 2, 8, 4, 4, plain) == 2  # float32: 8 threads x 8 rows x 2 heads
    assert split_for(1, 64, 64, 4, 8, 4, 2, plain) == 1  # not asked for
    assert split_for(2, 64, 64, 4, 8, 4, 2, (("HAS_EDGE", True),)) == 1  # edge features: the 3D loop
    assert split_for(2, 48, 64, 4, 8, 4, 2, plain) == 1  # no 16-byte loads (F not a power of two)
    assert split_for(2, 8, 8, 4, 16, 4, 2, plain) == 1  # a head narrower than 2 vectors
    assert split_for(2, 64, 64, 2, 8, 4, 2, plain) == 1  # too few lanes: the SPLIT axis would span threads
    assert split_for(2, 64, 64, 2, 8, 2, 2, plain) == 2  # (enough for 2 warps)


def test_loop_table_split_reaches_the_launch():
    """The wide GATv2 half-dropout entry's SPLIT reaches the launch; other pair paths keep the 3D loop."""
    csr = hub_graph()
    x = torch.zeros(gat.N, 4, 64, dtype=torch.bfloat16)
    for dtype, dropout, gatv2 in ((torch.bfloat16, True, True), (torch.float16, True, True),
                                  (torch.bfloat16, False, True), (torch.float32, True, True),
                                  (torch.bfloat16, True, False)):
        flags = (("GATV2", gatv2), ("HAS_EDGE", False), ("DROPOUT", dropout))
        setup = kernels.forward_setup("split-table", None, x.to(dtype), csr.rowptr, csr.col, flags, True)
        entry = kernels._forward_loop(64, flags, True, dtype)
        want = (*entry, 0, 0)[4] or 1
        assert setup.meta["SPLIT"] == want, (dtype, dropout, gatv2)
    assert kernels.FORWARD_LOOP[(False, "gatv2", "half-dropout")][4:] == (2,)
