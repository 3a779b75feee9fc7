"""The C++ build: cache keys, crash-safe locking, a cache nobody else can plant into, verified
modules, clear errors without a compiler. Nothing here compiles: builds are faked, and anything
that could crash (loading a damaged module) runs in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from gnnfuse import _build, _build_cache

REPO = Path(__file__).resolve().parents[1]
POSIX = os.name == "posix"


def run_python(script: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", script], env=full_env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def cache_dir(monkeypatch, tmp_path):
    root = tmp_path / "cache"
    monkeypatch.setenv("GNNFUSE_BUILD_DIR", str(root))
    return root


@pytest.fixture
def fake_compile(monkeypatch):
    """cpp_extension.load replaced by one that writes a fake module file and records its calls."""
    calls: list[dict] = []

    def fake_load(**kwargs):
        directory = Path(kwargs["build_directory"])
        assert not (directory / "lock").exists()
        (directory / f"{kwargs['name']}.so").write_bytes(b"\x7fELF fake module" * 100)
        calls.append(kwargs)
        return types.SimpleNamespace(name="built")

    monkeypatch.setattr("torch.utils.cpp_extension.load", fake_load)
    monkeypatch.setattr(_build, "_import_built", lambda path, name: types.SimpleNamespace(name="cached"))
    monkeypatch.setattr(_build, "_prebuilt", lambda extension: None)
    return calls


def test_build_key_depends_on_sources_and_is_per_extension():
    key = _build.build_key("graph")
    assert key == _build.build_key("graph") and len(key) == 16
    assert key != _build.build_key("density")
    assert _build.build_dir("graph").name.endswith(key)


def test_build_dir_override(cache_dir):
    assert _build.build_dir("graph").parent == cache_dir


def test_relative_build_dir_is_refused(monkeypatch):
    monkeypatch.setenv("GNNFUSE_BUILD_DIR", "relative/cache")
    with pytest.raises(_build.BuildError, match="absolute path"):
        _build_cache.checked_root()


def test_build_announces_itself_writes_a_verified_marker_and_is_reused(cache_dir, fake_compile, capsys):
    """A compile killed mid-way leaves torch's 'lock' file behind: it must not block the next build."""
    _build_cache.checked_root()
    directory = _build.build_dir("graph")
    directory.mkdir(mode=0o700)
    (directory / "lock").write_text("left by a killed compile")
    assert _build._build("graph").name == "built"
    err = capsys.readouterr().err
    assert "gnnfuse: compiling C++ kernels 'graph' (one-time, about" in err and str(directory) in err
    assert "gnnfuse: built 'graph' in" in err
    record = json.loads((directory / "BUILD_OK").read_text())
    module_file = directory / f"{directory.name}.so"
    assert record["size"] == module_file.stat().st_size and record["sha256"] == _build_cache.file_digest(module_file)
    assert _build._build("graph").name == "cached"  # second process: no compile, no message
    assert capsys.readouterr().err == ""
    assert len(fake_compile) == 1 and fake_compile[0]["build_directory"] == str(directory)
    if POSIX:
        _build._build("density")
        assert (cache_dir.stat().st_mode & 0o777) == 0o700
        assert (_build.build_dir("density").stat().st_mode & 0o777) == 0o700


@pytest.mark.parametrize("damage", ["truncate", "replace", "legacy-marker"])
def test_module_not_matching_its_marker_is_rebuilt(cache_dir, fake_compile, capsys, damage):
    _build._build("graph")
    directory = _build.build_dir("graph")
    module_file = directory / f"{directory.name}.so"
    if damage == "truncate":
        module_file.write_bytes(module_file.read_bytes()[:100])
    elif damage == "replace":
        module_file.write_bytes(b"X" * module_file.stat().st_size)
    else:
        (directory / "BUILD_OK").write_text(directory.name)  # what older versions wrote: no hash
    assert _build._build("graph").name == "built"
    assert "does not match its build record; rebuilding" in capsys.readouterr().err
    assert len(fake_compile) == 2 and _build_cache.marker_state(directory, module_file) == "ok"


