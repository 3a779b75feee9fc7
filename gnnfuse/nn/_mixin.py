"""``FusedMessagePassing``: routes PyG's propagate through :func:`gnnfuse.fused_gather_scatter`.

The fused path runs when all of these hold (otherwise PyG's own ``propagate`` runs, unchanged):
  * the layer's ``message`` is ``x_j`` or ``x_j * edge_weight`` (see :func:`message_form`);
  * its aggregation is exactly PyG's Sum/Mean/Max/Min/MulAggregation and ``aggregate`` is not
    overridden; ``flow="source_to_target"``; no explain mode, no ``decomposed_layers``, no
    propagate/message/aggregate hooks;
  * ``edge_index`` is a plain [2, E] tensor, a PyG ``EdgeIndex`` or a :class:`gnnfuse.CSR`, and
    the node features are a tensor (or an ``(x_src, x_dst)`` pair) with nodes in dim 0.
A ``gnnfuse.CSR`` on the PyG path is turned back into an ``edge_index`` (original edge order), so
every layer accepts it. ``update`` is called as in PyG.

Semantics differences from stock PyG (documented, not bugs): max/min send each (row, feature)'s
gradient to one winning edge (the first in edge order among ties) where PyG's ``scatter_reduce``
splits it evenly among ties; sums are accumulated in CSR order, so float results differ from PyG
by rounding only.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn.aggr import MaxAggregation, MeanAggregation, MinAggregation, MulAggregation, SumAggregation
from torch_geometric.nn.conv import MessagePassing

from ..csr import CSR, csr_for_edge_index
from ..ops.gather_scatter import fused_gather_scatter

REDUCE_OF_AGGR = {
    SumAggregation: "sum",
    MeanAggregation: "mean",
    MaxAggregation: "max",
    MinAggregation: "min",
    MulAggregation: "mul",
}
_HOOK_DICTS = (
    "_propagate_forward_pre_hooks", "_propagate_forward_hooks", "_message_forward_pre_hooks",
    "_message_forward_hooks", "_aggregate_forward_pre_hooks", "_aggregate_forward_hooks",
    "_message_and_aggregate_forward_pre_hooks", "_message_and_aggregate_forward_hooks",
)


# ---- which message is it? ----------------------------------------------------------------------
# A message is recognised from its source: one `return` of one of these expressions, with X the
# `*_j` parameter and W the weight parameter. Anything else is "not recognised" and runs PyG's path.
_WEIGHT_VIEWS = ("W.view(-1, 1)", "W.reshape(-1, 1)", "W.unsqueeze(1)", "W[:, None]",
                 "W.view(-1, 1).to(X.dtype)")
_WEIGHTED = [f"{w} * X" for w in _WEIGHT_VIEWS] + [f"X * {w}" for w in _WEIGHT_VIEWS]
_OPTIONAL = [f"X if W is None else {e}" for e in _WEIGHTED] + [f"{e} if W is not None else X" for e in _WEIGHTED]


def _dump(expr: str) -> str:
    return ast.dump(ast.parse(expr, mode="eval").body, annotate_fields=False, include_attributes=False)


_TEMPLATES: dict[str, str] | None = None


def _templates() -> dict[str, str]:
    global _TEMPLATES
    if _TEMPLATES is None:
        t = {_dump("X"): "x_j"}
        t.update({_dump(e): "x_j*w" for e in _WEIGHTED})
        t.update({_dump(e): "x_j*w?" for e in _OPTIONAL})
        _TEMPLATES = t
    return _TEMPLATES


class _Rename(ast.NodeTransformer):
    def __init__(self, names: dict[str, str]):
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(id=self.names.get(node.id, "_" + node.id), ctx=node.ctx), node)


def message_form(cls: type) -> tuple[str, str, str | None] | None:
    """How ``cls.message`` can be fused: ``(kind, x_param, weight_param)`` or None.

    kind is "x_j" (message = x_j), "x_j*w" (x_j times a per-edge weight, which must be given) or
    "x_j*w?" (x_j, times the weight when it is not None). A class may declare it instead of relying
    on source inspection: ``gnnfuse_message = ("x_j*w?", "x_j", "edge_weight")`` (or None to opt out).
    """
    declared = cls.__dict__.get("gnnfuse_message", inspect.Parameter.empty)
    for klass in cls.__mro__:  # an explicit declaration anywhere up the MRO wins, if message is not redefined below it
        if "gnnfuse_message" in klass.__dict__:
            declared = klass.__dict__["gnnfuse_message"]
            break
        if "message" in klass.__dict__:
            break
    if declared is not inspect.Parameter.empty:
        return declared
    fn = getattr(cls, "message", None)
    if fn is None:
        return None
    if fn is MessagePassing.message:
        return ("x_j", "x_j", None)
    try:
        params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, ValueError):
        return None
    if any(p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params) or not 1 <= len(params) <= 2:
        return None
    x_names = [p.name for p in params if p.name.endswith("_j")]
    w_names = [p.name for p in params if not p.name.endswith(("_i", "_j")) and p.name not in MessagePassing.special_args]
    if len(x_names) != 1 or len(x_names) + len(w_names) != len(params):
        return None
    func = tree.body[0] if tree.body else None
    if not isinstance(func, ast.FunctionDef):
        return None
    body = [s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return None
    names = {x_names[0]: "X"}
    if w_names:
        names[w_names[0]] = "W"
    expr = _Rename(names).visit(body[0].value)
    kind = _templates().get(ast.dump(expr, annotate_fields=False, include_attributes=False))
    if kind is None or (kind != "x_j" and not w_names):
        return None
    return (kind, x_names[0], w_names[0] if w_names else None)


def _is_pyg_template(klass: type, fn: object) -> bool:
    """True for the propagate PyG generated from its jinja template for ``klass``."""
    return klass.__dict__.get("_jinja_propagate") is fn and klass.__dict__.get("_orig_propagate") is not fn


def _custom_propagate(cls: type) -> bool:
    """True if a class of ``cls``'s MRO (below MessagePassing) defines its own propagate."""
    for klass in cls.__mro__:
        if klass is MessagePassing:
            return False
        fn = klass.__dict__.get("propagate")
        if fn is not None and fn is not FusedMessagePassing.propagate and not _is_pyg_template(klass, fn):
            return True
    return False


