"""A fixed catalogue of small worlds for the losslessness bench, every shape guaranteed.

Random worlds (tests/lossless_strategies.py) find the unexpected; this catalogue
makes sure the expected corners are always there, whatever Hypothesis draws:

* *coverage* - every (requests, gamma) from (1, 1) to (4, 5), with the drafted token
  random at every depth 1..gamma-1 in some world (a look-ahead leak at position k
  needs x_k random and c_{k+1} depending on it);
* *ties* - throughput ties that hold exactly, in floating point, for some draft
  outcomes and not for others (a policy that treats a tie differently leaks there);
* *late joiners* - warm engines (stale pools, EMA rows of some requests) whose
  requests join on later steps, retiring or not when done.

Exact enumeration stays cheap because drafts branch only where it matters: at the
*branching* positions the drafter is a generic distribution, elsewhere it is sure
of one token (which the target still accepts or rejects at random). Worlds are
built like Appendix A (tests/lossless_strategies.sharp_tables): confidences
after the first position swing with the drafted token, and a knife-edge SPS table
puts its edge on one possible draft outcome, so look-ahead changes the decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Literal

import numpy as np

from policies import Policy
from policies.driver import PolicyMemory
from tests.lossless_strategies import MarkovCase, knife_edge_sps


@dataclass(frozen=True)
class World:
    """A catalogue entry: a name that says what it covers, and the world."""

    name: str
    case: MarkovCase


def _distributions(rng: np.random.Generator, vocab_size: int, shape: tuple[int, ...],
                   zero_share: float) -> np.ndarray:
    """Generic probability rows (Dirichlet), a share of entries zeroed -> [*shape, V]."""
    probs = rng.dirichlet(np.ones(vocab_size), size=shape)
    zeroed = probs * (rng.random(probs.shape) >= zero_share)
    total = zeroed.sum(axis=-1, keepdims=True)
    return np.where(total > 0, zeroed / np.where(total > 0, total, 1.0), probs)


def _draft_path(rng: np.random.Generator, draft: np.ndarray, confidence: np.ndarray, prev: int) -> np.ndarray:
    """Survivals of one possible draft block from context ``prev`` -> [gamma]."""
    survivals, running = [], 1.0
    for k in range(draft.shape[0]):
        running *= confidence[k, prev]
        survivals.append(running)
        prev = int(rng.choice(draft.shape[2], p=draft[k, prev]))
    return np.array(survivals)


def tie_exactly(sps: np.ndarray, num_requests: int, path: np.ndarray, tie_at: int) -> np.ndarray:
    """``sps`` changed so that Theta_tie_at == Theta_{tie_at - 1} holds bit for bit along ``path``.

    Theta_n = (R + S_n) * SPS(R + n), computed as the policies compute it (running
    sum, then + R, then the product). SPS(R + tie_at) and SPS(R + tie_at - 1) move
    by a few ulps until the two products are the same float.
    """
    expected = np.concatenate(([0.0], np.cumsum(path))) + num_requests  # [n + 1]
    before, at = num_requests + tie_at - 2, num_requests + tie_at - 1  # indices of SPS(R + n - 1), SPS(R + n)
    later = sps[at]
    for _ in range(256):
        theta = expected[tie_at] * later
        earlier = theta / expected[tie_at - 1]
        for _ in range(8):
            product = expected[tie_at - 1] * earlier
            if product == theta:
                tied = sps.copy()
                tied[before], tied[at] = earlier, later
                return tied
            earlier = np.nextafter(earlier, np.inf if product < theta else -np.inf)
        later = np.nextafter(later, np.inf)
    raise ValueError("no SPS values make this tie exact")


Shape = Literal["edge", "dip", "deep"]


def edge_offsets(rng: np.random.Generator, shape: Shape, size: int, turn: int | None = None) -> np.ndarray:
    """Offsets o_n of the knife edge E_n = S_n + o_n along one outcome's path (Theta_n > Theta_0 iff o_n < 0).

    * ``edge`` - each o_n on its own: 0 (a tie with plain decoding), +-0.05 or +-0.2;
    * ``dip`` - Appendix A's shape: Theta falls for the first t - 1 entries and rises
      above Theta_0 at entry t, so a search past the first fall admits t entries
      for this outcome and none for outcomes with a smaller survival at t;
    * ``deep`` - Theta rises along the first t entries, then falls: schedulers
      admit deep positions, and the edge sits deep in the path.

    t is ``turn``, or drawn from 2..size.
    """
    steps = np.arange(1, size + 1)
    if turn is None:
        turn = int(rng.integers(2, size + 1)) if size > 1 else 1
    if shape == "edge":
        return rng.choice([0.0, -0.05, 0.05, -0.2, 0.2], size=size)
    if shape == "dip":
        return np.where(steps < turn, rng.choice([0.02, 0.05]), np.where(steps == turn, -rng.choice([0.02, 0.05, 0.1]),
                                                                          0.5))
    return np.where(steps <= turn, -rng.choice([0.02, 0.05]) * steps, rng.choice([0.0, 0.05]) * (steps - turn))


def sparse_world(seed: int, num_requests: int, gamma: int, branching: tuple[int, ...], *, vocab_size: int = 2,
                 num_tokens: int = 1, warm: bool = True, join_steps: tuple[int, ...] = (), retire: bool = False,
                 tie_at: int | None = None, shape: Shape = "edge", turn: int | None = None) -> MarkovCase:
    """A sharp world whose drafter branches only at the 1-based positions in ``branching``.

    ``warm``: the engine holds two stale pools (survivals of 1..3 earlier requests
    of the same world) and an EMA row for request 0 only (later requests are new
    to it). ``shape`` and ``turn``: how Theta runs along one outcome's sorted path
    (:func:`edge_offsets`). ``tie_at``: Theta ties exactly after ``tie_at`` entries
    of that path.
    """
    rng = np.random.default_rng(seed)
    contexts = vocab_size + 1
    target = _distributions(rng, vocab_size, (contexts,), zero_share=0.1)
    draft = _distributions(rng, vocab_size, (gamma, contexts), zero_share=0.03)
    for k in range(gamma):
        if k + 1 not in branching:  # sure of one token: no branch here
            draft[k] = np.eye(vocab_size)[rng.integers(vocab_size, size=contexts)]
    confidence = np.empty((gamma, contexts))
    first = [0.9, 1.0] if shape == "deep" else [0.5, 0.8, 0.9, 1.0, rng.uniform(0.3, 1.0)]
    confidence[0] = rng.choice(first, size=contexts)
    # after position 1 the confidence swings with the previous token (distinct values where levels suffice);
    # deep worlds keep positions 2-3 alive and put the dead ends (c = 0) from position 4 on
    for k in range(1, gamma):
        later = [0.0, 0.5, 0.9, 1.0] if shape != "deep" else [0.5, 0.9, 1.0] if k < 3 else [0.0, 0.9, 1.0]
        confidence[k] = np.resize(rng.permutation(later), contexts)
    prompts = tuple((int(rng.integers(vocab_size)),) for _ in range(num_requests))
    num_old = int(rng.integers(1, 4)) if warm else 0
    max_batch_tokens = max(num_requests, num_old) * (1 + gamma)
    path = np.sort(np.concatenate([_draft_path(rng, draft, confidence, prompt[-1]) for prompt in prompts]))[::-1]
    sps = knife_edge_sps(max_batch_tokens, num_requests, np.cumsum(path) + edge_offsets(rng, shape, path.size, turn))
    if tie_at is not None and tie_at <= np.count_nonzero(path > 0):
        sps = tie_exactly(sps, num_requests, path[path > 0], tie_at)
    memory = None
    if warm:
        pools = tuple(np.array([_draft_path(rng, draft, confidence, int(rng.integers(contexts)))
                                for _ in range(num_old)]) for _ in range(2))
        ema = MappingProxyType({0: confidence[:, int(rng.integers(contexts))].copy()})
        memory = PolicyMemory(pools, ema)
    return MarkovCase(target=target, draft=draft, confidence=confidence, prompts=prompts, sps=sps,
                      num_tokens=num_tokens, join_steps=join_steps, retire=retire, memory=memory)


def _branching_sets(num_requests: int, gamma: int) -> list[tuple[int, ...]]:
    """Branching positions for the worlds of one (requests, gamma).

    One or two requests (whose later outputs are checked): every depth 1..gamma-1
    branches in some world. Three or four requests (first outputs checked): the
    first position, the first two, and the last but one, whose token sets the
    deepest confidence other requests' decisions may read.
    """
    if gamma == 1:
        return [(1,)]
    depths = list(range(1, gamma))
    if num_requests <= 2:
        per_world = 3 if num_requests == 1 else 2
        return [tuple(depths[i:i + per_world]) for i in range(0, len(depths), per_world)]
    sets = [(1,), (1, 2), (gamma - 1,)]
    return list(dict.fromkeys(s for s in sets if max(s) < gamma))


@cache
def coverage_worlds() -> tuple[World, ...]:
    """Every (requests, gamma) in 1..4 x 1..5 on warm engines, with edge and dip SPS tables
    (a deep one for the first branching set), plus fresh engines over three tokens."""
    worlds = []
    for num_requests in (1, 2, 3, 4):
        for gamma in range(1, 6):
            for i, branching in enumerate(_branching_sets(num_requests, gamma)):
                shapes: tuple[Shape, ...] = ("edge", "dip", "deep") if i == 0 else ("edge", "dip")
                for j, shape in enumerate(shapes):
                    seed = 1000 * num_requests + 100 * gamma + 10 * i + j
                    name = f"R{num_requests}-g{gamma}-x{''.join(map(str, branching))}-{shape}"
                    worlds.append(World(name, sparse_world(seed, num_requests, gamma, branching, shape=shape,
                                                           num_tokens=2 if num_requests == 1 else 1)))
            if num_requests <= 2 and gamma <= 3:  # a fresh engine over several steps: pools built in the run
                num_tokens = 3 if num_requests * gamma <= 4 else 2
                name = f"R{num_requests}-g{gamma}-fresh-m{num_tokens}"
                worlds.append(World(name, sparse_world(7000 + 10 * num_requests + gamma, num_requests, gamma,
                                                       (1, 2)[:gamma - 1] or (1,), num_tokens=num_tokens, warm=False)))
    return tuple(worlds)


@cache
def deep_worlds() -> tuple[World, ...]:
    """One request, gamma 4 and 5, schedulers admitting deep positions, outputs checked to position 3-4:
    where a look-ahead from position 3 on shows."""
    worlds = []
    for gamma, branching, num_tokens in [(4, (3,), 3), (4, (2, 3), 4), (5, (3, 4), 3), (5, (3,), 4)]:
        for seed in range(4):
            name = f"deep-R1-g{gamma}-x{''.join(map(str, branching))}-m{num_tokens}-{seed}"
            worlds.append(World(name, sparse_world(8000 + 100 * gamma + 10 * len(branching) + seed, 1, gamma,
                                                   branching, shape="deep", turn=gamma, num_tokens=num_tokens)))
    return tuple(worlds)


@cache
def tie_worlds() -> tuple[World, ...]:
    """Exact throughput ties Theta_t == Theta_{t-1} after t = 1 or 2 entries of one outcome's path, and
    Theta rising above both at entry t + 1 for that outcome only: a scheduler that looks past a tie
    sees the drafted token entry t + 1 depends on. Fresh and warm engines."""
    worlds = []
    for num_requests, gamma, tie_at, warm in [(1, 2, 1, False), (1, 3, 1, False), (1, 3, 2, True),
                                              (2, 2, 1, True), (2, 3, 2, False), (3, 2, 1, True)]:
        for seed in range(2):
            name = f"tie{tie_at}-R{num_requests}-g{gamma}-{'warm' if warm else 'fresh'}-{seed}"
            case = sparse_world(5000 + 100 * num_requests + 10 * gamma + seed, num_requests, gamma,
                                tuple(range(1, gamma)), warm=warm, tie_at=tie_at, shape="dip", turn=tie_at + 1,
                                num_tokens=2 if num_requests == 1 else 1)
            worlds.append(World(name, case))
    return tuple(worlds)


@cache
def late_join_worlds() -> tuple[World, ...]:
    """Warm engines whose requests join one and two steps late, retiring when done or staying."""
    worlds = []
    for num_requests, gamma, joins, retire in [(2, 2, (0, 1), False), (2, 3, (0, 1), True), (3, 2, (0, 1, 2), True),
                                               (3, 1, (0, 0, 1), False), (2, 2, (0, 2), True)]:
        name = f"join{''.join(map(str, joins))}-R{num_requests}-g{gamma}-{'retire' if retire else 'stay'}"
        case = sparse_world(9000 + 10 * num_requests + gamma + 3 * retire, num_requests, gamma, (1,),
                            num_tokens=2, join_steps=joins, retire=retire)
        worlds.append(World(name, case))
    return tuple(worlds)


def catalogue() -> tuple[World, ...]:
    """Every catalogue world."""
    return coverage_worlds() + deep_worlds() + tie_worlds() + late_join_worlds()


@cache
def world(name: str) -> World:
    """The catalogue world called ``name``."""
    return {w.name: w for w in catalogue()}[name]


@cache
def catalogue_gaps(name: str, policy: Policy) -> dict[str, float]:
    """The check gaps of ``policy`` in catalogue world ``name``, computed once per test run.

    Several tests read the same laws (the bench, the coverage and teeth checks);
    policies are frozen dataclasses, so they key the cache.
    """
    case = world(name).case
    exact = case.exact(policy)
    return {**case.gaps(exact), "verified": float(exact.max_verified_tokens)}


def runs_in(policy: Policy, case: MarkovCase) -> bool:
    """Whether the world's drafter can propose the draft tokens the policy asks for (mtp-k needs gamma >= k)."""
    return policy.draft_tokens(case.gamma) <= case.gamma
