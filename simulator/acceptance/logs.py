"""Acceptance logs: per (request, step, draft position) confidence and verification outcome (numpy/pandas only).

One parquet row per draft position k = 1..gamma of one request's engine step (format
and semantics: ``docs/acceptance_logs.md``). A *block* is the gamma rows of one
(drafter, domain, request_id, step). ``accepted`` is True/False up to and including the
first rejection and null after it (those tokens were discarded, their outcome carries no
information); it is also null at positions that were not verified (``verified`` False).

The log is an input format of the simulator (like a hardware profile), so it
lives here, free of torch; :class:`AcceptanceRecorder` is what the torch
speculative-decoding loop in ``calibration/`` calls with the numpy fields of
its step records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

COLUMNS: dict[str, str] = {  # name -> pandas dtype as written
    "request_id": "int64",
    "step": "int64",
    "position": "int64",
    "domain": "string",
    "drafter": "string",
    "gamma": "int64",
    "confidence": "Float64",  # c_k of the confidence head; null for drafters without one
    "draft_prob": "Float64",  # q_k(x_k)
    "analytic_acceptance": "Float64",  # 1 - TV(p_d, p_t) at this position; null where not verified
    "accepted": "boolean",  # null after the first rejection and where not verified
    "verified": "boolean",
    "decoded_tokens": "Int64",  # output tokens the request had decoded before this step; null when unknown
}
REQUIRED = ("request_id", "step", "position", "domain", "drafter", "gamma", "confidence", "accepted")
BLOCK_KEYS = ("drafter", "domain", "request_id", "step")


class LogError(ValueError):
    """A log that breaks the format; the message names the file, column and row."""


class AcceptanceRecorder:
    """Collects log rows from speculative-decoding steps of one (drafter, domain) batch of requests."""

    def __init__(self, drafter: str, domain: str, gamma: int, request_ids: Sequence[int]) -> None:
        self.drafter, self.domain, self.gamma = drafter, domain, gamma
        self.request_ids = np.asarray(request_ids, dtype=np.int64)  # [R] id of the request in decoder slot r
        self._chunks: list[pd.DataFrame] = []
        self._steps = np.zeros(self.request_ids.size, dtype=np.int64)  # [R] steps logged per request

    def record(self, lengths: np.ndarray, accepted: np.ndarray, confidence: np.ndarray | None,
               draft_prob: np.ndarray, analytic_acceptance: np.ndarray, active: np.ndarray | None = None,
               decoded_tokens: np.ndarray | None = None) -> None:
        """Add one step: ``lengths``/``accepted`` [R] verified/accepted draft tokens, the rest [R, g].

        ``active`` [R] bool keeps only the requests still decoding (default: all).
        ``decoded_tokens`` [R]: output tokens each request had decoded before this step
        (lets the simulator replay a request's blocks in order; null if omitted).
        """
        num_requests, g = draft_prob.shape
        keep = np.ones(num_requests, dtype=bool) if active is None else np.asarray(active, dtype=bool)
        if g != self.gamma:
            raise ValueError(f"recorder for gamma={self.gamma} got a step with {g} draft tokens")
        position = np.arange(1, g + 1)[None, :]  # [1, g]
        verified = position <= lengths[:, None]  # [R, g]
        outcome = np.where(position <= accepted[:, None], 1, 0).astype(float)
        outcome[~verified | (position > accepted[:, None] + 1)] = np.nan  # null after the first rejection
        rows = np.repeat(keep, g)
        conf = np.full((num_requests, g), np.nan) if confidence is None else confidence
        decoded = np.full(num_requests, np.nan) if decoded_tokens is None else np.asarray(decoded_tokens, float)
        frame = pd.DataFrame({
            "request_id": np.repeat(self.request_ids, g)[rows],
            "step": np.repeat(self._steps, g)[rows],
            "position": np.tile(position[0], num_requests)[rows],
            "domain": self.domain, "drafter": self.drafter, "gamma": self.gamma,
            "confidence": conf.reshape(-1)[rows], "draft_prob": draft_prob.reshape(-1)[rows],
            "analytic_acceptance": np.where(verified, analytic_acceptance, np.nan).reshape(-1)[rows],
            "accepted": outcome.reshape(-1)[rows], "verified": verified.reshape(-1)[rows],
            "decoded_tokens": np.repeat(decoded, g)[rows],
        })
        self._chunks.append(frame)
        self._steps += keep

    def frame(self) -> pd.DataFrame:
        if not self._chunks:
            return _typed(pd.DataFrame({c: [] for c in COLUMNS}))
        return _typed(pd.concat(self._chunks, ignore_index=True))


def _as_float(column: pd.Series) -> np.ndarray:
    """Numbers, booleans or nulls -> float64 with NaN for null; names the first row that is none of those."""
    if column.dtype.kind in "biuf" or str(column.dtype) in ("Float64", "Int64", "boolean"):
        return column.to_numpy(dtype="float64", na_value=np.nan)
    values = pd.to_numeric(column.astype("object").where(column.notna(), np.nan), errors="coerce")
    bad = np.flatnonzero(values.isna().to_numpy() & column.notna().to_numpy())
    if bad.size:
        raise ValueError(f"row {int(bad[0])}: {column.iloc[int(bad[0])]!r} is not a number or boolean")
    return values.astype("float64").to_numpy()


def _convert(column: pd.Series, dtype: str) -> pd.Series | pd.api.extensions.ExtensionArray:
    if dtype == "Float64":
        return pd.array(_as_float(column), dtype="Float64")
    if dtype == "boolean":
        values = _as_float(column)
        flags = pd.array(values == 1.0, dtype="boolean")
        flags[np.isnan(values)] = pd.NA
        return flags
    if dtype == "int64":
        values = _as_float(column)
        bad = np.flatnonzero(np.isnan(values) | (values != np.round(values)))
        if bad.size:
            raise ValueError(f"row {int(bad[0])}: {column.iloc[int(bad[0])]!r} is not an integer")
        return pd.Series(values.astype(np.int64), index=column.index)
    if dtype == "Int64":
        values = _as_float(column)
        bad = np.flatnonzero(~np.isnan(values) & (values != np.round(values)))
        if bad.size:
            raise ValueError(f"row {int(bad[0])}: {column.iloc[int(bad[0])]!r} is not an integer")
        return _nullable_int(values)
    return column.astype(dtype)


def _nullable_int(values: np.ndarray) -> pd.api.extensions.ExtensionArray:
    out = pd.array(np.where(np.isnan(values), 0, values).astype(np.int64), dtype="Int64")
    out[np.isnan(values)] = pd.NA
    return out


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    """The columns of :data:`COLUMNS` in their written dtypes (nulls as ``pd.NA``)."""
    out = df.copy()
    for col, dtype in COLUMNS.items():
        if col in out:
            try:
                out[col] = _convert(out[col], dtype)
            except (TypeError, ValueError) as err:
                raise ValueError(f"column {col!r}, {err}") from err
    return out


def write_log(df: pd.DataFrame, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    validate(df, str(path))
    _typed(df).to_parquet(path, index=False)
    return path


def read_log(path: str | Path) -> pd.DataFrame:
    """Read and validate a log (a missing ``verified`` column means every position was verified)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"acceptance log {path} not found")
    df = pd.read_parquet(path)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise LogError(f"acceptance log {path}: missing column(s) {missing}; required: {list(REQUIRED)}")
    if "verified" not in df.columns:
        df["verified"] = True
    if "decoded_tokens" not in df.columns:
        df["decoded_tokens"] = pd.NA
    try:
        df = _typed(df)
    except (TypeError, ValueError) as err:
        raise LogError(f"acceptance log {path}: {err}") from err
    validate(df, str(path))
    return df


