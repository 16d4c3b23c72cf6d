"""The online acceptance estimator: it learns only from verified outcomes of earlier steps, and it learns."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibration.acceptance.sts import ece
from policies import make_policy
from simulator import ClusterSpec, DrafterSpec
from simulator.acceptance.online import OnlineAcceptanceEstimator
from simulator.acceptance.parametric import AcceptanceModel, ConfidenceSpec
from simulator.cluster import Cluster
from traces.workload import DOMAINS


def replay(signals, lengths, accepted) -> tuple[list[np.ndarray], np.ndarray]:
    """Estimates handed to the policy at each step, and the final weights."""
    estimator = OnlineAcceptanceEstimator()
    estimates = []
    for signal, length, outcome in zip(signals, lengths, accepted, strict=True):
        estimates.append(estimator.estimate(signal))  # what the policy decides step t with
        estimator.update(signal, length, outcome)  # step t verified: its outcomes, for later steps only
    return estimates, estimator.weights


@st.composite
def step_sequences(draw):
    """Steps of R requests and g draft tokens: signals, verified lengths and (true) accepted counts."""
    num_steps, num_requests, g = draw(st.integers(2, 6)), draw(st.integers(1, 5)), draw(st.integers(1, 7))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    signals = [rng.uniform(0.01, 0.99, (num_requests, g)) for _ in range(num_steps)]
    lengths = [rng.integers(0, g + 1, num_requests) for _ in range(num_steps)]
    accepted = [rng.integers(0, g + 1, num_requests) for _ in range(num_steps)]
    return signals, lengths, accepted, draw(st.integers(0, num_steps - 1)), rng


@settings(max_examples=60, deadline=None)
@given(step_sequences())
def test_a_steps_estimates_ignore_its_own_and_later_outcomes(case):
    """Non-anticipating: changing what steps t, t+1, ... accept leaves the estimates of steps 0..t unchanged."""
    signals, lengths, accepted, t, rng = case
    changed = accepted[:t] + [rng.integers(0, s.shape[1] + 1, s.shape[0]) for s in signals[t:]]
    before, _ = replay(signals, lengths, accepted)
    after, _ = replay(signals, lengths, changed)
    for s in range(t + 1):
        np.testing.assert_array_equal(before[s], after[s])


@settings(max_examples=40, deadline=None)
@given(step_sequences())
def test_only_verified_positions_up_to_the_first_rejection_teach_it(case):
    """Outcomes the target never produced (unverified positions, past the first rejection) change nothing."""
    signals, lengths, accepted, _, rng = case
    # Past the verified length: accepting l or more looks the same to the engine (all l verified ones accepted).
    hidden = [np.where(a >= ln, rng.integers(ln, s.shape[1] + 1), a) for s, ln, a in
              zip(signals, lengths, accepted, strict=True)]
    np.testing.assert_array_equal(replay(signals, lengths, accepted)[1], replay(signals, lengths, hidden)[1])


def test_nothing_verified_teaches_nothing():
    estimator = OnlineAcceptanceEstimator()
    start = estimator.weights.copy()
    estimator.update(np.full((3, 4), 0.7), np.zeros(3, dtype=np.int64), np.array([4, 0, 2]))
    np.testing.assert_array_equal(estimator.weights, start)
    assert estimator.num_labelled == 0


def test_it_starts_from_the_drafters_signal_and_learns_away_an_overconfident_head():
    model = AcceptanceModel("qwen3-8b_dspark", 7, confidence=ConfidenceSpec(calibrated=False))
    rng = np.random.default_rng(0)
    num_requests = 64
    domain = np.full(num_requests, DOMAINS.index("chat"))
    estimator = OnlineAcceptanceEstimator()
    first = model.sample_step(rng, domain, model.request_difficulty(rng, num_requests), 7)[0]
    np.testing.assert_allclose(estimator.estimate(first), first, atol=1e-5)  # w = (0, 1, 0, 0) at the start
    raw_preds, online_preds, outcomes = [], [], []
    for step in range(400):
        raw, accepted = model.sample_step(rng, domain, model.request_difficulty(rng, num_requests), 7)
        estimate = estimator.estimate(raw)
        if step >= 200:  # judged once it has learned
            reached = np.arange(7)[None, :] <= accepted[:, None]  # positions whose predecessors survived
            raw_preds.append(raw[reached])
            online_preds.append(estimate[reached])
            outcomes.append((np.arange(1, 8)[None, :] <= accepted[:, None])[reached])
        estimator.update(raw, np.full(num_requests, 7), accepted)
    outcome = np.concatenate(outcomes).astype(float)
    raw_ece = ece(np.concatenate(raw_preds), outcome)
    online_ece = ece(np.concatenate(online_preds), outcome)
    assert raw_ece > 0.04 and online_ece < 0.3 * raw_ece


@pytest.mark.parametrize("kwargs", [{"forgetting": 0.0}, {"forgetting": 1.5}, {"prior_precision": 0.0}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError, match="must"):
        OnlineAcceptanceEstimator(**kwargs)


def test_engines_carry_an_estimator_each_and_learn_from_their_steps(small_spec):
    spec = small_spec(make_policy("dspark"), drafter=DrafterSpec(
        "dspark", 5, confidence=ConfidenceSpec(calibrated=False, source="online")),
        cluster=ClusterSpec(num_decode_engines=2, num_prefill_instances=2))
    cluster = Cluster(spec)
    cluster.run()
    estimators = [engine.estimator for engine in cluster.engines]
    assert estimators[0] is not estimators[1]
    for estimator in estimators:
        assert estimator.num_labelled > 0
        assert not np.allclose(estimator.weights, [0.0, 1.0, 0.0, 0.0])
    head = small_spec(make_policy("dspark"))
    assert Cluster(head).engines[0].estimator is None
