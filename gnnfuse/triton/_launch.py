"""The one launch path of gnnfuse's Triton kernels: device guard, then a fenced fast launch or
Triton's plain one.

Every launch runs with the GPU of its first argument current (a device guard,
``torch.cuda.device(t.device)``): Triton compiles for, launches on and takes the stream of the
current device, so a tensor on another GPU would otherwise be read on the wrong one. When that GPU
is already current (the usual case) the guard costs two integer reads and a comparison (the current
device read without CUDA's lazy-init check: ops._torch_private.current_cuda_device).

``kernel[grid](*args, **meta)`` re-derives Triton's specialisation of every argument (dtype and
16-byte alignment of pointers; width, ``== 1`` and divisibility by 16 of ints) and its cache key
on each call: on an H200 host that Python work is half of the 15 us a launch costs, and a small
graph's whole kernel takes less. :class:`FastKernel` wraps a ``@triton.jit`` function, keys the
compiled kernel by the same properties (a superset of what Triton specialises on, so a hit can
only find a kernel compiled for equal specialisations) and calls Triton's C launcher directly.

:class:`BoundLaunches` goes one step further for callers with a fixed configuration (a cached
per-graph setup: gather_scatter.py's forward and backward setups and the attention kernels'
attention_launches.py launch through them): each step's compiled kernel, grid and constexprs are
kept, and a later launch checks only the varying tensors' alignment and hands the launcher data
pointers, not tensors (:func:`addresses`).

The first call per key goes through ``kernel[grid]`` (compiling if needed). The plain path is
always taken under ``TRITON_INTERPRET=1``, while Triton launch hooks are set (profilers), for a
compiled kernel that lacks the attributes used here, when ``GNNFUSE_TRITON_FAST_LAUNCH=0``, and on
a Triton outside ``TESTED_TRITON``: the fast path reads Triton internals (the JIT function's
``params``, the compiled kernel's ``run``/``function``/``packed_metadata`` and the argument list of
its C launcher), which change between releases. Widen the range only after
tests/test_triton_gather_scatter.py's test_fast_launch_matches_the_jit_launch (one kernel) and
test_fast_and_plain_launch_paths_agree_bitwise (forward and backward of every reduction) pass on a
GPU with that Triton: both compare the two paths bitwise. A bound launch on the Tritons of
``DIRECT_TRITON`` (inside that range) calls the C launcher itself, without the launcher object's
Python ``__call__`` (``_direct_launch``: only a CUDA launcher without scratch buffers); widen that range
only after tests/test_attention_node_setups.py's test_direct_bound_and_plain_launches_agree_bitwise
passes on a GPU with that Triton (it asserts that the direct call was taken and compares its bits
with compiled.run's and Triton's plain launch).
"""
from __future__ import annotations

import torch
import triton

from .. import config
from ..ops._torch_private import current_cuda_device  # (the public torch.cuda.current_device off the tested torch)

TESTED_TRITON = ((3, 6), (3, 6))  # inclusive (major, minor) range the fast path was tested on
# A bound launch calls the compiled kernel's C launcher itself (skipping the Python ``__call__`` of
# Triton's CudaLauncher: two scratch allocations of size 0, a closure) on these Tritons only: that
# call's argument list is Triton's private launcher ABI (3.6: grid, stream, function, cooperative
# and PDL flags, global and profile scratch, then metadata, hooks and the kernel's arguments).
DIRECT_TRITON = ((3, 6), (3, 6))


def tested_triton(version: str = triton.__version__, tested: tuple = TESTED_TRITON) -> bool:
    """Whether ``version`` lies in ``tested`` (TESTED_TRITON: else every launch takes Triton's own path)."""
    try:
        major_minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return tested[0] <= major_minor <= tested[1]


_ENABLED = config.enabled("GNNFUSE_TRITON_FAST_LAUNCH") and tested_triton()
_DIRECT = _ENABLED and tested_triton(tested=DIRECT_TRITON)


def _spec(a: object) -> object:
    """What Triton specialises an argument on (or more)."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() & 15 == 0)
    if type(a) is int:
        return ("i", a == 1, a & 15 == 0, -(2**31) <= a < 2**31, a >= 2**63)
    return (type(a), a)  # bool, float, None: by value (bool and None may be compile-time constants)


def _active(hook) -> bool:
    """A launch hook that does something: newer Tritons keep an (empty) HookChain, not None."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _hooks_set() -> bool:
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None:
        return True  # an older Triton: keep its own launch path
    return _active(runtime.launch_enter_hook) or _active(runtime.launch_exit_hook)


