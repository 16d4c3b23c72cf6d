"""Plot measured against analytic step rates.

    python -m calibration.compare MEASURED.json ANALYTIC.json --out fig.png

Left: SPS(B), steps per second over batch tokens; right: B x SPS(B), batch tokens per
second. Every curve is labelled with its profile's own source (measured/analytic),
model and device, so a figure can never pass one off as the other.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from simulator.costs import HardwareProfile, load_profile  # noqa: E402

STYLES = {"measured": {"color": "tab:blue", "marker": "o", "markersize": 2.5},
          "analytic": {"color": "tab:orange", "linestyle": "--"}}


def compare_figure(profiles: list[HardwareProfile]) -> plt.Figure:
    """The two-panel comparison figure of ``profiles`` (any number, usually one measured and one analytic)."""
    if not profiles:
        raise ValueError("nothing to compare: pass at least one profile")
    fig, (ax_sps, ax_tps) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for p in profiles:
        batch, sps = p.verify_sps.x, p.verify_sps.y
        style = STYLES.get(p.source, {})
        ax_sps.plot(batch, sps, label=p.label, **style)
        ax_tps.plot(batch, batch * sps, label=p.label, **style)
    ax_sps.set(xscale="log", yscale="log", xlabel="batch tokens B", ylabel="steps per second SPS(B)",
               title="verify step rate")
    ax_tps.set(xscale="log", yscale="log", xlabel="batch tokens B", ylabel="B x SPS(B)  [tokens/s]",
               title="verified tokens per second")
    for ax in (ax_sps, ax_tps):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(" vs ".join(f"{p.metadata.get('model', '?')} on {p.metadata.get('device', '?')} ({p.source})"
                             for p in profiles), fontsize=10)
    return fig


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        prog="python -m calibration.compare",
        description="Plot measured vs analytic SPS(B) of two hardware profiles (files or built-in names).")
    parser.add_argument("measured", help="measured profile (path or built-in name)")
    parser.add_argument("analytic", help="analytic profile (path or built-in name)")
    parser.add_argument("--out", required=True, type=Path, help="figure path (.png, .pdf, .svg)")
    args = parser.parse_args(argv)
    fig = compare_figure([load_profile(args.measured), load_profile(args.analytic)])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=130)
    plt.close(fig)
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
