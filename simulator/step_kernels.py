"""Compiled kernels (numba) of a decode step's bookkeeping: one pass over the requests instead of a handful of
numpy calls (each costs a microsecond or so whatever R, which is most of a step's bookkeeping).

Integer arithmetic only: the results are those of the numpy formulations exactly.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def settle_lengths(lengths: np.ndarray, accepted: np.ndarray, remaining: np.ndarray, good: np.ndarray,
                   remaining_after: np.ndarray) -> tuple[int, int, int, int, bool]:
    """A step's outcome: ``good`` [R] = min(l_r, accepted_r, remaining_r - 1) (the accepted draft tokens a request
    keeps: none past its end), ``remaining_after`` [R] = remaining_r - 1 - good_r -> (sum of l_r, sum of good,
    sum of min(l_r, accepted_r) (the verifier's accepted draft tokens, kept or not), the longest l_r (0 for none),
    some request ends)."""
    total = good_sum = accepted_sum = longest = 0
    ends = False
    for r in range(lengths.size):
        count = min(lengths[r], accepted[r])
        accepted_sum += count
        left = remaining[r] - 1
        if left < count:
            count = left
        good[r] = count
        remaining_after[r] = left - count
        ends = ends or left == count
        total += lengths[r]
        good_sum += count
        longest = max(longest, lengths[r])
    return total, good_sum, accepted_sum, longest, ends


@numba.njit(cache=True)
def apply_lengths(remaining: np.ndarray, num_verified: np.ndarray, num_accepted: np.ndarray, lengths: np.ndarray,
                  accepted: np.ndarray, remaining_after: np.ndarray, verified_counts: np.ndarray,
                  accepted_counts: np.ndarray, measured: bool) -> None:
    """A settled step is applied: the requests' ``remaining`` and counters [R] in place; when ``measured``, the
    histograms of verified and accepted lengths [g + 1] count its request-steps. Accepted draft tokens are counted
    as the verifier accepted them, min(l_r, accepted_r), including any past the request's end that it does not
    keep (as vLLM counts them)."""
    for r in range(lengths.size):
        remaining[r] = remaining_after[r]
        num_verified[r] += lengths[r]
        count = min(lengths[r], accepted[r])
        num_accepted[r] += count
        if measured:
            verified_counts[lengths[r]] += 1
            accepted_counts[count] += 1
