"""Grid-size arithmetic for the kernel launchers, in plain Python (no Triton import, so the dispatch
module can use it too). ``triton.cdiv`` and ``triton.next_power_of_2`` are ConstexprFunctions in
recent Tritons: several us a call on a device host, most of a kernel launch."""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), like ``triton.next_power_of_2``."""
    return 1 << max(n - 1, 0).bit_length()
