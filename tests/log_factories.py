"""Synthetic acceptance logs with known structure, for the log, replay, fitting and STS tests.

Request r has a persistent ease z_r ~ N(0, 1); at position k of a step the token is
accepted with probability ``p = sigmoid(logit(base_k) + request_spread * z_r + 0.5 * eps)``
(eps per step and position), sequentially until the first rejection. The logged
confidence is ``sigmoid(overconfidence * logit(p) + bias)``: informative about the
outcome, and miscalibrated unless overconfidence = 1 and bias = 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.acceptance.logs import AcceptanceRecorder

BASE_CURVES = {"math": (0.9, 0.86), "code": (0.85, 0.8), "chat": (0.7, 0.62)}  # (q_1, q_gamma), linear between


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p / (1.0 - p))


def synthetic_log(rng: np.random.Generator, drafter: str = "dspark", gamma: int = 7, num_requests: int = 150,
                  num_tokens: int = 60, request_spread: float = 1.0, overconfidence: float = 1.0,
                  bias: float = 0.0, domains: tuple[str, ...] = ("math", "code", "chat")) -> pd.DataFrame:
    """Each request decodes until it has ``num_tokens`` tokens, every draft token verified (as the evaluator)."""
    frames = []
    for domain in domains:
        first, last = BASE_CURVES[domain]
        base = _logit(np.linspace(first, last, gamma))  # [g]
        ease = request_spread * rng.standard_normal(num_requests)  # [R] persistent
        recorder = AcceptanceRecorder(drafter, domain, gamma, range(num_requests))
        produced = np.zeros(num_requests, dtype=np.int64)
        while (active := produced < num_tokens).any():
            logits = base[None, :] + ease[:, None] + 0.5 * rng.standard_normal((num_requests, gamma))
            p = 1.0 / (1.0 + np.exp(-logits))
            accepted = np.argmin(np.concatenate((rng.random(p.shape) < p, np.zeros((num_requests, 1), bool)),
                                                axis=1), axis=1)
            confidence = 1.0 / (1.0 + np.exp(-(overconfidence * logits + bias)))
            recorder.record(np.full(num_requests, gamma), accepted, confidence, np.full(p.shape, 0.5), p, active)
            produced += np.where(active, accepted + 1, 0)
        frames.append(recorder.frame())
    return pd.concat(frames, ignore_index=True)
