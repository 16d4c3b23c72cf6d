"""Analytic drafter latency (the roofline's ``draft.<kind>`` tables) over requests R and draft tokens gamma.

How each drafter spends a step (shapes follow the DSpark paper, sec. 3.1 and 4.1):

* ``dflash``: one forward of ``num_layers`` layers over ``R * gamma`` tokens (anchor +
  gamma-1 masks per request), reading target features through a ``k*h -> h``
  projection, then the LM head over ``R * gamma`` positions.
* ``dspark``: the same parallel pass, then ``gamma`` sequential Markov-head steps
  (``W1[x_{k-1}] W2``, ``W2`` is ``r x V``) that sample left to right.
* ``eagle3``: one layer, ``gamma`` sequential passes over R tokens, each with an LM-head
  projection (the full vocabulary is assumed; a reduced draft vocabulary would be cheaper).
* ``mtp``: DeepSeek-style multi-token prediction: one layer per depth (its own weights,
  a ``2h -> h`` projection), ``gamma`` sequential passes over R tokens with the LM head.

Drafter layers have the target's layer shape (MoE layers for an MoE target, as the
production DSpark backbone of three MoE layers, sec. 5.1). Each pass attends over the
context (or the drafter's window) and reads that KV cache: the drafter's *own* cache, one
entry per context token in each of its layers, shaped like the target's per-layer KV and
stored in the target's KV format. No drafter here reads the target's KV cache:

* ``dspark``, ``dflash``: KV injection (DSpark paper, eq. 3) - the target's context features,
  projected, become keys and values in every drafter layer; the whole context, or the
  last ``window_tokens`` (128 for MoE targets, sec. 5.1: flat in context beyond it);
* ``eagle3``, ``mtp``: their one layer's KV over the whole context.

So drafter latency grows with context (:func:`draft_latency_s` takes the batch's mean
context; without one, the roofline's reference ``context_tokens``). The drafters' shapes
(kinds, layer counts, the paper's defaults) are :class:`calibration.models.shapes.DrafterShape`.
"""

from __future__ import annotations

import numpy as np

from calibration.models.shapes import DrafterShape
from calibration.profiling.roofline import Roofline


def _pass_s(roof: Roofline, spec: DrafterShape, num_requests: int, tokens: int, context_tokens: float) -> float:
    """One drafter forward over ``tokens`` tokens of ``num_requests`` requests at ``context_tokens`` each, LM head
    included."""
    s, a, weight_bytes = roof.shape, roof.assume, roof.precision.weight_bytes
    graph = roof.graph_tokens(np.array([tokens]))
    compute = roof.tile_tokens(graph).astype(np.float64)
    context = context_tokens if spec.window_tokens is None else min(context_tokens, spec.window_tokens)
    moe = s.is_moe
    fc_params = spec.feature_layers * s.hidden_size * s.hidden_size
    matmul = spec.num_layers * s.layer_active_params(moe) + fc_params + s.lm_head_params
    attention = 4.0 * spec.num_layers * s.num_q_heads * s.head_dim * context * roof.attention_flops_weight
    flops = compute * (2.0 * matmul + attention)
    bytes_ = (spec.num_layers * roof.layer_weight_bytes(graph, moe)
              + (fc_params + s.lm_head_params) * weight_bytes
              + tokens * s.vocab_size * 4.0  # fp32 logits written for sampling
              + spec.num_layers * s.kv_elems_per_token_layer * float(roof.precision.kv_bytes) * context
              * num_requests)
    step = roof.roofline_s(flops, bytes_) + a.draft_pass_overhead_s + roof.collectives_s(graph, spec.num_layers)
    return float(step[0])


def _markov_step_s(roof: Roofline, num_requests: int) -> float:
    """One sequential Markov-head step: B = W1[x] W2 for R rows, add to the logits, sample."""
    s, a = roof.shape, roof.assume
    r, v = a.markov_rank, s.vocab_size
    flops = 2.0 * num_requests * r * v
    bytes_ = r * v * roof.precision.weight_bytes + 2 * num_requests * v * 4.0  # W2, logits read + written
    return float(roof.roofline_s(flops, bytes_)) + a.sequential_step_overhead_s


def draft_latency_s(roof: Roofline, spec: DrafterShape, num_requests: int, draft_tokens: int,
                    context_tokens: float | None = None) -> float:
    """Seconds the drafter needs to propose ``draft_tokens`` tokens for each of ``num_requests`` requests whose
    contexts hold ``context_tokens`` tokens on average (default: the roofline's reference context)."""
    if num_requests < 1 or draft_tokens < 1:
        raise ValueError(f"num_requests and draft_tokens must be >= 1, got {num_requests}, {draft_tokens}")
    context = roof.assume.context_tokens if context_tokens is None else context_tokens
    if context < 0:
        raise ValueError(f"context_tokens must be >= 0, got {context}")
    if spec.parallel:
        total = _pass_s(roof, spec, num_requests, num_requests * draft_tokens, context)
        if spec.markov_head:
            total += draft_tokens * _markov_step_s(roof, num_requests)
        return total
    return draft_tokens * _pass_s(roof, spec, num_requests, num_requests, context)
