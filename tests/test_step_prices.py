"""The real loop's steps priced as the simulator prices them, prefill chunks included.

* steps with decoding requests and chunks, chunks alone or no chunks: the price is the simulator's
  :class:`simulator.costs.StepPricer` of the same step (drafter at the padded context, per-request work counting
  chunks, decode attention, chunk attention at each chunk's computed-before context);
* a step with prefill tokens needs its chunks, and the chunks must add up to the step's prefill columns;
* the cost ratio counts steps of chunks alone; the per-step breakdown runs on a validation-like folder.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from calibration.profiling.step_prices import breakdown, main, price_parts, priced_steps_s, step_cost_ratio
from policies import make_policy
from simulator.costs import ChunkAttentionBlock, ContextDraftTable, Version2Blocks, load_profile, profile_from_dict
from simulator.costs.step_cost import StepPricer
from tests.cost_factories import linear_attention

GAMMA = 7
# (decoding requests' contexts, each one's verified draft tokens, chunks as (computed-before context, tokens))
STEPS = [
    ([1000, 3000, 8000], 7, [(2000, 300), (0, 100)]),  # mixed: three decoding requests, a partial and a new chunk
    ([500], 0, [(0, 900)]),  # one request verifying nothing, one new prompt
    ([], 0, [(4000, 1000), (0, 24)]),  # chunks alone (nobody decoding): no drafter, no decision
    ([1200, 1500, 2500, 6000], 2, []),  # no chunks, as in a disaggregated run
    ([64, 64], 3, [(120, 1)]),  # a one-token chunk
]


def _profile(padding: str, raw: bool = False, decode_token_s: float = 0.0, chunk_draft_share: float = 0.0):
    """A version-2 profile with per-request work, query padding, an inline scheduler, attention, chunk attention
    and a context-aware drafter, all padding keys as ``padding`` says, and ``decode_token_s`` per decode token;
    ``chunk_draft_share`` of each chunk's attention is the drafter's (``prefill.chunk_attention.draft_s``)."""
    base = load_profile("h200_qwen3-8b_analytic")
    grid = (((1e-3, 2e-3), (2e-3, 4e-3)), ((3e-3, 4e-3), (4e-3, 6e-3)))  # [context][R][gamma]
    draft = ContextDraftTable((0, 100000), (1, 64), (1, 8), grid, key_padding=padding)  # type: ignore[arg-type]
    # quadratic in the chunk, growing with the context: interpolation between points is not linear in the sum
    per_chunk_s = ((1e-6, 1e-4, 3e-3), (2e-6, 2e-4, 5e-3), (5e-6, 6e-4, 1.2e-2))
    draft_s = tuple(tuple(chunk_draft_share * v for v in row) for row in per_chunk_s) if chunk_draft_share else None
    chunk = ChunkAttentionBlock((0, 1000, 5000), (1, 100, 1000), per_chunk_s, draft_s)
    data = Version2Blocks(attention=linear_attention(key_padding=padding), chunk_attention=chunk,
                          draft={"dspark": draft}).apply(base.raw)
    data["verify"]["padded_slot_s"] = 3e-6
    data["scheduler"]["inline"] = True
    if decode_token_s:
        data["verify"]["decode_token_s"] = decode_token_s
    return data if raw else profile_from_dict(data, "chunk-prices.json")


def _tables(table: list = STEPS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The steps table and chunks table the real loop would write for ``table`` (:data:`STEPS`)."""
    steps, chunks = [], []
    for i, (contexts, length, step_chunks) in enumerate(table):
        r = len(contexts)
        steps.append({"num_requests": r, "batch_tokens": r * (1 + length), "max_verified_tokens": length,
                      "context_tokens": sum(contexts), "max_context_tokens": max(contexts, default=0),
                      "prefill_tokens": sum(n for _, n in step_chunks), "num_prefill_requests": len(step_chunks)})
        chunks += [{"step": i, "request_id": 10 * i + k, "context_tokens": c, "chunk_tokens": n}
                   for k, (c, n) in enumerate(step_chunks)]
    return pd.DataFrame(steps), pd.DataFrame(chunks)


def _simulator_prices(profile, policy, table: list = STEPS) -> list[float]:
    """What the simulator's engine charges each step of ``table`` (its own pricer, as ``DecodeEngine._plan``)."""
    pricer = StepPricer(profile, profile, policy, "dspark", policy.draft_tokens(GAMMA))
    prices = []
    for contexts, length, step_chunks in table:
        r = len(contexts)
        ctx = np.array(contexts, dtype=np.int64) if r else None
        lengths = np.full(r, length, dtype=np.int64)
        draft_s = sched_s = 0.0
        if r:
            draft_s, sched_s, _ = pricer.before_decision(r, ctx)
        chunk_ctx = np.array([c for c, _ in step_chunks], dtype=np.int64)
        chunk_tokens = np.array([n for _, n in step_chunks], dtype=np.int64)
        cost = pricer.verify(lengths, r * (1 + length), ctx, chunk_ctx, chunk_tokens, False)
        prices.append(draft_s + sched_s + cost.verify_s)
    return prices


