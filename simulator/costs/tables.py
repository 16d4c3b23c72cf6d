"""Measured tables and how they are read: linear interpolation inside, an error outside.

Real step-cost curves are jagged (CUDA-graph buckets, GEMM tiles), so a table
is never smoothed or extrapolated: a query between two points is interpolated
linearly (bilinearly over two axes), and a query outside the profiled range is
an error that names the table and the profile file it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _outside(what: str, origin: str, axis_name: str, low: float, high: float, axis: np.ndarray) -> ValueError:
    axis_part = f" {axis_name}" if axis_name else ""
    return ValueError(f"{what}:{axis_part} {low:g}..{high:g} is outside the profiled range "
                      f"{axis[0]:g}..{axis[-1]:g} (profile {origin})")


@dataclass(frozen=True)
class Table1D:
    """y over strictly increasing x, interpolated linearly, errors outside."""

    x: np.ndarray
    y: np.ndarray
    what: str  # e.g. "verify SPS over batch_tokens", for error messages
    origin: str = "<memory>"  # the profile file

    def __call__(self, x: np.ndarray | float) -> np.ndarray:
        q = np.asarray(x, dtype=np.float64)
        if q.size and (q.min() < self.x[0] or q.max() > self.x[-1]):
            raise _outside(self.what, self.origin, "", float(q.min()), float(q.max()), self.x)
        return np.interp(q, self.x, self.y)


def _cell(axis: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower grid index and the fraction towards the next point for every query (axis of >= 2 points)."""
    i = np.searchsorted(axis, q, side="right") - 1
    i = np.minimum(np.maximum(i, 0), axis.size - 2)
    return i, (q - axis[i]) / (axis[i + 1] - axis[i])


