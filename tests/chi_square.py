"""Pearson's chi-square goodness-of-fit test at a fixed false-failure rate, for the Monte Carlo lossless checks."""

from __future__ import annotations

import numpy as np
from scipy.stats import chi2

FALSE_FAILURE_RATE = 1e-6


def chi_square(observed: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """Statistic and critical value; cells expecting < 5 are pooled into one."""
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(((obs - exp) ** 2 / exp).sum()), float(chi2.isf(FALSE_FAILURE_RATE, obs.size - 1))