def why_not_fused(module: MessagePassing) -> str | None:
    """None if the module's structure allows the fused path (inputs are checked per call), else why not."""
    cls = type(module)
    if message_form(cls) is None:
        return "message is not x_j or x_j * edge_weight"
    if type(module.aggr_module) not in REDUCE_OF_AGGR:
        return f"aggregation {module.aggr!r} is not sum/mean/max/min/mul"
    if cls.aggregate is not MessagePassing.aggregate:
        return "custom aggregate()"
    if _custom_propagate(cls):
        return "custom propagate()"
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
        # own; define ours on every subclass so that our propagate is the one that runs.
        if "propagate" not in cls.__dict__:
            cls.propagate = FusedMessagePassing.propagate  # type: ignore[method-assign]
        cls._gnnfuse_form = message_form(cls)
        cls._gnnfuse_custom_update = cls.update is not MessagePassing.update

    def propagate(self, edge_index, size=None, **kwargs):
        plan = self._gnnfuse_plan(edge_index, size, kwargs)
        if plan is None:
            return self._gnnfuse_fallback(edge_index, size, kwargs)
        x_src, weight, num_dst, reduce = plan
        out = fused_gather_scatter(x_src, edge_index, reduce, edge_weight=weight, num_nodes=num_dst,
                                   backend=self.gnnfuse_backend)
        if reduce == "mul":  # PyG's product over no edges is 1, gnnfuse's is 0
            csr = edge_index if isinstance(edge_index, CSR) else _csr_of(edge_index, x_src.shape[0], num_dst)
            empty = (csr.in_degree() == 0).view(-1, *([1] * (out.dim() - 1)))
            out = torch.where(empty, torch.ones_like(out), out)
        if self._gnnfuse_custom_update:
            out = self._gnnfuse_update(out, edge_index, size, kwargs)
        return out

    # ---- decisions ------------------------------------------------------------------------
    def _gnnfuse_plan(self, edge_index, size, kwargs) -> tuple[Tensor, Tensor | None, int, str] | None:
        form = self._gnnfuse_form
        reduce = REDUCE_OF_AGGR.get(type(self.aggr_module))
        if form is None or reduce is None or self.flow != "source_to_target":
            return None
        if self.explain or self.decomposed_layers != 1 or type(self).aggregate is not MessagePassing.aggregate:
            return None
        if any(len(getattr(self, name)) for name in _HOOK_DICTS):
            return None
        if isinstance(edge_index, Tensor) and edge_index.layout != torch.strided:
            return None  # torch.sparse adjacency: PyG's spmm path
        if not isinstance(edge_index, (Tensor, CSR)):
            return None
        kind, x_name, w_name = form
        x = kwargs.get(x_name[:-2])
        x_src, x_dst = x if isinstance(x, (tuple, list)) and len(x) == 2 else (x, None)
        if not isinstance(x_src, Tensor) or not x_src.is_floating_point() or x_src.dim() < 1:
            return None
        if self.node_dim % x_src.dim() != 0:
            return None
        weight = kwargs.get(w_name) if w_name else None
        if kind == "x_j":
            weight = None
        elif weight is None:
            if kind == "x_j*w":
                return None  # PyG raises its own error
        elif not isinstance(weight, Tensor) or weight.dim() != 1 or weight.dtype != x_src.dtype or x_src.dim() != 2:
            return None  # broadcasting / type promotion the fused op does not reproduce
        num_src = x_src.shape[0]
        size_src, size_dst = size if size is not None else (None, None)
        if size_src is not None and size_src != num_src:
            return None  # PyG raises its size error
        if isinstance(x_dst, Tensor):
            if size_dst is not None and size_dst != x_dst.shape[self.node_dim % x_dst.dim()]:
                return None
            size_dst = x_dst.shape[self.node_dim % x_dst.dim()]
        if isinstance(edge_index, CSR):
            if size_dst is not None and size_dst != edge_index.num_dst:
                raise ValueError(f"{type(self).__name__}: size/x_dst give {size_dst} target nodes but the "
                                 f"gnnfuse.CSR has {edge_index.num_dst} rows")
            return x_src, weight, edge_index.num_dst, reduce
        if isinstance(edge_index, EdgeIndex):
            rows, cols = edge_index.sparse_size()
            if rows is not None and rows != num_src:
                return None
            if size_dst is None:
                size_dst = cols
        return x_src, weight, num_src if size_dst is None else size_dst, reduce

    def _gnnfuse_fallback(self, edge_index, size, kwargs):
        if isinstance(edge_index, CSR):
            if size is None:
                size = (edge_index.num_src, edge_index.num_dst)
            edge_index = csr_to_edge_index(edge_index)
        for klass in type(self).__mro__:  # the next propagate after the mixin's (PyG's template or original)
            fn = klass.__dict__.get("propagate")
            if fn is not None and fn is not FusedMessagePassing.propagate:
                return fn(self, edge_index, size=size, **kwargs)
        raise AssertionError("unreachable: MessagePassing defines propagate")

    def _gnnfuse_update(self, out, edge_index, size, kwargs):
        if isinstance(edge_index, CSR):
            size = size or (edge_index.num_src, edge_index.num_dst)
            edge_index = csr_to_edge_index(edge_index)
        names = set(self.inspector.get_param_names("update"))
        if not names:
            return self.update(out)
        coll = self._collect(names, edge_index, self._check_input(edge_index, size), kwargs)
        return self.update(out, **self.inspector.collect_param_data("update", coll))


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
