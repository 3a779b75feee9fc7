"""The Triton attention forwards' one launch (gnnfuse/triton/attention_forward_kernels.py): row groups
and pieces of long rows side by side in one task list, split rows merged afterwards, vector loads
(head widths that are powers of two) and run-time widths, head blocks that do not divide the heads:
outputs and gradients against the reference, in the interpreter on CPU (tiny graphs)."""
from __future__ import annotations

import pytest
import torch

import test_attention as gat
import test_pair_attention as pair
from gnnfuse import CSR

HUB = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 3], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]])


def hub_graph():
    """test_attention's graph plus an in-hub and an out-hub at node 4 (12 + edges)."""
    return CSR.from_edge_index(torch.cat([gat.graph(), HUB, HUB.flip(0)], 1), gat.N)


def force(monkeypatch, **over):
    """The one-pass forward's config with ``over`` forced (hb, rows, warps, seg, short_max)."""
    from gnnfuse.triton import attention as kernels

    default = kernels._one_pass_config
    monkeypatch.setattr(kernels, "_one_pass_config", lambda *args, **kw: {**default(*args, **kw), **over})


# (forced config, what it exercises): pieces of 3 edges with row groups of 2 rows (groups, whole-row
# pieces and split rows in one launch); every row a piece (no row groups); every row in a row group
CONFIGS = [dict(rows=2, seg=3, short_max=2), dict(rows=4, seg=4, short_max=-1), dict(rows=4, seg=64, short_max=64)]


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("self_loops,edge,loop,dropout", [(False, True, False, 0.0), (True, True, True, 0.4)])
def test_gat_one_pass_matches_reference(monkeypatch, cfg, self_loops, edge, loop, dropout):
    from gnnfuse.triton import attention as kernels

    force(monkeypatch, **cfg)
    csr = hub_graph()
    plan = kernels._one_pass_plan(csr.rowptr, csr.col, gat.N, gat.H, gat.F, 8)
    assert (plan.short.numel() > 0) == (cfg["short_max"] >= 0)  # row groups
    assert (plan.wl.split_rows.numel() > 0) == (cfg["seg"] < 12)  # split rows (the hub's 12 edges)
    ins = gat.inputs(edge=edge, loop=loop, num_edges=csr.num_edges)
    gat.assert_matches_reference(ins, csr, "triton", add_self_loops=self_loops, dropout=dropout, seed=11)


@pytest.mark.parametrize("cfg", CONFIGS[:2])
@pytest.mark.parametrize("mode", ["gatv2", "dot+edge"])
def test_pair_one_pass_matches_reference(monkeypatch, cfg, mode):
    force(monkeypatch, **cfg)
    pair.assert_matches_reference(mode, pair.inputs(mode), hub_graph(), "triton", add_self_loops=True, dropout=0.3,
                                  seed=8)


@pytest.mark.parametrize("width", [4, 5])  # a power of two (vector loads) and not
def test_head_blocks_not_dividing_the_heads(monkeypatch, width):
    """3 heads in blocks of 2 (the second block half masked), widths with and without DENSE."""
    force(monkeypatch, hb=2, rows=2, seg=3, short_max=2)
    monkeypatch.setattr(gat, "F", width)
    csr = hub_graph()
    ins = gat.inputs(num_edges=csr.num_edges)
    assert ins["x"].shape[1:] == (3, width)
    gat.assert_matches_reference(ins, csr, "triton", add_self_loops=True, dropout=0.2, seed=3)


def test_forward_is_deterministic(monkeypatch):
    force(monkeypatch, rows=2, seg=3, short_max=2)
    csr = hub_graph()
    ins = {k: v.detach() if v is not None else None for k, v in gat.inputs(dtype=torch.float32).items()}
    first, _ = gat.run(ins, csr, "triton", add_self_loops=True, dropout=0.3, seed=4)
    second, _ = gat.run(ins, csr, "triton", add_self_loops=True, dropout=0.3, seed=4)
    assert torch.equal(first, second)
