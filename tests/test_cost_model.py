"""The version-2 cost model: profiles that load, errors that name file and field, what a step costs and why.

Long contexts make verification cheap relative to the KV read every request pays (larger speculative gain),
and a cliff stated in a profile makes fixed-k speculation peak and then lose with concurrency.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from policies import make_policy
from simulator import simulate
from simulator.costs import (
    PROFILE_VERSION,
    ContextDraftTable,
    CudaGraphsBlock,
    ProfileError,
    Table2D,
    Version2Blocks,
    builtin_profiles,
    load_profile,
    migrate,
    profile_from_dict,
    profile_to_dict,
)
from simulator.engine import StepLog
from tests.cost_factories import KV_S_PER_TOKEN, closed_spec, linear_attention, uniform_contexts, v2_profile


@pytest.fixture(scope="module")
def v2(default_profile):
    """The default analytic profile with attention (KV read per context token) instead of its per-request KV."""
    return v2_profile(default_profile, attention=linear_attention())


@pytest.fixture(scope="module")
def v2_raw(v2):
    return copy.deepcopy(v2.raw)


# ------------------------------------------------------------------ the format


@pytest.mark.parametrize("name", builtin_profiles())
def test_builtin_profiles_load_and_migrate_without_changing_a_cost(name):
    profile = load_profile(name)
    migrated = profile_from_dict(profile_to_dict(profile))
    assert migrated.version == PROFILE_VERSION == 2
    assert migrate(migrate(profile.raw)) == migrate(profile.raw)
    if profile.version == 1:
        assert profile.attention is None and profile.cuda_graphs is None and profile.token_budget is None
    for requests, tokens in ((1, 1), (64, 320), (256, 2048)):
        assert migrated.verify_s(requests, tokens, 3) == profile.verify_s(requests, tokens, 3)
        np.testing.assert_array_equal(migrated.cost_curve(requests).steps_per_s,
                                      profile.cost_curve(requests).steps_per_s)


def test_version2_blocks_write_what_the_reader_reads_back(v2, v2_raw, tmp_path):
    path = tmp_path / "v2.json"
    v2.save(path)
    again = load_profile(path)
    assert profile_to_dict(again) == json.loads(path.read_text()) == migrate(v2_raw)
    assert list(v2_raw) == [k for k in ("format", "version", "metadata", "gpus_per_replica", "verify", "attention",
                                        "draft", "prefill", "scheduler")]
    contexts = np.array([0, 500, 20000])
    assert again.attention_s(contexts, np.array([1, 4, 8])) == pytest.approx(
        KV_S_PER_TOKEN * (contexts + [1, 4, 8]).sum())


def test_two_axis_tables_interpolate_bilinearly_and_name_the_file_outside():
    x, y = np.array([0.0, 10.0, 30.0]), np.array([1.0, 5.0])
    plane = 2.0 * x[:, None] + 3.0 * y[None, :] + 1.0  # bilinear interpolation is exact on a plane
    table = Table2D(x, y, plane, "attention per_request_s", "context_tokens", "query_tokens", "p.json")
    qx, qy = np.array([0.0, 7.5, 30.0, 12.0]), np.array([1.0, 2.0, 5.0, 4.5])
    np.testing.assert_allclose(table(qx, qy), 2.0 * qx + 3.0 * qy + 1.0)
    with pytest.raises(ValueError, match=r"attention per_request_s: context_tokens 31\.\.31 is outside the profiled "
                                         r"range 0\.\.30 \(profile p\.json\)"):
        table(31.0, 1.0)
    with pytest.raises(ValueError, match="query_tokens 0..0 is outside"):
        table(3.0, 0.0)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["attention"]["per_request_s"][1].pop(), r"'attention\.per_request_s\[1\]' must be a list of 9"),
        (lambda d: d["attention"]["per_request_s"].pop(), r"'attention\.per_request_s' must have one row per point"),
        (lambda d: d["attention"]["context_tokens"].reverse(), r"'attention\.context_tokens' must be strictly incr"),
        (lambda d: d["attention"].__setitem__("key_padding", "max"), r"'attention\.key_padding' must be one of"),
        (lambda d: d["attention"]["per_request_s"][0].__setitem__(2, -1.0),
         r"'attention\.per_request_s\[0\]\[2\]' must be >= 0"),
        (lambda d: d["attention"].__setitem__("keys", 1), r"unknown field 'attention\.keys'"),
        (lambda d: d.__setitem__("cuda_graphs", {"max_captured_tokens": 512}), r"'cuda_graphs' needs exactly one of"),
        (lambda d: d.__setitem__("cuda_graphs", {"max_captured_tokens": 10**6, "eager_overhead_s": 0.0}),
         r"'cuda_graphs\.max_captured_tokens' is 1000000, beyond the verify table"),
        (lambda d: d.__setitem__("cuda_graphs", {"max_captured_tokens": 512, "eager": {
            "batch_tokens": [600, 8192], "steps_per_s": [10.0, 5.0]}}),
         r"'cuda_graphs\.eager\.batch_tokens' starts at"),
        (lambda d: d.__setitem__("token_budget", {"max_num_batched_tokens": 0}),
         r"'token_budget\.max_num_batched_tokens' must be an integer >= 1"),
        (lambda d: d.__setitem__("token_budget", {"max_num_batched_tokens": 10**6}),
         r"'token_budget\.max_num_batched_tokens' is 1000000, but the dense cost covers only 8192"),
        (lambda d: d["draft"]["dspark"].__setitem__("context_tokens", [0, 1000]),
         r"'draft\.dspark\.latency_s' must have one row per point of its first axis \(2\)"),
        (lambda d: d["verify"].__setitem__("step_s", [1.0] * len(d["verify"]["batch_tokens"])),
         r"'verify\.steps_per_s' and 'verify\.step_s' exclude each other"),
        (lambda d: d["prefill"].__setitem__("chunk_attention", {"context_tokens": [0]}),
         r"missing field 'prefill\.chunk_attention\.chunk_tokens'"),
        (lambda d: d["prefill"].__setitem__("chunk_attention", {
            "context_tokens": [0, 1000], "chunk_tokens": [1, 512], "per_chunk_s": [[0.0, 1e-3], [1e-6, 2e-3]],
            "draft_s": [[0.0, 1e-3], [1e-6]]}), r"'prefill\.chunk_attention\.draft_s\[1\]' must be a list of 2"),
        (lambda d: d["prefill"].__setitem__("chunk_attention", {
            "context_tokens": [0, 1000], "chunk_tokens": [1, 512], "per_chunk_s": [[0.0, 1e-3], [1e-6, 2e-3]],
            "draft_s": [[0.0, 1e-3], [1e-6, 3e-3]]}),
         r"'prefill\.chunk_attention\.draft_s\[1\]\[1\]' is 0\.003, more than the chunk's whole per_chunk_s "
         r"0\.002 \(context_tokens 1000, chunk_tokens 512\)"),
        (lambda d: d.__setitem__("speculation", {}), r"unknown field 'speculation'"),
        (lambda d: d.__setitem__("version", 1), r"field 'attention' needs version 2 \(this file says version 1\)"),
        (lambda d: d.__setitem__("version", 3), r"field 'version' must be 1 or 2, got 3"),
    ],
)
def test_malformed_version2_profiles_name_file_and_field(tmp_path, v2_raw, mutate, message):
    data = copy.deepcopy(v2_raw)
    mutate(data)
    path = tmp_path / "bad_v2.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=message) as err:
        load_profile(path)
    assert str(path) in str(err.value)


# ------------------------------------------------------------------ what a step costs


def test_step_cost_is_dense_plus_attention_with_the_cliff_and_key_padding(default_profile):
    graphs = CudaGraphsBlock(1024, eager_overhead_s=0.01)
    plain = v2_profile(default_profile, attention=linear_attention(), graphs=graphs)
    padded = v2_profile(default_profile, attention=linear_attention(key_padding="longest"), graphs=graphs)
    contexts, queries = np.array([100, 3000, 9000]), np.array([1, 4, 8])
    assert plain.attention_s(contexts, queries) == pytest.approx(KV_S_PER_TOKEN * (contexts + queries).sum())
    assert padded.attention_s(contexts, queries) == pytest.approx(KV_S_PER_TOKEN * (9000 * 3 + queries.sum()))
    assert plain.dense_s(1024) == default_profile.dense_s(1024) and not plain.is_eager(1024)
    assert plain.dense_s(1025) == pytest.approx(default_profile.dense_s(1025) + 0.01) and plain.is_eager(1025)
    # No per-request table left: a step is dense + padding + attention.
    assert plain.verify_s(3, 13, 2) == pytest.approx(plain.dense_s(13) + 2 * plain.padded_slot_s)


def test_policy_curve_holds_the_attention_line(v2):
    """For uniform lengths the policy's curve is the engine's cost: the fixed KV read of every request plus the
    mean marginal cost of each verified token; on long contexts the extra tokens are cheap relative to it."""
    num_requests, gamma = 32, 7

    def extra_cost_of_drafts(context_tokens: int) -> float:
        contexts = uniform_contexts(num_requests, context_tokens)
        curve = v2.step_cost_curve("dspark", num_requests, gamma, contexts)
        for length in (0, 3, 7):
            tokens = num_requests * (1 + length)
            step_s = v2.verify_s(num_requests, tokens) + v2.attention_s(contexts, np.full(num_requests, 1 + length))
            assert 1.0 / float(curve.sps(tokens)) == pytest.approx(step_s, rel=1e-9)
        return float(curve.sps(num_requests) / curve.sps(num_requests * (1 + gamma))) - 1.0  # T(8R) / T(R) - 1

    assert extra_cost_of_drafts(30000) < 0.5 * extra_cost_of_drafts(300)


def test_drafter_latency_may_depend_on_context(default_profile):
    table = ContextDraftTable(context_tokens=(0, 100000), num_requests=(1, 64), draft_tokens=(1, 8),
                              latency_s=(((1e-3, 2e-3), (2e-3, 4e-3)), ((3e-3, 4e-3), (4e-3, 6e-3))))
    raw = Version2Blocks(attention=linear_attention(), draft={"dspark": table}).apply(default_profile.raw)
    profile = profile_from_dict(raw, "ctx-draft.json")
    assert profile.draft_s("dspark", 1, 1, 0.0) == pytest.approx(1e-3)
    assert profile.draft_s("dspark", 64, 8, 50000.0) == pytest.approx(5e-3)
    with pytest.raises(ValueError, match=r"context_tokens=200000 is outside the profiled range 0\.\.100000"):
        profile.draft_s("dspark", 1, 1, 200000.0)
    with pytest.raises(ValueError, match="depends on context_tokens"):
        profile.draft_s("dspark", 1, 1)
    medians = {}
    for prompt in (200, 30000):
        spec = closed_spec(make_policy("mtp1"), profile, 8, prompt_tokens=prompt, output_tokens=200, gamma=1,
                           duration_s=1.5, warmup_s=0.0)
        steps = simulate(spec).steps
        assert len(steps) > 20
        mean_context = steps["context_tokens"] / steps["num_requests"]  # the drafter's table is read at the mean
        expected = [profile.draft_s("dspark", r, 1, c) for r, c in zip(steps["num_requests"], mean_context,
                                                                        strict=True)]
        assert steps["draft_s"].tolist() == pytest.approx(expected)
        medians[prompt] = steps["draft_s"].median()
    assert medians[30000] > 1.5 * medians[200]


def test_a_padded_drafter_is_read_at_the_batch_longest_context(default_profile, tmp_path):
    from simulator.costs.step_cost import StepPricer

    grid = (((1e-3, 2e-3), (2e-3, 4e-3)), ((3e-3, 4e-3), (4e-3, 6e-3)))
    contexts = np.array([1000, 3000, 80000])
    prices = {}
    for padding in ("none", "longest"):
        table = ContextDraftTable((0, 100000), (1, 64), (1, 8), grid, key_padding=padding)  # type: ignore[arg-type]
        raw = Version2Blocks(attention=linear_attention(), draft={"dspark": table}).apply(default_profile.raw)
        profile = profile_from_dict(raw, "pad.json")
        pricer = StepPricer(profile, profile, make_policy("mtp1"), "dspark", 1)
        draft_s, _, curve = pricer.before_decision(3, contexts)
        assert curve.draft_s == draft_s  # what the policy sees is what the step is charged
        prices[padding] = draft_s
        assert ("key_padding" in raw["draft"]["dspark"]) == (padding == "longest")
    assert prices["none"] == pytest.approx(profile.draft_s("dspark", 3, 1, float(contexts.mean())))
    assert prices["longest"] == pytest.approx(profile.draft_s("dspark", 3, 1, 80000.0))
    assert prices["longest"] > prices["none"]
    bad = copy.deepcopy(raw)
    del bad["draft"]["dspark"]["context_tokens"]
    bad["draft"]["dspark"]["latency_s"] = [list(row) for row in grid[0]]
    path = tmp_path / "bad_pad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ProfileError, match=r"'draft\.dspark\.key_padding' needs 'draft\.dspark\.context_tokens'"):
        load_profile(path)
    bad = copy.deepcopy(raw)
    bad["draft"]["dspark"]["key_padding"] = "max"
    path.write_text(json.dumps(bad))
    with pytest.raises(ProfileError, match=r"'draft\.dspark\.key_padding' must be one of none, longest"):
        load_profile(path)


def test_contexts_outside_the_attention_table_are_refused_at_start(default_profile):
    short = v2_profile(default_profile, attention=linear_attention())
    spec = closed_spec(make_policy("none"), short, 4, prompt_tokens=200000, output_tokens=100000)
    with pytest.raises(ValueError, match=r"profile test-v2\.json: attention per_request_s covers context_tokens "
                                         r"0\.\.262144, but this run needs .*traffic"):
        simulate(spec)


# ------------------------------------------------------------------ what the engine does with it


def test_steps_show_the_cost_parts_for_version2_only(small_spec, v2):
    plain = simulate(small_spec(make_policy("mtp3"))).steps
    assert tuple(plain.columns) == StepLog.COLUMNS
    steps = simulate(small_spec(make_policy("mtp3"), profile=v2)).steps
    assert tuple(steps.columns) == StepLog.COLUMNS + StepLog.COST_COLUMNS
    assert (steps["context_tokens"] >= steps["num_requests"]).all()
    np.testing.assert_allclose(steps["dense_s"] + steps["attention_s"], steps["verify_s"])  # no per-request table
    expected = KV_S_PER_TOKEN * (steps["context_tokens"] + steps["batch_tokens"])
    np.testing.assert_allclose(steps["attention_s"], expected, rtol=1e-9)
    assert (steps["budget_tokens"] == -1).all() and not steps["eager"].any() and (steps["prefill_tokens"] == 0).all()


def test_long_contexts_gain_more_from_speculation(v2):
    """Verifying 1 + l tokens against a long context costs almost the KV read of decoding one, so MTP-3 gains more
    over plain decoding on 16k-token prompts than on 256-token ones; steps.parquet shows why."""
    gain, share = {}, {}
    for prompt in (256, 16384):
        runs = {p: simulate(closed_spec(make_policy(p), v2, 64, prompt_tokens=prompt, output_tokens=2000,
                                        duration_s=1.0, warmup_s=0.3)) for p in ("none", "mtp3")}
        gain[prompt] = runs["mtp3"].summary["output_tokens_per_s"] / runs["none"].summary["output_tokens_per_s"]
        steps = runs["mtp3"].steps
        share[prompt] = float((steps["attention_s"] / steps["verify_s"]).mean())
    assert gain[16384] > 1.1 * gain[256] and gain[256] > 1.0
    assert share[16384] > 0.5 > 0.2 > share[256]


def test_a_stated_cliff_makes_fixed_k_peak_and_then_lose(default_profile):
    """A profile whose dense cost more than doubles from 1024 to 2048 batch tokens (CUDA graphs captured up to
    1024, a heavy eager step above): MTP-7 (8 tokens per request) peaks at 128 requests and loses to plain decoding
    at 256; with the same table and no eager cost it still gains at 256."""
    cliff = v2_profile(default_profile, graphs=CudaGraphsBlock(1024, eager_overhead_s=0.04), drop_per_request=False)
    smooth = v2_profile(default_profile, graphs=CudaGraphsBlock(1024, eager_overhead_s=0.0), drop_per_request=False)
    assert cliff.dense_s(2048) > 2 * cliff.dense_s(1024)

    def throughput(policy: str, profile, num_users: int) -> float:
        spec = closed_spec(make_policy(policy), profile, num_users, output_tokens=2000, duration_s=1.0, warmup_s=0.3)
        return simulate(spec).summary["output_tokens_per_s"]

    mtp7 = [throughput("mtp7", cliff, r) for r in (32, 128, 256)]
    plain = throughput("none", cliff, 256)
    assert mtp7[1] > mtp7[0] and mtp7[1] > mtp7[2]  # peak, then decline
    assert mtp7[2] < 0.9 * plain
    assert throughput("mtp7", smooth, 256) > plain
