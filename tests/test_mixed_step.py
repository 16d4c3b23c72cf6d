"""``prefill.mixed_step`` (profile version 2): what a step with prefill chunks beside decoding requests costs beyond
its priced parts.

The field is read from version-2 files only, checked in one line, charged by the engine on steps that have both
chunks and decoding requests (never on a step of chunks alone or of decoding requests alone), priced the same way
for the real loop's logged steps, and fitted from a chunked serving-loop probe.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from calibration.profiling.mixed_steps import MixedExcess, fit_mixed
from calibration.profiling.policy_steps import fit_excess
from calibration.profiling.step_prices import price_parts
from policies import make_policy
from simulator.costs import ProfileError, Version2Blocks, profile_from_dict, profile_to_dict
from simulator.costs.step_cost import StepPricer
from tests.cost_factories import linear_attention

FIXED_S, PER_REQUEST_S = 8e-4, 1e-4
GAMMA = 7


def _with_field(raw: dict, block: object = None) -> dict:
    data = copy.deepcopy(raw)
    data["prefill"]["mixed_step"] = {"fixed_s": FIXED_S, "per_request_s": PER_REQUEST_S} if block is None else block
    return data


@pytest.fixture(scope="module")
def v2_raw(default_profile) -> dict:
    return Version2Blocks(attention=linear_attention()).apply(default_profile.raw, "test-v2.json")


def test_the_field_is_read_from_version2_and_round_trips(v2_raw):
    assert profile_from_dict(v2_raw).mixed_step is None
    profile = profile_from_dict(_with_field(v2_raw))
    assert profile.mixed_step == (FIXED_S, PER_REQUEST_S)
    assert profile.mixed_step_s(4) == pytest.approx(FIXED_S + 4 * PER_REQUEST_S)
    assert profile_from_dict(profile_to_dict(profile)).mixed_step == (FIXED_S, PER_REQUEST_S)


@pytest.mark.parametrize(("version", "block", "message"), [
    (1, None, r"x\.json: field 'prefill\.mixed_step' needs version 2 \(this file says version 1\)"),
    (2, {"fixed_s": -1e-3, "per_request_s": 0}, r"x\.json: field 'prefill\.mixed_step\.fixed_s' must be >= 0"),
    (2, {"fixed_s": 1e-3}, r"x\.json: missing field 'prefill\.mixed_step\.per_request_s'"),
    (2, {"fixed_s": 1e-3, "per_request_s": 0, "per_chunk_s": 1}, r"x\.json: .*prefill\.mixed_step\.per_chunk_s"),
    (2, 0.001, r"x\.json: field 'prefill\.mixed_step' must be \{fixed_s, per_request_s\}, got 0\.001"),
])
def test_bad_fields_are_refused_in_one_line(default_profile, v2_raw, version, block, message):
    data = _with_field(default_profile.raw if version == 1 else v2_raw, block)
    with pytest.raises(ProfileError, match=message) as err:
        profile_from_dict(data, "x.json")
    assert "\n" not in str(err.value)


def _verify_s(profile, lengths: list[int], chunks: list[tuple[int, int]]) -> float:
    pricer = StepPricer(profile, profile, make_policy("greedy"), "dspark", GAMMA)
    lengths_arr = np.array(lengths, dtype=np.int64)
    contexts = np.full(len(lengths), 1000, dtype=np.int64)
    if lengths:
        pricer.before_decision(len(lengths), contexts)
    return pricer.verify(lengths_arr, int((1 + lengths_arr).sum()), contexts,
                         np.array([c for c, _ in chunks], dtype=np.int64),
                         np.array([n for _, n in chunks], dtype=np.int64), True).verify_s


@pytest.mark.parametrize(("lengths", "chunks", "charged"), [
    ([0, 3, 7], [(500, 200)], FIXED_S + 3 * PER_REQUEST_S),  # chunks beside three decoding requests
    ([2], [(0, 100), (300, 50)], FIXED_S + PER_REQUEST_S),  # two chunks beside one request: once per step
    ([0, 3, 7], [], 0.0),  # decoding requests alone
    ([], [(500, 200)], 0.0),  # a chunk alone
])
def test_the_engine_charges_it_on_mixed_steps_only(v2_raw, lengths, chunks, charged):
    without = profile_from_dict(v2_raw)
    with_it = profile_from_dict(_with_field(v2_raw))
    assert _verify_s(with_it, lengths, chunks) - _verify_s(without, lengths, chunks) == pytest.approx(charged,
                                                                                                     abs=1e-12)


def test_the_real_loops_step_prices_charge_it_as_the_engine_does(v2_raw):
    """A logged mixed step is priced FIXED_S + R * PER_REQUEST_S higher with the field; a chunk-only step is not."""
    steps = pd.DataFrame({"num_requests": [3, 0], "batch_tokens": [6, 0], "max_verified_tokens": [1, 0],
                          "context_tokens": [3000.0, 0.0], "max_context_tokens": [1000.0, 0.0],
                          "prefill_tokens": [200, 200], "num_prefill_requests": [1, 1]})
    chunks = pd.DataFrame({"step": [0, 1], "context_tokens": [500, 0], "chunk_tokens": [200, 200]})
    parts = [price_parts(steps, profile_from_dict(raw), "dspark", "mtp", 1, chunks=chunks)["verify_s"].to_numpy()
             for raw in (v2_raw, _with_field(v2_raw))]
    np.testing.assert_allclose(parts[1] - parts[0], [FIXED_S + 3 * PER_REQUEST_S, 0.0], atol=1e-12)


def test_the_mixed_steps_excess_is_taken_beside_the_decode_steps_of_the_same_run():
    """At 2 users the decode-only steps ran 0.3 ms above their price and the mixed ones 0.3 ms + FIXED_S + 2 x
    PER_REQUEST_S; at 4 users the decode steps on price: the fit keeps what a mixed step adds beside a decode
    step, and reports the decode steps' excess per R."""
    rows = []
    for users, offset_s in ((2, 3e-4), (4, 0.0)):
        for r in (users - 1, users):
            rows.append({"users": users, "num_requests": r, "prefill_tokens": 100, "mixed": True, "priced_s": 0.02,
                         "excess_s": offset_s + FIXED_S + PER_REQUEST_S * r})
        rows.append({"users": users, "num_requests": users, "prefill_tokens": 0, "mixed": False, "priced_s": 0.01,
                     "excess_s": offset_s})
    excess = fit_mixed(pd.DataFrame(rows * 3), (2, 4))
    assert excess.entry() == pytest.approx({"fixed_s": FIXED_S, "per_request_s": PER_REQUEST_S})
    assert excess.decode_only_excess_s == pytest.approx((3e-4, 0.0))


