"""The analytic roofline: step costs from a model shape and a GPU spec, with no GPU at hand.

Every number this module gives is *analytic* (profiles built from it say
``metadata.source = "analytic"``): a roofline estimate, never a measurement. One
forward over ``n`` tokens costs::

    t(n) = max(FLOPs / (G * peak * eff_compute), bytes / (G * bandwidth * eff_memory))
           + step overhead [+ eager overhead above the largest CUDA graph] [+ collectives when G > 1]

with FLOPs from the padded token count (CUDA-graph bucket, then GEMM tile) and
bytes from the weights read once per forward (for MoE: the dense part plus the
expected number of distinct experts the tokens touch). Per-request KV-cache
reads at a reference context length go into the profile's ``per_request``
table, which the simulator adds to ``1 / SPS(B)``. Drafter passes are priced by
:mod:`calibration.profiling.drafter_cost`; :mod:`calibration.profiling.analytic` turns
both into a profile (``python -m calibration.roofline``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from calibration.models.shapes import ModelShape


@dataclass(frozen=True)
class GPUSpec:
    """Vendor peak numbers of one GPU (datasheet values; dense tensor-core peaks, never the 2:4-sparsity ones).

    * ``peak_flops_per_s``: dense BF16 tensor-core peak (the GEMM peak of bf16 weights; attention math always);
    * ``peak_fp8_flops_per_s``: dense FP8 tensor-core peak (the GEMM peak of FP8 weights, W8A8);
    * ``hbm_bytes_per_s``, ``hbm_capacity_bytes``: HBM bandwidth and capacity;
    * ``interconnect_bytes_per_s``: GPU-to-GPU bandwidth per direction (half the bidirectional figure);
    * ``source``: the datasheet every number above comes from, written into each profile's ``metadata.gpu``.
    """

    name: str
    peak_flops_per_s: float
    hbm_bytes_per_s: float
    hbm_capacity_bytes: float
    interconnect_bytes_per_s: float
    peak_fp8_flops_per_s: float = 0.0
    source: str = ""

    def v1_dict(self) -> dict[str, float | str]:
        """The fields version-1 analytic profiles state (kept as they were, so those files stay reproducible)."""
        return {"name": self.name, "peak_flops_per_s": self.peak_flops_per_s, "hbm_bytes_per_s": self.hbm_bytes_per_s,
                "hbm_capacity_bytes": self.hbm_capacity_bytes,
                "interconnect_bytes_per_s": self.interconnect_bytes_per_s}


GPUS: dict[str, GPUSpec] = {
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: BF16 1,979 and FP8 3,958 TFLOPS "with sparsity"
    # (dense: half, 989 and 1,979), 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s bidirectional (450 per direction).
    "h100": GPUSpec("H100 SXM", 989e12, 3.35e12, 80e9, 450e9, 1979e12,
                    "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): BF16 1,979 / FP8 3,958 TFLOPS with 2:4 "
                    "sparsity, dense = half; 80 GB HBM3, 3.35 TB/s; NVLink 900 GB/s bidirectional"),
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: the H100's tensor cores (BF16 1,979 / FP8 3,958
    # TFLOPS with sparsity), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s bidirectional.
    "h200": GPUSpec("H200 SXM", 989e12, 4.8e12, 141e9, 450e9, 1979e12,
                    "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): BF16 1,979 / FP8 3,958 TFLOPS with 2:4 "
                    "sparsity, dense = half; 141 GB HBM3e, 4.8 TB/s; NVLink 900 GB/s bidirectional"),
    # NVIDIA HGX B200 datasheet (8 GPUs, 1,000 W each): FP16/BF16 36 and FP8 72 PFLOPS with sparsity, i.e.
    # 2.25 and 4.5 PFLOPS dense per GPU; DGX B200 datasheet: 1,440 GB HBM3e and 64 TB/s for 8 GPUs (180 GB,
    # 8 TB/s each); fifth-generation NVLink 1.8 TB/s bidirectional per GPU (900 GB/s per direction).
    "b200": GPUSpec("B200 (HGX)", 2.25e15, 8.0e12, 180e9, 900e9, 4.5e15,
                    "NVIDIA HGX B200 datasheet: FP16/BF16 36 / FP8 72 PFLOPS with sparsity for 8 GPUs (dense per "
                    "GPU: 2.25 / 4.5 PFLOPS); DGX B200 datasheet: 1,440 GB HBM3e, 64 TB/s for 8 GPUs; NVLink 5 "
                    "1.8 TB/s bidirectional per GPU"),
    # AMD Instinct MI300X data sheet: peak BF16 1,307.4 and FP8 2,614.9 TFLOPS dense (twice that with sparsity),
    # 192 GB HBM3 at 5.3 TB/s, 7 Infinity Fabric links of 128 GB/s bidirectional (896 GB/s; 448 per direction).
    "mi300x": GPUSpec("MI300X", 1307.4e12, 5.3e12, 192e9, 448e9, 2614.9e12,
                      "AMD Instinct MI300X data sheet: peak BF16 1,307.4 / FP8 2,614.9 TFLOPS dense; 192 GB HBM3, "
                      "5.3 TB/s; 7 Infinity Fabric links x 128 GB/s bidirectional (896 GB/s aggregate)"),
}

Dtype = Literal["bf16", "fp8"]
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class Precision:
    """Number formats of the weights and of the KV cache (``bf16`` or ``fp8``).

    FP8 weights are read at 1 byte per parameter and their GEMMs run at the FP8 peak (W8A8, as FP8
    checkpoints are served on Hopper, Blackwell and MI300); FP8 KV halves the bytes a request's attention
    reads and stores. Attention math runs at the BF16 peak in both cases (an assumption: decode attention is
    memory-bound, so it matters only for long prefill chunks). The drafter uses the target's formats.
    """

    weights: Dtype = "bf16"
    kv: Dtype = "bf16"

    def __post_init__(self) -> None:
        for key in ("weights", "kv"):
            if getattr(self, key) not in DTYPE_BYTES:
                raise ValueError(f"{key} dtype must be one of {', '.join(DTYPE_BYTES)}, got {getattr(self, key)!r}")

    @property
    def weight_bytes(self) -> int:
        return DTYPE_BYTES[self.weights]

    @property
    def kv_bytes(self) -> int:
        return DTYPE_BYTES[self.kv]


@dataclass(frozen=True)
class Assumptions:
    """Every constant of the cost model that is not a datasheet number. All are assumptions.

    * ``compute_efficiency`` 0.6: fraction of peak that large bf16 GEMMs of LLM layers
      reach in serving engines (typically 50-70%).
    * ``memory_efficiency`` 0.8: fraction of HBM bandwidth a weight-streaming GEMV/GEMM
      reaches (typically 75-90%).
    * ``step_overhead_s`` 1.5 ms: per target step, non-GEMM time outside the roofline
      (CUDA-graph launch, input preparation, sampling, detokenisation hand-off, Python
      framework) - the order of what decode steps of 8B-class models show in vLLM/SGLang.
    * ``eager_overhead_s`` 1.0 ms: extra per-kernel launch cost when a batch exceeds the
      largest captured CUDA graph and runs eagerly.
    * ``max_graph_tokens`` 1024: largest captured CUDA-graph batch; batches are padded
      up to the next capture size (vLLM-like sizes, see :func:`cuda_graph_sizes`).
    * ``tile_tokens`` 64: GEMM M-tile; compute is paid for tokens padded to a multiple of it.
    * ``context_tokens`` 2048: reference context length for attention FLOPs and KV reads.
    * ``weight_memory_fraction`` 0.7: share of HBM the weights may take (the rest is
      KV cache and activations); decides GPUs per replica.
    * ``collective_latency_per_layer_s`` 20 us: with G > 1 GPUs, two collectives per
      layer (attention all-reduce, MoE dispatch/combine or MLP all-reduce) at ~10 us each
      (NCCL small-message latency over NVLink); their volume adds
      ``2 * tokens * hidden * 2 bytes / interconnect`` per layer.
    * ``draft_pass_overhead_s`` 0.15 ms: launch cost of one drafter forward (graph replay,
      input preparation); ``sequential_step_overhead_s`` 10 us: one fused step of the
      DSpark sequential head (gather, small GEMM, sampling).
    * ``markov_rank`` 256: rank r of the Markov head (DSpark paper, sec. 3.1).
    * ``scheduler_fixed_s`` 0.5 ms: host sync / pipeline bubble a synchronous policy adds;
      ``scheduler_per_candidate_s`` 20 ns: sorting and scanning one (request, position).
    * ``max_batch_tokens`` 8192, ``max_requests`` 1024, ``max_draft_tokens`` 16: extents of
      the tables (not assumptions about the hardware); the simulator errors outside them.
    """

    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.8
    step_overhead_s: float = 1.5e-3
    eager_overhead_s: float = 1.0e-3
    max_graph_tokens: int = 1024
    tile_tokens: int = 64
    context_tokens: int = 2048
    weight_memory_fraction: float = 0.7
    collective_latency_per_layer_s: float = 20e-6
    draft_pass_overhead_s: float = 0.15e-3
    sequential_step_overhead_s: float = 10e-6
    markov_rank: int = 256
    scheduler_fixed_s: float = 0.5e-3
    scheduler_per_candidate_s: float = 20e-9
    max_batch_tokens: int = 8192
    max_requests: int = 1024
    max_draft_tokens: int = 16

    def __post_init__(self) -> None:
        for key in ("compute_efficiency", "memory_efficiency", "weight_memory_fraction"):
            if not 0.0 < getattr(self, key) <= 1.0:
                raise ValueError(f"{key} must be in (0, 1], got {getattr(self, key)}")
        for key in ("max_graph_tokens", "tile_tokens", "context_tokens", "max_batch_tokens", "max_requests",
                    "max_draft_tokens", "markov_rank"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")


def cuda_graph_sizes(max_graph_tokens: int) -> np.ndarray:
    """vLLM-like capture sizes: 1, 2, 4, 8, multiples of 8 to 512, of 16 to 1024, of 32 beyond."""
    sizes = [1, 2, 4, *range(8, 513, 8), *range(528, 1025, 16), *range(1056, max_graph_tokens + 1, 32)]
    sizes = [s for s in sizes if s <= max_graph_tokens]
    if sizes[-1] != max_graph_tokens:
        sizes.append(max_graph_tokens)
    return np.array(sizes, dtype=np.int64)


@dataclass(frozen=True)
class Roofline:
    """Cost model of one replica (``num_gpus`` GPUs) serving ``shape``; all times in seconds."""

    shape: ModelShape
    gpu: GPUSpec
    assume: Assumptions
    num_gpus: int
    precision: Precision = Precision()

    # -------------------------------------------------------------- padding
    def graph_tokens(self, tokens: np.ndarray) -> np.ndarray:
        """Batch after CUDA-graph padding (unchanged above the largest graph: eager)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        sizes = cuda_graph_sizes(self.assume.max_graph_tokens)
        idx = np.minimum(np.searchsorted(sizes, tokens), sizes.size - 1)
        return np.where(tokens <= sizes[-1], sizes[idx], tokens)

    def tile_tokens(self, tokens: np.ndarray) -> np.ndarray:
        tile = self.assume.tile_tokens
        return -(-np.asarray(tokens, dtype=np.int64) // tile) * tile

    # ------------------------------------------------------------ primitives
    @property
    def gemm_flops_per_s(self) -> float:
        """Dense peak of the weight GEMMs of one GPU: BF16, or FP8 when the weights are FP8."""
        if self.precision.weights == "bf16":
            return self.gpu.peak_flops_per_s
        if self.gpu.peak_fp8_flops_per_s <= 0:
            raise ValueError(f"GPU {self.gpu.name!r} states no FP8 peak; FP8 weights cannot be priced on it")
        return self.gpu.peak_fp8_flops_per_s

    @property
    def attention_flops_weight(self) -> float:
        """Attention FLOPs (BF16 peak) in units of GEMM FLOPs: 1 with BF16 weights, the FP8/BF16 peak ratio else.
        Multiplying attention FLOPs by it lets one ``roofline_s`` at the GEMM peak price both exactly."""
        return self.gemm_flops_per_s / self.gpu.peak_flops_per_s

    def roofline_s(self, flops: np.ndarray, bytes_: np.ndarray) -> np.ndarray:
        """max(compute, memory) over the replica: ``flops`` at the GEMM peak, ``bytes_`` at HBM bandwidth."""
        a = self.assume
        compute_s = np.asarray(flops, dtype=np.float64) / (self.num_gpus * self.gemm_flops_per_s * a.compute_efficiency)
        memory_s = np.asarray(bytes_, dtype=np.float64) / (self.num_gpus * self.gpu.hbm_bytes_per_s
                                                             * a.memory_efficiency)
        return np.maximum(compute_s, memory_s)

    def expected_experts(self, tokens: np.ndarray) -> np.ndarray:
        """Expected distinct routed experts touched by ``tokens`` tokens in one layer: E(1-(1-k/E)^n)."""
        s = self.shape
        n = np.asarray(tokens, dtype=np.float64)
        if not s.is_moe:
            return np.zeros(n.shape)
        return s.num_experts * (1.0 - (1.0 - s.experts_per_token / s.num_experts) ** n)

    def layer_weight_bytes(self, tokens: np.ndarray, moe: bool) -> np.ndarray:
        """Weight bytes one layer reads for a forward over ``tokens`` tokens."""
        s, weight_bytes = self.shape, self.precision.weight_bytes
        if not moe:
            return np.full(np.shape(tokens), float(s.layer_params(False) * weight_bytes))
        dense = s.attention_params + s.router_params + 2 * s.hidden_size + s.num_shared_experts * s.expert_params
        return (dense + self.expected_experts(tokens) * s.expert_params) * weight_bytes

    def weight_bytes(self, tokens: np.ndarray) -> np.ndarray:
        """Weight bytes one forward over ``tokens`` tokens reads: every layer and the LM head."""
        s = self.shape
        return (s.num_dense_mlp_layers * self.layer_weight_bytes(tokens, False)
                + s.num_moe_layers * self.layer_weight_bytes(tokens, True)
                + s.lm_head_params * self.precision.weight_bytes)

    def attention_flops_per_token(self, context_tokens: float) -> float:
        """QK^T and AV over the context, all layers: 4 * L * Hq * d * context."""
        s = self.shape
        return 4.0 * s.num_layers * s.num_q_heads * s.head_dim * context_tokens

    def collectives_s(self, tokens: np.ndarray, num_layers: int) -> np.ndarray:
        if self.num_gpus == 1:
            return np.zeros(np.shape(tokens))
        volume = 2.0 * np.asarray(tokens, dtype=np.float64) * self.shape.hidden_size * 2
        per_layer = self.assume.collective_latency_per_layer_s + volume / self.gpu.interconnect_bytes_per_s
        return num_layers * per_layer

    # ------------------------------------------------------------ the tables
    def verify_step_s(self, batch_tokens: np.ndarray) -> np.ndarray:
        """Version 1's 1 / SPS(B): one target forward over B batch tokens, attention FLOPs at the reference context
        and the eager overhead folded in (KV reads excluded: see per_request_s)."""
        s, a = self.shape, self.assume
        b = np.asarray(batch_tokens, dtype=np.int64)
        if b.size and b.min() < 1:
            raise ValueError(f"batch tokens must be >= 1, got {b.min()}")
        graph = self.graph_tokens(b)
        compute = self.tile_tokens(graph)
        flops = compute * (2.0 * s.matmul_params_per_token
                           + self.attention_flops_per_token(a.context_tokens) * self.attention_flops_weight)
        eager = np.where(b > a.max_graph_tokens, a.eager_overhead_s, 0.0)
        return (self.roofline_s(flops, self.weight_bytes(graph)) + a.step_overhead_s + eager
                + self.collectives_s(graph, s.num_layers))

    def per_request_s(self, num_requests: np.ndarray) -> np.ndarray:
        """Version 1's per-request cost: KV-cache reads of R requests at the reference context."""
        kv = self.shape.kv_bytes_per_token_at(self.precision.kv_bytes) * self.assume.context_tokens
        return self.roofline_s(0.0, kv * np.asarray(num_requests, dtype=np.float64))

    def dense_step_s(self, batch_tokens: np.ndarray) -> np.ndarray:
        """Version 2's dense part over B batch tokens in CUDA-graph mode: weight GEMMs and LM head (graph bucket,
        then GEMM tile), step overhead and collectives. No attention (:meth:`attention_s` prices it per request)
        and no eager overhead (the profile's ``cuda_graphs`` block adds it above the largest graph)."""
        s, a = self.shape, self.assume
        b = np.asarray(batch_tokens, dtype=np.int64)
        if b.size and b.min() < 1:
            raise ValueError(f"batch tokens must be >= 1, got {b.min()}")
        graph = self.graph_tokens(b)
        flops = self.tile_tokens(graph) * (2.0 * s.matmul_params_per_token)
        return (self.roofline_s(flops, self.weight_bytes(graph)) + a.step_overhead_s
                + self.collectives_s(graph, s.num_layers))

    @property
    def kv_read_shards(self) -> int:
        """GPUs that share the reading of the batch's KV. GQA under tensor parallelism: the KV heads are split
        (a head is replicated when there are fewer heads than GPUs). A latent cache shared by all heads
        (``kv_cache_elems``, MLA-like): data-parallel attention, each GPU holding its share of the requests, as
        MLA targets are served (an assumption: requests spread evenly; version 1 and the drafters assume it too)."""
        s = self.shape
        return self.num_gpus if s.kv_cache_elems is not None else min(self.num_gpus, s.num_kv_heads)

    def attention_s(self, context_tokens: np.ndarray, query_tokens: np.ndarray) -> np.ndarray:
        """One request's attention, all layers (broadcast over both arguments): ``query_tokens`` new tokens over
        ``context_tokens`` cached ones and each other (causal), i.e. ``q * c + q (q + 1) / 2`` (query, key) pairs of
        ``4 L Hq d`` FLOPs at the BF16 peak, against one read of the ``c`` cached and one write of the ``q`` new
        tokens' KV (``kv_bytes_per_token`` each) shared by :attr:`kv_read_shards` GPUs."""
        s, a = self.shape, self.assume
        c = np.asarray(context_tokens, dtype=np.float64)
        q = np.asarray(query_tokens, dtype=np.float64)
        flops = 4.0 * s.num_layers * s.num_q_heads * s.head_dim * (q * c + q * (q + 1.0) / 2.0)
        kv_bytes = s.kv_bytes_per_token_at(self.precision.kv_bytes) * (c + q)
        compute_s = flops / (self.num_gpus * self.gpu.peak_flops_per_s * a.compute_efficiency)
        memory_s = kv_bytes / (self.kv_read_shards * self.gpu.hbm_bytes_per_s * a.memory_efficiency)
        return np.maximum(compute_s, memory_s)

    def prefill_s(self, prompt_tokens: np.ndarray) -> np.ndarray:
        """Version 2's ``prefill.table``: one disaggregated prefill of n prompt tokens as one forward - the dense
        part over n tokens (:meth:`dense_step_s`), the eager overhead above the largest captured graph and the
        prompt's causal attention over itself (:meth:`attention_s` at context 0 with n query tokens: n (n + 1) / 2
        (query, key) pairs, so the cost is quadratic in n once attention FLOPs dominate). Exactly what the
        simulator prices a chunk of n tokens over 0 computed ones at, in chunked mode."""
        n = np.asarray(prompt_tokens, dtype=np.int64)
        eager = np.where(n > self.assume.max_graph_tokens, self.assume.eager_overhead_s, 0.0)
        return self.dense_step_s(n) + eager + self.attention_s(np.zeros(n.shape), n)

    def prefill(self) -> tuple[float, float]:
        """(fixed_s, tokens_per_s): compute-bound throughput at the reference context (causal: half of it
        attended on average); fixed cost = step overhead + one read of the weights."""
        s, a = self.shape, self.assume
        flops_per_token = (2.0 * s.matmul_params_per_token
                           + self.attention_flops_per_token(a.context_tokens / 2) * self.attention_flops_weight)
        tokens_per_s = self.num_gpus * self.gemm_flops_per_s * a.compute_efficiency / flops_per_token
        fixed_s = a.step_overhead_s + float(self.roofline_s(0.0, s.total_params * self.precision.weight_bytes))
        return fixed_s, tokens_per_s


def gpus_per_replica(shape: ModelShape, gpu: GPUSpec, assume: Assumptions, precision: Precision = Precision()) -> int:
    """Smallest power of two of GPUs whose weight share of HBM holds the weights (in ``precision.weights``)."""
    need = shape.total_params * precision.weight_bytes / (gpu.hbm_capacity_bytes * assume.weight_memory_fraction)
    return 1 << max(0, math.ceil(math.log2(max(need, 1.0))))


def verify_grid(assume: Assumptions) -> np.ndarray:
    """Batch tokens to tabulate: 1..64 densely, and both sides of every graph-bucket and tile edge.

    Between two consecutive edges a dense model's step time is constant, so linear
    interpolation over this grid reproduces the step function exactly at every integer.
    """
    top = assume.max_batch_tokens
    edges = np.concatenate([cuda_graph_sizes(assume.max_graph_tokens),
                            np.arange(assume.tile_tokens, top + 1, assume.tile_tokens),
                            2 ** np.arange(0, int(math.log2(top)) + 1), [top]])
    points = np.concatenate([np.arange(1, 65), edges - 1, edges, edges + 1])
    return np.unique(points[(points >= 1) & (points <= top)])


def requests_grid(max_requests: int, num_points: int = 24) -> np.ndarray:
    """Log-spaced request counts 1..max_requests (integers, always including both ends)."""
    points = np.unique(np.round(np.geomspace(1, max_requests, num_points)).astype(np.int64))
    return np.union1d(points, [1, max_requests])
