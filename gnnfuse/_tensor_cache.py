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
    ``FULL_BYTES`` long, else its first and last 8 bytes and ``SAMPLES - 2`` evenly spaced 8-byte
    words. This catches writes that bypass the version counter (through ``.data``, ``.numpy()``,
    DLPack, another tensor aliasing the storage) wherever they change a fingerprinted byte; a
    write elsewhere into a large tensor that bypasses the version counter is NOT detected (hashing
    everything would cost as much as the work the cache saves). On CUDA no fingerprint is taken
    (reading device memory would need a host sync): only storage, pointer and version are checked.

Inference tensors (made under ``torch.inference_mode()``) have no version counter: values derived
from them are never cached, just built (correct, at the cost of rebuilding on each call).
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
SAMPLES = 32  # 8-byte words read from a larger span
_entries: dict[tuple, tuple[tuple[tuple, ...], object]] = {}


# ---- stamps ----------------------------------------------------------------------------------------
def _span_bytes(t: torch.Tensor) -> int:
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()


class _Fingerprint:
    """Reads the fingerprinted bytes of a CPU tensor straight from its memory (see the module
    docstring). It holds no reference to the storage (the cache must not keep tensors alive), so
    it is read only after the stamp has confirmed that the tensor in hand still owns that memory."""

    __slots__ = ("windows", "tail")

    def __init__(self, t: torch.Tensor):
        span = _span_bytes(t)
        raw = np.frombuffer((ctypes.c_char * span).from_address(t.data_ptr()), dtype=np.uint8) if span else None
        if span <= FULL_BYTES:
            self.windows, self.tail = raw, None
            return
        stride = (span - 8) // (SAMPLES - 2)  # SAMPLES - 1 windows from the start, then the last 8 bytes
        self.windows = np.lib.stride_tricks.as_strided(raw, shape=(SAMPLES - 1, 8), strides=(stride, 1))
        self.tail = raw[span - 8:]

    def read(self) -> bytes:
        if self.tail is None:
            return b"" if self.windows is None else self.windows.tobytes()
        return self.windows.tobytes() + self.tail.tobytes()


def stamp(t: torch.Tensor, on_free: Callable | None = None) -> tuple:
    """What must stay the same for a value derived from ``t`` to still hold: (weak reference to its
    storage, data pointer, version, fingerprint reader or None on CUDA, fingerprint). ``on_free``
    is called when the storage is freed. Not for inference tensors (no version counter)."""
    reader = _Fingerprint(t) if t.is_cpu else None
    storage = weakref.ref(t.untyped_storage(), on_free)
    return storage, t.data_ptr(), t._version, reader, None if reader is None else reader.read()


def same_stamp(t: torch.Tensor, old: tuple) -> bool:
    """True while ``t`` still matches ``stamp(t)`` taken earlier (see the module docstring)."""
    if old[0]() is not t.untyped_storage() or t.data_ptr() != old[1] or t._version != old[2]:
        return False
    reader = old[3]
    return reader is None or reader.read() == old[4]


# ---- the cache ----------------------------------------------------------------------------------
def cached(kind: str, sources: tuple[torch.Tensor, ...], key: tuple, build: Callable[[], T]) -> T:
    """``build()``, or its cached result for these source tensors' contents, unchanged, and ``key``."""
    for t in sources:
        if t.is_inference():  # no version counter: a change could not be seen, so never cache
            return build()
    k = (kind, *[(t.data_ptr(), t.dtype, t.shape, t.stride()) for t in sources], *key)
    hit = _entries.get(k)
    if hit is not None:
        stamps = hit[0]
        for i in range(len(sources)):  # a plain loop: a generator would double a hit's cost
            if not same_stamp(sources[i], stamps[i]):
                break
        else:
            return hit[1]  # type: ignore[return-value]
    value = build()
    forget = lambda _ref, k=k: _entries.pop(k, None)  # noqa: E731  (the first freed storage ends the entry)
    _entries[k] = (tuple(stamp(t, forget) for t in sources), value)
    return value


def clear() -> None:
    _entries.clear()
