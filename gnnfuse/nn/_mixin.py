"""``FusedMessagePassing``: routes PyG's propagate through :func:`gnnfuse.fused_gather_scatter`.

The fused path runs when all of these hold (otherwise PyG's own ``propagate`` runs, unchanged):
  * the layer's ``message`` is ``x_j`` or ``x_j * edge_weight`` in one of its common spellings
    (see :func:`message_form`);
  * its aggregation is exactly PyG's Sum/Mean/Max/Min/MulAggregation and ``aggregate`` is not
    overridden; ``flow="source_to_target"``; none of the PyG features that live in its message
    path is active (explain mode, ``decomposed_layers``, propagate/message/aggregate hooks,
    forward hooks on ``aggr_module``, message/aggregate/update replaced on the instance), and the
    call is not being captured by ``torch.jit.trace`` or ONNX export (see gnnfuse/nn/_pyg_path.py);
  * ``edge_index`` is a plain [2, E] tensor, a PyG ``EdgeIndex`` or a :class:`gnnfuse.CSR`, and
    the node features are a tensor (or an ``(x_src, x_dst)`` pair) with nodes in dim 0.
A ``gnnfuse.CSR`` on the PyG path is turned back into an ``edge_index`` (original edge order), so
every layer accepts it. ``update`` is called as in PyG. Each (layer, reason) for taking PyG's path
is announced once with a ``UserWarning``. ``torch.jit.script`` of a fused layer scripts the stock
PyG layer it derives from (same parameters).

Semantics differences from stock PyG (documented, not bugs): max/min send each (row, feature)'s
gradient to one winning edge (the first in edge order among ties) where PyG's ``scatter_reduce``
splits it evenly among ties; sums are accumulated in CSR order, so float results differ from PyG
by rounding only.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn.aggr import (MaxAggregation, MeanAggregation, MinAggregation, MulAggregation,
                                    MultiAggregation, SumAggregation)
from torch_geometric.nn.conv import MessagePassing

from .. import config
from .._tensor_cache import cached
from ..csr import CSR, csr_for_edge_index
from ..ops.gather_scatter import fused_gather_scatter
from ._message_form import message_form
from ._pyg_path import _HOOK_DICTS  # noqa: F401  (re-exported: the attention layers check the same hooks)
from ._pyg_path import _is_template, instance_reason, pyg_propagate, scriptable_stock_copy, warn_pyg_path

REDUCE_OF_AGGR = {
    SumAggregation: "sum",
    MeanAggregation: "mean",
    MaxAggregation: "max",
    MinAggregation: "min",
    MulAggregation: "mul",
}


def _custom_propagate(cls: type) -> bool:
    """True if a class of ``cls``'s MRO (below MessagePassing) defines its own propagate."""
    for klass in cls.__mro__:
        if klass is MessagePassing:
            return False
        fn = klass.__dict__.get("propagate")
        if fn is not None and fn is not FusedMessagePassing.propagate and not _is_template(klass, fn):
            return True
    return False


def why_not_fused(module: MessagePassing) -> str | None:
    """None if the module's structure allows the fused path (inputs are checked per call), else why not."""
    cls = type(module)
    if message_form(cls) is None:
        return "message is not x_j or x_j * edge_weight"
    if fused_reduce(module.aggr_module) is None:
        return f"aggregation {module.aggr!r} is not sum/mean/max/min/mul or a concatenating multi-aggregation"
    if cls.aggregate is not MessagePassing.aggregate:
        return "custom aggregate()"
    if _custom_propagate(cls):
        return "custom propagate()"
    if cls.edge_update is not MessagePassing.edge_update:
        # attention-style layers compute the message weight per edge and head in edge_updater;
        # the fused op takes one weight per edge
        return "message weights from edge_updater (attention-style)"
    if module.flow != "source_to_target":
        return "flow='target_to_source'"
    return None


# ---- the mixin ---------------------------------------------------------------------------------
# The mixin is always combined with a MessagePassing subclass; type checkers see it as one.
_MixinBase = MessagePassing if TYPE_CHECKING else object


