"""The policies of the losslessness bench: every registered one, and lossy ones written to be caught.

* :func:`registered_variants` - each policy found by the registry, with its default
  parameters and one parameter changed at a time (every value of a ``Literal``,
  small integers, a few floats, ``None``); a new policy module is covered with no
  edit here. Upper bounds that read true outcomes are left out, with the reason.
* Lossy policies, each leaking through one door, so that the tests can show the
  checks and the worlds find every door: look-ahead past a falling Theta, deeper
  positions first on survival ties, a peek made only on exact throughput ties, a
  peek two positions ahead from position 3 on (gamma >= 5), decisions gated on
  the policy's own memory (stale pool, EMA rows), and cross-request peeks that
  form a cycle (two requests; three in an XOR; four in a ring).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import ClassVar, Literal, get_args, get_origin

import numpy as np

from policies import Policy, policy_classes
from policies.base import Decision, PolicyTraits, StepView, path_throughput, prefix_survival, top_k_lengths
from policies.greedy import early_stop_count, search_capacity

# --- every registered policy ------------------------------------------------------------------------

FLOAT_VALUES = (0.0, 0.5, 0.8, 1.0)  # for float parameters; values a policy refuses are left out
BOUND = "reads the true acceptance outcomes: an upper bound, not a runnable scheduler"


def _values(annotation: object, default: object) -> list[object]:
    """Candidate values for one dataclass field, from its type."""
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    args = [a for a in get_args(annotation) if a is not type(None)]
    optional = len(args) < len(get_args(annotation))
    base = args[0] if args else annotation
    if base is bool:
        values: list[object] = [False, True]
    elif base is int:  # the small values (0 is often a boundary) and the default's neighbours
        near = {default - 1, default + 1} if isinstance(default, int) else set()
        values = sorted(v for v in {0, 1, 2} | near if v >= 0)
    elif base is float:
        values = list(FLOAT_VALUES)
    else:
        values = []
    return values + ([None] if optional else [])


def skipped_policies() -> dict[str, str]:
    """Registered policies the bench does not run, with the reason.

    Policies that read true outcomes (``needs_outcomes``, the oracle) are upper
    bounds, not schedulers: no engine can run them, so there is no law to check.
    """
    return {name: BOUND for name, cls in policy_classes().items() if cls.needs_outcomes}


def registered_variants() -> list[tuple[str, Policy]]:
    """(id, policy) for every runnable registered policy: defaults, then one parameter changed at a time."""
    variants: dict[str, Policy] = {}
    for name, cls in policy_classes().items():
        if name in skipped_policies():
            continue
        default = cls()
        variants[repr(default)] = default
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            for value in _values(hints[field.name], getattr(default, field.name)):
                try:
                    variant = dataclasses.replace(default, **{field.name: value})
                except (ValueError, TypeError):
                    continue  # a value the policy refuses
                variants.setdefault(repr(variant), variant)
    return [(_variant_id(policy), policy) for policy in variants.values()]


def _variant_id(policy: Policy) -> str:
    params = [f"{f.name}={getattr(policy, f.name)}" for f in dataclasses.fields(policy)]
    return policy.name + ("[" + ",".join(params) + "]" if params else "")


def lossless_variants() -> list[tuple[str, Policy]]:
    return [(name, policy) for name, policy in registered_variants() if policy.lossless]


def lossy_variants() -> list[tuple[str, Policy]]:
    return [(name, policy) for name, policy in registered_variants() if not policy.lossless]


# --- lossy on purpose -------------------------------------------------------------------------------

def sorted_path(survival: np.ndarray, deeper_first: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidates with a > 0 by descending survival; ties by position (shallow or deep first), then request."""
    num_requests, gamma = survival.shape
    flat = survival.ravel()
    positions = np.tile(np.arange(1, gamma + 1), num_requests)
    requests = np.repeat(np.arange(num_requests), gamma)
    order = np.lexsort((requests, -positions if deeper_first else positions, -flat))
    order = order[flat[order] > 0.0]
    return requests[order], positions[order], flat[order]


