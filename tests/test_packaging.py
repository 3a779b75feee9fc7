"""The package as a user gets it: the sdist carries what the tests need, the wheel installs into a
clean virtual environment and works there, away from the source tree."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

SMOKE = """
import sys, warnings, torch, gnnfuse
from pathlib import Path
assert Path(gnnfuse.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()), gnnfuse.__file__
from importlib.metadata import version
assert version("gnnfuse") == gnnfuse.__version__
x = torch.randn(6, 3, dtype=torch.float64)
ei = torch.tensor([[0, 1, 2, 5, 4], [1, 2, 3, 0, 0]])
expect = gnnfuse.fused_gather_scatter(x, ei, "sum", backend="reference")
out = gnnfuse.fused_gather_scatter(x, ei, "sum")   # the CPU kernels, from the shared build cache
assert torch.allclose(out, expect)
import gnnfuse.datasets, gnnfuse.loader, gnnfuse.nn, gnnfuse.ops, gnnfuse.triton
print("smoke ok", gnnfuse.__version__)
"""


PREBUILT_SMOKE = """
import sys, torch, gnnfuse
from pathlib import Path
from gnnfuse import _build
x, ei = torch.randn(50, 8), torch.randint(0, 50, (2, 200))
out = gnnfuse.fused_gather_scatter(x, ei, "sum")
assert torch.allclose(out, gnnfuse.fused_gather_scatter(x, ei, "sum", backend="reference"), atol=1e-5)
assert _build.compiler() is None
for name in _build.EXTENSIONS:
    assert Path(_build.load_extension(name).__file__).resolve().is_relative_to(Path(sys.prefix).resolve())
print("prebuilt ok")
"""


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{cmd}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    pytest.importorskip("build")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)], cwd=out)
    return out


def test_sdist_has_what_the_tests_examples_and_benchmarks_need(dist):
    (sdist,) = dist.glob("gnnfuse-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    for needed in ("LICENSE", "Makefile", "setup.py", "tests/conftest.py", "tests/test_examples.py",
                   "examples/train.py", "benchmarks/__main__.py", "benchmarks/gpu/validate.sh",
                   "csrc/reducer.h", "gnnfuse/py.typed", "CHANGELOG.md", "CONTRIBUTING.md"):
        assert needed in names, needed
    assert not any(name.startswith("benchmarks/results/") or name.endswith(".so") for name in names)


def _clean_venv(tmp_path: Path, wheel: Path) -> Path:
    """A new venv holding ``wheel``, which sees this interpreter's packages (torch) after its own."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # torch and friends come from this interpreter's site-packages, after the venv's own
    (site / "parent_site.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)])
    return python


def test_wheel_installs_into_a_clean_venv_and_runs(dist, tmp_path):
    (wheel,) = dist.glob("gnnfuse-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert {"gnnfuse/py.typed", "gnnfuse/_csrc/reducer.h", "gnnfuse/_csrc/csr.cpp"} <= names
    assert any(name.endswith("licenses/LICENSE") for name in names)
    python = _clean_venv(tmp_path, wheel)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = _run([str(python), "-c", SMOKE], cwd=tmp_path, env=env)
    assert "smoke ok" in result.stdout
    info = _run([str(python), "-m", "gnnfuse", "info"], cwd=tmp_path, env=env)
    assert "build cache" in info.stdout


@pytest.mark.skipif(os.environ.get("GNNFUSE_TEST_KERNEL_WHEEL") != "1",
                    reason="compiles every extension (minutes): set GNNFUSE_TEST_KERNEL_WHEEL=1")
def test_wheel_with_compiled_kernels_runs_without_a_compiler(dist, tmp_path):
    (sdist,) = dist.glob("gnnfuse-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "src", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (source,) = (tmp_path / "src").iterdir()
    env = {**os.environ, "GNNFUSE_BUILD_EXTENSIONS": "1"}
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", str(tmp_path / "w"),
          str(source)], env=env)
    (wheel,) = (tmp_path / "w").glob("gnnfuse-*.whl")
    python = _clean_venv(tmp_path, wheel)
    no_compiler = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "CXX": "/nonexistent/c++",
                   "GNNFUSE_BUILD_DIR": str(tmp_path / "unused-cache")}
    assert "prebuilt ok" in _run([str(python), "-c", PREBUILT_SMOKE], cwd=tmp_path, env=no_compiler).stdout
    assert not (tmp_path / "unused-cache").exists()  # nothing was built or cached
