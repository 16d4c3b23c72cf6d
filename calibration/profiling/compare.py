"""Plot measured against analytic profiles, panel by panel.

    python -m calibration.compare MEASURED.json ANALYTIC.json --out fig.png

Top: SPS(B), steps per second over batch tokens, and B x SPS(B), batch tokens per
second (the dense verify cost; a CUDA-graph cliff shows as a drop), and one request's
attention over its context with 1, 2 and 9 query tokens (version 2). Bottom: the
drafters' step latency over requests at context 0 (every drafter kind the profiles
share, at one gamma), one prefill's latency over prompt tokens, and one prefill
chunk's attention over the tokens computed before it (version 2). Every curve is
labelled with its profile's own source (measured/analytic), model and device, and
the title names each file and the code revision that wrote it, so a figure can
never pass one off as the other.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from simulator.costs import HardwareProfile, load_profile  # noqa: E402

STYLES = {"measured": {"color": "tab:blue", "marker": "o", "markersize": 2.5},
          "analytic": {"color": "tab:orange", "linestyle": "--"}}
KIND_STYLES = ("-", "--", ":", "-.")
DRAFT_TOKENS = 8  # the gamma of the drafter panel (the nearest one every profile has, if not 8)
QUERY_TOKENS = (1, 2, 9)  # the attention panel's lines: decoding, verifying 1 and 8 draft tokens
CHUNK_TOKENS = 512  # the chunk-attention panel's chunk


def _provenance(p: HardwareProfile) -> str:
    """One title line: what the profile is, its file and the code that wrote it."""
    revision = p.metadata.get("code_revision")
    code = f"code {str(revision)[:12]}" if revision else "code revision not recorded"
    return f"{p.label}: {Path(p.path).name}, {code}, created {p.metadata.get('created', '?')}"


def _common_gamma(profiles: list[HardwareProfile], kinds: list[str]) -> int | None:
    """The gamma of the drafter panel: DRAFT_TOKENS if every table has it, else the nearest gamma all share."""
    shared = set.intersection(*({int(g) for g in p.draft[k].draft_tokens} for p in profiles for k in kinds))
    if not shared:
        return None
    return min(shared, key=lambda g: (abs(g - DRAFT_TOKENS), g))


def _draft_panel(ax: plt.Axes, profiles: list[HardwareProfile]) -> None:
    kinds = [k for k in profiles[0].draft if all(k in p.draft for p in profiles)]
    gamma = _common_gamma(profiles, kinds) if kinds else None
    if gamma is None:
        ax.text(0.5, 0.5, "no drafter table common to the profiles", ha="center", transform=ax.transAxes)
        return
    for p in profiles:
        for i, kind in enumerate(kinds):
            style = {**STYLES.get(p.source, {}), "linestyle": KIND_STYLES[i % len(KIND_STYLES)]}
            table = p.draft[kind]
            context = None if table.context_tokens is None else 0.0
            requests = table.num_requests
            latency_ms = [1e3 * p.draft_s(kind, int(r), gamma, context) for r in requests]
            ax.plot(requests, latency_ms, label=f"{kind}, {p.source}", **style)
    ax.set(xscale="log", yscale="log", xlabel="requests R", ylabel="draft step latency [ms]",
           title=f"drafter step, gamma = {gamma}, context 0")


def _prefill_panel(ax: plt.Axes, profiles: list[HardwareProfile]) -> None:
    for p in profiles:
        if p.prefill_table is not None:
            prompts = p.prefill_table.x[p.prefill_table.x >= 1]
        else:
            prompts = np.geomspace(1, 16384, 30)
        ax.plot(prompts, 1e3 * np.asarray(p.prefill_s(prompts)), label=p.label, **STYLES.get(p.source, {}))
    ax.set(xscale="log", yscale="log", xlabel="prompt tokens", ylabel="prefill latency [ms]",
           title="one request's prefill")


def _contexts(axis: np.ndarray) -> np.ndarray:
    """Contexts to plot a table over: its grid from 1,024 tokens up (log axes), or none."""
    return axis[axis >= 1024].astype(float)


def _attention_panel(ax: plt.Axes, profiles: list[HardwareProfile]) -> None:
    for p in profiles:
        table = p.attention
        if table is None:
            continue
        contexts = _contexts(table.x)
        for q, dash in zip(QUERY_TOKENS, KIND_STYLES, strict=False):
            if table.y[0] <= q <= table.y[-1] and contexts.size:
                ms = [1e3 * p.attention_s(np.array([c]), q) for c in contexts]
                ax.plot(contexts, ms, label=f"{q} query token{'s' if q > 1 else ''}, {p.source}",
                        **{**STYLES.get(p.source, {}), "linestyle": dash})
    if not ax.lines:
        ax.text(0.5, 0.5, "no attention table (version 1)", ha="center", transform=ax.transAxes)
    ax.set(xscale="log", xlabel="context tokens", ylabel="attention per request [ms]",
           title="one request's attention per step")
    ax.set_yscale("symlog", linthresh=0.1)  # a measured table may hold zeros (negative differences written as 0)
    ax.set_ylim(bottom=0)


def _chunk_panel(ax: plt.Axes, profiles: list[HardwareProfile]) -> None:
    for p in profiles:
        table = p.chunk_attention
        if table is None or not table.y[0] <= CHUNK_TOKENS <= table.y[-1]:
            continue
        contexts = _contexts(table.x)
        ms = [1e3 * p.chunk_attention_s(np.array([c]), np.array([CHUNK_TOKENS])) for c in contexts]
        ax.plot(contexts, ms, label=p.label, **STYLES.get(p.source, {}))
    if not ax.lines:
        ax.text(0.5, 0.5, f"no chunk-attention table with {CHUNK_TOKENS}-token chunks", ha="center",
                transform=ax.transAxes)
    ax.set(xscale="log", xlabel="tokens computed before the chunk", ylabel="chunk attention [ms]",
           title=f"a {CHUNK_TOKENS}-token prefill chunk's attention")
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_ylim(bottom=0)


def compare_figure(profiles: list[HardwareProfile]) -> plt.Figure:
    """The six-panel comparison figure of ``profiles`` (any number, usually one measured and one analytic)."""
    if not profiles:
        raise ValueError("nothing to compare: pass at least one profile")
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.4), constrained_layout=True)
    (ax_sps, ax_tps, ax_attention), (ax_draft, ax_prefill, ax_chunk) = axes
    for p in profiles:
        batch, sps = p.verify_sps.x, p.verify_sps.y
        style = STYLES.get(p.source, {})
        ax_sps.plot(batch, sps, label=p.label, **style)
        ax_tps.plot(batch, batch * sps, label=p.label, **style)
    ax_sps.set(xscale="log", yscale="log", xlabel="batch tokens B", ylabel="steps per second SPS(B)",
               title="verify step rate (context 0)")
    ax_tps.set(xscale="log", yscale="log", xlabel="batch tokens B", ylabel="B x SPS(B)  [tokens/s]",
               title="verified tokens per second")
    _attention_panel(ax_attention, profiles)
    _draft_panel(ax_draft, profiles)
    _prefill_panel(ax_prefill, profiles)
    _chunk_panel(ax_chunk, profiles)
    for ax in axes.flat:
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle("\n".join(_provenance(p) for p in profiles), fontsize=8)
    return fig


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        prog="python -m calibration.compare",
        description="Plot measured vs analytic costs of two hardware profiles (files or built-in names): verify "
                    "step rate, verified tokens/s, attention over context, drafter latency, prefill latency and "
                    "chunk attention.")
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
