"""Profiles fitted from benchmark results: readers, recovery of known costs, identifiability, intervals."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from calibration.fitting.cli import main as fit_main
from calibration.fitting.export import ExportOptions, profile_dict, profiles
from calibration.fitting.model import DrafterCost
from calibration.fitting.pipeline import SEQUENTIAL_DRAFTERS, FitConfig, fit_runs
from calibration.fitting.readers import read_results
from calibration.fitting.report import unidentified_words
from calibration.fitting.runs import ResultsError, observe, overshoot_tokens
from calibration.fitting.synthetic import SyntheticPoint, synthetic_run
from calibration.fitting.writers import write_csv, write_sglang, write_vllm
from calibration.models.presets import BYTE_SHAPE
from calibration.models.shapes import default_drafters
from calibration.validation.bench_export import write_benchmark
from calibration.validation.report import ARRIVAL_FIGURES, pooled_summary
from experiments.intervals import draw_intervals, with_intervals
from policies import make_policy
from simulator import ClusterSpec, DrafterSpec, EngineLimits, SimulationSpec, simulate
from simulator.costs import profile_from_dict
from traces.synthetic import TrafficSpec

# ---------------------------------------------------------------- a known profile and runs computed from it

DENSE_FIXED_S, DENSE_PER_TOKEN_S = 4e-3, 10e-6
PER_REQUEST_S, ATTENTION_S = 30e-6, 20e-9
DRAFT_FIXED_S, DRAFT_PER_POSITION_S = 0.2e-3, 0.4e-3
CONTEXT_TOP = 100_000


def known_profile(cliff: tuple[int, float] | None = None, draft_token_s: float = 0.0):
    """Linear dense part, per-request and per-context-token costs, a fixed + per-position drafter (and, when given,
    the target's cost per verified draft token)."""
    top = 1024
    data = {
        "format": "specsched-hardware-profile", "version": 2,
        "metadata": {"source": "analytic", "device": "test", "model": "known", "created": "2025-01-01",
                     "tool": "test"},
        "gpus_per_replica": 1,
        "verify": {"batch_tokens": [1, top], "step_s": [DENSE_FIXED_S + DENSE_PER_TOKEN_S,
                                                        DENSE_FIXED_S + DENSE_PER_TOKEN_S * top]},
        "per_request": {"num_requests": [1, 512], "step_s": [PER_REQUEST_S, PER_REQUEST_S * 512]},
        "attention": {"context_tokens": [0, CONTEXT_TOP], "query_tokens": [1, 16],
                      "per_request_s": [[0.0, 0.0], [ATTENTION_S * CONTEXT_TOP] * 2]},
        "draft": {"mtp": {"num_requests": [1, 512], "draft_tokens": list(range(1, 9)),
                          "latency_s": [[DRAFT_FIXED_S + DRAFT_PER_POSITION_S * g for g in range(1, 9)]] * 2}},
        "prefill": {"fixed_s": 0.01, "tokens_per_s": 20000.0},
        "scheduler": {"fixed_s": 0.0, "per_candidate_s": 0.0},
    }
    if cliff is not None:
        data["cuda_graphs"] = {"max_captured_tokens": cliff[0], "eager_overhead_s": cliff[1]}
    if draft_token_s:
        data["verify"]["draft_token_s"] = draft_token_s
    return profile_from_dict(data, "<known>")


def known_runs(configs=((0, 1.0), (1, 1.8), (3, 2.6)), users=(1, 2, 4, 8, 16, 32), prompts=(500, 2000),
               profile=None):
    profile = profile or known_profile()
    points = [SyntheticPoint(u, k, tau, p, 200) for k, tau in configs for u in users for p in prompts]
    return [synthetic_run(profile, "mtp", point, "synthetic", i + 1) for i, point in enumerate(points)]


# ---------------------------------------------------------------- readers


def _vllm(**extra):
    record = {"completed": 10, "total_input_tokens": 5000, "total_output_tokens": 2000, "output_throughput": 800.0,
              "mean_tpot_ms": 10.0, "request_throughput": 4.0, "max_concurrency": 8, "request_rate": "inf",
              "median_tpot_ms": 9.5, "p99_tpot_ms": 14.0, "mean_ttft_ms": 50.0, "model_id": "m"}
    record.update(extra)
    return record


def test_vllm_reader_no_speculation_and_metadata_k(tmp_path: Path):
    (tmp_path / "a.json").write_text(json.dumps(_vllm()))
    (tmp_path / "b.json").write_text(json.dumps(_vllm(spec_decode_acceptance_length=2.5,
                                                      num_speculative_tokens="3", spec_method="mtp")))
    plain, spec = read_results([tmp_path / "a.json", tmp_path / "b.json"])
    assert (plain.num_speculative_tokens, plain.acceptance_length, plain.spec_method) == (0, None, "none")
    assert plain.mean_prompt_tokens == 500 and plain.mean_output_tokens == 200 and plain.concurrency == 8
    assert (spec.num_speculative_tokens, spec.acceptance_length, spec.spec_method) == (3, 2.5, "mtp")
    # step = TPOT x tau; R by Little's law over decode: TPOT x (output tok/s - requests/s)
    obs = observe(spec)
    # TPOT x tau, less the last step's overshoot over the 199 tokens after the first
    assert obs.step_s == pytest.approx(0.025 * 199 / (199 + overshoot_tokens(2.5, 3)))
    assert obs.num_requests == pytest.approx(0.010 * 796)
    assert obs.batch_tokens == pytest.approx(4 * obs.num_requests)


def test_vllm_reader_k_from_draft_counts_and_appended_results(tmp_path: Path):
    lines = [_vllm(), _vllm(spec_decode_acceptance_length=1.8, spec_decode_num_drafts=100,
                             spec_decode_draft_tokens=200)]
    (tmp_path / "r.json").write_text("\n".join(json.dumps(x) for x in lines) + "\n")  # --append-result
    runs = read_results([tmp_path / "r.json"])
    assert [r.num_speculative_tokens for r in runs] == [0, 2] and runs[1].row == 2


def test_sglang_reader(tmp_path: Path):
    base = {k: v for k, v in _vllm().items() if k != "model_id"}
    lines = [dict(base, accept_length=None), dict(base, accept_length=2.2, num_speculative_tokens=3)]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    plain, spec = read_results([tmp_path / "s.jsonl"])
    assert plain.num_speculative_tokens == 0 and (spec.num_speculative_tokens, spec.acceptance_length) == (3, 2.2)


def test_json_flavour_from_content_not_extension(tmp_path: Path):
    sglang, vllm = dict(_vllm(), accept_length=2.2, num_speculative_tokens=3), _vllm(
        spec_decode_acceptance_length=2.5, num_speculative_tokens=3)
    (tmp_path / "sglang.json").write_text(json.dumps(sglang))  # an SGLang result saved as *.json
    (tmp_path / "vllm.jsonl").write_text(json.dumps(vllm) + "\n")  # vLLM --append-result lines in *.jsonl
    from_sglang, from_vllm = read_results([tmp_path / "sglang.json", tmp_path / "vllm.jsonl"])
    assert (from_sglang.acceptance_length, from_vllm.acceptance_length) == (2.2, 2.5)
    # read as the other tool's, the speculation field is an error, never ignored (it would make a no-spec run)
    with pytest.raises(ResultsError, match=r"sglang\.json row 1: field 'accept_length' is SGLang's, but the file "
                                           r"is read as vllm"):
        read_results([tmp_path / "sglang.json"], "vllm")
    with pytest.raises(ResultsError, match=r"field 'spec_decode_acceptance_length' is vLLM's"):
        read_results([tmp_path / "vllm.jsonl"], "sglang")
    (tmp_path / "both.json").write_text(json.dumps(sglang) + "\n" + json.dumps(vllm) + "\n")
    with pytest.raises(ResultsError, match=r"both\.json: holds both vLLM"):
        read_results([tmp_path / "both.json"])


def test_csv_reader(tmp_path: Path):
    (tmp_path / "r.csv").write_text(
        "concurrency,spec_method,num_speculative_tokens,mean_input_tokens,mean_output_tokens,output_throughput,"
        "mean_tpot_ms,acceptance_length,mean_decode_requests\n"
        "4,none,0,100,50,300,12.5,,3.9\n"
        "4,mtp,1,100,50,500,7.0,1.8,3.8\n")
    plain, spec = read_results([tmp_path / "r.csv"])
    assert plain.mean_decode_requests == 3.9 and observe(plain).num_requests == 3.9
    assert observe(spec).step_s == pytest.approx(0.0126 * 49 / (49 + overshoot_tokens(1.8, 1)))
    assert observe(spec).batch_tokens == pytest.approx(7.6)
    with pytest.raises(ResultsError, match=r"r\.csv row 2: field 'mean_itl_ms' missing; needed by --step itl"):
        observe(spec, step="itl")


@pytest.mark.parametrize("name, text, message", [
    # a required field missing names file, row and field
    ("a.json", json.dumps({k: v for k, v in _vllm().items() if k != "mean_tpot_ms"}),
     r"a\.json row 1: missing field 'mean_tpot_ms'"),
    # a number that is not one
    ("a.json", json.dumps(_vllm(output_throughput="fast")), r"row 1: field 'output_throughput' must be a number"),
    # speculative vLLM run whose k cannot be told
    ("a.json", json.dumps(_vllm(spec_decode_acceptance_length=2.0)), r"missing field 'num_speculative_tokens'"),
    # SGLang does not record k
    ("s.jsonl", json.dumps(dict(_vllm(), accept_length=2.0)) + "\n", r"s\.jsonl row 1: missing field "
                                                                      r"'num_speculative_tokens'"),
    # acceptance length below 1 (accepted tokens without the bonus?)
    ("s.jsonl", json.dumps(dict(_vllm(), accept_length=0.7, num_speculative_tokens=2)) + "\n",
     r"field 'accept_length' is 0\.7"),
    # CSV: an unknown column, a missing column, a speculative row without acceptance, a method/k mismatch
    ("r.csv", "concurrency,spec_method,num_speculative_tokens,mean_input_tokens,mean_output_tokens,"
              "output_throughput,mean_tpot_ms,tpot\n", r"unknown column 'tpot'"),
    ("r.csv", "concurrency,spec_method,num_speculative_tokens,mean_input_tokens,output_throughput,mean_tpot_ms\n",
     r"missing column 'mean_output_tokens'"),
    ("r.csv", "concurrency,spec_method,num_speculative_tokens,mean_input_tokens,mean_output_tokens,"
              "output_throughput,mean_tpot_ms\n4,mtp,2,100,50,300,12.5\n",
     r"r\.csv row 1: missing field 'acceptance_length'"),
    ("r.csv", "concurrency,spec_method,num_speculative_tokens,mean_input_tokens,mean_output_tokens,"
              "output_throughput,mean_tpot_ms\n4,mtp,0,100,50,300,12.5\n", r"row 1: spec_method='mtp' with "
                                                                          r"num_speculative_tokens=0"),
    ("r.txt", "x", r"cannot tell the format"),
])
def test_reader_errors(tmp_path: Path, name: str, text: str, message: str):
    (tmp_path / name).write_text(text)
    with pytest.raises(ResultsError, match=message):
        read_results([tmp_path / name])


def test_writers_round_trip(tmp_path: Path):
    runs = known_runs(configs=((0, 1.0), (3, 2.6)), users=(2,), prompts=(500,))
    back_vllm = [read_results([write_vllm(r, tmp_path / f"{i}.json")])[0] for i, r in enumerate(runs)]
    back_sglang = read_results([write_sglang(runs, tmp_path / "s.jsonl")])
    back_csv = read_results([write_csv(runs, tmp_path / "r.csv")])
    for back in (back_vllm, back_sglang, back_csv):
        for a, b in zip(runs, back, strict=True):
            assert (b.num_speculative_tokens, b.acceptance_length) == (a.num_speculative_tokens, a.acceptance_length)
            assert observe(b).step_s == pytest.approx(observe(a).step_s, rel=1e-9)
            assert observe(b).num_requests == pytest.approx(a.concurrency, rel=1e-6)


# ---------------------------------------------------------------- the fit


def test_fit_recovers_known_costs():
    report = fit_runs(known_runs())
    assert np.max(np.abs(report.fit.relative_errors)) < 1e-6  # noise-free runs: the best fit explains them exactly
    assert np.max(np.abs(report.central_errors)) < 0.01  # the profile's parameters: within the 1% noise
    ranges = {r.name: r for r in report.identification.ranges}
    truths = {"per_request_s": PER_REQUEST_S, "attention_s_per_context_token": ATTENTION_S,
              "draft_fixed_s": DRAFT_FIXED_S, "draft_per_position_s": DRAFT_PER_POSITION_S, "draft_per_token_s": 0.0,
              **{f"dense_s[B={k:g}]": DENSE_FIXED_S + DENSE_PER_TOKEN_S * k for k in report.model.knots_tokens}}
    for name, truth in truths.items():
        assert ranges[name].low - 1e-12 <= truth <= ranges[name].high + 1e-12, name
    # off the null direction, the best fit is the truth
    for name in ("attention_s_per_context_token", "draft_fixed_s", "draft_per_position_s"):
        assert ranges[name].best == pytest.approx(truths[name], rel=1e-3), name
        assert ranges[name].status != "not identified" and not ranges[name].on_null_direction
    # the one split static-k runs cannot make: drafter per drafted token vs target per verified token
    assert ranges["draft_per_token_s"].status == "not identified"
    assert all("draft_per_token_s" in d for d in report.identification.null_directions)
    # per request: on that direction too, but bounded by costs being >= 0 to about the target's per-token cost
    # (10 us), plus the noise - against 0 .. 40 us without speculative runs (next test)
    assert ranges["per_request_s"].high - ranges["per_request_s"].low < 2.5 * DENSE_PER_TOKEN_S


def test_the_targets_cost_per_verified_draft_token_is_the_other_end_of_the_drafter_split():
    """The real loop's target spends host work per verified draft token (rejection sampling) that a step without
    speculation never pays. In static-k runs it is R * k, exactly the drafter's per-drafted-token column: the fit
    says so, its range holds the truth, and the alternatives bracket a step that verifies fewer tokens than it
    drafts (as greedy's and dspark's do) where the two ends price it differently."""
    truth_s = 20e-6
    profile = known_profile(draft_token_s=truth_s)
    report = fit_runs(known_runs(profile=profile, prompts=(1000,)))
    verify, drafter = (report.identification.by_name(n) for n in ("verify_draft_token_s", "draft_per_token_s"))
    assert verify.status == drafter.status == "not identified"
    assert verify.low <= truth_s <= verify.high and drafter.low == pytest.approx(0.0, abs=1e-9)
    r, k, verified = 16.0, 7.0, 16.0 * 2  # 16 requests draft 7 tokens each, verify 2 each
    shape = [np.array([v]) for v in (r, r + verified, 1100.0, k)]
    real_s = (profile.verify_s(16, 48) + profile.attention_s(np.full(16, 1100), 3)
              + profile.draft_s("mtp", 16, 7))
    priced = [float(report.model.predict_s(a.theta, *shape, draft_cap=a.draft_cap)[0])
              for a in [*report.alternatives.values()]]
    assert min(priced) <= real_s <= max(priced) and max(priced) > 1.02 * min(priced)


def test_no_speculation_cannot_split_per_token_from_per_request():
    runs = known_runs(configs=((0, 1.0),))
    report = fit_runs(runs, FitConfig(drafter_cost=DrafterCost(DRAFT_FIXED_S, DRAFT_PER_POSITION_S, 0.0)))
    per_request = report.identification.by_name("per_request_s")
    assert per_request.status == "not identified"
    # the two extreme splits: everything per token (0 per request) .. everything per request (a flat dense curve)
    assert per_request.low == pytest.approx(0.0, abs=1e-9)
    assert per_request.high >= PER_REQUEST_S + 0.9 * DENSE_PER_TOKEN_S
    assert set(report.identification.alternatives) == {"per_request_s.low", "per_request_s.high"}
    assert any({"per_request_s"} < set(d) for d in report.identification.null_directions)
    # every alternative explains the runs as well, within two standard deviations of the assumed 1% noise
    for theta in report.identification.alternatives.values():
        assert report.fit.problem.chi2(theta) <= report.fit.chi2 + report.identification.delta_chi2 + 1e-6
        assert np.max(np.abs(report.fit.problem.relative_errors(theta))) < 0.02


def test_spec_runs_at_two_k_identify_the_split():
    report = fit_runs(known_runs(configs=((0, 1.0), (1, 1.8), (3, 2.6)), prompts=(1000,)))
    per_request = report.identification.by_name("per_request_s")
    assert per_request.status == "identified"
    # one context (1000 + 200 / 2 tokens): its attention is folded into the per-request cost, and said so
    assert "attention over context not fitted" in " ".join(report.notes)
    truth = PER_REQUEST_S + ATTENTION_S * 1100
    assert 0.7 * truth < per_request.low <= truth <= per_request.high < 1.3 * truth


def test_stated_and_detected_cliff():
    profile = known_profile(cliff=(40, 2e-3))
    runs = known_runs(configs=((0, 1.0), (1, 1.8), (3, 2.6)), prompts=(1000,), profile=profile)
    stated = fit_runs(runs, FitConfig(max_captured_tokens=40))
    assert stated.identification.by_name("eager_s").best == pytest.approx(2e-3, rel=1e-2)
    detected = fit_runs(runs, FitConfig(detect_cliff=True))
    assert detected.cliff is not None and detected.cliff.low_tokens <= 40 <= detected.cliff.high_tokens
    assert detected.identification.by_name("eager_s").best == pytest.approx(2e-3, rel=0.05)


def test_profile_and_alternatives_load_in_the_simulator():
    report = fit_runs(known_runs(configs=((0, 1.0),)),
                      FitConfig(drafter_cost=DrafterCost(DRAFT_FIXED_S, DRAFT_PER_POSITION_S, 0.0),
                                max_batch_tokens=64))
    data = profiles(report, ExportOptions(device="test", model="known", created="2025-01-01", max_requests=64))
    central = profile_from_dict(data, "<fitted>")
    assert central.source == "fitted" and central.draft_s("mtp", 4, 3) == pytest.approx(
        DRAFT_FIXED_S + 3 * DRAFT_PER_POSITION_S)
    low, high = (profile_from_dict(data["metadata"]["fit"]["alternatives"][f"per_request_s.{end}"], end)
                 for end in ("low", "high"))
    # the same no-spec step at the observed batches, different steps when a request verifies more tokens
    assert low.verify_s(8, 8) == pytest.approx(high.verify_s(8, 8), rel=0.01)
    assert low.verify_s(8, 64) > 1.3 * high.verify_s(8, 64)


def test_the_curve_beyond_the_largest_batch_run_ranges_from_flat_to_proportional():
    """No-spec runs reach 32 batch tokens; a profile to 64 has knots beyond them. Their range runs from the value at
    the last knot a run touches (flat: no batch costs less than a smaller one) to that value times B / 32 (no batch
    costs more than steps of 32 that hold its tokens), the fitted continuation between; both ends explain the runs
    as well as the best fit and are alternative profiles."""
    report = fit_runs(known_runs(configs=((0, 1.0),)),
                      FitConfig(drafter_cost=DrafterCost(DRAFT_FIXED_S, DRAFT_PER_POSITION_S, 0.0),
                                max_batch_tokens=64))
    knots = report.model.knots_tokens
    assert knots[-1] == 64 and 32 in knots
    beyond = [report.identification.by_name(f"dense_s[B={k:g}]") for k in knots[knots > 32]]
    at_32 = report.identification.by_name("dense_s[B=32]").best
    assert beyond and all(r.status == "extrapolated" for r in beyond)
    for r, knot in zip(beyond, knots[knots > 32], strict=True):
        assert r.low == pytest.approx(at_32) and r.high == pytest.approx(at_32 * knot / 32)
        assert r.low < r.best < r.high
    flat = report.identification.alternatives["dense_beyond_data.flat"]
    proportional = report.identification.alternatives["dense_beyond_data.proportional"]
    np.testing.assert_allclose(report.fit.problem.relative_errors(proportional), report.fit.relative_errors,
                               atol=1e-9)
    # the same step time at every run (the smoothness of the curve, not the data, prefers the continuation)
    np.testing.assert_allclose(report.fit.problem.relative_errors(flat), report.fit.relative_errors, atol=1e-9)
    values = report.model.dense_values(flat)
    assert values[knots > 32] == pytest.approx(np.full(len(beyond), at_32))
    assert values[knots <= 32] == pytest.approx(report.model.dense_values(report.fit.theta)[knots <= 32])


def test_the_drafter_beyond_the_largest_draft_length_run_ranges_from_flat_to_linear():
    """Runs at k = 1 and 3: the central profile carries the drafter's per-position cost on to k = 8 (the known
    drafter is linear, so it is exact there), and one alternative keeps it flat beyond k = 3. That alternative
    prices every fitted run as the central fit does and appears in the report and the profile."""
    report = fit_runs(known_runs(), FitConfig(max_batch_tokens=32 * 9))
    assert report.draft_tokens_fitted == 3
    flat = report.alternatives["draft_beyond_data.flat"]
    assert flat.draft_cap == 3 and flat.theta is report.central
    obs = report.fit.problem.obs
    same = [report.model.predict_s(report.central, obs.num_requests, obs.batch_tokens, obs.context_tokens,
                                   obs.draft_tokens, draft_cap=cap) for cap in (None, flat.draft_cap)]
    np.testing.assert_allclose(same[0], same[1], rtol=1e-12)
    data = profiles(report, ExportOptions(device="test", model="known", created="2025-01-01", max_requests=64,
                                          max_draft_tokens=8))
    central = profile_from_dict(data, "<fitted>")
    alternative = profile_from_dict(data["metadata"]["fit"]["alternatives"]["draft_beyond_data.flat"], "<flat>")
    for r in (1, 16):
        for k in (1, 3):
            assert alternative.draft_s("mtp", r, k) == pytest.approx(central.draft_s("mtp", r, k))
        assert alternative.draft_s("mtp", r, 8) == pytest.approx(alternative.draft_s("mtp", r, 3))
        assert central.draft_s("mtp", r, 8) > alternative.draft_s("mtp", r, 3) + 4 * DRAFT_PER_POSITION_S
    assert central.draft_s("mtp", 1, 8) == pytest.approx(DRAFT_FIXED_S + 8 * DRAFT_PER_POSITION_S, rel=0.03)
    assert "draft_beyond_data.flat" in unidentified_words(report)
    # a profile that stops at the fitted draft length has nothing to carry: no such alternative
    upto3 = profiles(report, ExportOptions(device="test", model="known", created="2025-01-01", max_requests=64,
                                           max_draft_tokens=3))
    assert "draft_beyond_data.flat" not in upto3["metadata"]["fit"]["alternatives"]
    # a drafter named sequential pays per position: carrying its cost on linearly is not a guess
    assert fit_runs(known_runs(), FitConfig(drafter_kind="mtp")).draft_tokens_fitted is None


def test_a_parameter_held_a_rounding_error_below_zero_is_written_as_zero():
    """A bounded solver may return -1e-36 for a cost held at its bound; the profile writes 0, not an error."""
    report = fit_runs(known_runs(), FitConfig())
    theta = report.central.copy()
    for name in ("verify_draft_token_s", "per_request_s", "draft_per_request_s"):
        theta[report.model.index(name)] = -4e-36
    data = profile_dict(report.model, theta, ExportOptions(device="test", model="known", created="2025-01-01",
                                                           max_requests=64, max_draft_tokens=8), (0.0, 1e4), {})
    profile = profile_from_dict(data, "<rounded>")
    assert profile.draft_token_s == 0.0 and data["per_request"]["step_s"] == [0.0, 0.0]


def test_sequential_drafters_are_the_shapes_that_are_not_parallel():
    shapes = default_drafters(BYTE_SHAPE)
    assert set(SEQUENTIAL_DRAFTERS) == {kind for kind, shape in shapes.items() if not shape.parallel}


# ---------------------------------------------------------------- the command and the interval downstream


def _write_example(tmp_path: Path) -> list[str]:
    runs = known_runs(configs=((0, 1.0),), prompts=(1000,))
    paths = []
    for run in runs:
        paths.append(str(write_vllm(run, tmp_path / f"c{int(run.concurrency)}.json")))
    return paths


def test_command_prints_residuals_and_identifiability(tmp_path: Path, capsys):
    out = tmp_path / "profile.json"
    fit_main([*_write_example(tmp_path), "--out", str(out), "--created", "2025-01-01", "--drafter-cost",
              f"{DRAFT_FIXED_S},{DRAFT_PER_POSITION_S},0"])
    text = capsys.readouterr().out
    assert "residuals" in text and "per-request vs per-token cost" in text and "not identified" in text
    data = json.loads(out.read_text())
    assert data["metadata"]["source"] == "fitted" and len(data["metadata"]["fit"]["alternatives"]) == 2


def test_command_error_is_one_line(tmp_path: Path, capsys):
    (tmp_path / "a.json").write_text(json.dumps({"completed": 1}))
    with pytest.raises(SystemExit) as exit_info:
        fit_main([str(tmp_path / "a.json"), "--out", str(tmp_path / "p.json")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "a.json row 1: missing field 'total_input_tokens'" in err


def test_interval_is_carried_into_the_summary():
    report = fit_runs(known_runs(configs=((0, 1.0),), prompts=(1000,)),
                      FitConfig(drafter_cost=DrafterCost(DRAFT_FIXED_S, DRAFT_PER_POSITION_S, 0.0),
                                max_batch_tokens=64))
    data = profiles(report, ExportOptions(device="test", model="known", created="2025-01-01", max_requests=64,
                                          drafter_kind="dspark", max_draft_tokens=7))
    spec = SimulationSpec(policy=make_policy("mtp3"), profile=profile_from_dict(data, "<fitted>"),
                          drafter=DrafterSpec("dspark", 3),
                          cluster=ClusterSpec(num_prefill_instances=2, limits=EngineLimits(16, 600_000)),
                          traffic=TrafficSpec(arrival="closed", num_users=16, domain_mix={"chat": 1.0},
                                              max_output_tokens=256, max_prompt_tokens=2048),
                          duration_s=3.0, warmup_s=0.5, seed=7)
    summary = with_intervals(spec, simulate(spec)).summary
    assert with_intervals(spec, simulate(spec), jobs=2).summary == summary  # the same figures in two processes
    low, high = summary["output_tokens_per_s_low"], summary["output_tokens_per_s_high"]
    assert low <= summary["output_tokens_per_s"] <= high and high > 1.1 * low
    assert summary["tokens_per_s_per_user_low"]["mean"] < summary["tokens_per_s_per_user_high"]["mean"]
    # mtp3 at 16 users runs batches of up to 64 tokens, the no-spec runs reach 32: the flat end is carried too
    assert summary["interval_profiles"] == ["dense_beyond_data.flat", "dense_beyond_data.proportional",
                                            "per_request_s.high", "per_request_s.low"]


def test_benchmark_export_of_loop_results_reads_back(tmp_path: Path, default_profile):
    # Simulator results have the real loop's schema (the validation pools both alike): two slices of a point.
    spec = SimulationSpec(policy=make_policy("mtp3"), profile=default_profile, drafter=DrafterSpec("dspark", 7),
                          cluster=ClusterSpec(num_prefill_instances=1, limits=EngineLimits(4, 100_000)),
                          traffic=TrafficSpec(arrival="closed", num_users=4, domain_mix={"chat": 1.0},
                                              max_output_tokens=128, max_prompt_tokens=512),
                          duration_s=1.0, warmup_s=0.2, seed=3)
    slices = [simulate(spec), simulate(dataclasses.replace(spec, seed=4))]
    paths = write_benchmark({("mtp3", 4): slices, ("greedy", 4): slices}, "dspark", 7, "sim", tmp_path)
    assert set(paths) == {"bench_mtp3_u4", "bench_csv"}  # greedy verifies varying lengths: no fixed-k record
    (from_json,), (from_csv,) = read_results([paths["bench_mtp3_u4"]]), read_results([paths["bench_csv"]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # windows laid end to end have no arrivals: no figure of them, no NaN warning
        pooled = pooled_summary(slices)
    assert not set(ARRIVAL_FIGURES) & set(pooled)
    for run in (from_json, from_csv):
        assert (run.spec_method, run.num_speculative_tokens) == ("dspark", 3)
        assert run.acceptance_length == pytest.approx(pooled["mean_acceptance_length"])
        assert run.mean_decode_requests == pytest.approx(pooled["mean_num_requests"])
        assert run.output_tokens_per_s == pytest.approx(pooled["output_tokens_per_s"])
        needed = run.mean_output_tokens - 1
        assert observe(run).step_s == pytest.approx(pooled["tpot_s"]["mean"] * pooled["mean_acceptance_length"]
                                                    * needed / (needed + overshoot_tokens(run.acceptance_length, 3)))


def test_error_bars_from_a_sweep_table():
    sweep = pd.DataFrame({"tokens_per_s_per_user_mean": [100.0, 50.0], "output_tokens_per_s_per_gpu": [1e3, 2e3],
                          "tokens_per_s_per_user_low_mean": [80.0, 40.0],
                          "tokens_per_s_per_user_high_mean": [120.0, 60.0],
                          "output_tokens_per_s_per_gpu_low": [900.0, 1800.0],
                          "output_tokens_per_s_per_gpu_high": [1100.0, 2500.0]})
    ax = Figure().add_subplot()
    assert draw_intervals(ax, sweep)
    assert not draw_intervals(Figure().add_subplot(), sweep.drop(columns=["output_tokens_per_s_per_gpu_low"]))
