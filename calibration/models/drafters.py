"""Drafters that share the verifier's embedding and LM head (frozen, not registered as their own weights).

Every drafter reads *injected target features*: the hidden states of the verifier's
feature layers for committed tokens go through a projection ``fc`` and become the
keys and values of each drafter layer over the context (DFlash-style injection,
kept in the drafter's own KV cache). Kinds (DSpark paper sec. 3.1, 4.1):

* ``dflash``: parallel backbone; input anchor + (gamma-1) mask tokens at positions
  n..n+gamma-1, bidirectional inside the block, gamma logits in one pass; positions
  are sampled independently. No confidence head.
* ``dspark``: the same backbone, then a sequential head applied left to right while
  sampling: Markov ``U_k + W1[x_{k-1}] W2`` (eq. 5, ``W1 [V x r]``, ``W2 [r x V]``) or the
  RNN head (eq. 6); confidence ``c_k = sigmoid(w^T [h_k ; W1[x_{k-1}]])`` (eq. 7).
* ``eagle3``: one layer, autoregressive; step k reads ``[embed(x_{k-1}); feature]``
  where the feature is the projected target feature of the last committed token
  at k = 1 and the drafter's own previous hidden state afterwards.
* ``mtp``: DeepSeek-style multi-token prediction, one layer per depth; depth k reads
  ``[norm(h_{k-1}); norm(embed(x_{k-1}))]`` with h_0 the target's last hidden state.

``propose`` returns the draft tokens, the full proposal distributions q they were
sampled from, and confidences where the design has a head (dspark).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from calibration.models.model import Block, KVCache, RMSNorm, Verifier, VerifierOutput, attend, init_weights
from calibration.models.shapes import DRAFT_KINDS, DrafterKind, ModelShape, default_drafters

SequentialHead = Literal["markov", "rnn"]


@dataclass(frozen=True)
class DraftOutput:
    tokens: Tensor  # [R, gamma] long
    probs: Tensor  # [R, gamma, V] float32: q_k(. | context, x_<k) each token was drawn from
    confidence: Tensor | None  # [R, gamma] in (0, 1), or None without a confidence head


def sample(probs: Tensor, generator: torch.Generator) -> Tensor:
    """One draw per row of probs [..., V] -> [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def softmax_t(logits: Tensor, temperature: float) -> Tensor:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for speculative sampling, got {temperature}")
    return torch.softmax(logits.float() / temperature, dim=-1)


@dataclass(frozen=True)
class SlotContext:
    """One request's drafter context: its KV rows and the raw feature of its last committed token."""

    k: Tensor  # [drafter layers, Hkv, n, d]
    v: Tensor  # [drafter layers, Hkv, n, d]
    last_feature: Tensor  # [feature_dim]


class Drafter(nn.Module):
    """Shared machinery: feature projection, context KV cache, attention over [context; block]."""

    kind: DrafterKind
    uses_hidden = False  # mtp reads the verifier's last hidden state instead of the feature layers

    def __init__(self, target: Verifier, num_layers: int) -> None:
        super().__init__()
        s = target.s
        self.s = s
        self._target = (target,)  # a tuple: the shared embedding/LM head are not this module's weights
        feature_dim = s.hidden_size if self.uses_hidden else s.hidden_size * len(target.feature_layers)
        self.fc = nn.Linear(feature_dim, s.hidden_size, bias=False)
        self.layers = nn.ModuleList(Block(s) for _ in range(num_layers))
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.cache: KVCache | None = None
        self.last_feature: Tensor | None = None  # [S, feature_dim] raw feature of each slot's last token

    # --------------------------------------------------------------- shared
    @property
    def target(self) -> Verifier:
        return self._target[0]

    def head(self, x: Tensor) -> Tensor:
        """Shared LM head over the drafter's final norm -> float32 logits."""
        return self.target.lm_head(self.norm(x)).float()

    def features_of(self, out: VerifierOutput) -> Tensor:
        return out.hidden if self.uses_hidden else out.features

    def new_cache(self, num_slots: int, max_tokens: int) -> None:
        self.cache, self.last_feature = self._empty_context(num_slots, max_tokens)

    def _empty_context(self, num_slots: int, max_tokens: int) -> tuple[KVCache, Tensor]:
        """A context cache of ``num_slots`` slots and their last-feature rows ``[num_slots, feature_dim]``."""
        p = self.fc.weight
        return (KVCache(self.s, len(self.layers), num_slots, max_tokens, p.device, p.dtype),
                torch.zeros(num_slots, self.fc.in_features, device=p.device, dtype=p.dtype))

    def _cache(self) -> KVCache:
        if self.cache is None or self.last_feature is None:
            raise RuntimeError("call new_cache(num_slots, max_tokens) before using the drafter")
        return self.cache

    def extend_context(self, slots: list[int] | Tensor, features: Tensor, counts: list[int] | Tensor) -> None:
        """Append committed tokens: ``features [T, feature_dim]``, ``counts[r]`` rows for slot ``slots[r]``."""
        self._write_context(self._cache(), self.last_feature, slots, features, counts)  # type: ignore[arg-type]

    def _write_context(self, cache: KVCache, last_feature: Tensor, slots: list[int] | Tensor, features: Tensor,
                       counts: list[int] | Tensor) -> None:
        batch = cache.batch(slots, counts)
        ctx = self.fc(features)  # [T, h]
        for i, layer in enumerate(self.layers):
            k, v = layer.attn.kv(layer.attn_norm(ctx), batch.positions)
            cache.k[i][batch.token_slots, :, batch.positions] = k
            cache.v[i][batch.token_slots, :, batch.positions] = v
        last_rows = torch.cumsum(batch.query_lens, 0) - 1
        last_feature[batch.slots] = features[last_rows.to(features.device)]
        cache.commit(slots, counts)

    # ------------------------------------------------------ one slot's context (a serving loop's requests)
    def staged_context(self, features: Tensor) -> SlotContext:
        """One prompt's context built outside the drafter's cache from its target ``features [n, feature_dim]``:
        what :meth:`load_slot` puts into a slot when the request joins a batch."""
        cache, last_feature = self._empty_context(1, features.shape[0])
        self._write_context(cache, last_feature, [0], features, [features.shape[0]])
        return SlotContext(*cache.rows(0), last_feature[0])

    def slot_context(self, slot: int) -> SlotContext:
        """Copies of slot ``slot``'s context rows and last feature."""
        return SlotContext(*self._cache().rows(slot), self.last_feature[slot].clone())  # type: ignore[index]

    def load_slot(self, slot: int, context: SlotContext) -> None:
        """Slot ``slot`` holds exactly ``context``."""
        self._cache().write(slot, context.k, context.v)
        self.last_feature[slot] = context.last_feature  # type: ignore[index]

    def move_slot(self, src: int, dst: int) -> None:
        """Slot ``dst`` takes slot ``src``'s context (``src`` keeps it until it is reused)."""
        self._cache().move(src, dst)
        self.last_feature[dst] = self.last_feature[src]  # type: ignore[index]

    def clear_slots(self, slots: slice | list[int]) -> None:
        """Empty ``slots`` (their rows are overwritten by whoever uses them next)."""
        self._cache().lengths[slots] = 0

    def _attend(self, i: int, x: Tensor, positions: Tensor, slots: Tensor, block_k: Tensor,
                block_v: Tensor, block_mask: Tensor) -> Tensor:
        """Layer i: x [R, Q, h] attends to the slot's context and to block keys [R, Hkv, Qk, d] -> [R, Q, h]."""
        cache, layer = self._cache(), self.layers[i]
        lengths = cache.lengths[slots.cpu()]
        ctx_len = int(lengths.max())
        ctx_k = cache.k[i][slots, :, :ctx_len]  # [R, Hkv, Lc, d]
        ctx_v = cache.v[i][slots, :, :ctx_len]
        ctx_mask = (torch.arange(ctx_len)[None, :] < lengths[:, None]).to(x.device)  # [R, Lc]
        q = layer.attn.q(x, positions).transpose(1, 2)  # [R, Hq, Q, d]
        mask = torch.cat([ctx_mask[:, None, None, :].expand(-1, 1, x.shape[1], -1), block_mask], dim=-1)
        out = attend(q, torch.cat([ctx_k, block_k], 2), torch.cat([ctx_v, block_v], 2), mask)
        return layer.attn.o_proj(out.transpose(1, 2).flatten(2))

    def _positions(self, slots: Tensor, offsets: Tensor) -> Tensor:
        return (self._cache().lengths[slots.cpu()][:, None] + offsets[None, :]).to(self.fc.weight.device)

    def propose(self, anchor: Tensor, slots: Tensor, gamma: int, generator: torch.Generator,
                temperature: float = 1.0) -> DraftOutput:
        raise NotImplementedError


class ParallelDrafter(Drafter):
    """DFlash backbone; with ``sequential`` set it is DSpark (Markov or RNN head + confidence head)."""

    def __init__(self, target: Verifier, num_layers: int, sequential: SequentialHead | None, rank: int) -> None:
        super().__init__(target, num_layers)
        s = target.s
        self.kind = "dflash" if sequential is None else "dspark"
        self.sequential = sequential
        self.mask_embedding = nn.Parameter(torch.zeros(s.hidden_size))
        if sequential is not None:
            self.w1 = nn.Embedding(s.vocab_size, rank)  # [V, r] Markov embedding
            self.w2 = nn.Linear(rank, s.vocab_size, bias=False)  # [r -> V] logit projection
            self.confidence_head = nn.Linear(s.hidden_size + rank, 1, bias=False)
            if sequential == "rnn":  # one projection split into gate, candidate, output (eq. 6)
                self.rnn = nn.Linear(2 * rank + s.hidden_size, 3 * rank, bias=False)

    def backbone(self, anchor: Tensor, slots: Tensor, gamma: int) -> Tensor:
        """Anchor + (gamma-1) masks in one pass -> hidden states [R, gamma, h] (normed)."""
        num_requests = anchor.shape[0]
        x = torch.cat([self.target.embed(anchor)[:, None],
                       self.mask_embedding.expand(num_requests, gamma - 1, -1)], dim=1)  # [R, g, h]
        positions = self._positions(slots, torch.arange(gamma))  # [R, g]
        block_mask = torch.ones(num_requests, 1, gamma, gamma, dtype=torch.bool, device=x.device)
        for i, layer in enumerate(self.layers):
            h = layer.attn_norm(x)
            k, v = layer.attn.kv(h, positions)  # [R, g, Hkv, d]
            x = x + self._attend(i, h, positions, slots, k.transpose(1, 2), v.transpose(1, 2), block_mask)
            x = x + layer.mlp(layer.mlp_norm(x))
        return self.norm(x)

    def propose(self, anchor: Tensor, slots: Tensor, gamma: int, generator: torch.Generator,
                temperature: float = 1.0) -> DraftOutput:
        h = self.backbone(anchor, slots, gamma)  # [R, g, h]
        base = self.target.lm_head(h).float()  # [R, g, V] base logits U_k
        if self.sequential is None:
            probs = softmax_t(base, temperature)
            return DraftOutput(sample(probs, generator), probs, None)
        tokens, rows, confidences = [], [], []
        previous = anchor
        state = torch.zeros(anchor.shape[0], self.w2.in_features, device=h.device, dtype=h.dtype)  # s_0 = 0
        for k in range(gamma):
            e = self.w1(previous)  # [R, r] W1[x_{k-1}]
            if self.sequential == "markov":
                bias = self.w2(e)  # eq. 5
            else:
                gate, cand, out = self.rnn(torch.cat([state, e, h[:, k]], dim=-1)).chunk(3, dim=-1)
                state = torch.sigmoid(gate) * state + (1 - torch.sigmoid(gate)) * torch.tanh(cand)  # eq. 6
                bias = self.w2(torch.tanh(out))
            probs = softmax_t(base[:, k] + bias.float(), temperature)  # [R, V]
            confidences.append(torch.sigmoid(self.confidence_head(torch.cat([h[:, k], e], -1))).float()[:, 0])
            previous = sample(probs, generator)
            tokens.append(previous)
            rows.append(probs)
        return DraftOutput(torch.stack(tokens, 1), torch.stack(rows, 1), torch.stack(confidences, 1))


class AutoregressiveDrafter(Drafter):
    """Eagle3 (one shared layer for every step) or MTP (layer k for depth k)."""

    def __init__(self, target: Verifier, kind: Literal["eagle3", "mtp"], num_layers: int) -> None:
        self.uses_hidden = kind == "mtp"
        super().__init__(target, num_layers)
        self.kind = kind
        h = target.s.hidden_size
        self.in_proj = nn.ModuleList(nn.Linear(2 * h, h, bias=False) for _ in range(num_layers))
        self.embed_norm = RMSNorm(h, target.s.rms_norm_eps)
        self.feature_norm = RMSNorm(h, target.s.rms_norm_eps)

    def propose(self, anchor: Tensor, slots: Tensor, gamma: int, generator: torch.Generator,
                temperature: float = 1.0) -> DraftOutput:
        if self.kind == "mtp" and gamma > len(self.layers):
            raise ValueError(f"mtp drafter has {len(self.layers)} depths; cannot draft {gamma} tokens")
        self._cache()
        feature = self.last_feature[slots]
        feature = feature if self.uses_hidden else self.fc(feature)  # [R, h]
        previous, tokens, rows = anchor, [], []
        block_k: list[Tensor] = []
        block_v: list[Tensor] = []
        for k in range(gamma):
            depth = k if self.kind == "mtp" else 0
            layer = self.layers[depth]
            x = self.in_proj[depth](torch.cat([self.embed_norm(self.target.embed(previous)),
                                               self.feature_norm(feature)], -1))[:, None]  # [R, 1, h]
            positions = self._positions(slots, torch.tensor([k]))  # [R, 1]
            hx = layer.attn_norm(x)
            key, value = layer.attn.kv(hx, positions)
            if self.kind == "mtp":  # each depth has its own layer: no earlier block keys there
                block_k, block_v = [], []
            block_k.append(key.transpose(1, 2))
            block_v.append(value.transpose(1, 2))
            mask = torch.ones(x.shape[0], 1, 1, len(block_k), dtype=torch.bool, device=x.device)
            x = x + self._attend(depth, hx, positions, slots, torch.cat(block_k, 2), torch.cat(block_v, 2), mask)
            x = x + layer.mlp(layer.mlp_norm(x))
            feature = x[:, 0]
            probs = softmax_t(self.head(x[:, 0]), temperature)  # [R, V]
            previous = sample(probs, generator)
            tokens.append(previous)
            rows.append(probs)
        return DraftOutput(torch.stack(tokens, 1), torch.stack(rows, 1), None)


def drafter_num_layers(kind: str, shape: ModelShape, max_depth: int = 16) -> int:
    """Layers :func:`build_drafter` gives a drafter of ``kind`` by default: mtp chains one module per draft depth
    (``max_depth``), the others take :func:`calibration.models.shapes.default_drafters`' count."""
    return max_depth if kind == "mtp" else default_drafters(shape)[kind].num_layers


def build_drafter(kind: str, target: Verifier, generator: torch.Generator, *, num_layers: int | None = None,
                  head: SequentialHead = "markov", rank: int | None = None, max_depth: int = 16,
                  std: float = 0.02) -> Drafter:
    """A drafter of ``kind`` for ``target`` with random weights from ``generator``.

    Defaults: layer counts of :func:`calibration.models.shapes.default_drafters` (5 for
    dspark/dflash, 1 for eagle3), ``max_depth`` layers for mtp, Markov rank 256 (at most V).
    """
    if kind not in DRAFT_KINDS:
        raise ValueError(f"unknown drafter kind {kind!r}; kinds: {', '.join(DRAFT_KINDS)}")
    # mtp always chains max_depth modules (num_layers does not apply to it)
    layers = drafter_num_layers(kind, target.s, max_depth) if num_layers is None or kind == "mtp" else num_layers
    rank = rank if rank is not None else min(256, target.s.vocab_size)
    p = target.embed.weight
    with torch.device("meta"):
        if kind in ("dspark", "dflash"):
            drafter: Drafter = ParallelDrafter(target, layers, head if kind == "dspark" else None, rank)
        else:
            drafter = AutoregressiveDrafter(target, kind, layers)
    drafter = drafter.to(p.dtype).to_empty(device=p.device)
    return init_weights(drafter, generator, std).eval()
