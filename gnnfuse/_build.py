"""Just-in-time build of the C++ CPU kernels in ``csrc/``.

The kernels form a few small extensions (``EXTENSIONS``), one per op family, so changing one
kernel rebuilds only its own. Each is compiled once per (its sources, the shared headers,
torch version, Python, CPU model) into a cache directory and reused by every later process.
Concurrency and crashes:

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

# extension name -> its .cpp files in csrc/ (exactly one of them defines PYBIND11_MODULE).
EXTENSIONS: dict[str, list[str]] = {
    "graph": ["csr.cpp", "gather_scatter.cpp", "graph_module.cpp"],
    "planarity": ["planarity.cpp"],
    "density": ["density_scatter.cpp"],
    "attention": ["attention.cpp", "edge_softmax.cpp"],
}
# No -std flag: cpp_extension picks the standard torch was built with (C++20 for torch >= 2.9).
# Forcing another one mixes inline libstdc++/c10 code compiled under two standards, which
# crashed in std::ostream (formatting an error message) on torch 2.11. The sources are C++17.
CXX_FLAGS = ["-O3", "-fopenmp", "-march=native", "-Wno-unknown-pragmas"]
_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}
_errors: dict[str, BuildError] = {}


class BuildError(RuntimeError):
    """The C++ extension could not be built; ``backend="reference"`` still works."""


def source_dir() -> Path:
    """``csrc/`` of a source checkout, else the copy shipped inside the wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "csrc", here / "_csrc"):
        if (candidate / "reducer.h").is_file():
            return candidate
    raise BuildError(f"gnnfuse C++ sources not found next to {here} (looked for csrc/)")


def _sources(extension: str) -> list[Path]:
    """The extension's .cpp files plus every shared header."""
    root = source_dir()
    return [root / name for name in EXTENSIONS[extension]] + sorted(root.glob("*.h"))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                return line  # flags matter too: we compile with -march=native
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_key(extension: str) -> str:
    digest = hashlib.sha256()
    for path in _sources(extension):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    for part in (torch.__version__, sys.version, _cpu_model(), os.environ.get("CXX", ""), *CXX_FLAGS):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    root = os.environ.get("GNNFUSE_BUILD_DIR")
    return Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gnnfuse"


def build_dir(extension: str) -> Path:
    return cache_root() / f"gnnfuse_{extension}_{build_key(extension)}"


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


def _build(extension: str) -> ModuleType:
    from torch.utils import cpp_extension

    directory = build_dir(extension)
    name = directory.name  # unique per source hash, so a rebuilt module never clashes with a loaded one
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
            try:
                module = cpp_extension.load(
                    name=name,
                    sources=[str(p) for p in _sources(extension) if p.suffix == ".cpp"],
                    extra_cflags=CXX_FLAGS,
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(directory),
                    verbose=os.environ.get("GNNFUSE_BUILD_VERBOSE") == "1",
                )
            except Exception as exc:  # compiler errors arrive as RuntimeError/CalledProcessError
                raise BuildError(
                    f"building gnnfuse's C++ kernels in {directory} failed: {exc}\n"
                    "Set GNNFUSE_BUILD_VERBOSE=1 for the compiler output. backend='reference' still works."
                ) from exc
            marker.write_text(directory.name)
            return module
        finally:
            fcntl.lockf(lock_file, fcntl.LOCK_UN)


def load_extension(extension: str = "graph") -> ModuleType:
    """The compiled CPU kernels of ``extension``, built on first use. Raises BuildError on failure
    (and again on later calls, without retrying the compile)."""
    module = _modules.get(extension)
    if module is not None:
        return module
    with _lock:
        if extension not in _modules:
            if extension in _errors:
                raise _errors[extension]
            try:
                _modules[extension] = _build(extension)
            except BuildError as exc:
                _errors[extension] = exc
                raise
    return _modules[extension]


def extension_available(extension: str = "graph") -> bool:
    try:
        load_extension(extension)
        return True
    except BuildError:
        return False
