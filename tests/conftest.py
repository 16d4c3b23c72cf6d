"""Shared fixtures: injected RNGs, cost curves and small simulation specs."""

from __future__ import annotations

import numpy as np
import pytest

from policies.base import CostCurve
from simulator import ClusterSpec, DrafterSpec, EngineLimits, SimulationSpec, load_profile
from traces.synthetic import TrafficSpec


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


@pytest.fixture(scope="module")
def torch_one_thread():
    """Torch on one thread for a whole test module (its module fixtures included): deterministic
    timings and results, and no OpenMP oversubscription on a shared 2-core machine."""
    import torch  # imported here so that torch-free test modules do not pay for it

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_verifier_v8(torch_one_thread):
    """The tiny torch verifier with an 8-token vocabulary and fixed random weights, small enough
    that exact output distributions can be enumerated."""
    import dataclasses

    import torch

    from calibration.models.model import build_verifier
    from calibration.models.shapes import get_shape

    shape = dataclasses.replace(get_shape("tiny"), name="tiny-v8", vocab_size=8)
    return build_verifier(shape, torch.Generator().manual_seed(11), std=0.1)


@pytest.fixture(scope="session")
def default_profile():
    return load_profile("h200_qwen3-8b_analytic")


def curve(sps: list[float], start: int = 1) -> CostCurve:
    """A cost curve with SPS given at batch tokens start, start + 1, ..."""
    return CostCurve(batch_tokens=np.arange(start, start + len(sps)), steps_per_s=np.asarray(sps, dtype=float))


@pytest.fixture
def small_spec(default_profile):
    """Factory for a short closed-loop simulation."""

    def make(policy, **overrides) -> SimulationSpec:
        params = dict(policy=policy, profile=default_profile, drafter=DrafterSpec("dspark", 5),
                      cluster=ClusterSpec(num_prefill_instances=2, limits=EngineLimits(64, 600_000)),
                      traffic=TrafficSpec(arrival="closed", num_users=16, domain_mix={"chat": 1.0},
                                          max_output_tokens=256),
                      duration_s=5.0, warmup_s=1.0, seed=7)
        params.update(overrides)
        return SimulationSpec(**params)

    return make
