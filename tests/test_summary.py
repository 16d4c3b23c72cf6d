"""The run summary: who arrived, who was served, who is still queued, overload, strict JSON, provenance."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.report import format_summary, summary_json
from policies import make_policy
from simulator import ClusterSpec, EngineLimits, simulate
from simulator.metrics import (
    OVERLOAD_MIN_REQUESTS,
    add_request_metrics,
    backlog_trend,
    distribution,
    queue_at_end,
    requests_in_run,
    summarize,
)
from traces.synthetic import TrafficSpec
from traces.workload import Workload

REPO = Path(__file__).resolve().parents[1]
NAN = np.nan


def strict_loads(text: str) -> object:
    """json.loads that refuses NaN and Infinity, as strict parsers do."""
    def refuse(token: str) -> None:
        raise ValueError(f"non-standard JSON constant {token}")
    return json.loads(text, parse_constant=refuse)


def table(rows: list[tuple]) -> pd.DataFrame:
    """Requests from (arrival, prefill start, first token, decode start, finish, output tokens)."""
    cols = ["arrival_at", "prefill_start_at", "first_token_at", "decode_start_at", "finished_at", "output_tokens"]
    frame = pd.DataFrame(rows, columns=cols)
    frame.insert(0, "request_id", np.arange(len(frame)))
    return add_request_metrics(frame)


NO_STEPS = pd.DataFrame({c: pd.Series(dtype=float) for c in (
    "end_at", "num_emitted_tokens", "num_requests", "num_verified_tokens", "num_accepted_tokens", "batch_tokens")})


# ---------------------------------------------------------------- distributions and the queue at the end


def test_distribution_is_exact_and_none_when_empty():
    assert distribution(pd.Series([4.0, 1.0, NAN, 3.0, 2.0])) == {
        "num": 4, "mean": 2.5, "p50": 2.5, "p90": pytest.approx(3.7), "p99": pytest.approx(3.97), "max": 4.0}
    assert distribution(pd.Series([NAN])) == {"num": 0, "mean": None, "p50": None, "p90": None, "p99": None,
                                              "max": None}


QUEUE = table([
    (0.0, 0.0, 1.0, 1.0, 3.0, 10),  # finished
    (1.0, 1.0, 2.0, 2.0, NAN, 10),  # decoding
    (2.0, 2.0, 3.0, NAN, NAN, 10),  # prefilled, waiting for a decode slot
    (3.0, 4.0, NAN, NAN, NAN, 10),  # in prefill
    (4.0, NAN, NAN, NAN, NAN, 10),  # waiting for prefill since 4 s
    (5.5, NAN, NAN, NAN, NAN, 10),  # waiting for prefill since 5.5 s
])


def test_queue_at_end_counts_every_unfinished_request_by_stage():
    queue = queue_at_end(QUEUE, end_at=6.0)
    assert {k: v for k, v in queue.items() if k != "ttft_pending_s"} == {
        "num_unfinished_at_end": 5, "num_waiting_prefill_at_end": 2, "num_prefilling_at_end": 1,
        "num_waiting_decode_at_end": 1, "num_decoding_at_end": 1}
    # Still without a first token: waited 3, 2 and 0.5 s so far.
    pending = queue["ttft_pending_s"]
    assert (pending["num"], pending["mean"], pending["max"]) == (3, pytest.approx(5.5 / 3), 3.0)


def test_summary_ttft_covers_unfinished_requests_and_arrivals_count_in_the_window():
    s = summarize(QUEUE, NO_STEPS, np.zeros(1, np.int64), np.zeros(1, np.int64), start_at=0.5, end_at=6.0,
                  num_decode_gpus=1)
    # First tokens at 1, 2, 3 are in (0.5, 6]: TTFT 1, 1, 1 (two of those requests never finished).
    assert (s["ttft_s"]["num"], s["ttft_s"]["mean"]) == (3, 1.0)
    assert s["tpot_s"]["num"] == s["num_requests_finished"] == 1
    # Arrivals in [0.5, 6): the one at 0.0 came during the warm-up.
    assert (s["num_requests_arrived"], s["num_requests_arrived_in_run"]) == (5, 6)
    assert s["num_requests_arrived_in_run"] == s["num_unfinished_at_end"] + 1
    # No step ran: every step figure is null, and the summary is strict JSON.
    assert s["mean_acceptance_length"] is None and s["mean_batch_tokens"] is None
    assert strict_loads(json.dumps(s, allow_nan=False))["draft_acceptance_rate"] is None


def test_requests_in_run_keeps_arrived_rows_and_flags_the_window():
    frame = table([(0.5, NAN, NAN, NAN, NAN, 3), (2.0, NAN, NAN, NAN, NAN, 3), (9.9, NAN, NAN, NAN, NAN, 3),
                   (10.0, NAN, NAN, NAN, NAN, 3), (30.0, NAN, NAN, NAN, NAN, 3)])
    kept = requests_in_run(frame, start_at=1.0, end_at=10.0)
    assert kept["request_id"].tolist() == [0, 1, 2]  # 10.0 and 30.0 had not arrived when the run stopped
    assert kept["in_window"].tolist() == [False, True, True]
    assert requests_in_run(frame, start_at=1.0, end_at=None)["in_window"].tolist() == [False] + [True] * 4


# ---------------------------------------------------------------- overload


def _steady(rate_per_s: float, span_s: float, stay_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Evenly spaced arrivals at ``rate_per_s`` over ``[0, span_s)``, each staying ``stay_s`` (inf: never done)."""
    arrival = (np.arange(int(rate_per_s * span_s)) + 0.5) / rate_per_s
    return arrival, np.where(np.isinf(stay_s), NAN, arrival + stay_s)


