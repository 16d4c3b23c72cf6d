"""What a trace reader returns: the good rows of one file, before any replay option applies."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TraceTable:
    """The requests of one trace file, in file order, with the file's own field names for messages.

    ``arrival_s`` is the *trace clock*: seconds since the first good row of the
    file (``origin`` says what that instant is in the file's own terms).
    ``domain_label`` is a per-row label that replay maps onto a project domain:
    a file-level label such as ``azure_code`` or ``mooncake`` repeated, or the
    ``domain`` column of a generic file. ``output_tokens`` may be 0 (a failed
    request, as BurstGPT logs them); replay decides what happens to those.
    """

    file_name: str
    format: str
    arrival_s: np.ndarray  # [N] float seconds since the first good row, non-decreasing
    prompt_tokens: np.ndarray  # [N] int64 >= 1
    output_tokens: np.ndarray  # [N] int64 >= 0
    line: np.ndarray  # [N] int64 1-based line number in the file
    domain_label: np.ndarray  # [N] str
    num_rows: int  # data rows in the file, bad ones included
    skipped_rows: Mapping[str, int]  # "field: reason" -> rows left out (skip mode only)
    origin: str  # the file's own time of arrival_s == 0
    output_field: str  # the file's name for the output-length field
    session_id: np.ndarray | None = None  # [N] int64, -1 where unknown
    prefix_hash_ids: tuple[tuple[int, ...], ...] | None = None

    @property
    def num_requests(self) -> int:
        return int(self.arrival_s.shape[0])

    def select(self, keep: np.ndarray) -> TraceTable:
        """The rows at integer positions (or boolean mask) ``keep``, in that order."""
        keep = np.flatnonzero(keep) if keep.dtype == bool else keep
        hashes = None if self.prefix_hash_ids is None else tuple(self.prefix_hash_ids[i] for i in keep)
        return TraceTable(
            file_name=self.file_name,
            format=self.format,
            arrival_s=self.arrival_s[keep],
            prompt_tokens=self.prompt_tokens[keep],
            output_tokens=self.output_tokens[keep],
            line=self.line[keep],
            domain_label=self.domain_label[keep],
            num_rows=self.num_rows,
            skipped_rows=self.skipped_rows,
            origin=self.origin,
            output_field=self.output_field,
            session_id=None if self.session_id is None else self.session_id[keep],
            prefix_hash_ids=hashes,
        )


def good_rows_table(
    *,
    file_name: str,
    format: str,
    times: np.ndarray,
    ticks_per_s: float,
    describe_time: Callable[[int], str],
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    line: np.ndarray,
    good: np.ndarray,
    domain_label: np.ndarray,
    skipped_rows: Mapping[str, int],
    output_field: str,
    session_id: np.ndarray | None = None,
    prefix_hash_ids: tuple[tuple[int, ...], ...] | None = None,
) -> TraceTable:
    """Build a table from parsed columns and the good-row mask; times become seconds since the first good row.

    ``times`` counts the file's ticks (``ticks_per_s`` per second); it keeps
    its exact dtype until the origin is subtracted, so nanosecond date-times
    lose no precision. ``describe_time(i)`` says what row i's time is in the
    file's own terms.
    """
    rows = np.flatnonzero(good)
    kept_times = times[rows]
    if rows.size:
        origin = describe_time(int(rows[0]))
        arrival_s = (kept_times - kept_times[0]).astype(np.float64) / ticks_per_s
    else:
        origin = "no good rows"
        arrival_s = np.zeros(0, dtype=np.float64)
    hashes = None if prefix_hash_ids is None else tuple(prefix_hash_ids[i] for i in rows)
    return TraceTable(
        file_name=file_name,
        format=format,
        arrival_s=arrival_s,
        prompt_tokens=prompt_tokens[rows],
        output_tokens=output_tokens[rows],
        line=line[rows],
        domain_label=domain_label[rows],
        num_rows=int(good.shape[0]),
        skipped_rows=dict(skipped_rows),
        origin=origin,
        output_field=output_field,
        session_id=None if session_id is None else session_id[rows],
        prefix_hash_ids=hashes,
    )
