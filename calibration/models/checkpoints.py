"""Checkpoints of the trained byte-level target and drafters: fp16 files small enough to ship (in ``weights/``).

A checkpoint is one ``torch.save`` file ``{"meta": {...}, "state": {name: fp16 tensor}}``.
``meta`` records what the weights are (kind, layer count, Markov rank, gamma they were
trained for) and how they were made (steps, seed, seconds, corpora); the architectures are
those of :mod:`calibration.models.presets`. Loading casts the weights back to float32.
Drafter checkpoints hold only the drafter's own weights: the embedding and LM head are
the target's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from calibration.models.drafters import Drafter, build_drafter
from calibration.models.model import Verifier, build_verifier
from calibration.models.presets import BYTE_SHAPE, DrafterConfig

DEFAULT_DIR = Path(__file__).resolve().parent / "weights"  # the shipped checkpoints


def new_target(generator: torch.Generator) -> Verifier:
    return build_verifier(BYTE_SHAPE, generator)


def new_drafter(config: DrafterConfig, target: Verifier, generator: torch.Generator) -> Drafter:
    return build_drafter(config.kind, target, generator, num_layers=config.num_layers, rank=config.rank,
                         max_depth=config.num_layers)


def save(model: torch.nn.Module, path: Path, meta: dict[str, Any]) -> int:
    """Write fp16 weights and ``meta``; return the file size in bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().to(torch.float16).clone() for name, t in model.state_dict().items()}
    torch.save({"meta": meta, "state": state}, path)
    return path.stat().st_size


def _read(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} not found; train it with `python -m calibration.train "
                                f"--domain all --out {path.parent}`")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    return blob["meta"], blob["state"]


def _load_state(model: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    try:
        model.load_state_dict({name: t.float() for name, t in state.items()})
    except RuntimeError as err:
        raise ValueError(f"checkpoint {path} does not fit its recorded architecture: {err}") from err


def load_target(directory: Path = DEFAULT_DIR) -> Verifier:
    path = Path(directory) / "target.pt"
    meta, state = _read(path)
    if meta.get("shape") != BYTE_SHAPE.name:
        raise ValueError(f"checkpoint {path}: shape {meta.get('shape')!r}, expected {BYTE_SHAPE.name!r}")
    target = new_target(torch.Generator().manual_seed(0))
    _load_state(target, state, path)
    return target.eval()


def load_drafter(kind: str, target: Verifier, directory: Path = DEFAULT_DIR) -> Drafter:
    path = Path(directory) / f"{kind}.pt"
    meta, state = _read(path)
    config = DrafterConfig(**meta["config"])
    drafter = new_drafter(config, target, torch.Generator().manual_seed(0))
    _load_state(drafter, state, path)
    for p in drafter.parameters():
        p.requires_grad_(False)
    return drafter.eval()


def read_meta(path: Path) -> dict[str, Any]:
    return _read(Path(path))[0]
