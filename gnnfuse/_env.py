"""Environment variables read on hot paths (``GNNFUSE_BACKEND``, ``GNNFUSE_TRITON_KERNEL``, ...).

They are read on every call, so setting one mid-program takes effect at once. ``os.environ.get``
encodes the key and goes through the Mapping machinery: about 1 us a read on our CPU hosts, and a
small-graph GPU call reads three. ``os.environ`` keeps its contents in a private dict (POSIX:
``_data``, bytes keys and values, kept in sync by ``os.environ[k] = v``, ``del``, ``putenv`` via
os.environ, and pytest's monkeypatch); reading that dict costs 0.03 us. Anything unexpected
falls back to ``os.environ.get``.
"""
from __future__ import annotations

import os

_ENCODED: dict[str, bytes] = {}
_POSIX = os.name == "posix"  # elsewhere the private dict has other key types


def get(name: str, default: str | None = None) -> str | None:
    """``os.environ.get(name, default)``, fast."""
    data = getattr(os.environ, "_data", None)
    if type(data) is not dict or not _POSIX:
        return os.environ.get(name, default)
    key = _ENCODED.get(name)
    if key is None:
        key = _ENCODED[name] = os.fsencode(name)
    value = data.get(key)
    return default if value is None else os.fsdecode(value)
