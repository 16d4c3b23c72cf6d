"""A roofline prior (``--prior MODEL@GPU``): the analytic roofline's costs as Gaussian prior means.

:mod:`calibration.profiling.roofline` prices a model shape on a GPU from datasheet
peaks and stated efficiencies (an estimate, never a measurement). Mapped onto
the fit's parameters:

* ``dense_s[B=g]``: the roofline's target step over ``g`` batch tokens
  (``Roofline.verify_step_s``), less its eager overhead above its largest CUDA
  graph when the fit has its own cliff parameter (``eager_s`` then gets it);
* ``attention_s_per_context_token``: the KV bytes one context token adds to a
  request's step, read at the roofline's memory bandwidth;
* ``draft_fixed_s`` / ``draft_per_position_s``: the roofline drafter's latency at
  one request for one and two draft tokens (fixed = first minus step);
* ``per_request_s`` has no roofline counterpart and stays free.

Each prior has standard deviation ``relative_std`` times its mean (default 30%).
"""

from __future__ import annotations

import numpy as np

from calibration.fitting.fit import Prior
from calibration.fitting.model import CostModel, dense_name
from calibration.models.shapes import default_drafters, get_shape
from calibration.profiling.drafter_cost import draft_latency_s
from calibration.profiling.roofline import GPUS, Assumptions, Roofline, gpus_per_replica

DEFAULT_RELATIVE_STD = 0.3


def parse_prior(text: str) -> tuple[str, str]:
    """``MODEL@GPU`` -> (model, gpu); errors name the valid presets."""
    model, sep, gpu = text.partition("@")
    if not sep or not model or not gpu:
        raise ValueError(f"--prior: expected MODEL@GPU such as qwen3-8b@h200, got {text!r}")
    get_shape(model)  # names the valid shapes when unknown
    if gpu not in GPUS:
        raise ValueError(f"--prior: unknown GPU {gpu!r}; presets: {', '.join(GPUS)}")
    return model, gpu


def roofline_attention_s_per_context_token(model: str, gpu: str) -> float:
    roof = _roofline(model, gpu)
    return float(roof.per_request_s(np.array([1.0]))[0]) / roof.assume.context_tokens


def _roofline(model: str, gpu: str) -> Roofline:
    shape, spec, assume = get_shape(model), GPUS[gpu], Assumptions()
    return Roofline(shape, spec, assume, gpus_per_replica(shape, spec, assume))


def roofline_prior(cost_model: CostModel, model: str, gpu: str, drafter_kind: str | None,
                   relative_std: float = DEFAULT_RELATIVE_STD) -> Prior:
    """Prior means for ``cost_model``'s parameters from the roofline of ``model`` on ``gpu``."""
    roof = _roofline(model, gpu)
    knots = cost_model.knots_tokens
    dense = roof.verify_step_s(np.round(knots).astype(np.int64))
    means: dict[str, float] = {}
    if cost_model.max_captured_tokens is not None:
        dense = dense - np.where(knots > roof.assume.max_graph_tokens, roof.assume.eager_overhead_s, 0.0)
        means["eager_s"] = roof.assume.eager_overhead_s
    means.update({dense_name(g): float(v) for g, v in zip(knots, dense, strict=True)})
    if cost_model.fit_attention:
        means["attention_s_per_context_token"] = roofline_attention_s_per_context_token(model, gpu)
    if cost_model.fit_drafter:
        drafters = default_drafters(roof.shape)
        if drafter_kind not in drafters:
            raise ValueError(f"--prior: the roofline has no drafter {drafter_kind!r}; it has "
                             f"{', '.join(sorted(drafters))} (set --drafter-kind)")
        one, two = (draft_latency_s(roof, drafters[drafter_kind], 1, g) for g in (1, 2))
        means["draft_per_position_s"] = max(two - one, 0.0)
        means["draft_fixed_s"] = max(one - (two - one), 0.0)
    label = f"roofline {model}@{gpu} x{roof.num_gpus} (analytic), +-{100 * relative_std:.0f}%"
    return Prior(means, relative_std, label)
