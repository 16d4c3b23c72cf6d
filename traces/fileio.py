"""Reading CSV and JSON Lines trace files into raw columns with 1-based line numbers.

Values stay raw here (the readers check them with :mod:`traces.rows`). The
fast paths are pandas' C CSV parser and pyarrow's JSON reader; only a file the
fast path rejects (a CSV row with the wrong number of fields, a malformed JSON
line, blank lines) is scanned line by line, so that every row keeps its true
line number and every malformed line can be reported or counted.
Files ending in ``.gz`` are decompressed.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pa_json

from traces.rows import TraceFormatError


def read_bytes(path: Path) -> bytes:
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as f:
            return f.read()
    return path.read_bytes()


def first_line(path: Path) -> str:
    """The first non-blank line of the file (BOM and line ending stripped); empty if there is none."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8-sig", newline="") as f:  # type: ignore[operator]
        for line in f:
            if line.strip():
                return line.strip()
    return ""


def csv_header(path: Path) -> list[str]:
    return next(csv.reader([first_line(path)]), [])


@dataclass(frozen=True)
class CsvRows:
    frame: pd.DataFrame  # one column per requested column present in the header
    line: np.ndarray  # [N] int64 1-based line of each data row
    wrong_width: np.ndarray  # [N] bool: the row has more fields than the header


def read_csv_columns(path: Path, required: list[str], optional: list[str], *, format: str,
                     text_columns: frozenset[str] = frozenset(),
                     category_columns: frozenset[str] = frozenset()) -> CsvRows:
    """Data rows of the required and present optional columns; ``text_columns`` stay strings.

    Every column is parsed, so that a row with more fields than the header is
    found (pandas would ignore the extra fields of unused columns); the
    ``category_columns`` (low-cardinality text that is not used) are read
    cheaply as categories. A row with fewer fields reads as missing values.
    Raises :class:`TraceFormatError` if the header lacks a required column.
    Line numbers assume the header is line 1 and no quoted field spans lines;
    the line-by-line scan used for malformed files counts lines exactly.
    """
    header = csv_header(path)
    absent = [c for c in required if c not in header]
    if absent:
        raise TraceFormatError(f"{path.name}: missing column(s) {absent} of the {format} format; "
                               f"header has {header}")
    present = [c for c in required + optional if c in header]
    dtype = {c: "str" for c in present if c in text_columns}
    dtype.update({c: "category" for c in header if c in category_columns and c not in present})
    try:
        frame = pd.read_csv(path, dtype=dtype, index_col=False, skip_blank_lines=False, encoding="utf-8-sig",
                            compression="infer", on_bad_lines="error")
    except pd.errors.ParserError:
        return _scan_csv(path, present, text_columns)
    n = len(frame)
    return CsvRows(frame=frame[present].reset_index(drop=True), line=np.arange(2, n + 2, dtype=np.int64),
                   wrong_width=np.zeros(n, dtype=bool))


def _scan_csv(path: Path, present: list[str], text_columns: frozenset[str]) -> CsvRows:
    reader = csv.reader(io.StringIO(read_bytes(path).decode("utf-8-sig"), newline=""))
    header = next(reader)
    where = [header.index(c) for c in present]
    values: list[list[str | None]] = [[] for _ in present]
    lines: list[int] = []
    wrong: list[bool] = []
    start = reader.line_num + 1
    for record in reader:
        lines.append(start)
        start = reader.line_num + 1
        too_long = len(record) > len(header)
        wrong.append(too_long)
        for out, i in zip(values, where, strict=True):
            out.append(record[i] if i < len(record) and not too_long else None)  # short rows: missing values
    frame = pd.DataFrame({c: pd.Series(v, dtype="str" if c in text_columns else object)
                          for c, v in zip(present, values, strict=True)})
    return CsvRows(frame=frame, line=np.asarray(lines, dtype=np.int64), wrong_width=np.asarray(wrong, dtype=bool))


@dataclass(frozen=True)
class JsonlRows:
    frame: pd.DataFrame  # scalar keys, one column per requested key (all missing where no line has it)
    lists: dict[str, list[object]]  # list-valued keys: per row a tuple of ints, None (absent) or the raw value
    line: np.ndarray  # [N] int64 1-based line of each non-blank line
    malformed: np.ndarray  # [N] bool: the line is not a JSON object
    keys_seen: frozenset[str]  # keys present on at least one line


def read_jsonl(path: Path, scalar_keys: list[str], list_keys: list[str]) -> JsonlRows:
    """One row per non-blank line; blank lines are not rows (their numbers are still counted)."""
    data = read_bytes(path)
    num_lines = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
    try:
        table = pa_json.read_json(io.BytesIO(data))
    except pa.ArrowInvalid:
        return _scan_jsonl(data, scalar_keys, list_keys)
    if table.num_rows != num_lines:  # blank lines: pyarrow skips them, so line numbers need the scan
        return _scan_jsonl(data, scalar_keys, list_keys)
    n = table.num_rows
    names = set(table.column_names)
    frame = pd.DataFrame({k: table.column(k).to_pandas() if k in names else pd.Series([None] * n, dtype=object)
                          for k in scalar_keys})
    lists = {k: _list_column(table.column(k)) if k in names else [None] * n for k in list_keys}
    return JsonlRows(frame=frame, lists=lists, line=np.arange(1, n + 1, dtype=np.int64),
                     malformed=np.zeros(n, dtype=bool), keys_seen=frozenset(names))


def _list_column(column: pa.ChunkedArray) -> list[object]:
    array = column.combine_chunks()
    if not (pa.types.is_list(array.type) and pa.types.is_integer(array.type.value_type)):
        return array.to_pylist()  # odd types: checked value by value by the reader
    offsets = array.offsets.to_numpy()
    flat = array.values.to_numpy(zero_copy_only=False).tolist()
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    return [tuple(flat[offsets[i]:offsets[i + 1]]) if valid[i] else None for i in range(len(array))]


def _scan_jsonl(data: bytes, scalar_keys: list[str], list_keys: list[str]) -> JsonlRows:
    records: list[dict[str, object]] = []
    lines: list[int] = []
    malformed: list[bool] = []
    seen: set[str] = set()
    for number, text in enumerate(data.decode("utf-8-sig").split("\n"), start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            record = None
        ok = isinstance(record, dict)
        records.append(record if ok else {})  # type: ignore[arg-type]
        lines.append(number)
        malformed.append(not ok)
        if ok:
            seen.update(record)  # type: ignore[arg-type]
    frame = pd.DataFrame({k: pd.Series([r.get(k) for r in records], dtype=object) for k in scalar_keys})
    lists = {k: [r.get(k) for r in records] for k in list_keys}
    return JsonlRows(frame=frame, lists=lists, line=np.asarray(lines, dtype=np.int64),
                     malformed=np.asarray(malformed, dtype=bool), keys_seen=frozenset(seen))
