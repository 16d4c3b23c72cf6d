"""Readers for published acceptance numbers: a table of tau or per-position curves, and DeepSpec's eval table.

Each reader returns :class:`Row` records, one per (target, drafter, benchmark or domain).

**Published numbers** (CSV, ``#`` starts a comment line). Columns, all optional
but a name and some numbers:

| column | meaning |
|---|---|
| ``target``, ``drafter`` | the pair the numbers belong to (or ``--target``/``--drafter``) |
| ``benchmark`` | a benchmark name (empty: the row is a whole domain) |
| ``domain`` | ``math``, ``code`` or ``chat`` (may be left out for the paper's nine benchmarks) |
| ``gamma`` | block size the numbers were measured at, every draft verified (or ``--gamma``) |
| ``tau`` | mean accepted length per round, bonus token included |
| ``q1..qK`` | conditional acceptance per position (the paper's Figure 2 metric) |
| ``s1..sK`` | prefix survival per position (vLLM's / DeepSpec's per-position acceptance rate) |
| ``tail_decay`` | decay of q past the last position given |
| ``note`` | kept in the preset next to the curve |

**DeepSpec's eval table**: what ``eval.py`` of deepseek-ai/DeepSpec prints
(``deepspec/eval/base_evaluator.py``, ``build_results_table``): a PrettyTable
(``| a | b |`` rows between ``+---+`` rules) or, without prettytable, tab-separated
lines, with the header ``dataset, target_model, draft_model, #propose, accept_len,
verify_rate, samples, out_tokens, tok/s, verify/s, accept_rate@0 .. accept_rate@{K-1}``.
``#propose`` reads ``7.00+1`` (draft tokens per round + the bonus position);
``accept_len`` is tau; ``accept_rate@k`` counts rounds that accepted draft
tokens 1..k+1 among rounds that proposed k+1 of them (a prefix survival). Rows
printed without a header (per dataset, while eval runs) are read when a header
line came first. Columns we do not use (samples, out_tokens, tok/s, verify/s)
are kept in the preset's inputs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.acceptance.paper import BENCHMARK_DOMAINS
from traces.workload import DOMAINS

ALIASES = {"arena_hard_v2": "arena_hard", "lcb": "livecodebench", "math_500": "math500", "mtbench": "mt_bench",
           "human_eval": "humaneval", "aime_25": "aime25", "aime2025": "aime25"}
DEEPSPEC_REQUIRED = ("dataset", "target_model", "draft_model", "#propose", "accept_len", "verify_rate")
PROPOSE_TOLERANCE = 0.1  # #propose below the block size by more than this: a thresholded (not full) run


class InputError(ValueError):
    """An input table that cannot be read; the message names the file, the row and the column."""


@dataclass(frozen=True)
class Row:
    """Published numbers of one class (a benchmark or a whole domain) of one target/drafter pair."""

    target: str
    drafter: str
    name: str  # benchmark name, or the domain for a domain-level row
    domain: str
    gamma: int
    where: str  # "file, row n" for messages
    tau: float | None = None
    conditional: tuple[float, ...] | None = None
    survival: tuple[float, ...] | None = None
    tail_decay: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_domain(self) -> bool:
        return self.name == self.domain


def benchmark_name(raw: str) -> str:
    """A benchmark's canonical name: lower case, ``_`` for ``-`` and spaces, known aliases resolved."""
    name = re.sub(r"[^a-z0-9]+", "_", raw.strip().lower()).strip("_")
    return ALIASES.get(name, name)


def _domain_of(name: str, given: str | None, domain_map: dict[str, str], where: str) -> str:
    domain = given or domain_map.get(name) or BENCHMARK_DOMAINS.get(name) or (name if name in DOMAINS else None)
    if domain is None:
        raise InputError(f"{where}: no domain for benchmark {name!r}; add a domain column or --domain "
                         f"{name}=math|code|chat")
    if domain not in DOMAINS:
        raise InputError(f"{where}: domain {domain!r}; valid: {', '.join(DOMAINS)}")
    return domain


def _numbers(record: dict[str, Any], prefix: str, where: str) -> tuple[float, ...] | None:
    cols = sorted((int(c[len(prefix):]), c) for c in record if re.fullmatch(rf"{prefix}\d+", c))
    if not cols:
        return None
    if [k for k, _ in cols] != list(range(1, len(cols) + 1)):
        raise InputError(f"{where}: columns {[c for _, c in cols]} must be {prefix}1..{prefix}{len(cols)}")
    values = [record[c] for _, c in cols]
    filled = [not (v is None or (isinstance(v, float) and math.isnan(v))) for v in values]
    if not any(filled):
        return None
    if not all(filled[: sum(filled)]) or not all(0.0 < float(v) < 1.0 for v in values[: sum(filled)]):
        raise InputError(f"{where}: {prefix}1..: values must lie in (0, 1) from position 1 on, without gaps; "
                         f"got {values}")
    return tuple(float(v) for v in values[: sum(filled)])


def _value(record: dict[str, Any], key: str) -> Any:
    value = record.get(key)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) or value == "" else value


