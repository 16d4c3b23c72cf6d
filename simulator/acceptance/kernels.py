"""Compiled kernels (numba) of the parametric acceptance model's sampling.

The kernel does in one pass what the numpy formulation did in a dozen array
operations, with the same floating-point operations in the same order (no
fused multiply-adds: numba does not contract without ``fastmath``), so its
values are the numpy ones bit for bit. The normals are drawn by the caller's
``np.random.Generator`` and the normal CDF stays numpy's (``scipy.special.ndtr``)
applied to the whole block afterwards: the stream and the values are unchanged.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True)
def latent_steps(draws: np.ndarray, table: np.ndarray, rows: np.ndarray, ease: np.ndarray, request_spread: float,
                 step_spread: float, num_draft_tokens: int, probit: np.ndarray, accepted: np.ndarray) -> None:
    """Fill ``probit`` [K, R, g] (the confidences before the normal CDF) and ``accepted`` [K, R].

    ``draws`` [K, 2 R g + R]: per step n0 [R, g], n1 [R, g], then the step's shifts [R]; ``table`` [C, 5, gamma]
    (mu, loading of W on n0, on n1, 1/psd, scale of A), ``rows`` [R] each request's row of it, ``ease`` [R]
    its z. Accepted draft count = index of the first position whose latent A + shift is <= 0 (g when none).
    """
    num_steps, num_requests = accepted.shape
    g = num_draft_tokens
    size = num_requests * g
    for k in range(num_steps):
        step = draws[k]
        for r in range(num_requests):
            row = rows[r]
            shift = request_spread * ease[r] + step_spread * step[2 * size + r]
            count = g
            for j in range(g):
                n0 = step[r * g + j]
                base = table[row, 0, j] + shift
                if count == g and table[row, 4, j] * n0 + base <= 0.0:
                    count = j
                value = base + table[row, 1, j] * n0
                value = value + table[row, 2, j] * step[size + r * g + j]
                probit[k, r, j] = value * table[row, 3, j]
            accepted[k, r] = count
