"""Checking the rows of one trace file: bad-row errors, skip counts, column parsing.

A *bad row* is a data row that cannot become a request: a length that is
missing, not a whole number or negative (a prompt must also be at least one
token), a timestamp that is missing or unparsable, a timestamp earlier than a
previous row's, or a line that is not a JSON object. By default the earliest
bad row in the file raises :class:`TraceRowError` naming the file, line and
field. With ``skip_bad_rows`` the bad rows are left out and counted by reason;
a row with several problems is counted once, under the first reason checked
(columns in file order, the timestamp order last).

All checks are vectorised over whole columns.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd


class TraceFormatError(ValueError):
    """The file as a whole cannot be read in the requested format (wrong columns, unknown format)."""


class TraceRowError(ValueError):
    """A data row of a trace file is bad; names the file, 1-based line number and field."""

    def __init__(self, file_name: str, line: int, field: str, reason: str, value: object, num_bad_rows: int):
        self.file_name = file_name
        self.line = line
        self.field = field
        self.reason = reason
        self.num_bad_rows = num_bad_rows
        shown = "" if value is None else f" (value {value!r})"
        super().__init__(
            f"{file_name} line {line}, field {field!r}: {reason}{shown}. "
            f"{num_bad_rows} bad row(s) in this file; pass skip_bad_rows=True to leave them out and count them."
        )


class RowChecker:
    """Collects the bad rows of one file, then raises on the earliest or counts them by reason.

    ``line`` holds the 1-based line number of every data row, so messages point
    into the file as a text editor shows it.
    """

    def __init__(self, file_name: str, line: np.ndarray, *, skip_bad_rows: bool):
        self.file_name = file_name
        self.line = line  # [N] int
        self.skip_bad_rows = skip_bad_rows
        self.bad = np.zeros(line.shape[0], dtype=bool)  # [N]
        self._checks: list[tuple[np.ndarray, str, str, object]] = []

    def flag(self, mask: np.ndarray, field: str, reason: str, values: object = None) -> None:
        """Mark rows where ``mask`` holds as bad; ``values`` (indexable per row) is shown in the error."""
        mask = np.asarray(mask, dtype=bool)
        if mask.any():
            self._checks.append((mask, field, reason, values))
            self.bad |= mask

    def finish(self) -> dict[str, int]:
        """Raise on the earliest bad row, or (skip mode) return ``{"field: reason": count}``."""
        if not self.bad.any():
            return {}
        if not self.skip_bad_rows:
            first = int(np.argmax(self.bad))
            for mask, field, reason, values in self._checks:
                if mask[first]:
                    value = None if values is None else _value_at(values, first)
                    raise TraceRowError(self.file_name, int(self.line[first]), field, reason, value,
                                        int(self.bad.sum()))
        counts: Counter[str] = Counter()
        counted = np.zeros_like(self.bad)
        for mask, field, reason, _ in self._checks:
            new = mask & ~counted
            if new.any():
                counts[f"{field}: {reason}"] += int(new.sum())
                counted |= new
        return dict(counts)


def _value_at(values: object, row: int) -> object:
    value = values.iloc[row] if isinstance(values, pd.Series) else values[row]  # type: ignore[index]
    if isinstance(value, np.generic):
        value = value.item()
    return value


def _missing(raw: pd.Series) -> np.ndarray:
    missing = raw.isna().to_numpy(dtype=bool, copy=True)
    if not (pd.api.types.is_numeric_dtype(raw) or pd.api.types.is_bool_dtype(raw)):
        blank = raw.astype("string").str.strip().eq("").fillna(False).to_numpy(dtype=bool)
        missing |= blank
    return missing


#: The largest token count a row may hold: far beyond any context length, and safe in int64 sums.
MAX_TOKENS = 2**31 - 1


def parse_count_column(checker: RowChecker, raw: pd.Series, field: str, *, min_value: int) -> np.ndarray:
    """Token counts as int64 (0 on bad rows); flags missing, non-numeric, fractional, too-small and too-large values.

    ``min_value`` is 1 for prompt lengths and 0 for output lengths (a zero
    output is a failed request; the replay options decide what happens to it).
    """
    if pd.api.types.is_integer_dtype(raw) and not raw.hasnans:
        num = raw.to_numpy(dtype=np.float64)
        missing = np.zeros(num.shape[0], dtype=bool)
    else:
        missing = _missing(raw)
        num = pd.to_numeric(raw.where(~missing), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        checker.flag(missing, field, "missing")
        checker.flag(~missing & ~np.isfinite(num), field, "not a number", raw)
        with np.errstate(invalid="ignore"):
            checker.flag(np.isfinite(num) & (num != np.floor(num)), field, "not a whole number", raw)
    with np.errstate(invalid="ignore"):
        checker.flag(num < 0, field, "negative", raw)
        if min_value > 0:
            checker.flag((num >= 0) & (num < min_value), field, f"less than {min_value}", raw)
        checker.flag(np.isfinite(num) & (num > MAX_TOKENS), field, f"more than {MAX_TOKENS} tokens", raw)
        ok = np.isfinite(num) & (num >= min_value) & (num <= MAX_TOKENS) & (num == np.floor(num))
    return np.where(ok, num, 0).astype(np.int64)


def parse_number_column(checker: RowChecker, raw: pd.Series, field: str) -> np.ndarray:
    """Finite floats (NaN on bad rows); flags missing and non-numeric values."""
    if pd.api.types.is_numeric_dtype(raw) and not pd.api.types.is_bool_dtype(raw) and not raw.hasnans:
        num = raw.to_numpy(dtype=np.float64)
        checker.flag(~np.isfinite(num), field, "not a number", raw)
        return num
    missing = _missing(raw)
    num = pd.to_numeric(raw.where(~missing), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    checker.flag(missing, field, "missing")
    checker.flag(~missing & ~np.isfinite(num), field, "not a number", raw)
    return np.where(np.isfinite(num), num, np.nan)


def parse_datetime_column(checker: RowChecker, raw: pd.Series, field: str) -> np.ndarray:
    """ISO-8601-like date-times as int64 nanoseconds (naive times taken as UTC); flags missing and unparsable."""
    missing = _missing(raw)
    parsed = pd.to_datetime(raw.where(~missing), format="ISO8601", errors="coerce", utc=True)
    unparsable = ~missing & parsed.isna().to_numpy(dtype=bool)
    checker.flag(missing, field, "missing")
    checker.flag(unparsable, field, "unparsable date-time", raw)
    return parsed.dt.as_unit("ns").to_numpy(dtype="datetime64[ns]").view(np.int64).copy()


def check_order(checker: RowChecker, times: np.ndarray, field: str, raw: object) -> None:
    """Flag rows whose time is earlier than an earlier good row's (the file must be in arrival order)."""
    good = np.flatnonzero(~checker.bad)
    if good.size < 2:
        return
    t = times[good]
    earlier_max = np.maximum.accumulate(t)[:-1]  # latest time among the good rows before each row
    late = np.flatnonzero(t[1:] < earlier_max) + 1
    mask = np.zeros(times.shape[0], dtype=bool)
    mask[good[late]] = True
    checker.flag(mask, field, "earlier than a previous row", raw)


def parse_session_column(raw: pd.Series) -> np.ndarray:
    """Session ids as int64, -1 where missing (an unknown session is not a bad row).

    Whole numbers >= 0 are kept as they are; any other ids (strings, hashes)
    are numbered 0, 1, ... in order of first appearance.
    """
    missing = _missing(raw)
    num = pd.to_numeric(raw.where(~missing), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    present = ~missing
    with np.errstate(invalid="ignore"):
        whole = np.isfinite(num) & (num >= 0) & (num == np.floor(num))
    if np.array_equal(whole, present):
        return np.where(present, num, -1).astype(np.int64)
    codes, _ = pd.factorize(raw.where(~missing).astype("string"))
    return np.where(present, codes, -1).astype(np.int64)
