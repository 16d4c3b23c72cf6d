"""Traffic: synthetic request generators and readers for public serving traces.

Trace replay starts at :func:`load_trace_workload` (a shipped sample name or a
file path in, a :class:`~traces.workload.Workload` out); ``python -m
traces.summary`` describes a trace; ``traces/README.md`` lists the formats,
samples and licences. The replay names below load on first use, so importing
``traces.workload`` or ``traces.synthetic`` does not import pandas.
"""

from __future__ import annotations

import importlib
from typing import Any

_REPLAY_NAMES = {
    "SAMPLES": "traces.load",
    "TraceReplayWarning": "traces.load",
    "load_trace": "traces.load",
    "load_trace_workload": "traces.load",
    "sample_path": "traces.load",
    "ReplayOptions": "traces.replay",
    "ReplayReport": "traces.replay",
    "TraceReplay": "traces.replay",
    "ZeroOutputError": "traces.replay",
    "TraceFormatError": "traces.rows",
    "TraceRowError": "traces.rows",
}

__all__ = sorted(_REPLAY_NAMES)


def __getattr__(name: str) -> Any:
    if name in _REPLAY_NAMES:
        return getattr(importlib.import_module(_REPLAY_NAMES[name]), name)
    raise AttributeError(f"module 'traces' has no attribute {name!r}")