def _fail(source: str, column: str, df: pd.DataFrame, bad: np.ndarray, what: str) -> None:
    rows = np.flatnonzero(bad)
    if rows.size:
        raise LogError(f"acceptance log {source}: column {column!r}, row {int(rows[0])} "
                       f"({rows.size} row(s) in all): {what}; first row: {df.iloc[int(rows[0])].to_dict()}")


def validate(df: pd.DataFrame, source: str = "<frame>") -> None:
    """Check ranges, one row per block position and the null pattern of ``accepted``."""
    if df.empty:
        raise LogError(f"acceptance log {source}: no rows")
    gamma = df["gamma"].to_numpy()
    position = df["position"].to_numpy()
    _fail(source, "gamma", df, gamma < 1, "gamma must be >= 1")
    _fail(source, "position", df, (position < 1) | (position > gamma), "position must lie in 1..gamma")
    for col in ("confidence", "draft_prob", "analytic_acceptance"):
        if col in df:
            v = df[col].to_numpy(dtype="float64", na_value=np.nan)
            _fail(source, col, df, (v < 0) | (v > 1), "values must lie in [0, 1]")
    order = df.sort_values([*BLOCK_KEYS, "position"], kind="stable").index.to_numpy()
    s = df.loc[order]
    keys = [s[k].to_numpy() for k in BLOCK_KEYS]
    new_block = np.ones(len(s), dtype=bool)
    new_block[1:] = np.any([k[1:] != k[:-1] for k in keys], axis=0)
    block = np.cumsum(new_block) - 1
    start = np.flatnonzero(new_block)
    expected = np.arange(len(s)) - start[block] + 1
    bad = s["position"].to_numpy() != expected
    sizes = np.diff(np.append(start, len(s)))
    bad |= (sizes != s["gamma"].to_numpy()[start])[block]
    _fail(source, "position", df, _unsort(bad, order), "every block (drafter, domain, request_id, step) needs "
          "positions 1..gamma exactly once")
    acc = s["accepted"].to_numpy(dtype="float64", na_value=np.nan)
    verified = s["verified"].to_numpy(dtype=bool, na_value=False)
    first = expected == 1
    prev_ok = np.concatenate(([True], acc[:-1] == 1))  # previous position of the block accepted
    prev_ok[first] = True
    should_have = verified & prev_ok
    _fail(source, "accepted", df, _unsort(should_have & np.isnan(acc), order),
          "null at a verified position whose earlier positions were all accepted")
    _fail(source, "accepted", df, _unsort(~should_have & ~np.isnan(acc), order),
          "set after the first rejection or at an unverified position (must be null)")
    prev_verified = np.concatenate(([True], verified[:-1]))
    prev_verified[first] = True
    _fail(source, "verified", df, _unsort(verified & ~prev_verified, order), "verified positions must form a prefix")
    if "decoded_tokens" in s:
        _validate_decoded(df, s, order, block, first, source)


