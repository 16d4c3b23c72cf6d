"""``python -m experiments.trace RUN_DIR [--out FILE]``: a run's timeline as a Chrome/Perfetto trace.

Reads ``steps.parquet`` and ``requests.parquet`` of a run directory (written
by ``python -m experiments.run``; ``summary.json`` gives the run's end) and
writes ``trace.json`` in the Chrome trace event format, which
https://ui.perfetto.dev and ``chrome://tracing`` open:

* one process per decode engine (``engine 0``, ...) with a thread per part
  of a step: ``step`` (the whole step; its arguments hold the batch: requests,
  batch tokens, verified, accepted and emitted tokens, capacity), ``draft``,
  ``schedule`` and ``verify`` (back to back, as the engine charges them), and
  a counter track of requests and batch tokens per step;
* a process ``requests`` holding each request's lifetime as consecutive
  slices ``queue`` (arrival to prefill start), ``prefill`` (to the first
  token), ``wait decode`` (to decode admission) and ``decode`` (to the
  finish); a request still unfinished at the end of the run has its last
  slice end there, with ``unfinished: true``. Requests are packed onto lanes
  (threads ``lane 0``, ``lane 1``, ...): a lane holds one request at a time,
  and a request takes the lowest lane free at its arrival.

Times are simulated time in microseconds (``ts``, ``dur``), events sorted by
time after the metadata events that name processes and threads. Slices of
zero length are left out (an asynchronous policy's scheduler time, a prefill
queue nobody waited in).
"""

from __future__ import annotations

import argparse
import heapq
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

US_PER_S = 1e6
STEP_THREADS = {"step": 1, "draft": 2, "schedule": 3, "verify": 4}  # thread name -> tid in an engine's process
STEP_ARGS = ("num_requests", "batch_tokens", "num_verified_tokens", "num_accepted_tokens", "num_emitted_tokens",
             "capacity")
REQUEST_STAGES = (("queue", "arrival_at", "prefill_start_at"), ("prefill", "prefill_start_at", "first_token_at"),
                  ("wait decode", "first_token_at", "decode_start_at"), ("decode", "decode_start_at", "finished_at"))


class TraceExportError(ValueError):
    """A run directory lacks what the trace needs; the message names the file."""


def _us(seconds: float) -> float:
    return round(float(seconds) * US_PER_S, 3)


