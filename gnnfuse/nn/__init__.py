"""PyTorch Geometric drop-in: fused message passing with PyG's results, parameters and state_dict.

Change one import line::

    from gnnfuse.nn import GCNConv, SAGEConv, GINConv, GraphConv   # was: torch_geometric.nn
    from gnnfuse.nn import GATConv, GINEConv                       # fused attention / edge messages

or convert a built model in place::

    model = gnnfuse.nn.fuse(model)      # swaps supported layers, keeps weights; see fuse()

or add the mixin to your own layer (its message must be ``x_j`` or ``x_j * edge_weight``)::

    class MyConv(gnnfuse.nn.FusedMessagePassing, torch_geometric.nn.MessagePassing): ...

The layers accept a plain ``edge_index``, a PyG ``EdgeIndex`` or a :class:`gnnfuse.CSR` (the
recommended form under ``torch.compile``). Anything the fused path cannot express (other
messages, aggregations, hooks, explain mode, ``flow="target_to_source"``, sparse adjacency
tensors) runs PyG's own code, unchanged. torch-geometric is imported on first use, so
``import gnnfuse`` works without it.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "FusedMessagePassing": "._mixin",
    "message_form": "._mixin",
    "GCNConv": "._layers",
    "SAGEConv": "._layers",
    "GINConv": "._layers",
    "GraphConv": "._layers",
    "gcn_norm_weights": "._layers",
    "GATConv": "._attention",
    "GINEConv": "._gine",
    "GATv2Conv": "._pair_attention",
    "TransformerConv": "._pair_attention",
    "fuse": "._fuse",
    "fusable": "._fuse",
    "PNAConv": "._pna",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name == "aggr":  # the submodule gnnfuse.nn.aggr: PyG's aggregation modules on gnnfuse kernels
        return importlib.import_module(".aggr", __name__)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gnnfuse.nn' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module, __name__), name)
    except ImportError as e:
        if "torch_geometric" in str(e):
            raise ImportError(
                f"gnnfuse.nn.{name} needs torch-geometric (>= 2.5): pip install 'gnnfuse[pyg]'"
            ) from e
        raise
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
