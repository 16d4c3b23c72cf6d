"""calibration/'s subpackages import one way, the package imports no torch, and every known command still resolves.

Layers, each importing only those before it (within ``calibration``):

    models -> training -> serving -> profiling -> fitting -> acceptance -> validation

The modules directly under ``calibration/`` are the commands' entry points (thin shims) and may import any layer.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CALIBRATION = ROOT / "calibration"
LAYERS = ("models", "training", "serving", "profiling", "fitting", "acceptance", "validation")
# command module (python -m calibration.<name>) -> where its main lives
COMMANDS = {
    "profile_gpu": "calibration.profiling.profile_gpu",
    "roofline": "calibration.profiling.analytic",
    "fit_profile": "calibration.fitting.cli",
    "compare": "calibration.profiling.compare",
    "train": "calibration.training.train",
    "evaluate": "calibration.acceptance.evaluate",
    "validate": "calibration.validation.validate",
}


def _subpackage_modules() -> list[Path]:
    return sorted(p for layer in LAYERS for p in (CALIBRATION / layer).rglob("*.py"))


def _calibration_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, subpackage) of every ``calibration.<subpackage>`` import, function-local ones included."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "calibration" else [f"calibration.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [(node.lineno, n.split(".")[1]) for n in names if n.startswith("calibration.")]
    return found


@pytest.mark.parametrize("path", _subpackage_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_subpackage_imports_only_earlier_layers(path: Path):
    layer = path.relative_to(CALIBRATION).parts[0]
    allowed = LAYERS[: LAYERS.index(layer) + 1]
    for line, target in _calibration_imports(ast.parse(path.read_text())):
        assert target in allowed, f"{path.relative_to(ROOT)}:{line}: {layer} must not import calibration.{target}"


@pytest.mark.parametrize("command, target", COMMANDS.items())
def test_command_shim_runs_its_subpackage_main(command: str, target: str):
    shim = importlib.import_module(f"calibration.{command}")
    assert shim.main is importlib.import_module(target).main
    assert (CALIBRATION / f"{command}.py").read_text().count("\n") <= 12  # a shim, not a second copy


def test_simulation_package_shapes_and_analytic_roofline_import_no_torch():
    # torch is the calibration extra (`pip install -e .` leaves it out): the simulation command, the model shapes
    # and the analytic roofline run without it. One interpreter for all (a fresh one costs ~2.5 s of the suite).
    code = ("import sys, experiments.run, calibration, calibration.models.shapes, calibration.models.presets, "
            "calibration.profiling.analytic, calibration.profiling.context_tables; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)
