"""Model shapes: frozen dataclasses with named presets, shared by the roofline and the torch models.

A :class:`ModelShape` fixes every dimension of a target that decides cost (parameters,
FLOPs, bytes, KV cache); a :class:`DrafterShape` fixes how a drafter of each kind
spends a step (layers, parallel or sequential, Markov head, feature inputs), with the
paper's defaults in :func:`default_drafters`. The torch drafters take their default
layer counts from there, and :mod:`calibration.profiling.drafter_cost` prices them.
The dense presets copy the public Qwen3 ``config.json`` files (Hugging Face
``Qwen/Qwen3-4B``, ``Qwen/Qwen3-8B``, ``Qwen/Qwen3-14B``). ``v4flash-like`` is an
approximation of a DeepSeek-V4-Flash-class MoE target; see :data:`V4FLASH_LIKE_NOTE`.

Parameter accounting (weights only, no buffers):

* attention per layer: q ``h x Hq*d``, k and v ``h x Hkv*d`` each, o ``Hq*d x h``,
  plus QK-norm gains ``2*d`` when ``qk_norm``;
* dense MLP (SwiGLU): gate, up, down = ``3 * h * I``; an expert is the same with
  ``I = expert_intermediate_size``; the router is ``h x E``;
* two RMSNorm gains per layer (``2*h``), one final norm (``h``);
* embedding ``V x h``, plus an LM head ``V x h`` unless embeddings are tied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

V4FLASH_LIKE_NOTE = (
    "APPROXIMATION, not an official configuration. Routed/shared experts, top-k, hidden size, "
    "layer count, expert width and vocabulary follow publicly reported DeepSeek-V4-Flash figures "
    "(43 MoE layers, 256 routed + 1 shared expert, top-6, hidden 4096, expert intermediate 2048, "
    "vocab 129280; about 284B total / 13B activated parameters). Its compressed sparse attention "
    "and hyper-connections are not modelled: attention is approximated as GQA with 64 query heads "
    "and 8 KV heads of dim 192, sized so that total and activated parameter counts land near the "
    "reported figures, and the KV cache as one 512-wide latent per token and layer. Weights are "
    "counted in bf16 (2 bytes/parameter) like the dense presets."
)


@dataclass(frozen=True)
class ModelShape:
    """Dimensions of a decoder-only transformer (dense or MoE). Counts are plain ints."""

    name: str
    hidden_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense SwiGLU width (dense layers only)
    vocab_size: int
    tied_embeddings: bool
    qk_norm: bool = True
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    # MoE: layers after the first ``num_dense_layers`` are MoE when num_experts > 0.
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0
    # Elements cached per token and layer; None = K and V of every KV head (2 * Hkv * d).
    kv_cache_elems: int | None = None
    bytes_per_param: int = 2  # bf16
    note: str = ""

    def __post_init__(self) -> None:
        for key in ("hidden_size", "num_layers", "num_q_heads", "num_kv_heads", "head_dim", "vocab_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"model shape {self.name!r}: {key} must be >= 1, got {getattr(self, key)}")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"model shape {self.name!r}: num_q_heads={self.num_q_heads} is not a multiple "
                             f"of num_kv_heads={self.num_kv_heads}")
        if self.is_moe and not (0 < self.experts_per_token <= self.num_experts and self.expert_intermediate_size > 0):
            raise ValueError(f"model shape {self.name!r}: MoE needs 0 < experts_per_token <= num_experts "
                             f"and expert_intermediate_size > 0")

    # ----------------------------------------------------------- structure
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def num_dense_mlp_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    # ---------------------------------------------------------- parameters
    @property
    def attention_params(self) -> int:
        """Attention weights of one layer (q, k, v, o, QK-norm gains)."""
        h, d = self.hidden_size, self.head_dim
        qo = 2 * h * self.num_q_heads * d
        kv = 2 * h * self.num_kv_heads * d
        return qo + kv + (2 * d if self.qk_norm else 0)

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def expert_params(self) -> int:
        """One routed or shared expert (SwiGLU of width expert_intermediate_size)."""
        return 3 * self.hidden_size * self.expert_intermediate_size

    @property
    def router_params(self) -> int:
        return self.hidden_size * self.num_experts

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Parameters the LM-head matmul reads (the embedding matrix itself when tied)."""
        return self.vocab_size * self.hidden_size

    def layer_params(self, moe: bool) -> int:
        """All weights of one layer, counting every expert."""
        norms = 2 * self.hidden_size
        if not moe:
            return self.attention_params + self.dense_mlp_params + norms
        experts = (self.num_experts + self.num_shared_experts) * self.expert_params
        return self.attention_params + experts + self.router_params + norms

    def layer_active_params(self, moe: bool) -> int:
        """Weights one token multiplies with in one layer (top-k + shared experts)."""
        if not moe:
            return self.layer_params(False)
        experts = (self.experts_per_token + self.num_shared_experts) * self.expert_params
        return self.attention_params + experts + self.router_params + 2 * self.hidden_size

    @property
    def total_params(self) -> int:
        """All weights, embeddings included (LM head counted once when tied)."""
        layers = (self.num_dense_mlp_layers * self.layer_params(False)
                  + self.num_moe_layers * self.layer_params(True))
        head = 0 if self.tied_embeddings else self.lm_head_params
        return layers + self.embedding_params + head + self.hidden_size

    @property
    def active_params(self) -> int:
        """Activated weights per token, embeddings included (the usual "activated parameters")."""
        layers = (self.num_dense_mlp_layers * self.layer_active_params(False)
                  + self.num_moe_layers * self.layer_active_params(True))
        head = 0 if self.tied_embeddings else self.lm_head_params
        return layers + self.embedding_params + head + self.hidden_size

    @property
    def matmul_params_per_token(self) -> int:
        """Weights in matmuls per token: active layer weights + LM head (embedding lookup is no matmul)."""
        return self.active_params - self.embedding_params + (self.lm_head_params if self.tied_embeddings else 0)

    # ------------------------------------------------------------ KV cache
    @property
    def kv_elems_per_token_layer(self) -> int:
        return self.kv_cache_elems if self.kv_cache_elems is not None else 2 * self.num_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one context token over all layers (bf16)."""
        return self.kv_bytes_per_token_at(2)

    def kv_bytes_per_token_at(self, bytes_per_elem: int) -> int:
        """KV-cache bytes of one context token over all layers at ``bytes_per_elem`` bytes per cached element
        (2: bf16, 1: fp8): layers x (K and V of every KV head, or the latent) x bytes."""
        return self.num_layers * self.kv_elems_per_token_layer * bytes_per_elem


MODEL_SHAPES: dict[str, ModelShape] = {
    # CPU tests: small enough that a forward pass takes milliseconds.
    "tiny": ModelShape("tiny", hidden_size=64, num_layers=2, num_q_heads=4, num_kv_heads=2, head_dim=16,
                       intermediate_size=128, vocab_size=128, tied_embeddings=True, rope_theta=10_000.0),
    # Public Qwen3 configs (hidden, layers, q heads, kv heads, head_dim, intermediate, vocab, tying).
    "qwen3-4b": ModelShape("qwen3-4b", 2560, 36, 32, 8, 128, 9728, 151936, tied_embeddings=True),
    "qwen3-8b": ModelShape("qwen3-8b", 4096, 36, 32, 8, 128, 12288, 151936, tied_embeddings=False),
    "qwen3-14b": ModelShape("qwen3-14b", 5120, 40, 40, 8, 128, 17408, 151936, tied_embeddings=False),
    "v4flash-like": ModelShape(
        "v4flash-like", hidden_size=4096, num_layers=43, num_q_heads=64, num_kv_heads=8, head_dim=192,
        intermediate_size=0, vocab_size=129280, tied_embeddings=False, qk_norm=False,
        num_experts=256, experts_per_token=6, expert_intermediate_size=2048, num_shared_experts=1,
        num_dense_layers=0, kv_cache_elems=512, note=V4FLASH_LIKE_NOTE),
}


def get_shape(name: str) -> ModelShape:
    if name not in MODEL_SHAPES:
        raise ValueError(f"unknown model shape {name!r}; presets: {', '.join(MODEL_SHAPES)}")
    return MODEL_SHAPES[name]


# ------------------------------------------------------------------- drafters
DrafterKind = Literal["dspark", "dflash", "eagle3", "mtp"]
DRAFT_KINDS: tuple[DrafterKind, ...] = ("dspark", "dflash", "eagle3", "mtp")


@dataclass(frozen=True)
class DrafterShape:
    """Shape of a drafter as far as cost goes.

    ``num_layers`` per forward pass; ``parallel`` = all gamma positions in one pass;
    ``markov_head`` = DSpark's sequential stage; ``feature_layers`` = target layers whose
    hidden states are concatenated and projected to h (for ``mtp``: 2, the previous hidden
    state and the token embedding); ``window_tokens`` = attention window over the context
    (None: the full context).
    """

    kind: DrafterKind
    num_layers: int
    parallel: bool
    markov_head: bool
    feature_layers: int
    window_tokens: int | None = None


def default_drafters(shape: ModelShape) -> dict[str, DrafterShape]:
    """Paper defaults: 5 layers for DSpark/DFlash and 1 for Eagle3 (sec. 4.1); for an MoE target,
    3 backbone layers with a 128-token sliding window (the production setting, sec. 5.1)."""
    layers, window = (3, 128) if shape.is_moe else (5, None)
    return {
        "dspark": DrafterShape("dspark", layers, parallel=True, markov_head=True, feature_layers=3,
                               window_tokens=window),
        "dflash": DrafterShape("dflash", layers, parallel=True, markov_head=False, feature_layers=3,
                               window_tokens=window),
        "eagle3": DrafterShape("eagle3", 1, parallel=False, markov_head=False, feature_layers=3),
        "mtp": DrafterShape("mtp", 1, parallel=False, markov_head=False, feature_layers=2),
    }
