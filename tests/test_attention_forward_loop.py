"""The Triton attention forwards' loop table (attention_forward_kernels.FORWARD_LOOP): issuing a step's loads one or two
steps ahead of its softmax maths changes when values arrive, not the maths, so every load order gives
the same bits (outputs and the saved row max and sum the backward reads), with dropout, edge terms,
self loops, row groups and split rows; and the table's order, register cap and rows reach the launch
for each path (float32 or half, with or without dropout; kernels with edge terms or float64 keep the
loop as it was).
Tiny graphs: in the interpreter on CPU, compiled on a GPU machine (more shapes there:
benchmarks/gpu/check_attention.py --ahead N)."""
from __future__ import annotations

import pytest
import torch

import test_attention as gat
import test_pair_attention as pair
from test_attention_forward import CONFIGS, force, hub_graph

from gnnfuse.triton import attention as kernels
from gnnfuse.triton import pair_attention as pair_kernels

DEVICE = gat.TRITON_DEVICE  # the Triton kernels are called directly: CPU tensors only in the interpreter


def _every_order_agrees(monkeypatch, forward):
    monkeypatch.setattr(kernels, "FORWARD_AHEAD", 0)
    base = forward()
    for ahead in (1, 2):
        monkeypatch.setattr(kernels, "FORWARD_AHEAD", ahead)
        for name, a, b in zip(("out", "row max", "row sum"), base, forward()):
            assert torch.equal(a, b), f"load order {ahead}: {name} differs from order 0"


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[2]])  # groups, whole-row and split pieces; groups only
def test_gat_load_orders_give_the_same_bits(monkeypatch, cfg):
    force(monkeypatch, **cfg)
    csr = hub_graph()
    raw = gat.inputs(edge=True, loop=True, num_edges=csr.num_edges)
    ins = {k: v.detach().float().to(DEVICE) for k, v in raw.items()}
    csr = csr.to(DEVICE)
    _every_order_agrees(monkeypatch, lambda: kernels.forward(
        ins["x"], ins["alpha_src"], ins["alpha_dst"], ins["alpha_edge"], ins["alpha_loop"], csr.rowptr, csr.col,
        *csr.transpose_parts(), True, 0.2, 0.4, 11))


@pytest.mark.parametrize("mode", ["gatv2+edge", "dot+edge"])
def test_pair_load_orders_give_the_same_bits(monkeypatch, mode):
    force(monkeypatch, **CONFIGS[0])
    csr = hub_graph()
    ins = {k: v.detach().float().to(DEVICE) for k, v in pair.inputs(mode).items()}
    edge = ins["edge_attr"][:csr.num_edges + pair.N]
    csr = csr.to(DEVICE)
    if mode.startswith("gatv2"):  # the values are the keys (one gather for both)
        q, k, v, att = ins["x_dst"], ins["x_src"], ins["x_src"], ins["att"]
    else:
        q, k, v, att = ins["query"], ins["key"], ins["value"], None
    _every_order_agrees(monkeypatch, lambda: pair_kernels.forward(
        q, k, v, att, edge, csr.rowptr, csr.col, csr.perm, *csr.transpose_parts(), True, mode.startswith("gatv2"),
        0.2, 0.35, 0.3, 7))


