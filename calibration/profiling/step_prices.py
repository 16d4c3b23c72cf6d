"""The real loop's steps priced by the profile: the cost model's error alone, apart from scheduling and acceptance.

A point's throughput error mixes two things: what a step costs (the profile against
the loop's measured step times) and which steps run (batch sizes, verification
lengths and acceptance, which the simulator reproduces only in distribution).
:func:`step_cost_ratio` takes the real loop's own steps - their batch sizes,
verification lengths (the longest one for query padding) and contexts - prices each
as the simulator's engine would (drafter, inline decision, verifier forward with
padding and per-request work, attention at the contexts) and compares the sum with
the measured cycles (end of the previous step to the end of this one, less any sleep
for a prefill). A ratio above 1: the loop's steps cost more than the profile says, and
the simulator is optimistic by about that much whatever the acceptance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from simulator.costs import HardwareProfile


def priced_steps_s(steps: pd.DataFrame, profile: HardwareProfile, drafter: str, policy: str, draft_tokens: int,
                   synchronous: bool = False) -> np.ndarray:
    """Seconds the profile gives each decode step of a real steps table (columns of
    :data:`calibration.serving.spec.STEP_COLUMNS`), priced as :class:`simulator.costs.StepPricer` prices a step
    whose every request verified ``num_verified_tokens / num_requests`` tokens on average, the longest
    ``max_verified_tokens`` (query padding), over the step's contexts (the mean, or the longest with key padding)."""
    out = np.empty(len(steps))
    charged = draft_tokens > 0 and profile.charges_decision(synchronous)
    for i, (r, b, longest, ctx, max_ctx) in enumerate(zip(
            steps["num_requests"].to_numpy(int), steps["batch_tokens"].to_numpy(int),
            steps["max_verified_tokens"].to_numpy(int), steps["context_tokens"].to_numpy(float),
            steps["max_context_tokens"].to_numpy(float), strict=True)):
        contexts = np.full(r, ctx / r)
        draft_s = profile.draft_s(drafter, r, draft_tokens, profile.draft_context(drafter, contexts)) \
            if draft_tokens else 0.0
        sched_s = profile.scheduler_s(r * draft_tokens, policy) if charged else 0.0
        verify_s = profile.verify_s(r, b, r * (1 + longest) - b)
        if profile.attention is not None:
            contexts = np.full(r, max_ctx) if profile.key_padding == "longest" else contexts
            verify_s += profile.attention_s(contexts, np.full(r, max(1, round(b / r))))
        out[i] = draft_s + sched_s + verify_s
    return out


def step_cost_ratio(slices: Sequence[pd.DataFrame], profile: HardwareProfile, drafter: str, policy: str,
                    draft_tokens: int, warmup_s: float, synchronous: bool = False) -> float:
    """Measured over priced seconds of the decode steps after ``warmup_s`` of every slice (NaN without any)."""
    measured, priced = 0.0, 0.0
    for steps in slices:
        cycle_s = steps["end_at"].diff() - steps["wait_s"]
        keep = (steps["start_at"] >= warmup_s) & (steps["num_requests"] > 0) & cycle_s.notna()
        if not keep.any():
            continue
        measured += float(cycle_s[keep].sum())
        priced += float(priced_steps_s(steps[keep], profile, drafter, policy, draft_tokens, synchronous).sum())
    return measured / priced if priced else float("nan")
