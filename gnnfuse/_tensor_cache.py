"""Values derived from tensors (a CSR, a kernel plan, an atom order), cached on the tensors' memory,
and the *stamps* that tell whether such a value still holds.

A stamp of some tensors records, for each:

  * which tensor it is: the same tensor object (a CSR's own tensors, which the CSR holds anyway)
    or the same storage (a cache entry, which holds only a weak reference to each source's storage,
    never to the tensor object, so ``torch.utils.swap_tensors`` and ``module.to()`` with swapping
    enabled are not blocked), at the same data pointer: catches ``t.data = other``, ``set_`` and a
    freed and reused address;
  * its dtype, shape and strides: catches ``t.data = t.data[:k]`` (same pointer, other view);
  * its in-place version counter: catches every ordinary in-place write (``t[0] = 1``,
    ``t.add_()``, ``out=``, a write through any view of ``t``);
  * on CPU, a *fingerprint*: the bytes of the tensor's memory span when it is at most
    ``FULL_BYTES`` long, else ``SAMPLES`` evenly spaced elements of it, the first and the last
    included. This catches writes that bypass the version counter (through ``.data``, ``.numpy()``,
    DLPack, another tensor aliasing the storage) wherever they change a fingerprinted byte; a
    write elsewhere into a large tensor that bypasses the version counter is NOT detected (hashing
    everything would cost as much as the work the cache saves). On CUDA no fingerprint is taken
    (reading device memory would need a host sync).

Stamps are taken and compared in C++ (one call for all of a value's tensors, about 0.1 us) once
gnnfuse's C++ graph kernels are loaded (:func:`use_native`: every CPU CSR is built or checked by
them, so CPU graphs always get these), else in Python (the same checks, about 0.3 us a tensor).

Inference tensors (made under ``torch.inference_mode()``) have no version counter, and tensor
subclasses (a PyG ``EdgeIndex`` wraps its data: pass ``as_tensor()``) may have no storage of their
own: they get no stamp, so values derived from them are never cached, just built (correct, at the
cost of rebuilding on each call). A cache entry dies with the first of its sources' storages to be
freed.

Code that Dynamo may trace must not use the cache while compiling (a hit is Python state that would
be baked into the graph): see ``csr_for_edge_index``. Kernel launchers need no such check: they run
inside registered ops, which torch.compile never traces.
"""
from __future__ import annotations

import contextlib
import ctypes
import weakref
from collections.abc import Callable, Iterator
from typing import TypeVar

import numpy as np
import torch

T = TypeVar("T")
FULL_BYTES = 512  # spans up to this size are fingerprinted whole (the C++ stamps use the same sizes)
SAMPLES = 32  # elements read from a larger span
PLAIN = (torch.Tensor, torch.nn.Parameter)  # types whose data_ptr/storage are their own memory
SAME_MEMORY, SAME_OBJECT = 0, 1  # stamp modes (see the module docstring)
_native: list[Callable] = []  # [take_stamp, same_stamp] of the C++ graph kernels, once loaded
_in_python = [False]  # set inside python_stamps()
_entries: dict[tuple, tuple] = {}  # key -> (same, stamp, value, weak references to the storages)


def use_native(extension) -> None:
    """Takes stamps in C++ from now on (called once gnnfuse's C++ graph kernels are loaded)."""
    if not _native and not _in_python[0]:
        _native[:] = [extension.take_stamp, extension.same_stamp]


def stamps_in_cpp() -> bool:
    """Whether new stamps are taken in C++ (see :func:`use_native`)."""
    return bool(_native)


def cpp_stamp(data: bytes | None) -> tuple[Callable[..., bool], object] | None:
    """The stamp, as :func:`take` gives it, whose data a C++ check took along with its check."""
    return None if data is None else (_native[1], data)


@contextlib.contextmanager
def python_stamps() -> Iterator[None]:
    """Within the block, new stamps are taken in Python, as without the C++ kernels (for tests and
    benchmarks of that path). Stamps taken before keep their own kind."""
    saved = list(_native)
    _native.clear()
    _in_python[0] = True
    try:
        yield
    finally:
        _in_python[0] = False
        _native[:] = saved


