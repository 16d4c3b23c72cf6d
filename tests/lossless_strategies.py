"""Hypothesis strategies and helpers shared by the tests/test_lossless*.py files.

A *Markov case* is a small world in which every distribution depends only on the
previous token (row ``V`` of each table stands for "no previous token"):

* target ``p(. | prev)`` - table ``target[prev]``;
* drafter ``q_k(. | prev)`` - table ``draft[k, prev]``, where prev is the last token
  of prefix + x_<k, so q_k depends on the sampled draft tokens;
* confidence ``c_k(prev)`` - table ``confidence[k, prev]``, likewise depending on the
  sampled draft prefix (the Markov feature that makes look-ahead lossy).

A case also fixes the requests (prompts, the step each joins, whether requests
leave once done), the SPS table over every batch size that can occur, and m.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from policies import CostCurve, Policy, prefix_survival
from policies.driver import PolicyMemory
from policies.dspark import DSpark
from policies.goodput import Goodput
from policies.greedy import Greedy
from policies.lossless.exact import ExactDistribution, max_abs_difference, output_distribution, sequence_distribution
from policies.lossless.laws import failed_checks, law_gaps
from policies.lossless.sampler import Prefix, TokenModels
from policies.static import Mtp, NoSpeculation
from policies.threshold import Threshold

TOLERANCE = 1e-9
# Deterministic for CI: a fixed seed, no example database.
LOSSLESS_SETTINGS = settings(deadline=None, derandomize=True, database=None,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def sized(max_examples: int) -> settings:
    """The shared settings with this test's number of examples."""
    return settings(LOSSLESS_SETTINGS, max_examples=max_examples)


@dataclass(frozen=True)
class MarkovCase:
    """One small world: Markov tables, requests, SPS table and the number m of output tokens checked."""

    target: np.ndarray  # [V + 1, V] p(. | prev)
    draft: np.ndarray  # [gamma, V + 1, V] q_k(. | prev)
    confidence: np.ndarray  # [gamma, V + 1] c_k(prev)
    prompts: tuple[Prefix, ...]  # one per request
    sps: np.ndarray  # [B_max] steps per second at B = 1..B_max batch tokens
    num_tokens: int  # m
    join_steps: tuple[int, ...] = ()
    retire: bool = False
    per_request_s: float = 0.0  # extra step time per request (makes the curve depend on R)
    draft_s: float = 0.0
    memory: PolicyMemory | None = None  # stale pools and EMA rows left by earlier steps (a warm engine)

    @property
    def vocab_size(self) -> int:
        return int(self.target.shape[1])

    @property
    def gamma(self) -> int:
        return int(self.draft.shape[0])

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    def _prev(self, tokens: Prefix) -> int:
        return tokens[-1] if tokens else self.vocab_size

    def models(self) -> list[TokenModels]:
        token_models = TokenModels(
            target=lambda prefix: self.target[self._prev(prefix)],
            drafter=lambda prefix, drafted: self.draft[len(drafted), self._prev(prefix + drafted)],
            confidence=lambda prefix, drafted: float(self.confidence[len(drafted), self._prev(prefix + drafted)]),
        )
        return [token_models] * self.num_requests

    def cost(self, num_requests: int) -> CostCurve:
        batch_tokens = np.arange(1, self.sps.size + 1)
        if self.per_request_s == 0.0:  # the table as given: worlds with exact throughput ties rely on its bits
            return CostCurve(batch_tokens=batch_tokens, steps_per_s=self.sps, draft_s=self.draft_s)
        steps_per_s = 1.0 / (1.0 / self.sps + self.per_request_s * num_requests)
        return CostCurve(batch_tokens=batch_tokens, steps_per_s=steps_per_s, draft_s=self.draft_s)

    def memory_for(self, policy: Policy) -> PolicyMemory | None:
        """The warm memory as an engine running ``policy`` holds it: EMA rows only when it drafts gamma tokens."""
        if self.memory is None or policy.draft_tokens(self.gamma) == self.gamma:
            return self.memory
        return PolicyMemory(self.memory.pools)

    def exact(self, policy: Policy, merge: bool = True) -> ExactDistribution:
        return output_distribution(self.models(), self.prompts, policy, self.cost, self.gamma, self.num_tokens,
                                   join_steps=self.join_steps or None, retire=self.retire,
                                   memory=self.memory_for(policy), context=self._prev, merge=merge)

    def reference(self, request: int) -> dict[Prefix, float]:
        return sequence_distribution(self.models()[request], self.prompts[request], self.num_tokens)

    def gaps(self, exact: ExactDistribution) -> dict[str, float]:
        """The gap of each check of :mod:`policies.lossless.laws` for an exact law of this world."""
        return law_gaps(exact, [self.reference(r) for r in range(self.num_requests)])