def _validate_decoded(df: pd.DataFrame, s: pd.DataFrame, order: np.ndarray, block: np.ndarray, first: np.ndarray,
                      source: str) -> None:
    """``decoded_tokens``: >= 0, one value per block, known for all or none of a request's blocks, and growing
    with ``step`` (a request decodes at least one token per step)."""
    decoded = s["decoded_tokens"].to_numpy(dtype="float64", na_value=np.nan)
    _fail(source, "decoded_tokens", df, _unsort(decoded < 0, order), "must be >= 0")
    head = decoded[first]  # [N] per block
    same = np.isclose(decoded, head[block]) | (np.isnan(decoded) & np.isnan(head[block]))
    _fail(source, "decoded_tokens", df, _unsort(~same, order), "must be the same at every position of a block")
    keys = [s[k].to_numpy()[first] for k in ("drafter", "domain", "request_id")]
    same_request = np.ones(head.size, dtype=bool)
    same_request[0] = False
    same_request[1:] = np.all([k[1:] == k[:-1] for k in keys], axis=0)
    prev = np.concatenate(([np.nan], head[:-1]))
    mixed = same_request & (np.isnan(head) != np.isnan(prev))
    shrinking = same_request & (head <= prev)
    bad_block = mixed | shrinking
    _fail(source, "decoded_tokens", df, _unsort(bad_block[block], order),
          "must be known for all or none of a request's steps and grow from one step to the next")


def _unsort(flags: np.ndarray, order: np.ndarray) -> np.ndarray:
    out = np.zeros_like(flags)
    out[order] = flags
    return out


@dataclass(frozen=True)
class Blocks:
    """A log as one row per block, sorted by (drafter, domain, request_id, step)."""

    drafter: np.ndarray  # [N] str
    domain: np.ndarray  # [N] str
    request_id: np.ndarray  # [N]
    step: np.ndarray  # [N]
    confidence: np.ndarray  # [N, G] (NaN without a head)
    draft_prob: np.ndarray  # [N, G]
    analytic_acceptance: np.ndarray  # [N, G] (NaN where not verified)
    num_accepted: np.ndarray  # [N] accepted draft tokens (leading accepted positions)
    num_verified: np.ndarray  # [N]
    decoded_tokens: np.ndarray  # [N] output tokens decoded before the step; -1 where the log has none

    @property
    def gamma(self) -> int:
        return int(self.confidence.shape[1])

    @property
    def censored(self) -> np.ndarray:
        """[N] blocks whose verified positions were all accepted but that verified fewer than gamma."""
        return (self.num_accepted == self.num_verified) & (self.num_verified < self.gamma)


