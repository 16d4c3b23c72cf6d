"""Verification policies: pure numpy functions that decide l_r for every request.

The folder holds the contract (:mod:`policies.base`: what a policy sees and
returns), the driver (:mod:`policies.driver`: what a caller carries for a
policy between steps and how it checks a decision), the registry
(:mod:`policies.registry`) and one module per policy family. Add a policy by
writing a frozen dataclass with ``name``, the traits of
:class:`policies.base.PolicyTraits` and a pure ``decide(view) -> Decision`` in a
new module here, decorated with ``@register``; it is found by discovery. The
token-level sampler and the exact losslessness checker live in
:mod:`policies.lossless`.
"""

from __future__ import annotations

from policies.base import CostCurve, Decision, Policy, PolicyTraits, StepView, prefix_survival
from policies.driver import CostSource, PolicyMemory, check_decision, cost_for
from policies.registry import make_policy, policy_classes, policy_names, register

__all__ = [
    "CostCurve", "CostSource", "Decision", "Policy", "PolicyMemory", "PolicyTraits", "StepView",
    "check_decision", "cost_for", "make_policy", "policy_classes", "policy_names", "prefix_survival", "register",
]
