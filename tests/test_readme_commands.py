"""Every command in the README's ``bash`` blocks runs, so that the README stays true.

Each fenced ``bash`` block is one test: its commands run in order in a fresh
directory (a command may read what an earlier one in its block wrote: a
profile, a sweep), shortened by the options below. Blocks that take minutes
(sweeps, anything on torch) are marked ``slow`` and run with ``python -m pytest
-m slow -n 0``. A command the table below cannot shorten runs as written, and a
placeholder it does not know fails the test: a new README command is checked
from the day it is written.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

# Commands the test does not run, by pattern, and why.
NOT_RUN = {
    r"^pip install\b": "installs packages: the suite runs inside the installed project (.ci/run installs it)",
    r"^python -m pytest\b": "the test suite itself, which holds this file",
}

# Placeholders and sizes replaced before a command runs.
REPLACE = {
    r"/path/to/measured_profile\.json": "measured_profile.json",  # written by the test (a built-in profile's copy)
    r"<stamp>": "stamp",  # the sweep below writes into multirun/<experiment>/stamp
    r"--preset qwen3-8b": "--preset tiny",  # an 8B verifier on a CPU would take hours; the tiny shape seconds
}

# A profile measured on a loaded machine can be refused as too noisy (the loop probe's timings contradict each
# other: a one-line error, not a wrong result). Such a command runs once more and must succeed then; any other
# failure fails at once.
NOISE_REFUSAL = "too noisy"

# Blocks with a command matching one of these take minutes.
SLOW = (r"^python -m experiments\.run -m\b", r"\bcalibration\b", r"^python -m experiments\.table1\b")


def bash_blocks(text: str) -> list[list[str]]:
    """The commands of every fenced ``bash`` block: one per line or per ``&&`` part, comments removed."""
    blocks = []
    for body in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        commands = []
        for line in body.splitlines():
            part: list[str] = []
            for word in [*shlex.split(line, comments=True), "&&"]:
                if word != "&&":
                    part.append(word)
                elif part:
                    commands.append(shlex.join(part))
                    part = []
        blocks.append(commands)
    return blocks


def not_run_reason(command: str) -> str | None:
    return next((why for pattern, why in NOT_RUN.items() if re.search(pattern, command)), None)


def short_options(command: str, index: int) -> list[str]:
    """Options appended so that ``command`` takes seconds (a later Hydra override or argparse option wins)."""
    if command.startswith("python -m experiments.run"):
        short = ["duration_s=2", "warmup_s=0", "progress=false"]
        if not re.match(r"python -m experiments\.run -m\b", command):
            short.append(f"hydra.run.dir=runs/{index}")
            if "hardware=my_h200.json" in command:  # the tiny CPU profile covers 16 requests and 64 batch tokens
                short += ["cluster.max_concurrency=4", "traffic.num_users=4"]
            return short
        preset = re.search(r"experiment=(\S+)", command)
        short += [f"hydra.sweep.dir=multirun/{preset.group(1) if preset else 'sweep'}/stamp",
                  "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
        if preset:  # 2 policies x 2 loads of the preset's grid (the command line overrides the preset's sweep)
            short += ["policy=mtp1,dspark", "traffic.num_users=4,64"]
        return short
    if "calibration/profile_gpu.py" in command:
        return ["--quick"]
    if command.startswith("python -m calibration.validate"):
        return ["--users", "1,2", "--duration-s", "2", "--warmup-s", "0.5", "--rounds", "1", "--log-requests", "4",
                "--profile-repeats", "1"]
    if command.startswith("python -m experiments.table1"):
        return ["--requests", "20"]
    if command.startswith("python -m experiments.bench"):
        return ["--requests", "32", "--gammas", "5", "--steps", "50", "--repeats", "50"]
    return []


def runnable(command: str, index: int) -> list[str]:
    """``command`` as an argument list: placeholders replaced, short options appended, this interpreter, and
    scripts of the repository by their path in it."""
    for pattern, replacement in REPLACE.items():
        command = re.sub(pattern, replacement, command)
    unknown = re.findall(r"<[^>]+>|/path/to/\S+", command)
    assert not unknown, f"README command {command!r} has placeholder(s) {unknown}: add them to REPLACE"
    words = shlex.split(command) + short_options(command, index)
    assert words[0] == "python", f"README command {command!r} does not start with python"
    return [sys.executable] + [str(REPO / w) if (REPO / w).is_file() and "/" in w else w for w in words[1:]]


def _params() -> list:
    params = []
    for i, commands in enumerate(bash_blocks(README.read_text())):
        slow = any(re.search(p, c) for p in SLOW for c in commands)
        name = f"block{i}-" + re.sub(r"\W+", "_", commands[0][:40]).strip("_")
        params.append(pytest.param(commands, id=name, marks=[pytest.mark.slow] if slow else []))
    return params


def test_readme_has_the_quick_start_commands():
    commands = [c for block in bash_blocks(README.read_text()) for c in block]
    assert any(c.startswith("python -m experiments.run") for c in commands)
    assert "python -m pytest -q" in commands  # the README's test command, kept as CI runs it


@pytest.mark.parametrize("commands", _params())
def test_readme_command_block_runs(commands, tmp_path):
    to_run = [c for c in commands if not_run_reason(c) is None]
    if not to_run:
        pytest.skip("; ".join(sorted({not_run_reason(c) for c in commands})))  # type: ignore[arg-type]
    shutil.copy(REPO / "simulator" / "profiles" / "h100_qwen3-8b_analytic.json", tmp_path / "measured_profile.json")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for index, command in enumerate(to_run):
        for _attempt in range(2):
            proc = subprocess.run(runnable(command, index), cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=600)
            if proc.returncode == 0 or NOISE_REFUSAL not in proc.stderr:
                break
        assert proc.returncode == 0, f"README command failed: {command}\n{proc.stderr[-3000:]}"
