"""Field checks of a profile dictionary: each error is a :class:`ProfileError` naming the file and the field."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np


class ProfileError(ValueError):
    """A profile file is malformed; the message names the file and the field."""


def get(data: Any, key: str, where: str, origin: str) -> Any:
    """``data[key]``; ``where`` is the dotted prefix of the field (``"verify."``) for the message."""
    if not isinstance(data, dict) or key not in data:
        raise ProfileError(f"{origin}: missing field '{where}{key}'")
    return data[key]


def block(data: dict[str, Any], key: str, origin: str, required: bool = True) -> dict[str, Any] | None:
    """A sub-object of the profile (``None`` when optional and absent or null)."""
    value = data.get(key)
    if value is None and not required:
        return None
    value = get(data, key, "", origin)
    if not isinstance(value, dict):
        raise ProfileError(f"{origin}: field '{key}' must be an object, got {value!r}")
    return value


def known_keys(data: dict[str, Any], allowed: Iterable[str], where: str, origin: str) -> None:
    """Every key of ``data`` is one the format defines (nothing in a profile is silently ignored)."""
    allowed = tuple(allowed)
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ProfileError(f"{origin}: unknown field '{where}{unknown[0]}'; valid fields here: {', '.join(allowed)}")


def number(value: Any, where: str, origin: str, allow_zero: bool = False) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not np.isfinite(value):
        raise ProfileError(f"{origin}: field '{where}' must be a number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ProfileError(f"{origin}: field '{where}' must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return float(value)


def integer(value: Any, where: str, origin: str, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ProfileError(f"{origin}: field '{where}' must be an integer >= {minimum}, got {value!r}")
    return value


def flag(value: Any, where: str, origin: str) -> bool:
    if not isinstance(value, bool):
        raise ProfileError(f"{origin}: field '{where}' must be true or false, got {value!r}")
    return value


def choice(value: Any, allowed: tuple[str, ...], where: str, origin: str) -> str:
    if value not in allowed:
        raise ProfileError(f"{origin}: field '{where}' must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


def axis(values: Any, where: str, origin: str, allow_zero: bool = False) -> np.ndarray:
    """A non-empty, strictly increasing list of numbers (> 0, or >= 0 with ``allow_zero``)."""
    if not isinstance(values, list) or not values:
        raise ProfileError(f"{origin}: field '{where}' must be a non-empty list")
    arr = np.array([number(v, f"{where}[{i}]", origin, allow_zero) for i, v in enumerate(values)])
    steps = np.diff(arr)
    if np.any(steps <= 0):
        i = int(np.flatnonzero(steps <= 0)[0]) + 1
        kind = "duplicate" if steps[i - 1] == 0 else "unsorted"
        raise ProfileError(f"{origin}: field '{where}' must be strictly increasing "
                           f"({kind} value {values[i]} at index {i})")
    return arr


def values(data: Any, n: int, where: str, origin: str, allow_zero: bool = False) -> np.ndarray:
    """A list of ``n`` numbers (> 0, or >= 0 with ``allow_zero``)."""
    if not isinstance(data, list) or len(data) != n:
        raise ProfileError(f"{origin}: field '{where}' must be a list of {n} numbers")
    return np.array([number(v, f"{where}[{i}]", origin, allow_zero) for i, v in enumerate(data)])


def grid(data: Any, shape: tuple[int, ...], where: str, origin: str, allow_zero: bool = False) -> np.ndarray:
    """A nested list of numbers of the given shape (rows first), e.g. ``[NC][NQ]``."""
    if len(shape) == 1:
        return values(data, shape[0], where, origin, allow_zero)
    if not isinstance(data, list) or len(data) != shape[0]:
        raise ProfileError(f"{origin}: field '{where}' must have one row per point of its first axis ({shape[0]})")
    return np.stack([grid(row, shape[1:], f"{where}[{i}]", origin, allow_zero) for i, row in enumerate(data)])
