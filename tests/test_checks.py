"""check_spec: what would stop a run minutes in is refused at start, naming the config key or the profile file."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from policies import make_policy
from simulator import ClusterSpec, DrafterSpec, EngineLimits, SimulationSpec
from simulator.checks import SpecError, check_spec
from simulator.costs import Table2D
from traces.synthetic import TrafficSpec
from traces.workload import Workload


@pytest.fixture
def spec(default_profile):
    """A small closed-loop spec that passes every check."""
    return SimulationSpec(policy=make_policy("dspark"), profile=default_profile, drafter=DrafterSpec("dspark", 5),
                          cluster=ClusterSpec(limits=EngineLimits(max_concurrency=8, kv_capacity_tokens=100_000)),
                          traffic=TrafficSpec(num_users=8), duration_s=2.0)


def _attention(contexts: list[float], queries: list[float]) -> Table2D:
    values = np.full((len(contexts), len(queries)), 1e-5)
    return Table2D(np.array(contexts, dtype=float), np.array(queries, dtype=float), values, "attention step_s",
                   "context_tokens", "query_tokens", "attn.json")


def _workload(prompt: list[int], output: list[int]) -> Workload:
    n = len(prompt)
    return Workload(arrival_at=np.arange(n, dtype=float), prompt_tokens=np.array(prompt),
                    output_tokens=np.array(output), domain=np.full(n, "chat"), source="mine.csv")


def test_a_spec_that_fits_passes(spec):
    check_spec(spec)


@pytest.mark.parametrize(
    "change, message",
    [
        # 2000 requests x (1 + 5 draft tokens) = 12000 batch tokens, past the 8192 of the table
        (lambda s: {"cluster": ClusterSpec(limits=EngineLimits(max_concurrency=2000))},
         r"verify.batch_tokens ends at 8192, but a step can hold 12000 batch tokens"),
        # the built-in draft tables end at gamma = 16
        (lambda s: {"drafter": DrafterSpec("dspark", 20)}, r"draft.dspark.draft_tokens covers 1..16, but every step"),
        # mtp5 cannot run on a 3-token block
        (lambda s: {"policy": make_policy("mtp5"), "drafter": DrafterSpec("dspark", 3)},
         r"policy mtp drafts 5 tokens per step but drafter.gamma=3"),
        # closed-loop users never stop
        (lambda s: {"duration_s": None}, r"duration_s=null: closed-loop traffic never ends"),
        # a request of 32768 + 4096 tokens can never be admitted
        (lambda s: {"cluster": ClusterSpec(limits=EngineLimits(kv_capacity_tokens=30_000))},
         r"traffic.max_prompt_tokens \+ traffic.max_output_tokens = 36864 KV tokens, but "
         r"cluster.kv_capacity_tokens=30000"),
        # a replayed trace: its largest row names the request
        (lambda s: {"traffic": _workload([100, 90_000], [10, 20_000])},
         r"traffic mine.csv: request 1 \(in arrival order\) needs 110000 KV tokens \(90000 prompt \+ 20000 output\)"),
        # an attention table over contexts up to 4096 tokens, for requests of up to 36863
        (lambda s: {"profile": dataclasses.replace(s.profile, attention=_attention([1, 4096], [1, 8]))},
         r"attention.context_tokens covers 1..4096, but traffic.max_prompt_tokens \+ traffic.max_output_tokens "
         r"give contexts of 1..36863 tokens"),
        # an attention table over 1..4 query tokens, for 1 + 5 verified tokens
        (lambda s: {"profile": dataclasses.replace(s.profile, attention=_attention([1, 40_000], [1, 4]))},
         r"attention.query_tokens covers 1..4, but a request verifies up to 6 tokens"),
        # the profile the policy prices with is checked too
        (lambda s: {"policy_profile": dataclasses.replace(s.profile, draft={}, path="stale.json")},
         r"profile stale.json: no draft latency for drafter.kind=dspark"),
    ],
)
def test_what_cannot_run_is_refused_at_start(spec, change, message):
    with pytest.raises(SpecError, match=message):
        check_spec(dataclasses.replace(spec, **change(spec)))


def test_a_token_budget_caps_the_batch(spec):
    # 1000 requests would hold 6000 batch tokens, but a 4096-token budget keeps every step inside the table
    limits = EngineLimits(max_concurrency=1000, max_num_batched_tokens=4096)
    check_spec(dataclasses.replace(spec, cluster=ClusterSpec(limits=limits)))
