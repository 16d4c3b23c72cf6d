"""Adding a policy is one module plus one yaml: a module dropped beside the others runs from the CLI.

The new module lives in a temporary folder appended to ``policies.__path__`` (so the tree is never modified)
and its yaml in a temporary Hydra search path; nothing else is edited or listed anywhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

MODULE = '''
"""A test policy: verify half of the drafted tokens for every request."""
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from policies.base import Decision, PolicyTraits, StepView, prefix_survival
from policies.registry import register


@register
@dataclass(frozen=True)
class Halfway(PolicyTraits):
    """l_r = gamma // 2 for every request."""

    name: ClassVar[str] = "halfway"

    def decide(self, view: StepView) -> Decision:
        lengths = np.full(view.num_requests, view.gamma // 2, dtype=np.int64)
        return Decision(lengths=lengths, pool=prefix_survival(view.confidence), capacity=int(lengths.sum()))
'''

YAML = """\
defaults:
  - /schema/policy/halfway@_here_
  - _self_
name: halfway
"""

DRIVER = '''
import runpy
import sys
import policies
policies.__path__.append({modules!r})
sys.argv = ["run", "policy=halfway", "hydra.searchpath=[file://{conf}]", "duration_s=2", "warmup_s=0",
            "progress=false", "write_tables=false", "hydra.run.dir={out}"]
runpy.run_module("experiments.run", run_name="__main__")
'''


def test_a_dropped_in_policy_runs_from_the_cli(tmp_path: Path):
    modules, conf, out = tmp_path / "modules", tmp_path / "conf", tmp_path / "run"
    modules.mkdir()
    (conf / "policy").mkdir(parents=True)
    (modules / "halfway.py").write_text(textwrap.dedent(MODULE))
    (conf / "policy" / "halfway.yaml").write_text(YAML)
    driver = DRIVER.format(modules=str(modules), conf=conf, out=out)
    done = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"] == "halfway"
    # gamma // 2 tokens verified per request-step, so the verification budget is exactly 1 + gamma // 2.
    gamma = summary["gamma"]
    assert summary["verification_budget_per_request"] == 1 + gamma // 2
