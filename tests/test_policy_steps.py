"""The per-policy step probe and the shared loop-cost probes run again, longer, when their batch was seldom full
after the first prefills; every loop probe runs in proportion to R above 2 users; a policy's excess is charged per
probed R."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from calibration.profiling import loop_costs, policy_steps, residual_fit
from calibration.profiling.step_prices import priced_cycles
from traces.synthetic import LengthSpec

LENGTHS = LengthSpec(prompt_median_tokens=2048, prompt_sigma=0.0, output_median_tokens=64, output_sigma=0.0)
FULL_STEP = {"num_requests": 4, "batch_tokens": 12, "max_verified_tokens": 2, "context_tokens": 8000,
             "max_context_tokens": 2100, "cycle_s": 0.02}
DRAFTER = SimpleNamespace(kind="dspark")  # the loop run is stood in for: only the drafter's kind is read


VERIFIER = SimpleNamespace(s=SimpleNamespace(vocab_size=256))  # only its vocabulary is read (the probe's prompts)


def _probe(full_after: int, calls: list[float], count: int = policy_steps.MIN_FULL_BATCH_STEPS):
    """A stand-in for the loop run: no full-batch step in the first ``full_after`` runs, then ``count`` after a
    first step before the warm-up (whose end starts the first counted step's cycle)."""
    def serve(spec, models):
        calls.append(spec.duration_s - spec.warmup_s)  # how long it ran after the ramp and warm-up
        full = count if len(calls) > full_after else 0
        steps = pd.DataFrame([{**FULL_STEP, "num_requests": 3}] + [FULL_STEP] * full)
        start_s = np.r_[0.0, spec.warmup_s + 0.1 * np.arange(full)]
        return SimpleNamespace(steps=steps.assign(start_at=start_s, end_at=start_s + 0.05, wait_s=0.0))
    return serve


@pytest.mark.parametrize(("full_after", "count", "stretches"),
                         [(0, 20, [1]), (1, 20, [1, 2]), (2, 20, [1, 2, 4]), (0, 19, [1, 2, 4]), (0, 1, [1, 2, 4])])
def test_a_probe_with_few_full_batch_steps_runs_again_longer(monkeypatch, default_profile, full_after, count,
                                                             stretches):
    """Below MIN_FULL_BATCH_STEPS (20) the probe runs again for longer; after the longest run, any step will do."""
    calls: list[float] = []
    monkeypatch.setattr(policy_steps, "serve", _probe(full_after, calls, count))
    out = policy_steps.measure_policy_steps(VERIFIER, DRAFTER, 3, (4,), default_profile, ("greedy",), LENGTHS,
                                            (4096, 128), duration_s=0.8, warmup_s=0.2)
    assert calls == pytest.approx([1.6 * k - 0.2 for k in stretches])  # 4 users: twice the 0.8 s of 1-2 users
    assert out["greedy"].num_steps == count


def test_a_probe_never_full_is_an_error(monkeypatch, default_profile):
    monkeypatch.setattr(policy_steps, "serve", _probe(3, []))
    with pytest.raises(ValueError, match=r"the greedy step probe ran no full-batch step at 4 users, even 6\.4 s after "
                                         r"the first prefills; lengthen it \(duration_s\)"):
        policy_steps.measure_policy_steps(VERIFIER, DRAFTER, 3, (4,), default_profile, ("greedy",), LENGTHS,
                                          (4096, 128), duration_s=0.8, warmup_s=0.2)


def _loop_run(full_for: type | None, calls: list[float]):
    """A stand-in for the loop-cost probe's serving run at 4 users: its batch is full only in the runs of
    ``full_for`` policies (none: never)."""
    def serve(spec, models):
        calls.append(spec.duration_s - spec.warmup_s)
        users = 4 if full_for is not None and isinstance(spec.policy, full_for) else 3
        start_s = 10.0 + 0.1 * np.arange(policy_steps.MIN_FULL_BATCH_STEPS + 1)  # the first: no cycle yet
        steps = pd.DataFrame({"start_at": start_s, "end_at": start_s + 0.05, "wait_s": 0.0, "num_requests": users})
        requests = pd.DataFrame({"first_token_at": [0.1], "prefill_start_at": [0.0], "prompt_tokens": [2048]})
        return SimpleNamespace(steps=steps, requests=requests)
    return serve


@pytest.mark.parametrize(("full_for", "missing"), [
    (None, "[(4, 'mtp1'), (4, 'mtp3'), (4, 'varlen-probe')]"),
    # the variable-length probe's steps do not stand in for mtp3's draft factor (they once left it NaN)
    (loop_costs.VariableLength, "[(4, 'mtp1'), (4, 'mtp3')]"),
])
def test_a_loop_cost_probe_never_full_runs_longer_then_names_what_is_missing(monkeypatch, default_profile, full_for,
                                                                             missing):
    calls: list[float] = []
    monkeypatch.setattr(policy_steps, "serve", _loop_run(full_for, calls))
    with pytest.raises(ValueError, match=re.escape(f"the loop probe ran no step with a full batch at (users, probe) "
                                                   f"{missing}, even 4 times as long after the first prefills")):
        loop_costs.measure_loop_costs(VERIFIER, DRAFTER, 3, (4,), default_profile, LENGTHS, duration_s=0.8,
                                      warmup_s=0.2)
    ran_full = 1 if full_for is not None else 0  # the variable-length probe stops at its first run when full
    assert len(calls) == 4 * 3 - 2 * ran_full  # four probes: mtp1, mtp3, variable length, none
    assert calls[:3] == pytest.approx([1.6 * k - 0.2 for k in (1, 2, 4)])


def test_probes_run_in_proportion_to_the_users_above_two():
    assert [policy_steps.probe_duration_s(0.8, r) for r in (1, 2, 4, 8, 16)] == pytest.approx([0.8, 0.8, 1.6, 3.2, 6.4])


def test_the_excess_is_charged_at_each_probed_r_not_along_a_line():
    """Mean excess 0.2, 0.1, 0.1, 0.3 ms at R = 1, 2, 4, 8 (U-shaped, as measured): the entry is that table over
    R x g; negative means become 0; one probed R gets the line (its mean)."""
    excess = {1: 2e-4, 2: 1e-4, 4: 1e-4, 8: 3e-4}
    steps = pd.DataFrame([{"users": r, "num_requests": r, "excess_s": e + d, "priced_s": 1e-3}
                          for r, e in excess.items() for d in (-5e-5, 5e-5)])
    fit = policy_steps.fit_excess(steps, 7)
    assert fit.entry() == {"num_candidates": [7.0, 14.0, 28.0, 56.0], "s": pytest.approx(list(excess.values()))}
    line_at_one = fit.fixed_s + fit.per_candidate_s * 7  # what the line fitted through every step charged at R = 1
    assert line_at_one < 0.8 * excess[1]
    below = policy_steps.fit_excess(steps.assign(excess_s=steps["excess_s"] - 1.5e-4), 7).entry()
    assert below["s"] == pytest.approx([5e-5, 0.0, 0.0, 1.5e-4])
    one = policy_steps.fit_excess(steps[steps["users"] == 2], 7).entry()
    assert one == {"fixed_s": pytest.approx(1e-4), "per_candidate_s": 0.0}


def test_the_excess_table_is_fitted_to_every_step_at_its_own_r_under_the_table_s_interpolation():
    """Steps at every R from 1 to 8 (a probe at 8 users runs smaller batches while requests are prefilled again)
    whose excess is the interpolation of 0.2, 0.1, 0.1, 0.3 ms at R = 1, 2, 4, 8: the fit gives back those four,
    though only a few steps ran at R = 8; each knot's price is the mean of the steps at it. Linear interpolation
    weights: R = 6 is half R = 4 and half R = 8; beyond the knots, the nearest. A probed R without a step at it is
    an error naming it."""
    knots, values = (1, 2, 4, 8), np.array([2e-4, 1e-4, 1e-4, 3e-4])
    assert residual_fit.hat_design(np.array([6, 3, 1, 8, 9]), knots) == pytest.approx(np.array(
        [[0, 0, 0.5, 0.5], [0, 0.5, 0.5, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 1]]))
    assert residual_fit.hat_design(np.array([3, 5]), (4,)) == pytest.approx(np.ones((2, 1)))
    r = np.repeat(np.arange(1, 9), [30, 30, 30, 30, 30, 30, 30, 3])
    truth = np.interp(r, knots, values)
    steps = pd.DataFrame({"users": 8, "num_requests": r, "excess_s": truth, "priced_s": 1e-3 * r})
    fit = policy_steps.fit_excess(steps, 7, knots)
    assert fit.entry() == {"num_candidates": [7.0, 14.0, 28.0, 56.0], "s": pytest.approx(list(values), rel=1e-9)}
    assert fit.mean_priced_s == pytest.approx([1e-3, 2e-3, 4e-3, 8e-3]) and fit.num_steps == len(steps)
    with pytest.raises(ValueError, match=r"no probe step ran at R = \[8\] of the probed \[1, 2, 4, 8\]"):
        policy_steps.fit_excess(steps[steps["num_requests"] < 8], 7, knots)


def test_a_policy_probe_counts_every_decode_step_after_the_warmup():
    steps = pd.DataFrame({"start_at": [0.0, 1.0, 1.1, 1.2, 1.3], "end_at": [0.05, 1.05, 1.15, 1.25, 1.35],
                          "wait_s": [0.0, 0.0, 0.05, 0.0, 0.0], "num_requests": [4, 3, 4, 0, 2]})
    kept = priced_cycles(steps, warmup_s=0.5)  # what the probe prices: every decode step, whatever its batch
    assert kept.index.tolist() == [1, 2, 4]  # after the warm-up, with a request or more
    assert kept["cycle_s"].tolist() == pytest.approx([1.0, 0.05, 0.1])  # less the sleep before the step
