"""The source tree's layout rules: small modules, and a README architecture section that names every one."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 400  # "no file in gnnfuse/ above ~400 lines": split a module by concern before it grows past


def _architecture() -> str:
    text = (ROOT / "README.md").read_text()
    return re.search(r"^## Architecture\n(.*?)^## ", text, re.S | re.M).group(1)


def test_readme_architecture_names_every_module():
    section = _architecture()
    modules = [p for p in (ROOT / "gnnfuse").rglob("*.py") if p.name != "__init__.py"]
    modules += [p for p in (ROOT / "csrc").iterdir() if p.suffix in (".cpp", ".h")]
    missing = [str(p.relative_to(ROOT)) for p in modules if p.name not in section]
    assert not missing, f"add these to README.md's Architecture section: {missing}"


def test_no_module_in_gnnfuse_is_long():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "gnnfuse").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules above {MAX_LINES} lines (split them by concern): {long}"
