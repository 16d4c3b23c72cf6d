"""The verifier: a Qwen3-style decoder (RMSNorm, RoPE, GQA, SwiGLU, QK-norm) with a preallocated KV cache.

One forward verifies a *flattened* batch: the tokens of every request laid end to
end, request after request (``tokens [T]``). Request r brings ``query_lens[r]``
new tokens (1 + l_r in verification, the prompt in prefill) on top of the
``cache_lens[r]`` tokens already in its cache slot. Attention runs per request
over [cached keys; new keys] with a causal block mask, so requests of different
lengths never see each other. The requests of one attention group are padded to
each other's longest query and key lengths; a forward may hold several groups
(:class:`MixedBatch`: decoding requests and each prefill chunk apart, as a varlen
kernel would), the dense layers running once over all tokens. Weights are random (timing depends on shapes only);
nothing is ever downloaded. Shapes come from :mod:`calibration.models.shapes`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from calibration.models.shapes import ModelShape, get_shape


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def apply_rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Rotary embedding (rotate-half form) of ``x [..., T, H, d]`` at ``positions [..., T]``."""
    d = x.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)  # [d/2]
    angles = positions.float()[..., None] * freqs  # [..., T, d/2]
    cos, sin = angles.cos()[..., None, :], angles.sin()[..., None, :]  # [..., T, 1, d/2]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Grouped-query attention: q [R, Hq, Q, d], k/v [R, Hkv, L, d], mask [R, 1, Q, L] (True = visible)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