def test_the_fit_recovers_fixed_and_per_request_parts_from_mixed_steps():
    """Mixed steps whose excess is exactly FIXED_S + PER_REQUEST_S * R (R = 1..7 decoding requests) fit to them; the
    profile block and the metadata carry what was fitted."""
    r = np.tile(np.arange(1, 8), 5)
    steps = pd.DataFrame({"users": np.where(r < 4, 4, 8), "num_requests": r, "priced_s": 0.02,
                          "excess_s": FIXED_S + PER_REQUEST_S * r})
    excess = MixedExcess(fit_excess(steps, 1), (0.0, 0.0), (4, 8))
    assert excess.entry() == pytest.approx({"fixed_s": FIXED_S, "per_request_s": PER_REQUEST_S})
    assert excess.metadata()["num_steps"] == len(steps)


@pytest.mark.usefixtures("torch_one_thread")
def test_the_chunked_loop_probe_fits_the_mixed_steps_of_real_runs(tiny_verifier_v8, v2_raw):
    """The probe runs the real loop in chunked mode at each R >= 2, prices its steps and fits the mixed ones: a
    profile block that loads, per-R means for the report, the decode-only steps' check beside them; it refuses a
    profile that already has the field and probes that cannot mix (one user)."""
    import torch

    from calibration.models.drafters import build_drafter
    from calibration.profiling.mixed_steps import measure_mixed_steps
    from traces.synthetic import LengthSpec

    drafter = build_drafter("dspark", tiny_verifier_v8, torch.Generator().manual_seed(5), num_layers=1, std=0.1)
    profile = profile_from_dict(v2_raw)
    lengths = LengthSpec(prompt_median_tokens=40, prompt_sigma=0.3, output_median_tokens=6, output_sigma=0.3)
    excess = measure_mixed_steps(tiny_verifier_v8, drafter, 3, (1, 2), profile, 16, lengths, (80, 12),
                                 duration_s=0.4, warmup_s=0.05)
    assert excess.num_users == (2,) and excess.fit.num_steps > 0
    assert excess.fit.mean_priced_s[0] > 0 and np.isfinite(excess.decode_only_excess_s[0])
    assert profile_from_dict(_with_field(v2_raw, excess.entry())).mixed_step == tuple(excess.entry().values())
    with pytest.raises(ValueError, match="without prefill.mixed_step"):
        measure_mixed_steps(tiny_verifier_v8, drafter, 3, (2,), profile_from_dict(_with_field(v2_raw)), 16, lengths,
                            (80, 12))
    with pytest.raises(ValueError, match="an R >= 2"):
        measure_mixed_steps(tiny_verifier_v8, drafter, 3, (1,), profile, 16, lengths, (80, 12))
