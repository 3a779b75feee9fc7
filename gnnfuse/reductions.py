"""The one table of reduce names: canonical names, accepted aliases and the integer codes the
C++ (csrc/reduce_codes.h) and Triton kernels use for them.

Every public function that takes a reduce name passes it through :func:`canonical_reduce`, so
the spellings of PyG and torch_scatter (``"add"``) and of ``torch.scatter_reduce`` (``"amax"``,
``"amin"``, ``"prod"``) work everywhere. tests/test_reductions.py checks that the header and this
table agree.
"""
from __future__ import annotations

from collections.abc import Iterable

# name -> code. The order of the first five is the order of the C++ ``Reduce`` enum.
CODES: dict[str, int] = {"sum": 0, "mean": 1, "max": 2, "min": 3, "mul": 4, "var": 5, "std": 6}
ALIASES: dict[str, str] = {"add": "sum", "amax": "max", "amin": "min", "prod": "mul"}

# One reduction per call (fused_gather_scatter with a name, scatter, segment_*).
SINGLE: tuple[str, ...] = ("sum", "mean", "max", "min", "mul")
# Reductions a multi-aggregation may combine (var and std need a second moment, so only there).
MULTI: tuple[str, ...] = SINGLE + ("var", "std")
# Reductions whose forward records the winning edge (their gradient goes to one edge).
ARG: tuple[str, ...] = ("max", "min")
# What torch.scatter_reduce calls each single reduction.
TORCH_NAME: dict[str, str] = {"sum": "sum", "mean": "mean", "max": "amax", "min": "amin", "mul": "prod"}

SUM, MEAN, MAX, MIN, MUL, VAR, STD = (CODES[n] for n in ("sum", "mean", "max", "min", "mul", "var", "std"))


def canonical_reduce(name: object, allowed: Iterable[str] = SINGLE, argument: str = "reduce") -> str:
    """The canonical name of reduce ``name`` (an alias resolved), which must be in ``allowed``.

    Raises a ValueError naming ``argument`` and the accepted spellings otherwise.
    """
    canonical = ALIASES.get(name, name) if isinstance(name, str) else name
    allowed = tuple(allowed)
    if canonical not in allowed:
        aliases = [a for a, c in ALIASES.items() if c in allowed]
        also = f" (or the alias{'es' if len(aliases) > 1 else ''} {', '.join(map(repr, aliases))})" if aliases else ""
        raise ValueError(f"{argument} must be one of {', '.join(map(repr, allowed))}{also}; got {name!r}")
    return canonical  # type: ignore[return-value]


def code_of(name: str) -> int:
    """The kernel code of a canonical (or aliased) reduce name."""
    return CODES[ALIASES.get(name, name)]
