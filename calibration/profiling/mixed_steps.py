"""What a step costs when prefill chunks share it with decoding requests, beyond the sum of its priced parts.

The profile prices a co-located step as one forward: the dense part over decode plus
chunk tokens, each decoding request's attention, each chunk's attention (its table
measured on a chunk alone, the drafter's context of the chunk included), per-request
work of R + chunks. Measured in the serving loop, a step of chunks alone costs what
that sum says, a step of decoding requests alone too, but a step with both costs
more: 0.9-2 ms per step on the tiny CPU models at 2-8 users with 512-token chunks,
growing with R (the chunk's own bookkeeping - its KV commit, the first token of a
completed prompt, a second drafter call for its context - and the decoding requests'
drafter pass after the chunk's work has taken the caches). Production engines have
the same kind of term: a mixed batch may leave the CUDA-graph path that pure decode
batches take.

:func:`measure_mixed_steps` runs the serving loop in chunked mode with ``mtp1`` (a
static policy: nothing policy-specific in the excess) on random prompts of the
workload's lengths at each probed R >= 2, prices every step after warm-up with the
profile being built, and fits the excess of the mixed steps (chunks and decoding
requests) over their price, less the mean excess of the steps of decoding requests
alone in the same run, as ``fixed_s + per_request_s * R`` (R: the step's decoding
requests) by least squares - means, as the rest of the loop fit. That is the
profile's ``prefill.mixed_step``: what a mixed step costs beyond a decode step
priced alike, measured side by side, so that the state of the machine during the
probe (its decode steps ran 0.2-1.2 ms above their price in one pass at 2k-token
contexts) does not land in it. The decode-only steps' mean excess is reported beside
it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from calibration.models.drafters import Drafter
from calibration.models.model import Verifier
from calibration.profiling.policy_steps import (
    PROBE_SEED_OFFSET,
    PolicyExcess,
    fit_excess,
    probe_duration_s,
    probe_pricing,
    serve_stretched,
)
from calibration.profiling.step_prices import priced_cycles, priced_steps_s
from calibration.serving.loop import ServingModels, ServingSpec, random_prompts
from calibration.serving.spec import ClockKind
from policies import make_policy
from simulator.costs import HardwareProfile
from simulator.specs import EngineLimits
from traces.synthetic import LengthSpec, TrafficSpec

PROBE_POLICY = "mtp1"
# A probe run with fewer mixed steps after its warm-up than this runs again, longer (policy_steps.serve_stretched):
# under load a short run can hold none at all
MIN_MIXED_STEPS = 10


@dataclass(frozen=True)
class MixedExcess:
    """The fit over the mixed steps and the check over the decode-only steps of the same runs."""

    fit: PolicyExcess  # fixed_s + per_candidate_s * R: per_candidate_s is per decoding request here; mean_excess_s
    # are the mixed steps' excess less the decode-only steps' of the same run
    decode_only_excess_s: tuple[float, ...]  # [NR] mean excess of the steps without chunks at each probed R
    num_users: tuple[int, ...]

    def entry(self) -> dict[str, float]:
        """The profile's ``prefill.mixed_step`` block."""
        return {"fixed_s": self.fit.fixed_s, "per_request_s": self.fit.per_candidate_s}

    def metadata(self) -> dict[str, object]:
        return {"num_users": list(self.num_users), "mean_excess_s": list(self.fit.mean_excess_s),
                "mean_priced_s": list(self.fit.mean_priced_s), "num_steps": self.fit.num_steps,
                "decode_only_mean_excess_s": list(self.decode_only_excess_s), "policy": PROBE_POLICY,
                "definition": "mean of (step cycle - the profile's price) over the steps with prefill chunks and "
                              "decoding requests of chunked serving-loop runs (random prompts, seed + "
                              f"{PROBE_SEED_OFFSET}), less the same mean over the run's steps of decoding requests "
                              "alone, fitted as fixed_s + per_request_s * R"}


