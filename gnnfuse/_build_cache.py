"""The torch-free half of the C++ build: what is compiled with which flags, and the build cache's
safety (where it lives, who may write it, how builds are locked and checked).

Nothing here imports torch or the rest of gnnfuse, so ``setup.py`` can load this file on its own
to compile the same extensions into a wheel.

* **Location.** ``$GNNFUSE_BUILD_DIR`` (must be absolute), else ``$XDG_CACHE_HOME/gnnfuse`` or
  ``~/.cache/gnnfuse``. Directories are created with mode 0700.
* **Ownership.** A cache root (and each build directory in it) must be owned by the current user
  and not writable by group or others: anyone who can write there could plant a module that we
  would load. An explicit ``GNNFUSE_BUILD_DIR`` that fails the check is refused (BuildError); the
  default location falls back, with a warning, to a private ``<tmp>/gnnfuse-<uid>``.
* **Locking.** One lock file per build, in the checked root, opened with ``O_NOFOLLOW`` (a planted
  symlink is an error, never followed). The holder writes its pid into it; a waiter reports the
  holder after a few seconds and gives up after ``$GNNFUSE_BUILD_LOCK_TIMEOUT`` seconds (default
  600). The OS drops the lock when its holder dies, so a killed compile never blocks the next one.
* **Verification.** The ``BUILD_OK`` marker records the size and SHA-256 of the built module; a
  module whose file does not match (truncated, replaced) is never loaded and is rebuilt.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

try:
    from . import config
except ImportError:  # loaded on its own (setup.py): the settings registry from the file next to this one
    import importlib.util

    _spec = importlib.util.spec_from_file_location("_gnnfuse_config", Path(__file__).with_name("config.py"))
    config = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
    sys.modules[_spec.name] = config  # type: ignore[union-attr]  # dataclasses look their module up there
    _spec.loader.exec_module(config)  # type: ignore[union-attr]

LOCK_TIMEOUT_ENV = "GNNFUSE_BUILD_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 600.0
REPORT_WAIT_AFTER_S = 3.0
MARKER = "BUILD_OK"
_warned: set[str] = set()

# extension name -> its .cpp files in csrc/ (exactly one of them defines PYBIND11_MODULE).
EXTENSIONS: dict[str, list[str]] = {
    "graph": ["csr.cpp", "gather_scatter.cpp", "graph_module.cpp"],
    "planarity": ["planarity.cpp"],
    "density": ["density_scatter.cpp"],
    "attention": ["attention.cpp", "edge_softmax.cpp", "pair_attention.cpp"],
    "edge_message": ["edge_message.cpp"],
    "sampler": ["sampler.cpp"],
    "aggregate": ["multi_aggregate.cpp"],
    "reorder": ["reorder.cpp"],
    "scatter": ["scatter_unsorted.cpp"],
}
# No -std flag: cpp_extension picks the standard torch was built with (C++20 for torch >= 2.9).
# Forcing another one mixes inline libstdc++/c10 code compiled under two standards, which
# crashed in std::ostream (formatting an error message) on torch 2.11. The sources are C++17.
CXX_FLAGS = ["-O3", "-fopenmp", "-march=native", "-Wno-unknown-pragmas"]


class BuildError(RuntimeError):
    """The C++ extension could not be built or loaded; ``backend="reference"`` still works."""


def libomp_prefix() -> Path | None:
    """Homebrew's (or $LIBOMP_PREFIX's) libomp on macOS, whose Apple clang ships no OpenMP."""
    for prefix in (config.get("LIBOMP_PREFIX"), "/opt/homebrew/opt/libomp", "/usr/local/opt/libomp"):
        if prefix and (Path(prefix) / "include" / "omp.h").is_file():
            return Path(prefix)
    return None


def compile_flags(native: bool = True) -> tuple[list[str], list[str]]:
    """(compiler flags, linker flags) for this platform. ``native=False`` gives portable code (wheels)."""
    cflags = [f for f in CXX_FLAGS if native or f != "-march=native"]
    if sys.platform != "darwin":
        return cflags, ["-fopenmp"]
    cflags = [f for f in cflags if f not in ("-fopenmp", "-march=native")]  # Apple clang rejects both
    prefix = libomp_prefix()
    if prefix is None:  # the kernels still compile: their OpenMP pragmas are then ignored (one thread)
        return cflags, []
    return cflags + ["-Xpreprocessor", "-fopenmp", f"-I{prefix}/include"], [f"-L{prefix}/lib", "-lomp"]


def say(message: str) -> None:
    """One line on stderr (build progress is never silent, and never on stdout)."""
    print(f"gnnfuse: {message}", file=sys.stderr, flush=True)


def _euid() -> int | None:
    return os.geteuid() if hasattr(os, "geteuid") else None  # None on Windows: no POSIX owners


def unsafe_reason(path: Path, *, follow: bool = True) -> str | None:
    """Why ``path`` is not a safe private directory, or None when it is."""
    st = os.stat(path) if follow else os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return "it is a symlink" if stat.S_ISLNK(st.st_mode) else "it is not a directory"
    euid = _euid()
    if euid is not None and st.st_uid != euid:
        return f"it is owned by uid {st.st_uid}, not by you (uid {euid})"
    if os.name == "posix" and st.st_mode & 0o022:
        return f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}; fix: chmod go-w {path})"
    return None


def private_dir(path: Path, *, follow: bool = True) -> Path:
    """Creates ``path`` (mode 0700) if needed; BuildError unless it is ours and private."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    reason = unsafe_reason(path, follow=follow)
    if reason:
        raise BuildError(f"refusing to use {path} for gnnfuse's compiled kernels: {reason}")
    return path