def max_deviation(case: MarkovCase, exact: ExactDistribution) -> float:
    """Largest gap between any request's output distribution and the target's (marginals only)."""
    return max(max_abs_difference(exact.marginal(r), case.reference(r)) for r in range(case.num_requests))


def law_deviation(case: MarkovCase, exact: ExactDistribution) -> float:
    """Largest gap of any check: marginals, pairs and the joint law of all requests together."""
    return max(case.gaps(exact).values())


def assert_lossless(case: MarkovCase, policy: Policy, tolerance: float = TOLERANCE) -> None:
    """Every check of :mod:`policies.lossless.laws` holds to ``tolerance``: mass, marginals, pairs, joint.

    The message names every check that fails (tests match on the names), with its gap.
    """
    gaps = case.gaps(case.exact(policy))
    failed = failed_checks(gaps, tolerance)
    assert not failed, f"{policy}: " + ", ".join(f"{check} gap {gaps[check]:.3g}" for check in failed)


# Appendix A of the DSpark paper, the world in which look-ahead is lossy: a single
# request, p = (0.7, 0.3), q = (0.5, 0.5), a_1 = 0.8, c_2 = 0.9 after token 0 and 0
# after token 1, SPS(1..3) = (1.0, 0.5, 0.45).
APPENDIX_A = MarkovCase(
    target=np.array([[0.7, 0.3]] * 3),
    draft=np.array([[[0.5, 0.5]] * 3] * 2),
    confidence=np.array([[0.8, 0.8, 0.8], [0.9, 0.0, 0.9]]),
    prompts=((),),
    sps=np.array([1.0, 0.5, 0.45]),
    num_tokens=1,
)
# The same world on a warm engine whose stale pools (survivals 0.8, 0.72) make a
# full search choose capacity K = 2 before anything is drafted.
APPENDIX_A_WARM = replace(APPENDIX_A, memory=PolicyMemory((np.array([[0.8, 0.72]]),) * 2))


# --- table strategies -------------------------------------------------------------------------------

CONFIDENCE_LEVELS = (0.0, 0.25, 0.5, 0.8, 0.9, 1.0)  # repeated values make ties, 0 and 1 are edges
# A coin whose simplest value (the one Hypothesis tries first and shrinks to) is True:
# sharp worlds and warm engines are the interesting ones, so early examples get them.
LIKELY = st.booleans().map(lambda coin: not coin)


@st.composite
def distributions(draw: st.DrawFn, vocab_size: int) -> np.ndarray:
    """A probability vector: small positive integer weights, integer weights with zeros, or float weights."""
    kind = draw(st.sampled_from(["positive", "zeros", "floats"]))
    if kind != "floats":
        weight = st.integers(1 if kind == "positive" else 0, 4)
        weights = np.array(draw(st.lists(weight, min_size=vocab_size, max_size=vocab_size)), float)
    else:
        weights = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=vocab_size, max_size=vocab_size)))
    if weights.sum() <= 1e-6:
        weights[draw(st.integers(0, vocab_size - 1))] = 1.0
    return weights / weights.sum()


def confidences() -> st.SearchStrategy[float]:
    """Mostly the shared levels (ties, knife edges), sometimes any float in [0, 1]."""
    levels = st.sampled_from(CONFIDENCE_LEVELS)
    return st.one_of(levels, levels, levels, st.floats(0.0, 1.0))


def knife_edge_sps(max_batch_tokens: int, num_requests: int, expected: np.ndarray) -> np.ndarray:
    """SPS(R + n) = 1 / (R + E_n), so Theta_n = (R + S_n) / (R + E_n) with S_n the survivals admitted.

    Admitting n candidates beats plain decoding exactly when S_n > E_n: with E_n close to
    survival sums the world can produce, that comparison hinges on single drafted tokens.
    ``expected`` holds E_1, E_2, ...; beyond it each extra token must bring a full 1.
    """
    batch = np.arange(1, max_batch_tokens + 1, dtype=float)
    over = np.clip(batch - num_requests, 0, None).astype(int)  # n = B - R
    tail = expected[-1] if expected.size else 0.0
    padded = np.concatenate(([0.0], expected, tail + np.arange(1, max_batch_tokens + 1)))
    return np.where(batch < num_requests, 1.0 / batch, 1.0 / np.maximum(num_requests + padded[over], 0.1))