def _widen(axis: np.ndarray, values: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """A one-point axis as two points with equal values (the range check keeps queries on the point)."""
    if axis.size > 1:
        return axis, values
    return np.array([axis[0], axis[0] + 1.0]), np.concatenate([values, values], axis=dim)


@dataclass(frozen=True)
class Table2D:
    """values[i, j] over (x[i], y[j]), both strictly increasing; bilinear inside the grid, errors outside.

    Called with arrays of x and y (one query per element, broadcast together), it
    returns the interpolated values, so a whole batch of requests is priced in a
    few vector operations.
    """

    x: np.ndarray  # [NX]
    y: np.ndarray  # [NY]
    values: np.ndarray  # [NX, NY]
    what: str  # e.g. "attention per_request_s", for error messages
    x_name: str
    y_name: str
    origin: str = "<memory>"
    _columns: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # cache of rows()

    def check(self, x: np.ndarray | float, y: np.ndarray | float) -> None:
        """Raise if any query lies outside the grid."""
        for q, axis, name in ((np.asarray(x), self.x, self.x_name), (np.asarray(y), self.y, self.y_name)):
            if q.size and (q.min() < axis[0] or q.max() > axis[-1]):
                raise _outside(self.what, self.origin, name, float(q.min()), float(q.max()), axis)

    def rows(self, x: np.ndarray, num_y: int) -> np.ndarray:
        """The table at every ``x`` for y = 1, 2, ..., ``num_y`` -> [len(x), num_y]: interpolated along y once per
        grid row (cached), then linearly in x - a batch's whole range of query counts in one pass."""
        self.check(x, (1.0, float(num_y)))
        columns = self._columns.get(num_y)
        if columns is None:
            whole = np.arange(1, num_y + 1, dtype=np.float64)
            columns = np.stack([np.interp(whole, self.y, row) for row in self.values])  # [NX, num_y]
            columns = self._columns[num_y] = _widen(self.x, columns, 0)
        ax, grid = columns
        i, t = _cell(ax, np.asarray(x, dtype=np.float64))
        return grid[i] + (grid[i + 1] - grid[i]) * t[:, None]

    def __call__(self, x: np.ndarray | float, y: np.ndarray | float) -> np.ndarray:
        qx = np.asarray(x, dtype=np.float64)
        qy = np.asarray(y, dtype=np.float64)
        self.check(qx, qy)
        ax, grid = _widen(self.x, self.values, 0)
        ay, grid = _widen(self.y, grid, 1)
        i, tx = _cell(ax, qx)
        j, ty = _cell(ay, qy)
        low = grid[i, j] + (grid[i + 1, j] - grid[i, j]) * tx
        high = grid[i, j + 1] + (grid[i + 1, j + 1] - grid[i, j + 1]) * tx
        return low + (high - low) * ty


@dataclass(frozen=True)
class DraftTable:
    """Drafter latency over (requests R, draft tokens gamma) and, optionally, the batch's mean context.

    Without a context axis ``latency_s`` is ``[NR, NG]``; with one it is
    ``[NC, NR, NG]`` and the latency is interpolated linearly in context between
    the two bilinear (R, gamma) slices around it. The context it is read at is the
    batch's mean, or with ``key_padding`` "longest" the batch's longest context
    (:meth:`batch_context`).
    """

    num_requests: np.ndarray  # [NR]
    draft_tokens: np.ndarray  # [NG]
    latency_s: np.ndarray  # [NR, NG], or [NC, NR, NG] with context_tokens
    kind: str
    context_tokens: np.ndarray | None = None  # [NC]
    origin: str = "<memory>"
    key_padding: str = "none"  # "longest": the drafter pads every request's keys to the batch's longest context
    _slices: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # (k, R, g) -> seconds

    def batch_context(self, context_tokens: np.ndarray) -> float:
        """The context a batch of requests with these contexts is priced at: their mean, or their longest when the
        drafter pads keys to it."""
        if self.key_padding == "longest":
            return float(np.max(context_tokens))
        return float(np.mean(context_tokens))

    def _check(self, value: float, axis: np.ndarray, name: str) -> None:
        if value < axis[0] or value > axis[-1]:
            raise ValueError(f"draft latency of {self.kind!r}: {name}={value:g} is outside the "
                             f"profiled range {axis[0]:g}..{axis[-1]:g} (profile {self.origin})")

    def _slice(self, grid: np.ndarray, r: float, g: float) -> float:
        per_gamma = np.array([np.interp(r, self.num_requests, col) for col in grid.T])
        if self.draft_tokens.size == 1:
            return float(per_gamma[0])
        return float(np.interp(g, self.draft_tokens, per_gamma))

    def __call__(self, num_requests: int, draft_tokens: int, context_tokens: float | None = None) -> float:
        if draft_tokens == 0:
            return 0.0
        r, g = float(num_requests), float(draft_tokens)
        self._check(r, self.num_requests, "num_requests")
        self._check(g, self.draft_tokens, "draft_tokens")
        if self.context_tokens is None:
            return self._slice(self.latency_s, r, g)
        if context_tokens is None:
            raise ValueError(f"draft latency of {self.kind!r} depends on context_tokens (profile {self.origin}); "
                             "pass the batch's mean context")
        c = float(context_tokens)
        self._check(c, self.context_tokens, "context_tokens")
        axis = self.context_tokens
        if axis.size == 1:
            return self._slice(self.latency_s[0], r, g)
        k = int(np.clip(np.searchsorted(axis, c, side="right") - 1, 0, axis.size - 2))
        low, high = self._slice_at(k, r, g), self._slice_at(k + 1, r, g)
        return low + (high - low) * (c - axis[k]) / (axis[k + 1] - axis[k])

    def _slice_at(self, k: int, r: float, g: float) -> float:
        """The (R, gamma) slice at context point k, remembered (an engine asks for the same R and g every step)."""
        value = self._slices.get((k, r, g))
        if value is None:
            value = self._slices[(k, r, g)] = self._slice(self.latency_s[k], r, g)
        return value