def lengths_from_path(num_requests: int, requests: np.ndarray, count: int) -> np.ndarray:
    """l_r = how many of the first ``count`` path entries belong to request r."""
    return np.bincount(requests[:count], minlength=num_requests).astype(np.int64)


class Lossy(PolicyTraits):
    lossless: ClassVar[bool] = False
    synchronous: ClassVar[bool] = True


@dataclass(frozen=True)
class LookaheadGreedy(Lossy):
    """Algorithm 1 that keeps admitting when Theta falls but the next entry recovers it."""

    name: ClassVar[str] = "lookahead_greedy"

    def decide(self, view: StepView) -> Decision:
        survival = prefix_survival(view.confidence)
        requests, _, survivals = sorted_path(survival)
        theta = path_throughput(view.cost, view.num_requests, survivals)
        count = 0
        while count < survivals.size and (theta[count + 1] > theta[count]
                                          or (count + 2 < theta.size and theta[count + 2] > theta[count])):
            count += 1
        return Decision(lengths=lengths_from_path(view.num_requests, requests, count), pool=survival)


@dataclass(frozen=True)
class DeeperFirstTieGreedy(Lossy):
    """Algorithm 1 with survival ties going to the deeper position first."""

    name: ClassVar[str] = "deeper_first_tie_greedy"

    def decide(self, view: StepView) -> Decision:
        survival = prefix_survival(view.confidence)
        requests, _, survivals = sorted_path(survival, deeper_first=True)
        count = early_stop_count(path_throughput(view.cost, view.num_requests, survivals))
        return Decision(lengths=lengths_from_path(view.num_requests, requests, count), pool=survival)


@dataclass(frozen=True)
class TiePeekGreedy(Lossy):
    """Algorithm 1, except that on an exact tie Theta_n == Theta_{n-1} it admits on if Theta_{n+1} rises above.

    Exact everywhere but on throughput ties: only worlds with exact ties can catch it.
    """

    name: ClassVar[str] = "tie_peek_greedy"

    def decide(self, view: StepView) -> Decision:
        survival = prefix_survival(view.confidence)
        requests, _, survivals = sorted_path(survival)
        theta = path_throughput(view.cost, view.num_requests, survivals)
        count = 0
        while count < survivals.size:
            rises = theta[count + 1] > theta[count]
            tie_then_rise = (theta[count + 1] == theta[count] and count + 2 < theta.size
                             and theta[count + 2] > theta[count])
            if not (rises or tie_then_rise):
                break
            count += 1
        return Decision(lengths=lengths_from_path(view.num_requests, requests, count), pool=survival)


@dataclass(frozen=True)
class DeepPeekGreedy(Lossy):
    """Algorithm 1, then each request cut before the first position k >= ``from_position`` whose
    survival ``ahead`` positions on is 0 (its continuation looks dead). Needs gamma >= from_position + ahead."""

    from_position: int = 3
    ahead: int = 2
    name: ClassVar[str] = "deep_peek_greedy"

    def decide(self, view: StepView) -> Decision:
        survival = prefix_survival(view.confidence)
        requests, _, survivals = sorted_path(survival)
        count = early_stop_count(path_throughput(view.cost, view.num_requests, survivals))
        lengths = lengths_from_path(view.num_requests, requests, count)
        for r in range(view.num_requests):
            for k in range(self.from_position, lengths[r] + 1):
                if k + self.ahead <= view.gamma and survival[r, k + self.ahead - 1] == 0.0:
                    lengths[r] = k - 1
                    break
        return Decision(lengths=lengths, pool=survival)


