"""Acceptance logs: format round trip, clear errors, replay in the simulator and fitted presets."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from calibration.acceptance.fit_preset import fit_curve, fit_preset
from simulator.acceptance.curves import AcceptanceCurve
from simulator.acceptance.logs import (
    AcceptanceRecorder,
    LogError,
    conditional_acceptance,
    read_log,
    summary,
    tau_standard_error,
    to_blocks,
    write_log,
)
from simulator.acceptance.parametric import AcceptanceModel
from simulator.acceptance.preset_file import PresetError
from simulator.acceptance.presets import PRESETS
from simulator.acceptance.replay import LoggedAcceptance
from tests.log_factories import synthetic_log
from traces.workload import DOMAINS


@pytest.fixture(scope="module")
def log() -> pd.DataFrame:
    return synthetic_log(np.random.default_rng(2024), num_requests=150, num_tokens=60)


def one_step_log() -> pd.DataFrame:
    """Three requests, gamma 4: rejected at 3, all 4 accepted, only 2 verified (both accepted: censored)."""
    rec = AcceptanceRecorder("dspark", "chat", 4, [10, 11, 12])
    conf = np.array([[0.9, 0.8, 0.7, 0.6], [0.95, 0.9, 0.85, 0.8], [0.5, 0.4, 0.3, 0.2]])
    analytic = np.full((3, 4), 0.75)
    rec.record(np.array([4, 4, 2]), np.array([2, 4, 2]), conf, conf / 2, analytic)
    return rec.frame()


def test_recorder_rows_follow_the_null_rules():
    df = one_step_log()
    acc = df["accepted"].astype("object").where(df["accepted"].notna(), None).tolist()
    assert acc == [True, True, False, None,  # request 10: rejected at position 3, null after
                   True, True, True, True,  # request 11: every position accepted
                   True, True, None, None]  # request 12: positions 3-4 not verified
    assert df["verified"].tolist() == [True] * 8 + [True, True, False, False]
    assert df["analytic_acceptance"].isna().tolist() == [False] * 10 + [True, True]


def test_log_round_trip(tmp_path, log):
    path = write_log(log, tmp_path / "log.parquet")
    back = read_log(path)
    pd.testing.assert_frame_equal(back, log, check_dtype=True)
    assert summary(back).equals(summary(log))


def test_summary_tau_and_conditional_acceptance():
    blocks = to_blocks(one_step_log())
    np.testing.assert_array_equal(blocks.num_accepted, [2, 4, 2])
    np.testing.assert_array_equal(blocks.censored, [False, False, True])
    # accepted counts 2, 4 (request 12 is censored and ignored): q1 = q2 = 1, q3 = 1/2, q4 = 1
    np.testing.assert_allclose(conditional_acceptance(np.array([2, 4]), 4), [1.0, 1.0, 0.5, 1.0])


def test_tau_standard_error_is_the_per_request_means_error_when_requests_have_equal_blocks(log):
    """With as many blocks in every request, the ratio estimator is the mean of the per-request means, and its
    standard error their sample standard deviation over sqrt(n), exactly; one request has none."""
    request_id = np.repeat(np.arange(5), 4)
    tokens = np.array([1, 2, 3, 4, 2, 2, 2, 2, 8, 1, 1, 2, 3, 3, 3, 3, 1, 1, 1, 5], dtype=np.float64)
    means = tokens.reshape(5, 4).mean(axis=1)
    assert tau_standard_error(request_id, tokens) == pytest.approx(np.std(means, ddof=1) / np.sqrt(5), rel=1e-12)
    assert np.isnan(tau_standard_error(np.zeros(4, dtype=np.int64), tokens[:4]))
    # the summary's column is the same figure over a domain's fully verified blocks
    blocks = to_blocks(log[log["domain"] == "code"])
    expected = tau_standard_error(blocks.request_id, 1.0 + blocks.num_accepted)
    assert summary(log).set_index("domain").loc["code", "tau_se"] == pytest.approx(expected, rel=1e-12)


def test_tau_standard_error_matches_the_spread_of_tau_over_samples_of_requests():
    """Requests of persistent ease and unequal lengths (blocks within a request correlated): over 4000 samples of
    40 requests, the standard error's mean is the standard deviation of tau within 5% (the sample's own error
    is about 1.1%), while the error of independent blocks would be several times too small."""
    rng = np.random.default_rng(11)
    num_samples, num_requests = 4000, 40
    blocks = rng.integers(5, 60, size=(num_samples, num_requests))  # blocks per request
    ease = 2.0 + rng.standard_normal((num_samples, num_requests))  # persistent per request
    taus, ses, naive = [], [], []
    for s in range(num_samples):
        request_id = np.repeat(np.arange(num_requests), blocks[s])
        tokens = ease[s][request_id] + 0.5 * rng.standard_normal(request_id.size)
        taus.append(tokens.mean())
        ses.append(tau_standard_error(request_id, tokens))
        naive.append(np.std(tokens, ddof=1) / np.sqrt(tokens.size))
    assert np.mean(ses) / np.std(taus, ddof=1) == pytest.approx(1.0, abs=0.05)
    assert np.mean(naive) < 0.4 * np.std(taus, ddof=1)


def _break(df: pd.DataFrame, column: str, row: int, value) -> pd.DataFrame:
    out = df.copy()
    out[column] = out[column].astype("object")
    out.loc[row, column] = value
    return out


@pytest.mark.parametrize("mutate, message", [
    (lambda df: df.drop(columns=["accepted"]), "missing column(s) ['accepted']"),
    (lambda df: _break(df, "accepted", 3, True), "column 'accepted', row 3"),  # set after the rejection at 3
    (lambda df: _break(df, "accepted", 1, None), "column 'accepted', row 1"),  # null before any rejection
    (lambda df: _break(df, "confidence", 5, 1.5), "column 'confidence', row 5"),  # not a probability
    (lambda df: _break(df, "position", 2, 2), "column 'position', row"),  # position 2 twice in one block
    (lambda df: _break(df, "position", 0, 9), "column 'position', row 0"),  # beyond gamma
    (lambda df: _break(df.astype({"confidence": str}), "confidence", 4, "high"), "column 'confidence', row 4"),
    (lambda df: _break(df, "step", 6, 1.5), "column 'step', row 6"),  # not an integer
])
def test_bad_logs_name_file_column_and_row(tmp_path, mutate, message):
    path = tmp_path / "bad.parquet"
    mutate(one_step_log()).to_parquet(path)
    with pytest.raises(LogError) as err:
        read_log(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_replay_refuses_censored_logs_and_unknown_drafters(log):
    with pytest.raises(LogError, match="verified fewer than gamma"):
        LoggedAcceptance(one_step_log())
    with pytest.raises(LogError, match="no drafter 'eagle3'"):
        LoggedAcceptance(log, drafter="eagle3")



def test_replay_never_switches_its_confidence_column_silently(log):
    """One null confidence among thousands of rows is an error that names the row, not a switch to draft_prob."""
    holed = log.copy()
    holed.loc[holed.index[5], "confidence"] = None
    with pytest.raises(LogError, match=r"1 null confidence value\(s\).*drafter.log_confidence=draft_prob"):
        LoggedAcceptance(holed)
    # Asking for the other column explicitly replays it, and the source says so.
    assert LoggedAcceptance(holed, confidence_column="draft_prob").describe()["confidence_column"] == "draft_prob"
    # A drafter with no head at all logs no confidence: auto takes draft_prob and records it.
    headless = log.assign(confidence=None)
    assert LoggedAcceptance(headless).describe()["confidence_column"] == "draft_prob"
    described = LoggedAcceptance(log).describe()
    assert described["source"] == "log" and described["confidence_column"] == "confidence"

def replay_until_done(model: LoggedAcceptance | AcceptanceModel, rng: np.random.Generator, domain: str,
                      num_requests: int, num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Simulate requests to ``num_tokens`` tokens each (as the log was recorded) -> accepted counts, request of step."""
    domain_idx = np.full(num_requests, DOMAINS.index(domain))
    difficulty = model.request_difficulty(rng, num_requests)
    produced = np.zeros(num_requests, dtype=np.int64)
    counts, owners = [], []
    while (active := np.flatnonzero(produced < num_tokens)).size:
        _, accepted = model.sample_step(rng, domain_idx[active], difficulty[active], model.gamma)
        produced[active] += accepted + 1
        counts.append(accepted)
        owners.append(active)
    return np.concatenate(counts), np.concatenate(owners)