@pytest.mark.parametrize("rate, stay_s, start, end, overloaded", [
    (10.0, np.inf, 0.0, 100.0, True),  # nothing finishes: the backlog grows at the arrival rate
    (10.0, 2.0, 10.0, 100.0, False),  # a steady backlog of 20
    (10.0, 40.0, 0.0, 100.0, False),  # fills up for 40 s, then steady: flat in the second half
    (1.0, np.inf, 0.0, 8.0, False),  # growing, but by 8 requests only (< OVERLOAD_MIN_REQUESTS)
    (1.0, np.inf, 0.0, 12.0, True),  # ... by 12
])
def test_backlog_trend_flags_a_queue_that_grows_through_the_window(rate, stay_s, start, end, overloaded):
    arrival, finished = _steady(rate, end + 50.0, stay_s)
    trend = backlog_trend(arrival, finished, start, end)
    assert trend["overloaded"] is overloaded
    if np.isinf(stay_s):
        assert trend["backlog_growth_per_s"] == pytest.approx(rate, rel=0.02)
        assert trend["request_finish_rate_per_s"] == 0.0


def test_backlog_growth_below_the_margin_is_not_overload():
    arrival, _ = _steady(10.0, 200.0, np.inf)
    finished = arrival + 1.0
    finished[::25] = NAN  # 4% of the requests never finish: growth 0.4/s < 5% of 10/s
    trend = backlog_trend(arrival, finished, 10.0, 190.0)
    assert trend["backlog_growth_per_s"] == pytest.approx(0.4, rel=0.05)
    assert trend["backlog_growth_per_s"] * 180.0 > OVERLOAD_MIN_REQUESTS and not trend["overloaded"]


