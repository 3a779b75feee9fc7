"""Declarative op definitions: one description per op generates its torch.library registration,
its autograd rule and its eager route.

Usage (an op module describes each op once, then calls it)::

    FWD = OpDef("my_op(Tensor x, Tensor idx, SymInt n) -> Tensor",
                kernels={"cpu": my_cpu_kernel, "triton": my_triton_kernel}, fake=lambda x, idx, n: x.new_empty(n),
                save=lambda ctx, inputs, out: (inputs[1],),          # tensors for the backward
                backward=lambda ctx, saved, grad: (BWD.from_backward(ctx, grad, *saved), None, None))
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
  * a CPU kernel written in C++ is best registered there (``kernels={"cpu": CppKernel("graph",
    "my_op")}``, with ``TORCH_LIBRARY_IMPL(gnnfuse, CPU, m) { m.impl("my_op", &my_op); }`` and a
    binding of the same function in csrc/, ``m.add_object("my_op", fast_function<&my_op>("my_op"))``
    (csrc/fast_call.h: no pybind11 machinery per call) or ``m.def``): the dispatcher then runs it
    without coming back into Python (compiled graphs, direct ``torch.ops`` calls), and the eager
    route calls the same function. See :class:`CppKernel` for how the lazily built extension is
    loaded. An op whose CPU errors are translated in Python (gnnfuse.IndexOutOfRange) or which
    falls back to torch without a compiler keeps a Python CPU kernel.

``backward(ctx, saved, *grads)`` returns one gradient (or None) per op input, a list for a
Tensor[] input. It finds ``ctx.needs`` (per input: does it need a gradient; any() over a list) and
whatever ``save`` put on ctx; it calls other ops as ``OTHER.from_backward(ctx, *args)``, which
keeps the route and backend of the forward (``ctx.backend``: None on the registered op).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

from .. import range_check
from .._build import load_extension
from ..range_check import PENDING as RANGE_CHECKS_PENDING
from ._torch_private import current_cuda_device, function_apply, private_gate
from ._library import NAMESPACE, lib

# backend -> the device its registered kernel serves ("cuda": a CUDA kernel written in plain torch)
DISPATCH_KEYS = {"cpu": "cpu", "triton": "cuda", "cuda": "cuda"}


class CppKernel:
    """A CPU kernel registered in C++: ``TORCH_LIBRARY_IMPL(gnnfuse, CPU, m)`` in the sources of
    ``extension`` (csrc/) registers it for the op, and the extension's Python function ``name``,
    taking the op's arguments, is the same C++ function for the eager route. The dispatcher then
    runs CPU calls without coming back into Python.

    The extension is built and loaded on first use, after the op was defined: until then a Python
    loader serves the op's ``CompositeExplicitAutograd`` key, which the dispatcher uses only where
    no kernel of the device's own key exists. It loads the extension (whose CPU kernel then takes
    precedence: no Python CPU kernel is ever registered, so nothing is overridden) and calls again."""

    def __init__(self, extension: str, name: str):
        self.extension, self.name = extension, name

    def load(self) -> Callable:
        return getattr(load_extension(self.extension), self.name)


# ---- the eager route's gate -------------------------------------------------------------------------
# The gate reads dispatcher state that torch exposes only privately (torch._C), on the tested torch
# versions only (gnnfuse/ops/_torch_private.py); outside them every call takes the registered op,
# which is always correct, only slower on small inputs (tests/test_op_parity.py runs both routes).
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_gate = private_gate()
_is_dynamo_compiling = torch.compiler.is_dynamo_compiling  # (bound once: the attribute walk costs 0.03 us a call)
_scan_args: Callable | None = None  # the C++ twin of _scan's loop, once the graph kernels are loaded


def use_native_scan(scan_args: Callable) -> None:
    """Scans arguments with ``scan_args(values) -> tuple | None`` (the C++ graph kernels' twin of
    :func:`_scan`'s loop: None where the loop returns False, else the positions that require grad)
    from now on: about 0.1 us for eight arguments, where the Python loop costs 0.5."""
    global _scan_args
    _scan_args = scan_args


def eager_route_ok(tensors: Sequence[torch.Tensor]) -> bool:
    """True when a call may skip the dispatcher: plain eager mode and plain CPU/CUDA tensors."""
    return _scan(tensors)[0]


def _scan(values: Sequence) -> tuple[bool, tuple[int, ...]]:
    """(may these arguments take the eager route, the positions of the tensors that require grad),
    in one pass: this runs on every call, so it is written for speed (each Python call in it costs
    about 0.1 us): no dispatch or function mode, no functorch transform, only plain CPU/CUDA tensors."""
    # (Dynamo's tracing first: it must not trace the gate; other tracers, such as non-strict
    # export, run under a dispatch mode, which the gate sees)
    if _gate is None or _is_dynamo_compiling():
        return False, ()
    dispatch_modes, function_mode, functorch_level = _gate
    if dispatch_modes() or function_mode() or functorch_level() is not None:
        return False, ()
    if _scan_args is not None:
        grad_pos = _scan_args(values)
        return (False, ()) if grad_pos is None else (True, grad_pos)
    grad_pos = ()
    i = -1
    for t in values:
        i += 1
        if t is None:  # (optional tensors: the commonest non-tensor argument, first)
            continue
        if type(t) in _PLAIN_TENSORS:
            if not (t.is_cpu or t.is_cuda):
                return False, ()
            if t.requires_grad:
                grad_pos += (i,)
        elif isinstance(t, torch.Tensor):  # a subclass
            return False, ()
    return True, grad_pos


# ---- Tensor[] arguments travel flat through autograd.Function ------------------------------------
def _flatten(values: Iterable) -> tuple[list, tuple]:
    flat: list = []
    layout: list[int | None] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            flat.extend(v)
            layout.append(len(v))
        else:
            flat.append(v)
            layout.append(None)
    return flat, tuple(layout)


def _unflatten(flat: Sequence, layout: tuple | None) -> Sequence:
    if layout is None:  # an op without Tensor[] arguments: nothing to regroup
        return flat
    out, i = [], 0
    for n in layout:
        if n is None:
            out.append(flat[i])
            i += 1
        else:
            out.append(list(flat[i:i + n]))
            i += n
    return out


def _needs(flags: Sequence[bool], layout: tuple | None) -> tuple[bool, ...]:
    if layout is None:
        return tuple(flags)
    return tuple(any(v) if isinstance(v, list) else bool(v) for v in _unflatten(flags, layout))


def _list_of_nones(grad, length: int | None):
    """A Tensor[] input's missing gradient is a list of Nones (autograd checks the structure)."""
    return [None] * length if grad is None and length is not None else grad


def _save(ctx, op: OpDef, inputs: Sequence, output) -> None:
    saved = op.save(ctx, inputs, output) if op.save else ()
    flat, ctx.saved_layout = _flatten(saved) if op._has_lists else (saved, None)
    ctx.save_for_backward(*flat)


def _grads(ctx, op: OpDef, needs: tuple[bool, ...], grads: tuple) -> tuple:
    ctx.needs = needs
    saved = ctx.saved_tensors if ctx.saved_layout is None else _unflatten(ctx.saved_tensors, ctx.saved_layout)
    return tuple(op.backward(ctx, saved, *grads))  # type: ignore[misc]


class _Eager(torch.autograd.Function):
    """The eager route's autograd node for every op (see the module docstring). Only the tensors
    that require grad are arguments of their own; the rest travel in one tuple (``flat``), and the
    op's description in another (``route``): each argument of ``apply`` costs autograd time on
    every call, and these never get a gradient. For the same reason only the differentiable
    outputs leave through the node: non-differentiable ones go out through ``side`` (a list).
    (The common single-tensor cases are spelled out: a generator costs ~0.3 us a call.)"""

    @staticmethod
    def forward(ctx, route: tuple, flat: tuple, side: list, *_grad_inputs):
        op, backend, layout, _ = route
        inputs = flat if layout is None else _unflatten(flat, layout)
        output = op.kernels[backend](*inputs)
        ctx.route, ctx.backend, ctx.num_flat = route, backend, len(flat)
        _save(ctx, op, inputs, output)
        through = op.autograd_outputs
        if through is None:
            return output
        for i in op.side_outputs:
            side.append(output[i])
        return output[through[0]] if len(through) == 1 else tuple(output[i] for i in through)

    @staticmethod
    def backward(ctx, *grads):
        op, _, layout, grad_pos = ctx.route
        if op.autograd_outputs is not None:  # the other outputs get no gradient
            full = [None] * op.num_outputs
            for i, g in zip(op.autograd_outputs, grads):
                full[i] = g
            grads = full
        needs = [False] * ctx.num_flat
        flags = ctx.needs_input_grad
        for k, i in enumerate(grad_pos):
            needs[i] = flags[3 + k]
        grads = _grads(ctx, op, tuple(needs) if layout is None else _needs(needs, layout), grads)
        if layout is not None:
            grads, _ = _flatten(_list_of_nones(g, n) for g, n in zip(grads, layout))
        if len(grad_pos) == 1:
            return None, None, None, grads[grad_pos[0]]
        return (None, None, None, *[grads[i] for i in grad_pos])


# the node's apply where the gate passed (no functorch transform, plain tensors): the C apply that
# torch.autograd.Function.apply's Python wrapper ends in, on the tested torch versions
_eager_apply = function_apply(_Eager)


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
        backward_only_outputs: positions of outputs that only the backward uses (e.g. winners or
            normals it saves): the eager route returns None in their place, which spares autograd
            an output per call; the registered op returns them.
        non_differentiable_outputs: positions of outputs that are returned but never
            differentiated (e.g. index outputs): the registered op marks them non-differentiable,
            and the eager route returns them beside its autograd node, not through it (an output
            through the node costs ~1-2 us per call).
        public_name: the public function named in the error raised when an op without
            ``backward`` is differentiated.
    """

    def __init__(self, schema: str, *, kernels: dict[str, Callable | CppKernel], fake: Callable,
                 save: Callable | None = None, backward: Callable | None = None, differentiable: bool = True,
                 backward_only_outputs: tuple[int, ...] = (), non_differentiable_outputs: tuple[int, ...] = (),
                 public_name: str | None = None):
        self.name = schema.split("(", 1)[0]
        self.qualname = f"{NAMESPACE}::{self.name}"
        self.save, self.backward = save, backward
        lib.define(schema)
        self.kernels: dict[str, Callable] = {}
        self._cpp: CppKernel | None = None
        for backend, kernel in kernels.items():
            if isinstance(kernel, CppKernel):  # registered in C++ when its extension loads
                self._cpp = kernel
                self.kernels[backend] = self._first_cpp_call
                torch.library.impl(self.qualname, "default", lib=lib)(self._load_cpp_kernel)
                continue
            if backend == "triton":  # Triton launches on the current GPU: run with the tensors' GPU current
                kernel = _on_tensor_device(kernel)
            self.kernels[backend] = kernel
            torch.library.impl(self.qualname, DISPATCH_KEYS[backend], lib=lib)(kernel)
        torch.library.register_fake(self.qualname, fake, lib=lib)
        if backward is not None:
            torch.library.register_autograd(self.qualname, self._registered_backward,
                                            setup_context=self._registered_setup, lib=lib)
        elif differentiable:
            torch.library.register_autograd(self.qualname, self._no_backward, setup_context=_no_setup, lib=lib)
        self.public_name = public_name or self.name
        self.overload = getattr(getattr(torch.ops, NAMESPACE), self.name).default
        # ops without Tensor[] arguments skip the flattening on every call
        self._has_lists = "[]" in schema.split("->")[0]
        returns = schema.rsplit("->", 1)[1].strip()
        self.num_outputs = returns.count(",") + 1 if returns.startswith("(") else 1
        # the eager route: outputs through its autograd node (None: all) and beside it
        self.side_outputs = tuple(non_differentiable_outputs)
        hidden = set(backward_only_outputs) | set(non_differentiable_outputs)
        self.autograd_outputs = tuple(i for i in range(self.num_outputs) if i not in hidden) if hidden else None

    # ---- a kernel registered in C++ (see CppKernel) ----
    def _first_cpp_call(self, *args):
        """The eager route's first CPU call: loads the extension (which registers the op's CPU
        kernel) and puts its Python binding in place of this one."""
        self.kernels["cpu"] = kernel = self._cpp.load()  # type: ignore[union-attr]
        return kernel(*args)

    def _load_cpp_kernel(self, *args):
        """The registered op where its device has no kernel: on CPU before the extension is loaded."""
        cpp = self._cpp
        assert cpp is not None  # registered only for an op with a CppKernel
        device = next(a.device for a in _flatten(args)[0] if isinstance(a, torch.Tensor))
        if device.type != "cpu":
            raise NotImplementedError(f"{self.qualname} has no kernel for {device.type} tensors")
        if self.kernels["cpu"] != self._first_cpp_call:  # loaded, yet no C++ kernel took over
            raise RuntimeError(f"the '{cpp.extension}' extension registered no CPU kernel for {self.qualname}; "
                               "rebuild it (python -m gnnfuse build)")
        self.kernels["cpu"] = cpp.load()
        return self.overload(*args)  # now dispatched to the C++ kernel

    # the registered op's autograd rule: the same save and backward as the eager route
    def _registered_setup(self, ctx, inputs, output) -> None:
        ctx.backend, ctx.layout = None, (_flatten(inputs)[1] if self._has_lists else None)
        if self.side_outputs:
            ctx.mark_non_differentiable(*(output[i] for i in self.side_outputs))
        _save(ctx, self, inputs, output)

    def _registered_backward(self, ctx, *grads):
        needs = tuple(any(v) if isinstance(v, (list, tuple)) else bool(v) for v in ctx.needs_input_grad)
        grads = _grads(ctx, self, needs, grads)
        if ctx.layout is None:
            return grads
        return tuple(_list_of_nones(g, n) for g, n in zip(grads, ctx.layout))

    def _no_backward(self, ctx, *grads):
        raise RuntimeError(
            f"gnnfuse.{self.public_name} does not support double backward (differentiating its gradient); "
            "use backend='reference' if you need higher-order derivatives")

    def from_backward(self, ctx, *args):
        """Runs this op inside another op's ``backward`` (``ctx`` is that backward's): the registered
        op there, else this backend's kernel directly (differentiable only under create_graph)."""
        backend = ctx.backend
        if backend is None:
            return self.overload(*args)
        if torch.is_grad_enabled():  # create_graph=True: the result must be differentiable (or raise)
            return self(*args, backend=backend)
        return self.kernels[backend](*args)

    def __call__(self, *args, backend: str | None = None):
        """Runs the op. ``backend`` None: the registered op (dispatch by device). "cpu" / "triton":
        that backend's kernel through the eager route where allowed, else the registered op."""
        if backend is None:
            return self.overload(*args)
        if self._has_lists:
            flat, layout = _flatten(args)
        else:
            flat, layout = args, None
        eager, grad_pos = _scan(flat)
        if not eager:
            if not (backend == "triton" and flat[0].is_cpu):  # TRITON_INTERPRET=1: the dispatcher can't
                return self.overload(*args)
            grad_pos = tuple(i for i, t in enumerate(flat) if isinstance(t, torch.Tensor) and t.requires_grad)
        if not (grad_pos and torch.is_grad_enabled()):
            return self.kernels[backend](*args)  # nothing to differentiate: no autograd node
        if self.backward is None:
            return self.overload(*args)  # its autograd rule raises on backward
        side: list = []
        route = (self, backend, layout, grad_pos)
        flat = flat if layout is None else tuple(flat)
        apply = _eager_apply if eager else _Eager.apply  # (not eager: the Triton interpreter's way round the gate)
        output = apply(route, flat, side, flat[grad_pos[0]]) if len(grad_pos) == 1 else \
            apply(route, flat, side, *[flat[i] for i in grad_pos])
        if self.autograd_outputs is None:
            return output
        full = [None] * self.num_outputs
        for i, o in zip(self.autograd_outputs, output if len(self.autograd_outputs) > 1 else (output,)):
            full[i] = o
        for i, o in zip(self.side_outputs, side):
            full[i] = o
        return tuple(full)


def _no_setup(ctx, inputs, output) -> None:
    return None


def _on_tensor_device(kernel: Callable) -> Callable:
    """``kernel`` run with the GPU of its first argument current (a device guard): Triton compiles
    for, launches on and takes the stream of the current device, so a tensor on another GPU would
    otherwise be read from the wrong one. Free when that GPU is already current (the usual case)."""

    def run(*args):
        first = args[0]
        if isinstance(first, torch.Tensor) and first.is_cuda and first.get_device() != current_cuda_device():
            with torch.cuda.device(first.device):
                out = kernel(*args)
        else:
            out = kernel(*args)
        if RANGE_CHECKS_PENDING:  # a graph built on the GPU whose range check no host read took yet
            range_check.resolve(*args)
        return out

    run.__wrapped__ = kernel  # type: ignore[attr-defined]
    return run
