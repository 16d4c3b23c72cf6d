"""The serving loop's prefill (verifier forward over the prompt, the drafter's context, the first token), timed
for the profile's ``prefill`` block."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from functools import partial

import numpy as np

from calibration.models.drafters import Drafter
from calibration.models.model import Verifier
from calibration.profiling.timing import run_times_s
from calibration.serving.batch import LiveBatch
from calibration.serving.specdec import FLAT_COST
from policies import make_policy


def measure_prefill(verifier: Verifier, drafter: Drafter, gamma: int, prompt_tokens: tuple[int, ...],
                    rng: np.random.Generator, warmup: int = 2, repeats: int = 7) -> tuple[float, float]:
    """(fixed_s, tokens_per_s) of :meth:`LiveBatch.prefill`, fitted to the medians at two or more prompt lengths.

    With two lengths n1 < n2 the line through both; with more, least squares. Prefill is convex in the prompt
    (attention is quadratic), so a line can cross 0 below the shortest length: then fixed_s is 0 and the rate the
    one that keeps the mean time over the lengths (queues in front of a prefill instance feel the mean service
    time). Pass lengths drawn like the traffic's prompts (e.g. its quantiles) for a fit where they are.
    """
    lengths = sorted(set(prompt_tokens))
    if len(lengths) < 2 or lengths[0] < 1:
        raise ValueError(f"measure_prefill needs two or more prompt lengths >= 1, got {prompt_tokens}")
    n = np.array(lengths, dtype=float)
    t = prefill_medians_s(verifier, drafter, gamma, tuple(lengths), rng, warmup, repeats)
    slope, intercept = np.polyfit(n, t, 1)
    if slope <= 0 or intercept < 0:  # noise, or a convex curve: no fixed cost, the mean time kept
        return 0.0, float(n.mean() / t.mean())
    return float(intercept), float(1.0 / slope)


def prefill_medians_s(verifier: Verifier, drafter: Drafter, gamma: int, prompt_tokens: tuple[int, ...],
                      rng: np.random.Generator, warmup: int = 2, repeats: int = 7) -> np.ndarray:
    """Median seconds of :meth:`LiveBatch.prefill` (verifier forward, the drafter's context, the first token) at
    each of ``prompt_tokens`` (>= 1), a new random prompt each run."""
    batch = LiveBatch(verifier, drafter, make_policy("mtp1"), FLAT_COST, gamma, 1, max(prompt_tokens) + 1)

    def prefill_of(n: int) -> Callable[[], object]:  # a new prompt each run, drawn outside the timed call
        return partial(batch.prefill, rng.integers(0, verifier.s.vocab_size, size=n).tolist(), rng)
    return np.array([statistics.median(run_times_s(partial(prefill_of, k), warmup, repeats)) for k in prompt_tokens])
