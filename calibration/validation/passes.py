"""One profile from a validation's profile passes, and how far its price can be off.

Every round of ``calibration.validate`` profiles the machine once (a *pass*), so a run holds one
pass per round, all on the same grids. The simulator prices with their element-wise combination,
by one of :data:`COMBINE_RULES`:

* ``trimmed`` (default): the mean after dropping each element's lowest and highest pass (the mean with
  two passes or fewer). Over the eleven runs whose passes were kept (``docs/validation_runs.md``, "Evening
  of 2026-12-04") it was the best of the three rules on average and the worst in one run only.
* ``mean``: what the slices pay on average (throughput is tokens over the *sum* of step times), but one
  stray pass moves it by a fifth of its distance (five passes).
* ``median``: one pass caught by a burst of load elsewhere does not move the profile. On a machine whose
  step times lean to the slow side it prices below what real slices pay on average: the default until
  2026-12-04, when every run of the evening came out optimistic under it.

The mean of a time is what a run pays, so rates (fields named ``..._per_s``: steps or tokens per
second) are combined through their reciprocal, the seconds each stands for: their mean is the
harmonic mean of the rates. The median is taken of the values as they stand (the same either way
with an odd number of passes).

``python -m calibration.validation.recombine`` re-simulates a finished run with each rule, from its
``profile_passes/`` files, to compare them on runs already made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from calibration.profiling.step_prices import excess_entry_s
from simulator.costs import HardwareProfile, profile_from_dict
from simulator.costs.schema import VERIFY_SECONDS

COMBINE_RULES = ("median", "trimmed", "mean")
DEFAULT_RULE = "trimmed"  # ValidationConfig.combine_passes' default (module docstring)


def _trimmed_mean(values: np.ndarray) -> float:
    ordered = np.sort(values)
    return float(ordered[1:-1].mean() if ordered.size > 2 else ordered.mean())


_CENTRES: dict[str, Callable[[np.ndarray], float]] = {
    "median": lambda v: float(np.median(v)), "mean": lambda v: float(np.mean(v)), "trimmed": _trimmed_mean}


def check_rule(rule: str) -> str:
    if rule not in COMBINE_RULES:
        raise ValueError(f"combine_passes must be one of {', '.join(COMBINE_RULES)}, got {rule!r}")
    return rule


def combine_passes(passes: Sequence[HardwareProfile], rule: str = DEFAULT_RULE) -> HardwareProfile:
    """The element-wise ``rule`` of profiles measured on the same grids (of every float, single or in lists; text,
    flags and integers - axes, counts - taken from the first pass, with which every other must agree in shape);
    ``..._per_s`` rates through their reciprocals for the means (module docstring)."""
    centre = _CENTRES[check_rule(rule)]

    def combine(values: list[Any], where: str, key: str) -> Any:
        first = values[0]
        if isinstance(first, dict):
            keys = list(dict.fromkeys(k for v in values for k in v))
            if where == "profile.verify":  # a pass's fit may find no work for one of these: the field is left out
                values = [{**{k: 0.0 for k in VERIFY_SECONDS if k in keys}, **v} for v in values]
            if where == "profile.prefill" and "decode_tail_s" in keys:  # a tail fitted to 0 beyond some step ends there
                tails = [v.get("decode_tail_s", []) for v in values]
                steps = max(map(len, tails))
                values = [{**v, "decode_tail_s": [*t, *[0.0] * (steps - len(t))]}
                          for v, t in zip(values, tails, strict=True)]
            for k in keys:
                lacking = [i + 1 for i, v in enumerate(values) if k not in v]
                if lacking:
                    raise ValueError(f"profile passes differ: {where}.{k} is missing from pass(es) "
                                     f"{', '.join(map(str, lacking))}")
            return {k: combine([v[k] for v in values], f"{where}.{k}", k) for k in keys}
        if isinstance(first, list):
            if any(len(v) != len(first) for v in values):
                raise ValueError(f"profile passes differ in the length of {where}")
            return [combine([v[i] for v in values], f"{where}[{i}]", key) for i in range(len(first))]
        if isinstance(first, float):
            array = np.asarray(values, dtype=np.float64)
            if rule != "median" and key.endswith("per_s") and (array > 0).all():
                return 1.0 / centre(1.0 / array)
            return centre(array)
        return first

    data = combine([p.raw for p in passes], "profile", "")
    _clamp_policy_excess_after_combining(data)
    data["metadata"]["profile_passes"] = len(passes)
    data["metadata"]["timing"] = (data["metadata"].get("timing", "") + f"; element-wise {rule} of {len(passes)} "
                                  "passes interleaved with the real runs (rates through their seconds)")
    return profile_from_dict(data, "<validation profile>")


def _clamp_policy_excess_after_combining(data: dict[str, Any]) -> None:
    """A dynamic policy's in-loop excess (``metadata.policy_steps``, from the profiler's policy probe) is written to
    each pass's ``scheduler.policies.<name>.s`` no lower than 0, since a decision takes no negative time. Combining
    those clamped entries would lean high: a pass whose shared fit priced the probe's steps above their cycles adds
    0, not its negative excess (in four runs of 2026-12-05 and 06, 10-36% of the per-pass, per-R figures were
    negative, and the combination of clamped entries came out up to 0.21 ms per step, 1.4% of a 15 ms step, above
    the clamped combination of the raw ones). So the combined entry is the combination of the raw excess, clamped
    once, after it."""
    entries = data.get("scheduler", {}).get("policies", {})
    for name, fit in data.get("metadata", {}).get("policy_steps", {}).items():
        entry, raw = entries.get(name, {}), fit.get("mean_excess_s")
        if "s" in entry and raw is not None and len(raw) == len(entry["s"]):
            entry["s"] = excess_entry_s(raw)


def price_se_factor(rule: str) -> float:
    """The combined price's standard error over the passes' standard deviation / sqrt(n), for normal scatter: 1
    for the mean, sqrt(pi / 2) for the median (large-sample; for 2-5 passes the exact factor is 1.0-1.2, so it
    errs wide by up to a quarter). A trimmed mean lies between the two: the median's factor, as an upper bound."""
    return 1.0 if check_rule(rule) == "mean" else float(np.sqrt(np.pi / 2))


def profile_price_se(ratios: Sequence[float], rule: str = DEFAULT_RULE) -> float:
    """The relative standard error of the combined profile's price of a point's real steps, from each profile
    pass's price of the same steps (``ratios``: measured over priced seconds under each pass): the passes' prices
    over their mean, their standard deviation times :func:`price_se_factor` over sqrt(n). NaN with fewer than two
    passes."""
    prices = 1.0 / np.asarray(ratios, dtype=np.float64)
    if prices.size < 2 or not np.isfinite(prices).all():
        return float("nan")
    return float(price_se_factor(rule) * np.std(prices / prices.mean(), ddof=1) / np.sqrt(prices.size))
