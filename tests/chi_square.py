"""Pearson's chi-square goodness-of-fit test at a fixed false-failure rate, for the Monte Carlo lossless checks."""

from __future__ import annotations

import numpy as np
from scipy.stats import chi2, ncx2

FALSE_FAILURE_RATE = 1e-6
POWER = 0.999


def chi_square(observed: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """Statistic and critical value; cells expecting < 5 are pooled into one."""
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(((obs - exp) ** 2 / exp).sum()), float(chi2.isf(FALSE_FAILURE_RATE, obs.size - 1))


def samples_for_power(probs: np.ndarray, leak: float, power: float = POWER,
                      false_failure_rate: float = FALSE_FAILURE_RATE) -> int:
    """Samples needed so that the test rejects, with probability >= ``power``, a law ``leak`` away from ``probs``.

    The leak is the hardest one to see of its size: ``leak`` of probability moved
    between the two likeliest cells (a total-variation distance of ``leak``). Its
    noncentrality after n samples is n leak^2 (1/p_1 + 1/p_2); the degrees of
    freedom are those of the test over every cell. At the returned n the test
    still fails a lossless law with probability ``false_failure_rate`` only.
    """
    probs = np.sort(np.asarray(probs, dtype=np.float64))[::-1]
    if probs.size < 2 or not 0 < leak <= probs[1]:
        raise ValueError(f"samples_for_power: need two cells and 0 < leak <= the second largest probability, "
                         f"got {probs.size} cells and leak={leak}")
    dof = probs.size - 1
    critical = chi2.isf(false_failure_rate, dof)
    per_sample = leak ** 2 * (1.0 / probs[0] + 1.0 / probs[1])

    def enough(n: int) -> bool:
        return bool(ncx2.sf(critical, dof, n * per_sample) >= power)

    high = 1
    while not enough(high):
        high *= 2
    low = high // 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high
