"""Acceptance logs replayed in order: the decoded_tokens column, dense logs and the walk through a logged request."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from policies import make_policy
from simulator import ClusterSpec, DrafterSpec, EngineLimits, SimulationSpec, simulate
from simulator.acceptance.logs import AcceptanceRecorder, LogError, read_log, to_blocks, write_log
from simulator.acceptance.replay import LoggedAcceptance
from simulator.costs import load_profile
from tests.log_factories import synthetic_log
from traces.workload import DOMAINS, Workload

GAMMA = 7


def dense_log(accepted: np.ndarray, domain: str = "chat", request_ids: range | None = None) -> pd.DataFrame:
    """A dense log: accepted[r, p] accepted draft tokens for request r at output position p (every position)."""
    num_requests, num_positions = accepted.shape
    ids = range(num_requests) if request_ids is None else request_ids
    recorder = AcceptanceRecorder("dspark", domain, GAMMA, ids)
    for p in range(num_positions):
        confidence = np.full((num_requests, GAMMA), 0.5) + 0.01 * p / num_positions
        recorder.record(np.full(num_requests, GAMMA), accepted[:, p], confidence, np.full((num_requests, GAMMA), 0.5),
                        np.full((num_requests, GAMMA), 0.5), None, np.full(num_requests, p))
    return recorder.frame()


def cliff_log(easy_until: int = 10, positions: int = 64) -> pd.DataFrame:
    """Every request of every domain accepts the whole block before ``easy_until`` tokens and nothing after."""
    accepted = np.where(np.arange(positions) < easy_until, GAMMA, 0)[None, :].repeat(4, axis=0)
    return pd.concat([dense_log(accepted, d) for d in DOMAINS], ignore_index=True)


def test_recorder_writes_decoded_tokens_and_reading_keeps_them(tmp_path):
    log = cliff_log()
    path = write_log(log, tmp_path / "dense.parquet")
    blocks = to_blocks(read_log(path))
    assert blocks.decoded_tokens.min() == 0 and blocks.decoded_tokens.max() == 63
    # A log without the column reads as unknown positions.
    legacy = tmp_path / "legacy.parquet"
    log.drop(columns="decoded_tokens").to_parquet(legacy)
    assert (to_blocks(read_log(legacy)).decoded_tokens == -1).all()


def _break(df: pd.DataFrame, row: int, value: object) -> pd.DataFrame:
    out = df.astype({"decoded_tokens": "object"})
    out.loc[row, "decoded_tokens"] = value
    return out


@pytest.mark.parametrize("mutate, message", [
    (lambda df: _break(df, 3, 5), "same at every position of a block"),  # one position of block 0 disagrees
    (lambda df: _break(df, 0, -2), "must be >= 0"),
    # block 1 of request 0 (rows 7..13 in step order) goes back to position 0
    (lambda df: df.assign(decoded_tokens=np.where(df["step"] == 1, 0, df["decoded_tokens"])), "grow from one step"),
    (lambda df: df.assign(decoded_tokens=df["decoded_tokens"].where(df["step"] != 2)), "all or none"),
])
def test_bad_decoded_tokens_name_the_column(tmp_path, mutate, message):
    path = tmp_path / "bad.parquet"
    log = dense_log(np.zeros((2, 4), dtype=np.int64))
    mutate(log).to_parquet(path)
    with pytest.raises(LogError, match=message) as err:
        read_log(path)
    assert "decoded_tokens" in str(err.value) and str(path) in str(err.value)


def test_order_auto_walks_dense_logs_only():
    assert LoggedAcceptance(cliff_log()).order == "walk"
    sparse = synthetic_log(np.random.default_rng(1), num_requests=20, num_tokens=30)  # mtp7 steps, no positions
    assert LoggedAcceptance(sparse).order == "independent"
    with pytest.raises(LogError, match="needs the decoded_tokens column"):
        LoggedAcceptance(sparse, order="walk")
    with pytest.raises(ValueError, match="order must be"):
        LoggedAcceptance(cliff_log(), order="sorted")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="log_order must be"):
        DrafterSpec(log_order="sorted")


def test_walk_returns_the_block_logged_at_each_position():
    rng = np.random.default_rng(0)
    accepted = rng.integers(0, GAMMA + 1, size=(3, 40))
    model = LoggedAcceptance(dense_log(accepted))
    chat = np.full(6, DOMAINS.index("chat"))
    difficulty = np.array([0.0, 0.4, 0.9, 0.0, 0.4, 0.9])  # logged requests 0, 1, 2, 0, 1, 2
    decoded = np.array([0, 5, 39, 17, 0, 12])
    conf, got = model.sample_step(rng, chat, difficulty, 3, decoded)
    expected = accepted[[0, 1, 2, 0, 1, 2], decoded]
    np.testing.assert_array_equal(got, np.minimum(expected, 3))
    np.testing.assert_allclose(conf[:, 0], 0.5 + 0.01 * decoded / 40)
    with pytest.raises(ValueError, match="needs each request's decoded_tokens"):
        model.sample_step(rng, chat, difficulty, 3)
    covered = 39 + accepted[0, 39]  # the last block (position 39) reaches this far
    with pytest.raises(ValueError, match=rf"output position 48 .* covers positions 0\.\.{covered};"):
        model.sample_step(rng, chat[:1], difficulty[:1], 3, np.array([48]))


def test_walk_follows_the_logged_text_through_the_simulator(tmp_path):
    """Requests accept whole blocks for their first 10 decoded tokens and nothing after: mtp7 takes exactly
    2 steps of 8 tokens, then one step per token; an independent replay would mix the two regimes."""
    profile = load_profile("h200_qwen3-8b_analytic")
    workload = Workload(arrival_at=np.zeros(12), prompt_tokens=np.full(12, 100), output_tokens=np.full(12, 31),
                        domain=np.array(DOMAINS * 4))
    path = str(write_log(cliff_log(), tmp_path / "cliff.parquet"))
    spec_for = {}
    for order in ("walk", "independent"):
        spec_for[order] = SimulationSpec(
            policy=make_policy("mtp7"), profile=profile, traffic=workload, duration_s=None, warmup_s=0.0, seed=1,
            drafter=DrafterSpec("dspark", GAMMA, log=path, log_order=order),
            cluster=ClusterSpec(limits=EngineLimits(max_concurrency=16)))
    walked = simulate(spec_for["walk"]).requests
    # 30 decoded tokens: 8 + 8 from positions 0 and 8, then positions 16..29 one token each.
    assert (walked["num_steps"] == 2 + 14).all()
    assert (walked["num_accepted_tokens"] == 2 * GAMMA).all()
    independent = simulate(spec_for["independent"]).requests
    assert not (independent["num_steps"] == 16).all()

