"""``simulate(spec) -> Results``: the simulator's one entry point, free of I/O."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from simulator.cluster import Cluster
from simulator.engine import StepLog
from simulator.metrics import add_request_metrics, summarize
from simulator.specs import SimulationSpec


@dataclass(frozen=True)
class Results:
    """Tables of one run plus its summary. ``requests`` has one row per request, ``steps`` one per engine step."""

    spec: SimulationSpec
    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict[str, Any]


def simulate(spec: SimulationSpec, progress: Callable[[float], None] | None = None) -> Results:
    cluster = Cluster(spec)
    end_at = cluster.run(progress)
    requests = add_request_metrics(cluster.store.to_frame())
    steps = pd.DataFrame(cluster.steps.rows, columns=list(StepLog.COLUMNS))
    verified_counts = np.sum([e.verified_length_counts for e in cluster.engines], axis=0)
    accepted_counts = np.sum([e.accepted_length_counts for e in cluster.engines], axis=0)
    start_at = spec.warmup_s if spec.duration_s is not None else float(requests["arrival_at"].min())
    num_gpus = spec.cluster.num_decode_engines * spec.profile.gpus_per_replica
    summary = {
        "policy": spec.policy.name,
        "policy_params": {k: v for k, v in vars(spec.policy).items()},
        "lossless": bool(spec.policy.lossless),
        "drafter": spec.drafter.kind,
        "gamma": spec.drafter.gamma,
        "profile": spec.profile.label,
        "profile_source": spec.profile.source,
        "seed": spec.seed,
        "num_decode_gpus": num_gpus,
        **summarize(requests, steps, verified_counts, accepted_counts, start_at=start_at, end_at=end_at,
                    num_decode_gpus=num_gpus),
    }
    return Results(spec=spec, requests=requests, steps=steps, summary=summary)