def read_published(path: str | Path, target: str | None = None, drafter: str | None = None,
                   gamma: int | None = None, domain_map: dict[str, str] | None = None) -> list[Row]:
    """Rows of a CSV of published numbers (see the module docstring)."""
    path = Path(path)
    try:
        frame = pd.read_csv(path, comment="#", skipinitialspace=True, dtype={"target": str, "drafter": str})
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: not a readable CSV table ({err})") from None
    rows = []
    for i, record in enumerate(frame.to_dict("records")):
        where = f"{path}, data row {i + 1}"
        pair = {k: _value(record, k) or default for k, default in (("target", target), ("drafter", drafter))}
        missing = [k for k, v in pair.items() if v is None]
        if missing:
            raise InputError(f"{where}: no {' or '.join(missing)}; add the column(s) or pass --{missing[0]}")
        bench = _value(record, "benchmark")
        domain = _value(record, "domain")
        if bench is None and domain is None:
            raise InputError(f"{where}: a row needs a benchmark or a domain")
        name = benchmark_name(str(bench)) if bench is not None else str(domain)
        row_gamma = _value(record, "gamma") or gamma
        tau = _value(record, "tau")
        q, s = _numbers(record, "q", where), _numbers(record, "s", where)
        if tau is None and q is None and s is None:
            raise InputError(f"{where}: no tau, q1.. or s1.. values")
        if q is not None and s is not None:
            raise InputError(f"{where}: give conditional (q1..) or survival (s1..) values, not both")
        if row_gamma is None:
            raise InputError(f"{where}: no block size: add a gamma column or pass --gamma (the number of draft "
                             "tokens per round the figures were measured with)")
        tail = _value(record, "tail_decay")
        rows.append(Row(target=str(pair["target"]), drafter=str(pair["drafter"]), name=name,
                        domain=_domain_of(name, domain, domain_map or {}, where), gamma=int(row_gamma), where=where,
                        tau=None if tau is None else float(tau), conditional=q, survival=s,
                        tail_decay=None if tail is None else float(tail), note=str(_value(record, "note") or "")))
    if not rows:
        raise InputError(f"{path}: no rows")
    return rows


def _split(line: str) -> list[str]:
    if "\t" in line:
        return [c.strip() for c in line.split("\t")]
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _deepspec_lines(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and data rows (with their line numbers) of a DeepSpec results table in a text file."""
    header: list[str] | None = None
    data = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        text = line.strip()
        if not text or text.startswith("+") or ("|" not in text and "\t" not in text):
            continue  # rules of a PrettyTable, and any log line around the table
        cells = _split(text)
        if "dataset" in cells and "accept_len" in cells:
            header = cells
        elif header is not None and len(cells) == len(header):
            data.append((number, cells))
    if header is None:
        raise InputError(f"{path}: no DeepSpec results header (dataset | target_model | ... | accept_rate@0 ...)")
    return header, data


def read_deepspec(path: str | Path, domain_map: dict[str, str] | None = None) -> list[Row]:
    """Rows of a DeepSpec eval table (see the module docstring)."""
    path = Path(path)
    header, data = _deepspec_lines(path)
    missing = [c for c in DEEPSPEC_REQUIRED if c not in header]
    positions = sorted(int(c.split("@")[1]) for c in header if re.fullmatch(r"accept_rate@\d+", c))
    if missing or positions != list(range(len(positions))) or not positions:
        raise InputError(f"{path}: the header lacks {missing or 'accept_rate@0..'}; expected DeepSpec's columns "
                         f"{', '.join(DEEPSPEC_REQUIRED)}, accept_rate@0..")
    rows = []
    for number, cells in data:
        where = f"{path}, line {number}"
        record = dict(zip(header, cells, strict=True))
        rates = [record[f"accept_rate@{k}"] for k in positions]
        given = [r for r in rates if r not in ("-", "")]
        try:
            survival = tuple(float(r) for r in given)
            propose = float(record["#propose"].split("+")[0])
            tau = float(record["accept_len"])
        except ValueError:
            raise InputError(f"{where}: #propose, accept_len and accept_rate@k must be numbers "
                             f"(#propose as '7.00+1'); got {record}") from None
        if len(given) != len(rates) and rates[len(given):] != ["-"] * (len(rates) - len(given)):
            raise InputError(f"{where}: accept_rate@k has gaps: {rates}")
        block = len(survival)
        if propose < block - PROPOSE_TOLERANCE:
            raise InputError(f"{where}: #propose {record['#propose']} is below the {block} positions measured: the "
                             "eval ran with a confidence threshold, so accept_rate@k counts only the rounds that "
                             "proposed k; re-run eval.py with --confidence-threshold 0")
        name = benchmark_name(record["dataset"])
        extra = {k: v for k, v in record.items() if k not in ("dataset", "target_model", "draft_model")}
        rows.append(Row(target=record["target_model"], drafter=record["draft_model"], name=name,
                        domain=_domain_of(name, None, domain_map or {}, where), gamma=block, where=where, tau=tau,
                        survival=survival, extra=extra))
    if not rows:
        raise InputError(f"{path}: a DeepSpec header but no data rows under it")
    return rows
