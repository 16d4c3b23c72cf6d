"""The real loop's chunk log: every prefill chunk with its step, request, computed-before context and size.

A tiny chunked run to completion (long prompts against a small budget, so prompts split over several steps):
each request's chunks follow one another and sum to its prompt, each chunk's context is the running sum of the
chunks before it, the chunks of a step add up to the steps table's prefill columns, and a request's first and
last chunks are the steps that start its prefill and give its first token.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calibration.models.drafters import build_drafter
from calibration.profiling.step_prices import step_cost_ratio
from calibration.serving.loop import ServingModels, ServingSpec, random_prompts, serve
from calibration.serving.spec import CHUNK_COLUMNS
from policies import make_policy
from policies.base import CostCurve
from simulator import EngineLimits
from simulator.costs import ChunkAttentionBlock, Version2Blocks, load_profile, profile_from_dict
from tests.cost_factories import linear_attention
from traces.workload import Workload

BUDGET = 16
COST = CostCurve(batch_tokens=np.arange(1, 401), steps_per_s=100.0 / np.arange(1, 401) ** 0.7)

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def run(tiny_verifier_v8):
    drafter = build_drafter("dspark", tiny_verifier_v8, torch.Generator().manual_seed(5), num_layers=1, std=0.1)
    rng = np.random.default_rng(3)
    n = 6
    workload = Workload(arrival_at=np.sort(rng.uniform(0, 0.02, n)), prompt_tokens=rng.integers(20, 60, n),
                        output_tokens=rng.integers(2, 8, n), domain=np.array(["chat", "code", "math"] * 2))
    limits = EngineLimits(3, 400, max_num_batched_tokens=BUDGET)
    spec = ServingSpec(make_policy("greedy"), gamma=3, traffic=workload, limits=limits, duration_s=None, seed=2,
                       prefill="chunked")
    return serve(spec, ServingModels(tiny_verifier_v8, drafter, random_prompts(8), COST, "v8"))


def test_each_request_s_chunks_sum_to_its_prompt_over_running_contexts(run) -> None:
    chunks, req = run.chunks, run.requests
    assert tuple(chunks.columns) == CHUNK_COLUMNS and len(req) == 6
    assert (req["prompt_tokens"] > BUDGET).all()  # every prompt is split
    for rid, mine in chunks.groupby("request_id"):
        assert mine["step"].is_monotonic_increasing and mine["step"].is_unique  # one chunk per step, in order
        sizes = mine["chunk_tokens"].to_numpy()
        assert sizes.sum() == req.loc[req["request_id"] == rid, "prompt_tokens"].item()
        assert mine["context_tokens"].tolist() == (np.cumsum(sizes) - sizes).tolist()  # computed before each
    assert sorted(chunks["request_id"].unique()) == sorted(req["request_id"])


def test_chunks_add_up_to_their_steps(run) -> None:
    steps, chunks, req = run.steps, run.chunks, run.requests
    per_step = chunks.groupby("step")["chunk_tokens"].agg(["sum", "size"]).reindex(steps.index, fill_value=0)
    assert per_step["sum"].tolist() == steps["prefill_tokens"].tolist()
    assert per_step["size"].tolist() == steps["num_prefill_requests"].tolist()
    assert (steps["batch_tokens"] + steps["prefill_tokens"] <= BUDGET).all()
    assert (steps["num_requests"] == 0).any()  # some steps ran chunks alone
    by_request = chunks.groupby("request_id")["step"].agg(["min", "max"])
    for rid, first, last in zip(by_request.index, by_request["min"], by_request["max"], strict=True):
        row = req[req["request_id"] == rid].iloc[0]
        assert steps.loc[first, "start_at"] == row["prefill_start_at"]
        assert steps.loc[last, "end_at"] == row["first_token_at"]


def test_a_chunked_run_is_priced_with_its_chunks(run) -> None:
    chunk = ChunkAttentionBlock((0, 64), (1, 64), ((1e-6, 1e-4), (2e-6, 3e-4)))
    raw = Version2Blocks(attention=linear_attention(key_padding="longest"), chunk_attention=chunk).apply(
        load_profile("h200_qwen3-8b_analytic").raw)
    profile = profile_from_dict(raw, "chunk-log.json")
    ratio = step_cost_ratio([run.steps], profile, "dspark", "greedy", 3, 0.0, True, [run.chunks])
    assert np.isfinite(ratio) and ratio > 0
    with pytest.raises(ValueError, match="no chunks table"):
        step_cost_ratio([run.steps], profile, "dspark", "greedy", 3, 0.0, True)