class FastKernel:
    """``FastKernel(jit_fn)[grid](*runtime_args, **constexprs_and_options)``, like the JIT function.

    Runtime arguments must be positional and come first in the signature, constexprs by keyword
    (how every gnnfuse launcher calls); other call shapes take the plain path.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        # (the interpreter's functions are no JITFunction; off the tested Tritons no internal is read)
        self._fast = _ENABLED and isinstance(kernel, triton.runtime.jit.JITFunction)
        self._compiled: dict[tuple, tuple | None] = {}
        if self._fast:
            params = kernel.params
            self._num_runtime = sum(not p.is_constexpr for p in params)
            self._constexpr_names = tuple(p.name for p in params if p.is_constexpr)
            # runtime parameters first, then constexprs: then positional args + constexpr values
            # are the launcher's argument list in signature order
            self._fast = all(not p.is_constexpr for p in params[: self._num_runtime])

    def __getattr__(self, name):  # everything else (fn, params, ...) is the JIT function's
        return getattr(self.kernel, name)

    def __getitem__(self, grid):
        return lambda *args, **meta: self._launch(grid, args, meta)

    def _takes_fast_path(self, args: tuple) -> bool:
        return _ENABLED and self._fast and len(args) == self._num_runtime and not _hooks_set()

    def _launch(self, grid, args: tuple, meta: dict):
        first = args[0] if args else None
        if not (isinstance(first, torch.Tensor) and first.is_cuda):  # the interpreter's CPU tensors
            return self.kernel[grid](*args, **meta)
        device = first.get_device()
        if device != current_cuda_device():  # the device guard
            with torch.cuda.device(device):
                return self._launch(grid, args, meta)
        if not self._takes_fast_path(args):
            return self.kernel[grid](*args, **meta)
        key = (device, tuple(map(_spec, args)), tuple(meta.items()))
        hit = self._compiled.get(key, False)
        if hit is False:  # first call with these specialisations: Triton binds, compiles, launches
            compiled = self.kernel[grid](*args, **meta)
            self._compiled[key] = self._entry(compiled, meta)
            return compiled
        if hit is None:
            return self.kernel[grid](*args, **meta)
        compiled, constexprs = hit  # type: ignore[misc]  # a (compiled, constexprs) entry here
        _run_compiled(compiled, _grid3(grid), device, args, constexprs)
        return compiled

    def bind(self, grid, args: tuple, meta: dict) -> _Bound | None:
        """Launches like ``self[grid](*args, **meta)``; returns what repeats that launch with other
        arguments of the same specialisations (see BoundLaunches), or None off the fast path."""
        compiled = self._launch(grid, args, meta)
        if not self._takes_fast_path(args):
            return None
        entry = self._entry(compiled, meta)
        return None if entry is None else _Bound(entry[0], entry[1], grid, args[0].get_device())

    def _entry(self, compiled, meta: dict) -> tuple | None:
        if not all(name in meta for name in self._constexpr_names):
            return None  # a default-valued constexpr: leave the binding to Triton
        if not all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
            return None
        return compiled, tuple(meta[name] for name in self._constexpr_names)


def fast_kernel(kernel) -> FastKernel:
    """Decorator, under ``@triton.jit``: ``@fast_kernel @triton.jit def k(...)``."""
    return FastKernel(kernel)


def _grid3(grid: tuple) -> tuple[int, int, int]:
    return grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1


def _run_compiled(compiled, grid3: tuple[int, int, int], device: int, args: tuple | list,
                  constexprs: tuple) -> None:
    """Triton's C launcher of a compiled kernel, called directly (what ``kernel[grid]`` ends in)."""
    compiled.run(*grid3, torch._C._cuda_getCurrentRawStream(device), compiled.function, compiled.packed_metadata,
                 None, None, None, *args, *constexprs)


def _direct_launch(compiled) -> tuple | None:
    """(C launcher, its leading arguments after the stream) of a compiled kernel where the bound launch
    may call it directly (DIRECT_TRITON, module doc): Triton's CudaLauncher with no global or profile
    scratch (its ``__call__`` then passes None for both) and the plain C launch (no tensor-descriptor
    wrapper). None elsewhere: the launch goes through ``compiled.run``."""
    if not _DIRECT:
        return None
    try:
        run = compiled.run
        if type(run).__name__ != "CudaLauncher" or run.global_scratch_size or run.profile_scratch_size:
            return None
        launch = run.launch
        if type(launch).__name__ != "builtin_function_or_method":
            return None
        return launch, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                        compiled.packed_metadata, None, None, None)
    except AttributeError:
        return None


