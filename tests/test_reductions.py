"""The reduce-name table: aliases, errors, and agreement with the C++ header."""
import re
from pathlib import Path

import pytest
import torch

import gnnfuse
from gnnfuse import reductions
from gnnfuse.reductions import canonical_reduce

HEADER = Path(__file__).resolve().parent.parent / "csrc" / "reduce_codes.h"


def test_header_codes_agree_with_python_table():
    found = dict(re.findall(r"constexpr int k(\w+) = (\d+);", HEADER.read_text()))
    assert {name.lower(): int(code) for name, code in found.items()} == reductions.CODES


def test_triton_codes_agree():
    pytest.importorskip("triton")
    from gnnfuse.triton import gather_scatter_fwd_kernels as k

    assert all(k._CODES[n] == reductions.CODES[n] for n in k._CODES)


@pytest.mark.parametrize("alias,name", [("add", "sum"), ("amax", "max"), ("amin", "min"), ("prod", "mul"),
                                        ("mean", "mean")])
def test_aliases(alias, name):
    assert canonical_reduce(alias) == name


def test_error_names_argument_and_aliases():
    with pytest.raises(ValueError, match=r"aggr must be one of .*'sum'.*alias.*'add'.*got 'median'"):
        canonical_reduce("median", argument="aggr")
    with pytest.raises(ValueError, match="reduce must be one of"):
        canonical_reduce("std")  # multi-aggregation only
    assert canonical_reduce("std", reductions.MULTI) == "std"
    with pytest.raises(ValueError, match="got 3"):
        canonical_reduce(3)


@pytest.mark.parametrize("alias", ["add", "amax", "amin", "prod"])
def test_fused_gather_scatter_takes_aliases(alias):
    x = torch.randn(4, 3)
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 1, 0]])
    want = gnnfuse.fused_gather_scatter(x, ei, canonical_reduce(alias), backend="reference")
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, ei, alias, backend="reference"), want)
    torch.testing.assert_close(gnnfuse.fused_gather_scatter(x, ei, alias), want)
