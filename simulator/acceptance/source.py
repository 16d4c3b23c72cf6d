"""The contract every acceptance source meets: what the engine asks of a drafter's behaviour.

An acceptance source answers two questions, both with an injected generator:
how hard each new request is (a persistent per-request value), and, for one
engine step over R active requests, the drafter's confidences ``c[r, k]`` and
the true number of draft tokens the target would accept. Two members exist:
the parametric model (:mod:`simulator.acceptance.parametric`, fitted to
presets) and the replay of a real run's acceptance log
(:mod:`simulator.acceptance.replay`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class AcceptanceSource(Protocol):
    """Confidences and outcomes of a drafter, per engine step."""

    def request_difficulty(self, rng: np.random.Generator, num_requests: int) -> np.ndarray:
        """A persistent value per request -> [N], drawn when the requests arrive."""
        ...

    def sample_step(self, rng: np.random.Generator, domain_idx: np.ndarray, difficulty: np.ndarray,
                    num_draft_tokens: int, decoded_tokens: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Confidences [R, g] and accepted draft counts [R] (0..g) for one step of g draft tokens.

        ``domain_idx`` [R] and ``difficulty`` [R] describe the active requests, ``decoded_tokens`` [R] how many
        output tokens each has decoded (sources that depend on the position in the output read it).
        """
        ...

    def describe(self) -> dict[str, object]:
        """What the acceptance comes from (preset or log, and how it is read), recorded in every summary."""
        ...
