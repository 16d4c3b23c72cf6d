"""Acceptance preset files: a drafter's acceptance curves on one target, per domain and per benchmark.

A preset is a JSON file (format ``specsched-acceptance-preset``, version 1)::

    {
      "format": "specsched-acceptance-preset", "version": 1,
      "name": "qwen3-8b_dspark", "target": "Qwen3-8B", "drafter": "DSpark",
      "created": "YYYY-MM-DD", "tool": "calibration.acceptance.fit_acceptance",
      "source": {"kind": "paper" | "deepspec-eval" | "acceptance-log" | ..., "reference": "...", ...},
      "fit_positions": 7,                          # block size the input numbers were measured at
      "domains": {"math": {"q": [q_1, ...], "tail_decay": 1.0, "note": "..."}, "code": {...}, "chat": {...}},
      "benchmarks": {"gsm8k": {"domain": "math", "q": [...], "tail_decay": 1.0}, ...},     # optional
      "confidence": {"auc": [auc_1, ...]},                                                # optional
      "inputs": [...], "check": [...]              # what was fitted to, and the fit's own check (free-form)
    }

``q`` is the conditional acceptance q_1..q_K of :class:`AcceptanceCurve`.
A request of a domain follows the domain's curve, or a benchmark's curve of
that domain when the run has a benchmark mix. ``confidence.auc`` is the head's
per-position AUC (conditional, as ``ConfidenceSpec.auc``) where the source
measured it. Reading validates the file and raises :class:`PresetError`
naming the file and the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.acceptance.curves import AcceptanceCurve
from traces.workload import DOMAINS

PRESET_FORMAT = "specsched-acceptance-preset"
PRESET_VERSION = 1


class PresetError(ValueError):
    """A preset file is malformed or lacks what a run needs; the message names the file and the field."""


@dataclass(frozen=True)
class AcceptancePreset:
    """Acceptance curves of one drafter on one target (see the module docstring)."""

    name: str
    target: str
    drafter: str
    domains: Mapping[str, AcceptanceCurve]
    benchmarks: Mapping[str, tuple[str, AcceptanceCurve]] = field(default_factory=dict)  # name -> (domain, curve)
    fit_positions: int = 7
    confidence_auc: tuple[float, ...] | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)  # created, tool, source, inputs, check, notes
    path: str = "<memory>"

    def __post_init__(self) -> None:
        where = f"acceptance preset {self.path}"
        unknown = sorted(set(self.domains) - set(DOMAINS))
        if unknown:
            raise PresetError(f"{where}: domains has unknown domain(s) {unknown}; valid: {', '.join(DOMAINS)}")
        for name, (domain, _) in self.benchmarks.items():
            if name in DOMAINS:
                raise PresetError(f"{where}: benchmark {name!r} has a domain's name; name benchmarks apart")
            if domain not in DOMAINS:
                raise PresetError(f"{where}: benchmarks.{name}.domain={domain!r}; valid: {', '.join(DOMAINS)}")
        if not self.domains:
            raise PresetError(f"{where}: no domain curves")
        if self.fit_positions < 1:
            raise PresetError(f"{where}: fit_positions must be >= 1, got {self.fit_positions}")

    def curve(self, domain: str) -> AcceptanceCurve:
        """The domain's curve; an error names the preset and the domains it has."""
        if domain not in self.domains:
            raise PresetError(f"acceptance preset {self.name} ({self.path}) has no curve for domain {domain!r}; "
                              f"it has {', '.join(self.domains)}: choose traffic of those domains or another preset")
        return self.domains[domain]

    def benchmark(self, name: str) -> tuple[str, AcceptanceCurve]:
        if name not in self.benchmarks:
            raise PresetError(f"acceptance preset {self.name} ({self.path}) has no benchmark {name!r}; it has: "
                              f"{', '.join(self.benchmarks) or '(none: it is per domain only)'}")
        return self.benchmarks[name]

    def to_dict(self) -> dict[str, Any]:
        meta = dict(self.metadata)
        out: dict[str, Any] = {"format": PRESET_FORMAT, "version": PRESET_VERSION, "name": self.name,
                               "target": self.target, "drafter": self.drafter}
        out.update({k: meta.pop(k) for k in ("created", "tool", "source") if k in meta})
        out["fit_positions"] = self.fit_positions
        out["domains"] = {d: {**c.to_dict(), **_notes(meta, d)} for d, c in self.domains.items()}
        if self.benchmarks:
            out["benchmarks"] = {b: {"domain": d, **c.to_dict(), **_notes(meta, b)}
                                 for b, (d, c) in self.benchmarks.items()}
        if self.confidence_auc is not None:
            out["confidence"] = {"auc": [round(a, 4) for a in self.confidence_auc]}
        meta.pop("notes", None)
        out.update(meta)
        return out

    def save(self, path: str | Path) -> None:
        """Write the preset as strict JSON (no NaN), one line per list of numbers."""
        text = json.dumps(self.to_dict(), indent=1, allow_nan=False)
        text = re.sub(r"\[\s+([^\[\]{}\"]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
        Path(path).write_text(text + "\n")


def _notes(meta: Mapping[str, Any], name: str) -> dict[str, str]:
    note = meta.get("notes", {}).get(name)
    return {"note": note} if note else {}


def _get(data: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise PresetError(f"{where}: missing field {key!r}")
    return data[key]


def _curve(block: Any, where: str) -> AcceptanceCurve:
    if not isinstance(block, Mapping):
        raise PresetError(f"{where}: expected an object with q and tail_decay, got {block!r}")
    q = _get(block, "q", where)
    if not isinstance(q, list) or not q or not all(isinstance(x, (int, float)) for x in q):
        raise PresetError(f"{where}.q: expected a non-empty list of numbers, got {q!r}")
    try:
        return AcceptanceCurve(tuple(q), float(block.get("tail_decay", 1.0)))
    except ValueError as err:
        raise PresetError(f"{where}: {err}") from err


def preset_from_dict(data: Mapping[str, Any], origin: str = "<memory>") -> AcceptancePreset:
    """Validate a preset's JSON object (see the module docstring)."""
    where = f"acceptance preset {origin}"
    if data.get("format") != PRESET_FORMAT:
        raise PresetError(f"{where}: format must be {PRESET_FORMAT!r}, got {data.get('format')!r}")
    if data.get("version") != PRESET_VERSION:
        raise PresetError(f"{where}: version {data.get('version')!r} is not supported (this reader: "
                          f"{PRESET_VERSION})")
    domains_block = _get(data, "domains", where)
    if not isinstance(domains_block, Mapping):
        raise PresetError(f"{where}: domains must be an object of domain -> curve")
    domains = {d: _curve(c, f"{where}: domains.{d}") for d, c in domains_block.items()}
    benchmarks = {}
    for name, block in (data.get("benchmarks") or {}).items():
        benchmarks[name] = (_get(block, "domain", f"{where}: benchmarks.{name}"),
                            _curve(block, f"{where}: benchmarks.{name}"))
    auc = (data.get("confidence") or {}).get("auc")
    if auc is not None and (not isinstance(auc, list) or not all(0.5 < a < 1.0 for a in auc)):
        raise PresetError(f"{where}: confidence.auc must be a list of AUCs between 0.5 and 1, got {auc!r}")
    fit_positions = _get(data, "fit_positions", where)
    if not isinstance(fit_positions, int):
        raise PresetError(f"{where}: fit_positions must be an integer, got {fit_positions!r}")
    notes = {n: b["note"] for group in ("domains", "benchmarks") for n, b in (data.get(group) or {}).items()
             if isinstance(b, Mapping) and b.get("note")}
    known = {"format", "version", "name", "target", "drafter", "fit_positions", "domains", "benchmarks", "confidence"}
    metadata = {k: v for k, v in data.items() if k not in known} | ({"notes": notes} if notes else {})
    return AcceptancePreset(name=str(_get(data, "name", where)), target=str(_get(data, "target", where)),
                            drafter=str(_get(data, "drafter", where)), domains=domains, benchmarks=benchmarks,
                            fit_positions=fit_positions, confidence_auc=tuple(auc) if auc is not None else None,
                            metadata=metadata, path=origin)


def read_preset(path: str | Path) -> AcceptancePreset:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PresetError(f"acceptance preset {path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise PresetError(f"acceptance preset {path}: not JSON ({err})") from None
    if not isinstance(data, Mapping):
        raise PresetError(f"acceptance preset {path}: expected a JSON object")
    return preset_from_dict(data, str(path))