def to_blocks(df: pd.DataFrame, source: str = "<frame>") -> Blocks:
    """One drafter's (validated) log -> :class:`Blocks`."""
    gammas = df.groupby("drafter", observed=True)["gamma"].unique()
    for drafter, values in gammas.items():
        if len(values) != 1:
            raise LogError(f"acceptance log {source}: drafter {drafter!r} has several gammas {sorted(values)}")
    gamma_values = {int(v[0]) for v in gammas}
    if len(gamma_values) != 1:
        raise LogError(f"acceptance log {source}: drafters have different gammas {sorted(gamma_values)}; "
                       f"select one drafter first")
    g = gamma_values.pop()
    s = df.sort_values([*BLOCK_KEYS, "position"], kind="stable")
    head = s.iloc[::g]

    def matrix(col: str) -> np.ndarray:
        return s[col].to_numpy(dtype="float64", na_value=np.nan).reshape(-1, g)

    acc = matrix("accepted")
    verified = s["verified"].to_numpy(dtype=bool, na_value=False).reshape(-1, g)
    leading = np.cumprod(acc == 1, axis=1).sum(axis=1)
    return Blocks(head["drafter"].to_numpy(dtype=object), head["domain"].to_numpy(dtype=object),
                  head["request_id"].to_numpy(np.int64), head["step"].to_numpy(np.int64), matrix("confidence"),
                  matrix("draft_prob") if "draft_prob" in s else np.full(acc.shape, np.nan),
                  matrix("analytic_acceptance") if "analytic_acceptance" in s else np.full(acc.shape, np.nan),
                  leading.astype(np.int64), verified.sum(axis=1).astype(np.int64),
                  np.nan_to_num(head["decoded_tokens"].to_numpy(dtype="float64", na_value=np.nan), nan=-1.0)
                  .astype(np.int64) if "decoded_tokens" in s else np.full(len(head), -1, dtype=np.int64))


def conditional_acceptance(num_accepted: np.ndarray, gamma: int) -> np.ndarray:
    """Figure 2's metric from fully verified blocks: P(k accepted | 1..k-1 accepted), k = 1..gamma -> [gamma].

    NaN where no block reached position k.
    """
    reached = np.array([(num_accepted >= k - 1).sum() for k in range(1, gamma + 1)], dtype=float)
    passed = np.array([(num_accepted >= k).sum() for k in range(1, gamma + 1)], dtype=float)
    return np.divide(passed, reached, out=np.full(gamma, np.nan), where=reached > 0)


def tau_standard_error(request_id: np.ndarray, tokens_per_step: np.ndarray) -> float:
    """The standard error of tau (the mean of ``tokens_per_step`` over blocks) from the sample of requests that
    wrote the blocks: tau is a ratio of per-request sums (tokens over blocks), so the error is the ratio
    estimator's, clustered by request (blocks of one text are not independent draws). NaN below two requests."""
    ids, request = np.unique(request_id, return_inverse=True)
    if ids.size < 2:
        return float("nan")
    blocks = np.bincount(request).astype(np.float64)
    tokens = np.bincount(request, weights=tokens_per_step)
    tau = tokens.sum() / blocks.sum()
    return float(np.sqrt(np.sum((tokens - tau * blocks) ** 2) * ids.size / (ids.size - 1)) / blocks.sum())


def summary(df: pd.DataFrame, source: str = "<frame>") -> pd.DataFrame:
    """Per (drafter, domain): blocks, requests, tau (bonus included) with its standard error over the logged
    requests (:func:`tau_standard_error`: what another sample of as many texts would move it by) and
    q_1..q_gamma."""
    rows = []
    for (drafter, domain), part in df.groupby(["drafter", "domain"], observed=True, sort=True):
        b = to_blocks(part, source)
        full = b.num_verified == b.gamma
        row = {"drafter": drafter, "domain": domain, "num_blocks": int(full.sum()),
               "num_requests": int(np.unique(b.request_id).size), "tau": 1.0 + b.num_accepted[full].mean(),
               "tau_se": tau_standard_error(b.request_id[full], 1.0 + b.num_accepted[full])}
        q = conditional_acceptance(b.num_accepted[full], b.gamma)
        row.update({f"q{k + 1}": q[k] for k in range(b.gamma)})
        rows.append(row)
    return pd.DataFrame(rows)
