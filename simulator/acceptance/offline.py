"""The paper's offline protocol on an acceptance source alone: every draft verified, requests run to the end.

Table 1's tau is a per-round average over whole benchmark runs: each request
contributes as many rounds as it needs, so hard requests weigh more. This
module replays that protocol with an acceptance source and no engine (numpy
only), which is how a preset's fit is checked against the numbers it was
fitted to; ``experiments.table1`` runs the same protocol through the whole
simulator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from simulator.acceptance.source import AcceptanceSource
from traces.workload import DOMAINS


@dataclass(frozen=True)
class OfflineResult:
    """tau and per-position figures of a run of the offline protocol."""

    tau: float  # mean tokens kept per round: accepted draft tokens among the verified ones, plus one
    survival: np.ndarray  # [gamma] share of rounds whose drafts 1..k would all be accepted (accept_rate@k-1)
    num_rounds: int
    num_verified_tokens: int  # draft tokens verified, over all rounds
    num_accepted_tokens: int  # verified draft tokens accepted, over all rounds
    confidence: np.ndarray | None = None  # [rounds, gamma] the source's confidences (with collect=True)
    accepted: np.ndarray | None = None  # [rounds] accepted draft tokens of each round (with collect=True)
    request: np.ndarray | None = None  # [rounds] the request each round belongs to (with collect=True)

    @property
    def conditional(self) -> np.ndarray:
        """[gamma] q_k: share of rounds accepting k among those that accepted 1..k-1 (Figure 2's metric)."""
        return self.survival / np.concatenate(([1.0], self.survival[:-1]))

    @property
    def acceptance_rate(self) -> float:
        """The paper's acceptance rate (footnote 3): tokens kept over tokens verified, the bonus counted in both,
        tau / (1 + l) - with every draft verified, tau / (1 + gamma)."""
        return (self.num_accepted_tokens + self.num_rounds) / (self.num_verified_tokens + self.num_rounds)

    @property
    def draft_acceptance_rate(self) -> float:
        """vLLM's draft acceptance rate: accepted over verified draft tokens (no bonus)."""
        return self.num_accepted_tokens / self.num_verified_tokens if self.num_verified_tokens else float("nan")


def run_offline(source: AcceptanceSource, domain: str, gamma: int, rng: np.random.Generator,
                num_requests: int = 2000, output_tokens: int = 256, collect: bool = False,
                lengths: Callable[[np.ndarray], np.ndarray] | None = None) -> OfflineResult:
    """Decode ``num_requests`` requests of ``domain`` to ``output_tokens`` tokens each, verifying every draft;
    ``collect`` keeps every round's confidences and outcome (a sample of rounds, as a log holds them).

    ``lengths`` (confidences [R, gamma] -> verified draft tokens [R]) verifies fewer, as a confidence threshold
    does (the paper's Figure 5): a round then keeps min(l, accepted) + 1 tokens.
    """
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain {domain!r}; valid: {', '.join(DOMAINS)}")
    domain_idx = np.full(num_requests, DOMAINS.index(domain), dtype=np.int64)
    difficulty = source.request_difficulty(rng, num_requests)
    produced = np.zeros(num_requests, dtype=np.int64)
    counts = np.zeros(gamma + 1, dtype=np.int64)  # rounds by accepted draft count (as if all were verified)
    verified_tokens = accepted_tokens = 0
    active = np.arange(num_requests)
    rounds_kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    while active.size:
        confidence, accepted = source.sample_step(rng, domain_idx[active], difficulty[active], gamma,
                                                  produced[active])
        if collect:
            rounds_kept.append((confidence, accepted, active))
        counts += np.bincount(accepted, minlength=gamma + 1)
        verified = np.full(active.size, gamma) if lengths is None else np.asarray(lengths(confidence))
        good = np.minimum(verified, accepted)
        verified_tokens += int(verified.sum())
        accepted_tokens += int(good.sum())
        produced[active] += good + 1
        active = active[produced[active] < output_tokens]
    rounds = int(counts.sum())
    reached = np.cumsum(counts[::-1])[::-1][1:]  # [gamma] rounds with >= k acceptable
    blocks = [np.concatenate(part) for part in zip(*rounds_kept, strict=True)] if collect else [None, None, None]
    return OfflineResult(tau=1.0 + accepted_tokens / rounds, survival=reached / rounds, num_rounds=rounds,
                         num_verified_tokens=verified_tokens, num_accepted_tokens=accepted_tokens,
                         confidence=blocks[0], accepted=blocks[1], request=blocks[2])
