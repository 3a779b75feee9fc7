"""The source tree's layout rules: small modules, and a README architecture section that names every one."""
from __future__ import annotations

import ast
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



# Numbers that gnnfuse/constants.py names: code writes the name (found in the syntax tree, so
# docstrings and messages may still spell the number out).
def _shared_number(node) -> str | None:
    def dtypes(n):
        return [f"{e.value.id}.{e.attr}" for e in n.elts if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name)]

    def const(n, value):
        return isinstance(n, ast.Constant) and type(n.value) is type(value) and n.value == value

    if isinstance(node, ast.Tuple):
        names = dtypes(node)
        if names == ["torch.float16", "torch.bfloat16"]:
            return "HALF_DTYPES"
        if names == ["torch.int32", "torch.int64"]:
            return "INDEX_DTYPES"
        if len(names) == 4 and set(names) == {"torch.float16", "torch.bfloat16", "torch.float32", "torch.float64"}:
            return "VALUE_DTYPES"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and const(node.left, 2) and const(node.right, 31):
        return "INT32_MAX or SEED_BOUND"
    if isinstance(node, ast.BinOp) and const(node.left, 50) and (
            (isinstance(node.op, ast.LShift) and const(node.right, 20)) or isinstance(node.op, ast.Mult)):
        return "DEFAULT_L2_BYTES"
    if const(node, 0.0031622776601683794):
        return "STD_CUT"
    return None


NOT_SHARED = {  # modules whose look-alike numbers are something else
    "gnnfuse/triton/_launch.py": "mirrors Triton's own int32 test of an argument",
    "gnnfuse/loader/_torch_sampling.py": "a hash modulo the prime 2**31 - 1",
    "gnnfuse/testing.py": "the tests' own order of the value dtypes",
}


def test_shared_numbers_come_from_the_constants_module():
    found = []
    for path in (ROOT / "gnnfuse").rglob("*.py"):
        name = str(path.relative_to(ROOT))
        if name in NOT_SHARED or name == "gnnfuse/constants.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if constant := _shared_number(node):
                found.append(f"{name}:{node.lineno} -> {constant}")
    assert not found, f"use gnnfuse.constants: {found}"
