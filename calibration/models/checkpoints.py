"""The trained byte-level target and drafters: shapes, and fp16 checkpoints small enough to ship.

A checkpoint is one ``torch.save`` file ``{"meta": {...}, "state": {name: fp16 tensor}}``.
``meta`` records what the weights are (kind, layer count, Markov rank, gamma they were
trained for) and how they were made (steps, seed, seconds, corpora). Loading casts the
weights back to float32. Drafter checkpoints hold only the drafter's own weights: the
embedding and LM head are the target's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from calibration.corpora import VOCAB_SIZE
from calibration.drafters import Drafter, build_drafter
from calibration.model import Verifier, build_verifier
from calibration.shapes import ModelShape

DEFAULT_DIR = Path(__file__).resolve().parent / "checkpoints"

# A Qwen3-style byte-level target that trains in minutes on two CPU cores (~0.42 M parameters).
BYTE_SHAPE = ModelShape("tiny-byte", hidden_size=96, num_layers=4, num_q_heads=4, num_kv_heads=2, head_dim=24,
                        intermediate_size=256, vocab_size=VOCAB_SIZE, tied_embeddings=True, rope_theta=10_000.0,
                        note="trained byte-level target of calibration.train")


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    """Architecture of one trained drafter (paper sec. 4.1 scaled down: deep parallel, shallow autoregressive)."""

    kind: str
    num_layers: int
    rank: int = 64  # Markov rank r (dspark)
    gamma: int = 7  # block size trained for (mtp: number of depths)


DRAFTER_CONFIGS: dict[str, DrafterConfig] = {
    "dspark": DrafterConfig("dspark", num_layers=2),
    "dflash": DrafterConfig("dflash", num_layers=2),
    "eagle3": DrafterConfig("eagle3", num_layers=1),
    "mtp": DrafterConfig("mtp", num_layers=7),  # one layer per depth
}


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