@pytest.mark.parametrize("decode_token_s", [0.0, 1e-5])  # host work per decode token: none, or 10 us
@pytest.mark.parametrize("padding", ["longest", "none"])  # keys padded to the batch's longest context, or not
def test_steps_with_chunks_are_priced_as_the_simulator_prices_them(padding: str, decode_token_s: float) -> None:
    profile, policy = _profile(padding, decode_token_s=decode_token_s), make_policy("greedy")
    steps, chunks = _tables()
    priced = priced_steps_s(steps, profile, "dspark", policy.name, GAMMA, policy.synchronous, chunks)
    assert priced.tolist() == pytest.approx(_simulator_prices(profile, policy), rel=1e-12)
    parts = price_parts(steps, profile, "dspark", policy.name, GAMMA, policy.synchronous, chunks)
    assert parts.loc[2, "draft_s"] == 0.0 and parts.loc[2, "sched_s"] == 0.0  # chunks alone: the target only
    # the chunks' contexts matter: the same chunks priced over no computed tokens cost less
    flat = priced_steps_s(steps, profile, "dspark", policy.name, GAMMA, policy.synchronous,
                          chunks.assign(context_tokens=0))
    assert flat[0] < priced[0] and flat[2] < priced[2] and flat[1] == priced[1]


def test_a_policy_that_drafts_nothing_leaves_out_the_drafters_part_of_each_chunk() -> None:
    """``prefill.chunk_attention.draft_s``: the real loop builds no drafter context over the chunks of a policy that
    drafts nothing, and the simulator and the step prices leave that part out for it alone."""
    steps, chunks = _tables()
    plain_table = [(contexts, 0, step_chunks) for contexts, _, step_chunks in STEPS]  # none verifies no draft token
    plain_steps, plain_chunks = _tables(plain_table)
    whole, shared = _profile("longest"), _profile("longest", chunk_draft_share=0.4)
    assert shared.chunk_draft is not None and whole.chunk_draft is None
    for name, table, (logged, logged_chunks) in (("greedy", STEPS, (steps, chunks)),
                                                  ("none", plain_table, (plain_steps, plain_chunks))):
        policy = make_policy(name)
        priced = priced_steps_s(logged, shared, "dspark", name, policy.draft_tokens(GAMMA), policy.synchronous,
                                logged_chunks)
        assert priced.tolist() == pytest.approx(_simulator_prices(shared, policy, table), rel=1e-12)
    args = ("dspark", "greedy", GAMMA, True, chunks)
    np.testing.assert_array_equal(priced_steps_s(steps, shared, *args), priced_steps_s(steps, whole, *args))
    none_args = ("dspark", "none", 0, False, plain_chunks)
    saved = priced_steps_s(plain_steps, whole, *none_args) - priced_steps_s(plain_steps, shared, *none_args)
    chunk_s = [whole.chunk_attention_s(np.array([c for c, _ in step]), np.array([n for _, n in step]))
               for _, _, step in STEPS]
    np.testing.assert_allclose(saved, 0.4 * np.array(chunk_s), rtol=1e-9, atol=1e-15)
    assert saved[0] > 0 and saved[3] == 0.0  # a step without chunks is priced as before


def test_the_host_work_per_decode_token_is_charged_on_decode_tokens_only() -> None:
    steps, chunks = _tables()
    plain = priced_steps_s(steps, _profile("longest"), "dspark", "greedy", GAMMA, True, chunks)
    charged = priced_steps_s(steps, _profile("longest", decode_token_s=1e-5), "dspark", "greedy", GAMMA, True, chunks)
    # decode tokens per step: 3 x 8, 1 x 1, none (chunks alone), 4 x 3, 2 x 4; the 2,325 chunk tokens pay nothing
    np.testing.assert_allclose(charged - plain, 1e-5 * np.array([24, 1, 0, 12, 8]), rtol=1e-9, atol=1e-15)


def test_a_padded_drafter_is_read_at_the_batch_longest_context() -> None:
    profile = _profile("longest")
    steps, chunks = _tables()
    parts = price_parts(steps, profile, "dspark", "greedy", GAMMA, True, chunks)
    assert parts.loc[0, "draft_s"] == pytest.approx(profile.draft_s("dspark", 3, GAMMA, 8000.0))
    assert parts.loc[0, "draft_s"] > profile.draft_s("dspark", 3, GAMMA, 4000.0)  # not at the mean


