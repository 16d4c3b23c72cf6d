"""What a dynamic policy's step costs in the serving loop beyond the profile's shared step model.

:func:`calibration.profiling.loop_costs.measure_loop_costs` fits one loop residual
for every policy, from static probes (mtp) and a stand-in variable-length policy
that decides nothing. A dynamic policy's step also spends time on its own work in
the loop around the drafter and the forward: building its view from the drafter's
confidences and its memory, its decision and the state update, and the shapes its
lengths give the verifier's index tensors and the rejection sampling. Timing the
decision alone between a drafter pass and a forward
(:func:`~calibration.profiling.decision_cost.measure_scheduler`) misses part of it.

:func:`measure_policy_steps` runs the serving loop itself with each policy to be
priced, the policy pricing its steps with the profile being built (as the validated
runs do), at each probed R, and prices every one of its decode steps after the ramp
with that profile's shared model (drafter, verifier forward with query padding,
per-request work, attention at the step's contexts; no decision). The step cycle
minus that price is the policy's in-loop excess. What the simulator charges per
step of that policy is a table over the step's candidates ``R * g`` (g: the
policy's draft length; ``scheduler.policies.<name>`` with ``num_candidates`` and
``s``, and ``scheduler.inline``), replacing the isolated decision timing: its
entries at the probed R are the least-squares fit of every probe step's excess
under the table's own linear interpolation (:func:`~calibration.profiling.residual_fit.hat_design`), a mean fit as the
rest of the loop fit (throughput is tokens over the sum of step times). A probe
at r users also runs steps with fewer requests while one is prefilled again; each
counts at its own R. With long prompts those are most of a probe's steps (at 8
users and 2k-token prompts about 50 of some 500 had the full batch), and the
full-batch steps alone, the steps that follow the last prefill of a burst, moved
the excess at R = 8 by 1.3-4.1 ms from one profile pass to the next. The excess is
not a line in R: on the trained models it was 0.17-0.24 ms per step at one request,
0.06-0.22 ms at two and four and 0.27-0.30 ms at eight, and the line fitted through
all of them before priced one-request steps of greedy and dspark 2-3% cheap. A
single probed R gets the line (its mean, no slope).

The probe's requests are its own: random prompts (not the validation's domain
prompts) and a seed offset from the validated runs' seeds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from calibration.models.drafters import Drafter
from calibration.models.model import Verifier
from calibration.profiling.residual_fit import hat_design, knots_without_steps
from calibration.profiling.step_prices import excess_entry_s, priced_cycles, priced_steps_s
from calibration.serving.loop import ServingModels, ServingSpec, random_prompts, serve
from calibration.serving.spec import ClockKind
from calibration.serving.specdec import ContextCost
from policies import make_policy
from policies.driver import CostSource
from simulator.costs import HardwareProfile
from simulator.specs import EngineLimits
from traces.synthetic import LengthSpec, TrafficSpec

PROBE_SEED_OFFSET = 7919  # the policy probe's seed: the profile's seed + this, apart from the validated runs' seeds
# With long prompts and short outputs the batch is full only now and then (a request that finishes is away for
# its next prefill; at 8 users and 2k-token prompts one 3.7 s loop probe of mtp1 held no full-batch step): a
# serving-loop probe with fewer full-batch steps than this runs again, the same requests for longer (the
# stretches: times its length after the ramp), and fails only with none at all after the longest.
MIN_FULL_BATCH_STEPS = 20
PROBE_STRETCHES = (1, 2, 4)


def probe_duration_s(duration_s: float, num_users: int) -> float:
    """How long a serving-loop probe at ``num_users`` runs after its ramp: ``duration_s`` up to 2 users, then in
    proportion to the users. A step's time grows about linearly with R, so the largest batches get about as many
    steps as the smallest (at 8 users a fixed 0.8 s held some 20 full-batch steps at 2k-token contexts, and the
    fits there moved by several percent between passes)."""
    return duration_s * max(1.0, num_users / 2)


@dataclass(frozen=True)
class PolicyExcess:
    """A policy's in-loop step time beyond the shared model's price: its mean at each probed R, and the line
    ``fixed_s + per_candidate_s * R * g`` through them (least squares over the steps)."""

    fixed_s: float
    per_candidate_s: float
    mean_excess_s: tuple[float, ...]  # [NR] mean excess per step at each probed R
    mean_priced_s: tuple[float, ...]  # [NR] mean shared-model price of a step at each probed R
    num_steps: int
    num_requests: tuple[int, ...] = ()  # [NR] the probed R
    draft_tokens: int = 1  # g

    def entry(self) -> dict[str, float | list[float]]:
        """The profile's ``scheduler.policies.<name>`` entry: the mean excess over the candidates ``R * g`` of the
        probed R (never below 0: a decision takes no negative time; the raw means stay in ``mean_excess_s``), or
        the line when one R was probed."""
        if len(self.num_requests) < 2:
            return {"fixed_s": self.fixed_s, "per_candidate_s": self.per_candidate_s}
        return {"num_candidates": [float(r * self.draft_tokens) for r in self.num_requests],
                "s": excess_entry_s(self.mean_excess_s)}



def probe_pricing(profile: HardwareProfile, drafter: str, draft_tokens: int) -> CostSource | ContextCost:
    """The step cost the policy prices with: the profile's, with the requests' contexts when it prices context."""
    if profile.uses_context(drafter):
        return ContextCost(lambda r, contexts: profile.step_cost_curve(drafter, r, draft_tokens, contexts))
    return partial(profile.step_cost_curve, drafter, draft_tokens=draft_tokens)


def full_batch_cycles(steps: pd.DataFrame, warmup_s: float, users: int) -> pd.DataFrame:
    """The steps with the whole batch (``users`` requests) that start after ``warmup_s`` and follow another step,
    with their cycle ``cycle_s``: end of the previous step to the end of this one, less any sleep for a prefill
    (idle, not step cost; :func:`~calibration.profiling.step_prices.priced_cycles`)."""
    cycles = priced_cycles(steps, warmup_s)
    return cycles[cycles["num_requests"] == users]


def serve_stretched(models: ServingModels, spec: ServingSpec, probe_s: float,
                    enough: Callable[[Any], bool] | None = None) -> Any:
    """``serve(spec, models)``, run again with the same requests ``(stretch - 1) * probe_s`` longer for each further
    stretch of ``PROBE_STRETCHES`` until a run is ``enough`` (default: it holds ``MIN_FULL_BATCH_STEPS``
    :func:`full_batch_cycles`); the last run."""
    if enough is None:
        def enough(result: Any) -> bool:
            cycles = full_batch_cycles(result.steps, spec.warmup_s, spec.traffic.num_users)
            return len(cycles) >= MIN_FULL_BATCH_STEPS
    for stretch in PROBE_STRETCHES:
        result = serve(replace(spec, duration_s=spec.duration_s + (stretch - 1) * probe_s), models)
        if enough(result):
            break
    return result


def _probe_steps(verifier: Verifier, drafter: Drafter, profile: HardwareProfile, name: str, gamma: int, users: int,
                 traffic: TrafficSpec, duration_s: float, warmup_s: float, seed: int, clock: ClockKind,
                 probe_s: float) -> pd.DataFrame:
    """The decode steps after warmup of a loop run of ``name`` at ``users`` (:func:`serve_stretched`: run until it
    holds enough full-batch steps), with their cycles; none when it never held a full-batch step."""
    policy = make_policy(name)
    models = ServingModels(verifier, drafter, random_prompts(verifier.s.vocab_size),
                           probe_pricing(profile, drafter.kind, policy.draft_tokens(gamma)), f"{name} step probe")
    spec = ServingSpec(policy, gamma, traffic, EngineLimits(users, 1_000_000), duration_s=duration_s,
                       warmup_s=warmup_s, seed=seed, clock=clock)
    cycles = priced_cycles(serve_stretched(models, spec, probe_s).steps, warmup_s)
    return cycles if (cycles["num_requests"] == users).any() else cycles.iloc[:0]


def measure_policy_steps(verifier: Verifier, drafter: Drafter, gamma: int, num_requests: tuple[int, ...],
                         profile: HardwareProfile, policies: tuple[str, ...], lengths: LengthSpec,
                         max_lengths: tuple[int, int], seed: int = 0, duration_s: float = 0.8,
                         warmup_s: float = 0.2, clock: ClockKind = "wall") -> dict[str, PolicyExcess]:
    """:class:`PolicyExcess` of each policy in ``policies`` (that drafts) against ``profile``, whose decision
    entries must be zero or off (they are what is measured here), at each R of ``num_requests`` that fits."""
    if profile.charges_decision(False) and (profile.scheduler_fixed_s or profile.scheduler_per_candidate_s):
        raise ValueError("measure_policy_steps prices steps without a decision: pass a profile whose scheduler "
                         "is not inline or costs 0")
    probed = tuple(r for r in num_requests if r * (1 + gamma) <= profile.max_batch_tokens)
    traffic_of = partial(TrafficSpec, arrival="closed", max_prompt_tokens=max_lengths[0],
                         max_output_tokens=max_lengths[1], lengths={d: lengths for d in ("math", "code", "chat")})
    out = {}
    for name in policies:
        policy = make_policy(name)
        g = policy.draft_tokens(gamma)
        if g == 0 or policy.name in out:
            continue
        frames = []
        for r in probed:
            ramp_s = r * float(profile.prefill_s(lengths.prompt_median_tokens))  # the r first prefills
            steps = _probe_steps(verifier, drafter, profile, name, gamma, r, traffic_of(num_users=r),
                                 probe_duration_s(duration_s, r) + ramp_s, warmup_s + ramp_s,
                                 seed + PROBE_SEED_OFFSET, clock, probe_duration_s(duration_s, r))
            if steps.empty:
                longest_s = PROBE_STRETCHES[-1] * probe_duration_s(duration_s, r)
                raise ValueError(f"the {name} step probe ran no full-batch step at {r} users, even {longest_s:g} "
                                 "s after the first prefills; lengthen it (duration_s)")
            priced = priced_steps_s(steps, profile, drafter.kind, name, g)
            frames.append(steps.assign(priced_s=priced, excess_s=steps["cycle_s"] - priced, users=r))
        out[policy.name] = fit_excess(pd.concat(frames, ignore_index=True), g, probed)
    return out


def fit_excess(steps: pd.DataFrame, draft_tokens: int, knots: tuple[int, ...] | None = None) -> PolicyExcess:
    """``excess_s = fixed_s + per_candidate_s * R * draft_tokens`` by least squares over ``steps`` (columns users,
    num_requests, excess_s, priced_s). A negative slope is noise: then the mean excess, no slope; a negative
    intercept with a positive slope: no intercept, the slope that keeps the mean. A policy whose steps cost less
    than the shared model in the mean gets 0 (the simulator's decision time cannot be negative; the raw means
    stay in ``mean_excess_s``). The table (``mean_excess_s`` at ``num_requests``): without ``knots`` the mean
    excess of each probe (column users); with them (ascending R, each with steps at it), the values at those R
    whose linear interpolation fits every step's excess at its own R best (:func:`hat_design`), with the mean
    price of the steps at each."""
    candidates = steps["num_requests"].to_numpy(float) * draft_tokens
    excess = steps["excess_s"].to_numpy(float)
    design = np.column_stack((np.ones(len(steps)), candidates))
    fixed_s, per_candidate_s = np.linalg.lstsq(design, excess, rcond=None)[0]
    if per_candidate_s < 0 or np.ptp(candidates) == 0:
        fixed_s, per_candidate_s = excess.mean(), 0.0
    elif fixed_s < 0:
        fixed_s, per_candidate_s = 0.0, max(excess.mean(), 0.0) / candidates.mean()
    if knots is None:
        by_r = steps.groupby("users")[["excess_s", "priced_s"]].mean()
        return PolicyExcess(max(float(fixed_s), 0.0), float(per_candidate_s), tuple(map(float, by_r["excess_s"])),
                            tuple(map(float, by_r["priced_s"])), len(steps), tuple(map(int, by_r.index)),
                            draft_tokens)
    at = steps["num_requests"].to_numpy(int)
    bare = knots_without_steps(at, knots)
    if bare:
        raise ValueError(f"no probe step ran at R = {bare} of the probed {list(knots)}: their excess is not measured")
    table = np.linalg.lstsq(hat_design(at, knots), excess, rcond=None)[0]
    priced = [float(steps.loc[at == r, "priced_s"].mean()) for r in knots]
    return PolicyExcess(max(float(fixed_s), 0.0), float(per_candidate_s), tuple(map(float, table)), tuple(priced),
                        len(steps), tuple(knots), draft_tokens)


def check_full_batches(steps: pd.DataFrame, probed: tuple[int, ...], probes: list[tuple[str, int, bool]]) -> None:
    """Every probe ``(name, draft tokens, static)`` of the loop-cost probe needs full-batch ``steps`` (columns
    users, num_requests, draft_tokens, static) at every probed R: a static one for its draft factor at (R, g), the
    variable-length one for its residual at R; a ValueError names those without."""
    full = steps[steps["num_requests"] == steps["users"]]
    ran = set(zip(full["users"], full["draft_tokens"], full["static"], strict=True))
    missing = [(r, name) for r in probed for name, k, static in probes if (r, k, static) not in ran]
    if missing:
        raise ValueError(f"the loop probe ran no step with a full batch at (users, probe) {missing}, even "
                         f"{PROBE_STRETCHES[-1]} times as long after the first prefills; lengthen it (duration_s)")
