"""``python -m calibration.fit_profile RESULTS... --out profile.json``: fit a profile to benchmark results.

Reads vLLM ``bench serve --save-result`` JSON (``*.json``), SGLang ``bench_serving``
JSONL (``*.jsonl``) or the plain CSV of ``docs/calibration.md`` (``*.csv``), fits the
step-cost model, prints the per-run residuals and what the data identify, and
writes a version-2 profile (``metadata.source = "fitted"``) whose
``metadata.fit.alternatives`` carry the range of fits that explain the data
equally well.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from calibration.fitting.export import ExportOptions, profiles
from calibration.fitting.model import DrafterCost
from calibration.fitting.pipeline import FitConfig, fit_runs
from calibration.fitting.prior import parse_prior
from calibration.fitting.readers import read_results
from calibration.fitting.report import check_table, full_report
from calibration.fitting.runs import BenchmarkRun, ResultsError, observe


def _numbers(text: str, count: int, option: str, meaning: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != count or any(v < 0 for v in values):
        raise ResultsError(f"{option}: expected {meaning} (>= 0, comma-separated), got {text!r}")
    return values


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m calibration.fit_profile", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", type=Path, help="benchmark result files")
    p.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    p.add_argument("--format", default="auto", choices=["auto", "vllm", "sglang", "csv"],
                   help="format of every file (default: by extension: .json vllm, .jsonl sglang, .csv csv)")
    p.add_argument("--tpot", default="mean", choices=["mean", "median"], help="TPOT statistic (default: mean)")
    p.add_argument("--step", default="tpot", choices=["tpot", "itl"],
                   help="mean step time: TPOT x acceptance length less the tokens a request's last step accepts "
                        "past its end (default), or the mean ITL when the server streams one chunk per step")
    p.add_argument("--batch", default="littles", choices=["littles", "nominal"],
                   help="decoding requests per step: Little's law over decode, or the nominal concurrency")
    p.add_argument("--knots", type=int, default=12, help="most dense-curve knots over the observed batches")
    p.add_argument("--max-batch-tokens", type=int, default=None,
                   help="extend the dense curve to this many batch tokens (smooth continuation, no data)")
    cliff = p.add_mutually_exclusive_group()
    cliff.add_argument("--max-captured-tokens", type=int, default=None,
                       help="a stated CUDA-graph cliff: steps above it run eagerly (fits eager_s)")
    cliff.add_argument("--detect-cliff", action="store_true", help="look for a cliff between observed batches")
    p.add_argument("--drafter-cost", default=None, metavar="FIXED_S,PER_POSITION_S,PER_TOKEN_S",
                   help="a known drafter cost per step: fixed + per_position*k + per_token*R*k seconds")
    p.add_argument("--drafter-kind", default=None,
                   help="name of the profile's draft table (default: the runs' spec_method)")
    p.add_argument("--prior", default=None, metavar="MODEL@GPU", help="roofline prior, e.g. qwen3-8b@h200")
    p.add_argument("--prior-std", type=float, default=0.3, help="relative std of the prior (default: 0.3)")
    p.add_argument("--noise-pct", type=float, default=1.0, help="relative noise of a run's step time, %%")
    p.add_argument("--smoothness-pct", type=float, default=5.0,
                   help="step-time effect of a unit kink of the dense curve, %% (larger: smoother)")
    p.add_argument("--device", default="unknown device", help="metadata.device of the profile")
    p.add_argument("--model", default=None, help="metadata.model (default: the runs' model id, when one)")
    p.add_argument("--gpus-per-replica", type=int, default=1)
    p.add_argument("--max-requests", type=int, default=4096, help="extent of the per-request and draft tables")
    p.add_argument("--max-draft-tokens", type=int, default=16,
                   help="extent of the draft and attention tables, and the draft length of the steps whose "
                        "cheapest and dearest fits are carried forward (default: 16)")
    p.add_argument("--max-context-tokens", type=int, default=131072, help="extent of the attention table")
    p.add_argument("--prefill", default=None, metavar="FIXED_S,TOKENS_PER_S",
                   help="prefill cost (default: from the runs' TTFT)")
    p.add_argument("--scheduler-cost", default="0,0", metavar="FIXED_S,PER_CANDIDATE_S",
                   help="a synchronous scheduler's cost per decision (benchmarks cannot see it; default 0,0)")
    p.add_argument("--created", default=None, help="metadata.created (default: today), for reproducible files")
    p.add_argument("--check", nargs="+", type=Path, default=[], metavar="RESULTS",
                   help="results left out of the fit: print their TPOT as the fitted profile predicts it")
    return p


def _drafter_kind(runs: list[BenchmarkRun], given: str | None) -> str:
    if given:
        return given
    methods = sorted({r.spec_method for r in runs if r.speculative})
    if len(methods) > 1:
        raise ResultsError(f"the runs use several speculation methods ({', '.join(methods)}); fit each alone, or "
                           "name the draft table with --drafter-kind")
    return methods[0] if methods and methods[0] != "spec" else "mtp"


def _model_name(runs: list[BenchmarkRun], given: str | None) -> str:
    labels = sorted({r.label for r in runs if r.label})
    return given or (labels[0] if len(labels) == 1 else "unknown model")


def run(argv: list[str] | None = None) -> tuple[dict, str]:
    """Parse, fit and build the profile; returns (profile dict, report text). Errors are ResultsError/ValueError."""
    args = _parser().parse_args(argv)
    runs = read_results(args.results, args.format)
    drafter = None
    if args.drafter_cost is not None:
        drafter = DrafterCost(*_numbers(args.drafter_cost, 3, "--drafter-cost", "FIXED_S,PER_POSITION_S,PER_TOKEN_S"))
    if args.max_draft_tokens < 1:
        raise ResultsError(f"--max-draft-tokens must be >= 1, got {args.max_draft_tokens}")
    kind = _drafter_kind(runs, args.drafter_kind)
    config = FitConfig(
        tpot=args.tpot, batch=args.batch, step=args.step, num_knots=args.knots, max_batch_tokens=args.max_batch_tokens,
        max_captured_tokens=args.max_captured_tokens, detect_cliff=args.detect_cliff, drafter_cost=drafter,
        prior=parse_prior(args.prior) if args.prior else None, prior_std=args.prior_std, drafter_kind=kind,
        probe_draft_tokens=args.max_draft_tokens, noise=args.noise_pct / 100, smoothness=args.smoothness_pct / 100)
    report = fit_runs(runs, config)
    prefill = _numbers(args.prefill, 2, "--prefill", "FIXED_S,TOKENS_PER_S") if args.prefill else None
    if prefill is not None and prefill[1] <= 0:
        raise ResultsError(f"--prefill: tokens_per_s must be > 0, got {args.prefill!r}")
    options = ExportOptions(
        device=args.device, model=_model_name(runs, args.model), gpus_per_replica=args.gpus_per_replica,
        drafter_kind=kind, max_requests=args.max_requests, max_draft_tokens=args.max_draft_tokens,
        max_context_tokens=args.max_context_tokens, prefill=prefill,  # type: ignore[arg-type]
        scheduler=_numbers(args.scheduler_cost, 2, "--scheduler-cost", "FIXED_S,PER_CANDIDATE_S"),  # type: ignore[arg-type]
        **({"created": args.created} if args.created else {}))
    text = full_report(report)
    if args.check:
        held_out = [observe(r, config.tpot, config.batch, config.step) for r in read_results(args.check, args.format)]
        text += "\n\n" + check_table(report, held_out)
    return profiles(report, options), text


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        profile, text = run(argv)
    except (ResultsError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(profile, indent=1) + "\n")
    print(text)
    print(f"\nwrote {args.out} (version 2, source: fitted; {len(profile['metadata']['fit']['alternatives'])} "
          "alternative profile(s) in metadata.fit.alternatives)")