def _metadata(pid: int, process: str, threads: dict[str, int], sort_index: int) -> list[dict[str, Any]]:
    events = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": process}},
              {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": sort_index}}]
    for name, tid in threads.items():
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return events


def _slice(name: str, pid: int, tid: int, start_s: float, stop_s: float, args: dict[str, Any]) -> dict[str, Any]:
    """A complete event; ``dur`` is the difference of the rounded ends, so back-to-back slices never overlap."""
    ts = _us(start_s)
    return {"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": round(_us(stop_s) - ts, 3),
            "args": args}


def step_events(steps: pd.DataFrame, pid_of_engine: dict[int, int]) -> list[dict[str, Any]]:
    """The slices and counters of every engine step."""
    events = []
    for row in steps.itertuples(index=False):
        pid = pid_of_engine[int(row.engine)]
        batch = {name: int(getattr(row, name)) for name in STEP_ARGS}
        events.append(_slice("step", pid, STEP_THREADS["step"], row.start_at, row.end_at, batch))
        start = row.start_at
        for name, dur_s in (("draft", row.draft_s), ("schedule", row.sched_s), ("verify", row.verify_s)):
            if dur_s > 0:
                events.append(_slice(name, pid, STEP_THREADS[name], start, start + dur_s, {}))
            start += dur_s
        events.append({"name": "batch", "ph": "C", "pid": pid, "tid": 0, "ts": _us(row.start_at),
                       "args": {"requests": batch["num_requests"], "batch_tokens": batch["batch_tokens"]}})
    return events


def assign_lanes(start_at: np.ndarray, end_at: np.ndarray) -> np.ndarray:
    """Lane per interval (sorted by start): the lowest lane whose previous interval ended by this start."""
    busy: list[tuple[float, int]] = []  # (end_at, lane)
    free: list[int] = []
    lanes = np.empty(start_at.size, dtype=np.int64)
    for i in np.argsort(start_at, kind="stable"):
        while busy and busy[0][0] <= start_at[i]:
            heapq.heappush(free, heapq.heappop(busy)[1])
        lanes[i] = heapq.heappop(free) if free else len(busy)
        heapq.heappush(busy, (float(end_at[i]), int(lanes[i])))
    return lanes


def request_events(requests: pd.DataFrame, pid: int, end_at: float) -> tuple[list[dict[str, Any]], int]:
    """The lifetime slices of every request and the number of lanes they take."""
    finish = requests["finished_at"].fillna(end_at).to_numpy(dtype=np.float64)
    lanes = assign_lanes(requests["arrival_at"].to_numpy(dtype=np.float64), finish)
    events = []
    for row, lane in zip(requests.itertuples(index=False), lanes, strict=True):
        for name, begin, until in REQUEST_STAGES:
            start_s, stop_s = getattr(row, begin), getattr(row, until)
            if np.isnan(start_s):
                break  # the request never got this far
            args: dict[str, Any] = {"request_id": int(row.request_id)}
            if np.isnan(stop_s):
                stop_s, args["unfinished"] = end_at, True
            if stop_s > start_s:
                events.append(_slice(name, pid, int(lane) + 1, start_s, stop_s, args))
    return events, int(lanes.max()) + 1 if lanes.size else 0


def chrome_trace(steps: pd.DataFrame, requests: pd.DataFrame, end_at: float) -> dict[str, Any]:
    """The trace of one run (pure). ``end_at``: when the run stopped (unfinished requests end there)."""
    engines = sorted(int(e) for e in steps["engine"].unique())
    pid_of_engine = {engine: i + 1 for i, engine in enumerate(engines)}
    requests_pid = len(engines) + 1
    events = step_events(steps, pid_of_engine)
    lifetimes, num_lanes = request_events(requests, requests_pid, end_at)
    events += lifetimes
    events.sort(key=lambda e: (e["ts"], e["pid"], e["tid"]))
    metadata = []
    for engine, pid in pid_of_engine.items():
        metadata += _metadata(pid, f"engine {engine}", STEP_THREADS, pid)
    metadata += _metadata(requests_pid, "requests", {f"lane {k}": k + 1 for k in range(num_lanes)}, requests_pid)
    return {"traceEvents": metadata + events, "displayTimeUnit": "ms",
            "otherData": {"time": "simulated", "end_at_s": end_at, "num_steps": len(steps),
                          "num_requests": len(requests)}}


def run_end(run_dir: Path, steps: pd.DataFrame, requests: pd.DataFrame) -> float:
    """The run's end from its summary (``window_end_at``), else the last event of its tables."""
    summary_path = run_dir / "summary.json"
    if summary_path.is_file():
        end = json.loads(summary_path.read_text()).get("window_end_at")
        if end is not None:
            return float(end)
    times = [steps["end_at"].max(), requests[[c for _, _, c in REQUEST_STAGES]].max().max()]
    return float(np.nanmax(np.array(times, dtype=np.float64)))


def read_run(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    tables = []
    for name in ("steps.parquet", "requests.parquet"):
        path = run_dir / name
        if not path.is_file():
            raise TraceExportError(f"{path}: not found; expected the run directory of python -m experiments.run "
                                   "with its tables (write_tables=true)")
        tables.append(pd.read_parquet(path))
    return tables[0], tables[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.trace",
                                     description="Write a run's engine steps and request lifetimes as a "
                                                 "Chrome/Perfetto trace (open it in https://ui.perfetto.dev).")
    parser.add_argument("run_dir", type=Path, help="run directory of python -m experiments.run")
    parser.add_argument("--out", type=Path, default=None, help="output file (default: RUN_DIR/trace.json)")
    args = parser.parse_args(argv)
    try:
        steps, requests = read_run(args.run_dir)
    except TraceExportError as err:
        parser.exit(2, f"error: {err}\n")
    trace = chrome_trace(steps, requests, run_end(args.run_dir, steps, requests))
    out = args.out or args.run_dir / "trace.json"
    out.write_text(json.dumps(trace, allow_nan=False, separators=(",", ":")))
    print(f"{len(trace['traceEvents'])} events ({len(steps)} steps, {len(requests)} requests) -> {out}")


if __name__ == "__main__":
    main()