# ---- stamps ----------------------------------------------------------------------------------------
def take(mode: int, tensors: tuple[torch.Tensor, ...]) -> tuple[Callable[..., bool], object] | None:
    """A stamp of ``tensors``: ``(same, data)``, where ``same(data, *tensors)``, given the same
    number of tensors in the same order, is True while they still match (see the module
    docstring); None for tensors that cannot be stamped (inference tensors, subclasses). In mode
    ``SAME_OBJECT`` the caller keeps the tensors and their storages alive; in mode ``SAME_MEMORY``
    it drops the stamp when one of the storages is freed, and keys it on the tensors' data pointers
    and shapes (the Python stamps leave those to the key)."""
    for t in tensors:
        if type(t) not in PLAIN:
            return None
    if _native:
        data = _native[0](mode, *tensors)
        return None if data is None else (_native[1], data)
    if any(t.is_inference() for t in tensors):
        return None
    return _take_in_python(mode, tensors)


def _take_in_python(mode: int, tensors: tuple[torch.Tensor, ...]) -> tuple[Callable[..., bool], object]:
    # The common cases are written out (about 30% faster to compare): a CSR's perm, its rowptr and
    # col, and a cache entry of one tensor (the hot path of every GPU call).
    if mode == SAME_OBJECT and len(tensors) == 1:
        a = tensors[0]
        va = fingerprint_view(a)
        return _same_object_1, (a, (a.data_ptr(), a._version, a.shape, a.stride(), a.dtype), va,
                                va is not None and va.tobytes())
    if mode == SAME_OBJECT and len(tensors) == 2:
        a, b = tensors
        flat = (a.data_ptr(), b.data_ptr(), a._version, b._version, a.shape, b.shape, a.stride(), b.stride(),
                a.dtype, b.dtype)
        va, vb = fingerprint_view(a), fingerprint_view(b)
        return _same_objects_2, (a, b, flat, va, vb, va is not None and va.tobytes(), vb is not None and vb.tobytes())
    views = tuple(v for v in map(fingerprint_view, tensors) if v is not None)  # CPU tensors only
    prints = tuple([v.tobytes() for v in views])
    if mode == SAME_OBJECT:
        layout = tuple([(t.data_ptr(), t._version, t.dtype, t.shape, t.stride()) for t in tensors])
        return _same_objects, (tuple(map(id, tensors)), layout, views, prints)
    storages = tuple([weakref.ref(t.untyped_storage()) for t in tensors])
    contents = tuple([(t._version, t.dtype, t.stride()) for t in tensors])  # data pointer and shape: in the key
    if len(tensors) == 1:
        return _same_memory_1, (storages[0], contents[0], views[0] if views else None, prints[0] if views else None)
    return _same_memory, (storages, contents, views, prints)


# Python stamps, compared. Each reads a fingerprint only once the memory is known to be the stamped
# tensor's. An inference tensor in place of a stamped one has no version to compare (RuntimeError):
# not the same.
def _same_objects(data: tuple, *tensors: torch.Tensor) -> bool:
    """Mode SAME_OBJECT: the caller holds the stamped tensors, so their ids stay theirs."""
    ids, layout, views, prints = data
    try:
        return (tuple(map(id, tensors)) == ids
                and tuple([(t.data_ptr(), t._version, t.dtype, t.shape, t.stride()) for t in tensors]) == layout
                and tuple([v.tobytes() for v in views]) == prints)
    except RuntimeError:
        return False


def _same_object_1(data: tuple, a: torch.Tensor) -> bool:
    """Mode SAME_OBJECT, one tensor: the same checks as _same_objects, written out."""
    a0, flat, va, pa = data
    try:
        return (a is a0 and (a.data_ptr(), a._version, a.shape, a.stride(), a.dtype) == flat
                and (va is None or va.tobytes() == pa))
    except RuntimeError:
        return False


def _same_objects_2(data: tuple, a: torch.Tensor, b: torch.Tensor) -> bool:
    """Mode SAME_OBJECT, two tensors: the same checks as _same_objects, written out."""
    a0, b0, flat, va, vb, pa, pb = data
    try:
        return (a is a0 and b is b0 and (a.data_ptr(), b.data_ptr(), a._version, b._version, a.shape, b.shape,
                                         a.stride(), b.stride(), a.dtype, b.dtype) == flat
                and (va is None or va.tobytes() == pa) and (vb is None or vb.tobytes() == pb))
    except RuntimeError:
        return False


