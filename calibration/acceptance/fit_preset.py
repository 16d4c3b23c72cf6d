"""Fit parametric acceptance presets to an acceptance log, so :class:`AcceptanceModel` can stand in for replay.

Per domain the log gives the measured conditional acceptance q_1..q_G (Figure 2's
metric over fully verified blocks) and tau. :func:`fit_curve` turns q into the paper-fitting
family of :meth:`simulator.acceptance.curves.AcceptanceCurve.family` (smooth even where few
blocks reach a position): ``first = q_1`` and
``last = q_7`` are pinned, ``shape`` is solved so that the curve's tau over 7
positions equals the measured one (when no shape does - a non-monotone curve -
``shape`` is fitted by least squares and first and last are shifted together
until tau matches), and
``tail_decay`` is the geometric decay fitted to positions 8..G (1.0, i.e. flat, when
G = 7). The confidence AUC per position is the mean over domains of the AUC of c_k
against the outcome among blocks that reached position k - the quantity
:class:`simulator.acceptance.ConfidenceSpec` takes.

    fitted = fit_preset("outputs/acceptance/tiny_byte.parquet", drafter="dspark")
    name = fitted.install("tiny-dspark")          # adds simulator.acceptance.presets.PRESETS["tiny-dspark"]
    model = AcceptanceModel(name, 7, confidence=fitted.confidence_spec())

``python -m calibration.acceptance.fit_acceptance LOG.parquet`` writes the same preset to a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import brentq, minimize_scalar

from calibration.acceptance.sts import auc
from simulator.acceptance.curves import PAPER_POSITIONS, AcceptanceCurve
from simulator.acceptance.logs import LogError, conditional_acceptance, read_log, to_blocks
from simulator.acceptance.parametric import ConfidenceSpec
from simulator.acceptance.preset_file import AcceptancePreset
from simulator.acceptance.presets import install
from traces.workload import DOMAINS

_LOG_SHAPE_RANGE = (-5.0, 5.0)  # shape in [e^-5, e^5]


def fit_curve(q: np.ndarray) -> AcceptanceCurve:
    """Measured conditional acceptance q_1..q_G (G >= 7) -> the preset family (see the module docstring)."""
    q = np.asarray(q, dtype=float)
    if q.size < PAPER_POSITIONS or np.isnan(q).any():
        raise ValueError(f"need a measured acceptance at positions 1..{PAPER_POSITIONS} at least, got {q.tolist()}")
    first, last = float(q[0]), float(q[PAPER_POSITIONS - 1])
    tau7 = 1.0 + float(np.cumprod(q[:PAPER_POSITIONS]).sum())

    def gap(log_shape: float) -> float:
        return AcceptanceCurve.family(first, last, float(np.exp(log_shape))).tau() - tau7

    lo, hi = _LOG_SHAPE_RANGE
    if abs(first - last) < 1e-9:
        log_shape = 0.0
    elif gap(lo) * gap(hi) < 0:
        log_shape = brentq(gap, lo, hi, xtol=1e-10)
    else:  # outside the family's tau range (e.g. a non-monotone curve): best shape, then shift to match tau
        def sse(s: float) -> float:
            return float(((AcceptanceCurve.family(first, last, float(np.exp(s))).conditional(PAPER_POSITIONS)
                           - q[:7]) ** 2).sum())

        log_shape = minimize_scalar(sse, bounds=_LOG_SHAPE_RANGE, method="bounded").x

        def shifted_gap(delta: float) -> float:
            return AcceptanceCurve.family(first + delta, last + delta, float(np.exp(log_shape))).tau() - tau7

        lo_d, hi_d = -min(first, last) + 1e-9, 1.0 - max(first, last) - 1e-9
        if shifted_gap(lo_d) * shifted_gap(hi_d) < 0:
            delta = brentq(shifted_gap, lo_d, hi_d, xtol=1e-12)
            first, last = first + delta, last + delta
    decay = 1.0
    if q.size > PAPER_POSITIONS:
        steps = np.arange(1, q.size - PAPER_POSITIONS + 1)
        ratios = np.log(np.maximum(q[PAPER_POSITIONS:], 1e-9) / last)
        decay = float(min(np.exp((steps * ratios).sum() / (steps**2).sum()), 1.0))
    return AcceptanceCurve.family(first, last, float(np.exp(log_shape)), decay)


@dataclass(frozen=True)
class FittedPreset:
    """A log summarised for :class:`AcceptanceModel`: curves per domain and the confidence AUC."""

    drafter: str
    gamma: int  # logged block size
    source: str
    measured: dict[str, np.ndarray]  # domain -> measured q_1..q_G
    tau: dict[str, float]  # domain -> measured tau (bonus included)
    curves: dict[str, AcceptanceCurve]  # domain -> fitted preset curve
    auc_per_position: dict[str, np.ndarray]  # domain -> [G] conditional AUC of the confidence
    confidence_column: str

    @property
    def auc(self) -> float:
        values = np.concatenate(list(self.auc_per_position.values()))
        return float(np.nanmean(values))

    @property
    def auc_by_position(self) -> tuple[float, ...]:
        """[G] AUC per position, averaged over domains (the overall mean where no domain has one)."""
        stacked = np.vstack(list(self.auc_per_position.values()))
        with np.errstate(all="ignore"):
            per_position = np.nanmean(stacked, axis=0)
        return tuple(round(float(a), 4) if np.isfinite(a) else round(self.auc, 4) for a in per_position)

    def confidence_spec(self, calibrated: bool = True) -> ConfidenceSpec:
        """The fitted discrimination; ``calibrated`` as after STS (the parametric model is exactly calibrated)."""
        return ConfidenceSpec(auc=self.auc_by_position, calibrated=calibrated)

    def to_preset(self, name: str, target: str = "unknown") -> AcceptancePreset:
        """The curves as a preset named ``name`` (``target``: the model the log's drafter was verified by)."""
        return AcceptancePreset(
            name=name, target=target, drafter=self.drafter, domains=dict(self.curves), fit_positions=self.gamma,
            confidence_auc=self.auc_by_position,
            metadata={"source": {"kind": "acceptance-log", "reference": self.source,
                                 "confidence_column": self.confidence_column},
                      "inputs": [{"class": d, "domain": d, "gamma": self.gamma, "tau": round(self.tau[d], 6),
                                  "q": [round(float(x), 6) for x in q]} for d, q in self.measured.items()],
                      "notes": {d: f"fitted to {Path(self.source).name} ({self.drafter}/{d})" for d in self.curves}})

    def install(self, name: str) -> str:
        """Register the curves as the in-memory preset ``name`` (:func:`simulator.acceptance.presets.install`) and
        return ``name``; refuses to replace different curves under an existing name."""
        return install(self.to_preset(name))

    def table(self) -> pd.DataFrame:
        rows = []
        for domain, q in self.measured.items():
            fitted = self.curves[domain].conditional(q.size)
            rows.append({"domain": domain, "tau_log": self.tau[domain], "tau_fit": self.curves[domain].tau(q.size),
                         "max_abs_q_error": float(np.abs(fitted - q).max()),
                         "auc": float(np.nanmean(self.auc_per_position[domain]))})
        return pd.DataFrame(rows)


def fit_preset(log: str | Path | pd.DataFrame, drafter: str | None = None,
               confidence_column: str = "auto") -> FittedPreset:
    """Fit curves and AUC of one drafter's log (see the module docstring)."""
    source = str(log) if not isinstance(log, pd.DataFrame) else "<frame>"
    df = read_log(log) if not isinstance(log, pd.DataFrame) else log
    drafters = sorted(df["drafter"].unique())
    drafter = drafter if drafter is not None else (drafters[0] if len(drafters) == 1 else None)
    if drafter is None or drafter not in drafters:
        raise LogError(f"acceptance log {source} holds drafters {drafters}; pass drafter=<one of them>")
    measured, tau, curves, aucs = {}, {}, {}, {}
    column = confidence_column
    for domain in [d for d in DOMAINS if d in set(df["domain"])]:
        b = to_blocks(df[(df["drafter"] == drafter) & (df["domain"] == domain)], source)
        full = b.num_verified == b.gamma
        if not full.any():
            raise LogError(f"acceptance log {source}: {drafter}/{domain} has no fully verified block")
        n = b.num_accepted[full]
        measured[domain] = conditional_acceptance(n, b.gamma)
        tau[domain] = 1.0 + float(n.mean())
        curves[domain] = fit_curve(measured[domain])
        conf = b.confidence if column in ("auto", "confidence") else b.draft_prob
        if column == "auto" and np.isnan(conf).any():
            conf, column = b.draft_prob, "draft_prob"
        conf = conf[full]
        aucs[domain] = np.array([auc(conf[n >= k - 1, k - 1], n[n >= k - 1] >= k) for k in range(1, b.gamma + 1)])
    if not measured:
        raise LogError(f"acceptance log {source}: no blocks of drafter {drafter!r} in domains {DOMAINS}")
    gamma = next(iter(measured.values())).size
    return FittedPreset(drafter, gamma, source, measured, tau, curves, aucs,
                        "confidence" if column == "auto" else column)