def _probe(verifier: Verifier, drafter: Drafter, profile: HardwareProfile, gamma: int, users: int,
           traffic: TrafficSpec, token_budget: int, duration_s: float, warmup_s: float, seed: int,
           clock: ClockKind) -> pd.DataFrame:
    """The steps after warm-up of one chunked loop run at ``users``, priced: columns ``cycle_s``, ``priced_s``,
    ``excess_s``, ``mixed`` (chunks beside decoding requests) besides the loop's own."""
    policy = make_policy(PROBE_POLICY)
    g = policy.draft_tokens(gamma)
    models = ServingModels(verifier, drafter, random_prompts(verifier.s.vocab_size),
                           probe_pricing(profile, drafter.kind, g), "mixed-step probe")
    limits = EngineLimits(users, 1_000_000, max_num_batched_tokens=token_budget)
    spec = ServingSpec(policy, gamma, traffic, limits, duration_s=duration_s, warmup_s=warmup_s, seed=seed,
                       prefill="chunked", clock=clock)
    results = serve_stretched(models, spec, duration_s,
                              lambda run: _mixed(priced_cycles(run.steps, warmup_s)).sum() >= MIN_MIXED_STEPS)
    kept = priced_cycles(results.steps, warmup_s)
    priced = priced_steps_s(kept, profile, drafter.kind, policy.name, g, policy.synchronous, results.chunks)
    return kept.assign(priced_s=priced, excess_s=kept["cycle_s"] - priced, mixed=_mixed(kept), users=users)


def _mixed(steps: pd.DataFrame) -> pd.Series:
    """Which steps ran prefill chunks beside decoding requests."""
    return (steps["prefill_tokens"] > 0) & (steps["num_requests"] > 0)


def measure_mixed_steps(verifier: Verifier, drafter: Drafter, gamma: int, num_requests: tuple[int, ...],
                        profile: HardwareProfile, token_budget: int, lengths: LengthSpec,
                        max_lengths: tuple[int, int], seed: int = 0, duration_s: float = 1.5,
                        warmup_s: float = 0.3, clock: ClockKind = "wall") -> MixedExcess:
    """:class:`MixedExcess` against ``profile`` (which must not have ``prefill.mixed_step`` yet: it is what is
    measured) at each R >= 2 of ``num_requests`` (one user has no mixed step) under ``token_budget``."""
    if profile.mixed_step is not None:
        raise ValueError("measure_mixed_steps prices steps without prefill.mixed_step: pass a profile without it")
    probed = tuple(r for r in num_requests if r >= 2)
    if not probed:
        raise ValueError(f"measure_mixed_steps needs an R >= 2 in num_requests, got {num_requests}")
    frames = []
    for r in probed:
        traffic = TrafficSpec(arrival="closed", num_users=r, max_prompt_tokens=max_lengths[0],
                              max_output_tokens=max_lengths[1], lengths={d: lengths for d in ("math", "code", "chat")})
        frames.append(_probe(verifier, drafter, profile, gamma, r, traffic, token_budget,
                             probe_duration_s(duration_s, r), warmup_s, seed + PROBE_SEED_OFFSET, clock))
    steps = pd.concat(frames, ignore_index=True)
    missing = sorted(set(probed) - set(steps.loc[steps["mixed"], "users"]))
    if missing:
        raise ValueError(f"the mixed-step probe ran no step with chunks beside decoding requests at {missing} users; "
                         f"lengthen it (duration_s {duration_s:g})")
    return fit_mixed(steps, probed)


def fit_mixed(steps: pd.DataFrame, probed: tuple[int, ...]) -> MixedExcess:
    """The fit over priced probe steps (columns users, num_requests, prefill_tokens, mixed, excess_s, priced_s):
    each mixed step's excess less the mean excess of its run's decode-only steps, ``fixed_s + per_request_s * R``."""
    mixed = steps[steps["mixed"]]
    decode_only = steps[~steps["mixed"] & (steps["prefill_tokens"] == 0)].groupby("users")["excess_s"].mean()
    baseline = mixed["users"].map(decode_only).fillna(0.0)  # a run without decode-only steps: nothing to subtract
    fit = fit_excess(mixed.assign(excess_s=mixed["excess_s"] - baseline), 1)
    return MixedExcess(fit, tuple(float(decode_only.get(r, np.nan)) for r in probed), probed)