def configured_root() -> Path:
    """The cache root the settings name (not checked, not created): for display and for builds."""
    if config.is_set("GNNFUSE_BUILD_DIR"):
        return Path(config.get("GNNFUSE_BUILD_DIR"))
    xdg = config.get("XDG_CACHE_HOME") if config.is_set("XDG_CACHE_HOME") else None
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"  # XDG: relative is ignored
    return base / "gnnfuse"


def checked_root() -> Path:
    """The cache root to build in: created, owned by us, private. BuildError with the fix otherwise."""
    root = configured_root()
    if config.is_set("GNNFUSE_BUILD_DIR"):
        if not root.is_absolute():
            raise BuildError(
                f"GNNFUSE_BUILD_DIR must be an absolute path, got {str(root)!r} (a relative one would "
                f"change with the working directory); e.g. GNNFUSE_BUILD_DIR={Path(root).absolute()}")
        try:
            return private_dir(root)
        except OSError as exc:
            raise BuildError(f"cannot create gnnfuse's build cache {root} ({exc}). Point GNNFUSE_BUILD_DIR "
                             "at a writable absolute directory of yours.") from exc
    try:
        return private_dir(root)
    except (OSError, BuildError) as exc:
        problem = str(exc)
    user = _euid() if _euid() is not None else config.get("USERNAME")
    fallback = Path(tempfile.gettempdir()) / f"gnnfuse-{user}"
    try:
        private_dir(fallback, follow=False)
    except (OSError, BuildError) as exc:
        raise BuildError(f"no usable build cache: {problem}; and the fallback {fallback}: {exc}. Set "
                         "GNNFUSE_BUILD_DIR to a writable absolute directory owned by you.") from exc
    if str(root) not in _warned:
        _warned.add(str(root))
        say(f"not using {root} ({problem}); building in {fallback} instead. Set GNNFUSE_BUILD_DIR to choose.")
    return fallback


# ---- verification --------------------------------------------------------------------------------
def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def hash_files(digest: hashlib._Hash, paths: Iterable[Path]) -> None:
    for path in paths:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())


def source_digest(paths: Iterable[Path]) -> str:
    """SHA-256 of the files' names and contents (which sources a module was built from)."""
    digest = hashlib.sha256()
    hash_files(digest, paths)
    return digest.hexdigest()


def write_marker(directory: Path, module_file: Path) -> None:
    record = {"module": module_file.name, "size": module_file.stat().st_size, "sha256": file_digest(module_file)}
    tmp = directory / f"{MARKER}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, directory / MARKER)  # atomic: a reader sees no marker or a whole one