def test_overloaded_run_says_so_and_counts_its_queue(small_spec):
    """500 req/s on one engine with one prefill worker: the queue grows without bound."""
    spec = small_spec(make_policy("mtp3"), traffic=TrafficSpec(arrival="poisson", rate_per_s=500.0,
                                                                max_output_tokens=256),
                      cluster=ClusterSpec(num_prefill_instances=1, limits=EngineLimits(64, 600_000)),
                      duration_s=3.0, warmup_s=1.0)
    results = simulate(spec)
    s, req = results.summary, results.requests
    assert s["overloaded"] and s["overload_warning"].startswith("OVERLOADED: the backlog grew")
    assert s["num_unfinished_at_end"] > 10 * s["num_requests_finished"]
    assert s["num_unfinished_at_end"] == (s["num_waiting_prefill_at_end"] + s["num_prefilling_at_end"]
                                          + s["num_waiting_decode_at_end"] + s["num_decoding_at_end"])
    # The one prefill worker is the bottleneck: it is busy, and the engine holds what it let through.
    assert s["num_prefilling_at_end"] == 1 and 0 < s["num_decoding_at_end"] <= 64
    assert s["ttft_pending_s"]["num"] == s["num_waiting_prefill_at_end"] + 1
    # TTFT covers every first token in the window (1, 3], including requests still decoding at the end.
    got_first = req["first_token_at"].between(1.0, 3.0, inclusive="right")
    assert s["ttft_s"]["num"] == got_first.sum() and (got_first & req["finished_at"].isna()).sum() > 0
    assert "WARNING       OVERLOADED" in format_summary(s)
    strict_loads(summary_json(s))


def test_closed_loop_run_is_not_overloaded(small_spec):
    s = simulate(small_spec(make_policy("mtp3"))).summary
    assert not s["overloaded"] and s["overload_warning"] is None
    assert s["num_unfinished_at_end"] == 16  # every closed-loop user has one request in flight
    assert "WARNING" not in format_summary(s)


def test_trace_rows_after_the_end_never_arrive(small_spec):
    n = 40
    workload = Workload(arrival_at=0.25 * np.arange(n), prompt_tokens=np.full(n, 100),
                        output_tokens=np.full(n, 50), domain=np.array(["chat"] * n))
    results = simulate(small_spec(make_policy("mtp3"), traffic=workload, duration_s=4.0, warmup_s=1.0))
    req = results.requests
    assert req["arrival_at"].max() < 4.0 and len(req) == 16  # arrivals every 0.25 s: 0.0 .. 3.75
    assert req["in_window"].sum() == results.summary["num_requests_arrived"] == 12  # 1.0 .. 3.75
    assert results.summary["num_requests_arrived_in_run"] == len(req)


# ---------------------------------------------------------------- the command: strict JSON, provenance, run.log


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    proc = subprocess.run([sys.executable, "-m", "experiments.run", "duration_s=2", "warmup_s=0.5", "progress=false",
                           "traffic.num_users=8", f"hydra.run.dir={out}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_summary_json_is_strict_and_records_provenance(cli_run):
    summary = strict_loads((cli_run / "summary.json").read_text())
    assert summary["config"]["traffic"]["num_users"] == 8 and summary["config"]["duration_s"] == 2
    assert summary["profile_file"] == "simulator/profiles/h200_qwen3-8b_analytic.json"
    expected = hashlib.sha256((REPO / summary["profile_file"]).read_bytes()).hexdigest()
    assert summary["profile_sha256"] == expected
    assert summary["traffic_source"]["kind"] == "synthetic" and summary["traffic_source"]["name"] == "chat"
    revision = summary["code_revision"]
    assert set(revision) == {"commit", "describe", "dirty"} and revision["describe"]
    assert (summary["window_start_at"], summary["window_end_at"]) == (0.5, 2.0)


def test_run_log_holds_the_summary_and_requests_table_the_window_flag(cli_run):
    log = (cli_run / "run.log").read_text()
    assert "throughput" in log and "profile file  simulator/profiles/" in log and "code " in log
    requests = pd.read_parquet(cli_run / "requests.parquet")
    assert requests["in_window"].dtype == bool
    assert (requests["in_window"] == (requests["arrival_at"] >= 0.5)).all()


def test_summary_records_where_acceptance_came_from(small_spec):
    summary = simulate(small_spec(make_policy("mtp1"), duration_s=1.0)).summary
    assert summary["acceptance"]["source"] == "preset" and summary["acceptance"]["preset"]
