"""Just-in-time build of the C++ CPU kernels in ``csrc/``.

The extension is compiled once per (sources, torch version, Python, CPU model) into a cache
directory and reused by every later process. Concurrency and crashes:

* an exclusive ``fcntl.lockf`` lock serialises builds across processes; the kernel drops the
  lock when its holder dies, so a compile killed mid-way never blocks the next import;
* a ``BUILD_OK`` marker is written only after the module imported successfully, so a
  half-written build directory is rebuilt rather than trusted.

``GNNFUSE_BUILD_DIR`` overrides the cache location; ``GNNFUSE_BUILD_VERBOSE=1`` shows the
compiler output.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import platform
import shutil
import sys
import threading
from pathlib import Path
from types import ModuleType

import torch

_EXTENSION_PREFIX = "gnnfuse_cpu"
_lock = threading.Lock()
_module: ModuleType | None = None
_error: BaseException | None = None


class BuildError(RuntimeError):
    """The C++ extension could not be built; ``backend="reference"`` still works."""


def source_dir() -> Path:
    """``csrc/`` of a source checkout, else the copy shipped inside the wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "csrc", here / "_csrc"):
        if (candidate / "extension.cpp").is_file():
            return candidate
    raise BuildError(f"gnnfuse C++ sources not found next to {here} (looked for csrc/extension.cpp)")


def _sources() -> list[Path]:
    root = source_dir()
    return sorted(root.glob("*.cpp")) + sorted(root.glob("*.h"))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                return line  # flags matter too: we compile with -march=native
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_key() -> str:
    digest = hashlib.sha256()
    for path in _sources():
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    for part in (torch.__version__, sys.version, _cpu_model(), os.environ.get("CXX", "")):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def build_dir() -> Path:
    root = os.environ.get("GNNFUSE_BUILD_DIR")
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gnnfuse"
    return base / f"{_EXTENSION_PREFIX}_{build_key()}"


def compiler() -> str | None:
    """Path of the C++ compiler torch.utils.cpp_extension will use, or None if missing."""
    return shutil.which(os.environ.get("CXX", "c++"))


def _check_toolchain() -> None:
    if compiler() is None:
        raise BuildError(
            f"gnnfuse needs a C++17 compiler to build its CPU kernels, and '{os.environ.get('CXX', 'c++')}' "
            "was not found. Install one (Debian/Ubuntu: apt-get install g++; macOS: xcode-select --install) "
            "or point CXX at it. backend='reference' works without it."
        )
    if shutil.which("ninja") is None:
        try:
            import ninja  # noqa: F401  (the pip package puts the binary on its own path)
        except ImportError:
            raise BuildError("gnnfuse builds its CPU kernels with ninja: pip install ninja") from None


def _import_built(directory: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, directory / f"{name}.so")
    if spec is None or spec.loader is None:
        raise ImportError(f"no built module in {directory}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(directory: Path) -> ModuleType:
    from torch.utils import cpp_extension

    name = f"{_EXTENSION_PREFIX}_{directory.name.rsplit('_', 1)[-1]}"
    marker = directory / "BUILD_OK"
    if marker.exists():
        return _import_built(directory, name)
    _check_toolchain()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f"{directory.name}.lock", "w") as lock_file:
        fcntl.lockf(lock_file, fcntl.LOCK_EX)  # released by the OS if this process dies
        try:
            if marker.exists():  # another process finished the build while we waited
                return _import_built(directory, name)
            # torch's own FileBaton lock survives a killed compile; ours makes it redundant.
            (directory / "lock").unlink(missing_ok=True)
            flags = ["-O3", "-std=c++17", "-fopenmp", "-march=native", "-Wno-unknown-pragmas"]
            try:
                module = cpp_extension.load(
                    name=name,
                    sources=[str(p) for p in _sources() if p.suffix == ".cpp"],
                    extra_cflags=flags,
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(directory),
                    verbose=os.environ.get("GNNFUSE_BUILD_VERBOSE") == "1",
                )
            except Exception as exc:  # compiler errors arrive as RuntimeError/CalledProcessError
                raise BuildError(
                    f"building gnnfuse's C++ kernels in {directory} failed: {exc}\n"
                    "Set GNNFUSE_BUILD_VERBOSE=1 for the compiler output. backend='reference' still works."
                ) from exc
            marker.write_text(build_key())
            return module
        finally:
            fcntl.lockf(lock_file, fcntl.LOCK_UN)


def load_extension() -> ModuleType:
    """The compiled CPU kernels, building them on first use. Raises BuildError on failure."""
    global _module, _error
    if _module is not None:
        return _module
    with _lock:
        if _module is None:
            if _error is not None:
                raise _error
            try:
                _module = _build(build_dir())
            except BuildError as exc:
                _error = exc
                raise
    return _module


def extension_available() -> bool:
    try:
        load_extension()
        return True
    except BuildError:
        return False
