"""The host work per decode token, ``verify.decode_token_s`` (profile version 2).

The real loop spends host time per *verified* token (softmax rows to numpy, rejection sampling); a co-located
prefill chunk's prompt tokens get none of it. The field is charged on a step's decode tokens sum_r (1 + l_r) and
never on its chunk tokens, the policy's curve holds it per batch token (each one the decision makes a decode
token), the loop costs write it into version-2 profiles (version 1 keeps it in the dense table), and the real
loop's step prices charge it as the engine does.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from calibration.profiling.loop_costs import LoopCosts
from policies import make_policy
from simulator import simulate
from simulator.costs import CudaGraphsBlock, ProfileError, Version2Blocks, profile_from_dict, profile_to_dict
from simulator.costs.step_cost import StepPricer
from tests.cost_factories import closed_spec, linear_attention, v2_profile

DECODE_TOKEN_S = 1e-5  # 10 us per decode token, the size the loop probe measures on the CPU
GAMMA = 7


def _with_field(raw: dict, value: float = DECODE_TOKEN_S) -> dict:
    data = copy.deepcopy(raw)
    data["verify"]["decode_token_s"] = value
    return data


@pytest.fixture(scope="module")
def v2_raw(default_profile) -> dict:
    """Version 2 with attention (which also prices chunks), the per-request table kept, no CUDA-graph cliff."""
    return Version2Blocks(attention=linear_attention()).apply(default_profile.raw, "test-v2.json")


# ------------------------------------------------------------------ the field


def test_the_field_is_read_from_version2_and_round_trips(v2_raw):
    assert profile_from_dict(v2_raw).decode_token_s == 0.0  # absent: nothing charged
    profile = profile_from_dict(_with_field(v2_raw))
    assert profile.decode_token_s == DECODE_TOKEN_S
    assert profile_from_dict(profile_to_dict(profile)).decode_token_s == DECODE_TOKEN_S
    assert profile_from_dict(_with_field(v2_raw, 0)).decode_token_s == 0.0


@pytest.mark.parametrize(("version", "value", "message"), [
    (1, DECODE_TOKEN_S, r"x\.json: field 'verify\.decode_token_s' needs version 2 \(this file says version 1\)"),
    (2, -1e-5, r"x\.json: field 'verify\.decode_token_s' must be >= 0, got -1e-05"),
    (2, "10us", r"x\.json: field 'verify\.decode_token_s' must be a number, got '10us'"),
])
def test_bad_fields_are_refused_in_one_line(default_profile, v2_raw, version, value, message):
    data = _with_field(default_profile.raw if version == 1 else v2_raw, value)
    with pytest.raises(ProfileError, match=message) as err:
        profile_from_dict(data, "x.json")
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------ what the engine charges


def _verify_s(profile, lengths: list[int], contexts: list[int], chunks: list[tuple[int, int]]) -> float:
    pricer = StepPricer(profile, profile, make_policy("greedy"), "dspark", GAMMA)
    lengths_arr = np.array(lengths, dtype=np.int64)
    context = np.array(contexts, dtype=np.int64)
    if lengths:
        pricer.before_decision(len(lengths), context)
    chunk_context = np.array([c for c, _ in chunks], dtype=np.int64)
    chunk_tokens = np.array([n for _, n in chunks], dtype=np.int64)
    return pricer.verify(lengths_arr, int((1 + lengths_arr).sum()), context, chunk_context, chunk_tokens,
                         True).verify_s


@pytest.mark.parametrize(("lengths", "contexts", "chunks", "decode_tokens"), [
    ([0, 3, 7], [1000, 2000, 3000], [(500, 200), (0, 100)], 13),  # mixed: 13 decode tokens, 300 chunk tokens
    ([0, 3, 7], [1000, 2000, 3000], [], 13),  # the same decode tokens alone
    ([2], [64], [(0, 1000)], 3),  # a large chunk beside one request
    ([], [], [(4000, 400)], 0),  # a chunk alone: no decode token, nothing charged
])
def test_the_engine_charges_decode_tokens_only(v2_raw, lengths, contexts, chunks, decode_tokens):
    plain, charged = profile_from_dict(v2_raw), profile_from_dict(_with_field(v2_raw))
    extra_s = _verify_s(charged, lengths, contexts, chunks) - _verify_s(plain, lengths, contexts, chunks)
    assert extra_s == pytest.approx(DECODE_TOKEN_S * decode_tokens, rel=1e-9, abs=1e-15)


def test_a_chunked_run_charges_each_step_its_decode_tokens(default_profile):
    """In the step log (no per-request table, no padding cost): verify = dense over decode + chunk tokens +
    attention + decode_token_s x decode tokens (``batch_tokens`` counts decode tokens, ``prefill_tokens`` chunks)."""
    base = v2_profile(default_profile, attention=linear_attention(), budget=256)
    profile = profile_from_dict(_with_field(base.raw), "test-v2.json")
    spec = closed_spec(make_policy("greedy"), profile, 4, prompt_tokens=300, output_tokens=30, mode="chunked",
                       duration_s=0.4, warmup_s=0.0)
    steps = simulate(spec).steps
    mixed = (steps["prefill_tokens"] > 0) & (steps["num_requests"] > 0)
    assert mixed.sum() >= 3 and (steps["num_requests"] == 0).any()  # steps with chunks beside decoding, and alone
    host_s = steps["verify_s"] - steps["dense_s"] - steps["attention_s"]
    np.testing.assert_allclose(host_s, DECODE_TOKEN_S * steps["batch_tokens"], rtol=1e-9, atol=1e-13)


# ------------------------------------------------------------------ what the policy prices with


def test_the_policy_curve_holds_it_per_batch_token(v2_raw):
    plain, charged = profile_from_dict(v2_raw), profile_from_dict(_with_field(v2_raw))
    contexts = np.array([1000, 2000, 3000], dtype=np.int64)
    for num_requests, context in ((3, None), (3, contexts)):  # without contexts (cached per R), and with them
        before = plain.step_cost_curve("dspark", num_requests, GAMMA, context)
        after = charged.step_cost_curve("dspark", num_requests, GAMMA, context)
        np.testing.assert_array_equal(after.batch_tokens, before.batch_tokens)
        np.testing.assert_allclose(1.0 / after.steps_per_s - 1.0 / before.steps_per_s,
                                   DECODE_TOKEN_S * before.batch_tokens, rtol=1e-9)
    # what a policy of the engine is shown before deciding is that curve
    pricer = StepPricer(charged, charged, make_policy("greedy"), "dspark", GAMMA)
    shown = pricer.before_decision(3, contexts)[2]
    np.testing.assert_array_equal(shown.steps_per_s,
                                  charged.step_cost_curve("dspark", 3, GAMMA, contexts).steps_per_s)


def test_the_curve_of_a_profile_with_a_cliff_holds_it_too(default_profile):
    raw = Version2Blocks(cuda_graphs=CudaGraphsBlock(1024, eager_overhead_s=1e-3)).apply(default_profile.raw)
    plain, charged = profile_from_dict(raw), profile_from_dict(_with_field(raw))
    before, after = plain.cost_curve(8), charged.cost_curve(8)
    np.testing.assert_allclose(1.0 / after.steps_per_s - 1.0 / before.steps_per_s,
                               DECODE_TOKEN_S * before.batch_tokens, rtol=1e-9)


# ------------------------------------------------------------------ who writes it


def _loop_costs(per_batch_token_s: float) -> LoopCosts:
    return LoopCosts(num_requests=(1, 16), draft_tokens=(1, 8), draft_factor=((1.0, 1.0), (1.0, 1.0)),
                     extra_per_request_s=(1e-4, 2e-4), extra_per_batch_token_s=per_batch_token_s, prefill_factor=1.0,
                     host_fixed_s=0.0, host_per_request_s=0.0, host_per_verified_token_s=0.0, num_steps=0)


def test_loop_costs_fold_c_into_the_field_of_a_version2_profile(v2_raw):
    folded = _loop_costs(DECODE_TOKEN_S).fold(v2_raw)
    assert folded["verify"]["decode_token_s"] == DECODE_TOKEN_S
    assert folded["verify"]["steps_per_s"] == v2_raw["verify"]["steps_per_s"]  # the dense table stays the forward
    assert "verify.decode_token_s += extra_per_batch_token_s" in folded["metadata"]["loop_costs"]["folded"]
    profile, before = profile_from_dict(folded), profile_from_dict(v2_raw)
    assert profile.decode_token_s == DECODE_TOKEN_S
    # 5 decode tokens of 2 requests beside a 100-token chunk: c on the 5 only, a_R of 2 requests on R + chunk
    extra_s = profile.verify_s(3, 105, 0, 5) - before.verify_s(3, 105, 0, 5)
    assert extra_s == pytest.approx(5 * DECODE_TOKEN_S + float(np.interp(3, (1, 16), (1e-4, 2e-4))), rel=1e-9)
    # folding again adds to the field (a profile that already holds loop costs)
    assert _loop_costs(2e-6).fold(folded)["verify"]["decode_token_s"] == pytest.approx(DECODE_TOKEN_S + 2e-6)


def test_loop_costs_fold_c_into_the_dense_table_of_a_version1_profile(default_profile):
    raw = default_profile.raw
    folded = _loop_costs(DECODE_TOKEN_S).fold(raw)
    assert "decode_token_s" not in folded["verify"] and folded["version"] == 1
    tokens, sps = np.array(raw["verify"]["batch_tokens"]), np.array(raw["verify"]["steps_per_s"])
    np.testing.assert_allclose(1.0 / np.array(folded["verify"]["steps_per_s"]), 1.0 / sps + DECODE_TOKEN_S * tokens,
                               rtol=1e-12)
    assert "1/SPS(B) += extra_per_batch_token_s * B" in folded["metadata"]["loop_costs"]["folded"]


# ------------------------------------------------------------------ per verified draft token (verify.draft_token_s)


def _with_draft_field(raw: dict, value: float = DECODE_TOKEN_S) -> dict:
    data = copy.deepcopy(raw)
    data["verify"]["draft_token_s"] = value
    return data


def test_the_draft_token_field_round_trips_and_needs_version2(default_profile, v2_raw):
    profile = profile_from_dict(_with_draft_field(v2_raw))
    assert profile.draft_token_s == DECODE_TOKEN_S and profile_from_dict(v2_raw).draft_token_s == 0.0
    assert profile_from_dict(profile_to_dict(profile)).draft_token_s == DECODE_TOKEN_S
    with pytest.raises(ProfileError, match=r"x\.json: field 'verify\.draft_token_s' needs version 2"):
        profile_from_dict(_with_draft_field(default_profile.raw), "x.json")


@pytest.mark.parametrize(("lengths", "contexts", "chunks"), [
    ([0, 3, 7], [1000, 2000, 3000], [(500, 200), (0, 100)]),  # 10 verified draft tokens beside two chunks
    ([0, 3, 7], [1000, 2000, 3000], []),
    ([2], [64], [(0, 1000)]),
    ([], [], [(4000, 400)]),  # a chunk alone: no draft token
])
def test_the_engine_charges_verified_draft_tokens_only(v2_raw, lengths, contexts, chunks):
    plain, charged = profile_from_dict(v2_raw), profile_from_dict(_with_draft_field(v2_raw))
    extra_s = _verify_s(charged, lengths, contexts, chunks) - _verify_s(plain, lengths, contexts, chunks)
    assert extra_s == pytest.approx(DECODE_TOKEN_S * sum(lengths), rel=1e-9, abs=1e-15)


def test_the_policy_curve_holds_it_per_batch_token_beyond_one_per_request(v2_raw):
    plain, charged = profile_from_dict(v2_raw), profile_from_dict(_with_draft_field(v2_raw))
    before, after = plain.cost_curve(3), charged.cost_curve(3)
    np.testing.assert_allclose(1.0 / after.steps_per_s - 1.0 / before.steps_per_s,
                               DECODE_TOKEN_S * np.maximum(before.batch_tokens - 3, 0), rtol=1e-9, atol=1e-15)
    # a step without speculation (B = R) pays none of it
    assert charged.verify_s(4, 4) == pytest.approx(plain.verify_s(4, 4))