def _same_memory(data: tuple, *tensors: torch.Tensor) -> bool:
    """Mode SAME_MEMORY, several tensors (their data pointers and shapes are part of the cache's key)."""
    storages, layout, views, prints = data
    if len(tensors) != len(storages):
        return False
    for t, storage in zip(tensors, storages):
        if storage() is not t.untyped_storage():
            return False
    try:
        return (tuple([(t._version, t.dtype, t.stride()) for t in tensors]) == layout
                and tuple([v.tobytes() for v in views]) == prints)
    except RuntimeError:
        return False


def _same_memory_1(data: tuple, t: torch.Tensor) -> bool:
    """Mode SAME_MEMORY, one tensor (its data pointer and shape are part of the cache's key)."""
    storage, layout, view, fingerprint = data
    try:
        return (storage() is t.untyped_storage() and (t._version, t.dtype, t.stride()) == layout
                and (view is None or view.tobytes() == fingerprint))
    except RuntimeError:
        return False


def _span_bytes(t: torch.Tensor) -> int:
    if t.is_contiguous():
        return t.numel() * t.element_size()
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()


_UNSIGNED = {n: np.dtype(f"u{n}") for n in (1, 2, 4, 8)}
_EMPTY = np.empty(0, dtype=np.uint8)  # the fingerprint view of an empty span: reads as b""


def fingerprint_view(t: torch.Tensor) -> np.ndarray | None:
    """A numpy view of the fingerprinted elements of a CPU tensor (see the module docstring); its
    ``tobytes()`` is the fingerprint (about 0.15 us). None on CUDA. The view holds no reference to
    the storage (the cache must not keep tensors alive), so it is read only after the stamp has
    confirmed that the tensor in hand still owns that memory."""
    if not t.is_cpu:
        return None
    span = _span_bytes(t)
    if span == 0:
        return _EMPTY
    dtype = _UNSIGNED.get(t.element_size(), _UNSIGNED[1])
    memory = (ctypes.c_char * span).from_address(t.data_ptr())
    size = dtype.itemsize
    n = span // size
    if span <= FULL_BYTES:
        return np.ndarray((n,), dtype=dtype, buffer=memory)  # type: ignore[arg-type]  # ctypes arrays export the buffer protocol
    # two rows of SAMPLES // 2 evenly spaced elements: the first row starts at the first
    # element, the second ends at the last one (one strided view: a single read)
    k = SAMPLES // 2
    step = (n - 1) // (k - 1)
    shift = (n - 1) - (k - 1) * step
    return np.ndarray((2, k), dtype=dtype, buffer=memory,  # type: ignore[arg-type]
                      strides=(shift * size, step * size))


# ---- the cache ----------------------------------------------------------------------------------
def cached(kind: str, sources: tuple[torch.Tensor, ...], key: tuple, build: Callable[[], T]) -> T:
    """``build()``, or its cached result for these source tensors' contents, unchanged, and ``key``."""
    if len(sources) == 1:  # the common case (hot path of every GPU call), inlined
        t = sources[0]
        if type(t) not in PLAIN:
            return build()
        k = (kind, t.data_ptr(), t.shape, key)
        hit = _entries.get(k)
        if hit is not None and hit[0](hit[1], t):
            return hit[2]  # type: ignore[no-any-return]
    else:
        if any(type(t) not in PLAIN for t in sources):
            return build()
        k = (kind, *[(t.data_ptr(), t.shape) for t in sources], key)  # type: ignore[assignment]
        hit = _entries.get(k)
        if hit is not None and hit[0](hit[1], *sources):
            return hit[2]  # type: ignore[no-any-return]
    stamp = take(SAME_MEMORY, sources)
    if stamp is None:  # see the module docstring
        return build()
    value = build()
    forget = lambda _ref, k=k: _entries.pop(k, None)  # noqa: E731  (the first freed storage ends the entry)
    _entries[k] = (*stamp, value, tuple(weakref.ref(t.untyped_storage(), forget) for t in sources))
    return value


def clear() -> None:
    _entries.clear()
