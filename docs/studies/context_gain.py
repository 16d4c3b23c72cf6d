"""Speculative gain against context length on the Mooncake conversation trace (docs/context_gain_study.md).

    python docs/studies/context_gain.py                      # the shipped sample, about two minutes
    python docs/studies/context_gain.py --trace /path/to/mooncake_fast25_conversation.jsonl

The trace's requests are split into bands by prompt length; each band is
served at a fixed concurrency (every request of the band queued at t = 0, so
the engine always holds ``--concurrency`` requests, as a ``--max-concurrency``
benchmark does) by ``none``, ``mtp1``, ``mtp3`` and ``dspark`` with the same
DSpark drafter, on a version-2 profile whose attention depends on context.
Writes the figure and a CSV of every run next to it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from experiments.provenance import save_stamped
from policies import make_policy
from simulator import ClusterSpec, DrafterSpec, EngineLimits, SimulationSpec, load_profile, simulate
from traces import load_trace_workload
from traces.workload import Workload

BAND_EDGES = (0, 2048, 8192, 16384, 32768, 10**9)  # prompt tokens: band i holds [edge i, edge i + 1)
POLICIES = ("none", "mtp1", "mtp3", "dspark")
REPO = Path(__file__).resolve().parents[2]


def band_workload(trace: Workload, low: int, high: int, num_requests: int, seed: int) -> Workload:
    """``num_requests`` (prompt, output) pairs drawn with replacement from the trace's band, all queued at t = 0."""
    index = np.flatnonzero((trace.prompt_tokens >= low) & (trace.prompt_tokens < high))
    pick = np.random.default_rng(seed).choice(index, num_requests)
    return Workload(arrival_at=np.zeros(num_requests), prompt_tokens=trace.prompt_tokens[pick],
                    output_tokens=trace.output_tokens[pick], domain=np.array(["chat"] * num_requests))


def run_one(policy: str, workload: Workload, concurrency: int, args: argparse.Namespace) -> dict:
    limits = EngineLimits(max_concurrency=concurrency, kv_capacity_tokens=args.kv_capacity_tokens)
    spec = SimulationSpec(policy=make_policy(policy), profile=load_profile(args.hardware),
                          drafter=DrafterSpec("dspark", args.gamma),
                          cluster=ClusterSpec(num_prefill_instances=concurrency, limits=limits), traffic=workload,
                          duration_s=args.duration_s, warmup_s=args.warmup_s, seed=args.seed)
    result = simulate(spec)
    s, steps, req = result.summary, result.steps, result.requests
    steps = steps[steps["end_at"] > args.warmup_s]
    # Decode speed of the requests that finished in the window, from when they started decoding (all requests
    # are queued at t = 0, so the time since their first token includes waiting for a slot).
    done = req[(req["finished_at"] > args.warmup_s) & (req["output_tokens"] > 1)]
    speed = (done["output_tokens"] - 1) / (done["finished_at"] - done["decode_start_at"])
    return {"policy": policy, "concurrency": concurrency, "output_tokens_per_s": s["output_tokens_per_s"],
            "tokens_per_s_per_user": float(speed.median()), "num_finished": len(done),
            "mean_num_requests": s["mean_num_requests"], "mean_acceptance_length": s["mean_acceptance_length"],
            "verification_budget_per_request": s["verification_budget_per_request"],
            "mean_context_tokens": float((steps["context_tokens"] / steps["num_requests"]).mean()),
            "attention_share": float((steps["attention_s"] / steps["verify_s"]).mean()),
            "draft_share": float((steps["draft_s"] / (steps["draft_s"] + steps["verify_s"])).mean())}


def sweep(args: argparse.Namespace) -> pd.DataFrame:
    trace = load_trace_workload(args.trace)
    bands = list(zip(args.band_edges[:-1], args.band_edges[1:], strict=True))
    for low, high in bands:
        if not np.any((trace.prompt_tokens >= low) & (trace.prompt_tokens < high)):
            raise SystemExit(f"--band-edges: no request of {args.trace} has a prompt of {low} to {high} tokens")
    rows = []
    for concurrency in args.concurrency:
        for low, high in bands:
            workload = band_workload(trace, low, high, args.requests_per_band, args.seed)
            for policy in POLICIES:
                row = run_one(policy, workload, concurrency, args)
                rows.append({"band_low_tokens": low, "band_high_tokens": high,
                             "median_prompt_tokens": float(np.median(workload.prompt_tokens)), **row})
                print(f"R={concurrency} band {low}-{high}: {policy:6s} {row['output_tokens_per_s']:8.0f} tok/s, "
                      f"R {row['mean_num_requests']:.1f}, context {row['mean_context_tokens']:.0f}", flush=True)
    frame = pd.DataFrame(rows)
    base = frame[frame["policy"] == "none"].set_index(["concurrency", "band_low_tokens"])
    keys = pd.MultiIndex.from_frame(frame[["concurrency", "band_low_tokens"]])
    for key in ("output_tokens_per_s", "tokens_per_s_per_user"):
        frame[f"gain_{key}"] = frame[key].to_numpy() / base[key].reindex(keys).to_numpy()
    return frame


