"""The trace formats the lab reads, and telling them apart from a file's first line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from traces import azure, burstgpt, generic, mooncake
from traces.fileio import csv_header, first_line
from traces.rows import TraceFormatError
from traces.table import TraceTable

FORMATS = ("azure", "burstgpt", "mooncake", "generic")

#: Replay maps these file-level labels onto project domains unless told otherwise.
DEFAULT_DOMAIN_MAP: dict[str, str] = {
    "azure_code": "code",
    "azure_conv": "chat",
    "mooncake": "chat",
    "burstgpt": "chat",
    "generic": "chat",
}


def detect_format(path: Path) -> str:
    """The format of ``path`` from its CSV header or its first JSON line; raises if none fits."""
    head = first_line(path)
    if not head:
        raise TraceFormatError(f"{path.name}: the file is empty")
    if head.startswith("{"):
        try:
            keys = set(json.loads(head))
        except (json.JSONDecodeError, TypeError) as err:
            raise TraceFormatError(f"{path.name} line 1: first line is not a JSON object ({err})") from err
        if {mooncake.TIME, mooncake.PROMPT, mooncake.OUTPUT} <= keys:
            return "mooncake"
        if set(generic.REQUIRED) <= keys:
            return "generic"
        raise TraceFormatError(f"{path.name}: unknown JSONL trace; first line has keys {sorted(keys)}. "
                               f"Known: mooncake {[mooncake.TIME, mooncake.PROMPT, mooncake.OUTPUT]}, "
                               f"generic {generic.REQUIRED}")
    header = set(csv_header(path))
    for name, columns in (("azure", azure.COLUMNS), ("burstgpt", burstgpt.HEADER_MARKERS),
                          ("generic", generic.REQUIRED)):
        if set(columns) <= header:
            return name
    raise TraceFormatError(f"{path.name}: unknown CSV trace; header is {sorted(header)}. Known: azure "
                           f"{list(azure.COLUMNS)}, burstgpt {list(burstgpt.HEADER_MARKERS)}, "
                           f"generic {generic.REQUIRED}")


def read_trace(path: Path, format: str | None = None, *, skip_bad_rows: bool = False,
               keep_prefix_hash_ids: bool = True, label: str | None = None) -> TraceTable:
    """Read ``path`` in ``format`` (detected when None). ``label`` overrides an Azure file's label."""
    if not path.is_file():
        raise FileNotFoundError(f"no trace file at {path}")
    fmt = format or detect_format(path)
    readers: dict[str, Callable[[], TraceTable]] = {
        "azure": lambda: azure.read_azure(path, skip_bad_rows=skip_bad_rows, label=label),
        "burstgpt": lambda: burstgpt.read_burstgpt(path, skip_bad_rows=skip_bad_rows),
        "mooncake": lambda: mooncake.read_mooncake(path, skip_bad_rows=skip_bad_rows,
                                                   keep_prefix_hash_ids=keep_prefix_hash_ids),
        "generic": lambda: generic.read_generic(path, skip_bad_rows=skip_bad_rows),
    }
    if fmt not in readers:
        raise TraceFormatError(f"unknown trace format {fmt!r}; valid: {', '.join(FORMATS)}")
    return readers[fmt]()