def marker_state(directory: Path, module_file: Path) -> str:
    """'missing' (no marker: never finished), 'ok' (the module file is the one recorded) or 'damaged'."""
    try:
        record = json.loads((directory / MARKER).read_text())
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError):
        return "damaged"  # unreadable, or the plain-text marker of older versions (no hash to check)
    try:
        st = os.lstat(module_file)
        if not stat.S_ISREG(st.st_mode) or not isinstance(record, dict) or st.st_size != record.get("size"):
            return "damaged"
        return "ok" if file_digest(module_file) == record.get("sha256") else "damaged"
    except OSError:
        return "damaged"


# ---- locking -------------------------------------------------------------------------------------
def _lock_module():  # noqa: ANN202  (fcntl or msvcrt)
    """fcntl on POSIX, msvcrt on Windows: imported here, so that importing gnnfuse works everywhere."""
    try:
        if os.name == "nt":
            import msvcrt

            return msvcrt
        import fcntl

        return fcntl
    except ImportError as exc:
        raise BuildError(f"no file locking on this platform ({exc}): use backend='reference'") from exc


def _try_lock(fd: int) -> bool:
    """Non-blocking exclusive lock of the open file; False when another process holds it."""
    locks = _lock_module()
    try:
        if os.name == "nt":
            os.lseek(fd, 0, os.SEEK_SET)
            locks.locking(fd, locks.LK_NBLCK, 1)
        else:
            locks.lockf(fd, locks.LOCK_EX | locks.LOCK_NB)
        return True
    except OSError:  # BlockingIOError / PermissionError: held elsewhere
        return False


def _unlock(fd: int) -> None:
    locks = _lock_module()
    if os.name == "nt":
        os.lseek(fd, 0, os.SEEK_SET)
        locks.locking(fd, locks.LK_UNLCK, 1)
    else:
        locks.lockf(fd, locks.LOCK_UN)


def lock_timeout() -> float:
    value = config.get(LOCK_TIMEOUT_ENV) if config.is_set(LOCK_TIMEOUT_ENV) else None
    try:
        return float(value) if value else DEFAULT_LOCK_TIMEOUT_S
    except ValueError:
        raise BuildError(f"{LOCK_TIMEOUT_ENV} must be a number of seconds, got {value!r}") from None


class BuildLock:
    """Exclusive lock on ``path`` (a file in a checked private directory) for one build."""

    def __init__(self, path: Path, what: str):
        self.path, self.what, self.fd = path, what, -1

    def _holder(self) -> str:
        try:
            text = os.pread(self.fd, 200, 0).decode(errors="replace").strip() if hasattr(os, "pread") else ""
        except OSError:
            text = ""
        return f"process {text}" if text else "another process"

    def __enter__(self) -> BuildLock:
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            self.fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            hint = " (a symlink: remove it)" if os.path.islink(self.path) else ""
            raise BuildError(f"cannot open the build lock {self.path}{hint}: {exc}") from exc
        try:
            self._wait()
        except BaseException:
            os.close(self.fd)
            raise
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"{os.getpid()} on {socket.gethostname()}\n".encode())
        return self

    def _wait(self) -> None:
        timeout, start, reported = lock_timeout(), time.monotonic(), False
        while not _try_lock(self.fd):
            waited = time.monotonic() - start
            if waited > timeout:
                raise BuildError(
                    f"gave up after {waited:.0f} s waiting for {self._holder()} to build {self.what} (lock "
                    f"{self.path}). If that process is stuck, stop it; {LOCK_TIMEOUT_ENV} sets the wait.")
            if not reported and waited > REPORT_WAIT_AFTER_S:
                reported = True
                say(f"waiting for {self._holder()}, which is building {self.what} (lock {self.path}; "
                    f"giving up after {timeout:.0f} s, {LOCK_TIMEOUT_ENV})")
            time.sleep(0.2)

    def __exit__(self, *exc_info: object) -> None:
        try:
            os.ftruncate(self.fd, 0)
            _unlock(self.fd)
        finally:
            os.close(self.fd)
