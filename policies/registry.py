"""The family of policies, found by discovery: one module per family, one ``@register`` per policy.

Every top-level module of :mod:`policies` other than the contract (``base``),
its compiled loops (``kernels``), the driver (``driver``) and this file is
imported once, the first time the registry is read; each policy class in it announces itself with
:func:`register`. Adding a policy is one module here plus one Hydra yaml in
``experiments/conf/policy/``: nothing else lists policies.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import re
from typing import Any

from policies.base import Policy

_NOT_POLICIES = frozenset({"base", "driver", "kernels", "registry"})
_MTP_NAME = re.compile(r"mtp(\d+)")
_registered: dict[str, type] = {}
_discovered = False


def register(cls: type) -> type:
    """Class decorator that makes a policy available by its ``name``."""
    name = cls.name
    if name in _registered and _registered[name] is not cls:
        raise ValueError(f"two policies are named {name!r}: {_registered[name].__module__} and {cls.__module__}")
    _registered[name] = cls
    return cls


def policy_classes() -> dict[str, type]:
    """Every registered policy class by name, after importing every policy module once."""
    global _discovered
    if not _discovered:
        package = importlib.import_module("policies")
        for module in pkgutil.iter_modules(package.__path__):
            if not module.ispkg and module.name not in _NOT_POLICIES:
                importlib.import_module(f"policies.{module.name}")
        _discovered = True
    return dict(sorted(_registered.items()))


def policy_names() -> list[str]:
    """Every accepted policy name (``mtp<k>`` stands for any k >= 1)."""
    return sorted(set(policy_classes()) | {"mtp<k>"})


def make_policy(name: str, **params: Any) -> Policy:
    """Build a policy by name; ``mtp3`` is shorthand for ``mtp`` with k=3."""
    match = _MTP_NAME.fullmatch(name)
    if match:
        params = {"k": int(match.group(1)), **params}
        name = "mtp"
    classes = policy_classes()
    if name not in classes:
        raise ValueError(f"unknown policy {name!r}; valid policies: {', '.join(policy_names())}")
    cls = classes[name]
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - fields)
    if unknown:
        raise ValueError(
            f"policy {name!r} has no parameter(s) {', '.join(unknown)}; "
            f"its parameters are: {', '.join(sorted(fields)) or '(none)'}"
        )
    return cls(**params)
