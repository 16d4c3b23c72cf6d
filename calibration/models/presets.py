"""The trained byte-level models: their vocabulary, the target's shape and each drafter's architecture.

``calibration.training`` trains these and :mod:`calibration.models.checkpoints` loads
them; the corpora encode text into this vocabulary.
"""

from __future__ import annotations

import dataclasses

from calibration.models.shapes import ModelShape

VOCAB_SIZE = 128  # 7-bit ASCII

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
