"""Chunked (co-located) vs disaggregated prefill, DSpark vs MTP-1: TTFT and throughput against load.

    python docs/studies/chunked_prefill.py            # about three minutes (docs/chunked_prefill_study.md)

Two GPUs in both deployments: ``disaggregated`` is one prefill worker and one
decode replica (the prefill pool hands prefilled requests over); ``chunked`` is
two co-located replicas behind a least-loaded router, each running prefill
chunks inside its decode steps within ``--budget`` batch tokens. Poisson
arrivals of chat-like requests at each rate; throughput is per GPU, all GPUs
counted. Writes the figure and a CSV of every run next to it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from experiments.provenance import save_stamped
from policies import make_policy
from simulator import ClusterSpec, DrafterSpec, EngineLimits, SimulationSpec, load_profile, simulate
from traces.synthetic import TrafficSpec

REPO = Path(__file__).resolve().parents[2]
DRAFTER = {"dspark": "dspark", "mtp1": "mtp"}  # the deployed pairs: DSpark with its drafter, MTP-1 with MTP
NUM_GPUS = 2


def cluster(mode: str, args: argparse.Namespace) -> ClusterSpec:
    if mode == "disaggregated":
        limits = EngineLimits(args.concurrency, args.kv_capacity_tokens)
        return ClusterSpec(num_decode_engines=1, num_prefill_instances=1, limits=limits)
    limits = EngineLimits(args.concurrency, args.kv_capacity_tokens, max_num_batched_tokens=args.budget)
    return ClusterSpec(num_decode_engines=2, limits=limits, mode="chunked")


def run_one(policy: str, mode: str, rate_per_s: float, args: argparse.Namespace) -> dict:
    traffic = TrafficSpec(arrival="poisson", rate_per_s=rate_per_s, domain_mix={"chat": 1.0},
                          max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=2048)
    spec = SimulationSpec(policy=make_policy(policy), profile=load_profile(args.hardware),
                          drafter=DrafterSpec(DRAFTER[policy], args.gamma), cluster=cluster(mode, args),
                          traffic=traffic, duration_s=args.duration_s, warmup_s=args.warmup_s, seed=args.seed)
    s = simulate(spec).summary
    ttft, tpot = s["ttft_s"] or {}, s["tpot_s"] or {}
    return {"policy": policy, "mode": mode, "rate_per_s": rate_per_s,
            "output_tokens_per_s_per_gpu": s["output_tokens_per_s"] / NUM_GPUS,
            "ttft_p50_s": ttft.get("p50"), "ttft_p90_s": ttft.get("p90"), "tpot_p50_s": tpot.get("p50"),
            "mean_num_requests": s["mean_num_requests"], "mean_batch_tokens": s["mean_batch_tokens"],
            "verification_budget_per_request": s["verification_budget_per_request"],
            "overloaded": bool(s["overloaded"]), "num_requests_finished": s["num_requests_finished"]}


def plot(frame: pd.DataFrame, args: argparse.Namespace, out: Path) -> None:
    profile = load_profile(args.hardware)
    fig = Figure(figsize=(16, 4.8))
    axes = fig.subplots(1, 3)
    panels = (("ttft_p90_s", "TTFT p90 (s)", "log"), ("output_tokens_per_s_per_gpu", "output tok/s per GPU", "linear"),
              ("tpot_p50_s", "TPOT p50 (s)", "log"))
    colors = {"dspark": "tab:blue", "mtp1": "tab:orange"}
    styles = {"disaggregated": "-", "chunked": "--"}
    for (policy, mode), part in frame.groupby(["policy", "mode"], sort=False):
        for ax, (key, _, _) in zip(axes, panels, strict=True):
            ax.plot(part["rate_per_s"], part[key], styles[mode], marker="o", color=colors[policy],
                    label=f"{policy}, {mode}")
            over = part[part["overloaded"]]
            ax.plot(over["rate_per_s"], over[key], "kx", markersize=9)
    for ax, (_, label, scale) in zip(axes, panels, strict=True):
        ax.set(xlabel="arrival rate (requests/s, Poisson)", ylabel=label, yscale=scale, title=label)
        ax.legend(fontsize=7)
    fig.suptitle(f"Chunked vs disaggregated prefill on {NUM_GPUS} GPUs (chunked: 2 replicas, budget {args.budget} "
                 f"tokens; disaggregated: 1 prefill + 1 decode); x: overloaded (backlog grows)", fontsize=11)
    save_stamped(fig, out, profile, "python docs/studies/chunked_prefill.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hardware", default="h200_qwen3-8b_v2_analytic", help="a version-2 profile")
    parser.add_argument("--rates", default="4,8,16,24,32,40,48", help="arrival rates (requests/s)")
    parser.add_argument("--budget", type=int, default=2048, help="chunked mode's max_num_batched_tokens")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--kv-capacity-tokens", type=int, default=750_000,
                        help="KV per replica: ~110 GB of bf16 Qwen3-8B KV (144 KiB/token) on a 141 GB H200")
    parser.add_argument("--max-prompt-tokens", type=int, default=32768)
    parser.add_argument("--gamma", type=int, default=7)
    parser.add_argument("--duration-s", type=float, default=40.0)
    parser.add_argument("--warmup-s", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "figures" / "chunked_prefill.png")
    args = parser.parse_args()
    rows = []
    for policy in ("mtp1", "dspark"):
        for mode in ("disaggregated", "chunked"):
            for rate in (float(r) for r in args.rates.split(",")):
                row = run_one(policy, mode, rate, args)
                rows.append(row)
                print(f"{policy:6s} {mode:13s} {rate:5.1f}/s: {row['output_tokens_per_s_per_gpu']:7.0f} tok/s/GPU, "
                      f"TTFT p90 {row['ttft_p90_s']}, overloaded {row['overloaded']}", flush=True)
    frame = pd.DataFrame(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out.with_suffix(".csv"), index=False, float_format="%.6g")
    plot(frame, args, args.out)
    print(f"wrote {args.out} and {args.out.with_suffix('.csv')}")


if __name__ == "__main__":
    main()
