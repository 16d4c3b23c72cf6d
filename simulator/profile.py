"""Hardware profiles: the step-cost tables that drive the simulator.

A profile is a JSON file (format ``specsched-hardware-profile``, version 1)::

    {
      "format": "specsched-hardware-profile", "version": 1,
      "metadata": {"source": "measured" | "analytic", "device": ..., "model": ...,
                   "created": "YYYY-MM-DD", "tool": ..., ...free-form extras},
      "gpus_per_replica": 1,
      "verify": {"batch_tokens": [1, 2, ...], "steps_per_s": [...],
                 "padded_slot_s": 0.0},                                   # optional
      "per_request": {"num_requests": [1, ...], "step_s": [...]},          # optional
      "draft": {"<drafter kind>": {"num_requests": [...], "draft_tokens": [...],
                                   "latency_s": [[...], ...]}},           # [R][gamma]
      "prefill": {"fixed_s": 0.01, "tokens_per_s": 40000.0},
      "scheduler": {"fixed_s": 0.0005, "per_candidate_s": 2e-8,
                    "inline": false,                                       # optional
                    "policies": {"<policy>": {"fixed_s": ..., "per_candidate_s": ...}}}  # optional
    }

One target step over B batch tokens with R requests takes
``1 / SPS(B) + per_request(R)`` seconds (the additive form production engines
profile: a cost over tokens plus a cost over requests), plus ``padded_slot_s``
per padded query slot, ``R * max_r(1 + l_r) - B``, for attention kernels that
pad every request's queries to the longest in the batch (0 for variable-length
kernels; uniform batches have no padding); the drafter adds
``latency_s(R, gamma)``, and a synchronous scheduler adds
``fixed_s + per_candidate_s * R * gamma`` (the policy's own entry under
``scheduler.policies`` when it has one). Asynchronous policies (``dspark``,
static ones) decide off the critical path unless ``scheduler.inline`` is true:
a serving stack that calls every policy's decision between the draft and the
verify pass, with no overlap, pays it at every step. Tables are interpolated linearly
between their points (never smoothed: real curves are jagged) and a query
outside a table is an error, not an extrapolation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from policies.base import CostCurve

PROFILE_FORMAT = "specsched-hardware-profile"
PROFILE_VERSION = 1
BUILTIN_DIR = Path(__file__).parent / "profiles"
SOURCES = ("measured", "analytic")


class ProfileError(ValueError):
    """A profile file is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class Table1D:
    """y over strictly increasing x, interpolated linearly, errors outside."""

    x: np.ndarray
    y: np.ndarray
    what: str  # e.g. "verify SPS over batch_tokens", for error messages

    def __call__(self, x: np.ndarray | float) -> np.ndarray:
        q = np.asarray(x, dtype=np.float64)
        if q.size and (q.min() < self.x[0] or q.max() > self.x[-1]):
            raise ValueError(f"{self.what}: {q.min():g}..{q.max():g} is outside the "
                             f"profiled range {self.x[0]:g}..{self.x[-1]:g}")
        return np.interp(q, self.x, self.y)


@dataclass(frozen=True)
class DraftTable:
    """Drafter latency over (requests R, draft tokens gamma), bilinear inside the grid."""

    num_requests: np.ndarray  # [NR]
    draft_tokens: np.ndarray  # [NG]
    latency_s: np.ndarray  # [NR, NG]
    kind: str

    def __call__(self, num_requests: int, draft_tokens: int) -> float:
        if draft_tokens == 0:
            return 0.0
        r, g = float(num_requests), float(draft_tokens)
        for value, axis, name in ((r, self.num_requests, "num_requests"), (g, self.draft_tokens, "draft_tokens")):
            if value < axis[0] or value > axis[-1]:
                raise ValueError(f"draft latency of {self.kind!r}: {name}={value:g} is outside the "
                                 f"profiled range {axis[0]:g}..{axis[-1]:g}")
        per_gamma = np.array([np.interp(r, self.num_requests, col) for col in self.latency_s.T])
        if self.draft_tokens.size == 1:
            return float(per_gamma[0])
        return float(np.interp(g, self.draft_tokens, per_gamma))


