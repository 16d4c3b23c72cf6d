"""Verification policies: pure numpy functions that decide l_r for every request.

Add a policy by writing a frozen dataclass with ``name``, the traits of
:class:`policies.base.PolicyTraits` and a pure ``decide(view) -> Decision``,
then listing it in ``POLICIES`` (or calling :func:`register`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from policies.base import CostCurve, Decision, Policy, StepView, prefix_survival
from policies.dspark import DSpark, Goodput, Oracle
from policies.greedy import GlobalSync, Greedy
from policies.static import Mtp, NoSpeculation, Threshold

POLICIES: dict[str, type] = {
    cls.name: cls for cls in (NoSpeculation, Mtp, Threshold, Greedy, GlobalSync, DSpark, Goodput, Oracle)
}
_MTP_NAME = re.compile(r"mtp(\d+)")


def register(cls: type) -> type:
    """Class decorator that makes a policy available by its ``name``."""
    POLICIES[cls.name] = cls
    return cls


def policy_names() -> list[str]:
    """Every accepted policy name (``mtp<k>`` stands for any k >= 1)."""
    return sorted(set(POLICIES) | {"mtp<k>"})


def make_policy(name: str, **params: Any) -> Policy:
    """Build a policy by name; ``mtp3`` is shorthand for ``mtp`` with k=3."""
    match = _MTP_NAME.fullmatch(name)
    if match:
        params = {"k": int(match.group(1)), **params}
        name = "mtp"
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; valid policies: {', '.join(policy_names())}")
    cls = POLICIES[name]
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - fields)
    if unknown:
        raise ValueError(
            f"policy {name!r} has no parameter(s) {', '.join(unknown)}; "
            f"its parameters are: {', '.join(sorted(fields)) or '(none)'}"
        )
    return cls(**params)


__all__ = [
    "POLICIES", "CostCurve", "DSpark", "Decision", "GlobalSync", "Goodput", "Greedy", "Mtp",
    "NoSpeculation", "Oracle", "Policy", "StepView", "Threshold", "make_policy", "policy_names",
    "prefix_survival", "register",
]
