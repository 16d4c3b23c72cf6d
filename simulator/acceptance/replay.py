"""Replay of acceptance logs: confidences and accepted counts resampled from a real drafter/verifier run.

Same interface as :class:`simulator.acceptance.AcceptanceModel`. How a log is replayed:

* **Request persistence.** ``request_difficulty`` draws a uniform quantile u in [0, 1)
  per simulated request. In ``sample_step`` the request of domain d replays logged
  request ``floor(u * n_d)`` of that domain (requests sorted by id), for its whole
  life: a hard logged request stays hard.
* **Steps, in order** (``order="walk"``). A simulated request that has decoded p
  output tokens replays the logged request's block recorded when it had decoded p
  tokens (the last block at or before p), so it walks through the logged text as a
  real request would: confidence and acceptance keep their dependence on the
  context length and on the part of the text being written, and which positions a
  request visits depends on how far the policy lets it advance. Exact for a
  *dense* log, one block at every output position
  (``calibration.specdec.SpeculativeDecoder.step(max_kept_tokens=1)``): with it a
  request's outcomes are those of the logged model at each position it reaches.
  Needs the log's ``decoded_tokens`` column; a position past the logged request's
  last block (and the tokens that block accepted) is an error: record the log at
  least as long as the simulated outputs.
* **Steps, independent** (``order="independent"``). Each simulated step draws one of
  that logged request's blocks uniformly with replacement. Logged requests are
  equally likely; a simulated request runs as many steps as its output length
  needs, so easy logged requests contribute fewer steps, as they did in the log;
  but the population of blocks is the one the logging policy visited (``mtp<gamma>``
  visits hard stretches of text more densely than ``mtp1``), and the step-to-step
  correlation is lost.
* ``order="auto"`` (default) walks dense logs and draws the others independently.
* **After the first rejection** the log's outcomes are null: those tokens were
  discarded and carry no information, and none is needed, because the accepted count
  is fixed by the first rejection. Confidences exist at every position and are
  replayed as logged.
* **Fewer draft tokens** than the logged gamma: the first g positions of the block
  (accepted count capped at g). **More** than the logged gamma: an error by default;
  with ``beyond_logged="chain"`` positions gamma+1.. come from further blocks of the
  same request drawn independently, and survive only if every earlier block was fully
  accepted - an assumption (conditional acceptance restarts as at position 1).
* Only fully verified blocks can be replayed: a block that verified fewer than gamma
  positions and accepted them all is censored, and the log is refused.

Confidences come from the ``confidence`` column (the head's c_k). Drafters without a
head log none; ``confidence_column="auto"`` (default) then uses ``draft_prob``, the
drafter's probability of its own token, as an uncalibrated stand-in. A column null in
only some rows is an error: the source of confidences never changes silently, and
:meth:`LoggedAcceptance.describe` records which column was replayed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from simulator.acceptance.logs import LogError, read_log, to_blocks
from traces.workload import DOMAINS

BeyondLogged = Literal["error", "chain"]
Order = Literal["auto", "walk", "independent"]


class LoggedAcceptance:
    """Samples, per engine step, confidences [R, g] and accepted draft counts [R] from an acceptance log."""

    def __init__(self, log: str | Path | pd.DataFrame, drafter: str | None = None, gamma: int | None = None,
                 confidence_column: Literal["auto", "confidence", "draft_prob"] = "auto",
                 beyond_logged: BeyondLogged = "error", order: Order = "auto") -> None:
        source = str(log) if not isinstance(log, pd.DataFrame) else "<frame>"
        df = read_log(log) if not isinstance(log, pd.DataFrame) else log
        drafters = sorted(df["drafter"].unique())
        if drafter is None:
            if len(drafters) != 1:
                raise LogError(f"acceptance log {source} holds drafters {drafters}; pass drafter=<one of them>")
            drafter = drafters[0]
        elif drafter not in drafters:
            raise LogError(f"acceptance log {source} has no drafter {drafter!r}; it holds {drafters}")
        if beyond_logged not in ("error", "chain"):
            raise ValueError(f"beyond_logged must be 'error' or 'chain', got {beyond_logged!r}")
        blocks = to_blocks(df[df["drafter"] == drafter], source)
        censored = blocks.censored
        if censored.any():
            i = int(np.flatnonzero(censored)[0])
            raise LogError(f"acceptance log {source}: {int(censored.sum())} block(s) verified fewer than "
                           f"gamma={blocks.gamma} positions without a rejection (first: domain "
                           f"{blocks.domain[i]}, request_id {blocks.request_id[i]}, step {blocks.step[i]}); "
                           f"replay needs logs recorded with every draft token verified")
        unknown = sorted(set(blocks.domain) - set(DOMAINS))
        if unknown:
            raise LogError(f"acceptance log {source}: unknown domain(s) {unknown}; valid: {', '.join(DOMAINS)}")
        self.drafter = drafter
        self.logged_gamma = blocks.gamma
        self.gamma = gamma if gamma is not None else blocks.gamma
        if self.gamma > self.logged_gamma and beyond_logged == "error":
            raise ValueError(f"gamma={self.gamma} exceeds the logged gamma={self.logged_gamma} of {source}; "
                             f"pass beyond_logged='chain' to chain logged blocks, or log a longer block")
        self.beyond_logged = beyond_logged
        self.source = source
        self.confidence, self.confidence_column = self._confidences(blocks, confidence_column, source)  # [N, G]
        self.num_accepted = blocks.num_accepted  # [N]
        # Blocks are sorted by (domain, request_id, step); requests by (domain, request_id).
        domain_idx = np.array([DOMAINS.index(d) for d in blocks.domain], dtype=np.int64)
        new_request = np.ones(blocks.request_id.size, dtype=bool)
        new_request[1:] = (blocks.request_id[1:] != blocks.request_id[:-1]) | (domain_idx[1:] != domain_idx[:-1])
        start = np.flatnonzero(new_request)
        count = np.diff(np.append(start, blocks.request_id.size))
        request_of_block = np.cumsum(new_request) - 1  # [N] rank of the block's request in block order
        self.order = self._order(blocks, order, source, np.arange(new_request.size) - start[request_of_block])
        grouped = np.argsort(domain_idx[start], kind="stable")  # group requests in DOMAINS order
        self.block_start, self.block_count = start[grouped], count[grouped]  # [Q] each logged request's blocks
        request_domain = domain_idx[self.block_start]  # [Q]
        self.requests_per_domain = np.bincount(request_domain, minlength=len(DOMAINS))  # [D]
        self.request_offset = np.concatenate(([0], np.cumsum(self.requests_per_domain)[:-1]))  # [D]
        # Walk lookup: block keys (request rank in block order) * span + decoded tokens grow strictly.
        self.decoded_tokens = blocks.decoded_tokens  # [N]
        self._request_rank = grouped  # [Q] rank of each (DOMAINS-grouped) logged request in block order
        self._key_span = int(blocks.decoded_tokens.max()) + 2 if blocks.decoded_tokens.size else 2
        self._keys = request_of_block * self._key_span + blocks.decoded_tokens  # [N]
        last = self.block_start + self.block_count - 1
        self.decoded_end = self.decoded_tokens[last] + self.num_accepted[last] + 1  # [Q] first position not covered

    def _order(self, blocks, order: str, source: str, step_in_request: np.ndarray) -> str:
        """The replay order; ``auto`` walks dense logs: every request has a block at every output position 0, 1,
        2, ... (``decoded_tokens`` equals the block's index within its request)."""
        if order not in ("auto", "walk", "independent"):
            raise ValueError(f"order must be auto, walk or independent, got {order!r}")
        known = blocks.decoded_tokens >= 0
        if order == "walk" and not known.all():
            raise LogError(f"acceptance log {source}: order='walk' needs the decoded_tokens column at every block "
                           f"({int((~known).sum())} block(s) have none); use order='independent'")
        if order == "auto":
            order = "walk" if np.array_equal(blocks.decoded_tokens, step_in_request) else "independent"
        if order == "walk" and self.beyond_logged == "chain" and self.gamma > self.logged_gamma:
            raise ValueError("beyond_logged='chain' draws further blocks independently; it needs "
                             "order='independent'")
        return order

    @staticmethod
    def _confidences(blocks, column: str, source: str) -> tuple[np.ndarray, str]:
        """The confidences to replay -> ([N, G], the column they come from).

        ``auto`` takes the head's ``confidence`` column, or ``draft_prob`` for a drafter that logged no confidence
        at all (no head); a column null in only some rows is an error, never a silent switch of the whole log.
        """
        if column not in ("auto", "confidence", "draft_prob"):
            raise ValueError(f"drafter.log_confidence must be auto, confidence or draft_prob, got {column!r}")
        drafter = blocks.drafter[0]
        if column == "auto":
            column = "draft_prob" if np.isnan(blocks.confidence).all() else "confidence"
        values = blocks.confidence if column == "confidence" else blocks.draft_prob
        missing = np.isnan(values)
        if missing.any():
            i = int(np.flatnonzero(missing.any(axis=1))[0])
            other = "draft_prob" if column == "confidence" else "confidence"
            raise LogError(f"acceptance log {source}: drafter {drafter!r} has {int(missing.sum())} null "
                           f"{column} value(s) (first: domain {blocks.domain[i]}, request_id {blocks.request_id[i]}, "
                           f"step {blocks.step[i]}); fill them or replay drafter.log_confidence={other}")
        return values, column

    def describe(self) -> dict[str, object]:
        """What the run's acceptance came from, for the summary."""
        return {"source": "log", "log": self.source, "drafter": self.drafter, "confidence_column":
                self.confidence_column, "order": self.order, "logged_gamma": self.logged_gamma}

    def request_difficulty(self, rng: np.random.Generator, num_requests: int) -> np.ndarray:
        """Persistent quantile u in [0, 1) per request -> [N]; selects the logged request it replays."""
        return rng.random(num_requests)

    def logged_request(self, domain_idx: np.ndarray, difficulty: np.ndarray) -> np.ndarray:
        """Index [R] (into the log's requests) replayed by simulated requests of ``domain_idx`` / ``difficulty``."""
        counts = self.requests_per_domain[domain_idx]
        if np.any(counts == 0):
            missing = sorted({DOMAINS[d] for d in np.unique(domain_idx[counts == 0])})
            raise ValueError(f"acceptance log {self.source} has no {self.drafter} requests of domain(s) {missing}")
        if np.any((difficulty < 0.0) | (difficulty >= 1.0)):
            raise ValueError("LoggedAcceptance difficulty must be a quantile in [0, 1) from its request_difficulty")
        return self.request_offset[domain_idx] + np.minimum((difficulty * counts).astype(np.int64), counts - 1)

    def _draw_blocks(self, rng: np.random.Generator, request: np.ndarray, num_chunks: int) -> np.ndarray:
        """[R, num_chunks] block indices drawn uniformly among each request's blocks."""
        u = rng.random((request.size, num_chunks))
        return self.block_start[request][:, None] + (u * self.block_count[request][:, None]).astype(np.int64)

    def _walk_blocks(self, request: np.ndarray, decoded_tokens: np.ndarray) -> np.ndarray:
        """[R] the block each request replays at its position: the last one logged at or before it."""
        keys = self._request_rank[request] * self._key_span + np.minimum(decoded_tokens, self._key_span - 1)
        block = np.searchsorted(self._keys, keys, side="right") - 1
        outside = (decoded_tokens < self.decoded_tokens[self.block_start[request]]) | (
            decoded_tokens >= self.decoded_end[request])
        if outside.any():
            i = int(np.flatnonzero(outside)[0])
            q = int(request[i])
            raise ValueError(f"acceptance log {self.source}: a simulated request at output position "
                             f"{int(decoded_tokens[i])} replays logged request {q} of its domain, which covers "
                             f"positions {int(self.decoded_tokens[self.block_start[q]])}.."
                             f"{int(self.decoded_end[q]) - 1}; record the log at least as long as the simulated "
                             f"outputs (traffic max_output_tokens), or replay with order='independent'")
        return block

    def sample_step(self, rng: np.random.Generator, domain_idx: np.ndarray, difficulty: np.ndarray,
                    num_draft_tokens: int, decoded_tokens: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Confidences [R, g] and accepted draft counts [R] for one step (g = num_draft_tokens).

        ``decoded_tokens`` [R]: output tokens each request has decoded so far (needed by ``order="walk"``).
        """
        g = num_draft_tokens
        num_requests = domain_idx.shape[0]
        if g == 0 or num_requests == 0:
            return np.zeros((num_requests, g)), np.zeros(num_requests, dtype=np.int64)
        if g > self.gamma:
            raise ValueError(f"{g} draft tokens requested but the logged acceptance was built for gamma={self.gamma}")
        request = self.logged_request(domain_idx, difficulty)
        if self.order == "walk":
            if decoded_tokens is None:
                raise ValueError("LoggedAcceptance(order='walk') needs each request's decoded_tokens")
            block = self._walk_blocks(request, np.asarray(decoded_tokens, dtype=np.int64))
            return self.confidence[block, :g], np.minimum(self.num_accepted[block], g)
        big = self.logged_gamma
        num_chunks = -(-g // big)
        block = self._draw_blocks(rng, request, num_chunks)  # [R, C]
        confidence = self.confidence[block].reshape(num_requests, num_chunks * big)[:, :g]
        counts = self.num_accepted[block]  # [R, C]
        # Chained blocks: the leading fully accepted chunks, then the first partial one.
        full = np.concatenate((counts == big, np.zeros((num_requests, 1), dtype=bool)), axis=1)
        leading = np.argmin(full, axis=1)  # [R] number of leading full chunks
        partial = np.take_along_axis(np.concatenate((counts, np.zeros((num_requests, 1), np.int64)), axis=1),
                                     leading[:, None], axis=1)[:, 0]
        return confidence, np.minimum(leading * big + partial, g)