def test_loop_table_reaches_the_launch():
    csr = hub_graph()
    for heads, width in ((8, 8), (4, 64)):
        x = torch.zeros(gat.N, heads, width)
        flags = (("HAS_EDGE", False), ("HAS_LOOP_TERM", False), ("SELF_LOOPS", True))
        for logit, kernel, setup_flags, is_pair in (
                ("gat", kernels._forward_one_pass_kernel, flags, False),
                ("gatv2", None, (("GATV2", True),), True), ("dot", None, (("GATV2", False),), True)):
            for features, dropout, paths in (
                    (x, False, ("float32",)), (x, True, ("float32-dropout",)), (x.bfloat16(), False, ("half",)),
                    (x.bfloat16(), True, ("half-dropout",)), (x.half(), False, ("float16", "half")),
                    (x.half(), True, ("float16-dropout", "half-dropout"))):  # float16: its own entry, else half's
                setup = kernels.forward_setup(f"loop-table-{logit}", kernel, features, csr.rowptr, csr.col,
                                              setup_flags + (("DROPOUT", dropout),), is_pair)
                keys = [(width <= 16, logit, path) for path in paths]
                entry = next((kernels.FORWARD_LOOP[k] for k in keys if k in kernels.FORWARD_LOOP), (0, 0, 0))
                ahead, cap, rows, hb = (*entry, 0)[:4]
                hb = hb or kernels._one_pass_config(heads, width, is_pair)["hb"]
                tile_rows = rows or kernels._one_pass_rows(hb, width)  # (widths here: powers of two)
                got = setup.meta["AHEAD"], setup.meta.get("maxnreg", 0), setup.meta["R"], setup.meta["HB"]
                assert got == (ahead, cap, tile_rows, hb), (heads, width, logit, paths)
            # the pair kernels' float32 edge features without dropout: their own entry
            base = tuple((k, v) for k, v in setup_flags if k != "HAS_EDGE")
            edge = (("HAS_EDGE", True),)
            if is_pair:
                setup = kernels.forward_setup(f"loop-table-{logit}", kernel, x, csr.rowptr, csr.col,
                                              base + edge + (("DROPOUT", False),), is_pair)
                ahead = kernels.FORWARD_LOOP.get((width <= 16, logit, "float32-edge"), (0,))[0]
                assert setup.meta["AHEAD"] == ahead and "maxnreg" not in setup.meta, (heads, width, logit)
            # GAT's edge terms with the self loops' terms in float32 (GATConv with edge_dim): their own entries
            if not is_pair:
                for dropout in (False, True):
                    flags_el = (("HAS_EDGE", True), ("HAS_LOOP_TERM", True), ("SELF_LOOPS", True), ("DROPOUT", dropout))
                    setup = kernels.forward_setup(f"loop-table-{logit}", kernel, x, csr.rowptr, csr.col, flags_el)
                    path = "float32-edge-loop" + ("-dropout" if dropout else "")
                    ahead, cap, rows = kernels.FORWARD_LOOP.get((width <= 16, logit, path), (0, 0, 0))[:3]
                    got = setup.meta["AHEAD"], setup.meta.get("maxnreg", 0), setup.meta["R"]
                    assert got == (ahead, cap, rows or kernels._one_pass_config(heads, width)["rows"]), (width, path)
            # GAT's edge terms without the loops', the other edge-feature paths and float64 keep the plain loop and
            # the tile's rows
            plain = [(x.double(), (("DROPOUT", False),)), (x, edge + (("DROPOUT", True),)),
                     (x.bfloat16(), edge + (("DROPOUT", False),))]
            if not is_pair:
                plain.append((x, edge + (("DROPOUT", False),)))
            for features, more in plain:
                setup = kernels.forward_setup(f"loop-table-{logit}", kernel, features, csr.rowptr, csr.col,
                                              base + more, is_pair)
                assert setup.meta["AHEAD"] == 0 and "maxnreg" not in setup.meta
                assert setup.meta["R"] == kernels._one_pass_config(heads, width, is_pair)["rows"]


def test_loop_entry_heads_stay_within_the_layer_and_the_tile():
    """A table entry's HEADS takes no more heads than the layer has, and none past 256 columns."""
    entry = (1, 0, 8, 4)
    assert kernels._one_pass_config(4, 64, True, entry)["hb"] == 4
    assert kernels._one_pass_config(1, 64, True, entry)["hb"] == 1
    assert kernels._one_pass_config(4, 128, True, entry)["hb"] == kernels._one_pass_config(4, 128, True)["hb"]
