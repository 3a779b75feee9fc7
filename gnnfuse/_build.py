"""The C++ CPU kernels in ``csrc/``: a module prebuilt at install time, else a one-time build.

The kernels form a few small extensions (``EXTENSIONS``), one per op family, so changing one
kernel rebuilds only its own. For each, ``load_extension`` takes, in order:

1. the module compiled when the wheel was built (``GNNFUSE_BUILD_EXTENSIONS=1``, see setup.py),
   if it was built from these very sources for this torch version: no compiler needed;
2. a module built earlier into the cache (``~/.cache/gnnfuse``, see ``_build_cache`` for the
   location, ownership checks, locking and the hash check that guards against damaged files);
3. a build now, announced on stderr before and after (about a minute per extension), cached
   per (its sources, the shared headers, torch version, Python, CPU model, compiler, flags).

``python -m gnnfuse build`` does step 3 ahead of time. ``GNNFUSE_BUILD_VERBOSE=1`` shows the
compiler output. Every failure is a ``BuildError`` saying what to fix; ``backend="reference"``
works without any of this.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import shlex
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

from . import _build_cache as cache
from . import config
from ._build_cache import EXTENSIONS, BuildError, compile_flags

__all__ = ["BuildError", "EXTENSIONS", "build_all", "cache_root", "build_dir", "compiler", "extension_available",
           "load_extension"]

PREBUILT_MANIFEST = "_prebuilt.json"  # written next to the prebuilt modules by setup.py
# Seconds a build took on a 2-core machine, shown before the first build; later builds show the last one.
TYPICAL_BUILD_S = {"graph": 70, "planarity": 25, "density": 25, "sampler": 30, "aggregate": 25, "reorder": 20}
_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}
_errors: dict[str, BuildError] = {}


def source_dir() -> Path:
    """``csrc/`` of a source checkout, else the copy shipped inside the wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "csrc", here / "_csrc"):
        if (candidate / "reducer.h").is_file():
            return candidate
    raise BuildError(f"gnnfuse C++ sources not found next to {here} (looked for csrc/)")


def sources(extension: str, root: Path | None = None) -> list[Path]:
    """The extension's .cpp files plus every shared header."""
    root = root or source_dir()
    return [root / name for name in EXTENSIONS[extension]] + sorted(root.glob("*.h"))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                return line  # flags matter too: we compile with -march=native
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ---- toolchain -----------------------------------------------------------------------------------
def compiler_command() -> list[str]:
    """``$CXX`` (split like a shell would: ``CXX="g++ -w"`` is g++ with a flag), else ``c++``."""
    return shlex.split(config.get("CXX") or "c++") or ["c++"]


def compiler() -> str | None:
    """Path of the C++ compiler torch.utils.cpp_extension will use, or None if missing."""
    return shutil.which(compiler_command()[0])


def _check_toolchain() -> tuple[dict[str, str], list[str]]:
    """Checks the compiler and ninja. Returns (environment for the build, extra compiler flags)."""
    if os.name == "nt":
        raise BuildError("gnnfuse builds its CPU kernels with GCC or Clang (Linux, macOS); on Windows use "
                         "backend='reference', or WSL.")
    if compiler() is None:
        raise BuildError(
            f"gnnfuse needs a C++17 compiler to build its CPU kernels, and '{compiler_command()[0]}' "
            "was not found. Install one (Debian/Ubuntu: apt-get install g++; macOS: xcode-select --install) "
            "or point CXX at it. backend='reference' works without it.")
    env: dict[str, str] = {}
    argv = compiler_command()
    flags: list[str] = []
    if len(argv) > 1 and all(arg.startswith("-") for arg in argv[1:]):
        env["CXX"], flags = argv[0], argv[1:]  # torch looks $CXX up as one program name
    if shutil.which("ninja") is None:
        try:
            import ninja  # the pip package: its binary lives in ninja.BIN_DIR, often not on PATH
        except ImportError:
            raise BuildError("gnnfuse builds its CPU kernels with ninja, which is missing: pip install ninja "
                             "(or apt-get install ninja-build).") from None
        env["PATH"] = ninja.BIN_DIR + os.pathsep + config.get("PATH")
    if sys.platform == "darwin" and cache.libomp_prefix() is None and "darwin" not in cache._warned:
        cache._warned.add("darwin")
        cache.say("no libomp found (brew install libomp, or set LIBOMP_PREFIX): the CPU kernels build "
                  "without OpenMP and run on one thread.")
    return env, flags