class _Bound:
    """One compiled kernel with its grid and constexprs fixed."""

    __slots__ = ("compiled", "constexprs", "grid", "device", "direct")

    def __init__(self, compiled, constexprs: tuple, grid: tuple, device: int):
        self.compiled, self.constexprs, self.grid, self.device = compiled, constexprs, _grid3(grid), device
        self.direct = _direct_launch(compiled)

    def launch(self, args: tuple) -> None:
        self._run(addresses(args))

    def launch_aligned(self, args: tuple) -> bool:
        """Launches unless a tensor among ``args`` is not 16-byte aligned (returns False, nothing
        launched): the alignment check of BoundLaunches.usable in the same pass as the addresses."""
        values, bits = [], 0
        for a in args:
            if isinstance(a, torch.Tensor):
                a = a.data_ptr()
                bits |= a
            values.append(a)
        if bits & 15:
            return False
        self._run(values)
        return True

    def _run(self, values: list) -> None:
        direct = self.direct
        if direct is None:
            _run_compiled(self.compiled, self.grid, self.device, values, self.constexprs)
            return
        grid = self.grid
        direct[0](grid[0], grid[1], grid[2], torch._C._cuda_getCurrentRawStream(self.device), *direct[1],
                  *values, *self.constexprs)


def addresses(args: tuple) -> list:
    """``args`` with each tensor replaced by its data pointer. Triton's launcher takes an int for a
    pointer argument as it is; a tensor costs it a call of ``data_ptr`` through Python's C API and a
    driver query (``cuPointerGetAttribute``, which checks that the memory is the GPU's) per pointer,
    some twenty per attention launch. A bound launch's tensors were checked by its op (one device,
    the GPU's) and by FastKernel on the first, bound call."""
    return [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]


class BoundLaunches:
    """The launches of one fixed configuration (e.g. one graph's forward at one feature width),
    by step name. A step binds its kernel on first use; later calls skip the per-argument
    specialisation that FastKernel still does (about 0.3 us an argument on our hosts, and the
    kernels take 12-17). The caller owns the promise this rests on: a step's grid, constexprs
    and every argument's dtype and int value match the bound call. ``usable`` checks the rest
    (the varying tensors' 16-byte alignment, launch hooks); pass its answer as ``fast``."""

    def __init__(self):
        self._bound: dict[str, _Bound] = {}

    @staticmethod
    def usable(*varying: torch.Tensor) -> bool:
        return BoundLaunches.enabled() and _aligned(varying)

    @staticmethod
    def enabled() -> bool:
        """``usable()`` without the alignment check: pass ``ALIGN`` as ``fast`` where this holds, and
        each bound launch checks every tensor's alignment while it takes the addresses (one pass),
        falling back to the plain launch for a misaligned one."""
        return _ENABLED and not _hooks_set()

    def __call__(self, step: str, kernel: FastKernel, grid: tuple, args: tuple, meta: dict, fast: bool) -> None:
        """Launches step ``step``: ``kernel[grid](*args, **meta)`` on the GPU of ``args[0]``, through
        the step's bound launch when ``fast`` (the first call binds it), else through FastKernel
        (whose own device guard and version fence apply). ``fast`` is usable()'s answer, or ALIGN
        where enabled() holds: then the launch checks every tensor's alignment itself."""
        if not fast:
            kernel[grid](*args, **meta)
            return
        device = args[0].get_device()
        if device != current_cuda_device():  # FastKernel's launch switches device first
            kernel[grid](*args, **meta)
            return
        bound = self._bound.get(step)
        if bound is None:
            if fast is ALIGN and not _aligned(args):
                kernel[grid](*args, **meta)
                return
            bound = kernel.bind(grid, args, meta)  # launches
            if bound is not None:
                self._bound[step] = bound
        elif bound.device != device:  # bound on another GPU (not expected: a setup belongs to one GPU's graph)
            kernel[grid](*args, **meta)
        elif fast is not ALIGN:
            bound.launch(args)
        elif not bound.launch_aligned(args):
            kernel[grid](*args, **meta)


ALIGN = "align"  # BoundLaunches' ``fast``: enabled(), every tensor's alignment checked at the launch


def _aligned(args: tuple) -> bool:
    bits = 0
    for a in args:
        if isinstance(a, torch.Tensor):
            bits |= a.data_ptr()
    return not bits & 15
