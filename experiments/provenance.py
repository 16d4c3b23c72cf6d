"""Where a run came from, recorded in its summary: resolved config, code revision, profile file, traffic source.

Computed here, at the experiment layer's edge (git and file hashes are I/O);
the simulator never asks.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from calibration.profiling.revision import REPO, code_revision
from simulator import SimulationSpec
from traces.formats import detect_format
from traces.load import SAMPLES, sample_path
from traces.workload import Workload


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def shown_path(path: Path) -> str:
    """A path relative to the repository when inside it (shipped profiles and samples), else absolute."""
    resolved = path.expanduser().resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(resolved)


def traffic_source(traffic_cfg: dict[str, Any], traffic: Any) -> dict[str, Any]:
    """A trace's file, format and hash (plus the replay options), or the synthetic spec, with the config name."""
    name = traffic_cfg.get("name")
    if not isinstance(traffic, Workload):
        return {"kind": "synthetic", "name": name, "spec": dataclasses.asdict(traffic)}
    trace = str(traffic_cfg["trace"])
    path = sample_path(trace) if trace in SAMPLES else Path(trace).expanduser()
    fmt = traffic_cfg.get("format") or (SAMPLES[trace].format if trace in SAMPLES else detect_format(path))
    options = {k: v for k, v in traffic_cfg.items() if k not in ("name", "arrival", "trace", "format")}
    return {"kind": "trace", "name": name, "file": shown_path(path), "format": fmt, "sha256": file_sha256(path),
            "num_requests": traffic.num_requests, "options": options}


def provenance(cfg: DictConfig, spec: SimulationSpec) -> dict[str, Any]:
    """The summary keys that say where a run came from (``docs/outputs.md``)."""
    keys = [key for key in cfg if key != "hydra"]  # the hydra node only resolves inside a Hydra app
    config = OmegaConf.to_container(OmegaConf.masked_copy(cfg, keys), resolve=True)
    profile = Path(spec.profile.path)
    return {
        "config": config,
        "code_revision": code_revision(),
        "profile_file": shown_path(profile) if profile.is_file() else spec.profile.path,
        "profile_sha256": file_sha256(profile) if profile.is_file() else None,
        "traffic_source": traffic_source(config["traffic"], spec.traffic),  # type: ignore[index,call-overload]
    }


def save_stamped(fig: Any, out: Path, profile: Any, command: str) -> None:
    """Write a study's figure with its provenance in the bottom strip: the profile file and label (which says
    measured or analytic), the code revision and the command that drew it."""
    rev = code_revision(REPO)["describe"]
    fig.text(0.01, 0.01, f"profile {Path(profile.path).name}: {profile.label}; code {rev}; {command}",
             fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    fig.savefig(out, dpi=110)