def test_steps_with_prefill_tokens_need_matching_chunks() -> None:
    profile = _profile("longest")
    steps, chunks = _tables()
    with pytest.raises(ValueError, match="steps have prefill chunks .* but no chunks table was given"):
        priced_steps_s(steps, profile, "dspark", "greedy", GAMMA)
    with pytest.raises(ValueError, match=r"step 1: the chunks table has 1 chunks of 899 tokens, the steps table "
                                         r"says 1 of 900"):
        priced_steps_s(steps, profile, "dspark", "greedy", GAMMA, chunks=chunks.assign(
            chunk_tokens=np.where(chunks["step"] == 1, 899, chunks["chunk_tokens"])))
    # steps without prefill tokens need no chunks table (a disaggregated run's steps)
    plain = steps[steps["prefill_tokens"] == 0]
    assert priced_steps_s(plain, profile, "dspark", "greedy", GAMMA).size == 1


def _timeline(steps: pd.DataFrame, priced: np.ndarray, factor: np.ndarray) -> pd.DataFrame:
    """``steps`` one after the other, step k's cycle ``factor[k] * priced[k]`` (the first has no previous end)."""
    cycle = priced * factor
    end = 1.0 + np.cumsum(cycle)
    return steps.assign(start_at=end - cycle, end_at=end, wait_s=0.0, draft_s=0.5 * cycle)


def test_the_cost_ratio_counts_steps_of_chunks_alone() -> None:
    profile = _profile("longest")
    steps, chunks = _tables()
    priced = priced_steps_s(steps, profile, "dspark", "greedy", GAMMA, True, chunks)
    factor = np.where(steps["num_requests"] == 0, 2.0, 1.0)  # the step of chunks alone took twice its price
    timed = _timeline(steps, priced, factor)
    want = (priced[1:] * factor[1:]).sum() / priced[1:].sum()
    assert step_cost_ratio([timed], profile, "dspark", "greedy", GAMMA, 0.0, True, [chunks]) == pytest.approx(want)
    assert want > 1.05


def test_breakdown_of_a_validation_folder(tmp_path, capsys) -> None:
    (tmp_path / "profile.json").write_text(json.dumps(_profile("longest", raw=True)))
    profile = load_profile(tmp_path / "profile.json")
    steps, chunks = _tables()
    priced = priced_steps_s(steps, profile, "dspark", "greedy", GAMMA, True, chunks)
    factor = np.where(steps["prefill_tokens"] > 0, 1.2, 1.0)  # steps with chunks 20% above their price
    slices = [_timeline(steps, priced, factor).assign(slice=k) for k in range(2)]
    pd.concat(slices, ignore_index=True).to_parquet(tmp_path / "real_greedy_u4_steps.parquet")
    pd.concat([chunks.assign(slice=k) for k in range(2)], ignore_index=True).to_parquet(
        tmp_path / "real_greedy_u4_chunks.parquet")
    row = breakdown(tmp_path, "dspark", GAMMA, 0.0).iloc[0]
    assert (row["policy"], row["users"], row["slices"], row["steps"], row["chunk_steps"], row["chunk_only_steps"]) \
        == ("greedy", 4, 2, 8, 6, 2)  # the first step of each slice has no previous end
    assert row["chunk_steps_real/priced"] == pytest.approx(1.2) and row["other_steps_real/priced"] == pytest.approx(1.0)
    # the settings come from the folder's config.json; --kept-only keeps the slices slices.csv kept
    (tmp_path / "config.json").write_text(json.dumps({"drafter": "dspark", "gamma": GAMMA, "warmup_s": 0.0}))
    pd.DataFrame({"policy": "greedy", "num_users": 4, "slice": [0, 1], "kept": [False, True]}).to_csv(
        tmp_path / "slices.csv", index=False)
    main([str(tmp_path), "--kept-only"])
    printed = capsys.readouterr().out
    assert "warm-up 0 s per slice, slices the validation kept" in printed and "chunk_steps_real/priced" in printed
    assert breakdown(tmp_path, "dspark", GAMMA, 0.0, kept_only=True).loc[0, ["slices", "steps"]].tolist() == [1, 4]
    assert "1.200" in printed
    (tmp_path / "real_greedy_u4_chunks.parquet").unlink()  # a chunked run's steps cannot be priced without them
    with pytest.raises(ValueError, match="no chunks table"):
        breakdown(tmp_path, "dspark", GAMMA, 0.0)
