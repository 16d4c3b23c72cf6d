"""Synthetic benchmark runs computed from a known profile with the simulator's own step costs (for tests, examples).

A closed-loop run at ``R`` users, every request drafting ``k`` tokens and gaining
``tau`` per step, in steady state: the step costs what the simulator's engine
charges for a uniform batch (``HardwareProfile.verify_s`` + ``attention_s`` +
``draft_s``), ITL is the step, ``TPOT = step (n - 1 + w) / ((n - 1) tau)`` for
``n`` output tokens, ``w`` the tokens the last step accepts past the end
(:func:`calibration.fitting.runs.kept_share`; both times ``1 + noise *
N(0, 1)`` when noise is asked for), each user finishes a request every
``TPOT * (n - 1)`` seconds plus its prefill, and ``TTFT`` is the profile's
prefill. These are *synthetic* numbers, never measurements::

    python -m calibration.fitting.synthetic --profile h200_qwen3-8b_analytic --out calibration/fitting/examples
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibration.fitting.runs import NO_SPECULATION, BenchmarkRun, kept_share
from calibration.fitting.writers import write_csv, write_sglang, write_vllm
from simulator.costs import HardwareProfile, load_profile


@dataclass(frozen=True)
class SyntheticPoint:
    num_users: int
    num_draft_tokens: int  # k (0: no speculation)
    tokens_per_step: float  # tau (1 without speculation)
    prompt_tokens: int
    output_tokens: int


def step_s(profile: HardwareProfile, drafter: str, point: SyntheticPoint) -> float:
    """The simulator's cost of one uniform step of ``point``."""
    r, k = point.num_users, point.num_draft_tokens
    context = np.full(r, point.prompt_tokens + point.output_tokens / 2)
    return (profile.verify_s(r, r * (1 + k)) + profile.attention_s(context, 1 + k)
            + profile.draft_s(drafter, r, k))


def synthetic_run(profile: HardwareProfile, drafter: str, point: SyntheticPoint, source: str, row: int,
                  noise: float = 0.0, rng: np.random.Generator | None = None) -> BenchmarkRun:
    """One run of ``point`` (see the module docstring); ``rng`` is needed when ``noise > 0``."""
    itl_s = step_s(profile, drafter, point)
    if noise > 0:
        if rng is None:
            raise ValueError("noise > 0 needs an rng")
        itl_s *= 1.0 + noise * rng.standard_normal()
    tpot_s = itl_s / (point.tokens_per_step
                      * kept_share(point.tokens_per_step, point.num_draft_tokens, point.output_tokens))
    ttft_s = float(profile.prefill_s(point.prompt_tokens))
    per_request_s = tpot_s * (point.output_tokens - 1)
    requests_per_s = point.num_users / per_request_s
    completed = 10 * point.num_users
    spec = point.num_draft_tokens > 0
    return BenchmarkRun(
        source=source, row=row, spec_method=drafter if spec else NO_SPECULATION,
        num_speculative_tokens=point.num_draft_tokens, mean_prompt_tokens=float(point.prompt_tokens),
        mean_output_tokens=float(point.output_tokens), output_tokens_per_s=requests_per_s * point.output_tokens,
        mean_tpot_ms=1e3 * tpot_s, concurrency=float(point.num_users), requests_per_s=requests_per_s,
        mean_itl_ms=1e3 * itl_s, mean_ttft_ms=1e3 * ttft_s,
        acceptance_length=point.tokens_per_step if spec else None, label=f"synthetic from {profile.label}",
        num_completed=completed, duration_s=completed / requests_per_s)


EXAMPLE_USERS = (1, 2, 4, 8, 16, 32, 64)
# (k, tau): no speculation, then MTP-like acceptance (synthetic, not measured)
EXAMPLE_CONFIGS = ((0, 1.0), (1, 1.85), (3, 2.9), (7, 3.6))


def write_examples(profile: HardwareProfile, drafter: str, out: Path, seed: int = 0,
                   noise: float = 0.01) -> list[Path]:
    """No speculation as vLLM JSON (one file per concurrency), k=1 as SGLang JSONL, k=3 as CSV, and k=7 (held out
    for checking predictions) as CSV."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for k, tau in EXAMPLE_CONFIGS:
        points = [SyntheticPoint(u, k, tau, 1000, 300) for u in EXAMPLE_USERS]
        if k == 0:
            (out / "vllm_nospec").mkdir(exist_ok=True)
            for point in points:
                path = out / "vllm_nospec" / f"c{point.num_users}.json"
                written.append(write_vllm(synthetic_run(profile, drafter, point, str(path), 1, noise, rng), path))
        else:
            name = f"{drafter}{k}" + ("_heldout" if k == 7 else "")
            path = out / (f"sglang_{name}.jsonl" if k == 1 else f"{name}.csv")
            runs = [synthetic_run(profile, drafter, p, str(path), i + 1, noise, rng) for i, p in enumerate(points)]
            written.append(write_sglang(runs, path) if k == 1 else write_csv(runs, path))
    return written


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m calibration.fitting.synthetic", description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", required=True, help="profile the runs are computed from (file or built-in name)")
    p.add_argument("--drafter", default="mtp", help="its draft table to use (default: mtp)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise-pct", type=float, default=1.0, help="relative TPOT noise per run, %% (default: 1)")
    args = p.parse_args(argv)
    for path in write_examples(load_profile(args.profile), args.drafter, args.out, args.seed, args.noise_pct / 100):
        print(path)


if __name__ == "__main__":
    main()