def test_truncated_module_is_never_loaded_in_a_fresh_process(tmp_path):
    """A real extension module cut short next to a marker that vouched for it: the next process must
    rebuild, not map it (that is a SIGBUS). The rebuild is faked, so nothing compiles."""
    script = """
import sys, types, torch.utils.cpp_extension as ce
from pathlib import Path
from gnnfuse import _build, _build_cache
_build._prebuilt = lambda extension: None
d = _build.build_dir("density"); d.mkdir(parents=True)
so = d / f"{d.name}.so"
so.write_bytes(Path(torch_ext).read_bytes())
_build_cache.write_marker(d, so)
so.write_bytes(so.read_bytes()[: so.stat().st_size // 3])   # damaged after the marker was written
def fake_load(**kw):
    print("rebuilt", flush=True)
    raise RuntimeError("no compile in this test")
ce.load = fake_load
try:
    _build.load_extension("density")
except _build.BuildError as e:
    print("BuildError", flush=True)
"""
    import torch

    torch_ext = next(Path(torch.__file__).parent.glob("_C*.so"))  # any real extension module will do
    result = run_python(f"torch_ext = {str(torch_ext)!r}\n" + script, GNNFUSE_BUILD_DIR=str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "rebuilt" in result.stdout and "BuildError" in result.stdout
    assert "does not match its build record" in result.stderr


@pytest.mark.skipif(not POSIX, reason="POSIX permissions")
def test_group_or_world_writable_build_dir_is_refused(cache_dir):
    cache_dir.mkdir(mode=0o700)
    os.chmod(cache_dir, 0o777)
    with pytest.raises(_build.BuildError, match="writable by group or others"):
        _build_cache.checked_root()


@pytest.mark.skipif(not POSIX, reason="POSIX owners")
def test_build_dir_owned_by_someone_else_is_refused(cache_dir, monkeypatch):
    cache_dir.mkdir(mode=0o700)
    monkeypatch.setattr(_build_cache, "_euid", lambda: os.geteuid() + 1)  # as if another user made it
    with pytest.raises(_build.BuildError, match="owned by uid"):
        _build_cache.checked_root()


@pytest.mark.skipif(not POSIX, reason="POSIX permissions")
def test_unsafe_default_cache_falls_back_to_a_private_dir(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("GNNFUSE_BUILD_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "gnnfuse").mkdir(parents=True)
    os.chmod(tmp_path / "xdg" / "gnnfuse", 0o777)
    monkeypatch.setattr(_build_cache.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    root = _build_cache.checked_root()
    assert root == tmp_path / "tmp" / f"gnnfuse-{os.geteuid()}" and (root.stat().st_mode & 0o777) == 0o700
    assert "building in" in capsys.readouterr().err


def test_unwritable_build_dir_is_a_build_error_and_reference_still_works(tmp_path):
    """Any OSError on the way (here: the cache path runs through a file) is a BuildError with the fix;
    extension_available() says False; the CSR build and backend='reference' still work."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    script = """
import warnings, torch, gnnfuse
from gnnfuse import _build
try:
    _build.load_extension("graph")
except _build.BuildError as e:
    assert "GNNFUSE_BUILD_DIR" in str(e), e
else:
    raise SystemExit("expected BuildError")
assert _build.extension_available("graph") is False
assert _build.extension_available("density") is False
x = torch.randn(4, 2)
ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
with warnings.catch_warnings(record=True):
    out = gnnfuse.fused_gather_scatter(x, ei, "sum", backend="reference")
    csr = gnnfuse.CSR.from_edge_index(ei, num_nodes=4)
assert torch.allclose(out[1:], x[:3]) and csr.rowptr.numel() == 5
print("ok")
"""
    result = run_python(script, GNNFUSE_BUILD_DIR=str(blocker / "cache"))
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


@pytest.mark.skipif(not POSIX, reason="O_NOFOLLOW")
def test_lock_file_symlink_is_not_followed(tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me")
    (tmp_path / "x.lock").symlink_to(target)
    with pytest.raises(_build.BuildError, match="symlink"):
        with _build_cache.BuildLock(tmp_path / "x.lock", "test"):
            pass
    assert target.read_text() == "keep me"


@pytest.mark.skipif(not POSIX, reason="fcntl locks")
def test_lock_wait_names_the_holder_and_times_out(tmp_path, monkeypatch, capsys):
    lock = tmp_path / "x.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); from gnnfuse import _build_cache as c; "
         "from pathlib import Path; import time\nwith c.BuildLock(Path(sys.argv[2]), 'x'):\n"
         " print('held', flush=True); time.sleep(60)", str(REPO), str(lock)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv(_build_cache.LOCK_TIMEOUT_ENV, "1.5")
        monkeypatch.setattr(_build_cache, "REPORT_WAIT_AFTER_S", 0.5)
        start = time.monotonic()
        with pytest.raises(_build.BuildError, match=f"process {holder.pid} on") as info:
            with _build_cache.BuildLock(lock, "the test kernels"):
                pass
        assert 1.5 <= time.monotonic() - start < 10 and _build_cache.LOCK_TIMEOUT_ENV in str(info.value)
        assert f"waiting for process {holder.pid}" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    with _build_cache.BuildLock(lock, "x"):  # released by the OS when its holder died
        pass


def test_missing_compiler_is_a_clear_error_and_reference_still_works(tmp_path):
    script = """
import warnings, torch, gnnfuse
from gnnfuse import _build
_build._prebuilt = lambda extension: None
try:
    _build.load_extension("graph")
except _build.BuildError as e:
    assert "C++17 compiler" in str(e) and "apt-get install g++" in str(e), e
else:
    raise SystemExit("expected BuildError")
x = torch.randn(4, 2)
ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
with warnings.catch_warnings(record=True):
    out = gnnfuse.fused_gather_scatter(x, ei, "sum", backend="reference")
assert torch.allclose(out[1:], x[:3])
print("ok")
"""
    result = run_python(script, CXX="/nonexistent/g++", GNNFUSE_BUILD_DIR=str(tmp_path))
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_cxx_with_flags_is_split_like_a_shell(monkeypatch):
    monkeypatch.setenv("CXX", "g++ -w")
    monkeypatch.setattr(_build.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert _build.compiler_command() == ["g++", "-w"] and _build.compiler() == "/usr/bin/g++"
    env, flags = _build._check_toolchain()
    assert env["CXX"] == "g++" and flags == ["-w"]


def test_pip_ninja_off_path_is_put_on_path(monkeypatch):
    monkeypatch.setattr(_build.shutil, "which", lambda name: None if name == "ninja" else "/usr/bin/c++")
    monkeypatch.setitem(sys.modules, "ninja", types.SimpleNamespace(BIN_DIR="/opt/pip-ninja/bin"))
    env, _ = _build._check_toolchain()
    assert env["PATH"].startswith("/opt/pip-ninja/bin" + os.pathsep)
    monkeypatch.setitem(sys.modules, "ninja", None)  # neither on PATH nor installed
    with pytest.raises(_build.BuildError, match="pip install ninja"):
        _build._check_toolchain()


def test_import_works_without_fcntl_and_windows_gets_a_clear_message(tmp_path):
    """As on Windows: no fcntl module. Importing gnnfuse and the reference backend must still work."""
    script = """
import sys
sys.modules["fcntl"] = None
import warnings, torch, gnnfuse
from gnnfuse import _build, _build_cache
_build._prebuilt = lambda extension: None
x = torch.randn(3, 2)
with warnings.catch_warnings(record=True):  # the CSR build may fall back to torch's sort
    out = gnnfuse.fused_gather_scatter(x, torch.tensor([[0, 1], [1, 2]]), "sum", backend="reference")
assert _build.extension_available("planarity") is False  # no lock: a BuildError, not an ImportError
_build.os.name = "nt"  # last: the rest of os would not survive this
try:
    _build._check_toolchain()
except _build.BuildError as e:
    assert "Windows" in str(e) and "reference" in str(e)
print("ok")
"""
    result = run_python(script, GNNFUSE_BUILD_DIR=str(tmp_path))
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_macos_flags_without_and_with_libomp(monkeypatch, tmp_path):
    monkeypatch.setattr(_build_cache.sys, "platform", "darwin")
    monkeypatch.setattr(_build_cache, "libomp_prefix", lambda: None)
    cflags, ldflags = _build_cache.compile_flags()
    assert "-fopenmp" not in cflags and "-march=native" not in cflags and ldflags == []
    monkeypatch.setattr(_build_cache, "libomp_prefix", lambda: tmp_path)
    cflags, ldflags = _build_cache.compile_flags()
    assert cflags[-3:] == ["-Xpreprocessor", "-fopenmp", f"-I{tmp_path}/include"] and "-lomp" in ldflags


def test_prebuilt_module_is_preferred_only_when_it_matches(monkeypatch, tmp_path):
    import torch

    manifest = tmp_path / _build.PREBUILT_MANIFEST
    monkeypatch.setattr(_build, "prebuilt_manifest", lambda: manifest)
    sentinel = types.SimpleNamespace(name="prebuilt")
    monkeypatch.setattr(_build.importlib, "import_module", lambda name: sentinel)
    assert _build._prebuilt("graph") is None  # no manifest: a source checkout
    digest = _build_cache.source_digest(_build.sources("graph"))
    manifest.write_text(json.dumps({"torch": torch.__version__, "sources": {"graph": digest}}))
    assert _build._prebuilt("graph") is sentinel
    manifest.write_text(json.dumps({"torch": torch.__version__, "sources": {"graph": "0" * 64}}))
    assert _build._prebuilt("graph") is None  # sources edited since: build them
    manifest.write_text(json.dumps({"torch": "0.0.1", "sources": {"graph": digest}}))
    assert _build._prebuilt("graph") is None  # another torch: its ABI may differ


def test_command_line_build_and_info(cache_dir, fake_compile, capsys):
    from gnnfuse.__main__ import main

    assert main([]) == 2 and "build" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["build", "nonsense"])
    saved = dict(_build._modules)
    _build._modules.clear()
    try:
        assert main(["build", "density"]) == 0
    finally:
        _build._modules.clear()
        _build._modules.update(saved)
    captured = capsys.readouterr()
    assert "compiling C++ kernels 'density'" in captured.err and captured.out.startswith("density: ")
    assert main(["info"]) == 0 and "build cache" in capsys.readouterr().out
