"""Human-readable summary of one run, and its strict JSON (pure formatters; the caller prints and writes)."""

from __future__ import annotations

import json
from typing import Any

from simulator.acceptance.presets import DEFAULT_PRESETS

STATS = ("mean", "p50", "p90", "p99")


def summary_json(summary: dict[str, Any]) -> str:
    """``summary.json``'s text: strict JSON (a NaN or an infinity anywhere is an error, never a bare ``NaN``)."""
    return json.dumps(summary, indent=1, allow_nan=False, default=str) + "\n"


def _num(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(scale * value, spec)


def _row(name: str, stats: dict[str, Any], unit: str, scale: float = 1.0, spec: str = "9.1f") -> str:
    values = "".join(f"{_num(stats[key], spec, scale):>10}" for key in STATS)
    return f"{name:<34}{values}   {unit} (n={stats['num']})"


def _requests_lines(s: dict[str, Any]) -> list[str]:
    lines = [
        f"requests      {s['num_requests_arrived']} arrived in the window ({s['num_requests_arrived_in_run']} since "
        f"t=0), {s['num_requests_finished']} finished in the window",
        f"at the end    {s['num_unfinished_at_end']} unfinished: {s['num_waiting_prefill_at_end']} waiting for "
        f"prefill, {s['num_prefilling_at_end']} in prefill, {s['num_waiting_decode_at_end']} waiting for a decode "
        f"slot, {s['num_decoding_at_end']} decoding",
        f"load          {_num(s['request_arrival_rate_per_s'], '.2f')} req/s arrived, "
        f"{_num(s['request_finish_rate_per_s'], '.2f')} req/s finished; backlog "
        f"{s['num_unfinished_at_window_start']} -> {s['num_unfinished_at_end']} "
        f"({_num(s['backlog_growth_per_s'], '+.2f')} req/s)",
    ]
    if s.get("overload_warning"):
        lines.append(f"WARNING       {s['overload_warning']}")
    return lines


def provenance_lines(s: dict[str, Any]) -> list[str]:
    """Where the run came from (code revision, profile file, traffic source, seed), for the keys present."""
    lines = []
    if "code_revision" in s:
        rev = s["code_revision"]
        lines.append(f"code          {rev['describe']} (commit {rev['commit']}, dirty: {rev['dirty']})")
    if "profile_file" in s:
        lines.append(f"profile file  {s['profile_file']} (sha256 {s['profile_sha256']})")
    if "traffic_source" in s:
        src = s["traffic_source"]
        if src["kind"] == "trace":
            lines.append(f"traffic       {src['name']}: trace {src['file']} (format {src['format']}, "
                         f"sha256 {src['sha256']})")
        else:
            lines.append(f"traffic       {src['name']}: synthetic {src['spec']['arrival']}")
    lines.append(f"seed          {s['seed']}")
    return lines


def _acceptance_source(s: dict[str, Any]) -> str:
    """Where the run's acceptance came from, as the resolved config says (summaries without it: nothing)."""
    drafter = (s.get("config") or {}).get("drafter") or {}
    if drafter.get("log"):
        return f", acceptance replayed from {drafter['log']}"
    if "kind" not in drafter:
        return ""
    preset = drafter.get("acceptance") or DEFAULT_PRESETS.get(drafter["kind"], drafter["kind"])
    return f", acceptance preset {preset}, draft latency {drafter.get('latency') or drafter['kind']}"


def format_summary(summary: dict[str, Any]) -> str:
    s = summary
    lossy = "" if s["lossless"] else "   <-- LOSSY policy: outputs do NOT follow the target distribution"
    positions = " ".join(_num(x, ".2f") for x in s["acceptance_rate_per_position"]) or "-"
    lines = [
        f"policy        {s['policy']} {s['policy_params'] or ''}{lossy}",
        f"drafter       {s['drafter']} (gamma {s['gamma']}){_acceptance_source(s)}",
        f"hardware      {s['profile']}   [{s['profile_source'].upper()}]",
        f"window        [{s['window_start_at']:.1f}, {s['window_end_at']:.1f}] s: {s['window_s']:.1f} s simulated, "
        f"{s['num_steps']} steps",
        *_requests_lines(s),
        "",
        f"throughput              {_num(s['output_tokens_per_s'], '10.1f')} tok/s   "
        f"{_num(s['output_tokens_per_s_per_gpu'], '10.1f')} tok/s/GPU ({s['num_decode_gpus']} decode GPUs)",
        f"{'':<34}{''.join(f'{key:>10}' for key in STATS)}",
        _row("tok/s/user (finished)", s["tokens_per_s_per_user"], "tok/s"),
        _row("TTFT (first token in window)", s["ttft_s"], "ms", 1e3),
        _row("TTFT pending (wait so far)", s["ttft_pending_s"], "ms", 1e3),
        _row("TPOT (finished)", s["tpot_s"], "ms", 1e3, "9.2f"),
        _row("e2e latency (finished)", s["e2e_s"], "s", 1.0, "9.2f"),
        "",
        f"mean acceptance length  {_num(s['mean_acceptance_length'], '.3f')} tokens/step (tau, bonus included)",
        f"acceptance rate         {_num(s['acceptance_rate_with_bonus'], '.3f')} with the bonus token (the paper's, "
        f"tau / (1 + l));  {_num(s['acceptance_rate_draft_only'], '.3f')} draft tokens only (vLLM's)",
        f"verification budget     {_num(s['verification_budget_per_request'], '.2f')} tokens/request/step",
        f"mean batch              {_num(s['mean_num_requests'], '.1f')} requests, "
        f"{_num(s['mean_batch_tokens'], '.1f')} tokens",
        f"acceptance by position  {positions}",
        "",
        *provenance_lines(s),
    ]
    return "\n".join(lines)
