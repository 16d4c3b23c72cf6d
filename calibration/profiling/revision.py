"""The revision of the code that produced a result, as git sees the checkout.

Read at the edges only: ``experiments`` stamps run summaries and study figures with it, the profiler a measured
profile's metadata. No torch here: a simulation's provenance reads it without the calibration extra.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _git(args: list[str], repo: Path) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None


def code_revision(repo: Path = REPO) -> dict[str, Any]:
    """``{commit, describe, dirty}`` of the code that runs: the full commit hash, ``git describe --always
    --dirty`` and whether tracked files differ from that commit (untracked files do not count); ``describe`` is
    'unknown' (and the others None) outside a git checkout."""
    commit = _git(["rev-parse", "HEAD"], repo)
    describe = _git(["describe", "--always", "--dirty", "--tags"], repo)
    if commit is None or describe is None:
        return {"commit": None, "describe": "unknown", "dirty": None}
    return {"commit": commit, "describe": describe, "dirty": describe.endswith("-dirty")}


def commit_label(repo: Path = REPO) -> str | None:
    """The full commit hash, with ``-dirty`` appended when tracked files differ from it; None outside a git
    checkout (a machine given a copy of the tree without its history)."""
    rev = code_revision(repo)
    if rev["commit"] is None:
        return None
    return rev["commit"] + ("-dirty" if rev["dirty"] else "")
