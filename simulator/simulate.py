"""``simulate(spec) -> Results``: the simulator's one entry point, free of I/O."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from simulator.cluster import Cluster
from simulator.metrics import add_request_metrics, requests_in_run, summarize
from simulator.specs import SimulationSpec


@dataclass(frozen=True)
class Results:
    """Tables of one run plus its summary.

    ``requests`` has one row per request that arrived before the end of the run (``in_window``: arrived in the
    measurement window; unfinished requests show their counters so far), ``steps`` one row per engine step.
    """

    spec: SimulationSpec
    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict[str, Any]


def simulate(spec: SimulationSpec, progress: Callable[[float], None] | None = None) -> Results:
    cluster = Cluster(spec)
    end_at = cluster.run(progress)
    frame = add_request_metrics(cluster.store.to_frame())
    complete = spec.duration_s is None  # an open-loop workload run until every request finished
    start_at = float(frame["arrival_at"].min()) if complete else spec.warmup_s
    # A trace's later rows are in the store from the start: they never arrived when the run stopped first.
    requests = requests_in_run(frame, start_at, None if complete else end_at)
    steps = pd.DataFrame(cluster.steps.rows, columns=list(cluster.steps.columns))
    verified_counts = np.sum([e.verified_length_counts for e in cluster.engines], axis=0)
    accepted_counts = np.sum([e.accepted_length_counts for e in cluster.engines], axis=0)
    num_gpus = spec.cluster.num_decode_engines * spec.profile.gpus_per_replica
    summary = {
        "policy": spec.policy.name,
        "policy_params": {k: v for k, v in vars(spec.policy).items()},
        "lossless": bool(spec.policy.lossless),
        "drafter": spec.drafter.kind,
        "gamma": spec.drafter.gamma,
        "acceptance": cluster.acceptance.describe(),
        "profile": spec.profile.label,
        "profile_source": spec.profile.source,
        "seed": spec.seed,
        "num_decode_gpus": num_gpus,
        **summarize(requests, steps, verified_counts, accepted_counts, start_at=start_at, end_at=end_at,
                    num_decode_gpus=num_gpus),
    }
    return Results(spec=spec, requests=requests, steps=steps, summary=summary)
