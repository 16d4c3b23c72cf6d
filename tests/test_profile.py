"""Hardware profiles: loading, interpolation without extrapolation, errors that name file and field."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from simulator.costs import ProfileError, builtin_profiles, load_profile, profile_from_dict


@pytest.fixture(scope="module")
def raw(default_profile):
    return copy.deepcopy(default_profile.raw)


def test_builtin_default_is_analytic_and_labelled(default_profile):
    assert "h200_qwen3-8b_analytic" in builtin_profiles()
    assert default_profile.source == "analytic"
    assert "(analytic)" in default_profile.label
    assert default_profile.max_batch_tokens >= 256 * 8  # 256 requests x (1 + 7 drafts)


def test_interpolates_inside_and_refuses_outside(default_profile):
    table = default_profile.verify_sps
    x0, x1 = table.x[10], table.x[11]
    mid = (x0 + x1) / 2
    assert float(table(mid)) == pytest.approx((table.y[10] + table.y[11]) / 2)
    with pytest.raises(ValueError, match="outside the profiled range"):
        table(table.x[-1] + 1)
    with pytest.raises(ValueError, match="outside the profiled range"):
        default_profile.draft_s("dspark", 10**6, 5)


def test_step_cost_adds_the_per_request_term(default_profile):
    curve_r1 = default_profile.cost_curve(1)
    curve_r100 = default_profile.cost_curve(100)
    assert np.all(curve_r100.steps_per_s < curve_r1.steps_per_s)
    assert default_profile.verify_s(100, 200) == pytest.approx(1.0 / float(curve_r100.sps(200)))


def test_inline_scheduler_charges_every_policy_its_own_decision_time(raw):
    """An inline scheduler puts even asynchronous policies' decisions on the critical path, each at the cost the
    profile measured for that policy (greedy's fit for the others)."""
    from policies import make_policy
    from simulator import ClusterSpec, DrafterSpec, SimulationSpec, simulate
    from traces.synthetic import TrafficSpec

    def sched_s(profile_raw, policy):
        spec = SimulationSpec(policy=make_policy(policy), profile=profile_from_dict(profile_raw),
                              drafter=DrafterSpec("dspark", 7), cluster=ClusterSpec(),
                              traffic=TrafficSpec(arrival="closed", num_users=4), duration_s=0.5, warmup_s=0.0, seed=0)
        steps = simulate(spec).steps
        return steps["sched_s"].to_numpy(), steps["num_requests"].to_numpy()

    data = copy.deepcopy(raw)
    data["scheduler"] = {"fixed_s": 1e-4, "per_candidate_s": 1e-6}
    assert (sched_s(data, "dspark")[0] == 0).all()  # asynchronous: off the critical path
    greedy, r = sched_s(data, "greedy")
    np.testing.assert_allclose(greedy, 1e-4 + 1e-6 * 7 * r)
    data["scheduler"].update(inline=True, policies={"dspark": {"fixed_s": 3e-4, "per_candidate_s": 0.0}})
    dspark, _ = sched_s(data, "dspark")
    np.testing.assert_allclose(dspark, 3e-4)
    mtp, r = sched_s(data, "mtp1")
    np.testing.assert_allclose(mtp, 1e-4 + 1e-6 * r)


def test_a_policys_measured_decision_table_is_interpolated_and_checked_at_start(raw):
    """``scheduler.policies.<name>`` as a table over candidates (R x g): read linearly between its points, and a
    run whose decisions could fall outside it stops before the first simulated second, naming the field."""
    from policies import make_policy
    from simulator import ClusterSpec, DrafterSpec, EngineLimits, SimulationSpec, simulate
    from traces.synthetic import TrafficSpec

    data = copy.deepcopy(raw)
    data["scheduler"] = {"fixed_s": 0.0, "per_candidate_s": 0.0, "inline": True,
                         "policies": {"greedy": {"num_candidates": [7, 14, 28], "s": [2e-4, 1e-4, 3e-4]}}}
    profile = profile_from_dict(data, "<table>")
    assert [profile.scheduler_s(c, "greedy") for c in (7, 14, 21, 28)] == pytest.approx([2e-4, 1e-4, 2e-4, 3e-4])
    with pytest.raises(ValueError, match=r"scheduler\.policies\.greedy\.s over num_candidates: 35\.\.35 is outside "
                                         r"the profiled range 7\.\.28 \(profile <table>\)"):
        profile.scheduler_s(35, "greedy")

    def spec(users: int, gamma: int = 7) -> SimulationSpec:
        return SimulationSpec(policy=make_policy("greedy"), profile=profile, drafter=DrafterSpec("dspark", gamma),
                              cluster=ClusterSpec(limits=EngineLimits(users, 100_000)),
                              traffic=TrafficSpec(arrival="closed", num_users=users), duration_s=0.3, warmup_s=0.0,
                              seed=0)
    steps = simulate(spec(4)).steps
    expected = np.interp(steps["num_requests"] * 7, [7, 14, 28], [2e-4, 1e-4, 3e-4])
    np.testing.assert_allclose(steps["sched_s"], expected)
    for users, gamma, needed in ((8, 7, "7..56"), (4, 3, "3..12")):
        with pytest.raises(ValueError, match=rf"scheduler\.policies\.greedy\.num_candidates covers 7\.\.28, but "
                                             rf"this run decides over {needed} "):
            simulate(spec(users, gamma))


def test_padded_query_slots_are_charged_per_slot(raw):
    """verify_s = 1/SPS(B) + per_request(R) + padded_slot_s * (R * max(1 + l_r) - B): static policies pad
    nothing; a confidence threshold mixes lengths and pays whole slots."""
    from policies import make_policy
    from simulator import ClusterSpec, DrafterSpec, SimulationSpec, simulate
    from traces.synthetic import TrafficSpec

    data = copy.deepcopy(raw)
    data["verify"]["padded_slot_s"] = 1e-3
    profile = profile_from_dict(data)
    for policy in ("mtp3", "threshold"):
        spec = SimulationSpec(policy=make_policy(policy), profile=profile, drafter=DrafterSpec("dspark", 7),
                              cluster=ClusterSpec(), traffic=TrafficSpec(arrival="closed", num_users=8),
                              duration_s=0.2, warmup_s=0.0, seed=0)
        steps = simulate(spec).steps
        base = np.array([profile.verify_s(r, b) for r, b in zip(steps["num_requests"], steps["batch_tokens"],
                                                                strict=True)])
        slots = (steps["verify_s"].to_numpy() - base) / 1e-3
        np.testing.assert_allclose(slots, np.round(slots), atol=1e-6)
        most = steps["num_requests"].to_numpy() * 8 - steps["batch_tokens"].to_numpy()
        assert (slots > -1e-6).all() and (slots <= most + 1e-6).all()
        assert (slots.max() > 0) == (policy == "threshold")


def _write(tmp_path, data):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["verify"]["steps_per_s"].__setitem__(3, 0.0), r"verify\.steps_per_s\[3\]' must be > 0"),
        (lambda d: d["verify"]["steps_per_s"].__setitem__(3, -2.0), r"verify\.steps_per_s\[3\]' must be > 0"),
        (lambda d: d["verify"]["batch_tokens"].__setitem__(2, d["verify"]["batch_tokens"][1]),
         r"verify\.batch_tokens' must be strictly increasing \(duplicate"),
        (lambda d: d["verify"]["batch_tokens"].__setitem__(2, 0.5),
         r"verify\.batch_tokens' must be strictly increasing \(unsorted"),
        (lambda d: d["verify"].pop("steps_per_s"), r"missing field 'verify\.steps_per_s'"),
        (lambda d: d["metadata"].pop("source"), r"missing field 'metadata\.source'"),
        (lambda d: d["metadata"].__setitem__("source", "guessed"), r"metadata\.source' must be one of"),
        (lambda d: d.__setitem__("version", 99), r"field 'version' must be 1"),
        (lambda d: d["draft"]["dspark"]["latency_s"].pop(), r"draft\.dspark\.latency_s' must have one row"),
        (lambda d: d["prefill"].__setitem__("tokens_per_s", "fast"), r"prefill\.tokens_per_s' must be a number"),
        (lambda d: d["scheduler"].__setitem__("inline", "yes"), r"scheduler\.inline' must be true or false"),
        (lambda d: d["scheduler"].__setitem__("policies", {"dspark": {"fixed_s": 1e-4}}),
         r"missing field 'scheduler\.policies\.dspark\.per_candidate_s'"),
        (lambda d: d["scheduler"].__setitem__("policies", [1]), r"scheduler\.policies' must map policy names"),
        (lambda d: d["scheduler"].__setitem__("policies", {"greedy": {"num_candidates": [7, 7], "s": [0, 0]}}),
         r"scheduler\.policies\.greedy\.num_candidates' must be strictly increasing \(duplicate"),
        (lambda d: d["scheduler"].__setitem__("policies", {"greedy": {"num_candidates": [7, 14], "s": [0]}}),
         r"scheduler\.policies\.greedy\.s' must be a list of 2 numbers"),
        (lambda d: d["scheduler"].__setitem__("policies", {"greedy": {"num_candidates": [7], "s": [-1e-4]}}),
         r"scheduler\.policies\.greedy\.s\[0\]' must be >= 0"),
        (lambda d: d["scheduler"].__setitem__("policies", {"greedy": {"num_candidates": [7], "s": [0],
                                                                       "fixed_s": 0}}),
         r"unknown field 'scheduler\.policies\.greedy\.fixed_s'"),
    ],
)
def test_malformed_profiles_name_file_and_field(tmp_path, raw, mutate, message):
    data = copy.deepcopy(raw)
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(ProfileError, match=message) as err:
        load_profile(path)
    assert str(path) in str(err.value)


def test_unknown_profile_lists_builtins():
    with pytest.raises(FileNotFoundError, match="built-in profiles: .*h200_qwen3-8b_analytic"):
        load_profile("no_such_profile")


def test_round_trip(tmp_path, default_profile):
    path = tmp_path / "copy.json"
    default_profile.save(path)
    again = load_profile(path)
    np.testing.assert_array_equal(again.verify_sps.y, default_profile.verify_sps.y)
    assert profile_from_dict(json.loads(path.read_text())).label == default_profile.label
