"""Every environment variable gnnfuse reads, declared once: name, type, default, when it is read, doc.

Code reads a variable only through :func:`get` (or :func:`enabled` for an on/off flag), never through
``os.environ`` directly, so this table is the complete list; :func:`gnnfuse.show_config` prints the
current values and the README's table is generated from it (a test keeps the two in step).

Values are read from the process environment at the moment stated under "read", so setting a
variable in the running program (``os.environ[...] = ...``, which writes through to the process
environment) takes effect at the next such moment. The per-call ones are read once per call: through
``os.environ.get`` (0.3-0.7 us) until gnnfuse's C++ graph kernels are loaded, then through their
``getenv`` (about 0.05 us), which reads the same environment (see :func:`use_getenv`).

This module imports nothing but the standard library: setup.py and the build cache load it on
their own, without torch or the package.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    type: str  # how the value is read: "choice", "flag" (on/off), "seconds", "integer", "path", "text"
    default: str  # what applies when the variable is unset, as a user would write it ("" = nothing)
    read: str  # when gnnfuse reads it
    doc: str
    group: str  # "runtime", "build", "packaging", "data", "reporting", "examples", "tests"
    choices: tuple[str, ...] = ()
    on: str = "1"  # for flags: the value that turns a default-off flag on ...
    off: str = "0"  # ... and the one that turns a default-on flag off


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    # ---- runtime -------------------------------------------------------------------------------------------
    Setting("GNNFUSE_BACKEND", "choice", "auto", "every op call with backend='auto'",
            "Replaces backend='auto' for every op (e.g. 'reference' to run a whole program on the pure-PyTorch "
            "reference).", "runtime", choices=("auto", "cpu", "triton", "reference")),
    Setting("GNNFUSE_TRITON_KERNEL", "choice", "", "every GPU gather-scatter call",
            "Forces one Triton kernel instead of the planner's choice (coo and atomic: sum/mean only, not "
            "deterministic).", "runtime", choices=("hybrid", "csr", "coo", "atomic")),
    Setting("GNNFUSE_AUTOTUNE", "flag", "0", "every GPU gather-scatter call",
            "1: the first call per (graph, width, dtype, reduction) times candidate tile configs and keeps the "
            "fastest.", "runtime"),
    Setting("GNNFUSE_TRITON_FAST_LAUNCH", "flag", "1", "when gnnfuse's Triton backend is first imported",
            "0: launch Triton kernels through Triton's own launcher instead of the cached fast path.", "runtime"),
    Setting("TRITON_INTERPRET", "flag", "0", "every call with backend='triton' on CPU tensors",
            "Triton's interpreter; gnnfuse accepts backend='triton' for CPU tensors only when it is 1 "
            "(the test suite sets it).", "runtime"),
    Setting("GNNFUSE_CPU_OUTPUT_CACHE_MB", "integer", "1/8 of the machine's memory",
            "by the C++ kernels, at the first CPU output of 32 MiB or more in a process",
            "Megabytes of dead CPU gather-scatter outputs of 32 MiB or more (forward results, x gradients) kept "
            "for reuse by the next call of the same size, which then skips the page faults of fresh memory; 0 "
            "turns it off.",
            "runtime"),
    Setting("GNNFUSE_CACHE_CONSTANT_AGGREGATION", "flag", "1",
            "every fused layer call whose input and edge weights need no gradient",
            "0: a layer's aggregation of a constant input (raw node features, with grad enabled or not) is "
            "computed on every call instead of being kept from the second call with the same input, graph and "
            "weights (gnnfuse.nn._mixin.constant_result).", "runtime"),
    # ---- building the C++ kernels --------------------------------------------------------------------------
    Setting("GNNFUSE_BUILD_DIR", "path", "$XDG_CACHE_HOME/gnnfuse, else ~/.cache/gnnfuse",
            "each build or load of the C++ kernels",
            "Build cache of the C++ kernels: an absolute directory owned by you and not writable by others.",
            "build"),
    Setting("GNNFUSE_BUILD_VERBOSE", "flag", "0", "each build of the C++ kernels",
            "1: show the compiler's output.", "build"),
    Setting("GNNFUSE_BUILD_LOCK_TIMEOUT", "seconds", "600", "when waiting for another process's build",
            "How long to wait for another process that is building the same kernels.", "build"),
    Setting("CXX", "text", "c++", "each build of the C++ kernels (also part of the build cache key)",
            "The C++ compiler, split like a shell would (CXX=\"g++ -w\" is g++ with a flag).", "build"),
    Setting("LIBOMP_PREFIX", "path", "/opt/homebrew/opt/libomp, then /usr/local/opt/libomp",
            "each build of the C++ kernels (macOS)", "Where libomp is installed (Apple clang ships no OpenMP).",
            "build"),
    Setting("XDG_CACHE_HOME", "path", "~/.cache", "when locating the build cache and the dataset cache",
            "Base of gnnfuse's caches when GNNFUSE_BUILD_DIR / GNNFUSE_DATA are unset (a relative path is "
            "ignored).", "build"),
    Setting("USERNAME", "text", "user", "a build whose cache root is unusable, on systems without user ids",
            "Names the private fallback build directory in the temp folder.", "build"),
    Setting("PATH", "text", "", "each build of the C++ kernels",
            "Searched for the compiler and ninja; pip's ninja is put in front of it for the build.", "build"),
    # ---- packaging -----------------------------------------------------------------------------------------
    Setting("GNNFUSE_BUILD_EXTENSIONS", "flag", "0", "pip wheel / setup.py",
            "1: compile the C++ kernels into the wheel (against the installed torch).", "packaging"),
    Setting("GNNFUSE_BUILD_NATIVE", "flag", "0", "pip wheel / setup.py with GNNFUSE_BUILD_EXTENSIONS=1",
            "1: compile the wheel's kernels for this CPU (-march=native) instead of portable code.", "packaging"),
    # ---- data ----------------------------------------------------------------------------------------------
    Setting("GNNFUSE_DATA", "path", "", "when a dataset is loaded without root=",
            "Folder searched first for the real datasets (Cora, CiteSeer, PubMed, Facebook).", "data"),
    # ---- reporting -----------------------------------------------------------------------------------------
    Setting("OMP_NUM_THREADS", "integer", "", "by torch at start-up; gnnfuse only reports it",
            "CPU threads of torch and of gnnfuse's C++ kernels (shown by show_config and the benchmarks).",
            "reporting"),
    # ---- examples ------------------------------------------------------------------------------------------
    Setting("RANK", "integer", "", "by examples/train_ddp.py at start", "This process's rank, set by torchrun.",
            "examples"),
    Setting("WORLD_SIZE", "integer", "", "by examples/train_ddp.py at start",
            "Number of processes, set by torchrun; when set, the example runs as one rank of it.", "examples"),
    Setting("LOCAL_RANK", "integer", "", "by examples/train_ddp.py in each worker",
            "This process's rank on its machine (picks its GPU), set by torchrun.", "examples"),
    # ---- tests ---------------------------------------------------------------------------------------------
    Setting("GNNFUSE_DYNAMIC_BATCHES", "integer", "20", "by the dynamic-shape compile test",
            "How many differently sized batches that test runs through a compiled model.", "tests"),
    Setting("GNNFUSE_TEST_KERNEL_WHEEL", "flag", "0", "by the packaging tests",
            "1: also build and test a wheel with compiled kernels (minutes).", "tests"),
)}


_getenv: Callable[[str], str | None] = os.environ.get  # how values are read (see use_getenv)


def use_getenv(reader: Callable[[str], str | None]) -> None:
    """Reads variables through ``reader(name) -> str | None`` from now on: gnnfuse's C++ graph
    kernels bring one that reads the process environment with C's getenv when they load. It sees
    every ``os.environ`` write (those go through putenv/unsetenv) and skips the two KeyErrors that
    ``os.environ.get`` raises inside for an unset variable (0.6 us on every op call)."""
    global _getenv
    _getenv = reader


def get(name: str, *, traced: bool = False) -> str:
    """The variable's value, or its declared default when unset (a declared variable only: an
    undeclared name is a KeyError, so that every variable gnnfuse reads is in :data:`SETTINGS`).
    ``traced``: the read happens while torch.compile traces, which can follow ``os.environ`` but
    not the C reader (see :func:`use_getenv`)."""
    value = (os.environ.get if traced else _getenv)(name)
    return SETTINGS[name].default if value is None else value


def is_set(name: str) -> bool:
    """True when the (declared) variable is set to a non-empty value."""
    SETTINGS[name]  # noqa: B018  (declared variables only)
    return bool(_getenv(name))


def enabled(name: str, *, traced: bool = False) -> bool:
    """An on/off flag: a default-off flag is on only when set to its ``on`` value ("1"), a
    default-on flag is off only when set to its ``off`` value ("0"). ``traced``: as in :func:`get`."""
    setting = SETTINGS[name]
    value = (os.environ.get if traced else _getenv)(name)
    if setting.default == setting.on:
        return value != setting.off
    return value == setting.on


def current() -> dict[str, str]:
    """Every declared variable with its value now ("unset" when it is not set)."""
    return {name: _getenv(name) or "unset" for name in SETTINGS}


def markdown_table(groups: tuple[str, ...] = ("runtime", "build", "packaging", "data", "reporting", "examples",
                                             "tests")) -> str:
    """The README's table of environment variables."""
    lines = ["| variable | type | default | read | what it does |", "|---|---|---|---|---|"]
    for group in groups:
        for s in SETTINGS.values():
            if s.group != group:
                continue
            kind = s.type + (f" ({' / '.join(s.choices)})" if s.choices else "")
            default = f"`{s.default}`" if s.default else "unset"
            lines.append(f"| `{s.name}` | {kind} | {default} | {s.read} | {s.doc} |")
    return "\n".join(lines)
