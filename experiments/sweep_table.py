"""One table row per sweep job, built from what the job wrote (pure: the caller reads the files).

A row joins the job's ``summary.json`` (flattened: ``ttft_s: {mean, p50, ...}``
becomes ``ttft_s_mean`` ..., ``code_revision: {describe, ...}`` becomes
``code_revision_describe`` ...; lists and deeper values are JSON text; the
resolved ``config`` is left out, being the job's own ``.hydra/config.yaml``), the load and setup read from its resolved
``.hydra/config.yaml`` and its command-line overrides (``override.<key>``
columns). Derived per request-step columns split the verification budget
(``1 + l_r`` target tokens) into the bonus/correction position, accepted
draft tokens and rejected draft tokens, as in the paper's Figure 5.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

# Read from the job's config: (column, dotted config key).
CONFIG_COLUMNS = (
    ("traffic_name", "traffic.name"),
    ("arrival", "traffic.arrival"),
    ("num_users", "traffic.num_users"),
    ("rate_per_s", "traffic.rate_per_s"),
    ("num_decode_engines", "cluster.num_decode_engines"),
    ("max_concurrency", "cluster.max_concurrency"),
    ("hardware", "hardware"),
    ("duration_s", "duration_s"),
    ("warmup_s", "warmup_s"),
)
STEP_TIME_COLUMNS = ("draft_s", "sched_s", "verify_s")


def _dig(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


NOT_IN_TABLE = ("config",)  # summary keys the table leaves out


def _flat_dict(value: Any) -> bool:
    return isinstance(value, dict) and not any(isinstance(v, (dict, list)) for v in value.values())


def _flatten(summary: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for key, value in summary.items():
        if key in NOT_IN_TABLE:
            continue
        if _flat_dict(value) and key != "policy_params":
            row.update({f"{key}_{stat}": v for stat, v in value.items()})
        elif isinstance(value, (dict, list)):
            row[key] = json.dumps(value, sort_keys=True)
        else:
            row[key] = value
    return row


def parse_overrides(overrides: list[str]) -> dict[str, str]:
    """``['policy=mtp1', '+x=1', '~y']`` -> ``{'policy': 'mtp1', 'x': '1', 'y': ''}`` (Hydra's override syntax)."""
    parsed = {}
    for item in overrides:
        key, _, value = item.partition("=")
        parsed[key.lstrip("+~")] = value
    return parsed


def step_times(steps: pd.DataFrame, warmup_s: float) -> dict[str, float]:
    """Mean per-step draft, scheduler and verify time (ms) of the steps that end after the warm-up."""
    measured = steps[steps["end_at"] > warmup_s]
    means = {f"{col[:-2]}_ms": 1e3 * float(measured[col].mean()) for col in STEP_TIME_COLUMNS}
    means["step_ms"] = sum(means.values())
    return means


def sweep_row(job: str, summary: dict[str, Any], config: dict[str, Any], overrides: list[str],
              steps: pd.DataFrame | None = None) -> dict[str, Any]:
    """The row of one job. ``config`` is the job's resolved config as plain containers."""
    row: dict[str, Any] = {"job": job}
    row.update(_flatten(summary))
    row.update({column: _dig(config, key) for column, key in CONFIG_COLUMNS})
    row["gpus_per_replica"] = summary["num_decode_gpus"] // max(int(row["num_decode_engines"] or 1), 1)
    row["overrides"] = " ".join(overrides)
    row.update({f"override.{key}": value for key, value in parse_overrides(overrides).items()})
    if steps is not None:
        row.update(step_times(steps, float(row["warmup_s"] or 0.0)))
    return row


def window_latencies(requests: pd.DataFrame, start_at: float, end_at: float) -> pd.DataFrame:
    """Per request of one run: ``ttft_s`` where the first token came in the window ``(start_at, end_at]`` and
    ``tpot_s`` where the request finished in it (NaN elsewhere): the populations of the run's summary."""
    first = (requests["first_token_at"] > start_at) & (requests["first_token_at"] <= end_at)
    done = (requests["finished_at"] > start_at) & (requests["finished_at"] <= end_at)
    out = pd.DataFrame({"ttft_s": requests["ttft_s"].where(first), "tpot_s": requests["tpot_s"].where(done)})
    return out[first | done].reset_index(drop=True)


def base_label(policy: str, params: dict[str, Any]) -> str:
    """``mtp`` with k=3 reads ``mtp3`` (the config names); other policies keep their name."""
    return f"mtp{params['k']}" if policy == "mtp" and "k" in params else policy


def _labels(frame: pd.DataFrame, params: pd.Series) -> pd.Series:
    """Base label, plus the policy parameters (and drafter) that vary under that label, plus a lossy flag."""
    labels = frame["base_label"].copy()
    for name, idx in frame.groupby("base_label").groups.items():
        group = params.loc[idx]
        keys = sorted({k for p in group for k in p})
        varying = [k for k in keys if len({json.dumps(p.get(k)) for p in group}) > 1]
        show_drafter = frame.loc[idx, "drafter"].nunique() > 1
        for i in idx:
            parts = [f"{k}={params[i].get(k)}" for k in varying]
            parts += [f"drafter={frame.at[i, 'drafter']}"] if show_drafter else []
            labels[i] = " ".join([name, *parts])
    return labels.where(frame["lossless"].astype(bool), labels + " (LOSSY)")


def sweep_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The sweep table: rows plus labels and derived columns, sorted by policy label then load."""
    if not rows:
        raise ValueError("no sweep rows: expected at least one job with a summary.json")
    frame = pd.DataFrame(rows)
    params = frame["policy_params"].map(json.loads)
    frame["base_label"] = [base_label(p, q) for p, q in zip(frame["policy"], params, strict=True)]
    frame["policy_label"] = _labels(frame, params)
    budget = frame["verification_budget_per_request"]
    tau = frame["mean_acceptance_length"]
    frame["verified_draft_tokens_per_request_step"] = budget - 1.0
    frame["accepted_draft_tokens_per_request_step"] = tau - 1.0
    frame["rejected_draft_tokens_per_request_step"] = budget - tau
    load = frame["num_users"].where(frame["arrival"] == "closed", frame["rate_per_s"])
    frame["offered_load"] = pd.to_numeric(load, errors="coerce")
    frame["offered_load_unit"] = np.where(frame["arrival"] == "closed", "users", "requests/s")
    order = frame.sort_values(["policy_label", "offered_load", "seed", "job"], kind="stable").index
    return frame.loc[order].reset_index(drop=True)