@dataclass(frozen=True)
class HardwareProfile:
    """A loaded, validated profile. Build it with :func:`load_profile` or :func:`profile_from_dict`."""

    metadata: dict[str, Any]
    gpus_per_replica: int
    verify_sps: Table1D
    per_request_s: Table1D | None
    draft: dict[str, DraftTable]
    prefill_fixed_s: float
    prefill_tokens_per_s: float
    scheduler_fixed_s: float
    scheduler_per_candidate_s: float
    padded_slot_s: float = 0.0  # verify seconds per padded query slot, R * max(1 + l_r) - B
    scheduler_inline: bool = False  # every policy's decision is on the step's critical path
    scheduler_by_policy: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (fixed, per cand.)
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    path: str = "<memory>"

    @property
    def source(self) -> str:
        return str(self.metadata["source"])

    @property
    def label(self) -> str:
        """Short human label, always saying whether the numbers are measured or analytic."""
        meta = self.metadata
        return f"{meta.get('model', '?')} on {meta.get('device', '?')} ({self.source})"

    @property
    def max_batch_tokens(self) -> int:
        return int(self.verify_sps.x[-1])

    def cost_curve(self, num_requests: int, draft_s: float = 0.0) -> CostCurve:
        """SPS over batch tokens for a step with ``num_requests`` requests."""
        sps = self.verify_sps.y
        if self.per_request_s is not None:
            sps = 1.0 / (1.0 / sps + float(self.per_request_s(num_requests)))
        return CostCurve(batch_tokens=self.verify_sps.x, steps_per_s=sps, draft_s=draft_s)

    def step_cost_curve(self, drafter: str, num_requests: int, draft_tokens: int) -> CostCurve:
        """What a policy prices a step with: :meth:`cost_curve` with the drafter's time for R and g."""
        return self.cost_curve(num_requests, self.draft_s(drafter, num_requests, draft_tokens))

    def verify_s(self, num_requests: int, batch_tokens: int, padded_slots: int = 0) -> float:
        """One target step: ``batch_tokens`` over ``num_requests`` requests, ``padded_slots`` query slots of
        padding (``R * max(1 + l_r) - B``)."""
        step_s = 1.0 / float(self.verify_sps(batch_tokens)) + self.padded_slot_s * padded_slots
        if self.per_request_s is not None:
            step_s += float(self.per_request_s(num_requests))
        return step_s

    def draft_s(self, kind: str, num_requests: int, draft_tokens: int) -> float:
        if draft_tokens == 0:
            return 0.0
        if kind not in self.draft:
            raise ValueError(f"profile {self.path} has no draft latency for drafter {kind!r}; "
                             f"it has: {', '.join(sorted(self.draft)) or '(none)'}")
        return self.draft[kind](num_requests, draft_tokens)

    def prefill_s(self, prompt_tokens: np.ndarray | int) -> np.ndarray:
        return self.prefill_fixed_s + np.asarray(prompt_tokens, dtype=np.float64) / self.prefill_tokens_per_s

    def scheduler_s(self, num_candidates: int, policy: str | None = None) -> float:
        """Seconds of one decision over ``num_candidates`` (request, position) pairs, by ``policy``'s own entry
        when the profile has one."""
        fixed_s, per_candidate_s = self.scheduler_by_policy.get(
            policy, (self.scheduler_fixed_s, self.scheduler_per_candidate_s))
        return fixed_s + per_candidate_s * num_candidates

    def charges_decision(self, synchronous: bool) -> bool:
        """Whether a policy's decision time is on the step's critical path."""
        return synchronous or self.scheduler_inline

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.raw, indent=1) + "\n")


def builtin_profiles() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.json"))


