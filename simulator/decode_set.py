"""The requests an engine is decoding: one int64 matrix [fields, R] in admission order (a struct of arrays).

Every field is a row of one matrix, so admitting, finishing or preempting
requests is one concatenation or one column selection whatever the number of
fields, and a step updates its rows in place. The rows are exposed as views
(``ids``, ``remaining``, ...), rebound whenever the set changes.

``num_steps`` is not stored per request: the set counts its decode steps
(every request in the set takes part in each of them) and a request's count is
the steps run since it joined.
"""

from __future__ import annotations

import numpy as np

from simulator.requests import RequestStore
from simulator.step_kernels import apply_lengths

_FIELDS = ("ids", "remaining", "held", "num_verified", "num_accepted", "joined_at_step", "last_index",
           "domain_idx", "difficulty_bits", "prompt_tokens")
_IDS, _REMAINING, _HELD, _VERIFIED, _ACCEPTED, _JOINED, _LAST, _DOMAIN, _DIFFICULTY, _PROMPT = range(len(_FIELDS))
_NO_COUNTS = np.zeros(0, dtype=np.int64)


class DecodeSet:
    """Decoding requests and their counters.

    * ``remaining`` - output tokens a request still has to emit;
    * ``held`` - KV units it holds (tokens when reserving, blocks when paged);
    * ``num_verified``, ``num_accepted`` - draft tokens verified and accepted (past its end too) since it
      joined or since the counters were last written to the store;
    * ``last_index`` - its output tokens minus one, so that ``decoded_tokens = last_index - remaining``;
    * ``domain_idx``, ``difficulty``, ``prompt_tokens`` - copied from the store when it joins.
    """

    def __init__(self) -> None:
        self.num_decode_steps = 0  # decode steps run by the engine
        self.version = 0  # changes whenever requests join or leave
        self._bind(np.empty((len(_FIELDS), 0), dtype=np.int64))

    def _bind(self, data: np.ndarray) -> None:
        self._data = data
        self.version += 1
        (self.ids, self.remaining, self.held, self.num_verified, self.num_accepted, self._joined, self._last_index,
         self.domain_idx, difficulty_bits, self.prompt_tokens) = data
        # The difficulty's float64 bits travel in the int64 matrix unchanged; this row reads them back as floats.
        self.difficulty = difficulty_bits.view(np.float64)
        self.size = data.shape[1]

    @property
    def names(self) -> tuple[str, ...]:
        return _FIELDS

    @property
    def num_steps(self) -> np.ndarray:
        """Decode steps each request took part in since it joined (or since its counters were written) -> [R]."""
        return self.num_decode_steps - self._joined

    def decoded_tokens(self) -> np.ndarray:
        """Output tokens each request has decoded after its prefill's first token -> [R]."""
        return self._last_index - self.remaining

    def add(self, store: RequestStore, ids: np.ndarray, remaining: np.ndarray, held: np.ndarray) -> None:
        """Requests that start (or resume) decoding, after the ones already here."""
        block = np.empty((len(_FIELDS), ids.size), dtype=np.int64)
        block[_IDS], block[_REMAINING], block[_HELD] = ids, remaining, held
        block[_VERIFIED] = block[_ACCEPTED] = 0
        block[_JOINED] = self.num_decode_steps
        block[_LAST] = store.output_tokens[ids] - 1
        block[_DOMAIN] = store.domain_idx[ids]
        block[_DIFFICULTY] = store.difficulty[ids].view(np.int64)
        block[_PROMPT] = store.prompt_tokens[ids]
        self._bind(np.concatenate((self._data, block), axis=1))

    def take(self, mask: np.ndarray) -> dict[str, np.ndarray]:
        """Remove the requests where ``mask`` is true; returns their columns (``ids``, ``remaining``, ``held`` and
        the counters ``num_steps``, ``num_verified``, ``num_accepted``)."""
        gone = self._data[:, mask]
        self._bind(self._data[:, ~mask])
        return self._columns(gone)

    def split(self, keep: int) -> dict[str, np.ndarray]:
        """Keep the first (oldest) ``keep`` requests; returns the others' columns as :meth:`take` does."""
        gone = self._data[:, keep:]
        self._bind(self._data[:, :keep])
        return self._columns(gone)

    def _columns(self, gone: np.ndarray) -> dict[str, np.ndarray]:
        return {"ids": gone[_IDS], "remaining": gone[_REMAINING], "held": gone[_HELD],
                "num_steps": self.num_decode_steps - gone[_JOINED], "num_verified": gone[_VERIFIED],
                "num_accepted": gone[_ACCEPTED]}

    def counters(self) -> dict[str, np.ndarray]:
        """The counters of every request here, as :meth:`take` returns them."""
        return self._columns(self._data)

    def reset_counters(self) -> None:
        """Count steps, verified and accepted tokens from zero again (after they were written to the store)."""
        self._data[_VERIFIED] = 0
        self._data[_ACCEPTED] = 0
        self._data[_JOINED] = self.num_decode_steps

    def steps_without_drafts(self, count: int) -> None:
        """Every request took part in ``count`` steps without draft tokens (one token each per step)."""
        self.num_decode_steps += count
        self.remaining -= count

    def step_done(self, lengths: np.ndarray | None, accepted: np.ndarray | None, remaining_after: np.ndarray | None,
                  histograms: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Every request took part in a step: ``lengths`` verified, ``accepted`` the true outcomes (counted up to
        l_r, past the request's end too), ``remaining_after`` output tokens still to emit; ``histograms`` (counts
        by verified and by accepted length, [g + 1] each), when given, count the step's request-steps. None for the
        first three: a step without draft tokens (each request emits one token)."""
        self.num_decode_steps += 1
        if remaining_after is None:
            self.remaining -= 1
            return
        by_verified, by_accepted = (_NO_COUNTS, _NO_COUNTS) if histograms is None else histograms
        apply_lengths(self.remaining, self.num_verified, self.num_accepted, lengths, accepted, remaining_after,
                      by_verified, by_accepted, histograms is not None)


def add_counters(store: RequestStore, columns: dict[str, np.ndarray]) -> None:
    """Add counters of requests (as :meth:`DecodeSet.take` returns them) to their rows in the store."""
    ids = columns["ids"]
    store.num_steps[ids] += columns["num_steps"]
    store.num_verified_tokens[ids] += columns["num_verified"]
    store.num_accepted_tokens[ids] += columns["num_accepted"]
