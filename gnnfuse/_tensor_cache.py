"""Values derived from tensors (a CSR, a kernel plan, an atom order), cached on the tensors' memory.

An entry is keyed on where its source tensors' contents live (data pointer, shape, strides, dtype)
plus extra hashable values, and it is served only while every source still passes its *stamp*:

  * the same storage object (the entry holds a weak reference to each source's storage, never to
    the tensor object, so ``torch.utils.swap_tensors`` and ``module.to()`` with swapping enabled
    are not blocked), at the same data pointer: catches ``t.data = other``, ``set_`` and a freed
    and reused address;
  * the same in-place version counter: catches every ordinary in-place write (``t[0] = 1``,
    ``t.add_()``, ``out=``, a write through any view of ``t``);
  * on CPU, the same *fingerprint*: the bytes of the tensor's memory span when it is at most
    ``FULL_BYTES`` long, else ``SAMPLES`` evenly spaced elements of it, the first and the last
    included. This catches writes that bypass the version counter (through ``.data``, ``.numpy()``,
    DLPack, another tensor aliasing the storage) wherever they change a fingerprinted byte; a
    write elsewhere into a large tensor that bypasses the version counter is NOT detected (hashing
    everything would cost as much as the work the cache saves). On CUDA no fingerprint is taken
    (reading device memory would need a host sync): only storage, pointer and version are checked.

Inference tensors (made under ``torch.inference_mode()``) have no version counter, and tensor
subclasses (a PyG ``EdgeIndex`` wraps its data: pass ``as_tensor()``) may have no storage of their
own: values derived from either are never cached, just built (correct, at the cost of rebuilding
on each call).
An entry dies with the first of its sources' storages to be freed.

Code that Dynamo may trace must not use the cache while compiling (a hit is Python state that would
be baked into the graph): see ``csr_for_edge_index``. Kernel launchers need no such check: they run
inside registered ops, which torch.compile never traces.
"""
from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

T = TypeVar("T")
FULL_BYTES = 512  # spans up to this size are fingerprinted whole
SAMPLES = 32  # elements read from a larger span
PLAIN = (torch.Tensor, torch.nn.Parameter)  # types whose data_ptr/storage are their own memory
_entries: dict[tuple, tuple[tuple[tuple, ...], object]] = {}


# ---- stamps ----------------------------------------------------------------------------------------
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


def stamp(t: torch.Tensor, on_free: Callable | None = None) -> tuple:
    """What must stay the same for a value derived from ``t`` to still hold: (weak reference to its
    storage, data pointer, version, fingerprint view or None on CUDA, fingerprint). ``on_free``
    is called when the storage is freed. Not for inference tensors (no version counter)."""
    view = fingerprint_view(t)
    storage = weakref.ref(t.untyped_storage(), on_free)
    return storage, t.data_ptr(), t._version, view, None if view is None else view.tobytes()


def same_stamp(t: torch.Tensor, old: tuple) -> bool:
    """True while ``t`` still matches ``stamp(t)`` taken earlier (see the module docstring).
    False, not an error, for an inference tensor (no version counter)."""
    try:
        if old[0]() is not t.untyped_storage() or t.data_ptr() != old[1] or t._version != old[2]:
            return False
    except RuntimeError:  # an inference tensor sharing the storage: it has no version to compare
        return False
    view = old[3]
    return view is None or view.tobytes() == old[4]


# ---- the cache ----------------------------------------------------------------------------------
def cached(kind: str, sources: tuple[torch.Tensor, ...], key: tuple, build: Callable[[], T]) -> T:
    """``build()``, or its cached result for these source tensors' contents, unchanged, and ``key``."""
    if len(sources) == 1:  # the common case (hot path of every GPU call), inlined
        t = sources[0]
        if type(t) not in PLAIN:
            return build()
        k = (kind, t.data_ptr(), t.dtype, t.shape, t.stride(), key)
        hit = _entries.get(k)
        if hit is not None:
            old = hit[0][0]  # its data pointer is part of the key: not compared again
            try:
                if old[0]() is t.untyped_storage() and t._version == old[2] and (
                        old[3] is None or old[3].tobytes() == old[4]):
                    return hit[1]  # type: ignore[return-value]
            except RuntimeError:  # an inference tensor sharing the storage: no version to compare
                pass
    else:
        if any(type(t) not in PLAIN for t in sources):
            return build()
        k = (kind, *[(t.data_ptr(), t.dtype, t.shape, t.stride()) for t in sources], key)  # type: ignore[assignment]
        hit = _entries.get(k)
        if hit is not None and all(same_stamp(t, old) for t, old in zip(sources, hit[0])):
            return hit[1]  # type: ignore[return-value]
    if any(type(t) not in PLAIN or t.is_inference() for t in sources):  # see the module docstring
        return build()
    value = build()
    forget = lambda _ref, k=k: _entries.pop(k, None)  # noqa: E731  (the first freed storage ends the entry)
    _entries[k] = (tuple(stamp(t, forget) for t in sources), value)
    return value


def clear() -> None:
    _entries.clear()