@dataclass(frozen=True)
class PoolGated(Lossy):
    """Full search over the current pool (``global_sync``) on steps after one whose pool had a
    positive survival at position 2 of its first row; verifies nothing otherwise.

    Lossy through its memory: a checker that merged branches with different stale
    pools would see only the lossless half.
    """

    name: ClassVar[str] = "pool_gated"
    history_steps: ClassVar[int] = 1

    def decide(self, view: StepView) -> Decision:
        survival = prefix_survival(view.confidence)
        gate = bool(view.history) and view.history[-1].shape[1] >= 2 and view.history[-1][0, 1] > 0.0
        capacity = search_capacity(survival, view.cost, "tokens_x_sps") if gate else 0
        return Decision(lengths=top_k_lengths(survival, capacity), pool=survival)


@dataclass(frozen=True)
class EmaGated(Lossy):
    """Like :class:`PoolGated`, with the gate read from its EMA rows (the last step's confidences)."""

    name: ClassVar[str] = "ema_gated"

    def decide(self, view: StepView) -> Decision:
        survival = prefix_survival(view.confidence)
        gate = (view.smoothed is not None and view.gamma >= 2
                and bool(np.nan_to_num(view.smoothed[:, 1], nan=0.0).max() > 0.5))
        capacity = search_capacity(survival, view.cost, "tokens_x_sps") if gate else 0
        return Decision(lengths=top_k_lengths(survival, capacity), pool=survival, smoothed=view.confidence)


def _peek(view: StepView, request: int) -> bool:
    """Whether ``request``'s second-position confidence (which reads its first draft token) is high."""
    return bool(view.confidence[request, 1] >= 0.5)


@dataclass(frozen=True)
class RingPeek(Lossy):
    """Requests 0..n-1 (n = ``ring``, when at least n share the step) each verify their first draft
    token iff the next request in the ring has a high second-position confidence.

    Each request's own decision reads no token of its own, so each marginal is
    exact; the peeks form a cycle, so the requests are dependent: as pairs for a
    ring of 2, only all together for longer rings. Other requests verify nothing.
    """

    ring: int = 2
    name: ClassVar[str] = "ring_peek"

    def decide(self, view: StepView) -> Decision:
        lengths = np.zeros(view.num_requests, dtype=np.int64)
        if view.num_requests >= self.ring and view.gamma >= 2:
            for r in range(self.ring):
                lengths[r] = int(_peek(view, (r + 1) % self.ring))
        return Decision(lengths=lengths, pool=prefix_survival(view.confidence))


@dataclass(frozen=True)
class OneWayPeek(PolicyTraits):
    """Request 0 verifies its first draft token iff request 1's second-position confidence is high;
    request 1 always verifies its first. LOSSLESS: the peek goes one way (1 before 0), no cycle."""

    name: ClassVar[str] = "one_way_peek"

    def decide(self, view: StepView) -> Decision:
        lengths = np.zeros(view.num_requests, dtype=np.int64)
        if view.num_requests >= 2 and view.gamma >= 2:
            lengths[0], lengths[1] = int(_peek(view, 1)), 1
        return Decision(lengths=lengths, pool=prefix_survival(view.confidence))


@dataclass(frozen=True)
class XorPeek(Lossy):
    """Requests 0 and 1 verify their first draft token; request 2 verifies its own iff its own
    second-position confidence is high XOR (the peeks at 0 and at 1 disagree).

    Request 2 looks ahead at its own token, but which way it leans is set by a fair
    coin made of the other two (their first tokens' XOR): each marginal stays exact,
    every pair is independent, and only the three together are dependent.
    """

    name: ClassVar[str] = "xor_peek"

    def decide(self, view: StepView) -> Decision:
        lengths = np.zeros(view.num_requests, dtype=np.int64)
        if view.num_requests >= 3 and view.gamma >= 2:
            lengths[0] = lengths[1] = 1
            lengths[2] = int(_peek(view, 2) ^ _peek(view, 0) ^ _peek(view, 1))
        return Decision(lengths=lengths, pool=prefix_survival(view.confidence))