def plot(frame: pd.DataFrame, args: argparse.Namespace, out: Path) -> None:
    profile = load_profile(args.hardware)
    fig = Figure(figsize=(16, 4.8))
    axes = fig.subplots(1, 3)
    styles = dict(zip(args.concurrency, ("-", "--", ":"), strict=False))
    for concurrency, style in styles.items():
        at = frame[frame["concurrency"] == concurrency]
        for policy, color in zip(POLICIES[1:], ("tab:orange", "tab:green", "tab:blue"), strict=True):
            part = at[at["policy"] == policy]
            for ax, key in zip(axes[:2], ("gain_output_tokens_per_s", "gain_tokens_per_s_per_user"), strict=True):
                ax.plot(part["mean_context_tokens"], part[key], style, marker="o", color=color,
                        label=f"{policy}, {concurrency} requests")
        none, dspark = at[at["policy"] == "none"], at[at["policy"] == "dspark"]
        axes[2].plot(none["mean_context_tokens"], none["attention_share"], style, marker="o", color="k",
                     label=f"attention share of T_verify, none, {concurrency}")
        axes[2].plot(dspark["mean_context_tokens"], dspark["verification_budget_per_request"] / (1 + args.gamma),
                     style, marker="^", color="tab:blue", label=f"dspark verified / (1 + gamma), {concurrency}")
    for ax, title in zip(axes[:2], ("throughput gain over none", "per-user decode speed gain over none (p50)"),
                         strict=True):
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(xscale="log", xlabel="mean context per request (tokens)", ylabel="x none", title=title)
        ax.legend(fontsize=7)
    axes[2].set(xscale="log", xlabel="mean context per request (tokens)", ylabel="fraction", ylim=(0, 1.02),
                title="why: the KV read every step pays")
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.set_xticks([1000, 3000, 10000, 30000, 100000])
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value / 1000:g}k"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    fig.suptitle(f"Speculative gain vs context: {Path(str(args.trace)).name}, requests binned by prompt length, "
                 f"fixed concurrency, DSpark drafter gamma={args.gamma}", fontsize=11)
    save_stamped(fig, out, profile, "python docs/studies/context_gain.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default="mooncake_conversation", help="shipped sample name or trace file")
    parser.add_argument("--hardware", default="h200_qwen3-8b_v2_analytic", help="a version-2 profile")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--kv-capacity-tokens", type=int, default=10**8,
                        help="KV per replica (default: not binding; see the doc)")
    parser.add_argument("--gamma", type=int, default=7)
    parser.add_argument("--requests-per-band", type=int, default=2000)
    parser.add_argument("--duration-s", type=float, default=40.0)
    parser.add_argument("--warmup-s", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--band-edges", type=int, nargs="+", default=list(BAND_EDGES),
                        help="prompt-length band edges in tokens, ascending (default: %(default)s); a profile "
                             "whose tables stop short of the longest contexts needs fewer bands")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "figures" / "context_gain.png")
    args = parser.parse_args()
    edges = args.band_edges
    if len(edges) < 2 or any(b <= a for a, b in zip(edges[:-1], edges[1:], strict=True)) or edges[0] < 0:
        parser.error(f"--band-edges must be at least two ascending token counts >= 0, got {edges}")
    try:
        frame = sweep(args)
    except ValueError as err:  # a start check (a profile table too short for a band, ...): one line, no traceback
        raise SystemExit(f"error: {err}") from None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out.with_suffix(".csv"), index=False, float_format="%.6g")
    plot(frame, args, args.out)
    print(f"wrote {args.out} and {args.out.with_suffix('.csv')}")


if __name__ == "__main__":
    main()
