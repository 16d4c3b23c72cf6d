"""Closed-loop request lengths: the sampler's draws are those of its plain numpy formulation, draw for draw.

The reference below is how the sampler was first written (``Generator.choice`` with ``p`` for the domain,
then each length on its own); the sampler computes the same numbers with fewer array operations, and the
stream must stay where the reference leaves it, so that every later draw is unchanged too.
"""

from __future__ import annotations

import numpy as np
import pytest

from traces.synthetic import LengthSpec, RequestSampler, TrafficSpec
from traces.workload import DOMAINS


def reference_sample(spec: TrafficSpec, rng: np.random.Generator, n: int):
    names = list(spec.domain_mix)
    weights = np.array([spec.domain_mix[name] for name in names], dtype=float)
    probs = weights / weights.sum()
    domain = np.array([DOMAINS.index(name) for name in names])[rng.choice(probs.size, size=n, p=probs)]
    lengths = [spec.lengths[DOMAINS[i]] for i in range(len(DOMAINS))]
    prompt_mu = np.log([s.prompt_median_tokens for s in lengths])[domain]
    prompt_sigma = np.array([s.prompt_sigma for s in lengths])[domain]
    output_mu = np.log([s.output_median_tokens for s in lengths])[domain]
    output_sigma = np.array([s.output_sigma for s in lengths])[domain]
    normals = rng.standard_normal((2, n))
    prompt = np.minimum(np.ceil(np.exp(prompt_mu + prompt_sigma * normals[0])), spec.max_prompt_tokens)
    output = np.minimum(np.ceil(np.exp(output_mu + output_sigma * normals[1])), spec.max_output_tokens)
    return domain, prompt.astype(np.int64), output.astype(np.int64)


SPECS = [
    TrafficSpec(domain_mix={"chat": 1.0}),  # one domain: the uniform draw is still taken
    TrafficSpec(domain_mix={"chat": 0.7, "math": 0.2, "code": 0.1}),
    TrafficSpec(domain_mix={"code": 0.0, "chat": 2.0, "math": 0.5}),  # a zero weight is never drawn
    TrafficSpec(domain_mix={"chat": 1.0, "code": 1.0}, max_prompt_tokens=300, max_output_tokens=40,  # truncation
                lengths={d: LengthSpec(400.0, 1.2, 30.0, 1.0) for d in DOMAINS}),
]


@pytest.mark.parametrize("spec", SPECS)
def test_draws_equal_the_reference_and_leave_the_stream_where_it_does(spec):
    sampler = RequestSampler(spec)
    for seed in range(3):
        ours, theirs = np.random.default_rng(seed), np.random.default_rng(seed)
        for n in (1, 2, 3, 5, 64, 2000):  # closed-loop batches are small, open-loop workloads large
            for got, want in zip(sampler.sample(ours, n), reference_sample(spec, theirs, n), strict=True):
                assert got.dtype == want.dtype and np.array_equal(got, want)
        assert ours.bit_generator.state == theirs.bit_generator.state