class Attention(nn.Module):
    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(s.hidden_size, s.num_q_heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.hidden_size, s.num_kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.hidden_size, s.num_kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.num_q_heads * s.head_dim, s.hidden_size, bias=False)
        self.q_norm = RMSNorm(s.head_dim, s.rms_norm_eps) if s.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(s.head_dim, s.rms_norm_eps) if s.qk_norm else nn.Identity()

    def q(self, x: Tensor, positions: Tensor) -> Tensor:
        """x [..., T, h] -> [..., T, Hq, d] (normed, rotated)."""
        q = self.q_proj(x).unflatten(-1, (self.s.num_q_heads, self.s.head_dim))
        return apply_rope(self.q_norm(q), positions, self.s.rope_theta)

    def kv(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """x [..., T, h] -> k, v [..., T, Hkv, d]."""
        k = self.k_proj(x).unflatten(-1, (self.s.num_kv_heads, self.s.head_dim))
        v = self.v_proj(x).unflatten(-1, (self.s.num_kv_heads, self.s.head_dim))
        return apply_rope(self.k_norm(k), positions, self.s.rope_theta), v


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.attn = Attention(s)
        self.mlp_norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.mlp = MLP(s.hidden_size, s.intermediate_size)


class KVCache:
    """Preallocated keys and values ``[layers, slots, Hkv, max_tokens, d]`` plus each slot's length."""

    def __init__(self, s: ModelShape, num_layers: int, num_slots: int, max_tokens: int,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        shape = (num_layers, num_slots, s.num_kv_heads, max_tokens, s.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.lengths = torch.zeros(num_slots, dtype=torch.long)  # host side: tokens held per slot
        self.max_tokens = max_tokens

    def batch(self, slots: Tensor | list[int], query_lens: Tensor | list[int],
              groups: Sequence[int] | None = None) -> VarlenBatch | MixedBatch:
        """The layout of a forward that appends ``query_lens[r]`` tokens to slot ``slots[r]``.

        ``groups``: numbers of consecutive requests whose attention is padded to each other (their sum is the
        number of requests); the dense layers still run once over every token. None: one group, every request's
        queries and keys padded to the longest. A mixed step of decoding requests and prefill chunks passes
        ``[R, 1, 1, ...]``: one forward whose attention, like a varlen kernel's, pads no chunk to another.
        """
        slots = torch.as_tensor(slots, dtype=torch.long)
        lens = torch.as_tensor(query_lens, dtype=torch.long)
        if groups is None or len(groups) == 1:
            return VarlenBatch.build(slots, self.lengths[slots], lens, self.max_tokens, self.k.device)
        if min(groups) < 1 or sum(groups) != slots.numel():
            raise ValueError(f"attention groups {list(groups)} must be >= 1 request each and sum to the "
                             f"{slots.numel()} requests")
        bounds = [0, *itertools.accumulate(groups)]
        parts = tuple(VarlenBatch.build(slots[a:b], self.lengths[slots[a:b]], lens[a:b], self.max_tokens,
                                        self.k.device) for a, b in itertools.pairwise(bounds))
        return MixedBatch(parts, torch.cat([p.positions for p in parts]), torch.cat([p.token_slots for p in parts]))

    def commit(self, slots: Tensor | list[int], num_tokens: Tensor | list[int]) -> None:
        """Keep ``num_tokens[r]`` of the tokens just written to slot r (the rest are overwritten later)."""
        slots = torch.as_tensor(slots, dtype=torch.long)
        self.lengths[slots] += torch.as_tensor(num_tokens, dtype=torch.long)

    def reset(self, slots: Tensor | list[int] | None = None) -> None:
        if slots is None:
            self.lengths.zero_()
        else:
            self.lengths[torch.as_tensor(slots, dtype=torch.long)] = 0

    # Whole slots, for a live batch whose requests come, go and move (calibration.serving.batch.LiveBatch).

    def rows(self, slot: int) -> tuple[Tensor, Tensor]:
        """Copies of slot ``slot``'s committed keys and values, ``[layers, Hkv, length, d]`` each."""
        n = int(self.lengths[slot])
        return self.k[:, slot, :, :n].clone(), self.v[:, slot, :, :n].clone()

    def write(self, slot: int, k: Tensor, v: Tensor) -> None:
        """Slot ``slot`` holds exactly ``k`` and ``v`` (``[layers, Hkv, n, d]``, as :meth:`rows` returns them)."""
        n = k.shape[2]
        self.k[:, slot, :, :n] = k
        self.v[:, slot, :, :n] = v
        self.lengths[slot] = n

    def move(self, src: int, dst: int) -> None:
        """Slot ``dst`` takes slot ``src``'s committed rows (``src`` keeps them until it is reused)."""
        n = int(self.lengths[src])
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self.lengths[dst] = n


@dataclass(frozen=True)
class VarlenBatch:
    """Index tensors of one flattened forward (tokens of request 0, then request 1, ...)."""

    slots: Tensor  # [R] cache slot of each request
    contiguous: bool  # slots == first..first+R-1: the cache is sliced, not gathered
    positions: Tensor  # [T] absolute position of each token
    token_slots: Tensor  # [T]
    pad_index: Tensor  # [R, Qmax] flat token index of (request, query row); 0 on padding
    valid_rows: Tensor  # [T] flat index of each real query row in R x Qmax (a gather, no host sync: graph capture)
    mask: Tensor  # [R, 1, Qmax, L] bool, key visible to query
    max_len: int  # L = max over requests of cache_len + query_len
    query_lens: Tensor  # [R] (host)
    first_slot: int  # slots[0], kept on the host: slicing the cache reads no device tensor (CUDA-graph capture)

    @staticmethod
    def build(slots: Tensor, cache_lens: Tensor, query_lens: Tensor, max_tokens: int,
              device: torch.device | str) -> VarlenBatch:
        if slots.numel() == 0 or slots.shape != query_lens.shape:
            raise ValueError(f"need one query length per slot (>= 1 request), got {slots.numel()} slots "
                             f"and {query_lens.numel()} query lengths")
        if query_lens.min() < 1:
            raise ValueError(f"every request needs >= 1 query token, got {query_lens.tolist()}")
        ends = cache_lens + query_lens
        if ends.max() > max_tokens:
            r = int(ends.argmax())
            raise ValueError(f"slot {int(slots[r])} would hold {int(ends[r])} tokens; the cache holds {max_tokens}")
        q_max, max_len = int(query_lens.max()), int(ends.max())
        rows = torch.arange(q_max)
        valid = rows[None, :] < query_lens[:, None]  # [R, Qmax]
        starts = torch.cumsum(query_lens, 0) - query_lens
        pad_index = torch.where(valid, starts[:, None] + rows[None, :], 0)
        query_pos = cache_lens[:, None] + rows[None, :]  # [R, Qmax]
        mask = torch.arange(max_len)[None, None, :] <= query_pos[:, :, None]  # [R, Qmax, L]
        contiguous = bool(torch.equal(slots, torch.arange(int(slots[0]), int(slots[0]) + slots.numel())))
        return VarlenBatch(
            slots=slots.to(device), contiguous=contiguous, positions=query_pos[valid].to(device),
            token_slots=slots.repeat_interleave(query_lens).to(device), pad_index=pad_index.to(device),
            valid_rows=valid.flatten().nonzero().flatten().to(device),
            mask=mask[:, None].to(device), max_len=max_len, query_lens=query_lens,
            first_slot=int(slots[0]))

    def cached(self, cache: Tensor) -> Tensor:
        """This batch's rows of one layer's cache [S, Hkv, Lmax, d] -> [R, Hkv, L, d]."""
        if self.contiguous:
            return cache[self.first_slot:self.first_slot + self.slots.numel(), :, :self.max_len]
        return cache[self.slots, :, :self.max_len]

    @property
    def parts(self) -> tuple[VarlenBatch, ...]:
        return (self,)


@dataclass(frozen=True)
class MixedBatch:
    """One forward over several attention groups (:meth:`KVCache.batch` with ``groups``): tokens of group 0, then
    group 1, ...; each group a :class:`VarlenBatch` whose token indices count from the group's first token."""

    parts: tuple[VarlenBatch, ...]
    positions: Tensor  # [T]
    token_slots: Tensor  # [T]


def varlen_attention(attn: Attention, x: Tensor, batch: VarlenBatch | MixedBatch, cache_k: Tensor,
                     cache_v: Tensor) -> Tensor:
    """x [T, h] -> [T, h]: write the new keys into the cache, attend per request under the block mask."""
    q = attn.q(x, batch.positions)  # [T, Hq, d]
    k, v = attn.kv(x, batch.positions)  # [T, Hkv, d]
    cache_k[batch.token_slots, :, batch.positions] = k
    cache_v[batch.token_slots, :, batch.positions] = v
    outs, start = [], 0
    for part in batch.parts:  # attention per group; every other layer ran once over all T tokens
        part_q = q[start:start + part.positions.numel()]
        start += part.positions.numel()
        q_pad = part_q[part.pad_index].transpose(1, 2)  # [R, Hq, Qmax, d]
        out = attend(q_pad, part.cached(cache_k), part.cached(cache_v), part.mask)  # [R, Hq, Qmax, d]
        outs.append(out.transpose(1, 2).flatten(2).flatten(0, 1)[part.valid_rows])  # [T_part, Hq * d]
    return attn.o_proj(outs[0] if len(outs) == 1 else torch.cat(outs))  # [T, h]


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """Low, middle and high layers whose outputs feed the drafters (Eagle3/DFlash practice)."""
    return tuple(sorted({min(max(i, 0), num_layers - 1) for i in (1, num_layers // 2, num_layers - 2)}))


@dataclass(frozen=True)
class VerifierOutput:
    logits: Tensor  # [T, V] float32
    features: Tensor  # [T, F*h] outputs of the feature layers, concatenated
    hidden: Tensor  # [T, h] last layer output (before the final norm)


class Verifier(nn.Module):
    """Dense Qwen3-style target model. MoE shapes are roofline-only."""

    def __init__(self, shape: ModelShape | str, feature_layers: tuple[int, ...] | None = None) -> None:
        super().__init__()
        s = get_shape(shape) if isinstance(shape, str) else shape
        if s.is_moe:
            raise ValueError(f"model shape {s.name!r} is MoE; the torch verifier implements dense models only "
                             f"(use the analytic roofline, calibration.profiling.roofline, for MoE shapes)")
        self.s = s
        self.feature_layers = feature_layers if feature_layers is not None else default_feature_layers(s.num_layers)
        if not all(0 <= i < s.num_layers for i in self.feature_layers):
            raise ValueError(f"feature layers {self.feature_layers} outside 0..{s.num_layers - 1}")
        self.embed = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList(Block(s) for _ in range(s.num_layers))
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)
        if s.tied_embeddings:
            self.lm_head.weight = self.embed.weight

    def new_cache(self, num_slots: int, max_tokens: int) -> KVCache:
        p = self.embed.weight
        return KVCache(self.s, self.s.num_layers, num_slots, max_tokens, p.device, p.dtype)

    def forward(self, tokens: Tensor, batch: VarlenBatch | MixedBatch, cache: KVCache) -> VerifierOutput:
        """tokens [T] (flattened per request) -> logits, features and hidden of every token."""
        x = self.embed(tokens)  # [T, h]
        features = []
        for i, layer in enumerate(self.layers):
            x = x + varlen_attention(layer.attn, layer.attn_norm(x), batch, cache.k[i], cache.v[i])
            x = x + layer.mlp(layer.mlp_norm(x))
            if i in self.feature_layers:
                features.append(x)
        logits = self.lm_head(self.norm(x)).float()  # [T, V]
        return VerifierOutput(logits, torch.cat(features, dim=-1), x)


def init_weights(module: nn.Module, generator: torch.Generator, std: float = 0.02) -> nn.Module:
    """Random weights from ``generator``: normal(0, std) for matrices, ones for norm gains."""
    with torch.no_grad():
        for param in module.parameters():
            if param.dim() == 1:
                param.fill_(1.0)
            else:
                param.normal_(0.0, std, generator=generator)
            param.requires_grad_(False)
    return module


def build_verifier(shape: ModelShape | str, generator: torch.Generator, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float32, std: float = 0.02) -> Verifier:
    """A verifier with random weights drawn on ``device`` (constructed on the meta device: no double init)."""
    with torch.device("meta"):
        model = Verifier(shape).to(dtype)  # cast on meta: the real weights are allocated once, in dtype
    model = model.to_empty(device=device)
    if model.s.tied_embeddings:
        model.lm_head.weight = model.embed.weight
    return init_weights(model, generator, std).eval()
