"""The JIT build: cache directory keys, crash-safe locking, clear errors without a compiler."""
from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from gnnfuse import _build

REPO = Path(__file__).resolve().parents[1]


def test_build_key_depends_on_sources_and_is_per_extension():
    key = _build.build_key("graph")
    assert key == _build.build_key("graph") and len(key) == 16
    assert _build.build_dir("graph").name.endswith(key)


def test_build_dir_override(monkeypatch, tmp_path):
    monkeypatch.setenv("GNNFUSE_BUILD_DIR", str(tmp_path))
    assert _build.build_dir("graph").parent == tmp_path


def test_stale_torch_lock_is_removed_and_marker_written_once(monkeypatch, tmp_path):
    """A compile killed mid-way leaves torch's 'lock' file behind: it must not block the next build."""
    monkeypatch.setenv("GNNFUSE_BUILD_DIR", str(tmp_path))
    directory = _build.build_dir("graph")
    directory.mkdir(parents=True)
    (directory / "lock").write_text("left by a killed compile")
    calls = []

    def fake_load(**kwargs):
        assert not (directory / "lock").exists()
        calls.append(kwargs)
        return types.SimpleNamespace(name="built")

    monkeypatch.setattr("torch.utils.cpp_extension.load", fake_load)
    monkeypatch.setattr(_build, "_import_built", lambda d, name: types.SimpleNamespace(name="cached"))
    assert _build._build("graph").name == "built"
    assert (directory / "BUILD_OK").exists()
    assert _build._build("graph").name == "cached"  # second process: no compile
    assert len(calls) == 1 and calls[0]["build_directory"] == str(directory)


def test_lock_held_by_a_killed_process_is_released(tmp_path):
    lock = tmp_path / "x.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import fcntl,time; f=open({str(lock)!r},'w'); fcntl.lockf(f, fcntl.LOCK_EX); "
         "print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    import fcntl

    with open(lock, "w") as f:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # would raise if still held


def test_missing_compiler_is_a_clear_error_and_reference_still_works(tmp_path):
    script = """
import warnings, torch, gnnfuse
from gnnfuse import _build
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
    env = {**os.environ, "CXX": "/nonexistent/g++", "GNNFUSE_BUILD_DIR": str(tmp_path),
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


@pytest.mark.parametrize("missing", ["ninja"])
def test_toolchain_check_names_ninja(monkeypatch, missing):
    monkeypatch.setattr(_build.shutil, "which", lambda name: None if name == "ninja" else "/usr/bin/c++")
    monkeypatch.setitem(sys.modules, "ninja", None)
    with pytest.raises(_build.BuildError, match="pip install ninja"):
        _build._check_toolchain()
