"""Human-readable summary of one run (a pure formatter; the caller prints)."""

from __future__ import annotations

from typing import Any


def format_summary(summary: dict[str, Any]) -> str:
    s = summary
    lossy = "" if s["lossless"] else "   <-- LOSSY policy: outputs do NOT follow the target distribution"
    per_user, ttft = s["tokens_per_s_per_user"], s["ttft_s"]
    positions = " ".join(f"{x:.2f}" for x in s["acceptance_rate_per_position"]) or "-"
    lines = [
        f"policy        {s['policy']} {s['policy_params'] or ''}{lossy}",
        f"drafter       {s['drafter']} (gamma {s['gamma']})",
        f"hardware      {s['profile']}   [{s['profile_source'].upper()}]",
        f"window        {s['window_s']:.1f} s simulated, {s['num_steps']} steps, "
        f"{s['num_requests_finished']} requests finished ({s['num_requests_arrived']} arrived)",
        "",
        f"throughput              {s['output_tokens_per_s']:10.1f} tok/s   "
        f"{s['output_tokens_per_s_per_gpu']:10.1f} tok/s/GPU ({s['num_decode_gpus']} decode GPUs)",
        f"tok/s/user              mean {per_user['mean']:7.1f}   p50 {per_user['p50']:7.1f}   "
        f"p90 {per_user['p90']:7.1f}",
        f"TTFT                    mean {1e3 * ttft['mean']:7.1f} ms   p50 {1e3 * ttft['p50']:7.1f} ms   "
        f"p90 {1e3 * ttft['p90']:7.1f} ms",
        f"mean acceptance length  {s['mean_acceptance_length']:.3f} tokens/step (tau, bonus included)",
        f"draft acceptance rate   {s['draft_acceptance_rate']:.3f}",
        f"verification budget     {s['verification_budget_per_request']:.2f} tokens/request/step",
        f"mean batch              {s['mean_num_requests']:.1f} requests, {s['mean_batch_tokens']:.1f} tokens",
        f"acceptance by position  {positions}",
    ]
    return "\n".join(lines)