@st.composite
def sps_tables(draw: st.DrawFn, max_batch_tokens: int, num_requests: int) -> np.ndarray:
    """SPS at B = 1..max_batch_tokens: smooth, one cliff, bucketed, jagged (arbitrary) or knife-edge."""
    batch = np.arange(1, max_batch_tokens + 1, dtype=float)
    kind = draw(st.sampled_from(["smooth", "cliff", "buckets", "jagged", "knife_edge"]))
    base_s, per_token_s = draw(st.floats(0.2, 2.0)), draw(st.floats(0.0, 1.0))
    if kind == "smooth":
        return 1.0 / (base_s + per_token_s * batch)
    if kind == "cliff":
        # a drop, then a slow decline (Appendix A: 1.0, 0.5, 0.45); right after B = R is the classic spot
        edge_tokens = draw(st.one_of(st.just(num_requests), st.integers(1, max_batch_tokens - 1)))
        drop, decline = draw(st.floats(0.3, 0.8)), draw(st.floats(0.8, 1.0))
        after = np.maximum(batch - edge_tokens - 1, 0.0)
        return np.where(batch <= edge_tokens, 1.0, drop * decline ** after)
    if kind == "buckets":
        bucket = draw(st.integers(2, 3))
        return 1.0 / (base_s + per_token_s * bucket * np.ceil(batch / bucket))
    if kind == "knife_edge":
        increments = draw(st.lists(st.sampled_from(CONFIDENCE_LEVELS), min_size=max_batch_tokens,
                                   max_size=max_batch_tokens))
        return knife_edge_sps(max_batch_tokens, num_requests, np.cumsum(increments))
    levels = st.one_of(st.sampled_from([1.0, 0.5, 0.45, 0.3]), st.floats(0.05, 1.0))
    return np.array(draw(st.lists(levels, min_size=max_batch_tokens, max_size=max_batch_tokens)))


