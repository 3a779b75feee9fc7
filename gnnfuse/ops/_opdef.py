"""Declarative op definitions: one description per op generates its torch.library registration,
its autograd rule and its eager route.

Usage (an op module describes each op once, then calls it)::

    FWD = OpDef("my_op(Tensor x, Tensor idx, SymInt n) -> Tensor",
                kernels={"cpu": my_cpu_kernel, "triton": my_triton_kernel}, fake=lambda x, idx, n: x.new_empty(n),
                save=lambda ctx, inputs, out: (inputs[1],),          # tensors for the backward
                backward=lambda ctx, saved, grad: (BWD(grad, *saved, backend=ctx.backend), None, None))
    out = FWD(x, idx, n, backend="cpu")   # "cpu" | "triton" | None (None: always the registered op)

What one description gives:
  * ``torch.ops.gnnfuse.<name>``: the schema, the "cpu" kernel for CPU tensors and the "triton" one
    for CUDA tensors, the fake (shape) rule, and the autograd rule made of ``save`` (whose tensors go
    through ``ctx.save_for_backward``: saved-tensor hooks and in-place checks apply) and
    ``backward`` (the maths). An op without ``backward`` that has differentiable inputs gets a rule
    that raises a clear error, so differentiating it (e.g. double backward) is never silently wrong.
  * the eager route of :meth:`OpDef.__call__`: in plain eager mode the kernel of the chosen backend
    is called directly (no autograd node when no input needs a gradient), else through one generic
    ``torch.autograd.Function`` running the same ``save``/``backward``. It skips the dispatcher's
    layers (autograd key, Python kernel, redispatch, pytree handling of Tensor[] lists), which cost
    10-20 us a call on small inputs (benchmarks/bench_cpu_overhead.py measures them); and it runs
    Triton kernels on CPU tensors under ``TRITON_INTERPRET=1``, which the dispatcher cannot pick.
    Tracing (torch.compile, export), dispatch/function modes, functorch transforms and tensor
    subclasses always take the registered op (see :func:`eager_route_ok`).

``backward(ctx, saved, *grads)`` returns one gradient (or None) per op input, a list for a
Tensor[] input. It finds ``ctx.needs`` (per input: does it need a gradient; any() over a list),
``ctx.backend`` (the eager route's backend, None on the registered op: pass it on as ``backend=``
when calling the backward's own op) and whatever ``save`` put on ctx.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ._library import lib

NAMESPACE = "gnnfuse"
# backend -> the device its registered kernel serves ("cuda": a CUDA kernel written in plain torch)
DISPATCH_KEYS = {"cpu": "cpu", "triton": "cuda", "cuda": "cuda"}


# ---- the eager route's gate -------------------------------------------------------------------------
# The gate reads dispatcher state that torch exposes only privately (torch._C). It is used on the
# torch versions it was tested on; outside them every call takes the registered op, which is
# always correct, only slower on small inputs (tests/test_op_parity.py runs both routes).
TESTED_TORCH = ((2, 4), (2, 13))  # inclusive (major, minor) range
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def _private_gate() -> Callable[[], bool] | None:
    if not TESTED_TORCH[0] <= _torch_version() <= TESTED_TORCH[1]:
        return None
    C = torch._C
    try:
        stack, mode, level = C._len_torch_dispatch_stack, C._is_torch_function_mode_enabled, \
            C._functorch.maybe_current_level
    except AttributeError:
        return None
    return lambda: stack() == 0 and not mode() and level() is None


_gate = _private_gate()


def eager_route_ok(tensors: Sequence[torch.Tensor]) -> bool:
    """True when a call may skip the dispatcher: plain eager mode and plain CPU/CUDA tensors."""
    if _gate is None or torch.compiler.is_compiling():
        return False
    for t in tensors:
        if type(t) not in _PLAIN_TENSORS or not (t.is_cuda or t.is_cpu):
            return False
    return _gate()


# ---- Tensor[] arguments travel flat through autograd.Function ------------------------------------
def _flatten(values: Sequence) -> tuple[list, tuple]:
    flat, layout = [], []
    for v in values:
        if isinstance(v, (list, tuple)):
            flat.extend(v)
            layout.append(len(v))
        else:
            flat.append(v)
            layout.append(None)
    return flat, tuple(layout)


def _unflatten(flat: Sequence, layout: tuple) -> list:
    out, i = [], 0
    for n in layout:
        if n is None:
            out.append(flat[i])
            i += 1
        else:
            out.append(list(flat[i:i + n]))
            i += n
    return out


def _needs(flags: Sequence[bool], layout: tuple) -> tuple[bool, ...]:
    return tuple(any(v) if isinstance(v, list) else bool(v) for v in _unflatten(flags, layout))


def _list_of_nones(grad, length: int | None):
    """A Tensor[] input's missing gradient is a list of Nones (autograd checks the structure)."""
    return [None] * length if grad is None and length is not None else grad


def _tensors(flat: Sequence) -> list[torch.Tensor]:
    return [v for v in flat if isinstance(v, torch.Tensor)]


