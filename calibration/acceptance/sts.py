"""Sequential temperature scaling (STS, DSpark paper sec. 3.2.1) of prefix survival, on acceptance logs (numpy).

The confidence head's c_k estimates P(x_k accepted | x_1..x_{k-1} accepted), so the
prefix survival ``a_k = prod_{i<=k} c_i`` estimates P(positions 1..k all accepted).
STS rescales each position's confidence on the logit scale,
``c'_k = sigmoid(logit(c_k) / T_k)``, choosing T_1, T_2, ... left to right: T_k is the
grid point that minimises the expected calibration error of ``a'_k = a'_{k-1} c'_k``
against the observed survival ``1[accepted >= k]``, with the earlier temperatures
fixed. A positive temperature is strictly increasing in c, so the order of the
confidences at a position never changes.

Metrics per position k, over fully verified blocks: ECE (equal-width bins, weighted by
bin counts), ROC-AUC and Brier score of a_k against survival. Temperatures are fitted
on one half of the requests and reported on the other (split by request, seeded).

    python -m calibration.acceptance.sts outputs/acceptance/tiny_byte.parquet --drafter dspark --figure sts.png
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.acceptance.logs import Blocks, read_log, to_blocks

DEFAULT_TEMPERATURES = np.geomspace(0.05, 20.0, 321)  # includes T = 1 (index 160)
_EPS = 1e-7
_STRIDE = 8  # coarse step of the temperature search, in grid points


def ece(predicted: np.ndarray, outcome: np.ndarray, num_bins: int = 10) -> float:
    """Expected calibration error with ``num_bins`` equal-width bins on [0, 1]."""
    return float(_ece_rows(np.asarray(predicted, float)[None, :], np.asarray(outcome, float), num_bins)[0])


def _ece_rows(predicted: np.ndarray, outcome: np.ndarray, num_bins: int) -> np.ndarray:
    """ECE of every row of predicted [M, N] against outcome [N] -> [M] (one bincount for all rows)."""
    m, n = predicted.shape
    bins = np.minimum((predicted * num_bins).astype(np.int64), num_bins - 1) + num_bins * np.arange(m)[:, None]
    size = m * num_bins
    pred_sum = np.bincount(bins.ravel(), weights=predicted.ravel(), minlength=size)
    out_sum = np.bincount(bins.ravel(), weights=np.broadcast_to(outcome, (m, n)).ravel(), minlength=size)
    return np.abs(pred_sum - out_sum).reshape(m, num_bins).sum(axis=1) / n


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """ROC-AUC (Mann-Whitney, ties count one half); NaN when one class is absent."""
    score, label = np.asarray(score, float), np.asarray(label, bool)
    n1, n0 = int(label.sum()), int((~label).sum())
    if n1 == 0 or n0 == 0:
        return float("nan")
    order = np.argsort(score, kind="mergesort")
    s = score[order]
    new = np.concatenate(([True], s[1:] != s[:-1]))
    first = np.flatnonzero(new)
    counts = np.diff(np.append(first, s.size))
    ranks = np.empty(s.size)
    ranks[order] = (first + (counts + 1) / 2.0)[np.cumsum(new) - 1]  # average 1-based rank of each tie group
    return float((ranks[label].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def brier(predicted: np.ndarray, outcome: np.ndarray) -> float:
    return float(np.mean((np.asarray(predicted, float) - np.asarray(outcome, float)) ** 2))


def temperature_scale(confidence: np.ndarray, temperature: np.ndarray | float) -> np.ndarray:
    """sigmoid(logit(c) / T), c clipped to [1e-7, 1 - 1e-7]."""
    c = np.clip(confidence, _EPS, 1.0 - _EPS)
    return 1.0 / (1.0 + np.exp(-np.log(c / (1.0 - c)) / temperature))


def survival_outcomes(num_accepted: np.ndarray, gamma: int) -> np.ndarray:
    """[N] accepted draft tokens -> [N, gamma] float: 1 where positions 1..k all survived."""
    return (num_accepted[:, None] >= np.arange(1, gamma + 1)[None, :]).astype(float)


@dataclass(frozen=True)
class StsCalibration:
    temperatures: np.ndarray  # [gamma] T_k

    def apply(self, confidence: np.ndarray) -> np.ndarray:
        """Raw c [N, g] (g <= gamma) -> calibrated c' [N, g]."""
        g = confidence.shape[1]
        if g > self.temperatures.size:
            raise ValueError(f"STS fitted for {self.temperatures.size} positions, got {g}")
        return temperature_scale(confidence, self.temperatures[None, :g])


