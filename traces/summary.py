"""``python -m traces.summary <sample-or-path>``: print a trace's statistics and write a PNG of them.

The table (requests, span, mean rate, burstiness, arrivals per second over
time, length percentiles) goes to standard output with the replay report (rows
skipped, dropped or capped); the figure (arrivals per second over time and
the two length histograms) is written to ``<out>/<trace>_summary.png``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from traces.formats import FORMATS
from traces.load import SAMPLES, load_trace
from traces.replay import ReplayOptions
from traces.stats import TraceStats, arrivals_per_s, compute_stats, format_stats, nice_bin_s
from traces.workload import DOMAINS, Workload

MAX_PLOT_BINS = 2000


def plot_summary(workload: Workload, stats: TraceStats, name: str) -> Figure:
    """Arrivals per second over time (top) and histograms of prompt and output lengths (bottom)."""
    figure = Figure(figsize=(11, 7.5), layout="constrained")
    grid = figure.add_gridspec(2, 2)
    rate_ax = figure.add_subplot(grid[0, :])
    bin_s = nice_bin_s(stats.span_s, MAX_PLOT_BINS)
    starts, rates = arrivals_per_s(workload.arrival_at, bin_s)
    rate_ax.stairs(rates, np.append(starts, starts[-1] + bin_s), linewidth=0.8)
    rate_ax.axhline(stats.mean_rate_per_s, color="tab:red", linestyle="--", linewidth=1,
                    label=f"mean {stats.mean_rate_per_s:.3g} req/s")
    rate_ax.set_xlabel("time since first request (s)")
    rate_ax.set_ylabel(f"arrivals per second (req/s, {bin_s:g} s bins)")
    rate_ax.set_title(f"arrivals over time (burstiness: inter-arrival CV {stats.interarrival_cv:.2f})")
    rate_ax.legend(loc="upper right")
    for column, (label, tokens) in enumerate((("prompt", workload.prompt_tokens), ("output", workload.output_tokens))):
        ax = figure.add_subplot(grid[1, column])
        low, high = int(tokens.min()), int(tokens.max())
        bins = np.geomspace(low, high + 1, 60) if high > low else np.array([low - 0.5, low + 0.5])
        ax.hist(tokens, bins=bins, color="tab:blue" if column == 0 else "tab:green")
        if high > low:
            ax.set_xscale("log")
        ax.set_xlabel(f"{label} length (tokens, log scale)")
        ax.set_ylabel("requests")
        lengths = stats.prompt_tokens if column == 0 else stats.output_tokens
        ax.set_title(f"{label} length: p50 {lengths.p50:,.0f}, p99 {lengths.p99:,.0f} tokens")
    figure.suptitle(f"{name}: {stats.num_requests:,} requests over {stats.span_s:,.1f} s "
                    f"(mean {stats.mean_rate_per_s:.3g} req/s)")
    return figure


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m traces.summary", description=__doc__.splitlines()[0])
    parser.add_argument("trace", help=f"a shipped sample ({', '.join(SAMPLES)}) or a trace file path")
    parser.add_argument("--format", choices=FORMATS, help="trace format (default: detected from the file)")
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the PNG (default: .)")
    parser.add_argument("--skip-bad-rows", action="store_true", help="leave out bad rows and count them")
    parser.add_argument("--zero-output", choices=("error", "drop", "one_token"), default="error",
                        help="what to do with requests that have 0 output tokens (failed requests)")
    parser.add_argument("--start-s", type=float, default=0.0, help="window start, s since the first request")
    parser.add_argument("--end-s", type=float, help="window end (exclusive), s since the first request")
    parser.add_argument("--max-requests", type=int, help="keep at most this many requests")
    parser.add_argument("--target-rate-per-s", type=float, help="scale arrival gaps to this mean rate")
    parser.add_argument("--max-output-tokens", type=int, help="cap output lengths (the count is reported)")
    parser.add_argument("--domain", choices=DOMAINS, help="give every request this domain")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        options = ReplayOptions(
            start_s=args.start_s, end_s=args.end_s, max_requests=args.max_requests,
            target_rate_per_s=args.target_rate_per_s, max_output_tokens=args.max_output_tokens,
            domain=args.domain, zero_output=args.zero_output, skip_bad_rows=args.skip_bad_rows,
            keep_prefix_hash_ids=False,
        )
        result = load_trace(args.trace, format=args.format, options=options)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    name = result.report.source
    stats = compute_stats(result.workload)
    print("\n".join(result.report.lines()))
    print()
    print("\n".join(format_stats(stats, name)))
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / f"{Path(name).stem}_summary.png"
    plot_summary(result.workload, stats, name).savefig(png, dpi=110)
    print(f"\nwrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