class FusedMessagePassing(_MixinBase):  # type: ignore[misc,valid-type]
    """Mixin for :class:`torch_geometric.nn.MessagePassing` subclasses: put it first in the bases.

    ``gnnfuse_backend`` (class or instance attribute, default "auto") is passed to
    :func:`gnnfuse.fused_gather_scatter`; ``gnnfuse_message`` declares the message form (see
    :func:`message_form`) where source inspection cannot see it.
    """

    gnnfuse_backend: str = "auto"
    _gnnfuse_form: tuple[str, str, str | None] | None
    _gnnfuse_custom_update: bool

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # PyG replaces a class's `propagate` by a generated template unless the class defines its
        # own; define ours on every subclass so that our propagate is the one that runs. PyG's
        # explain/decomposed_layers setters bind `_orig_propagate` / `_jinja_propagate` on the
        # instance: both must be ours too (a class converted by fuse() is never instantiated, and
        # would otherwise inherit the stock class's template, which ignores explain and decomposition).
        if "propagate" not in cls.__dict__:
            cls.propagate = FusedMessagePassing.propagate  # type: ignore[method-assign]
            cls._orig_propagate = cls._jinja_propagate = FusedMessagePassing.propagate
        cls._gnnfuse_form = message_form(cls)
        cls._gnnfuse_custom_update = cls.update is not MessagePassing.update

    def propagate(self, edge_index, size=None, **kwargs):
        plan = self._gnnfuse_plan(edge_index, size, kwargs)
        if isinstance(plan, str):
            if plan:
                warn_pyg_path(type(self).__name__, plan)
            return self._gnnfuse_fallback(edge_index, size, kwargs)
        x_src, weight, num_dst, reduce = plan

        def aggregate() -> Tensor:
            out = fused_gather_scatter(x_src, edge_index, reduce, edge_weight=weight, num_nodes=num_dst,
                                       backend=self.gnnfuse_backend)
            if reduce == "mul":  # PyG's product over no edges is 1, gnnfuse's is 0
                csr = edge_index if isinstance(edge_index, CSR) else _csr_of(edge_index, x_src.shape[0], num_dst)
                empty = (csr.in_degree() == 0).view(-1, *([1] * (out.dim() - 1)))
                out = torch.where(empty, torch.ones_like(out), out)
            return out

        if x_src.requires_grad or (weight is not None and weight.requires_grad):
            out = aggregate()
        else:  # a constant input (raw node features): the same result in every epoch
            sources = (x_src, *graph_tensors(edge_index)) + (() if weight is None else (weight,))
            key = (tuple(reduce) if isinstance(reduce, list) else reduce, num_dst, self.gnnfuse_backend)
            out = constant_result("aggregate", sources, key, aggregate)
        if self._gnnfuse_custom_update:
            out = self._gnnfuse_update(out, edge_index, size, kwargs)
        return out

    def __prepare_scriptable__(self):
        """``torch.jit.script`` scripts the stock PyG layer (same parameters; see scriptable_stock_copy)."""
        return scriptable_stock_copy(self)

    # ---- decisions ------------------------------------------------------------------------
    def _gnnfuse_why_pyg(self) -> str | None:
        """Why the layer, in its current state, runs PyG's propagate whatever the inputs (None: it need not)."""
        if self._gnnfuse_form is None:
            return "message is not x_j or x_j * edge_weight"
        if fused_reduce(self.aggr_module) is None:
            return f"aggregation {self.aggr!r} is not sum/mean/max/min/mul or a concatenating multi-aggregation"
        if type(self).aggregate is not MessagePassing.aggregate:
            return "custom aggregate()"
        if self.flow != "source_to_target":
            return "flow='target_to_source'"
        return instance_reason(self)

    def _gnnfuse_plan(self, edge_index, size, kwargs) -> tuple[Tensor, Tensor | None, int, str | list[str]] | str:
        """The fused call's (x_src, weight, num_dst, reduce), or why PyG's propagate runs instead
        ("" where PyG raises its own error for these inputs: no warning then)."""
        why = self._gnnfuse_why_pyg()
        if why is not None:
            return why
        if isinstance(edge_index, Tensor) and edge_index.layout != torch.strided:
            return "a torch.sparse adjacency (PyG's spmm path)"
        if not isinstance(edge_index, (Tensor, CSR)):
            return f"edge_index is a {type(edge_index).__name__}"
        kind, x_name, w_name = self._gnnfuse_form  # type: ignore[misc]  # not None: checked by _gnnfuse_why_pyg
        x = kwargs.get(x_name[:-2])
        x_src, x_dst = x if isinstance(x, (tuple, list)) and len(x) == 2 else (x, None)
        if not isinstance(x_src, Tensor) or not x_src.is_floating_point() or x_src.dim() < 1:
            return f"{x_name[:-2]} is not a floating-point tensor"
        if self.node_dim % x_src.dim() != 0:
            return "nodes are not in dim 0 of x (node_dim)"
        weight = kwargs.get(w_name) if w_name else None
        if kind == "x_j":
            weight = None
        elif weight is None:
            if kind == "x_j*w":
                return ""  # PyG raises its own error
        elif not isinstance(weight, Tensor) or weight.dim() != 1 or weight.dtype != x_src.dtype or x_src.dim() != 2:
            return f"{w_name} is not a 1-D weight of x's dtype, or x is not 2-D"  # broadcasting / type promotion
        num_src = x_src.shape[0]
        size_src, size_dst = size if size is not None else (None, None)
        if size_src is not None and size_src != num_src:
            return ""  # PyG raises its size error
        if isinstance(x_dst, Tensor):
            if size_dst is not None and size_dst != x_dst.shape[self.node_dim % x_dst.dim()]:
                return ""
            size_dst = x_dst.shape[self.node_dim % x_dst.dim()]
        if isinstance(edge_index, CSR):
            if size_dst is not None and size_dst != edge_index.num_dst:
                raise ValueError(f"{type(self).__name__}: size/x_dst give {size_dst} target nodes but the "
                                 f"gnnfuse.CSR has {edge_index.num_dst} rows")
            return x_src, weight, edge_index.num_dst, reduce_of(self)
        if isinstance(edge_index, EdgeIndex):
            rows, cols = edge_index.sparse_size()
            if rows is not None and rows != num_src:
                return ""
            if size_dst is None:
                size_dst = cols
        return x_src, weight, num_src if size_dst is None else size_dst, reduce_of(self)

    def _gnnfuse_fallback(self, edge_index, size, kwargs):
        if isinstance(edge_index, CSR):
            if size is None:
                size = (edge_index.num_src, edge_index.num_dst)
            edge_index = csr_to_edge_index(edge_index)
        return pyg_propagate(self, FusedMessagePassing.propagate)(self, edge_index, size=size, **kwargs)

    def _gnnfuse_update(self, out, edge_index, size, kwargs):
        if isinstance(edge_index, CSR):
            size = size or (edge_index.num_src, edge_index.num_dst)
            edge_index = csr_to_edge_index(edge_index)
        names = set(self.inspector.get_param_names("update"))
        if not names:
            return self.update(out)
        coll = self._collect(names, edge_index, self._check_input(edge_index, size), kwargs)
        return self.update(out, **self.inspector.collect_param_data("update", coll))


