"""The trace statistics and the ``python -m traces.summary`` command."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from traces import load_trace
from traces.stats import arrivals_per_s, compute_stats, interarrival_cv, nice_bin_s
from traces.summary import main


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240501)


def test_poisson_arrivals_have_cv_near_one(rng: np.random.Generator) -> None:
    arrival_at = np.cumsum(rng.exponential(0.5, size=20_000))
    assert interarrival_cv(arrival_at) == pytest.approx(1.0, abs=0.03)


def test_regular_arrivals_have_cv_zero() -> None:
    assert interarrival_cv(np.arange(10.0)) == 0.0


def test_arrivals_per_s_counts_every_arrival() -> None:
    arrival_at = np.array([0.0, 0.5, 1.0, 4.0, 9.0])
    starts, rate_per_s = arrivals_per_s(arrival_at, bin_s=2.0)
    np.testing.assert_array_equal(starts, [0.0, 2.0, 4.0, 6.0, 8.0])
    np.testing.assert_array_equal(rate_per_s * 2.0, [3, 0, 1, 0, 1])  # the last arrival sits on the right edge


@pytest.mark.parametrize(("span_s", "max_bins", "bin_s"), [(297.0, 12, 30.0), (3600.0, 2000, 2.0), (10.0, 12, 1.0)])
def test_nice_bin_s(span_s: float, max_bins: int, bin_s: float) -> None:
    assert nice_bin_s(span_s, max_bins) == bin_s


def test_stats_of_a_batched_sample() -> None:
    workload = load_trace("mooncake_conversation").workload
    stats = compute_stats(workload)
    assert stats.num_requests == 918 and stats.span_s == 297.0
    assert stats.mean_rate_per_s == pytest.approx(917 / 297.0)
    assert stats.num_arrival_instants == 100
    assert stats.interarrival_cv > 2 > stats.instant_gap_cv  # batches are bursty; the batch clock is regular
    assert stats.prompt_tokens.total == int(workload.prompt_tokens.sum())
    assert stats.output_tokens.p50 == float(np.median(workload.output_tokens))
    assert stats.rate_per_s.sum() * stats.rate_bin_s == 918


def test_summary_command_prints_the_table_and_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["azure_code", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    for row in ("requests", "1,482", "span", "mean rate", "burstiness (CV of inter-arrival gaps)",
                "prompt tokens mean / p50 / p90 / p99", "arrivals per second over time"):
        assert row in printed
    png = tmp_path / "azure_code_summary.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_command_prints_skipped_rows(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    trace = tmp_path / "mine.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,5,5\n1,-5,5\n2,5,0\n3,7,7\n")
    assert main([str(trace), "--out", str(tmp_path)]) == 1
    assert "mine.csv line 3, field 'prompt_tokens': negative" in capsys.readouterr().err
    assert main([str(trace), "--out", str(tmp_path), "--skip-bad-rows", "--zero-output", "drop"]) == 0
    printed = capsys.readouterr().out
    assert "skipped 1 bad rows (prompt_tokens: negative: 1)" in printed
    assert "1 requests with 0 output tokens (failed requests) dropped" in printed
    assert (tmp_path / "mine_summary.png").is_file()
