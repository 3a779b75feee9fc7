"""Packaging hook: everything is declared in pyproject.toml; this file only adds the optional
compile of the C++ CPU kernels into the wheel, so that an installed wheel needs no compiler:

    GNNFUSE_BUILD_EXTENSIONS=1 pip wheel --no-build-isolation --no-deps -w dist .

``--no-build-isolation`` builds against the torch already installed (the modules must match its
ABI; gnnfuse ignores them, and builds its own, under any other torch version). The code is
portable (no -march=native) unless GNNFUSE_BUILD_NATIVE=1. Without GNNFUSE_BUILD_EXTENSIONS the
package is pure Python and compiles its kernels on first use (see gnnfuse/_build.py).
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def _build_config():
    """gnnfuse/_build_cache.py loaded on its own (it imports neither torch nor the package)."""
    spec = importlib.util.spec_from_file_location("_gnnfuse_build_cache", HERE / "gnnfuse" / "_build_cache.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _settings():
    """gnnfuse/config.py, the registry of environment variables (loaded by the build config)."""
    return _build_config().config


def _with_extensions() -> dict:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    config = _build_config()
    cflags, ldflags = config.compile_flags(native=_settings().enabled("GNNFUSE_BUILD_NATIVE"))
    if sys.platform.startswith("linux"):  # no debug info: the modules shrink from ~50 MB to a few MB
        cflags, ldflags = cflags + ["-g0"], ldflags + ["-s"]
    csrc = Path("csrc")
    headers = sorted(csrc.glob("*.h"))
    modules = [
        CppExtension(f"gnnfuse._C_{name}", [str(csrc / f) for f in files], extra_compile_args=cflags,
                     extra_link_args=ldflags)
        for name, files in config.EXTENSIONS.items()
    ]
    manifest = {
        "torch": torch.__version__,
        "sources": {name: config.source_digest([csrc / f for f in files] + headers)
                    for name, files in config.EXTENSIONS.items()},
    }

    class BuildWithManifest(BuildExtension):
        """Also writes gnnfuse/_prebuilt.json: which sources and torch the modules were built from."""

        def run(self):
            super().run()
            target = Path(self.build_lib if not self.inplace else ".") / "gnnfuse" / "_prebuilt.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(manifest, indent=1) + "\n")

    return {"ext_modules": modules, "cmdclass": {"build_ext": BuildWithManifest}}


setup(**(_with_extensions() if _settings().enabled("GNNFUSE_BUILD_EXTENSIONS") else {}))
