"""Which ``message()`` can the fused op compute? Recognised from the method's source.

A message is fusable when it is ``x_j`` or ``x_j`` times a per-edge weight turned into a column,
optionally only when the weight is given. The source is reduced to one expression first, so the
common spellings all match:

* the weight as a column: ``w.view(-1, 1)``, ``w.reshape(-1, 1)``, ``w.unsqueeze(-1)`` /
  ``unsqueeze(1)``, ``w[:, None]``, ``w[..., None]`` (optionally ``.to(x_j.dtype)``);
* the product: ``a * b`` in either order, ``a.mul(b)``, ``torch.mul(a, b)``;
* temporaries (``w = edge_weight.view(-1, 1)`` then ``return x_j * w``), an
  ``if edge_weight is None: return x_j`` guard, a guarded reassignment
  (``if edge_weight is not None: x_j = x_j * ...``), and the inline ``x_j if w is None else ...``.

Anything else is "not recognised" and the layer keeps PyG's path (with a one-time warning).
"""
from __future__ import annotations

import ast
import copy
import inspect
import textwrap

from torch_geometric.nn.conv import MessagePassing

Form = tuple  # (kind, x_param, weight_param | None)
_COLUMN = "<column>"  # placeholder call standing for "the weight as an [E, 1] column"
# the parameters are renamed to names no source can contain, so a free variable never matches
_PLACEHOLDERS: dict[str, ast.expr] = {"X": ast.Name("<X>", ast.Load()), "W": ast.Name("<W>", ast.Load())}


def _is_minus_one_one(args: list[ast.expr]) -> bool:
    if len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List)):
        args = list(args[0].elts)
    return [_const(a) for a in args] == [-1, 1]


def _const(node: ast.expr) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None