def resolve_profile_path(name_or_path: str | Path) -> Path:
    """A path to an existing file, or the name of a built-in profile."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    builtin = BUILTIN_DIR / f"{name_or_path}.json"
    if builtin.is_file():
        return builtin
    raise FileNotFoundError(f"hardware profile {str(name_or_path)!r} is neither a file nor a built-in "
                            f"profile; built-in profiles: {', '.join(builtin_profiles())}")


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    path = resolve_profile_path(name_or_path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ProfileError(f"{path}: not valid JSON ({err})") from err
    return profile_from_dict(data, str(path))


# ---------------------------------------------------------------- validation


def _get(data: dict[str, Any], key: str, where: str, origin: str) -> Any:
    if not isinstance(data, dict) or key not in data:
        raise ProfileError(f"{origin}: missing field '{where}{key}'")
    return data[key]


def _positive(value: Any, where: str, origin: str, allow_zero: bool = False) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not np.isfinite(value):
        raise ProfileError(f"{origin}: field '{where}' must be a number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ProfileError(f"{origin}: field '{where}' must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return float(value)


def _axis(values: Any, where: str, origin: str) -> np.ndarray:
    if not isinstance(values, list) or not values:
        raise ProfileError(f"{origin}: field '{where}' must be a non-empty list")
    arr = np.array([_positive(v, f"{where}[{i}]", origin) for i, v in enumerate(values)])
    steps = np.diff(arr)
    if np.any(steps <= 0):
        i = int(np.flatnonzero(steps <= 0)[0]) + 1
        kind = "duplicate" if steps[i - 1] == 0 else "unsorted"
        raise ProfileError(f"{origin}: field '{where}' must be strictly increasing "
                           f"({kind} value {values[i]} at index {i})")
    return arr


def _values(values: Any, n: int, where: str, origin: str, allow_zero: bool = False) -> np.ndarray:
    if not isinstance(values, list) or len(values) != n:
        raise ProfileError(f"{origin}: field '{where}' must be a list of {n} numbers")
    return np.array([_positive(v, f"{where}[{i}]", origin, allow_zero) for i, v in enumerate(values)])


def profile_from_dict(data: dict[str, Any], origin: str = "<memory>") -> HardwareProfile:
    """Validate a profile dictionary; errors name ``origin`` and the field."""
    if _get(data, "format", "", origin) != PROFILE_FORMAT:
        raise ProfileError(f"{origin}: field 'format' must be {PROFILE_FORMAT!r}, got {data['format']!r}")
    if _get(data, "version", "", origin) != PROFILE_VERSION:
        raise ProfileError(f"{origin}: field 'version' must be {PROFILE_VERSION}, got {data['version']!r}")
    meta = _get(data, "metadata", "", origin)
    for key in ("source", "device", "model", "created", "tool"):
        _get(meta, key, "metadata.", origin)
    if meta["source"] not in SOURCES:
        raise ProfileError(f"{origin}: field 'metadata.source' must be one of {SOURCES}, got {meta['source']!r}")
    gpus = _get(data, "gpus_per_replica", "", origin)
    if not isinstance(gpus, int) or gpus < 1:
        raise ProfileError(f"{origin}: field 'gpus_per_replica' must be an integer >= 1, got {gpus!r}")

    verify = _get(data, "verify", "", origin)
    tokens = _axis(_get(verify, "batch_tokens", "verify.", origin), "verify.batch_tokens", origin)
    sps = _values(_get(verify, "steps_per_s", "verify.", origin), tokens.size, "verify.steps_per_s", origin)

    per_request = None
    if data.get("per_request") is not None:
        block = data["per_request"]
        reqs = _axis(_get(block, "num_requests", "per_request.", origin), "per_request.num_requests", origin)
        cost = _values(_get(block, "step_s", "per_request.", origin), reqs.size, "per_request.step_s", origin,
                       allow_zero=True)
        per_request = Table1D(reqs, cost, "per-request step cost over num_requests")

    drafts: dict[str, DraftTable] = {}
    for kind, block in _get(data, "draft", "", origin).items():
        where = f"draft.{kind}."
        reqs = _axis(_get(block, "num_requests", where, origin), where + "num_requests", origin)
        gammas = _axis(_get(block, "draft_tokens", where, origin), where + "draft_tokens", origin)
        rows = _get(block, "latency_s", where, origin)
        if not isinstance(rows, list) or len(rows) != reqs.size:
            raise ProfileError(f"{origin}: field '{where}latency_s' must have one row per num_requests ({reqs.size})")
        grid = np.stack([_values(row, gammas.size, f"{where}latency_s[{i}]", origin) for i, row in enumerate(rows)])
        drafts[kind] = DraftTable(reqs, gammas, grid, kind)

    prefill = _get(data, "prefill", "", origin)
    sched = _get(data, "scheduler", "", origin)
    return HardwareProfile(
        metadata=dict(meta),
        gpus_per_replica=gpus,
        verify_sps=Table1D(tokens, sps, "verify SPS over batch_tokens"),
        per_request_s=per_request,
        draft=drafts,
        prefill_fixed_s=_positive(_get(prefill, "fixed_s", "prefill.", origin), "prefill.fixed_s", origin, True),
        prefill_tokens_per_s=_positive(_get(prefill, "tokens_per_s", "prefill.", origin), "prefill.tokens_per_s",
                                       origin),
        scheduler_fixed_s=_positive(_get(sched, "fixed_s", "scheduler.", origin), "scheduler.fixed_s", origin, True),
        scheduler_per_candidate_s=_positive(_get(sched, "per_candidate_s", "scheduler.", origin),
                                            "scheduler.per_candidate_s", origin, True),
        padded_slot_s=_positive(verify.get("padded_slot_s", 0.0), "verify.padded_slot_s", origin, True),
        scheduler_inline=_flag(sched.get("inline", False), "scheduler.inline", origin),
        scheduler_by_policy=_policy_schedulers(sched.get("policies", {}), origin),
        raw=data,
        path=origin,
    )


def _flag(value: Any, name: str, origin: str) -> bool:
    if not isinstance(value, bool):
        raise ProfileError(f"{origin}: field '{name}' must be true or false, got {value!r}")
    return value


def _policy_schedulers(block: Any, origin: str) -> dict[str, tuple[float, float]]:
    if not isinstance(block, dict):
        raise ProfileError(f"{origin}: field 'scheduler.policies' must map policy names to "
                           f"{{fixed_s, per_candidate_s}}, got {block!r}")
    out = {}
    for name, entry in block.items():
        where = f"scheduler.policies.{name}."
        if not isinstance(entry, dict):
            raise ProfileError(f"{origin}: field '{where[:-1]}' must be {{fixed_s, per_candidate_s}}, got {entry!r}")
        out[name] = (_positive(_get(entry, "fixed_s", where, origin), where + "fixed_s", origin, True),
                     _positive(_get(entry, "per_candidate_s", where, origin), where + "per_candidate_s", origin,
                               True))
    return out