@contextlib.contextmanager
def _environment(overrides: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``overrides`` for the duration of a build (under the build lock)."""
    saved = {key: os.environ.get(key) for key in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ---- cache keys and locations --------------------------------------------------------------------
def build_key(extension: str) -> str:
    digest = hashlib.sha256()
    cache.hash_files(digest, sources(extension))
    cxx = config.get("CXX") if config.is_set("CXX") else ""  # unset hashes as "" (keys of earlier builds)
    for part in (torch.__version__, sys.version, _cpu_model(), cxx, *compile_flags()[0]):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    """Where builds are cached, as configured (``GNNFUSE_BUILD_DIR``, else the user cache dir)."""
    return cache.configured_root()


def build_dir(extension: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / f"gnnfuse_{extension}_{build_key(extension)}"


# ---- loading -------------------------------------------------------------------------------------
def _import_built(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no loadable module at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prebuilt_manifest() -> Path:
    return Path(__file__).resolve().parent / PREBUILT_MANIFEST


def _prebuilt(extension: str) -> ModuleType | None:
    """The module compiled into the installed package, when it matches these sources and torch."""
    try:
        record = json.loads(prebuilt_manifest().read_text())
    except (OSError, ValueError):
        return None
    if record.get("torch") != torch.__version__:
        if "prebuilt" not in cache._warned:
            cache._warned.add("prebuilt")
            cache.say(f"the prebuilt CPU kernels were built for torch {record.get('torch')}, this is "
                      f"torch {torch.__version__}: building them for it instead.")
        return None
    if record.get("sources", {}).get(extension) != cache.source_digest(sources(extension)):
        return None
    try:
        return importlib.import_module(f"gnnfuse._C_{extension}")
    except ImportError as exc:
        cache.say(f"cannot load the prebuilt '{extension}' kernels ({exc}); building them instead.")
        return None


def _last_build_seconds(root: Path, extension: str) -> float:
    try:
        return float(json.loads((root / "build_times.json").read_text())[extension])
    except (OSError, ValueError, KeyError, TypeError):
        return TYPICAL_BUILD_S.get(extension, 60)


def _record_build_seconds(root: Path, extension: str, seconds: float) -> None:
    path = root / "build_times.json"
    try:
        times = json.loads(path.read_text())
    except (OSError, ValueError):
        times = {}
    times[extension] = round(seconds, 1)
    tmp = root / f"build_times.json.{os.getpid()}"
    tmp.write_text(json.dumps(times))
    os.replace(tmp, path)


def _cached(directory: Path, module_file: Path, name: str, *, repair: bool) -> ModuleType | None:
    """The cached module if its marker vouches for the file. With ``repair`` (only under the build
    lock), a damaged build directory is cleared for a rebuild."""
    if not directory.is_dir():
        return None
    cache.private_dir(directory, follow=False)
    state = cache.marker_state(directory, module_file)
    if state == "ok":
        try:
            return _import_built(module_file, name)
        except ImportError as exc:
            if repair:
                cache.say(f"cannot load the cached {module_file.name} ({exc}); rebuilding it.")
    elif state == "damaged" and repair:
        cache.say(f"the cached {module_file.name} does not match its build record; rebuilding it.")
    if repair and state != "missing":
        shutil.rmtree(directory)
    return None


def _build(extension: str) -> ModuleType:
    module = _prebuilt(extension)
    if module is not None:
        return module
    root = cache.checked_root()
    directory = build_dir(extension, root)
    name = directory.name  # unique per build key, so a rebuilt module never clashes with a loaded one
    module_file = directory / f"{name}.so"  # cpp_extension's suffix on Linux and macOS
    module = _cached(directory, module_file, name, repair=False)
    if module is not None:
        return module
    env, extra_flags = _check_toolchain()
    with cache.BuildLock(root / f"{name}.lock", f"gnnfuse's '{extension}' kernels"):
        # another process may have finished the build while we waited
        module = _cached(directory, module_file, name, repair=True)
        if module is not None:
            return module
        cache.private_dir(directory, follow=False)
        # torch's own FileBaton lock survives a killed compile; ours makes it redundant. A module file
        # without a marker may be a killed link's output, which ninja would take as up to date.
        (directory / "lock").unlink(missing_ok=True)
        module_file.unlink(missing_ok=True)
        with _environment(env):
            return _compile(extension, root, directory, module_file, extra_flags)


def _compile(extension: str, root: Path, directory: Path, module_file: Path, extra_flags: list[str]) -> ModuleType:
    cache.say(f"compiling C++ kernels '{extension}' (one-time, about {_last_build_seconds(root, extension):.0f} s); "
              f"cached in {directory}")
    from torch.utils import cpp_extension  # after the message: importing it takes a second or two
    cflags, ldflags = compile_flags()
    cflags, ldflags = extra_flags + cflags, extra_flags + ldflags
    start = time.perf_counter()
    try:
        module = cpp_extension.load(
            name=directory.name,
            sources=[str(p) for p in sources(extension) if p.suffix == ".cpp"],
            extra_cflags=cflags,
            extra_ldflags=ldflags,
            build_directory=str(directory),
            verbose=config.enabled("GNNFUSE_BUILD_VERBOSE"),
        )
    except Exception as exc:  # compiler errors arrive as RuntimeError/CalledProcessError
        raise BuildError(
            f"building gnnfuse's C++ kernels in {directory} failed: {exc}\n"
            "Set GNNFUSE_BUILD_VERBOSE=1 for the compiler output. backend='reference' still works.") from exc
    seconds = time.perf_counter() - start
    cache.write_marker(directory, module_file)
    _record_build_seconds(root, extension, seconds)
    cache.say(f"built '{extension}' in {seconds:.0f} s")
    return module


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
                try:
                    _modules[extension] = _build(extension)
                except OSError as exc:  # unwritable or vanished cache: the fix is the same
                    raise BuildError(
                        f"gnnfuse cannot use its build cache {cache_root()} ({exc}). Set GNNFUSE_BUILD_DIR to "
                        "a writable absolute directory, or run `python -m gnnfuse build` where one is "
                        "writable. backend='reference' still works.") from exc
            except BuildError as exc:
                _errors[extension] = exc
                raise
    return _modules[extension]


def optional_extension(extension: str, unavailable: str, stacklevel: int = 2) -> ModuleType | None:
    """``load_extension(extension)``, or None with a warning ``"gnnfuse: C++ <unavailable> instead
    (<why>)"`` when it cannot be built: for callers that have a torch-ops fallback.
    ``stacklevel`` counts from the caller of this function, as in ``warnings.warn``."""
    try:
        return load_extension(extension)
    except BuildError as exc:
        warnings.warn(f"gnnfuse: C++ {unavailable} instead ({exc})", stacklevel=stacklevel + 1)
        return None


def extension_available(extension: str = "graph") -> bool:
    """Whether the compiled kernels of ``extension`` load (building them if needed). Never raises."""
    try:
        load_extension(extension)
        return True
    except Exception:  # noqa: BLE001  (a question, not a command: any failure means "no")
        return False


def build_all() -> dict[str, str]:
    """Builds (or finds) every extension; extension name -> where its module was loaded from."""
    return {name: str(getattr(load_extension(name), "__file__", "?")) for name in EXTENSIONS}