def _save(ctx, op: OpDef, inputs: Sequence, output) -> None:
    flat, ctx.saved_layout = _flatten(op.save(ctx, inputs, output) if op.save else ())
    ctx.save_for_backward(*flat)


def _grads(ctx, op: OpDef, needs: tuple[bool, ...], grads: tuple) -> tuple:
    ctx.needs = needs
    saved = _unflatten(ctx.saved_tensors, ctx.saved_layout)
    return tuple(op.backward(ctx, saved, *grads))  # type: ignore[misc]


class _Eager(torch.autograd.Function):
    """The eager route's autograd node for every op (see the module docstring)."""

    @staticmethod
    def forward(ctx, op: OpDef, backend: str, layout: tuple, *flat):
        inputs = _unflatten(flat, layout)
        output = op.kernels[backend](*inputs)
        ctx.op, ctx.backend, ctx.layout = op, backend, layout
        _save(ctx, op, inputs, output)
        return output

    @staticmethod
    def backward(ctx, *grads):
        grads = _grads(ctx, ctx.op, _needs(ctx.needs_input_grad[3:], ctx.layout), grads)
        flat, _ = _flatten(_list_of_nones(g, n) for g, n in zip(grads, ctx.layout))
        return (None, None, None, *flat)


# ---- the op definition ------------------------------------------------------------------------------
class OpDef:
    """``torch.ops.gnnfuse.<name>`` and its eager route, from one description (module docstring).

    Args:
        schema: ``"name(args) -> outputs"`` in torch.library syntax (``SymInt`` for sizes, so that
            torch.compile traces dynamic shapes).
        kernels: backend ("cpu", "triton") -> kernel taking the op's arguments. "cpu" serves CPU
            tensors in the registered op, "triton" CUDA tensors (and CPU tensors in the eager route
            under ``TRITON_INTERPRET=1``).
        fake: the shape rule (same arguments; returns empty tensors of the outputs' shapes).
        save: ``save(ctx, inputs, output)`` -> the tensors (or lists of them) the backward needs;
            it may set plain attributes on ctx and mark outputs non-differentiable.
        backward: ``backward(ctx, saved, *grads)`` -> one gradient per input (module docstring).
        differentiable: False for ops without gradients at all (index outputs): no autograd rule.
        public_name: the public function named in the error raised when an op without
            ``backward`` is differentiated.
    """

    def __init__(self, schema: str, *, kernels: dict[str, Callable], fake: Callable,
                 save: Callable | None = None, backward: Callable | None = None, differentiable: bool = True,
                 public_name: str | None = None):
        self.name = schema.split("(", 1)[0]
        self.qualname = f"{NAMESPACE}::{self.name}"
        self.kernels, self.save, self.backward = kernels, save, backward
        lib.define(schema)
        for backend, kernel in kernels.items():
            torch.library.impl(self.qualname, DISPATCH_KEYS[backend], lib=lib)(kernel)
        torch.library.register_fake(self.qualname, fake, lib=lib)
        if backward is not None:
            torch.library.register_autograd(self.qualname, self._registered_backward,
                                            setup_context=self._registered_setup, lib=lib)
        elif differentiable:
            torch.library.register_autograd(self.qualname, self._no_backward, setup_context=_no_setup, lib=lib)
        self.public_name = public_name or self.name
        self.overload = getattr(getattr(torch.ops, NAMESPACE), self.name).default

    # the registered op's autograd rule: the same save and backward as the eager route
    def _registered_setup(self, ctx, inputs, output) -> None:
        ctx.backend, ctx.layout = None, _flatten(inputs)[1]
        _save(ctx, self, inputs, output)

    def _registered_backward(self, ctx, *grads):
        needs = tuple(any(v) if isinstance(v, (list, tuple)) else bool(v) for v in ctx.needs_input_grad)
        grads = _grads(ctx, self, needs, grads)
        return tuple(_list_of_nones(g, n) for g, n in zip(grads, ctx.layout))

    def _no_backward(self, ctx, *grads):
        raise RuntimeError(
            f"gnnfuse.{self.public_name} does not support double backward (differentiating its gradient); "
            "use backend='reference' if you need higher-order derivatives")

    def __call__(self, *args, backend: str | None = None):
        """Runs the op. ``backend`` None: the registered op (dispatch by device). "cpu" / "triton":
        that backend's kernel through the eager route where allowed, else the registered op."""
        if backend is None:
            return self.overload(*args)
        flat, layout = _flatten(args)
        tensors = _tensors(flat)
        interpreted = backend == "triton" and tensors[0].is_cpu  # TRITON_INTERPRET=1: the dispatcher can't
        if not (interpreted or eager_route_ok(tensors)):
            return self.overload(*args)
        if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
            return self.kernels[backend](*args)  # nothing to differentiate: no autograd node
        if self.backward is None:
            return self.overload(*args)  # its autograd rule raises on backward
        return _Eager.apply(self, backend, layout, *flat)


def _no_setup(ctx, inputs, output) -> None:
    return None
