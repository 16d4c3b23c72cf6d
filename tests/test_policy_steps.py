"""The per-policy step probe runs again, longer, when its batch was never full after the first prefills; every
loop probe runs in proportion to R above 2 users; a policy's excess is charged per probed R."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from calibration.profiling import policy_steps
from traces.synthetic import LengthSpec

LENGTHS = LengthSpec(prompt_median_tokens=2048, prompt_sigma=0.0, output_median_tokens=64, output_sigma=0.0)
FULL_STEP = {"num_requests": 4, "batch_tokens": 12, "max_verified_tokens": 2, "context_tokens": 8000,
             "max_context_tokens": 2100, "cycle_s": 0.02}
DRAFTER = SimpleNamespace(kind="dspark")  # the loop run is stood in for: only the drafter's kind is read


def _probe(full_after: int, calls: list[float]):
    """A stand-in for the loop run: no full-batch step in the first ``full_after`` runs, then one."""
    def run(verifier, drafter, profile, name, gamma, users, traffic, duration_s, warmup_s, seed, clock):
        calls.append(duration_s - warmup_s)  # how long it ran after the ramp and warm-up
        return pd.DataFrame([FULL_STEP] * (len(calls) > full_after), columns=list(FULL_STEP))
    return run


@pytest.mark.parametrize(("full_after", "stretches"), [(0, [1]), (1, [1, 2]), (2, [1, 2, 4])])
def test_a_probe_without_a_full_batch_runs_again_longer(monkeypatch, default_profile, full_after, stretches):
    calls: list[float] = []
    monkeypatch.setattr(policy_steps, "_probe_steps", _probe(full_after, calls))
    out = policy_steps.measure_policy_steps(None, DRAFTER, 3, (4,), default_profile, ("greedy",), LENGTHS, (4096, 128),
                                            duration_s=0.8, warmup_s=0.2)
    assert calls == pytest.approx([1.6 * k - 0.2 for k in stretches])  # 4 users: twice the 0.8 s of 1-2 users
    assert out["greedy"].num_steps == 1


def test_a_probe_never_full_is_an_error(monkeypatch, default_profile):
    monkeypatch.setattr(policy_steps, "_probe_steps", _probe(3, []))
    with pytest.raises(ValueError, match=r"the greedy step probe ran no full-batch step at 4 users, even 6\.4 s after "
                                         r"the first prefills; lengthen it \(duration_s\)"):
        policy_steps.measure_policy_steps(None, DRAFTER, 3, (4,), default_profile, ("greedy",), LENGTHS, (4096, 128),
                                          duration_s=0.8, warmup_s=0.2)


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