@pytest.mark.parametrize("domain", DOMAINS)
def test_replay_reproduces_tau_and_position_acceptance(log, domain):
    model = LoggedAcceptance(log)
    expected = summary(log).set_index("domain").loc[domain]
    counts, _ = replay_until_done(model, np.random.default_rng(7), domain, 6000, 60)
    assert 1.0 + counts.mean() == pytest.approx(expected["tau"], abs=0.06)
    q = conditional_acceptance(counts, 7)
    np.testing.assert_allclose(q, expected[[f"q{k}" for k in range(1, 8)]].to_numpy(float), atol=0.025)


def test_replay_keeps_request_persistence(log):
    """Steps of one simulated request share a logged request: their accepted counts correlate as in the log."""
    model = LoggedAcceptance(log)
    rng = np.random.default_rng(3)
    blocks = to_blocks(log[log["domain"] == "chat"])
    logged_means = pd.Series(blocks.num_accepted).groupby(blocks.request_id).mean()
    counts, owners = replay_until_done(model, rng, "chat", 2000, 200)
    replay_means = pd.Series(counts).groupby(owners).mean()
    # Between-request spread of the mean accepted count: large in the log and in the replay.
    assert replay_means.std() == pytest.approx(logged_means.std(), rel=0.25)
    # Without persistence (a fresh quantile every step) the spread of 200-token requests collapses.
    difficulty = model.request_difficulty(rng, 2000)
    fresh = [model.sample_step(rng, np.full(2000, 2), model.request_difficulty(rng, 2000), 7)[1] for _ in range(30)]
    assert np.mean(fresh, axis=0).std() < 0.5 * replay_means.std()
    same = [model.sample_step(rng, np.full(2000, 2), difficulty, 7)[1] for _ in range(2)]
    assert np.corrcoef(same[0], same[1])[0, 1] > 0.2


