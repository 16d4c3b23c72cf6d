"""Batched training forwards: the same computations as inference, over whole sequences with many anchors.

Inference (``calibration.models.model`` / ``calibration.models.drafters``) runs one engine step at a
time through KV caches. Training needs the identical function of the weights over a
batch of sequences ``tokens [B, L]``:

* :func:`target_forward` - the verifier's causal forward without a cache: logits,
  feature-layer outputs and last hidden state of every position.
* :func:`drafter_forward` - every drafter kind at ``A`` anchor positions per sequence.
  An anchor ``n`` sees the target features of tokens ``0..n-1`` as its context (what
  the drafter's cache holds when ``tokens[n]`` is the anchor), and position k = 1..g
  predicts ``tokens[n + k]``. Sequential parts are teacher-forced: the Markov/RNN head
  and the autoregressive drafters read the true ``tokens[n + k - 1]`` where inference
  reads the sampled draft token; Eagle3 and MTP feed their own hidden states forward
  as at inference (training-time test).

``tests/test_training.py`` checks both against the cached inference path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from calibration.models.drafters import AutoregressiveDrafter, Drafter, ParallelDrafter
from calibration.models.model import Block, Verifier, VerifierOutput, attend


def target_forward(target: Verifier, tokens: Tensor) -> VerifierOutput:
    """tokens [B, L] -> logits [B, L, V], features [B, L, F*h], hidden [B, L, h] (causal, no cache)."""
    batch, length = tokens.shape
    positions = torch.arange(length, device=tokens.device).expand(batch, length)
    x = target.embed(tokens)  # [B, L, h]
    features = []
    for i, layer in enumerate(target.layers):
        h = layer.attn_norm(x)
        q = layer.attn.q(h, positions).transpose(1, 2)  # [B, Hq, L, d]
        k, v = (t.transpose(1, 2) for t in layer.attn.kv(h, positions))  # [B, Hkv, L, d]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + layer.attn.o_proj(out.transpose(1, 2).flatten(2))
        x = x + layer.mlp(layer.mlp_norm(x))
        if i in target.feature_layers:
            features.append(x)
    return VerifierOutput(target.lm_head(target.norm(x)).float(), torch.cat(features, dim=-1), x)


@dataclass(frozen=True)
class BlockPrediction:
    """Drafter outputs at every anchor: logits [B, A, g, V] and confidences [B, A, g] (None without a head)."""

    logits: Tensor
    confidence: Tensor | None


def _gather(x: Tensor, index: Tensor) -> Tensor:
    """x [B, L, ...] at index [B, ...] -> [B, ..., ...]."""
    rows = torch.arange(x.shape[0], device=x.device).view(-1, *([1] * (index.dim() - 1)))
    return x[rows, index]


def _context_kv(layer: Block, context: Tensor) -> tuple[Tensor, Tensor]:
    """Keys/values of the projected target features context [B, L, h] -> [B, Hkv, L, d] each."""
    positions = torch.arange(context.shape[1], device=context.device).expand(context.shape[:2])
    k, v = layer.attn.kv(layer.attn_norm(context), positions)
    return k.transpose(1, 2), v.transpose(1, 2)


def _attend_layer(layer: Block, x: Tensor, positions: Tensor, ctx_kv: tuple[Tensor, Tensor], ctx_visible: Tensor,
                  block_k: Tensor, block_v: Tensor, block_visible: Tensor) -> Tensor:
    """One drafter attention: x [B, Q, h] over [context; block] keys -> [B, Q, h] (residual not added)."""
    h = layer.attn_norm(x)
    q = layer.attn.q(h, positions).transpose(1, 2)  # [B, Hq, Q, d]
    keys = torch.cat([ctx_kv[0], block_k], dim=2)
    values = torch.cat([ctx_kv[1], block_v], dim=2)
    mask = torch.cat([ctx_visible, block_visible], dim=-1)[:, None]  # [B, 1, Q, L + K]
    out = attend(q, keys, values, mask)
    return layer.attn.o_proj(out.transpose(1, 2).flatten(2))


def _parallel(drafter: ParallelDrafter, context: Tensor, tokens: Tensor, anchors: Tensor,
              gamma: int) -> BlockPrediction:
    batch, num_anchors = anchors.shape
    length, device = tokens.shape[1], tokens.device
    offsets = torch.arange(gamma, device=device)
    anchor_embed = drafter.target.embed(_gather(tokens, anchors))[:, :, None]  # [B, A, 1, h]
    masks = drafter.mask_embedding.expand(batch, num_anchors, gamma - 1, -1)
    x = torch.cat([anchor_embed, masks], dim=2).flatten(1, 2)  # [B, A*g, h]
    positions = (anchors[:, :, None] + offsets).flatten(1)  # [B, A*g]
    query_anchor = anchors.repeat_interleave(gamma, dim=1)  # [B, A*g]
    ctx_visible = torch.arange(length, device=device)[None, None, :] < query_anchor[:, :, None]  # [B, A*g, L]
    block_id = torch.arange(num_anchors, device=device).repeat_interleave(gamma)
    block_visible = (block_id[:, None] == block_id[None, :]).expand(batch, -1, -1)  # bidirectional per block
    for layer in drafter.layers:
        hx = layer.attn_norm(x)
        k, v = (t.transpose(1, 2) for t in layer.attn.kv(hx, positions))
        x = x + _attend_layer(layer, x, positions, _context_kv(layer, context), ctx_visible, k, v, block_visible)
        x = x + layer.mlp(layer.mlp_norm(x))
    h = drafter.norm(x).unflatten(1, (num_anchors, gamma))  # [B, A, g, h]
    base = drafter.target.lm_head(h).float()  # [B, A, g, V]
    if drafter.sequential is None:
        return BlockPrediction(base, None)
    previous = _gather(tokens, anchors[:, :, None] + offsets)  # [B, A, g]: x_{k-1}, true tokens (teacher forcing)
    e = drafter.w1(previous)  # [B, A, g, r]
    if drafter.sequential == "markov":
        bias = drafter.w2(e)  # eq. 5
    else:
        state = torch.zeros_like(e[:, :, 0])
        outs = []
        for k in range(gamma):
            gate, cand, out = drafter.rnn(torch.cat([state, e[:, :, k], h[:, :, k]], dim=-1)).chunk(3, dim=-1)
            state = torch.sigmoid(gate) * state + (1 - torch.sigmoid(gate)) * torch.tanh(cand)  # eq. 6
            outs.append(torch.tanh(out))
        bias = drafter.w2(torch.stack(outs, dim=2))
    confidence = torch.sigmoid(drafter.confidence_head(torch.cat([h, e], dim=-1))).float()[..., 0]  # eq. 7
    return BlockPrediction(base + bias.float(), confidence)


def _autoregressive(drafter: AutoregressiveDrafter, context: Tensor, last_feature: Tensor, tokens: Tensor,
                    anchors: Tensor, gamma: int) -> BlockPrediction:
    batch, num_anchors = anchors.shape
    length, device = tokens.shape[1], tokens.device
    if drafter.kind == "mtp" and gamma > len(drafter.layers):
        raise ValueError(f"mtp drafter has {len(drafter.layers)} depths; cannot train {gamma} positions")
    ctx_visible = torch.arange(length, device=device)[None, None, :] < anchors[:, :, None]  # [B, A, L]
    feature = last_feature if drafter.uses_hidden else drafter.fc(last_feature)  # [B, A, h]
    context_kv: dict[int, tuple[Tensor, Tensor]] = {}
    block_k: list[Tensor] = []
    block_v: list[Tensor] = []
    logits = []
    for k in range(gamma):
        depth = k if drafter.kind == "mtp" else 0
        layer = drafter.layers[depth]
        if depth not in context_kv:
            context_kv[depth] = _context_kv(layer, context)
        previous = _gather(tokens, anchors + k)  # [B, A] x_{k-1}, true token
        x = drafter.in_proj[depth](torch.cat([drafter.embed_norm(drafter.target.embed(previous)),
                                              drafter.feature_norm(feature)], dim=-1))  # [B, A, h]
        positions = anchors + k
        key, value = (t.transpose(1, 2) for t in layer.attn.kv(layer.attn_norm(x), positions))  # [B, Hkv, A, d]
        if drafter.kind == "mtp":
            block_k, block_v = [], []
        block_k.append(key)
        block_v.append(value)
        own = torch.eye(num_anchors, dtype=torch.bool, device=device).repeat(1, len(block_k))  # [A, A*steps]
        x = x + _attend_layer(layer, x, positions, context_kv[depth], ctx_visible, torch.cat(block_k, 2),
                              torch.cat(block_v, 2), own.expand(batch, -1, -1))
        x = x + layer.mlp(layer.mlp_norm(x))
        feature = x
        logits.append(drafter.head(x))
    return BlockPrediction(torch.stack(logits, dim=2), None)


def drafter_forward(drafter: Drafter, target_out: VerifierOutput, tokens: Tensor, anchors: Tensor,
                    gamma: int) -> BlockPrediction:
    """Drafter logits at ``anchors [B, A]`` (1 <= n <= L - 1 - gamma) of ``tokens [B, L]``.

    ``target_out`` is :func:`target_forward` of the same tokens (computed without grad).
    """
    if anchors.min() < 1 or anchors.max() > tokens.shape[1] - 1 - gamma:
        raise ValueError(f"anchors must lie in 1..{tokens.shape[1] - 1 - gamma} for gamma={gamma} and "
                         f"sequences of {tokens.shape[1]} tokens, got {anchors.min()}..{anchors.max()}")
    raw = drafter.features_of(target_out)  # [B, L, F]
    context = drafter.fc(raw)  # [B, L, h]
    if isinstance(drafter, ParallelDrafter):
        return _parallel(drafter, context, tokens, anchors, gamma)
    if isinstance(drafter, AutoregressiveDrafter):
        return _autoregressive(drafter, context, _gather(raw, anchors - 1), tokens, anchors, gamma)
    raise TypeError(f"no training forward for drafter {type(drafter).__name__}")