def fit_sts(confidence: np.ndarray, num_accepted: np.ndarray, temperatures: np.ndarray = DEFAULT_TEMPERATURES,
            num_bins: int = 10) -> StsCalibration:
    """Grid-search T_k left to right on fully verified blocks: confidence [N, g], num_accepted [N].

    Per position the search is coarse to fine: every ``_STRIDE``-th grid point first, then every point within
    one stride of the best of those; the first minimum there wins (the smallest such T on the ascending grid).
    """
    if np.isnan(confidence).any():
        raise ValueError("STS needs a confidence at every position; got NaN (a drafter without a head?)")
    n, g = confidence.shape
    survived = survival_outcomes(num_accepted, g)
    c = np.clip(confidence, _EPS, 1.0 - _EPS)
    logits = np.log(c / (1.0 - c))  # [N, g]
    chosen = np.empty(g)
    prefix = np.ones(n)  # [N] calibrated a'_{k-1}

    def errors(k: int, index: np.ndarray) -> np.ndarray:
        candidates = prefix[None, :] / (1.0 + np.exp(-logits[None, :, k] / temperatures[index, None]))  # [T, N]
        return _ece_rows(candidates, survived[:, k], num_bins)

    size = temperatures.size
    coarse = np.unique(np.append(np.arange(0, size, _STRIDE), size - 1))
    for k in range(g):
        centre = int(coarse[np.argmin(errors(k, coarse))])
        window = np.arange(max(centre - _STRIDE, 0), min(centre + _STRIDE + 1, size))
        best = int(window[np.argmin(errors(k, window))])
        chosen[k] = temperatures[best]
        prefix = prefix * temperature_scale(confidence[:, k], temperatures[best])
    return StsCalibration(chosen)


def position_metrics(confidence: np.ndarray, num_accepted: np.ndarray, num_bins: int = 10) -> pd.DataFrame:
    """Per position: mean predicted survival, observed survival, ECE, AUC, Brier of a_k = prod c_i."""
    survival = np.cumprod(confidence, axis=1)
    survived = survival_outcomes(num_accepted, confidence.shape[1])
    rows = [{"position": k + 1, "predicted": survival[:, k].mean(), "observed": survived[:, k].mean(),
             "ece": ece(survival[:, k], survived[:, k], num_bins), "auc": auc(survival[:, k], survived[:, k] > 0),
             "brier": brier(survival[:, k], survived[:, k])} for k in range(confidence.shape[1])]
    return pd.DataFrame(rows)


def split_by_request(blocks: Blocks, rng: np.random.Generator, fit_fraction: float = 0.5) -> np.ndarray:
    """[N] True for blocks whose (domain, request) falls in the fitting half."""
    keys = pd.MultiIndex.from_arrays([blocks.domain, blocks.request_id])
    codes, uniques = pd.factorize(keys)
    chosen = rng.random(len(uniques)) < fit_fraction
    return chosen[codes]


@dataclass(frozen=True)
class StsReport:
    calibration: StsCalibration
    before: pd.DataFrame  # position_metrics of raw confidences on the evaluation half
    after: pd.DataFrame  # ... of STS-calibrated confidences
    confidence: np.ndarray  # [N, g] raw, evaluation half
    calibrated: np.ndarray  # [N, g]
    num_accepted: np.ndarray  # [N]

    def table(self) -> pd.DataFrame:
        t = self.before[["position", "observed"]].copy()
        t["T"] = self.calibration.temperatures
        for name in ("predicted", "ece", "auc", "brier"):
            t[f"{name}_raw"] = self.before[name]
            t[f"{name}_sts"] = self.after[name]
        return t


