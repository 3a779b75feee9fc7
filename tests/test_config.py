"""The registry of environment variables (gnnfuse/config.py): complete, the only reader, shown by
show_config, and the README's table generated from it."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch

import gnnfuse
from gnnfuse import config
from gnnfuse.ops._library import resolve_backend

ROOT = Path(__file__).resolve().parents[1]
READERS = [*(ROOT / "gnnfuse").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "examples").rglob("*.py"),
           ROOT / "setup.py"]
# os.environ used for something other than reading a setting: restoring the variables a build sets
NOT_A_SETTING = {"saved = {key: os.environ.get(key) for key in overrides}"}
DIRECT_READ = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environb|in os\.environ\b|os\.environ\[[^]]+\](?!\s*=)")
REGISTRY_READ = re.compile(r"config\.(?:get|enabled|is_set)\(\s*[\"']([A-Z_]+)[\"']")


def test_nothing_reads_the_environment_around_the_registry():
    offenders = []
    for path in READERS:
        if path.name == "config.py" and path.parent.name == "gnnfuse":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if DIRECT_READ.search(line) and line.strip() not in NOT_A_SETTING:
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "read these through gnnfuse.config:\n" + "\n".join(offenders)


def test_every_variable_read_is_declared_and_every_declared_one_is_read():
    sources = {p: p.read_text() for p in [*READERS, *(ROOT / "tests").glob("*.py")]
               if p.name not in ("config.py", "test_config.py")}
    read = {name for text in sources.values() for name in REGISTRY_READ.findall(text)}
    assert read <= set(config.SETTINGS), f"undeclared: {sorted(read - set(config.SETTINGS))}"
    everything = "\n".join(sources.values())
    unused = [name for name in config.SETTINGS if f'"{name}"' not in everything]
    assert not unused, f"declared but read nowhere: {unused}"
    with pytest.raises(KeyError):
        config.get("GNNFUSE_NOT_A_SETTING")


def test_declarations_are_complete():
    for s in config.SETTINGS.values():
        assert s.type in ("choice", "flag", "seconds", "integer", "path", "text"), s
        assert s.read and s.doc and s.group in ("runtime", "build", "packaging", "data", "reporting", "examples", "tests"), s
        assert (s.type == "choice") == bool(s.choices), s
        if s.type == "flag":
            assert s.default in (s.on, s.off), s


def test_readme_table_is_generated_from_the_registry():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- environment table: generated from gnnfuse/config.py -->\n")
    end = readme.index("\n<!-- end of environment table -->")
    table = readme[start:end].split("\n", 1)[1]
    assert table == config.markdown_table(), "regenerate the README table: see its Development section"


def test_show_config_and_cli_list_every_variable(capsys, monkeypatch):
    monkeypatch.setenv("GNNFUSE_DATA", "/somewhere/data")
    monkeypatch.delenv("GNNFUSE_AUTOTUNE", raising=False)
    gnnfuse.show_config()
    shown = capsys.readouterr().out
    from gnnfuse.__main__ import main

    assert main(["info"]) == 0
    cli = capsys.readouterr().out
    for out in (shown, cli):
        for name in config.SETTINGS:
            assert re.search(rf"^{name}\s", out, re.MULTILINE), name
        assert re.search(r"^GNNFUSE_DATA\s+/somewhere/data$", out, re.MULTILINE)
        assert re.search(r"^GNNFUSE_AUTOTUNE\s+unset$", out, re.MULTILINE)


def test_values_are_read_when_used(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.delenv("GNNFUSE_BACKEND", raising=False)
    assert resolve_backend("auto", cpu) == "cpu"
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")  # takes effect at the next call
    assert resolve_backend("auto", cpu) == "reference"
    monkeypatch.setenv("GNNFUSE_AUTOTUNE", "1")
    assert config.enabled("GNNFUSE_AUTOTUNE")
    monkeypatch.setenv("GNNFUSE_AUTOTUNE", "yes")  # a default-off flag is on only when set to 1
    assert not config.enabled("GNNFUSE_AUTOTUNE")
    monkeypatch.delenv("GNNFUSE_TRITON_FAST_LAUNCH", raising=False)
    assert config.enabled("GNNFUSE_TRITON_FAST_LAUNCH")  # a default-on flag is off only when set to 0
    monkeypatch.setenv("GNNFUSE_TRITON_FAST_LAUNCH", "0")
    assert not config.enabled("GNNFUSE_TRITON_FAST_LAUNCH")
    monkeypatch.setenv("GNNFUSE_BUILD_LOCK_TIMEOUT", "")
    assert not config.is_set("GNNFUSE_BUILD_LOCK_TIMEOUT") and config.get("GNNFUSE_BUILD_LOCK_TIMEOUT") == ""
    monkeypatch.delenv("GNNFUSE_BUILD_LOCK_TIMEOUT")
    assert config.get("GNNFUSE_BUILD_LOCK_TIMEOUT") == "600"


def test_registry_loads_without_the_package(monkeypatch):
    """setup.py loads the build config, and with it the registry, without torch or the package."""
    monkeypatch.setenv("GNNFUSE_BUILD_EXTENSIONS", "1")
    spec = importlib.util.spec_from_file_location("_standalone_build_cache", ROOT / "gnnfuse" / "_build_cache.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        assert module.config is not config and module.config.enabled("GNNFUSE_BUILD_EXTENSIONS")
        assert set(module.config.SETTINGS) == set(config.SETTINGS)
    finally:
        sys.modules.pop("_gnnfuse_config", None)
