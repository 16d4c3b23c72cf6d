"""What a policy's decision costs on the serving loop's step, timed between a drafter pass and a verifier forward.

:func:`measure_scheduler` gives the profile's ``scheduler`` fields (``fixed_s + per_candidate_s * R * g``) for a
policy; :func:`calibration.profiling.loop_costs.with_loop_costs` calls it for mtp (the loop probe's own decision)
and for each validated policy, before the policy's own steps in the loop replace the figure
(:mod:`calibration.profiling.policy_steps`); :func:`isolated_decisions` does that for a profile's policies.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from calibration.models.drafters import Drafter
from calibration.models.model import Verifier
from calibration.profiling.calls import draft_call, verify_call
from policies import make_policy
from policies.base import CostCurve, Policy
from policies.driver import CostSource, PolicyMemory
from policies.greedy import Greedy
from simulator.costs import profile_from_dict
from traces.synthetic import LengthSpec


def measure_scheduler(cost: CostSource, num_requests: tuple[int, ...], draft_tokens: tuple[int, ...],
                      rng: np.random.Generator, policy: Policy | None = None,
                      between: Callable[[], object] | None = None,
                      after: Callable[[int, int], Callable[[], object]] | None = None,
                      repeats: int = 50) -> tuple[float, float]:
    """(fixed_s, per_candidate_s): median time of one decision of ``policy`` (default greedy) over (R, draft
    tokens), fitted by least squares over the candidates R x g.

    A decision is what the serving loop spends on the policy per step: the view of its state
    (:class:`policies.driver.PolicyMemory`: stale pools, EMA rows by request), ``decide`` and the state
    update, driven step after step as in the loop. (The loop's ``sched_s`` column times ``decide`` alone;
    the state handling lands in its ``host_s``.) ``between`` runs before every decision: in the loop the
    drafter's pass comes right before it and leaves the CPU's caches holding the model, which makes a
    decision several times slower than the same call repeated alone. With ``after`` (``after(R, g)`` returns
    the step's verifier forward), a decision's cost is its *marginal* cost on the step: the median of
    between -> decision -> forward minus the median of between -> forward, run alternately; that includes
    how much slower the forward runs after the decision has taken the caches.
    """
    policy = Greedy() if policy is None else policy
    xs, ys = [], []
    for r in num_requests:
        curve = cost if isinstance(cost, CostCurve) else cost(r)
        for g in sorted({policy.draft_tokens(d) for d in draft_tokens} - {0}):
            if r * (1 + g) > curve.batch_tokens[-1]:
                continue  # the policy cannot price a batch the table does not cover
            forward = after(r, g) if after is not None else None
            memory, ids, with_s, without_s = PolicyMemory(), tuple(range(r)), [], []
            for i in range(2 * repeats if forward is not None else repeats):
                confidence = rng.uniform(0.05, 1.0, size=(r, g))
                if between is not None:
                    between()
                decides = forward is None or i % 2 == 0
                start = time.perf_counter()
                if decides:
                    decision = policy.decide(memory.view(ids, confidence, curve))
                    memory = memory.after(policy, ids, decision)
                if forward is not None:
                    forward()
                (with_s if decides else without_s).append(time.perf_counter() - start)
            xs.append(r * g)
            ys.append(statistics.median(with_s) - (statistics.median(without_s) if without_s else 0.0))
    if len(set(xs)) < 2:
        raise ValueError(f"measure_scheduler({policy.name}) needs >= 2 (R, g) points inside the cost table")
    slope, intercept = np.polyfit(np.array(xs, dtype=float), np.array(ys), 1)
    return max(float(intercept), 0.0), max(float(slope), 0.0)


def isolated_decisions(profile: dict[str, Any], model: Verifier, drafter: Drafter, gamma: int, lengths: LengthSpec,
                       seed: int, policies: tuple[str, ...], on_point: Callable[[str], None]) -> dict[str, dict]:
    """Each policy's decision timed between a drafter pass and a forward, less mtp's (the loop probe's own, already
    in its host residual): ``{name: {fixed_s, per_candidate_s}}`` for mtp (0), greedy and ``policies``."""
    gammas = sorted({g for g in profile["draft"][drafter.kind]["draft_tokens"] if g > 1} | {gamma})
    reqs = tuple(profile["draft"][drafter.kind]["num_requests"])
    context = lengths.prompt_median_tokens + lengths.output_median_tokens // 2
    device = next(drafter.parameters()).device
    gen = torch.Generator(device).manual_seed(seed)
    drafter_pass = draft_call(drafter, context, device, gen, 1, gamma)()

    def forward(r: int, g: int) -> Callable[[], object]:
        run = verify_call(model, model, device, gen, r * (1 + g), [1 + g] * r, context)()
        return lambda: _no_grad(run)

    cost = profile_from_dict(profile).cost_curve
    rng = np.random.default_rng(seed)
    # The loop probe below runs mtp: its decisions' cost is already in the host residual it measures.
    on_point("scheduler (mtp decision, the probe's own)")
    probe_fixed_s, probe_per_candidate_s = measure_scheduler(cost, reqs, tuple(gammas), rng, make_policy("mtp1"),
                                                             drafter_pass, forward, repeats=30)

    def net(fit: tuple[float, float]) -> dict[str, float]:
        return {"fixed_s": max(fit[0] - probe_fixed_s, 0.0), "per_candidate_s": max(fit[1] - probe_per_candidate_s,
                                                                                      0.0)}
    by_policy = {"mtp": {"fixed_s": 0.0, "per_candidate_s": 0.0}}
    for name in ("greedy", *policies):  # greedy's fit is also the default for policies without an entry
        policy = make_policy(name)
        if policy.draft_tokens(gamma) > 0 and policy.name not in by_policy:
            on_point(f"scheduler ({name} decision)")
            by_policy[policy.name] = net(measure_scheduler(cost, reqs, tuple(gammas), rng, policy, drafter_pass,
                                                           forward, repeats=30))
    return by_policy


@torch.inference_mode()
def _no_grad(run: Callable[[], object]) -> object:
    return run()