def sharp_tables(seed: int, vocab_size: int, gamma: int, prompts: tuple[Prefix, ...],
                 max_batch_tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Target, draft, confidence and SPS tables of a sharp world, from a seeded generator.

    Built like Appendix A: p and q are generic (Dirichlet draws, occasionally with a
    zero), confidences after the first position swing between 0 and 0.9-1 with the
    drafted token, and the knife-edge SPS table puts its edge on the sorted survivals
    of one possible draft outcome; other outcomes land on the other side of it. A
    policy that looks at drafted tokens before admitting them decides differently
    between such outcomes. (Seeded numpy keeps these tables generic; Hypothesis'
    own draws favour simple, degenerate values.)
    """
    rng = np.random.default_rng(seed)
    contexts = vocab_size + 1

    def tables(*shape: int) -> np.ndarray:
        probs = rng.dirichlet(np.ones(vocab_size), size=shape)  # [..., V]
        zeroed = probs * (rng.random(probs.shape) > 0.15)
        ok = zeroed.sum(axis=-1, keepdims=True) > 0
        return np.where(ok, zeroed / np.where(ok, zeroed.sum(axis=-1, keepdims=True), 1.0), probs)

    target, draft = tables(contexts), tables(gamma, contexts)
    confidence = np.empty((gamma, contexts))
    confidence[0] = rng.choice([0.5, 0.8, 0.9, 1.0, rng.uniform(0.3, 1.0)], size=contexts)
    confidence[1:] = rng.choice([0.0, 0.5, 0.9, 1.0], size=(gamma - 1, contexts))
    survivals = []
    for prompt in prompts:
        prev = prompt[-1] if prompt else vocab_size
        row = []
        for k in range(gamma):
            row.append(confidence[k, prev])
            prev = int(rng.integers(vocab_size))
        survivals.append(np.cumprod(row))
    path = np.sort(np.concatenate(survivals))[::-1]  # [R * gamma] descending
    offsets = rng.choice([0.0, -0.05, 0.05, -0.2, 0.2], size=path.size)
    sps = knife_edge_sps(max_batch_tokens, len(prompts), np.cumsum(path) + offsets)
    return target, draft, confidence, sps


# (vocabulary, gamma, largest m) per number of requests, sized so one case enumerates in milliseconds
# (tests/lossless_worlds.py guarantees every shape up to gamma 5 and 4 requests; these are the random ones)
SHAPES = {
    1: [(2, 2, 3), (2, 3, 3), (3, 2, 2), (3, 3, 2), (4, 2, 2), (2, 1, 3), (4, 1, 2), (2, 4, 2)],
    2: [(2, 2, 2), (2, 3, 1), (3, 2, 1), (2, 1, 2)],
    3: [(2, 2, 1), (2, 1, 2)],
    4: [(2, 1, 1), (2, 2, 1)],
}


@st.composite
def markov_cases(draw: st.DrawFn, num_requests: st.SearchStrategy[int] | None = None,
                 confidence: st.SearchStrategy[float] | None = None) -> MarkovCase:
    """A random small world (1-4 requests unless ``num_requests`` says); see :class:`MarkovCase`.

    Half the worlds are *sharp* (:func:`sharp_tables`): worlds in which a policy that
    looks past a candidate before admitting it changes the output, so the checks
    have teeth. The other half draw every table entry through Hypothesis.
    """
    requests = draw(num_requests if num_requests is not None else st.integers(1, 4))
    vocab, gamma, max_tokens = draw(st.sampled_from(SHAPES[requests]))
    confidence = confidence if confidence is not None else confidences()
    token = st.integers(0, vocab - 1)
    prompts = tuple(draw(st.lists(st.lists(token, max_size=1).map(tuple), min_size=requests, max_size=requests)))
    max_batch_tokens = max(requests, MAX_OLD_REQUESTS) * (1 + gamma)
    sharp = draw(LIKELY)
    if sharp:
        seed = draw(st.integers(0, 2**32 - 1))
        target, draft, conf, sps = sharp_tables(seed, vocab, gamma, prompts, max_batch_tokens)
    else:
        target = np.array([draw(distributions(vocab)) for _ in range(vocab + 1)])
        draft = np.array([[draw(distributions(vocab)) for _ in range(vocab + 1)] for _ in range(gamma)])
        conf = np.array(draw(st.lists(st.lists(confidence, min_size=vocab + 1, max_size=vocab + 1),
                                      min_size=gamma, max_size=gamma)))
        sps = draw(sps_tables(max_batch_tokens, requests))
    # late joiners keep the others running (and branching) while they wait: 4 requests wait at most a step
    joins = st.lists(st.integers(0, 2 if requests < 4 else 1), min_size=requests - 1, max_size=requests - 1)
    join_steps = (0, *draw(joins)) if draw(st.booleans()) else ()
    memory = draw(warm_memories(requests, conf, confidence)) if draw(LIKELY) else None
    return MarkovCase(
        target=target, draft=draft, confidence=conf, prompts=prompts, sps=sps,
        num_tokens=draw(st.integers(1, max_tokens)), join_steps=join_steps, retire=draw(st.booleans()),
        per_request_s=0.0 if sharp else draw(st.sampled_from([0.0, 0.0, 0.3])),
        draft_s=0.0 if sharp else draw(st.sampled_from([0.0, 0.5])), memory=memory,
    )


MAX_OLD_REQUESTS = 3  # stale pools may hold other requests than the current ones; the SPS table covers them


@st.composite
def warm_memories(draw: st.DrawFn, num_requests: int, conf: np.ndarray,
                  confidence: st.SearchStrategy[float]) -> PolicyMemory:
    """State a running engine leaves behind: 1-2 stale pools of 1-3 earlier requests, EMA rows of some requests.

    Pool rows are survivals the world itself produces (the confidence table read along
    random token paths), as if the engine had been serving similar requests.
    """
    gamma, contexts = conf.shape
    token = st.integers(0, contexts - 2)
    pools = []
    for _ in range(draw(st.integers(1, 2))):
        rows = []
        for _ in range(draw(st.integers(1, MAX_OLD_REQUESTS))):
            prev, row = draw(st.integers(0, contexts - 1)), []
            for k in range(gamma):
                row.append(conf[k, prev])
                prev = draw(token)
            rows.append(row)
        pools.append(prefix_survival(np.array(rows)))
    with_rows = draw(st.lists(st.booleans(), min_size=num_requests, max_size=num_requests))
    smoothed = {r: np.array(draw(st.lists(confidence, min_size=gamma, max_size=gamma)))
                for r, has_row in enumerate(with_rows) if has_row}
    return PolicyMemory(tuple(pools), MappingProxyType(smoothed))


# --- policy strategies ------------------------------------------------------------------------------

objectives = st.sampled_from(["tokens_x_sps", "tokens_per_s"])


def mtp_policies(gamma: int) -> st.SearchStrategy[Policy]:
    return st.builds(Mtp, k=st.integers(1, gamma))


def threshold_policies() -> st.SearchStrategy[Policy]:
    theta = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 0.72, 0.8, 0.9, 1.0]), st.floats(0.0, 1.0))
    return st.builds(Threshold, theta=theta, variant=st.sampled_from(["prefix", "position"]))


def greedy_policies() -> st.SearchStrategy[Policy]:
    return st.builds(Greedy, objective=objectives)


def goodput_policies() -> st.SearchStrategy[Policy]:
    return st.builds(Goodput, staleness_steps=st.integers(1, 2), objective=objectives)


def dspark_policies(staleness: st.SearchStrategy[int] | None = None) -> st.SearchStrategy[Policy]:
    """DSpark with stale capacity (staleness 1 or 2 unless ``staleness`` says), with and without EMA."""
    staleness = staleness if staleness is not None else st.integers(1, 2)
    decay = st.one_of(st.none(), st.sampled_from([0.0, 0.5, 0.8]), st.floats(0.0, 0.99))
    return st.builds(DSpark, staleness_steps=staleness, objective=objectives, ema_decay=decay)


def no_speculation() -> st.SearchStrategy[Policy]:
    return st.just(NoSpeculation())