class _Canonical(ast.NodeTransformer):
    """Rewrites equivalent spellings into one: products become ``a * b`` with sorted operands,
    weight-to-column views become ``__column__(w)``, ``.to(X.dtype)`` / ``.type_as(X)`` go."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute):
            base, name, args = func.value, func.attr, node.args
            kw = {k.arg: k.value for k in node.keywords}
            if name == "mul" and len(args) == 1 and not kw:
                if isinstance(base, ast.Name) and base.id == "torch":
                    return node  # torch.mul(a) is not a product
                return self._product(base, args[0])
            if name == "mul" and isinstance(base, ast.Name) and base.id == "torch" and len(args) == 2:
                return self._product(args[0], args[1])
            if name in ("view", "reshape") and _is_minus_one_one(list(args)) and not kw:
                return ast.Call(ast.Name(_COLUMN, ast.Load()), [base], [])
            if name == "unsqueeze" and not (args and kw):
                dim = _const(args[0]) if args else _const(kw.get("dim", ast.Constant(None)))
                if dim in (1, -1) and len(args) + len(kw) == 1:
                    return ast.Call(ast.Name(_COLUMN, ast.Load()), [base], [])
            if name in ("to", "type_as") and len(args) == 1 and not kw and self._is_column(base):
                return base  # a dtype cast of the weight column: the fused path requires equal dtypes anyway
        return node

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        self.generic_visit(node)
        sl = node.slice
        if isinstance(sl, ast.Tuple) and len(sl.elts) == 2 and _const(sl.elts[1]) is None \
                and isinstance(sl.elts[1], ast.Constant):
            first = sl.elts[0]
            full = isinstance(first, ast.Slice) and first.lower is first.upper is first.step is None
            if full or (isinstance(first, ast.Constant) and first.value is Ellipsis):
                return ast.Call(ast.Name(_COLUMN, ast.Load()), [node.value], [])
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Mult):
            return self._product(node.left, node.right)
        return node

    @staticmethod
    def _is_column(node: ast.expr) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == _COLUMN

    @staticmethod
    def _product(a: ast.expr, b: ast.expr) -> ast.BinOp:
        a, b = sorted((a, b), key=_dump)
        return ast.BinOp(a, ast.Mult(), b)


def _dump(node: ast.AST) -> str:
    return ast.dump(node, annotate_fields=False, include_attributes=False)


def _canonical(node: ast.expr) -> str:
    return _dump(_Canonical().visit(copy.deepcopy(node)))


class _Substitute(ast.NodeTransformer):
    """Replaces temporaries by their (already substituted) values; renames the parameters to X/W."""

    def __init__(self, env: dict[str, ast.expr]):
        self.env = env

    def visit_Name(self, node: ast.Name) -> ast.AST:
        value = self.env.get(node.id)
        return copy.deepcopy(value) if value is not None else node


def _single_expression(stmts: list[ast.stmt], env: dict[str, ast.expr]) -> ast.expr | None:
    """The value the statement list returns, as one expression (temporaries inlined, an
    ``if ...: return a`` followed by ``return b`` as ``a if ... else b``), or None."""
    if not stmts:
        return None
    first, rest = stmts[0], stmts[1:]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        return _single_expression(rest, env)  # a docstring
    if isinstance(first, (ast.Assign, ast.AnnAssign)):
        targets = first.targets if isinstance(first, ast.Assign) else [first.target]
        if len(targets) != 1 or not isinstance(targets[0], ast.Name) or first.value is None:
            return None
        value = _Substitute(env).visit(copy.deepcopy(first.value))
        return _single_expression(rest, {**env, targets[0].id: value})
    if isinstance(first, ast.Return):
        return None if first.value is None or rest else _Substitute(env).visit(copy.deepcopy(first.value))
    if isinstance(first, ast.If) and _assignments_only(first.body) and _assignments_only(first.orelse):
        # `if w is not None: x_j = x_j * w.view(-1, 1)`: each name assigned in a branch becomes
        # `then_value if test else else_value`
        test = _Substitute(env).visit(copy.deepcopy(first.test))
        then_env, else_env = _assigned(first.body, env), _assigned(first.orelse, env)
        if then_env is None or else_env is None:
            return None
        merged = dict(env)
        for name in set(then_env) | set(else_env):
            fallback = env.get(name, ast.Name(name, ast.Load()))
            merged[name] = ast.IfExp(test, then_env.get(name, fallback), else_env.get(name, fallback))
        return _single_expression(rest, merged)
    if isinstance(first, ast.If):
        then = _single_expression(first.body, env)
        other = _single_expression(first.orelse or rest, env)
        if then is None or other is None or (first.orelse and rest):
            return None
        test = _Substitute(env).visit(copy.deepcopy(first.test))
        return ast.IfExp(test, then, other)
    return None


def _assignments_only(stmts: list[ast.stmt]) -> bool:
    return all(isinstance(st, (ast.Assign, ast.AnnAssign)) for st in stmts)


def _assigned(stmts: list[ast.stmt], env: dict[str, ast.expr]) -> dict[str, ast.expr] | None:
    """The names a run of simple assignments binds, with their substituted values (None if not simple)."""
    env, bound = dict(env), {}
    for st in stmts:
        if not isinstance(st, (ast.Assign, ast.AnnAssign)):
            return None
        targets = st.targets if isinstance(st, ast.Assign) else [st.target]
        if len(targets) != 1 or not isinstance(targets[0], ast.Name) or st.value is None:
            return None
        value = _Substitute(env).visit(copy.deepcopy(st.value))
        env[targets[0].id] = bound[targets[0].id] = value
    return bound


_TEMPLATES: dict[str, str] | None = None


def _templates() -> dict[str, str]:
    global _TEMPLATES
    if _TEMPLATES is None:
        def parse(expr: str) -> str:
            return _canonical(_Substitute(_PLACEHOLDERS).visit(ast.parse(expr, mode="eval").body))
        weighted = "W.view(-1, 1) * X"
        _TEMPLATES = {
            parse("X"): "x_j",
            parse(weighted): "x_j*w",
            parse(f"X if W is None else {weighted}"): "x_j*w?",
            parse(f"{weighted} if W is not None else X"): "x_j*w?",
        }
    return _TEMPLATES


def message_form(cls: type) -> Form | None:
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
    w_names = [p.name for p in params
               if not p.name.endswith(("_i", "_j")) and p.name not in MessagePassing.special_args]
    if len(x_names) != 1 or len(x_names) + len(w_names) != len(params):
        return None
    func = tree.body[0] if tree.body else None
    if not isinstance(func, ast.FunctionDef):
        return None
    names: dict[str, ast.expr] = {x_names[0]: _PLACEHOLDERS["X"]}
    if w_names:
        names[w_names[0]] = _PLACEHOLDERS["W"]
    expr = _single_expression(func.body, names)
    if expr is None:
        return None
    kind = _templates().get(_canonical(expr))
    if kind is None or (kind != "x_j" and not w_names):
        return None
    return (kind, x_names[0], w_names[0] if w_names else None)