# ---- constant inputs ------------------------------------------------------------------------------
_computing = [0]  # > 0 while constant_result computes: aggregations inside it are not kept a second time


def constant_result(kind: str, sources: tuple[Tensor, ...], key: tuple, compute: Callable[[], Tensor]) -> Tensor:
    """``compute()``, kept across calls while its ``sources`` (input features, the graph's tensors,
    edge weights) stay unchanged and none of them needs a gradient.

    A layer's aggregation of raw node features gives the same result in every epoch of full-graph
    training (the dense layers around it change, it does not), yet would cost a whole gather-scatter
    pass per epoch. The result is kept from the *second* call with the same sources, so a one-off
    call (inference on fresh activations) holds no memory beyond its output. The entry lives in
    gnnfuse._tensor_cache: it dies with the first freed source, and a source changed in place (its
    stamp) or a returned tensor changed in place by the caller (its version counter) is computed
    anew. While kept, every call returns the same tensor (the layers only read it: they apply their
    linear maps to it). Memory: one output per (input, graph, weights, ``key``). Not while
    torch.compile traces; ``GNNFUSE_CACHE_CONSTANT_AGGREGATION=0`` turns it off."""
    if _computing[0] or torch.compiler.is_compiling() or not config.enabled("GNNFUSE_CACHE_CONSTANT_AGGREGATION"):
        return compute()
    if any(t.requires_grad for t in sources):
        return compute()
    slot = cached("constant_result:" + kind, sources, key, lambda: [None, 0, False])  # [value, version, seen]
    value = slot[0]
    if value is not None and value._version == slot[1]:
        return value
    _computing[0] += 1
    try:
        value = compute()
    finally:
        _computing[0] -= 1
    if slot[2]:  # the second call with these sources: keep it
        slot[0], slot[1] = value, value._version
    slot[2] = True
    return value


def graph_tensors(graph: Tensor | CSR) -> tuple[Tensor, ...]:
    """The tensors that define a graph argument, as cache sources (an EdgeIndex subclass is never cached)."""
    return (graph.rowptr, graph.col) if isinstance(graph, CSR) else (graph,)


def fused_reduce(aggr_module: Any) -> str | list[str] | None:
    """The reduce name for the fused op that ``aggr_module`` computes, a list of names for a
    MultiAggregation with mode="cat" (one pass; the op's [N, K*F] layout is PyG's concatenation), or
    None when the fused op cannot compute it."""
    name = REDUCE_OF_AGGR.get(type(aggr_module))
    if name is None and isinstance(aggr_module, MultiAggregation):
        from .aggr import reduce_of as names_of  # late import: aggr imports this module
        names = names_of(aggr_module)
        return names if isinstance(names, list) else None
    return name


def reduce_of(module: MessagePassing) -> str | list[str]:
    reduce = fused_reduce(module.aggr_module)
    assert reduce is not None  # the plan checked it
    return reduce


def _csr_of(edge_index: Tensor, num_src: int, num_dst: int) -> CSR:
    return csr_for_edge_index(edge_index, num_src, num_dst)


def csr_to_edge_index(csr: CSR) -> Tensor:
    """[2, E] int64 edge_index (PyG's dtype; a CSR may hold int32) in the CSR's original edge order,
    so edge_weight/edge_attr still line up."""
    perm = csr.perm.long()
    src = torch.empty_like(perm).scatter_(0, perm, csr.col.long())
    dst = torch.empty_like(perm).scatter_(0, perm, csr.row().long())
    return torch.stack([src, dst])


def edge_endpoints(graph: Tensor | CSR) -> tuple[Tensor, Tensor]:
    """(source, target) [E] plain tensors in original edge order for a tensor, EdgeIndex or CSR."""
    if isinstance(graph, CSR):
        ei = csr_to_edge_index(graph)
        return ei[0], ei[1]
    if isinstance(graph, EdgeIndex):
        graph = graph.as_subclass(Tensor)
    return graph[0], graph[1]  # type: ignore[index]  # a Tensor here
