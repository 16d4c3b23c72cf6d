"""experiments.trace: a run's steps and request lifetimes as a Chrome/Perfetto trace."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from experiments.trace import assign_lanes, chrome_trace, main
from policies import make_policy
from simulator import simulate

NAN = np.nan
PHASES = {"X", "M", "C"}

# Two engines: engine 0 steps at [1.0, 1.5) (draft 0.1, schedule 0, verify 0.4) and [1.5, 2.25);
# engine 1 one step at [1.2, 1.7).
STEPS = pd.DataFrame([
    (0, 1.0, 1.5, 2, 6, 4, 3, 5, -1, 0.1, 0.0, 0.4),
    (0, 1.5, 2.25, 1, 3, 2, 1, 2, -1, 0.25, 0.125, 0.375),
    (1, 1.2, 1.7, 1, 1, 0, 0, 1, -1, 0.0, 0.0, 0.5),
], columns=["engine", "start_at", "end_at", "num_requests", "batch_tokens", "num_verified_tokens",
             "num_accepted_tokens", "num_emitted_tokens", "capacity", "draft_s", "sched_s", "verify_s"])
# Request 0: queue 0.25 s, prefill to 0.75, waits for decode to 1.0, decodes to 2.25.
# Request 1 arrives when 0 has finished and takes its lane; request 2 never got a prefill worker.
REQUESTS = pd.DataFrame({
    "request_id": [0, 1, 2],
    "arrival_at": [0.0, 2.5, 2.6],
    "prefill_start_at": [0.25, 2.5, NAN],
    "first_token_at": [0.75, 2.75, NAN],
    "decode_start_at": [1.0, 2.75, NAN],
    "finished_at": [2.25, NAN, NAN],
})


def slices(trace: dict, name: str) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["name"] == name]


def check_structure(trace: dict) -> None:
    """What ui.perfetto.dev needs: strict JSON, known phases, integer ids, named processes and threads,
    events in time order, non-negative durations, no overlap within a thread."""
    text = json.dumps(trace, allow_nan=False)
    events = json.loads(text)["traceEvents"]
    assert {e["ph"] for e in events} <= PHASES
    assert all(isinstance(e["pid"], int) and isinstance(e["tid"], int) for e in events)
    named = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    timed = [e for e in events if e["ph"] != "M"]
    assert all(e["ph"] == "M" for e in events[: len(events) - len(timed)])  # metadata first
    assert [e["ts"] for e in timed] == sorted(e["ts"] for e in timed)
    assert {e["pid"] for e in timed} <= {pid for pid, _ in named}
    complete = [e for e in timed if e["ph"] == "X"]
    assert {(e["pid"], e["tid"]) for e in complete} <= threads
    assert all(e["dur"] >= 0 for e in complete)
    last_end: dict[tuple[int, int], float] = {}
    for e in complete:
        key = (e["pid"], e["tid"])
        assert e["ts"] >= last_end.get(key, -np.inf), f"overlapping slices on {key}"
        last_end[key] = round(e["ts"] + e["dur"], 3)  # nanoseconds, as the viewer reads them


def test_assign_lanes_reuses_the_lowest_free_lane():
    start = np.array([0.0, 1.0, 2.0, 3.0, 3.0])
    end = np.array([2.0, 5.0, 4.0, 4.0, 9.0])
    # 0 takes lane 0; 1 lane 1; 2 arrives when 0 ends: lane 0; at 3 both lanes busy: lanes 2 and 3.
    assert assign_lanes(start, end).tolist() == [0, 1, 0, 2, 3]


def test_trace_structure_and_exact_values():
    trace = chrome_trace(STEPS, REQUESTS, end_at=3.0)
    check_structure(trace)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {1: "engine 0", 2: "engine 1", 3: "requests"}
    # Engine 0's second step: draft 1.5..1.75, schedule 1.75..1.875, verify 1.875..2.25 (microseconds).
    assert [(e["ts"], e["dur"]) for e in slices(trace, "draft") if e["pid"] == 1] == [
        (1_000_000.0, 100_000.0), (1_500_000.0, 250_000.0)]
    assert [(e["ts"], e["dur"]) for e in slices(trace, "schedule")] == [(1_750_000.0, 125_000.0)]
    assert [(e["pid"], e["ts"], e["dur"]) for e in slices(trace, "verify")] == [
        (1, 1_100_000.0, 400_000.0), (2, 1_200_000.0, 500_000.0), (1, 1_875_000.0, 375_000.0)]
    first_step = slices(trace, "step")[0]
    assert first_step["args"] == {"num_requests": 2, "batch_tokens": 6, "num_verified_tokens": 4,
                                  "num_accepted_tokens": 3, "num_emitted_tokens": 5, "capacity": -1}
    lifetimes = [(e["name"], e["tid"], e["ts"], e["dur"], e["args"]) for e in trace["traceEvents"]
                 if e["ph"] == "X" and e["pid"] == 3]
    assert lifetimes == [
        ("queue", 1, 0.0, 250_000.0, {"request_id": 0}),
        ("prefill", 1, 250_000.0, 500_000.0, {"request_id": 0}),
        ("wait decode", 1, 750_000.0, 250_000.0, {"request_id": 0}),
        ("decode", 1, 1_000_000.0, 1_250_000.0, {"request_id": 0}),
        ("prefill", 1, 2_500_000.0, 250_000.0, {"request_id": 1}),  # no queue: a worker was free
        ("queue", 2, 2_600_000.0, 400_000.0, {"request_id": 2, "unfinished": True}),  # on lane 1: 1 is busy
        ("decode", 1, 2_750_000.0, 250_000.0, {"request_id": 1, "unfinished": True}),
    ]
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == 3 and counters[0]["args"] == {"requests": 2, "batch_tokens": 6}


def test_command_writes_trace_json_of_a_run(tmp_path, small_spec, capsys):
    results = simulate(small_spec(make_policy("dspark")))
    results.steps.to_parquet(tmp_path / "steps.parquet")
    results.requests.to_parquet(tmp_path / "requests.parquet")
    (tmp_path / "summary.json").write_text(json.dumps({"window_end_at": 5.0}))
    main([str(tmp_path)])
    trace = json.loads((tmp_path / "trace.json").read_text())
    check_structure(trace)
    assert len(slices(trace, "step")) == len(results.steps) and len(slices(trace, "verify")) == len(results.steps)
    assert {e["args"]["request_id"] for e in slices(trace, "prefill")} == set(results.requests["request_id"])
    ends = [e["ts"] + e["dur"] for e in trace["traceEvents"] if e["ph"] == "X"]
    assert max(ends) == pytest.approx(5e6)
    assert f"{len(trace['traceEvents'])} events ({len(results.steps)} steps" in capsys.readouterr().out


def test_command_names_a_missing_table(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path)])
    assert exit_info.value.code == 2
    assert "steps.parquet: not found" in capsys.readouterr().err