def sts_report(blocks: Blocks, confidence: np.ndarray, rng: np.random.Generator, num_bins: int = 10) -> StsReport:
    """Fit on one half of the requests, report before/after on the other."""
    full = blocks.num_verified == blocks.gamma
    if not full.all():
        raise ValueError(f"{int((~full).sum())} blocks were not verified to gamma; STS needs fully verified blocks")
    fit = split_by_request(blocks, rng)
    if fit.all() or not fit.any():
        raise ValueError("need at least two requests to split into fitting and evaluation halves")
    cal = fit_sts(confidence[fit], blocks.num_accepted[fit], num_bins=num_bins)
    held, acc = confidence[~fit], blocks.num_accepted[~fit]
    calibrated = cal.apply(held)
    return StsReport(cal, position_metrics(held, acc, num_bins), position_metrics(calibrated, acc, num_bins), held,
                     calibrated, acc)


def reliability_diagram(report: StsReport, path: Path, positions: tuple[int, ...] = (1, 3, 5, 7),
                        num_bins: int = 10, title: str = "") -> None:
    """Figure 6 analogue: observed vs predicted prefix survival per position, raw and after STS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = report.confidence.shape[1]
    positions = tuple(k for k in positions if k <= g) or (1,)
    fig, axes = plt.subplots(1, len(positions), figsize=(3.3 * len(positions), 3.4), squeeze=False)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    survived = survival_outcomes(report.num_accepted, g)
    for ax, k in zip(axes[0], positions, strict=True):
        hist = ax.twinx()
        for conf, color, label in ((report.confidence, "tab:red", "before"), (report.calibrated, "tab:blue", "after")):
            a = np.cumprod(conf, axis=1)[:, k - 1]
            idx = np.minimum((a * num_bins).astype(int), num_bins - 1)
            counts = np.bincount(idx, minlength=num_bins)
            obs = np.bincount(idx, weights=survived[:, k - 1], minlength=num_bins)
            pred = np.bincount(idx, weights=a, minlength=num_bins)
            ok = counts > 0
            ax.plot(pred[ok] / counts[ok], obs[ok] / counts[ok], "o-", color=color, ms=3, label=f"{label} STS")
            hist.bar(edges[:-1], counts, width=1.0 / num_bins, align="edge", color=color, alpha=0.12)
        hist.set_yticks([])
        ax.plot([0, 1], [0, 1], "k:", lw=1, label="perfect")
        b, a = report.before.iloc[k - 1], report.after.iloc[k - 1]
        ax.set_title(f"position {k}\nECE {100 * b.ece:.1f}% -> {100 * a.ece:.1f}%, AUC {b.auc:.3f}", fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_zorder(hist.get_zorder() + 1)
        ax.patch.set_visible(False)
        ax.set_xlabel("predicted prefix survival")
    axes[0, 0].set_ylabel("observed survival")
    axes[0, 0].legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--drafter", default="dspark")
    parser.add_argument("--domain", default="all", help="one domain or all (pooled)")
    parser.add_argument("--confidence-column", default="confidence", choices=("confidence", "draft_prob"))
    parser.add_argument("--bins", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--figure", type=Path, default=None)
    args = parser.parse_args(argv)
    df = read_log(args.log)
    df = df[df["drafter"] == args.drafter]
    if args.domain != "all":
        df = df[df["domain"] == args.domain]
    if df.empty:
        parser.error(f"{args.log} holds no rows for drafter {args.drafter!r}, domain {args.domain!r}")
    blocks = to_blocks(df, str(args.log))
    conf = blocks.confidence if args.confidence_column == "confidence" else blocks.draft_prob
    if np.isnan(conf).all():
        parser.error(f"{args.log}: drafter {args.drafter!r} logged no {args.confidence_column}; "
                     f"try --confidence-column draft_prob")
    report = sts_report(blocks, conf, np.random.default_rng(args.seed), args.bins)
    table = report.table()
    print(f"STS on {args.log}: drafter {args.drafter}, domain {args.domain}, {args.confidence_column}; "
          f"fitted on half of the requests, metrics on the other half ({report.num_accepted.size} blocks)")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"mean ECE raw {table['ece_raw'].mean():.4f} -> STS {table['ece_sts'].mean():.4f}")
    if args.figure:
        reliability_diagram(report, args.figure, num_bins=args.bins,
                            title=f"{args.drafter} ({args.confidence_column}), {args.domain}")
        print(f"wrote {args.figure}")


if __name__ == "__main__":
    main()
