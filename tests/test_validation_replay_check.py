"""calibration.validation.replay_check: the simulator's walk of an acceptance log against real decoding."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from calibration.validation.replay_check import compare, main, replayed_steps, steps_to
from calibration.validation.setup import ValidationConfig, build_models, record_log

TOKENS = 16


@pytest.fixture(scope="module")
def logs() -> tuple[pd.DataFrame, pd.DataFrame]:
    """(a log decoded as the serving loop decodes, a dense log) of the same prompts: random tiny models, mtp3."""
    cfg = replace(ValidationConfig(), models="random", log_requests=3, output_tokens=TOKENS, gamma=3)
    models = build_models(cfg)
    return (record_log(cfg, models, 3, TOKENS, max_kept_tokens=None), record_log(cfg, models, 3, TOKENS))


def test_walking_a_log_of_the_real_decoding_retraces_it_step_for_step(logs) -> None:
    real, _ = logs
    taken = steps_to(real, TOKENS)
    assert len(taken) == 9 and (taken >= TOKENS / 4).all()  # at most 1 + 3 tokens a step
    pd.testing.assert_series_equal(replayed_steps(real, 3, TOKENS, dense=False).sort_index(), taken.sort_index(),
                                   check_names=False)


def test_a_dense_walk_covers_every_request_and_refuses_a_log_that_is_not_dense(logs) -> None:
    real, dense = logs
    walked = replayed_steps(dense, 3, TOKENS)
    assert sorted(walked.index) == sorted(steps_to(real, TOKENS).index)
    assert ((walked >= TOKENS / 4) & (walked <= TOKENS)).all()
    # a dense log keeps one token a step: a block at each of the first TOKENS output positions
    assert (steps_to(dense, TOKENS) == TOKENS).all()
    with pytest.raises(ValueError, match="needs a dense log"):
        replayed_steps(real, 3, TOKENS)


def test_compare_pairs_the_requests_by_prompt() -> None:
    index = pd.MultiIndex.from_tuples([("chat", 0), ("chat", 1), ("math", 0)], names=["domain", "request_id"])
    real = pd.Series([4, 8, 2], index=index)  # 4, 2 and 8 tokens per step for 16 tokens
    replayed = pd.Series([4, 4, 2], index=index)  # 4, 4, 8
    table = compare(real, replayed, 16).set_index("domain")
    chat = table.loc["chat"]
    assert chat["requests"] == 2
    assert chat["real_tokens_per_step"] == pytest.approx(3.0)
    assert chat["replay_tokens_per_step"] == pytest.approx(4.0)
    assert chat["replay_err"] == pytest.approx(1 / 3)
    assert chat["replay_err_se"] == pytest.approx(np.std([0.0, 2.0], ddof=1) / np.sqrt(2) / 3)
    assert table.loc["math", "replay_err"] == pytest.approx(0.0)
    assert table.loc["all", "requests"] == 3
    assert table.loc["all", "replay_err"] == pytest.approx((2 / 3) / (14 / 3))


@pytest.mark.parametrize("flag", ["--requests", "--tokens", "--draft"])
def test_the_command_refuses_sizes_below_one(flag: str, capsys) -> None:
    with pytest.raises(SystemExit):
        main([flag, "0"])
    assert f"{flag} must be >= 1, got 0" in capsys.readouterr().err


def test_the_command_reports_the_validations_own_checks_in_one_line(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--prompt-tokens", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("error: prompt_tokens, output_tokens, log_requests, gamma and rounds must be >= 1")
