"""The parametric confidence head against the paper's Figure 6, measured on the model's own samples.

Figure 6 (page 15) is a reliability diagram of the prefix survival a_k of the
Qwen3-4B DSpark head on Alpaca: AUC of a_k against the survival of positions
1..k, and its ECE before and after sequential temperature scaling (STS), at
positions 1, 3, 5 and 7. Here the same preset (``qwen3-4b_dspark``, benchmark
``alpaca``) is decoded with the offline protocol (every draft verified, whole
requests), the rounds are split by request into halves, STS is fitted on one
and every figure is measured on the other, as ``calibration.acceptance.sts``
does for a real log.

``--solve`` derives the default head (``DEFAULT_AUC`` and
``DEFAULT_OVERCONFIDENCE`` of :mod:`simulator.acceptance.parametric`) from
Figure 6: a conditional AUC linear in the position whose survival AUCs fit
Figure 6's four by least squares, then a raw-head temperature linear in the
position whose raw ECEs of a_k fit Figure 6's likewise (two parameters each,
not one per point: the paper's figures carry sampling noise of their own).
Common random numbers (one seed) make each figure a smooth function of the
parameters.

    python -m calibration.acceptance.confidence            # the table, with the defaults
    python -m calibration.acceptance.confidence --solve    # the defaults again, from the paper
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from calibration.acceptance.sts import auc, ece, fit_sts, survival_outcomes
from simulator.acceptance.offline import OfflineResult, run_offline
from simulator.acceptance.paper import FIGURE6_AUC, FIGURE6_ECE_RAW, FIGURE6_ECE_STS, FIGURE6_POSITIONS
from simulator.acceptance.parametric import AcceptanceModel, ConfidenceSpec

PRESET, BENCHMARK, DOMAIN, GAMMA = "qwen3-4b_dspark", "alpaca", "chat", 7


def sample(confidence: ConfidenceSpec, seed: int = 0, num_requests: int = 4000,
           output_tokens: int = 64) -> tuple[OfflineResult, AcceptanceModel]:
    """Rounds of the Figure 6 setting with calibrated confidences (``model.raw`` gives the raw head's)."""
    model = AcceptanceModel(PRESET, GAMMA, confidence=replace(confidence, calibrated=True),
                            benchmark_mix={BENCHMARK: 1.0})
    result = run_offline(model, DOMAIN, GAMMA, np.random.default_rng(seed), num_requests, output_tokens, collect=True)
    return result, model


def survival_auc(confidence: np.ndarray, accepted: np.ndarray, k: int) -> float:
    """AUC of a_k = prod_{i<=k} c_i against the survival of positions 1..k, over all rounds (k is 1-based)."""
    return auc(np.prod(confidence[:, :k], axis=1), accepted >= k)


def survival_ece(confidence: np.ndarray, accepted: np.ndarray, k: int) -> float:
    return ece(np.prod(confidence[:, :k], axis=1), (accepted >= k).astype(float))


def figure6_table(result: OfflineResult, model: AcceptanceModel, seed: int = 1) -> pd.DataFrame:
    """Per position: AUC and ECE of a_k (calibrated, raw, raw after STS fitted on the other half of requests)."""
    calibrated, accepted = result.confidence, result.accepted
    raw = model.raw(calibrated)
    requests = np.unique(result.request)
    fit_half = np.isin(result.request, np.random.default_rng(seed).permutation(requests)[: requests.size // 2])
    sts = fit_sts(raw[fit_half], accepted[fit_half]).apply(raw[~fit_half])
    held = accepted[~fit_half]
    survived = survival_outcomes(held, GAMMA)
    rows = []
    for k in range(1, GAMMA + 1):
        paper = dict(zip(FIGURE6_POSITIONS, zip(FIGURE6_AUC, FIGURE6_ECE_RAW, FIGURE6_ECE_STS, strict=True),
                         strict=True)).get(k, (np.nan,) * 3)
        rows.append({"position": k, "observed": survived[:, k - 1].mean(),
                     "auc": survival_auc(calibrated[~fit_half], held, k), "auc_paper": paper[0],
                     "ece_calibrated": survival_ece(calibrated[~fit_half], held, k),
                     "ece_raw": survival_ece(raw[~fit_half], held, k), "ece_raw_paper": paper[1],
                     "ece_sts": survival_ece(sts, held, k), "ece_sts_paper": paper[2]})
    return pd.DataFrame(rows)


def _linear(start: float, slope: float) -> tuple[float, ...]:
    return tuple(start + slope * k for k in range(GAMMA))


def _least_squares(residuals, start: tuple[float, float]) -> tuple[float, float]:
    found = minimize(lambda p: float(np.sum(np.square(residuals(*p)))), np.array(start), method="Nelder-Mead",
                     options={"xatol": 1e-4, "fatol": 1e-8, "maxiter": 200})
    return float(found.x[0]), float(found.x[1])


def solve_aucs(seed: int = 0) -> tuple[float, ...]:
    """Conditional AUC, linear in the position, whose survival AUCs fit Figure 6's by least squares."""
    def residuals(start: float, slope: float) -> np.ndarray:
        aucs = _linear(start, slope)
        if min(aucs) <= 0.55 or max(aucs) >= 0.95:
            return np.full(len(FIGURE6_POSITIONS), 1.0)  # outside what the head can reach: a large penalty
        result, _ = sample(ConfidenceSpec(auc=aucs), seed)
        return np.array([survival_auc(result.confidence, result.accepted, k) for k in FIGURE6_POSITIONS]) - \
            np.array(FIGURE6_AUC)

    return tuple(round(a, 3) for a in _linear(*_least_squares(residuals, (0.818, 0.0))))


def solve_overconfidence(aucs: tuple[float, ...], seed: int = 0) -> tuple[float, ...]:
    """Raw-head temperature, linear in the position, whose raw ECE of a_k fits Figure 6's by least squares."""
    result, model = sample(ConfidenceSpec(auc=aucs), seed)

    def residuals(start: float, slope: float) -> np.ndarray:
        temperatures = _linear(start, slope)
        if min(temperatures) <= 0.0:
            return np.full(len(FIGURE6_POSITIONS), 1.0)
        spec = ConfidenceSpec(auc=aucs, calibrated=False, overconfidence=temperatures)
        raw = AcceptanceModel(model.preset, GAMMA, confidence=spec, benchmark_mix={BENCHMARK: 1.0}).raw(
            result.confidence)
        return np.array([survival_ece(raw, result.accepted, k) for k in FIGURE6_POSITIONS]) - \
            np.array(FIGURE6_ECE_RAW)

    return tuple(round(t, 2) for t in _linear(*_least_squares(residuals, (1.5, 0.0))))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--solve", action="store_true", help="derive the default head from Figure 6")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    spec = ConfidenceSpec()
    if args.solve:
        aucs = solve_aucs(args.seed)
        temperatures = solve_overconfidence(aucs, args.seed)
        print(f"DEFAULT_AUC = {aucs}\nDEFAULT_OVERCONFIDENCE = {temperatures}")
        spec = ConfidenceSpec(auc=aucs, overconfidence=temperatures)
    result, model = sample(spec, args.seed + 100)  # a fresh sample: the figures are not those solved on
    table = figure6_table(result, model)
    print(f"Figure 6 setting ({PRESET}, {BENCHMARK}, gamma {GAMMA}), {result.num_rounds} rounds, halves by request:")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"mean ECE: raw {table['ece_raw'].mean():.4f} -> STS {table['ece_sts'].mean():.4f} "
          f"(paper, positions 1/3/5/7: {np.mean(FIGURE6_ECE_RAW):.4f} -> {np.mean(FIGURE6_ECE_STS):.4f})")


if __name__ == "__main__":
    main()
