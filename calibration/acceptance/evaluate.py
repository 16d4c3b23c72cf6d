"""Measure the trained drafters on held-out text: write an acceptance log, print tau and Figure 2 analogues.

    python -m calibration.evaluate --out outputs/acceptance/tiny_byte.parquet

For every domain, ``--num-requests`` held-out prompts are decoded by the trained target
at temperature 1 with each drafter proposing ``gamma`` tokens, all of them verified
(policy ``mtp<gamma>``: no scheduler, as Table 1), until each request has
``--new-tokens`` tokens; only steps of requests still decoding are logged. The same
prompts (``request_id``) are used for every drafter. The tables put the measured tau and
conditional acceptance next to the paper's Qwen3-4B values (Table 1 domain means and the
Figure 2 fit of :mod:`simulator.acceptance.presets`).

``--dense`` keeps one token per step instead: every output position gets a fully
verified block, the log the simulator replays in order (``drafter.log_order=walk``).
Its tau is then a mean over every position of the text, not over the steps ``mtp<gamma>``
takes, so it is not Table 1's figure.

``--prompt-sigma S`` draws each prompt's length from a lognormal around ``--prompt-tokens`` (sigma S, rounded up
as the simulator's traffic rounds lengths, at most four times the median as ``calibration.validate`` truncates its
prompts) instead of giving every prompt that length, so that a dense log's blocks follow prompts as varied as a
traffic's; outputs still run to ``--new-tokens``, so every request has a block at every position up to it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from calibration.models import checkpoints
from calibration.models.drafters import Drafter
from calibration.models.model import Verifier
from calibration.serving.specdec import FLAT_COST, SpeculativeDecoder
from calibration.training.corpora import domains_of, load_corpus, sample_prompts
from calibration.training.train import TrainConfig, heldout_report
from policies import make_policy
from simulator.acceptance.logs import AcceptanceRecorder, summary, write_log
from simulator.acceptance.presets import TABLE1_QWEN3_4B, preset
from traces.synthetic import LengthSpec, RequestSampler, TrafficSpec
from traces.workload import DOMAINS


def decode_and_record(target: Verifier, drafter: Drafter, prompts: list[list[int]], num_tokens: int | np.ndarray,
                      gamma: int, domain: str, rng: np.random.Generator, generator: torch.Generator,
                      max_kept_tokens: int | None = None) -> pd.DataFrame:
    """Decode ``prompts`` with every draft token verified; log each step of each request still decoding.

    ``num_tokens``: output tokens to decode, one number or one per prompt. ``max_kept_tokens=1`` keeps one
    token per step, which records a *dense* log (a block at every output position, for in-order replay).
    """
    targets = np.broadcast_to(np.asarray(num_tokens, dtype=np.int64), (len(prompts),))
    decoder = SpeculativeDecoder(target, drafter, make_policy(f"mtp{gamma}"), FLAT_COST, gamma)
    recorder = AcceptanceRecorder(drafter.kind, domain, gamma, range(len(prompts)))
    decoder.start(prompts, int(targets.max()))
    while True:
        decoded = np.array([len(o) for o in decoder.outputs])
        active = decoded < targets
        if not active.any():
            break
        rec = decoder.step(rng, generator, max_kept_tokens)
        recorder.record(rec.lengths, rec.accepted, rec.confidence, rec.draft_prob, rec.analytic_acceptance, active,
                        decoded)
    return recorder.frame()


def prompt_lengths(median_tokens: int, sigma: float, num_prompts: int, rng: np.random.Generator) -> int | np.ndarray:
    """Prompt lengths: ``median_tokens`` each when ``sigma`` is 0 (nothing drawn), else drawn by the simulator's
    traffic sampler (lognormal around the median with that sigma, rounded up), at most four times the median
    (``calibration.validate``'s default prompt limit)."""
    if sigma == 0.0:
        return median_tokens
    spec = TrafficSpec(domain_mix={"chat": 1.0}, max_prompt_tokens=4 * median_tokens,
                       lengths={d: LengthSpec(median_tokens, sigma, 1.0, 0.0) for d in DOMAINS})
    return RequestSampler(spec).sample(rng, num_prompts)[1]  # the outputs' lengths are not used


def paper_tables(measured: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(tau table, per-position table) with the paper's values beside the measured ones."""
    order = {d: i for i, d in enumerate(DOMAINS)}
    measured = measured.sort_values(["drafter", "domain"], key=lambda c: c.map(order) if c.name == "domain" else c)
    tau = measured[["drafter", "domain", "num_requests", "num_blocks", "tau"]].copy()
    tau["paper_tau"] = [float(np.mean(TABLE1_QWEN3_4B[d][m])) if d in TABLE1_QWEN3_4B else np.nan
                        for d, m in zip(tau["drafter"], tau["domain"], strict=True)]
    q_cols = [c for c in measured.columns if c.startswith("q")]
    rows = []
    for _, r in measured.iterrows():
        rows.append({"drafter": r["drafter"], "domain": r["domain"], "source": "measured",
                     **{c: r[c] for c in q_cols}})
        curve = preset(r["drafter"], r["domain"]).conditional(len(q_cols))
        rows.append({"drafter": r["drafter"], "domain": r["domain"],
                     "source": "paper" if r["drafter"] != "mtp" else "preset (assumed)",
                     **{c: curve[i] for i, c in enumerate(q_cols)}})
    return tau, pd.DataFrame(rows)


def teacher_forced_table(target: Verifier, directory: Path, kinds: list[str], domains: tuple[str, ...]) -> pd.DataFrame:
    """Mean 1 - TV(p_d, p_t) per position with the corpus prefix fed to the drafter (as in training)."""
    drafters = {kind: checkpoints.load_drafter(kind, target, directory) for kind in kinds}
    report = heldout_report(target, drafters, [load_corpus(d, "heldout") for d in domains], TrainConfig())
    rows = [{"drafter": kind, "domain": domain,
             **{f"k{k + 1}": v for k, v in enumerate(entry[f"{kind}_teacher_forced_acceptance"])}}
            for kind in kinds for domain, entry in report.items()]
    return pd.DataFrame(rows).sort_values(["drafter"], kind="stable")


def markdown(df: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub markdown table (no extra dependency)."""
    def cell(v: object) -> str:
        if isinstance(v, float | np.floating):
            return "-" if np.isnan(v) else f"{v:.{digits}f}"
        return str(v)

    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def figure2(measured: pd.DataFrame, path: Path) -> None:
    """Conditional acceptance per position: measured (solid) and the paper's fit (dashed), one panel per domain."""
    # Imported here, not at the top: matplotlib is slow to import and only --figure needs it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    domains = [d for d in DOMAINS if d in set(measured["domain"])]
    q_cols = [c for c in measured.columns if c.startswith("q")]
    fig, axes = plt.subplots(1, len(domains), figsize=(4.2 * len(domains), 3.4), squeeze=False)
    colors = {"dflash": "tab:blue", "eagle3": "tab:orange", "dspark": "tab:green", "mtp": "tab:purple"}
    k = np.arange(1, len(q_cols) + 1)
    for ax, domain in zip(axes[0], domains, strict=True):
        for _, r in measured[measured["domain"] == domain].iterrows():
            color = colors.get(r["drafter"], "gray")
            ax.plot(k, r[q_cols].to_numpy(float), "o-", color=color, label=f"{r['drafter']} (tiny, measured)")
            ax.plot(k, preset(r["drafter"], domain).conditional(len(k)), "--", color=color, alpha=0.5)
        ax.set_title(domain)
        ax.set_xlabel("draft position")
    axes[0, 0].set_ylabel("conditional acceptance")
    axes[0, -1].legend(fontsize=7, title="dashed: paper (Qwen3-4B) fit", title_fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", type=Path, default=checkpoints.DEFAULT_DIR)
    parser.add_argument("--out", type=Path, default=Path("outputs/acceptance/tiny_byte.parquet"))
    parser.add_argument("--drafters", default="dspark,dflash,eagle3,mtp")
    parser.add_argument("--domain", default="all")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=96)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--figure", type=Path, default=None, help="write the Figure 2 analogue PNG here")
    parser.add_argument("--dense", action="store_true",
                        help="keep one token per step: a verified block at every output position (in-order replay)")
    parser.add_argument("--prompt-sigma", type=float, default=0.0,
                        help="lognormal sigma of the prompt lengths around --prompt-tokens, at most 4x it "
                             "(default 0: every prompt --prompt-tokens long)")
    args = parser.parse_args(argv)
    if not args.prompt_sigma >= 0.0:
        parser.error(f"--prompt-sigma must be >= 0 (0: fixed lengths), got {args.prompt_sigma}")
    if args.threads:
        torch.set_num_threads(args.threads)
    target = checkpoints.load_target(args.checkpoints)
    frames = []
    start = time.perf_counter()
    for d_idx, domain in enumerate(domains_of(args.domain)):
        prompts = sample_prompts(load_corpus(domain, "heldout"), args.num_requests,
                                 prompt_lengths(args.prompt_tokens, args.prompt_sigma, args.num_requests,
                                                np.random.default_rng([args.seed, d_idx, 1])),
                                 np.random.default_rng([args.seed, d_idx]))
        for k_idx, kind in enumerate(args.drafters.split(",")):
            drafter = checkpoints.load_drafter(kind, target, args.checkpoints)
            seeds = np.random.SeedSequence([args.seed, d_idx, k_idx])
            generator = torch.Generator().manual_seed(int(seeds.generate_state(1)[0]))
            frames.append(decode_and_record(target, drafter, prompts, args.new_tokens, args.gamma, domain,
                                            np.random.default_rng(seeds), generator,
                                            max_kept_tokens=1 if args.dense else None))
    log = pd.concat(frames, ignore_index=True)
    write_log(log, args.out)
    measured = summary(log, str(args.out))
    tau, positions = paper_tables(measured)
    print(f"wrote {len(log)} rows to {args.out} ({time.perf_counter() - start:.0f} s)\n")
    print("tau (accepted length incl. bonus), gamma =", args.gamma)
    print(markdown(tau, 2))
    print("\nposition-wise conditional acceptance q_k")
    print(markdown(positions))
    print("\nteacher-forced acceptance 1 - TV per position (true prefix, no survivor selection; held-out text)")
    print(markdown(teacher_forced_table(target, args.checkpoints, args.drafters.split(","),
                                        domains_of(args.domain))))
    if args.figure:
        figure2(measured, args.figure)
        print(f"\nwrote {args.figure}")


if __name__ == "__main__":
    main()
