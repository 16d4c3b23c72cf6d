"""Every request of a simulation as columns (struct of arrays), growing as requests arrive."""

from __future__ import annotations

import numpy as np
import pandas as pd

from traces.workload import DOMAINS

_FLOAT_COLUMNS = ("arrival_at", "prefill_start_at", "first_token_at", "decode_start_at", "finished_at", "difficulty")
_INT_COLUMNS = ("domain_idx", "prompt_tokens", "output_tokens", "engine", "num_steps",
                "num_verified_tokens", "num_accepted_tokens", "user")


class RequestStore:
    """Columns indexed by request id (0, 1, ...). Times are NaN until they happen.

    ``num_verified_tokens`` sums l_r over the request's steps and
    ``num_accepted_tokens`` the accepted draft tokens (bonus excluded; those accepted
    past the request's end in its last step too, as vLLM counts them).
    ``user`` is the closed-loop user that sent the request (-1 for open loop).
    With ``track_preemptions`` (paged KV) ``num_preemptions`` counts how often
    the request was preempted and recomputed.
    """

    def __init__(self, capacity: int = 1024, track_preemptions: bool = False) -> None:
        self.size = 0
        self._capacity = max(capacity, 1)
        self.columns: dict[str, np.ndarray] = {}
        for name in _FLOAT_COLUMNS:
            self.columns[name] = np.full(self._capacity, np.nan)
        for name in _INT_COLUMNS + (("num_preemptions",) if track_preemptions else ()):
            self.columns[name] = np.full(self._capacity, -1 if name in ("engine", "user") else 0, dtype=np.int64)
        self._expose()

    def _expose(self) -> None:
        """Each column as an attribute (``store.prompt_tokens``), rebound whenever the columns grow."""
        self.__dict__.update(self.columns)

    def __getattr__(self, name: str) -> np.ndarray:  # only reached for a name that is not a column
        raise AttributeError(name)

    def add(self, arrival_at: np.ndarray | float, domain_idx: np.ndarray, prompt_tokens: np.ndarray,
            output_tokens: np.ndarray, difficulty: np.ndarray, user: np.ndarray | None = None) -> np.ndarray:
        """Append requests (``arrival_at``: one time each, or one time for all); returns their ids."""
        n = domain_idx.shape[0]
        lo, hi = self.size, self.size + n
        self._reserve(hi)
        cols = self.columns
        cols["arrival_at"][lo:hi] = arrival_at
        cols["domain_idx"][lo:hi] = domain_idx
        cols["prompt_tokens"][lo:hi] = prompt_tokens
        cols["output_tokens"][lo:hi] = output_tokens
        cols["difficulty"][lo:hi] = difficulty
        if user is not None:
            cols["user"][lo:hi] = user
        self.size = hi
        return np.arange(lo, hi)

    def _reserve(self, needed: int) -> None:
        if needed <= self._capacity:
            return
        new_capacity = max(needed, 2 * self._capacity)
        for name, col in self.columns.items():
            fill = np.nan if col.dtype.kind == "f" else (-1 if name in ("engine", "user") else 0)
            grown = np.full(new_capacity, fill, dtype=col.dtype)
            grown[: self._capacity] = col
            self.columns[name] = grown
        self._capacity = new_capacity
        self._expose()

    def to_frame(self) -> pd.DataFrame:
        frame = pd.DataFrame({name: col[: self.size] for name, col in self.columns.items()})
        frame.insert(0, "request_id", np.arange(self.size))
        frame.insert(1, "domain", pd.Categorical.from_codes(frame.pop("domain_idx"), categories=list(DOMAINS)))
        return frame