def test_replay_fewer_and_more_positions_than_logged(log):
    rng = np.random.default_rng(5)
    model = LoggedAcceptance(log)
    conf, accepted = model.sample_step(rng, np.zeros(500, dtype=np.int64), model.request_difficulty(rng, 500), 3)
    assert conf.shape == (500, 3) and accepted.max() <= 3
    with pytest.raises(ValueError, match="exceeds the logged gamma=7"):
        LoggedAcceptance(log, gamma=10)
    chained = LoggedAcceptance(log, gamma=10, beyond_logged="chain")
    conf, accepted = chained.sample_step(rng, np.zeros(5000, dtype=np.int64), chained.request_difficulty(rng, 5000),
                                         10)
    assert conf.shape == (5000, 10) and accepted.max() == 10 and (accepted >= 7).mean() > (accepted == 10).mean()


def test_fit_curve_recovers_a_preset_family_curve():
    curve = AcceptanceCurve.family(0.88, 0.7641, 1.0, 0.98)  # dflash math
    fitted = fit_curve(curve.conditional(9))
    np.testing.assert_allclose(fitted.conditional(9), curve.conditional(9), atol=1e-6)


def test_fit_curve_matches_tau_of_a_non_monotone_curve():
    q = np.array([0.55, 0.42, 0.43, 0.46, 0.56, 0.67, 0.73])  # dips then rises, as DFlash on chat
    fitted = fit_curve(q)
    assert fitted.tau() == pytest.approx(1.0 + np.cumprod(q).sum(), abs=1e-9)
    assert np.abs(fitted.conditional(7) - q).max() < 0.15


def test_fitted_preset_reproduces_the_log(log, monkeypatch):
    fitted = fit_preset(log)
    table = fitted.table()
    np.testing.assert_allclose(table["tau_fit"], table["tau_log"], atol=1e-6)  # tau pinned exactly
    assert table["max_abs_q_error"].max() < 0.04  # family misfit + sampling noise of ~2000 blocks
    assert 0.6 < fitted.auc < 0.95  # the synthetic confidence is informative
    name = "synthetic-log-dspark"
    monkeypatch.setitem(PRESETS, name, None)  # so that teardown removes the name again
    del PRESETS[name]
    assert fitted.install(name) == name
    assert fitted.install(name) == name  # the same curves again: fine
    with pytest.raises(PresetError, match="already installed with other curves"):
        fit_preset(log[log["domain"] == "chat"]).install(name)
    with pytest.raises(PresetError, match="is a built-in preset"):
        fitted.install("qwen3-8b_dspark")
    model = AcceptanceModel(name, 7, confidence=fitted.confidence_spec())
    rng = np.random.default_rng(11)
    for domain, tau in fitted.tau.items():
        # Both the log and the presets count steps of requests decoded to a fixed length.
        accepted, _ = replay_until_done(model, rng, domain, 4000, 60)
        assert 1.0 + accepted.mean() == pytest.approx(tau, abs=0.05)
        q = conditional_acceptance(accepted, 7)
        np.testing.assert_allclose(q, fitted.measured[domain], atol=0.035)
