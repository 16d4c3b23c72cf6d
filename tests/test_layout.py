"""The house rules a newcomer relies on: small units, arrows that point inward, no hidden cycle dodges.

* modules of at most 400 lines, functions of at most 80;
* imports between top-level packages follow experiments -> simulator -> policies (traces is read by simulator
  and experiments, calibration may read everything but experiments); nothing points back;
* a project import inside a function exists only for a stated reason (a comment on the line says why), never to
  dodge an import cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("policies", "simulator", "traces", "calibration", "experiments")
# What each package may import from the project (besides itself).
ALLOWED = {
    "policies": set(),
    "traces": set(),
    "simulator": {"policies", "traces"},
    "calibration": {"policies", "simulator", "traces"},
    "experiments": {"policies", "simulator", "traces", "calibration"},
}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _project_imports(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node, node.module.split(".")[0]))
        elif isinstance(node, ast.Import):
            found.extend((node, alias.name.split(".")[0]) for alias in node.names)
    return [(node, top) for node, top in found if top in PACKAGES]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_small_and_points_inward(path: Path):
    source = path.read_text()
    rel = path.relative_to(ROOT)
    assert source.count("\n") <= MAX_MODULE_LINES, f"{rel}: {source.count(chr(10))} lines > {MAX_MODULE_LINES}"
    tree = ast.parse(source)
    package = rel.parts[0]
    lines = source.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            assert length <= MAX_FUNCTION_LINES, f"{rel}:{node.lineno} {node.name}() is {length} lines"
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)) and inner is not node:
                    names = [inner.module or ""] if isinstance(inner, ast.ImportFrom) else [a.name for a in inner.names]
                    if any(n.split(".")[0] in PACKAGES for n in names):
                        assert "#" in lines[inner.lineno - 1], \
                            f"{rel}:{inner.lineno}: project import inside {node.name}() without a comment saying why"
    for node, top in _project_imports(tree):
        assert top == package or top in ALLOWED[package], \
            f"{rel}:{node.lineno}: {package} must not import {top} (arrows point inward)"
