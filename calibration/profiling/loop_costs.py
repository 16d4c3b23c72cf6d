"""Step costs of the real serving loop that timing its pieces in isolation misses, measured for the profile.

The profiler times the verifier forward and the drafter each on its own,
repeating one call. Inside :mod:`calibration.serving.loop` a step also spends time
outside them - index tensors, softmax rows to numpy, token-level rejection
sampling in Python, policy-state and request bookkeeping, the loop between steps
- and on a CPU the forward passes themselves run slower there: they alternate
with each other (caches and predictors hold the other model's state) and attend
over each request's real context, padded to the longest in the batch, which
grows with the number of requests R. :func:`measure_loop_costs` runs the serving
loop itself with static policies (``mtp1`` and ``mtp<gamma>``) and with
:class:`VariableLength` (verification lengths that differ between requests and
change every step, as a dynamic policy's do; random prompts, the workload's
lengths) at several concurrencies R, longer by the R first prefills that fill the
batch and in proportion to R above 2 (:func:`~calibration.profiling.policy_steps.probe_duration_s`: about as
many steps at every R; a probe with fewer than ``MIN_FULL_BATCH_STEPS`` steps of the whole batch runs again for
longer, as the per-policy probe does). It measures on every decode step after the
ramp, each at the R it ran with: a probe at r users also runs steps with fewer
while a request is prefilled again, and with long prompts those are most of its
steps (the full-batch ones alone are the steps right after the last prefill of a
burst). The tables over R are fitted under the linear interpolation the profile
reads them with (:func:`~calibration.profiling.residual_fit.hat_design`), as
**means** (throughput is tokens over the sum of step times; a CPU's step times
have a right tail, steps up to 2x slower in every part while another job shares
the core, that a median would leave out):

* ``draft_factor[R, g]``: in-loop drafter seconds / the isolated draft table read as
  the simulator reads it (at the batch's longest context with key padding, which the
  factor must not hold too), over the static probes' steps, for g = 1, gamma: at one
  R the ratio of the sums, between probed R weighted least squares
  (:func:`~calibration.profiling.residual_fit.draft_factors`);
* the non-draft residual: step cycle (end of the previous step to the end of this
  one, less any sleep for a prefill) minus in-loop drafter seconds minus the
  isolated ``1 / SPS(B) + per_request(R)`` with the step's query padding
  (+ the attention table at the step's contexts, version 2) - host work and the
  forward passes' in-loop excess - fitted as ``a_R + c B`` (a table over R,
  one slope), for a version-2 profile ``+ join_s J + leave_s L + wake_s W`` (the step's
  joined and finished requests, 1 after a sleep), by least squares over the static
  probes' steps (:func:`calibration.profiling.residual_fit.churn_fit`): the line alone
  prices static policies, and each validated dynamic one pays its own steps' excess
  over it on top (the policy probe). The variable-length probe's steps (1-2% of a
  cycle below the static ones' at 2-8 requests on 2k-token prompts) once shared the
  fit and put mtp1's price at 8 requests 2% under its steps;
* ``prefill_factor``: in-loop prefill seconds / the profile's ``prefill_s``, summed;
* the same loop without speculation (``none``: no drafter in the step or the prefill), whose steps get their own
  intercept under the same line and whose prefills their own factor (:mod:`calibration.profiling.plain_steps`);
* for reports, the host part alone (cycle minus in-loop drafter and forward seconds) as ``fixed + per_request *
  R + per_verified_token * (B - R)``, and ``probe_misfit``: how far the line misses each probe's own steps at each
  R, the variable-length one's included (``docs/validation.md``, "What the profile had to learn").

:meth:`LoopCosts.fold` writes them into the profile's own form: draft entries
scaled by ``draft_factor`` (linear in R and g between probed points), the prefill
by ``prefill_factor``, ``per_request(R) += a_R`` and c, the host work per verified
token: into ``verify.decode_token_s`` of a version-2 profile, which the engine
charges on a step's decode tokens only (a prefill chunk's tokens get no softmax
rows or rejection sampling), as ``1/SPS(B) += c B`` into the dense table of a
version-1 profile (no such field: every batch token pays, chunk tokens too); the
churn terms into ``verify.join_s``, ``leave_s`` and ``wake_s`` (version 2 only); ``per_request(R)`` takes the
``none`` steps' intercept and every draft entry the gap to ``a_R``, and ``prefill.draft_share`` the drafter's share
of a prefill (:func:`~calibration.profiling.plain_steps.fold_plain`). The isolated tables stay in
``metadata.forward_only``; ``metadata.loop_costs.folded`` says which form was used.

:func:`calibration.profiling.decision_cost.measure_scheduler` times ``policies.Greedy.decide`` (a synchronous policy)
over (R, gamma) and fits the profile's ``scheduler`` fields
(``fixed_s + per_candidate_s * R * gamma``). :func:`measure_prefill` times the
loop's prefill (verifier forward, the drafter's context, the first token).
:func:`with_loop_costs` does all of it for a profile dictionary, and prices each validated dynamic policy by
its own steps in the loop (:mod:`calibration.profiling.policy_steps`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from calibration.models.drafters import Drafter
from calibration.models.model import Verifier
from calibration.profiling.decision_cost import isolated_decisions
from calibration.profiling.loop_prefill import measure_prefill, prefill_medians_s
from calibration.profiling.mixed_steps import measure_mixed_steps
from calibration.profiling.plain_steps import (
    PLAIN_POLICY,
    draft_share,
    fold_plain,
    gap_s,
    plain_per_request_s,
    plain_probed,
)
from calibration.profiling.policy_steps import (
    PROBE_SEED_OFFSET,
    check_full_batches,
    measure_policy_steps,
    probe_duration_s,
    serve_stretched,
)
from calibration.profiling.residual_fit import VARIABLE_LENGTH, churn_fit, draft_factors, probe_misfit
from calibration.profiling.step_prices import batch_contexts, priced_cycles, static_attention_s
from calibration.serving.loop import ServingModels, ServingSpec, random_prompts
from calibration.serving.spec import ClockKind
from calibration.serving.specdec import FLAT_COST
from policies import make_policy
from policies.base import Decision, PolicyTraits, StepView, prefix_survival, trim_to_budget
from simulator.costs import HardwareProfile, profile_from_dict
from simulator.specs import EngineLimits
from traces.synthetic import LengthSpec, TrafficSpec


@dataclass(frozen=True)
class VariableLength(PolicyTraits):
    """The loop probe's dynamic-shape policy: each request verifies a length in 0..gamma that looks random and
    changes every step - a hash of the drafter's first confidence, independent of what will be accepted - so
    that the probe's steps have the varying, padded shapes a dynamic policy's steps have, at no decision cost."""

    name: ClassVar[str] = VARIABLE_LENGTH
    reads_cost: ClassVar[bool] = False

    def decide(self, view: StepView) -> Decision:
        spread = np.modf(np.asarray(view.confidence[:, 0], dtype=np.float64) * 9973.0)[0]
        lengths = trim_to_budget(np.minimum((spread * (view.gamma + 1)).astype(np.int64), view.gamma),
                                 view.draft_budget)
        return Decision(lengths=lengths, pool=prefix_survival(view.confidence), capacity=int(lengths.sum()))


DECODE_TAIL_STEPS = 6  # decode steps after a prefill cut from the decode clock that the tail is fitted over
FIXED_LENGTHS = LengthSpec(prompt_median_tokens=32, prompt_sigma=0.0, output_median_tokens=96, output_sigma=0.0)


@dataclass(frozen=True)
class LoopCosts:
    """What the serving loop adds to the isolated tables (see the module docstring)."""

    num_requests: tuple[int, ...]  # [NR] the R the probe ran at
    draft_tokens: tuple[int, ...]  # [NG] the draft lengths it ran at (1 and gamma)
    draft_factor: tuple[tuple[float, ...], ...]  # [NR][NG] in-loop / isolated drafter seconds
    extra_per_request_s: tuple[float, ...]  # [NR] a_R of the non-draft residual
    extra_per_batch_token_s: float  # c of the non-draft residual
    prefill_factor: float
    host_fixed_s: float  # the host part alone, for reports: fixed + per request R + per verified token
    host_per_request_s: float
    host_per_verified_token_s: float
    num_steps: int  # probe steps the fits come from
    # probe name -> [NR] its steps' mean residual minus the line's mean over them, as a share of their mean cycle
    # (how far the shared a_R + c B misses that probe's own steps; a report, not folded into the tables)
    probe_misfit: dict[str, list[float]] = field(default_factory=dict)
    # the step's work per request that joined the batch before it and per request it finished (version 2 only)
    join_s: float = 0.0
    leave_s: float = 0.0
    wake_s: float = 0.0  # the first step after the loop slept (version 2 only)
    # The none probe (calibration.profiling.plain_steps): [NR] a_R of its steps (empty: not probed) and its
    # prefills' in-loop / isolated seconds (None: not probed).
    plain_per_request_s: tuple[float, ...] = ()
    plain_prefill_factor: float | None = None
    plain_num_requests: tuple[int, ...] = ()  # [NP] the R of plain_per_request_s (those where its batch filled)
    # [K] seconds per prompt prefilled on the decode device, k steps back: in the residual and in the drafter
    residual_tail_s: tuple[float, ...] = ()
    draft_tail_s: tuple[float, ...] = ()

    def draft_factor_at(self, num_requests: np.ndarray, draft_tokens: np.ndarray) -> np.ndarray:
        """Factor [len(R), len(g)]: linear in g between the probed lengths, in R between the probed R."""
        reqs, gammas = np.array(self.num_requests, float), np.array(self.draft_tokens, float)
        grid = np.array(self.draft_factor)  # [NR, NG]
        per_r = np.stack([np.interp(num_requests, reqs, grid[:, j]) for j in range(gammas.size)], axis=1)
        return np.stack([np.interp(draft_tokens, gammas, row) for row in per_r])

    def fold(self, profile: dict[str, Any]) -> dict[str, Any]:
        """A copy of a profile dictionary with these costs in its tables (see the module docstring)."""
        out = copy.deepcopy(profile)
        verify = out["verify"]
        tokens = np.array(verify["batch_tokens"], dtype=float)
        # c: host work per verified token. Version 2 has a field for it that the engine charges on decode tokens
        # alone; in the dense table (version 1) it would also be charged on co-located prefill chunks' tokens.
        per_decode_token = profile.get("version", 1) >= 2
        churn = {"join_s": self.join_s, "leave_s": self.leave_s, "wake_s": self.wake_s}
        if not per_decode_token and (any(churn.values()) or any(self.residual_tail_s + self.draft_tail_s)):
            raise ValueError("join_s, leave_s, wake_s and the prefill tail need a version-2 profile (verify.join_s, "
                             "..., prefill.decode_tail_s)")
        step_s = 1.0 / np.array(verify["steps_per_s"])
        if not per_decode_token:
            step_s = step_s + self.extra_per_batch_token_s * tokens
        per_request = out.get("per_request") or {"num_requests": [1, 1024], "step_s": [0.0, 0.0]}
        reqs = np.array(per_request["num_requests"], dtype=float)
        plain = bool(self.plain_per_request_s)  # a step that drafts nothing is priced by the none probe's a_R
        gap = partial(gap_s, num_requests=self.num_requests, per_request_s=self.extra_per_request_s,
                      plain_num_requests=self.plain_num_requests, plain_s=self.plain_per_request_s)
        extra = (np.interp(reqs, np.array(self.num_requests, float), np.array(self.extra_per_request_s))
                 - (gap(reqs) if plain else 0.0))
        meta = out["metadata"]
        meta["forward_only"] = copy.deepcopy({"verify": verify, "per_request": out.get("per_request"),
                                              "draft": out["draft"], "prefill": out["prefill"]})
        meta["loop_costs"] = {**{k: (np.array(v).tolist() if isinstance(v, tuple) else v)
                                 for k, v in vars(self).items()},
                              "folded": "draft(R, g) *= draft_factor(R, g); prefill (line, table) *= prefill_factor; "
                                        + ("verify.decode_token_s += extra_per_batch_token_s (charged per decode "
                                           "token, none per prefill-chunk token)" if per_decode_token else
                                           "1/SPS(B) += extra_per_batch_token_s * B")
                                        + ("; verify.join_s, leave_s, wake_s = join_s, leave_s, wake_s; "
                                           "prefill.decode_tail_s = residual_tail_s + draft_tail_s"
                                           if per_decode_token else "")
                                        + ("; per_request(R) += extra_per_request_s(R) - gap(R) (clipped at 0) "
                                           "and draft(R, g) += gap(R), gap = extra_per_request_s - "
                                           "plain_per_request_s at plain_num_requests (the nearest one's beyond); "
                                           "prefill.draft_share = 1 - plain_prefill_factor / prefill_factor (at "
                                           "least 0)" if plain else
                                           "; per_request(R) += extra_per_request_s(R) (clipped at 0)")}
        out["verify"] = ({**verify, "decode_token_s": verify.get("decode_token_s", 0.0) + self.extra_per_batch_token_s,
                          **({k: v for k, v in churn.items() if v})}
                         if per_decode_token else {**verify, "steps_per_s": (1.0 / step_s).tolist()})
        out["per_request"] = {"num_requests": per_request["num_requests"],
                              "step_s": np.maximum(np.array(per_request["step_s"]) + extra, 0.0).tolist()}
        out["prefill"] = {**out["prefill"], "fixed_s": self.prefill_factor * out["prefill"]["fixed_s"],
                          "tokens_per_s": out["prefill"]["tokens_per_s"] / self.prefill_factor}
        tail_s = np.add(self.residual_tail_s, self.draft_tail_s) if self.residual_tail_s else np.zeros(0)
        if tail_s.any():  # through the last step that pays
            out["prefill"]["decode_tail_s"] = tail_s[:int(np.flatnonzero(tail_s)[-1]) + 1].tolist()
        if "table" in out["prefill"]:
            table = out["prefill"]["table"]
            scaled = self.prefill_factor * np.array(table["latency_s"])
            out["prefill"]["table"] = {**table, "latency_s": scaled.tolist()}
        if np.any(step_s <= 0) or np.any(np.array(out["per_request"]["step_s"]) + 1.0 / np.array(
                out["verify"]["steps_per_s"])[0] <= 0):
            raise ValueError("the loop costs would make a step cost <= 0; the isolated tables are too noisy "
                             "(profile with more --repeats and --interleave)")
        for table in out["draft"].values():
            factor = self.draft_factor_at(np.array(table["num_requests"], float),
                                          np.array(table["draft_tokens"], float))
            table["latency_s"] = (factor * np.array(table["latency_s"])).tolist()
        if plain:
            share, meta["loop_costs"]["draft_share_measured"] = draft_share(self.prefill_factor,
                                                                            float(self.plain_prefill_factor))
            fold_plain(out, gap, share)
        return out


def measure_loop_costs(verifier: Verifier, drafter: Drafter, gamma: int, num_requests: tuple[int, ...],
                       isolated: HardwareProfile, lengths: LengthSpec = FIXED_LENGTHS, seed: int = 0,
                       duration_s: float = 0.8, warmup_s: float = 0.2,
                       max_lengths: tuple[int, int] | None = None, clock: ClockKind = "wall") -> LoopCosts:
    """Run the serving loop with mtp1 and mtp<gamma> at each R and measure :class:`LoopCosts` against ``isolated``.
    ``max_lengths``: the longest prompt and output (default: 4 x the medians); ``clock``: the loop's clock (the one
    the runs this profile is compared with use)."""
    # None of the probe's policies reads the cost curve (``reads_cost``), so the loop never builds one for them, as
    # it does not for mtp1 when serving; a policy that prices its steps pays for its curve in its own step probe.
    models = ServingModels(verifier, drafter, random_prompts(verifier.s.vocab_size), FLAT_COST, "loop-cost probe")
    max_prompt, max_output = max_lengths or (int(np.ceil(4 * lengths.prompt_median_tokens)),
                                             int(np.ceil(4 * lengths.output_median_tokens)))
    gammas = tuple(sorted({1, gamma}))
    probed = tuple(r for r in num_requests if r * (1 + gamma) <= isolated.max_batch_tokens)
    if not probed:
        raise ValueError(f"no R in {num_requests} fits R x (1 + gamma={gamma}) into the profile's "
                         f"{isolated.max_batch_tokens} batch tokens")
    # mtp1 and mtp<gamma>: the draft factor at both draft lengths; VariableLength: steps whose verification lengths
    # differ between requests and change from step to step (padding, shapes the forward did not just run), as a
    # dynamic policy's do, without any dynamic policy's decisions.
    # none: a step and a prefill without a drafter (calibration.profiling.plain_steps).
    probes = [(make_policy(f"mtp{k}"), k) for k in gammas] + [(VariableLength(), gamma),
                                                               (make_policy(PLAIN_POLICY), 0)]
    frames, prefills = [], []  # prefills: (in-loop seconds, isolated seconds, drafts nothing) of each probe's
    for r in probed:
        # The r users' first prefills go one after the other: the decode clock waits for them before the batch is
        # full (long prompts make that a large part of a short probe), so the probe runs that much longer.
        ramp_s = r * float(isolated.prefill_s(lengths.prompt_median_tokens))
        for policy, k in probes:
            traffic = TrafficSpec(arrival="closed", num_users=r, max_prompt_tokens=max_prompt,
                                  max_output_tokens=max_output, lengths={d: lengths for d in ("math", "code", "chat")})
            result = serve_stretched(models, ServingSpec(
                policy, gamma, traffic, EngineLimits(r, 1_000_000), seed=seed, clock=clock,
                duration_s=probe_duration_s(duration_s, r) + ramp_s, warmup_s=warmup_s + ramp_s),
                probe_duration_s(duration_s, r))
            done = result.requests.dropna(subset=["first_token_at"])
            prefills.append(((done["first_token_at"] - done["prefill_start_at"]).sum(),
                             isolated.prefill_s(done["prompt_tokens"].to_numpy()).sum(), k == 0))
            # Every decode step after the ramp, at its own R (the fits below): a probe at r users also runs steps
            # with fewer while a request is prefilled again, which the served runs have as well.
            frames.append(priced_cycles(result.steps, warmup_s + ramp_s).assign(
                draft_tokens=k, users=r, static=not isinstance(policy, VariableLength)))
    s = pd.concat(frames, ignore_index=True)
    check_full_batches(s, probed, [(p.name if isinstance(p, VariableLength) else f"mtp{k}", k,
                                    not isinstance(p, VariableLength)) for p, k in probes if k > 0])
    plain_steps = s["draft_tokens"] == 0
    plain_reqs = plain_probed(s[plain_steps], probed)
    iso_draft = np.array([isolated.draft_s(drafter.kind, r, g, isolated.draft_context(drafter.kind, batch_contexts(
        r, c, m))) for r, g, c, m in zip(s["num_requests"], s["draft_tokens"], s["context_tokens"],
                                         s["max_context_tokens"], strict=True)])
    padded = s["num_requests"] * (1 + s["max_verified_tokens"]) - s["batch_tokens"]
    iso_verify = np.array([isolated.verify_s(r, b, p) + static_attention_s(isolated, r, k, c, m)
                           for r, b, p, k, c, m in zip(s["num_requests"], s["batch_tokens"], padded, s["draft_tokens"],
                                                       s["context_tokens"], s["max_context_tokens"], strict=True)])
    s = s.assign(iso_draft_s=iso_draft,
                 residual_s=s["cycle_s"] - s["draft_s"] - iso_verify,  # what the isolated verify table misses
                 host_s_cycle=s["cycle_s"] - s["draft_s"] - s["verify_s"])
    s, plain = s[~plain_steps.to_numpy()], s[plain_steps.to_numpy()]
    # Means, not medians: throughput is tokens over the *sum* of step times, and on a CPU the step times have a
    # right tail (steps that run up to 2x slower in every part - drafter, forward, host - while another job shares
    # the core); a median leaves it out and prices every step as a typical one.
    tail_steps = DECODE_TAIL_STEPS if isolated.version >= 2 else 0  # version 1 has no prefill.decode_tail_s
    grid, draft_tail_s = draft_factors(s[s["static"]], probed, gammas, tail_steps)
    # The line is the static probes' (see the module docstring); the variable-length probe is reported against it.
    line = churn_fit(s[s["static"]], probed, churn=isolated.version >= 2, tail_steps=tail_steps)
    host_design = np.column_stack((np.ones(len(s)), s["num_requests"], s["num_verified_tokens"]))
    host_coef = np.linalg.lstsq(host_design, s["host_s_cycle"].to_numpy(), rcond=None)[0]
    in_loop_s, iso_s, none_prefill = (np.array(column) for column in zip(*prefills, strict=True))
    prefill_factors = [float(in_loop_s[of].sum() / iso_s[of].sum()) for of in (~none_prefill, none_prefill)]
    return LoopCosts(probed, gammas, grid, line.per_request_s, line.per_batch_token_s, prefill_factors[0],
                     float(host_coef[0]), float(host_coef[1]), float(host_coef[2]), len(s),
                     probe_misfit(s.assign(line_s=line.at(s)), probed), line.join_s, line.leave_s, line.wake_s,
                     plain_per_request_s(plain, line, plain_reqs), prefill_factors[1], plain_reqs,
                     line.decode_tail_s, draft_tail_s)


def with_loop_costs(profile: dict[str, Any], model: Verifier, drafter: Drafter, gamma: int,
                    probe_requests: tuple[int, ...], prefill_tokens: tuple[int, ...],
                    lengths: LengthSpec = FIXED_LENGTHS, seed: int = 0, warmup: int = 2, repeats: int = 7,
                    on_point: Callable[[str], None] = lambda _: None,
                    policies: tuple[str, ...] = ("greedy",),
                    max_lengths: tuple[int, int] | None = None, clock: ClockKind = "wall",
                    token_budget: int | None = None) -> dict[str, Any]:
    """Measure the scheduler, the loop's prefill and :class:`LoopCosts`; return a new profile dictionary with them.

    The serving loop decides inline (no overlap with the previous step), so the profile's scheduler is marked
    ``inline`` and gets an entry per policy in ``policies`` (and greedy, the default): each decision's marginal
    cost between a drafter pass and the verifier forward (:func:`measure_scheduler` with ``between`` and
    ``after``), less mtp's, which the loop probe's host residual already holds (mtp's entry is 0). A dynamic
    policy in ``policies`` then gets its own steps' mean excess in the loop over the shared model instead
    (:func:`calibration.profiling.policy_steps.measure_policy_steps`); the isolated timings stay in metadata.
    With ``token_budget`` (co-located chunked prefill) and a version-2 profile that prices chunks, the loop's steps
    with chunks beside decoding requests are probed too and their excess written as ``prefill.mixed_step``
    (:func:`calibration.profiling.mixed_steps.measure_mixed_steps`).
    """
    by_policy = isolated_decisions(profile, model, drafter, gamma, lengths, seed, policies, on_point)
    default = by_policy["greedy"]
    on_point("serving-loop prefill")
    prefill_fixed_s, prefill_tokens_per_s = measure_prefill(model, drafter, gamma, prefill_tokens,
                                                            np.random.default_rng(seed), warmup, repeats)
    prefill = {**profile["prefill"], "fixed_s": prefill_fixed_s, "tokens_per_s": prefill_tokens_per_s}
    if "table" in prefill:  # a measured prefill table: the loop's own prefill at its prompt lengths
        on_point("serving-loop prefill table")
        prompts = tuple(prefill["table"]["prompt_tokens"])
        prefill["table"] = {"prompt_tokens": list(prompts), "latency_s": prefill_medians_s(
            model, drafter, gamma, prompts, np.random.default_rng(seed), warmup, repeats).tolist()}
    isolated = dict(profile, prefill=prefill)
    on_point(f"serving-loop costs ({drafter.kind} drafter)")
    costs = measure_loop_costs(model, drafter, gamma, probe_requests, profile_from_dict(isolated), lengths, seed,
                               max_lengths=max_lengths, clock=clock)
    out = costs.fold(isolated)
    meta = out["metadata"]
    meta["forward_only"]["verifier_prefill"] = profile["prefill"]
    # Each validated dynamic policy's own steps in the loop, priced by the shared model (no decision): their
    # excess replaces the isolated decision timing in that policy's entry (the isolated fit stays as the default).
    on_point("serving-loop steps of " + ", ".join(policies))
    shared = profile_from_dict({**out, "scheduler": {"fixed_s": 0.0, "per_candidate_s": 0.0}})
    longest = max_lengths or (int(np.ceil(4 * lengths.prompt_median_tokens)),
                              int(np.ceil(4 * lengths.output_median_tokens)))
    excess = measure_policy_steps(model, drafter, gamma, probe_requests, shared,
                                  tuple(p for p in policies if make_policy(p).name != "mtp"), lengths, longest, seed,
                                  clock=clock)
    meta["isolated_decisions"] = by_policy
    meta["policy_steps"] = {name: {k: list(v) if isinstance(v, tuple) else v for k, v in vars(fit).items()}
                            for name, fit in excess.items()}
    out["scheduler"] = {**default, "inline": True, "policies": {**by_policy, **{n: f.entry()
                                                                               for n, f in excess.items()}}}
    meta["scheduler_source"] = SCHEDULER_SOURCE
    priced = profile_from_dict(out)
    prices_chunks = priced.chunk_attention is not None or priced.attention is not None
    if token_budget is not None and prices_chunks and max(probe_requests) >= 2:  # one user never mixes
        on_point("serving-loop steps with prefill chunks beside decoding requests")
        mixed = measure_mixed_steps(model, drafter, gamma, probe_requests, priced, token_budget, lengths, longest,
                                    seed, clock=clock)
        out["prefill"] = {**out["prefill"], "mixed_step": mixed.entry()}
        meta["mixed_steps"] = mixed.metadata()
    meta["timing"] += "; serving-loop costs folded in (metadata.loop_costs)"
    meta["prefill_definition"] = ("serving-loop prefill (calibration.serving_batch): verifier forward over the "
                                  "prompt, the drafter's context and the first token")
    meta["loop_probe_lengths"] = vars(lengths)
    return out


SCHEDULER_SOURCE = (
    "measured on this host. Policies the loop probe ran (scheduler.policies.<name> of each validated dynamic "
    "policy): the mean excess of its own steps in the serving loop over the shared step model (fixed + per "
    f"candidate fit; metadata.policy_steps), from probe runs separate from the validated runs (random prompts, "
    f"seed + {PROBE_SEED_OFFSET}); the isolated decision timings in metadata.isolated_decisions. Default and "
    "other policies: a decision's marginal cost between a drafter pass and a verifier forward, minus mtp's "
    "(already in the loop costs); mtp: 0. inline: the serving loop decides on the critical path")
